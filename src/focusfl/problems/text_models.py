"""Text classifiers on packed token inputs ``[B, 2, L]`` (row 0 token ids, row 1 attention mask).

- :class:`MeanPoolText` (``model=text-mean``): embedding, mean over the sequence's tokens,
  linear layer; plain PyTorch, no ``transformers`` needed.
- :class:`SequenceClassifier` (``model=hf:FOLDER`` or ``hf-config:FOLDER``): a ``transformers``
  AutoModelForSequenceClassification read from a local folder (safetensors weights only) or
  built from its config.json, behind the same packed input.

Dropout of a ``transformers`` model is OFF: the problem keeps it in eval mode while training.
Its attention-probability dropout is a functional call inside the attention code that draws
from torch's generator (which vmap refuses, and which keyed draws cannot replace), so the
whole model trains without dropout; keyed hidden dropout alone would be a model of its own.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ..data.hf import require
from ..errors import DataError

TEXT_MODELS = ("text-mean",)
MEAN_POOL_WIDTH = 64
# Weight files that unpickle (run code) when loaded; refused.
PICKLE_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5", "flax_model.msgpack")
SAFE_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")


class MeanPoolText(nn.Module):
    """logits = W (sum_t m_t E[x_t] / sum_t m_t) + b: the mean embedding of the tokens (mask m)."""

    def __init__(self, vocabulary: int, num_classes: int, width: int = MEAN_POOL_WIDTH) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocabulary, width)
        self.head = nn.Linear(width, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        ids, mask = tokens[:, 0].long(), tokens[:, 1].to(self.head.weight.dtype)
        summed = (self.embedding(ids) * mask[..., None]).sum(dim=1)
        return self.head(summed / mask.sum(dim=1, keepdim=True).clamp(min=1.0))

    def vocabulary(self) -> int:
        return self.embedding.num_embeddings


class SequenceClassifier(nn.Module):
    """A ``transformers`` sequence classifier taking packed tokens; returns its logits.

    The attention mask goes in as the additive 4-D mask ``(1 - m) * min_float`` [B, 1, 1, L],
    which the model uses as it is: building it from a 2-D mask would test the mask's values
    (data-dependent control flow that vmap cannot batch over clients).
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        ids = tokens[:, 0].long()
        dtype = self.model.get_input_embeddings().weight.dtype
        additive = (1.0 - tokens[:, 1].to(dtype))[:, None, None, :] * torch.finfo(dtype).min
        return self.model(input_ids=ids, attention_mask=additive).logits

    def vocabulary(self) -> int:
        return self.model.get_input_embeddings().num_embeddings


def load_sequence_classifier(spec: str, num_classes: int) -> SequenceClassifier:
    """``hf:FOLDER`` (config.json and safetensors weights) or ``hf-config:FOLDER`` (config.json
    only: a randomly initialised model, drawn from the caller's seeded generator).

    A checkpoint without a classification head (bert-base-uncased is BertForMaskedLM) gets a
    new head for ``num_classes``; one with a head must have exactly ``num_classes`` labels.
    Refused in one line: a missing folder or config.json, a model type without a
    sequence-classification class, pickle weights (.bin), code of the folder's own (auto_map).
    """
    kind, _, folder = spec.partition(":")
    path = Path(folder).expanduser()
    if not path.is_dir():
        raise DataError(f"model folder {path} not found")
    if not (path / "config.json").is_file():
        raise DataError(f"model folder {path} has no config.json (save the model with save_pretrained)")
    transformers = require("transformers", f"model={kind}:FOLDER")
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    config = _config(transformers, path)
    heads = [a for a in (config.architectures or []) if a.endswith("ForSequenceClassification")]
    if heads and config.num_labels != num_classes:
        raise DataError(
            f"model folder {path}: its classification head has {config.num_labels} labels, the data has "
            f"{num_classes} classes"
        )
    config.num_labels = num_classes
    auto = transformers.AutoModelForSequenceClassification
    try:
        if kind == "hf-config":
            model = auto.from_config(config, attn_implementation="eager", trust_remote_code=False)
        else:
            _check_weights(path)
            model = auto.from_pretrained(
                str(path), config=config, local_files_only=True, trust_remote_code=False, use_safetensors=True,
                attn_implementation="eager",
            )
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise DataError(f"cannot load a sequence classifier from {path}: {_first_line(exc)}") from None
    return SequenceClassifier(model)


def _config(transformers, path: Path):
    try:
        config = transformers.AutoConfig.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError, KeyError) as exc:
        raise DataError(f"cannot read model config {path / 'config.json'}: {_first_line(exc)}") from None
    mapping = transformers.models.auto.modeling_auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES
    if config.model_type not in mapping:
        raise DataError(
            f"model folder {path} holds a {config.model_type!r} model, which has no sequence-classification "
            "class in transformers"
        )
    return config


def _check_weights(path: Path) -> None:
    if any((path / name).is_file() for name in SAFE_WEIGHTS):
        return
    pickled = [name for name in PICKLE_WEIGHTS if (path / name).is_file()]
    if pickled:
        raise DataError(
            f"model folder {path}: refusing {pickled[0]} (pickle weights can run code); save it with "
            "save_pretrained(safe_serialization=True)"
        )
    raise DataError(
        f"model folder {path} has no model.safetensors (model=hf-config:{path} builds a random model from its config)"
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

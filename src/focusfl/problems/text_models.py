"""Text classifiers on packed token inputs ``[B, 2, L]`` (row 0 token ids, row 1 attention mask).

- :class:`MeanPoolText` (``model=text-mean``): embedding, mean over the sequence's tokens,
  linear layer; plain PyTorch, no ``transformers`` needed.
- :class:`SequenceClassifier` (``model=hf:FOLDER`` or ``hf-config:FOLDER``): a ``transformers``
  AutoModelForSequenceClassification read from a local folder (safetensors weights only) or
  built from its config.json, behind the same packed input.

A model folder is untrusted: config.json is checked field by field (types, ranges, no code of
its own) and the safetensors headers (length, JSON, dtypes, shapes, byte ranges) before
transformers reads either; the model's parameter count, a lower bound from the config and then
the exact count of the model laid out on torch's meta device, is checked against the memory
the run needs (the caller's ``check_size``: its copies and the algorithm's per-client state)
before a byte of it is allocated; whatever transformers or safetensors still raise is one line
naming the file.

Dropout of a ``transformers`` model is OFF: the problem keeps it in eval mode while training.
Its attention-probability dropout is a functional call inside the attention code that draws
from torch's generator (which vmap refuses, and which keyed draws cannot replace), so the
whole model trains without dropout; keyed hidden dropout alone would be a model of its own.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from ..data.hf import first_line, library_errors, plain_name, read_json_object, require, short
from ..errors import DataError, FocusflError

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

    @staticmethod
    def parameters_for(vocabulary: int, num_classes: int, width: int = MEAN_POOL_WIDTH) -> int:
        """Its parameter count, known before it is built: the embedding and the linear layer."""
        return vocabulary * width + width * num_classes + num_classes


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


# -- model folders -----------------------------------------------------------------------------------
# Checked in config.json before transformers reads it: integer sizes (the least each may be) and
# real numbers, under the names most architectures use (AutoConfig maps the others onto them,
# and the same checks run again on the config it builds).
CONFIG_INTEGERS = {"vocab_size": 1, "hidden_size": 1, "num_hidden_layers": 1, "num_attention_heads": 1,
                   "intermediate_size": 1, "max_position_embeddings": 1, "type_vocab_size": 0, "num_labels": 1,
                   "n_embd": 1, "n_layer": 1, "n_head": 1, "n_positions": 1, "d_model": 1, "dim": 1, "n_layers": 1,
                   "n_heads": 1, "hidden_dim": 1, "num_key_value_heads": 1, "head_dim": 1, "embedding_size": 1}
CONFIG_REALS = ("layer_norm_eps", "initializer_range", "hidden_dropout_prob", "attention_probs_dropout_prob",
                "classifier_dropout", "rms_norm_eps", "dropout", "attention_dropout")
DTYPE_NAMES = ("float32", "float16", "bfloat16", "float64", "auto")
# A sanity bound that keeps a config from hanging the build (the largest models have a few
# hundred layers; a config of a million layers took minutes to refuse by size).
MAX_LAYERS = 1024
MAX_CONFIG_BYTES = 16 << 20
# safetensors: the 8-byte header length, the header's limit, and each dtype's bytes per element.
SAFETENSORS_HEADER_LIMIT = 100 << 20
SAFETENSORS_DTYPES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2, "U16": 2,
                      "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


def check_config_file(path: Path) -> dict:
    """config.json as a dict, refused in one line naming the field when a value has the wrong
    type or range, names code of the folder's own (``auto_map``), or is absurdly large."""
    where = path / "config.json"
    if not where.is_file():
        raise DataError(f"model folder {path} has no config.json (save the model with save_pretrained)")
    if where.stat().st_size > MAX_CONFIG_BYTES:
        raise DataError(f"{where} is {where.stat().st_size:,} bytes, more than a model config holds")
    raw = read_json_object(where)
    if raw.get("auto_map") is not None:
        raise DataError(f"{where}: 'auto_map' names Python code of the folder's own, which focusfl never runs")
    if not isinstance(raw.get("model_type"), str):
        raise DataError(f"{where}: 'model_type' must name a transformers model type, got {short(raw.get('model_type'))}")
    for key, least in CONFIG_INTEGERS.items():
        if key in raw:
            _check_integer(raw[key], least, f"{where}: {key!r}")
    for key in CONFIG_REALS:
        value = raw.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value) or value < 0):
            raise DataError(f"{where}: {key!r} must be a number >= 0, got {short(value)}")
    architectures = raw.get("architectures")
    if architectures is not None and (not isinstance(architectures, list)
                                      or not all(isinstance(a, str) for a in architectures)):
        raise DataError(f"{where}: 'architectures' must be a list of class names, got {short(architectures)}")
    for key in ("dtype", "torch_dtype"):
        if raw.get(key) is not None and raw[key] not in DTYPE_NAMES:
            raise DataError(f"{where}: {key!r} must be one of {', '.join(DTYPE_NAMES)}, got {short(raw[key])}")
    if raw.get("hidden_act") is not None and not isinstance(raw["hidden_act"], str):
        raise DataError(f"{where}: 'hidden_act' must name an activation, got {short(raw['hidden_act'])}")
    return raw


def _check_integer(value: Any, least: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise DataError(f"{what} must be an integer >= {least}, got {short(value)}")
    return value


def check_safetensors(file: Path) -> dict[str, tuple[str, list[int]]]:
    """The header of a safetensors file, checked before any library reads it: an 8-byte length
    within the file and the format's 100 MB limit, a JSON object whose tensors have a known
    dtype, a shape of non-negative integers and byte ranges that tile the data exactly.
    Returns name -> (dtype, shape)."""
    size = file.stat().st_size
    with open(file, "rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise DataError(f"{file} is truncated: {len(prefix)} bytes, not even a header length")
        length = int.from_bytes(prefix, "little")
        if length < 2 or length > min(size - 8, SAFETENSORS_HEADER_LIMIT):
            raise DataError(f"{file}: its header claims {length:,} bytes, but the file holds {size - 8:,} after the "
                            f"length (and a header holds at most {SAFETENSORS_HEADER_LIMIT:,})")
        text = handle.read(length)
    try:
        header = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise DataError(f"{file}: its header is not JSON ({str(exc).splitlines()[0][:80]})") from None
    if not isinstance(header, dict):
        raise DataError(f"{file}: its header must be a JSON object, got {type(header).__name__}")
    data_bytes = size - 8 - length
    tensors, spans = {}, []
    for name, entry in header.items():
        if name == "__metadata__":
            if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
                raise DataError(f"{file}: '__metadata__' must map names to strings")
            continue
        what = f"{file}: tensor {name!r}"
        if not isinstance(entry, dict):
            raise DataError(f"{what} must be an object of dtype, shape and data_offsets")
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if dtype not in SAFETENSORS_DTYPES:
            raise DataError(f"{what}: unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                                                  for n in shape):
            raise DataError(f"{what}: 'shape' must be a list of integers >= 0, got {shape!r}"[:200])
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(
                isinstance(n, int) and not isinstance(n, bool) for n in offsets) and 0 <= offsets[0] <= offsets[1]):
            raise DataError(f"{what}: 'data_offsets' must be [begin, end] with 0 <= begin <= end, got {offsets!r}"[:200])
        if offsets[1] - offsets[0] != math.prod(shape) * SAFETENSORS_DTYPES[dtype]:
            raise DataError(f"{what}: shape {shape} of {dtype} needs {math.prod(shape) * SAFETENSORS_DTYPES[dtype]:,} "
                            f"bytes, its data_offsets span {offsets[1] - offsets[0]:,}")
        tensors[name] = (dtype, shape)
        spans.append((offsets[0], offsets[1], name))
    end = 0
    for begin, stop, name in sorted(spans):
        if begin != end:
            raise DataError(f"{file}: tensor {name!r} starts at byte {begin:,} of the data, expected {end:,} "
                            "(tensors must tile the data)")
        end = stop
    if end != data_bytes:
        raise DataError(f"{file}: its tensors cover {end:,} bytes of data, the file holds {data_bytes:,} (truncated?)")
    return tensors


def check_weights(path: Path) -> list[Path]:
    """The safetensors files of a model folder (one, or the shards its index names), each
    header checked; pickle weights (which run code when loaded) and no weights are refused."""
    if (path / "model.safetensors").is_file():
        files = [path / "model.safetensors"]
    elif (path / "model.safetensors.index.json").is_file():
        index = path / "model.safetensors.index.json"
        mapping = read_json_object(index).get("weight_map")
        if not isinstance(mapping, dict) or not mapping or not all(plain_name(v) for v in mapping.values()):
            raise DataError(f"{index}: 'weight_map' must map tensor names to shard files in {path}")
        files = [path / name for name in sorted(set(mapping.values()))]
        for file in files:
            if not file.is_file():
                raise DataError(f"{index} names the shard {file.name!r}, which is not a file in {path}")
    else:
        pickled = [name for name in PICKLE_WEIGHTS if (path / name).is_file()]
        if pickled:
            raise DataError(
                f"model folder {path}: refusing {pickled[0]} (pickle weights can run code); save it with "
                "save_pretrained(safe_serialization=True)"
            )
        raise DataError(
            f"model folder {path} has no model.safetensors (model=hf-config:{path} builds a random model from its config)"
        )
    for file in files:
        check_safetensors(file)
    return files


def load_config(path: Path, num_classes: int):
    """The transformers config of a checked config.json (sizes checked again under the names
    transformers gives them), with ``num_classes`` labels."""
    check_config_file(path)
    transformers = require("transformers", "model=hf:FOLDER")
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:
        config = transformers.AutoConfig.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    except Exception as exc:  # noqa: BLE001 - transformers' and huggingface_hub's validation errors
        if not library_errors(exc):
            raise
        raise DataError(f"cannot read model config {path / 'config.json'}: {first_line(exc)}") from None
    mapping = transformers.models.auto.modeling_auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES
    if config.model_type not in mapping:
        raise DataError(
            f"model folder {path} holds a {config.model_type!r} model, which has no sequence-classification "
            "class in transformers"
        )
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"):
        value = getattr(config, key, None)
        if value is not None:
            _check_integer(value, 1, f"{path / 'config.json'}: {key!r}")
    activation = getattr(config, "hidden_act", None)
    if isinstance(activation, str):
        from transformers.activations import ACT2FN

        if activation not in ACT2FN:
            raise DataError(f"{path / 'config.json'}: 'hidden_act' names {activation!r}, which transformers does not "
                            f"have (e.g. {', '.join(sorted(ACT2FN)[:4])})")
    heads = [a for a in (config.architectures or []) if a.endswith("ForSequenceClassification")]
    if heads and config.num_labels != num_classes:
        raise DataError(
            f"model folder {path}: its classification head has {config.num_labels} labels, the data has "
            f"{num_classes} classes"
        )
    config.num_labels = num_classes
    return config


def lower_bound_parameters(config) -> int:
    """Parameters a transformer of ``config`` has at least: the token embedding and, per layer,
    the four attention projections (checked before the model is even laid out)."""
    vocabulary = getattr(config, "vocab_size", 0) or 0
    width = getattr(config, "hidden_size", 0) or 0
    layers = getattr(config, "num_hidden_layers", 0) or 0
    return int(vocabulary) * int(width) + int(layers) * 4 * int(width) ** 2


def parameter_count(transformers, config, path: Path) -> int:
    """The exact parameter count of the model ``config`` builds, laid out on torch's meta
    device (no memory behind it)."""
    try:
        with torch.device("meta"):
            model = transformers.AutoModelForSequenceClassification.from_config(
                config, attn_implementation="eager", trust_remote_code=False)
    except Exception as exc:  # noqa: BLE001 - a config transformers accepts but cannot build
        if not library_errors(exc):
            raise
        raise DataError(f"cannot build a model from {path / 'config.json'}: {first_line(exc)}") from None
    return sum(p.numel() for p in model.parameters())


def _check_loaded(model, loading: dict, files: list[Path]) -> None:
    """DataError when the weights gave the model none of its parameters outside the new
    classification head (a checkpoint of another architecture: every weight would be random)."""
    missing = set(loading.get("missing_keys") or ())
    body = [name for name, _ in model.named_parameters() if not name.startswith(("classifier.", "score."))]
    if body and all(name in missing for name in body):
        where = files[0] if len(files) == 1 else files[0].parent
        raise DataError(f"{where} holds none of the weights of the {type(model).__name__} its config.json "
                        "describes (a checkpoint of another model?)")


def load_sequence_classifier(spec: str, num_classes: int,
                             check_size: Callable[..., None] | None = None, vocabulary: int = 0,
                             vocabulary_owner: str = "the token ids need a vocabulary of",
                             tokens: int = 0) -> SequenceClassifier:
    """``hf:FOLDER`` (config.json and safetensors weights) or ``hf-config:FOLDER`` (config.json
    only: a randomly initialised model, drawn from the caller's seeded generator).

    A checkpoint without a classification head (bert-base-uncased is BertForMaskedLM) gets a
    new head for ``num_classes``; one with a head must have exactly ``num_classes`` labels.
    Before anything is built: config.json is checked field by field, the weights' headers are
    checked, and ``check_size(parameters, what, at_least)`` is called with a lower bound of the
    model's parameters (``at_least`` True), then with their exact count (the caller checks the memory they and the run's
    per-client state need). Refused in one line: a missing folder or config.json, a model type
    without a sequence-classification class, pickle weights (.bin), code of the folder's own
    (auto_map), an embedding smaller than ``vocabulary`` (what the data's token ids need; its
    owner named by ``vocabulary_owner``), fewer positions than the data's ``tokens`` per
    sequence, and any error transformers or safetensors raise while loading.
    """
    kind, _, folder = spec.partition(":")
    path = Path(folder).expanduser()
    if not path.is_dir():
        raise DataError(f"model folder {path} not found")
    config = load_config(path, num_classes)
    positions = getattr(config, "max_position_embeddings", None)
    if isinstance(positions, int) and positions < tokens:
        raise DataError(f"sequences of up to {tokens} tokens are longer than the model's {positions} positions "
                        f"({path / 'config.json'}); set max_length={positions} or less")
    embedding = getattr(config, "vocab_size", None)
    if isinstance(embedding, int) and embedding < vocabulary:
        raise DataError(f"{vocabulary_owner} {vocabulary:,} is larger than the model's embedding ({embedding:,} tokens, "
                        f"{path / 'config.json'})")
    files = check_weights(path) if kind == "hf" else []
    transformers = require("transformers", f"model={kind}:FOLDER")
    what = f"the model of {path / 'config.json'}"
    if check_size is not None:
        check_size(lower_bound_parameters(config), what, True)
    layers = getattr(config, "num_hidden_layers", None)
    if isinstance(layers, int) and layers > MAX_LAYERS:  # before laying out so many, which takes minutes
        raise DataError(f"{path / 'config.json'}: 'num_hidden_layers' is {layers:,}, more than {MAX_LAYERS:,} "
                        "(the largest models have a few hundred)")
    if check_size is not None:
        check_size(parameter_count(transformers, config, path), what)
    auto = transformers.AutoModelForSequenceClassification
    try:
        if kind == "hf-config":
            model = auto.from_config(config, attn_implementation="eager", trust_remote_code=False)
        else:
            model, loading = auto.from_pretrained(
                str(path), config=config, local_files_only=True, trust_remote_code=False, use_safetensors=True,
                attn_implementation="eager", output_loading_info=True,
            )
            _check_loaded(model, loading, files)
    except FocusflError:
        raise
    except BaseException as exc:  # noqa: BLE001 - transformers' and safetensors' (Rust) errors
        if not library_errors(exc):
            raise
        source = files[0] if len(files) == 1 else path
        raise DataError(f"cannot load a sequence classifier from {source}: {first_line(exc)}") from None
    return SequenceClassifier(model)


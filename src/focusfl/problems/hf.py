"""Neural networks on Hugging Face datasets: images or token sequences, through nn's machinery.

``nn:data=hf:PATH,...`` builds this problem (problems/__init__.py): the same Problem as
``NeuralNetwork`` (flat parameter vector, ``vmap`` over clients of ``grad_and_value`` of a
``functional_call``, minibatches keyed by (seed, round, client, step), validation share,
formulation rule), on data read by ``focusfl.data.hf`` and split among clients by focusfl's
partitioners, flwr-datasets' (``flwr-iid``, ``flwr-dirichlet``, ``flwr-pathological``,
``flwr-shard``) or a natural-id column (``partition=natural,id_column=writer``).

Image columns become images ``[M, C, H, W]`` and train exactly as image files do. Token
sequences are stored packed ``[M, 2, L]`` (ids and attention mask, padded to the longest
sequence of the dataset) in the problem's sample table; every batch the model sees (one
gradient call of all active clients of a chunk, one evaluation batch) is cut to the longest
sequence in it (:meth:`inputs`), a rule of the batch's contents, so deterministic. The model is
``text-mean`` (built in, no ``transformers``), or a ``transformers`` sequence classifier from a
local folder (problems/text_models.py; trained with dropout off).
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from ..data import ImageData, infer_classes, label_histograms, make_partition
from ..data.hf import HFSplits, check_tokenizer_folder, load_hf
from ..data.partition import FLWR_PARTITIONERS, PARTITIONERS, flwr_partition, natural_partition
from ..errors import ConfigError, DataError
from ..limits import check_allocation
from .models import default_model
from .nn import NeuralNetwork, carve_validation
from .nn.problem import _seeded_model, _validate
from .text_models import MEAN_POOL_WIDTH, TEXT_MODELS, MeanPoolText, SequenceClassifier, load_sequence_classifier


class HuggingFaceNetwork(NeuralNetwork):
    """Classification of a Hugging Face dataset's images or token sequences (``data=hf:PATH``)."""

    defaults: ClassVar[dict[str, Any]] = {
        **NeuralNetwork.defaults,
        "data": "hf:",  # hf:PATH, a save_to_disk folder or a .parquet/.csv/.json/.jsonl file
        "input": "auto",  # the input column (auto: input_ids, image, img, text or sentence)
        "label": "label",  # the label column (integers 0..K-1, or a ClassLabel)
        "tokenizer": "",  # a local tokenizer folder for a text column ("" = pre-tokenized ids)
        "max_length": 128,  # tokens kept per sequence (truncation)
        "test_split": "test",  # the split evaluated on, when the dataset has it (else test_fraction)
        "id_column": "",  # partition=natural: client k = the k-th distinct value of this column
        "classes_per_client": 2,  # partition=flwr-pathological
    }

    def __init__(
        self, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
        allow_model_import: bool = False, state_size=None, **params: Any,
    ) -> None:
        p = {**self.defaults, **params}
        _validate(p)
        _validate_hf(p)
        self._set_run_basics(p, dtype, device, state_size)
        source = load_hf(
            _resolve(p["data"], p["data_dir"]), input=p["input"], label=p["label"], tokenizer=p["tokenizer"],
            max_length=int(p["max_length"]), test_split=p["test_split"], test_fraction=float(p["test_fraction"]),
            seed=int(p["seed"]), id_column=p["id_column"],
        )
        self.kind = source.kind
        if self.kind == "tokens" and self.augment:
            raise ConfigError("augment=crop-flip applies to images, not to token sequences")
        self.num_classes = class_count(source, self.num_clients)
        self.input_shape = tuple(source.train_inputs.shape[1:])
        parts = client_parts(p, source)
        parts, held = carve_validation(parts, float(p["validation"]), int(p["seed"]))
        self._histograms = label_histograms(source.train_labels, parts, self.num_classes)
        split = ImageData if self.kind == "image" else _Split
        self._store(split(source.train_inputs, source.train_labels), split(source.test_inputs, source.test_labels),
                    parts, held, standardise=self.kind == "image")
        module = self._build_model(p, source, allow_model_import)
        self._start(module, p)

    # -- model ---------------------------------------------------------------------------------------
    def _build_model(self, p: dict[str, Any], source: HFSplits, allow_import: bool) -> nn.Module:
        seed = int(p["seed"])
        if self.kind == "image":
            if p["model"] == "auto":
                p["model"] = default_model(source.name, self.input_shape)
            return _seeded_model(p["model"], self.input_shape, self.num_classes, seed, allow_import)
        if p["model"] == "auto":
            p["model"] = "text-mean"
        name = str(p["model"])
        what = "the tokenizer's vocabulary" if p["tokenizer"] else "the token ids need a vocabulary of"
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)  # initial values (and a checkpoint's new head) drawn from the seed
            if name == "text-mean":
                self.check_model_memory(MeanPoolText.parameters_for(source.vocabulary, self.num_classes),
                                        f"model text-mean (an embedding of {source.vocabulary:,} tokens)")
                module = MeanPoolText(source.vocabulary, self.num_classes)
            elif name.startswith(("hf:", "hf-config:")):
                module = load_sequence_classifier(name, self.num_classes, self.check_model_memory,
                                                  vocabulary=source.vocabulary, vocabulary_owner=what,
                                                  tokens=self.input_shape[-1])
            else:
                raise ConfigError(
                    f"model {name!r} cannot read token sequences; use {', '.join(TEXT_MODELS)}, hf:FOLDER "
                    "(a transformers checkpoint) or hf-config:FOLDER"
                )
        positions = getattr(getattr(getattr(module, "model", None), "config", None), "max_position_embeddings", None)
        if isinstance(positions, int) and positions < self.input_shape[-1]:
            raise DataError(
                f"sequences of up to {self.input_shape[-1]} tokens are longer than the model's {positions} "
                f"positions; set max_length={positions} or less"
            )
        if module.vocabulary() < source.vocabulary:
            raise DataError(
                f"{what} {source.vocabulary:,} is larger than the model's embedding ({module.vocabulary():,} tokens)"
            )
        return module

    def _setup_model(self, module: nn.Module) -> None:
        super()._setup_model(module)
        if isinstance(module, SequenceClassifier):
            self.grouped.train_model.eval()  # dropout off (text_models.py says why)

    # -- inputs --------------------------------------------------------------------------------------
    def inputs(self, images: torch.Tensor) -> torch.Tensor:
        """Stored samples as model inputs: images standardised (as nn's); packed token sequences
        [..., 2, L] cut to the longest sequence among them (its padding is masked anyway)."""
        if self.kind == "image":
            return super().inputs(images)
        longest = int(images[..., 1, :].sum(dim=-1).max()) if images.numel() else 1
        return images[..., : max(longest, 1)]

    def test_inputs(self) -> torch.Tensor:
        if self.kind == "image":
            return super().test_inputs()
        return self.test_images  # cut per evaluation batch

    def input_paths(self) -> dict[str, Path]:
        """The dataset (its file or folder), the tokenizer folder and a pretrained model's folder."""
        p = self.params
        paths = {"data": Path(_resolve(p["data"], p["data_dir"])[3:]).resolve()}
        if p["tokenizer"]:
            paths["tokenizer"] = Path(p["tokenizer"]).expanduser().resolve()
        model = str(p["model"])
        for prefix in ("hf:", "hf-config:"):
            if model.startswith(prefix):
                paths["model"] = Path(model[len(prefix):]).expanduser().resolve()
        return paths

    def data_fingerprint(self) -> str:
        """nn's digest of the client data (training inputs, labels, partition) and of the initial
        model: the token ids already depend on the tokenizer, and a node's copy of a pretrained
        model that differs from the server's would compute other gradients (focusfl.flower)."""
        cached = getattr(self, "_model_fingerprint", None)
        if cached is None:
            digest = hashlib.sha256(super().data_fingerprint().encode())
            x0 = self.initial_point().detach().cpu().contiguous().numpy()
            digest.update(f"{x0.dtype.str}{x0.shape}".encode())
            digest.update(x0.reshape(-1).view(np.uint8))
            cached = self._model_fingerprint = digest.hexdigest()[:32]
        return cached

    def client_rows(self) -> list[np.ndarray]:
        """Each client's training rows (indices into the training split, sorted)."""
        starts, sizes = self.client_starts.cpu().numpy(), self.sizes.cpu().numpy()
        order = self.client_order.cpu().numpy()
        return [np.sort(order[start : start + size]) for start, size in zip(starts, sizes)]


class _Split:
    """Packed token inputs and labels of one split (the fields nn's sample table reads)."""

    def __init__(self, images: np.ndarray, labels: np.ndarray) -> None:
        self.images, self.labels = images, labels


def _resolve(data: str, data_dir: str) -> str:
    """``hf:PATH``, a relative PATH taken under ``data_dir`` when it is not found here."""
    path = Path(data[3:]).expanduser()
    if not path.is_absolute() and not path.exists() and data_dir:
        path = Path(data_dir).expanduser() / path
    return f"hf:{path}"


def class_count(source: HFSplits, clients: int) -> int:
    """The classes: the ClassLabel's count, else 0..K-1 read off the training labels; every
    label (test ones too) must be one of them."""
    where = f"dataset {source.name!r}"
    classes = source.num_classes or infer_classes(source.train_labels, where,
                                                  declare="declare the classes with a ClassLabel feature")
    if classes < 2:
        raise DataError(f"{where} has {classes} class(es); classification needs at least two")
    # The clients' label counts [N, K] and an output layer of at least MEAN_POOL_WIDTH inputs.
    check_allocation(classes * 8 * (clients + MEAN_POOL_WIDTH), f"{where}: {classes:,} classes for {clients:,} clients")
    for split, labels in (("training", source.train_labels), ("test", source.test_labels)):
        if len(labels) and int(labels.max()) >= classes:
            raise DataError(f"{where}: {split} label {int(labels.max())} is outside its {classes} classes 0..{classes - 1}")
    return int(classes)


def client_parts(p: dict[str, Any], source: HFSplits) -> list[np.ndarray]:
    """The clients' training rows: focusfl's partitioners, Flower's, or a natural-id column."""
    name, clients, seed = p["partition"], int(p["clients"]), int(p["seed"])
    labels = source.train_labels
    if name == "natural":
        return natural_partition(source.train_ids, clients, p["id_column"])
    if clients > len(labels):
        raise ConfigError(f"cannot split {len(labels)} samples among {clients} clients")
    if name in FLWR_PARTITIONERS:
        parts = flwr_partition(
            name, labels, clients, seed, alpha=float(p["alpha"]), min_size=int(p["min_size"]),
            shards=int(p["shards"]), classes_per_client=int(p["classes_per_client"]),
        )
        if min(len(part) for part in parts) < 1:
            raise ConfigError(f"{name} partition left a client without data; use fewer clients")
        return parts
    return make_partition(name, labels, clients, seed, alpha=float(p["alpha"]), min_size=int(p["min_size"]),
                          shards=int(p["shards"]))


def _validate_hf(p: dict[str, Any]) -> None:
    where = "problem 'nn' (data=hf:...)"
    if not str(p["data"]).startswith("hf:") or len(str(p["data"])) <= 3:
        raise ConfigError(f"{where}: data must be hf:PATH, got {p['data']!r}")
    for key in ("input", "label", "tokenizer", "test_split", "id_column"):
        if not isinstance(p[key], str):
            raise ConfigError(f"{where}: {key} must be a name, got {p[key]!r}")
    for key in ("max_length", "classes_per_client"):
        if isinstance(p[key], bool) or not isinstance(p[key], int) or p[key] < 1:
            raise ConfigError(f"{where}: {key} must be an integer >= 1, got {p[key]!r}")
    known = [*PARTITIONERS, *FLWR_PARTITIONERS, "natural"]
    if p["partition"] not in known:
        raise ConfigError(f"{where}: unknown partition {p['partition']!r} (known: {', '.join(known)})")
    model_folder = str(p["model"]).partition(":")[2]
    if model_folder and str(p["model"]).startswith(("hf:", "hf-config:")):
        if not Path(model_folder).expanduser().is_dir():  # before the data are read and tokenized
            raise DataError(f"model folder {Path(model_folder).expanduser()} not found")
    if p["tokenizer"]:
        check_tokenizer_folder(Path(p["tokenizer"]).expanduser())
    if (p["partition"] == "natural") != bool(p["id_column"]):
        raise ConfigError(f"{where}: partition=natural and id_column=COLUMN go together")

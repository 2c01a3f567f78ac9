"""Neural networks as federated problems: any ``torch.nn.Module`` plus per-client image data.

The problem turns a module into the flat-parameter interface the algorithms use: a model is a
vector of d floats, and ``oracle(clients)`` returns minibatch gradients for a stack of points
``[n, d]``, one row per active client, computed for all of them in ONE batched call:
``torch.func.vmap`` over clients of ``grad_and_value`` of a ``functional_call`` of the module.
No Python loop runs over clients.

Data live on the problem's device: the training images once (uint8 when the files are), the
labels, and each client's index set (a padded ``[N, max_size]`` table plus sizes). Client i's
minibatch at local step t of round r is drawn from (seed, r, i, t) with the counter-based hash
of ``focusfl.rng``, so every engine sees the same samples; a client holding fewer samples than
the batch size uses all of them (its missing slots get weight 0).

Objective: f_i = mean cross-entropy over client i's samples, F = (1/N) sum_i f_i. Metrics every
E rounds: ``test_loss`` and ``test_accuracy`` of the server model on the held-out split, and
``train_loss``, the mean of the minibatch losses the participating clients computed during
their local steps since the previous row (left empty when no client trained in between).

Batch-norm running statistics are not supported (see models.prepare_for_clients); dropout
layers use keyed masks, also drawn from (seed, round, client, step).
"""
from __future__ import annotations

import copy
import math
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, grad_and_value, vmap

from ..data import Dataset, ImageData, label_histograms, load_dataset, make_partition
from ..data.partition import check_client_tables
from ..errors import ConfigError
from ..rng import hash_bits, uniform
from ..spec import parse_spec
from .base import Problem
from . import client_batched
from .models import KeyedDropout, default_model, make_model, prepare_for_clients

# Last coordinate of the dropout-key hash; minibatch keys use sample positions there, which
# never reach this value, so the two streams cannot collide.
_DROPOUT_COORD = 0xFFFFFFFF


# Activation memory per client chunk on CPU (client_chunk=auto): on a 2-core Xeon the MNIST CNN
# at batch 128 ran about 20% faster in chunks of 4-5 clients (4 MB per client) than all 10 at
# once, and no slower at batch 32 with all 10 (1 MB each).
CPU_ACTIVATION_BUDGET = 16 << 20


class NeuralNetwork(Problem):
    """Image classification with a PyTorch model, data split non-iid among N clients."""

    late_metrics = ("train_loss",)  # no participants have trained before round 1

    name: ClassVar[str] = "nn"
    default_dtype: ClassVar[str] = "float32"
    defaults: ClassVar[dict[str, Any]] = {
        "data": "mnist",  # dataset name or path to an .npz file
        "data_dir": "",  # folder with the dataset files ("" = $FOCUSFL_DATA or ~/.cache/focusfl)
        "download": False,  # fetch a missing dataset from its canonical source
        "model": "auto",  # zoo name, package.module:factory, or auto (per dataset)
        "partition": "dirichlet",  # dirichlet, iid or shards
        "alpha": 0.5,  # Dirichlet concentration (smaller = more label skew)
        "min_size": 10,  # Dirichlet: fewest samples any client may get
        "shards": 2,  # shards per client (partition=shards)
        "clients": 32,
        "batch": 64,  # minibatch per client and local step
        "test_fraction": 0.0,  # > 0: hold out this fraction of the training images as test set
        "eval_batch": 1000,  # samples per forward pass when evaluating
        "client_chunk": "auto",  # k > 0: batch at most k clients at once; 0: all; auto: see client_chunk
        "client_batching": "auto",  # auto: grouped-weights path for nn.Sequential models; vmap: always vmap
        "seed": 0,  # partition, held-out split and model initialisation
    }

    def __init__(
        self,
        *,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        module: nn.Module | None = None,
        dataset: Dataset | None = None,
        allow_model_import: bool = False,
        **params: Any,
    ) -> None:
        p = {**self.defaults, **params}
        _validate(p)
        self.dtype = dtype
        self.device = torch.device(device)
        self.batch = int(p["batch"])
        self.num_clients = int(p["clients"])
        self.eval_batch = int(p["eval_batch"])
        if dataset is None:
            dataset = load_dataset(p["data"], p["data_dir"] or None, bool(p["download"]))
        else:
            p["data"] = dataset.name
        train, test = split_test(dataset, float(p["test_fraction"]), int(p["seed"]))
        self.num_classes = dataset.num_classes
        self.input_shape = tuple(train.images.shape[1:])
        parts = make_partition(
            p["partition"], train.labels, self.num_clients, int(p["seed"]),
            alpha=float(p["alpha"]), min_size=int(p["min_size"]), shards=int(p["shards"]),
        )
        self._histograms = label_histograms(train.labels, parts, self.num_classes)
        self._store_data(train, test, parts)
        if module is None:
            if p["model"] == "auto":
                p["model"] = default_model(dataset.name, self.input_shape)
            module = _seeded_model(p["model"], self.input_shape, self.num_classes, int(p["seed"]), allow_model_import)
        else:
            p["model"] = f"custom:{type(module).__name__}"
        self.params = p
        self._setup_model(module)
        self._loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        self._loss_count = 0
        self._probe()

    # -- data -----------------------------------------------------------------------------------
    def _store_data(self, train: ImageData, test: ImageData, parts: list[np.ndarray]) -> None:
        dev = self.device
        self.train_images = torch.as_tensor(train.images, device=dev)
        self.train_labels = torch.as_tensor(train.labels, dtype=torch.int64, device=dev)
        self.test_images = torch.as_tensor(test.images, device=dev)
        self.test_labels = torch.as_tensor(test.labels, dtype=torch.int64, device=dev)
        sizes = np.array([len(part) for part in parts], dtype=np.int64)
        check_client_tables(sizes, self.batch, train.images[0], self.dtype.itemsize)
        table = np.empty((self.num_clients, int(sizes.max())), dtype=np.int64)
        for i, part in enumerate(parts):
            table[i, : len(part)] = part
            table[i, len(part) :] = part[0]  # padding: a valid index, never given weight
        self.client_index = torch.as_tensor(table, device=dev)
        self.sizes = torch.as_tensor(sizes, device=dev)
        # Per-sample weight 1/(N m_i) of F = (1/N) sum_i mean_{s in i} loss_s (0 if unowned).
        weights = np.zeros(len(train.labels))
        for part in parts:
            weights[part] = 1.0 / (self.num_clients * len(part))
        self._sample_weights = torch.as_tensor(weights, dtype=self.dtype, device=dev)
        # Standardise every channel with the training set's mean and standard deviation.
        mean, std = channel_statistics(train.images)
        self._scale = torch.as_tensor(1.0 / std, dtype=self.dtype, device=dev).view(-1, 1, 1)
        self._shift = torch.as_tensor(-mean / std, dtype=self.dtype, device=dev).view(-1, 1, 1)
        # Minibatch keys cover this many positions for every client, whichever clients are active.
        self._positions = torch.arange(max(self.batch, int(sizes.max())), device=dev)

    def inputs(self, images: torch.Tensor) -> torch.Tensor:
        """Stored images (any leading shape) as standardised model inputs of the problem's dtype."""
        return images.to(self.dtype) * self._scale + self._shift

    def label_histograms(self) -> np.ndarray:
        """Counts ``[N, C]`` of each class held by each client (what label participation uses)."""
        return self._histograms.copy()

    # -- model ----------------------------------------------------------------------------------
    def _setup_model(self, module: nn.Module) -> None:
        module = prepare_for_clients(module).to(device=self.device, dtype=self.dtype)
        named = [(n, t) for n, t in module.named_parameters() if t.requires_grad]
        if not named:
            raise ConfigError("the model has no trainable parameters")
        self._names = [n for n, _ in named]
        self._shapes = [t.shape for _, t in named]
        self._numels = [t.numel() for _, t in named]
        self.dim = sum(self._numels)
        self._x0 = torch.cat([t.detach().reshape(-1) for _, t in named]).clone()
        self._key_names = [f"{n}.key" if n else "key" for n, m in module.named_modules() if isinstance(m, KeyedDropout)]
        self._train_model = module.train()
        self._eval_model = copy.deepcopy(module).eval()
        # The grouped-weights path needs every parameter trainable (it builds all of them from z).
        all_trainable = len(named) == len(list(module.parameters()))
        self.batched_sequential = (
            self.params["client_batching"] == "auto" and all_trainable and client_batched.supports(module)
        )
        if self.batched_sequential:
            self._client_grads = self._sequential_loss_and_gradients
        else:
            self._client_grads = vmap(grad_and_value(self._minibatch_loss))

    @property
    def client_chunk(self) -> int | None:
        """How many clients the vectorized engine batches at once (None: all active clients).

        ``client_chunk=k`` fixes it, 0 means all. ``auto`` means all on an accelerator and, on a
        CPU, as many as keep one layer's activations for the whole chunk within
        CPU_ACTIVATION_BUDGET: larger chunks gain nothing there (the per-client work is already
        large) and their fresh multi-megabyte buffers cost page faults and cache misses.
        """
        chunk = self.params["client_chunk"]
        if chunk != "auto":
            return int(chunk) or None
        if self.device.type != "cpu":
            return None
        per_client = self._largest_activation_bytes * self.batch
        return max(1, CPU_ACTIVATION_BUDGET // max(1, per_client))

    def _sequential_loss_and_gradients(self, z, images, labels, weights, keys):
        return client_batched.loss_and_gradients(
            self._train_model, self._names, self._shapes, self._numels, z, images, labels, weights, keys
        )

    def unflatten(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """A flat parameter vector [d] as the module's named parameters (views, no copies)."""
        chunks = torch.split(flat, self._numels)
        return {n: c.view(s) for n, c, s in zip(self._names, chunks, self._shapes)}

    def _minibatch_loss(self, flat, images, labels, weights, key):
        """Weighted mean cross-entropy of one client's minibatch (vmapped over clients)."""
        state = self.unflatten(flat)
        for name in self._key_names:
            state[name] = key
        logits = functional_call(self._train_model, state, (images,))
        losses = F.cross_entropy(logits, labels, reduction="none")
        return (losses * weights).sum() / weights.sum()

    def _probe(self) -> None:
        """Run the model once on two samples, then one gradient, so a mismatch fails now in one line."""
        name = self.params["model"]
        failure = f"model {name!r} cannot train on inputs {self.input_shape}"
        largest = [0]

        def record_output(module, inputs, output):  # the largest layer output, per sample
            if isinstance(output, torch.Tensor) and output.dim() > 0:
                largest[0] = max(largest[0], output[0].numel() * output.element_size())

        hook = torch.nn.modules.module.register_module_forward_hook(record_output)
        try:
            with torch.no_grad():
                logits = self._logits(self._x0, self.train_images[:2])
        except (RuntimeError, ValueError, TypeError, IndexError) as exc:
            raise ConfigError(f"{failure}: {_first_line(exc)}") from None
        finally:
            hook.remove()
        self._largest_activation_bytes = largest[0]
        if tuple(logits.shape) != (2, self.num_classes):
            raise ConfigError(
                f"model {name!r} gives outputs {tuple(logits.shape[1:])} per sample, "
                f"expected ({self.num_classes},) class scores"
            )
        try:
            clients = torch.zeros(1, dtype=torch.int64, device=self.device)
            self.oracle(clients, seed=0, round=0)(self._x0[None, :], 0)
        except (RuntimeError, ValueError, TypeError, IndexError) as exc:
            raise ConfigError(f"{failure}: {_first_line(exc)}") from None
        finally:  # the probe's loss is no participant's
            self._loss_sum.zero_()
            self._loss_count = 0

    def initial_point(self) -> torch.Tensor:
        return self._x0.clone()

    # -- gradients --------------------------------------------------------------------------------
    def client_gradients(self, x, clients, *, seed, round, step):
        return self.oracle(clients, seed=seed, round=round)(x, step)

    def oracle(self, clients: torch.Tensor, *, seed: int, round: int):
        index = self.client_index.index_select(0, clients)
        sizes = self.sizes.index_select(0, clients)
        last = index.shape[1] - 1

        def gradients(z: torch.Tensor, step: int) -> torch.Tensor:
            if clients.numel() == 0:
                return torch.zeros_like(z)
            picks, weights = self.minibatch(seed, round, clients, step, sizes)
            ids = torch.gather(index, 1, picks.clamp(max=last))
            keys = hash_bits(seed, round, clients, step, _DROPOUT_COORD, device=self.device)
            grads, losses = self._client_grads(
                z, self.inputs(self.train_images[ids]), self.train_labels[ids], weights, keys
            )
            self._loss_sum = self._loss_sum + losses.detach().sum().to(torch.float64)
            self._loss_count += clients.numel()
            return grads

        return gradients

    def minibatch(self, seed, round_, clients, step, sizes) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions ``[n, batch]`` into each client's index set, and their 0/1 weights.

        Every position j < size of client i gets the key uniform(seed, round, i, step, j); the
        ``batch`` smallest keys win (the same draw as ``rng.minibatch_indices``). Positions past
        the client's size get key 2 so they come last, and weight 0.
        """
        positions = self._positions
        keys = uniform(seed, round_, clients[:, None], step, positions[None, :], device=self.device)
        keys = torch.where(positions[None, :] < sizes[:, None], keys, torch.full_like(keys, 2.0))
        picks = torch.topk(keys, self.batch, dim=1, largest=False, sorted=True).indices
        return picks, (picks < sizes[:, None]).to(self.dtype)

    # -- evaluation ------------------------------------------------------------------------------
    def _logits(self, x: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
        return functional_call(self._eval_model, self.unflatten(x), (self.inputs(images),))

    def evaluate(self, x: torch.Tensor, images: torch.Tensor, labels: torch.Tensor) -> tuple[float, float]:
        """(mean cross-entropy, accuracy) of the model x on a split, in batches of eval_batch."""
        total_loss = torch.zeros((), dtype=torch.float64, device=self.device)
        correct = torch.zeros((), dtype=torch.int64, device=self.device)
        with torch.no_grad():
            for start in range(0, len(labels), self.eval_batch):
                logits = self._logits(x, images[start : start + self.eval_batch])
                target = labels[start : start + self.eval_batch]
                total_loss += F.cross_entropy(logits, target, reduction="sum").to(torch.float64)
                correct += (logits.argmax(dim=1) == target).sum()
        count = max(len(labels), 1)
        return float(total_loss) / count, float(correct) / count

    def metrics(self, x: torch.Tensor) -> dict[str, float]:
        test_loss, test_accuracy = self.evaluate(x, self.test_images, self.test_labels)
        row = {"test_loss": test_loss, "test_accuracy": test_accuracy}
        if self._loss_count:
            row["train_loss"] = float(self._loss_sum) / self._loss_count
        self._loss_sum = torch.zeros_like(self._loss_sum)
        self._loss_count = 0
        return row

    def loss(self, x: torch.Tensor) -> torch.Tensor:
        """F(x) = (1/N) sum_i f_i(x) over all training data (dropout off); costs a full pass."""
        total = torch.zeros((), dtype=self.dtype, device=self.device)
        with torch.no_grad():
            for start in range(0, len(self.train_labels), self.eval_batch):
                stop = start + self.eval_batch
                losses = F.cross_entropy(
                    self._logits(x, self.train_images[start:stop]), self.train_labels[start:stop], reduction="none"
                )
                total = total + (losses * self._sample_weights[start:stop]).sum()
        return total

    def gradient(self, x: torch.Tensor) -> torch.Tensor:
        """Exact gradient of F at x (dropout off), accumulated over batches of training data."""

        def weighted_loss(flat, images, labels, weights):
            logits = functional_call(self._eval_model, self.unflatten(flat), (self.inputs(images),))
            return (F.cross_entropy(logits, labels, reduction="none") * weights).sum()

        total = torch.zeros_like(x)
        for start in range(0, len(self.train_labels), self.eval_batch):
            stop = start + self.eval_batch
            total = total + grad(weighted_loss)(
                x, self.train_images[start:stop], self.train_labels[start:stop], self._sample_weights[start:stop]
            )
        return total

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, **self.params}


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _validate(p: dict[str, Any]) -> None:
    where = "problem 'nn'"
    for key in ("clients", "batch", "eval_batch", "min_size", "shards"):
        if not isinstance(p[key], int) or p[key] < 1:
            raise ConfigError(f"{where}: {key} must be an integer >= 1, got {p[key]!r}")
    if p["client_chunk"] != "auto" and (not isinstance(p["client_chunk"], int) or p["client_chunk"] < 0):
        raise ConfigError(f"{where}: client_chunk must be auto or an integer >= 0, got {p['client_chunk']!r}")
    if not isinstance(p["seed"], int) or p["seed"] < 0:
        raise ConfigError(f"{where}: seed must be an integer >= 0, got {p['seed']!r}")
    if p["client_batching"] not in ("auto", "vmap"):
        raise ConfigError(f"{where}: client_batching must be auto or vmap, got {p['client_batching']!r}")
    if not 0.0 <= float(p["test_fraction"]) < 1.0:
        raise ConfigError(f"{where}: test_fraction must be in [0, 1), got {p['test_fraction']}")
    if not float(p["alpha"]) > 0 or not math.isfinite(float(p["alpha"])):
        raise ConfigError(f"{where}: alpha must be a positive number, got {p['alpha']}")


def channel_statistics(images: np.ndarray, chunk: int = 2048) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and standard deviation of [M, C, H, W] images (1 where it is 0),
    accumulated in float64 over chunks so that CIFAR-sized uint8 data is never copied whole."""
    total = np.zeros(images.shape[1])
    squares = np.zeros(images.shape[1])
    for start in range(0, len(images), chunk):
        block = images[start : start + chunk].astype(np.float64)
        total += block.sum(axis=(0, 2, 3))
        squares += np.square(block).sum(axis=(0, 2, 3))
    count = images.shape[0] * images.shape[2] * images.shape[3]
    mean = total / count
    std = np.sqrt(np.maximum(squares / count - mean**2, 0.0))
    return mean, np.where(std > 0, std, 1.0)


def split_test(dataset: Dataset, fraction: float, seed: int) -> tuple[ImageData, ImageData]:
    """(train, test): a random held-out ``fraction`` of the training images, or the dataset's
    own test split when ``fraction`` is 0."""
    if fraction > 0:
        pool = dataset.train
        order = np.random.default_rng(np.random.SeedSequence([seed, 13])).permutation(len(pool))
        held = int(round(fraction * len(pool)))
        if held < 1 or held >= len(pool):
            raise ConfigError(f"test_fraction={fraction} leaves no test or no training images")
        return pool.subset(np.sort(order[held:])), pool.subset(np.sort(order[:held]))
    if dataset.test is None:
        raise ConfigError(
            f"dataset {dataset.name!r} has no test split: hold some images out with test_fraction (e.g. 0.2)"
        )
    if dataset.test.images.shape[1:] != dataset.train.images.shape[1:]:
        raise ConfigError(f"dataset {dataset.name!r}: train and test images differ in shape")
    return dataset.train, dataset.test


def _seeded_model(name: str, input_shape, num_classes: int, seed: int, allow_import: bool = False) -> nn.Module:
    """Build a model with its default initialisation drawn from ``seed`` (global RNG untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return make_model(name, input_shape, num_classes, allow_import=allow_import)


def with_data_options(spec: str | dict, data_dir: str | None, download: bool) -> str | dict:
    """The problem spec with the command line's --data-dir / --download folded in.

    Keys already in the spec win over --data-dir; both options apply to ``nn`` problems only.
    """
    if not data_dir and not download:
        return spec
    name, params = parse_spec(spec)
    if name != NeuralNetwork.name:
        raise ConfigError("--data-dir and --download apply to neural-network problems (--problem nn:...)")
    if data_dir:
        params.setdefault("data_dir", str(data_dir))
    if download:
        params["download"] = True
    return {"name": name, **params}

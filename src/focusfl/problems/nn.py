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
their local steps since the previous row (left empty when no client trained in between): the
oracle of a round keeps its calls' losses, the round returns them, and the round loop
(engine/loop.py) builds the row from them; the problem itself keeps nothing between rows.

Batch-norm running statistics are not supported (see models.prepare_for_clients); dropout
layers use keyed masks, also drawn from (seed, round, client, step), and so does the optional
augmentation (``augment=crop-flip``: random crop with padding 4 and horizontal flip, the
standard CIFAR transforms of the papers' code, as batched tensor ops on the stored images).

Speed: how the clients' gradients are computed (clients per batched call, memory layout of the
convolutions) is chosen by a deterministic rule from the device type, the model's activation
sizes and the batch (``formulation``), so a run's bytes never depend on timing or load;
measuring instead is an explicit opt-in (``client_chunk=measure``, ``layout=measure``) whose
outcome config.json records. Evaluation runs in inference mode on a test set standardised once,
in the chosen layout.
"""
from __future__ import annotations

import copy
import functools
import hashlib
import math
import time
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, grad_and_value, vmap
from torch.nn.parameter import UninitializedParameter

from ..data import Dataset, ImageData, label_histograms, load_dataset, make_partition
from ..data.partition import ClientRows, check_client_tables, client_rows
from ..errors import ConfigError
from ..limits import check_allocation
from ..rng import hash_bits, uniform
from ..spec import parse_spec
from . import client_batched
from .base import Oracle, Problem
from .models import KeyedDropout, default_model, make_model, prepare_for_clients

# Last coordinate of the dropout-key hash; minibatch keys use sample positions there, which
# never reach this value, so the two streams cannot collide. Augmentation keys add one more
# coordinate (the sample's slot in the minibatch) after their own marker.
_DROPOUT_COORD = 0xFFFFFFFF
_AUGMENT_COORD = 0xFFFFFFFE
AUGMENT_PADDING = 4  # RandomCrop(32, padding=4) of the papers' CIFAR code
# The stored samples of the local steps whose minibatches are drawn together (see _gradient_call).
DRAW_AHEAD_BYTES = 16 * 2**20

# Evaluation batch for eval_batch=auto: on a 2-core Xeon the CIFAR-10 CNN evaluated 10,000
# images 2.6x faster at 256 in channels-last than at 1000 in NCHW (a batch's activations stay
# in cache); accelerators want large batches.
EVAL_BATCH = {"cpu": 256}
EVAL_BATCH_ACCELERATOR = 2048
# Model-sized vectors a run holds besides the algorithm's state: the training model, its
# evaluation copy, the flat initial point and the server model (a lower bound: the size check).
MODEL_COPIES = 4

# client_chunk=auto: the largest power-of-two chunk whose forward activations (elements, summed
# over the model's leaf modules, times batch and clients) stay within this budget. On a 2-core
# Xeon, timed per client with one thread (2026-11-24): the MNIST CNN at batch 32 (0.73M elements
# a client) ran fastest at chunks of 4-8 (3.1 ms against 4.9 at one client), the CIFAR-10 CNN at
# batch 128 (5.8M) at 1-2, the MLP and logistic regression (< 0.1M) with every client at once;
# a budget of 2**23 elements picks 8, 1 and all of them. Accelerators want large calls; their
# budget (2**28 elements, 1 GiB in float32 before the backward pass) bounds memory instead.
_CHUNK_BUDGET_CPU = 1 << 23
_CHUNK_BUDGET_ACCELERATOR = 1 << 28
# client_chunk=measure times chunks of 1, 2, 4, ... clients; on a CPU it stops once a chunk is
# this much slower per client than the best so far (grouped convolutions cost more per sample
# as the group count grows there, so larger chunks only get worse).
_TUNE_STOP = 1.15
_CPU_MARGIN = 1.1  # a larger chunk replaces a smaller one on a CPU only if 10% faster per client
_TUNE_MAX_CHUNK = 64
# Measured formulations (client_chunk/layout=measure), per (device, model, input, batch, dtype,
# path, clients, threads).
_FORMULATIONS: dict[tuple, tuple[int | None, str]] = {}


class NeuralNetwork(Problem):
    """Image classification with a PyTorch model, data split non-iid among N clients."""

    late_metrics = ("train_loss",)  # no participants have trained before round 1
    metric_names = ("test_loss", "test_accuracy", "val_loss", "val_accuracy", "train_loss")

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
        "validation": 0.0,  # > 0: each client keeps this fraction of its own data out of training (val_* metrics)
        "evaluate": "test",  # test: test metrics (and val_* with validation); validation: val_* only (tuning)
        "eval_batch": "auto",  # samples per forward pass when evaluating; auto: 256 on CPU, 2048 on GPU
        "client_chunk": "auto",  # k > 0: at most k clients at once; 0: all; auto: by rule; measure: timed
        "client_batching": "auto",  # auto: grouped-weights path for nn.Sequential models; vmap: always vmap
        "layout": "auto",  # convolutions' memory layout: channels_last, nchw, auto (by rule) or measure
        "augment": "none",  # none, or crop-flip: random crop (padding 4) and horizontal flip
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
        state_size=None,
        **params: Any,
    ) -> None:
        p = {**self.defaults, **params}
        _validate(p)
        self._set_run_basics(p, dtype, device, state_size)
        if dataset is None:
            dataset = load_dataset(p["data"], p["data_dir"] or None, bool(p["download"]))
        else:
            p["data"] = dataset.name
        train, test = split_test(dataset, float(p["test_fraction"]), int(p["seed"]))
        self._dataset_files = dataset.files
        self.num_classes = dataset.num_classes
        self.input_shape = tuple(train.images.shape[1:])
        parts = make_partition(
            p["partition"], train.labels, self.num_clients, int(p["seed"]),
            alpha=float(p["alpha"]), min_size=int(p["min_size"]), shards=int(p["shards"]),
        )
        parts, held = carve_validation(parts, float(p["validation"]), int(p["seed"]))
        self._histograms = label_histograms(train.labels, parts, self.num_classes)
        self._store_data(train, test, parts)
        self._store_validation(train, held)
        if module is None:
            if p["model"] == "auto":
                p["model"] = default_model(dataset.name, self.input_shape)
            module = _seeded_model(p["model"], self.input_shape, self.num_classes, int(p["seed"]), allow_model_import)
        else:
            p["model"] = f"custom:{type(module).__name__}"
        self._start(module, p)

    def _start(self, module: nn.Module, p: dict[str, Any]) -> None:
        """Take the model and the parameters, then try one forward and one gradient call."""
        built = [t for t in module.parameters() if not isinstance(t, UninitializedParameter)]
        self.check_model_memory(sum(t.numel() for t in built), f"model {p['model']!r}")
        self.params = p
        self._setup_model(module)
        self._test_inputs: torch.Tensor | None = None  # the standardised test set, made once
        self._tuned = False
        self._channels_last_fails = False  # found by _probe
        self._probe()

    # -- data -----------------------------------------------------------------------------------
    def _set_run_basics(self, p: dict[str, Any], dtype: torch.dtype, device: str | torch.device,
                        state_size=None) -> None:
        """dtype, device, batch, clients, evaluation batch and augmentation from validated params
        (shared with the Hugging Face problem, problems/hf.py); ``state_size``: the run's
        algorithm's ``state_size(N, d)`` (None: not known here)."""
        self._state_size = state_size
        self.dtype = dtype
        self.device = torch.device(device)
        self.batch = int(p["batch"])
        self.num_clients = int(p["clients"])
        self.eval_batch = (
            int(p["eval_batch"]) if p["eval_batch"] != "auto" else EVAL_BATCH.get(self.device.type, EVAL_BATCH_ACCELERATOR)
        )
        self.augment = p["augment"] != "none"

    def _store_data(self, train: ImageData, test: ImageData, parts: list[np.ndarray]) -> None:
        self._store_samples(train, test, parts)
        # Standardise every channel with the training set's mean and standard deviation.
        mean, std = channel_statistics(train.images)
        self._scale = torch.as_tensor(1.0 / std, dtype=self.dtype, device=self.device).view(-1, 1, 1)
        self._shift = torch.as_tensor(-mean / std, dtype=self.dtype, device=self.device).view(-1, 1, 1)

    def _store_samples(self, train, test, parts: list[np.ndarray]) -> None:
        """The splits' samples (``.images`` [M, ...] as stored, ``.labels`` [M]) on the device and the
        clients' index tables; token inputs (problems/hf.py) share this with images."""
        dev = self.device
        self.train_images = torch.as_tensor(standard_strides(train.images), device=dev)
        self.train_labels = torch.as_tensor(train.labels, dtype=torch.int64, device=dev)
        self.test_images = torch.as_tensor(standard_strides(test.images), device=dev)
        self.test_labels = torch.as_tensor(test.labels, dtype=torch.int64, device=dev)
        table = client_rows(parts)
        sizes = table.sizes
        check_client_tables(sizes, self.batch, train.images[0], self.dtype.itemsize)
        # Every client's rows in one array and its offsets (no [N, largest client] table: a
        # natural partition of 10^5 writers, some with thousands of samples, would not fit).
        self.client_order = torch.as_tensor(table.rows, device=dev)
        self.client_starts = torch.as_tensor(table.starts[:-1], device=dev)
        self.sizes = torch.as_tensor(sizes, device=dev)
        # Per-sample weight 1/(N m_i) of F = (1/N) sum_i mean_{s in i} loss_s (0 if unowned).
        weights = np.zeros(len(train.labels))
        weights[table.rows] = 1.0 / (self.num_clients * np.repeat(sizes, sizes))
        self._sample_weights = torch.as_tensor(weights, dtype=self.dtype, device=dev)
        # Minibatch keys cover this many positions for every client, whichever clients are active.
        self._positions = torch.arange(max(self.batch, int(sizes.max())), device=dev)

    def _store_validation(self, train: ImageData, held: np.ndarray) -> None:
        """The clients' held-out samples, pooled: val_loss and val_accuracy are measured on them
        (the data a step size is chosen on, never the test set)."""
        self.validation_images = torch.as_tensor(standard_strides(train.images[held]), device=self.device)
        self.validation_labels = torch.as_tensor(train.labels[held], dtype=torch.int64, device=self.device)

    def check_model_memory(self, parameters: int, what: str, at_least: bool = False) -> None:
        """Refuse, before it is built, a model whose ``parameters`` the run cannot hold: the
        problem's MODEL_COPIES copies (the training and evaluation models, the flat initial point,
        the server model) and the algorithm's state as it declares it (``state_size(N, d)``:
        MIFA's table is N rows). On an accelerator that state lives in its memory, which
        focusfl.limits does not measure: the host is checked for the model's copies (it is built
        there first)."""
        itemsize = self.dtype.itemsize
        state = 0
        if self._state_size is not None and self.device.type == "cpu":
            state = self._state_size(self.num_clients, parameters).nbytes(itemsize)
        owner = getattr(getattr(self._state_size, "__self__", None), "name", "the algorithm")
        said = f" and {owner}'s state for {self.num_clients:,} clients x {parameters:,} parameters" if state else ""
        check_allocation(parameters * itemsize * MODEL_COPIES + state,
                         f"{what}: {'at least ' if at_least else ''}{parameters:,} parameters x {MODEL_COPIES} copies"
                         f"{said}")

    def inputs(self, images: torch.Tensor) -> torch.Tensor:
        """Stored images (any leading shape) as standardised model inputs of the problem's dtype,
        in the images' layout: NCHW, or channels-last (then the per-channel scale and shift are
        tiled over H, W, C, so the arithmetic runs along whole images, not runs of C values)."""
        if images.dim() >= 4 and not images.is_contiguous() and images.movedim(-3, -1).is_contiguous():
            h, w = images.shape[-2:]
            scale = self._scale.movedim(0, -1).expand(h, w, -1).contiguous()
            shift = self._shift.movedim(0, -1).expand(h, w, -1).contiguous()
            return (images.movedim(-3, -1).to(self.dtype) * scale + shift).movedim(-1, -3)
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
        self._has_convolutions = any(isinstance(m, nn.Conv2d) for m in module.modules())
        self._activations_per_sample = _activation_elements(self._eval_model, self.input_shape, self.dtype, self.device)
        # The grouped-weights path needs every parameter trainable (it builds all of them from z).
        all_trainable = len(named) == len(list(module.parameters()))
        self.batched_sequential = (
            self.params["client_batching"] == "auto" and all_trainable and client_batched.supports(module)
        )
        if self.batched_sequential:
            self._client_grads = self._sequential_loss_and_gradients
        else:
            vmapped = vmap(grad_and_value(self._minibatch_loss))
            self._client_grads = lambda z, images, labels, weights, keys, channels_last=True: vmapped(
                z, images, labels, weights, keys
            )

    @property
    def client_chunk(self) -> int | None:
        """How many clients the vectorized engine batches at once (None: all active clients).

        ``client_chunk=k`` fixes it, 0 means all; ``auto`` follows the rule, ``measure`` times it
        (see ``formulation``).
        """
        return self.formulation()[0]

    @property
    def channels_last(self) -> bool:
        """Whether convolutions' activations are laid out channels-last (see ``formulation``)."""
        return self.formulation()[1] == "channels_last"

    def formulation(self) -> tuple[int | None, str]:
        """(clients per batched call or None for all, convolution layout) for this run.

        ``auto`` (the default) is a rule of the device type, the model and the batch, never of
        the clock, so the same command gives the same bytes on a busy or an idle machine: on a
        CPU, channels-last convolutions (oneDNN's fastest) and the largest power-of-two chunk of
        clients whose forward activations fit ``_CHUNK_BUDGET_CPU`` elements; on an accelerator,
        NCHW and chunks bounded by ``_CHUNK_BUDGET_ACCELERATOR``. Formulations round differently
        (grouped against per-client convolutions), so float32 results depend on the choice at
        the rounding level, and SG-FOCUS can amplify that.

        ``measure`` is the opt-in to time the candidates instead: one gradient call of the real
        model on real minibatches for chunks of 1, 2, 4, ... clients, in channels-last and NCHW
        memory where the grouped-weights path is used, the fastest per client kept (cached per
        device, model, input shape, batch, dtype and thread count). Its outcome can differ from
        one process to the next; ``describe()`` (so config.json) records it, and a rerun from
        config.json computes the same way.
        """
        if not self._tuned:
            self._tuned = True
            chunk, layout = self.params["client_chunk"], self.params["layout"]
            if chunk == "auto":
                chunk = self._rule_chunk()
            if layout == "auto":
                layout = self._rule_layout()
            if "measure" in (chunk, layout):
                key = (
                    str(self.device), str(self._train_model), self.input_shape, self.batch, self.dtype,
                    self.batched_sequential, self.num_clients, chunk, layout, torch.get_num_threads(),
                )
                if key not in _FORMULATIONS:
                    _FORMULATIONS[key] = self._measure_formulations(chunk, layout)
                chunk, layout = _FORMULATIONS[key]
            self._chunk = None if chunk in (0, None) or int(chunk) >= self.num_clients else int(chunk)
            self._layout = layout
        return self._chunk, self._layout

    def _rule_layout(self) -> str:
        if self._channels_last_fails:
            return "nchw"
        return "channels_last" if self.device.type == "cpu" else "nchw"

    def _rule_chunk(self) -> int:
        """The largest power of two (0 = all clients) whose chunk's activations fit the budget."""
        budget = _CHUNK_BUDGET_CPU if self.device.type == "cpu" else _CHUNK_BUDGET_ACCELERATOR
        per_client = self._activations_per_sample * self.batch
        chunk = 1
        while chunk * 2 * per_client <= budget and chunk * 2 <= _TUNE_MAX_CHUNK:
            chunk *= 2
        return 0 if chunk >= self.num_clients else chunk

    def _layouts(self, layout: str) -> list[str]:
        if layout != "measure":
            return [layout]
        if not self._has_convolutions:
            return ["channels_last"]  # nothing to lay out; eval and gradients ignore it
        if not self.batched_sequential:  # vmap path: inputs as given; eval may still use CL
            return [self._rule_layout()]
        return ["channels_last", "nchw"]

    def _measure_formulations(self, chunk, layout) -> tuple[int | None, str]:
        """The fastest (chunk, layout) per client over the candidates that ``measure`` leaves open."""
        chunks = [int(chunk)] if chunk != "measure" else _chunk_candidates(self.num_clients)
        best: tuple[float, int, str] | None = None
        for candidate_layout in self._layouts(layout):
            for k in chunks:
                try:
                    seconds = self._time_gradients(k, candidate_layout) / max(1, min(k or self.num_clients, self.num_clients))
                except torch.cuda.OutOfMemoryError:
                    break
                # On a CPU a larger chunk must win clearly: one short measurement is noisy, and
                # grouped convolutions cost more per sample as clients are added, so a near-tie
                # goes to the smaller chunk (measured: chunks of 2 picked on a tie ran 15% slower
                # than the per-client loop over whole rounds).
                margin = _CPU_MARGIN if self.device.type == "cpu" and best is not None and best[2] == candidate_layout else 1.0
                if best is None or seconds * margin < best[0]:
                    best = (seconds, k, candidate_layout)
                elif chunk == "measure" and self.device.type == "cpu" and seconds > _TUNE_STOP * best[0]:
                    break  # larger chunks only get slower on a CPU
        if best is None:  # not even one client fitted in memory while measuring: run one at a time
            return 1, self._layouts(layout)[0]
        return best[1], best[2]

    def _time_gradients(self, k: int, layout: str, repeats: int = 2) -> float:
        """Seconds of one gradient call for ``k`` clients (0: all) in ``layout`` (best of repeats)."""
        count = k or self.num_clients
        clients = torch.arange(count, device=self.device) % self.num_clients
        z = self._x0.expand(count, -1).clone()
        call = self._gradient_call(clients, seed=0, round=0, channels_last=layout == "channels_last")
        seconds = math.inf
        for attempt in range(repeats + 1):  # the first call warms up kernels and allocations
            self._synchronize()
            start = time.perf_counter()
            call(z, attempt)
            self._synchronize()
            if attempt:
                seconds = min(seconds, time.perf_counter() - start)
        return seconds

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _sequential_loss_and_gradients(self, z, images, labels, weights, keys, channels_last=True):
        return client_batched.loss_and_gradients(
            self._train_model, self._names, self._shapes, self._numels, z, images, labels, weights, keys,
            channels_last,
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
        """Run the model once on two samples, then one gradient, so a mismatch fails now in one line.

        A model that cannot take channels-last activations (one that calls ``.view`` on a
        convolution's output, as many hand-written CNNs do) runs NCHW when the layout is left to
        the rule: a property of the model's code, the same on every machine. Asked for
        channels-last explicitly, it is refused with that hint."""
        try:
            self._probe_once()
        except ConfigError as failure:
            if not (self._has_convolutions and self._eval_channels_last()):
                raise
            self._channels_last_fails = True  # the layouts below are NCHW now
            try:
                self._probe_once()
            except ConfigError:
                raise failure from None
            if self.params["layout"] == "channels_last":
                raise ConfigError(f"{failure} (with layout=channels_last; the model runs with layout=nchw)") from None

    def _probe_once(self) -> None:
        name = self.params["model"]
        failure = f"model {name!r} cannot train on inputs {self.input_shape}"
        try:
            with torch.no_grad():
                logits = self._logits(self._x0, self.train_images[:2])
        except (RuntimeError, ValueError, TypeError, IndexError) as exc:
            raise ConfigError(f"{failure}: {_first_line(exc)}") from None
        if tuple(logits.shape) != (2, self.num_classes):
            raise ConfigError(
                f"model {name!r} gives outputs {tuple(logits.shape[1:])} per sample, "
                f"expected ({self.num_classes},) class scores"
            )
        try:
            clients = torch.zeros(1, dtype=torch.int64, device=self.device)
            self._gradient_call(clients, seed=0, round=0, channels_last=self._eval_channels_last())(self._x0[None, :], 0)
        except (RuntimeError, ValueError, TypeError, IndexError) as exc:
            raise ConfigError(f"{failure}: {_first_line(exc)}") from None

    def initial_point(self) -> torch.Tensor:
        return self._x0.clone()

    # -- gradients --------------------------------------------------------------------------------
    def client_gradients(self, x, clients, *, seed, round, step):
        return self.oracle(clients, seed=seed, round=round)(x, step)

    def oracle(self, clients: torch.Tensor, *, seed: int, round: int, steps: int | None = None) -> Oracle:
        """Minibatch gradients of the clients; the oracle keeps each call's minibatch losses,
        which the round returns for the rows' ``train_loss`` (nothing is kept here). ``steps``
        (the local steps 0..steps-1 the round will ask for, when the engine knows) lets the
        minibatches of several steps be drawn together; the gradients are the same."""
        channels_last = self.channels_last
        call = self._gradient_call(clients, seed=seed, round=round, channels_last=channels_last, steps=steps)

        def compute(z: torch.Tensor, step: int) -> tuple[torch.Tensor, torch.Tensor | None]:
            if clients.numel() == 0:
                return torch.zeros_like(z), None
            return call(z, step)

        return Oracle(compute)

    def sample_ids(self, clients: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The training samples at ``positions`` [..., n, k] of the clients' own index sets; a
        position past a client's size (a padding slot, weight 0) gives its first sample."""
        starts = self.client_starts.index_select(0, clients)[:, None]
        sizes = self.sizes.index_select(0, clients)[:, None]
        return self.client_order[torch.where(positions < sizes, starts + positions, starts)]

    def _gradient_call(self, clients: torch.Tensor, *, seed: int, round: int, channels_last: bool,
                       steps: int | None = None):
        """``call(z, step) -> (gradients [n, d], losses [n])`` for the clients' minibatches.

        The minibatches of up to ``steps`` steps are drawn in one go, as many as DRAW_AHEAD_BYTES
        of stored samples hold: drawing is dozens of small operations a step, and after a
        backward pass each of them ran several times slower than alone (the CIFAR-10
        benchmark's draws took 1 ms a step). The draws are elementwise in the steps, so the
        same minibatches come out whichever steps are drawn together."""
        sizes = self.sizes.index_select(0, clients)
        # Clients smaller than the batch fill its last slots with weight-0 padding; when every
        # client of the call is that small, those slots are dropped instead of computed (13% of
        # the client rounds of the CIFAR-10 preset hold 15-54 samples). Same minibatches.
        largest = int(sizes.max()) if clients.numel() else self.batch
        width = min(self.batch, largest)
        step_bytes = max(clients.numel() * width * self.train_images[0].nbytes, 1)
        ahead = max(1, DRAW_AHEAD_BYTES // step_bytes)
        drawn: dict[int, tuple[torch.Tensor, ...]] = {}

        def call(z: torch.Tensor, step: int) -> tuple[torch.Tensor, torch.Tensor]:
            if step not in drawn:
                count = min(ahead, steps - step) if steps is not None and step < steps else 1
                drawn.clear()
                block = torch.arange(step, step + count, device=self.device)
                drawn.update(enumerate(zip(*self._draw(seed, round, clients, block, sizes, width, largest,
                                                       channels_last)), start=step))
            images, labels, weights, keys = drawn.pop(step)
            return self._client_grads(z, self.inputs(images), labels, weights, keys, channels_last)

        return call

    def _draw(self, seed: int, round: int, clients: torch.Tensor, steps: torch.Tensor, sizes: torch.Tensor,
              width: int, largest: int, channels_last: bool) -> tuple[torch.Tensor, ...]:
        """The minibatches of ``steps`` [S]: stored images [S, n, width, ...] (cropped and flipped
        with augmentation), labels and weights [S, n, width] and dropout keys [S, n]."""
        picks, weights = self.minibatch(seed, round, clients, steps, sizes, span=max(self.batch, largest))
        picks, weights = picks[..., :width], weights[..., :width]
        ids = self.sample_ids(clients, picks)
        images = self.train_images[ids]
        # Channels-last convolutions take per-sample HWC inputs: laying the stored images out
        # so here (the crop writes them so) costs less than converting standardised floats.
        per_sample_hwc = (channels_last and self.batched_sequential and self._has_convolutions
                          and self.train_images.dim() == 4)
        step_coordinate = steps.view(-1, 1, 1)
        if self.augment:
            bits = hash_bits(seed, round, clients[:, None], step_coordinate, _AUGMENT_COORD,
                             self._positions[None, :width], device=self.device)
            images = crop_flip(images, bits, AUGMENT_PADDING, channels_last=per_sample_hwc)
        elif per_sample_hwc:
            images = images.movedim(-3, -1).contiguous().movedim(-1, -3)
        keys = hash_bits(seed, round, clients, steps.view(-1, 1), _DROPOUT_COORD, device=self.device)
        return images, self.train_labels[ids], weights, keys

    def minibatch(self, seed, round_, clients, step, sizes, span=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions ``[n, batch]`` into each client's index set, and their 0/1 weights; for a
        tensor of steps [S], ``[S, n, batch]``: each step's draw, the same as drawn alone.

        Every position j < size of client i gets the key uniform(seed, round, i, step, j); the
        ``batch`` smallest keys win (the same draw as ``rng.minibatch_indices``). Positions past
        the client's size get key 2 so they come last, and weight 0. ``span`` (at least the
        batch and the largest of ``sizes``) limits the positions hashed; the draw is the same.
        """
        positions = self._positions if span is None else self._positions[:span]
        step = step if isinstance(step, int) else step.view(-1, 1, 1)
        keys = uniform(seed, round_, clients[:, None], step, positions[None, :], device=self.device)
        keys = torch.where(positions[None, :] < sizes[:, None], keys, torch.full_like(keys, 2.0))
        picks = torch.topk(keys, self.batch, dim=-1, largest=False, sorted=True).indices
        return picks, (picks < sizes[:, None]).to(self.dtype)

    # -- evaluation ------------------------------------------------------------------------------
    def _logits(self, x: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
        return self._forward(x, self.inputs(images))

    def _eval_channels_last(self) -> bool:
        """The measured layout once known; before that, the one asked for, or the rule's:
        channels-last on a CPU (oneDNN's best) unless the model cannot take it."""
        if self._tuned:
            return self._layout == "channels_last"
        if self._channels_last_fails or self.params["layout"] == "nchw":
            return False
        return self.params["layout"] == "channels_last" or self.device.type == "cpu"

    def _forward(self, x: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
        """Logits of the model x (dropout off) on standardised inputs, in the chosen layout."""
        if inputs.dim() == 4 and self._has_convolutions:
            layout = torch.channels_last if self._eval_channels_last() else torch.contiguous_format
            inputs = inputs.contiguous(memory_format=layout)
        return functional_call(self._eval_model, self.unflatten(x), (inputs,))

    def test_inputs(self) -> torch.Tensor:
        """The test images standardised once, in the layout evaluation uses (kept for the run)."""
        self.formulation()  # the layout is the measured one
        if self._test_inputs is None:
            images = self.test_images
            layout = torch.channels_last if images.dim() == 4 and self._has_convolutions and self._eval_channels_last() \
                else torch.contiguous_format
            standardised = torch.empty(images.shape, dtype=self.dtype, device=self.device).contiguous(memory_format=layout)
            for start in range(0, len(images), 4096):  # no full-size float temporary
                standardised[start : start + 4096] = self.inputs(images[start : start + 4096])
            self._test_inputs = standardised
        return self._test_inputs

    def evaluate(self, x: torch.Tensor, images: torch.Tensor, labels: torch.Tensor) -> tuple[float, float]:
        """(mean cross-entropy, accuracy) of the model x on a split, in batches of eval_batch.

        ``images`` are stored images, or already standardised inputs (floating point) such as
        ``test_inputs()``.
        """
        total_loss = torch.zeros((), dtype=torch.float64, device=self.device)
        correct = torch.zeros((), dtype=torch.int64, device=self.device)
        standardised = images.dtype == self.dtype and images is self._test_inputs
        with torch.inference_mode():
            for start in range(0, len(labels), self.eval_batch):
                batch = images[start : start + self.eval_batch]
                logits = self._forward(x, batch if standardised else self.inputs(batch))
                target = labels[start : start + self.eval_batch]
                total_loss += F.cross_entropy(logits, target, reduction="sum").to(torch.float64)
                correct += (logits.argmax(dim=1) == target).sum()
        count = max(len(labels), 1)
        return float(total_loss) / count, float(correct) / count

    def metrics(self, x: torch.Tensor) -> dict[str, float]:
        row = {}
        if self.params["evaluate"] == "test":  # a step-size search never looks at the test set
            row["test_loss"], row["test_accuracy"] = self.evaluate(x, self.test_inputs(), self.test_labels)
        if len(self.validation_labels):
            row["val_loss"], row["val_accuracy"] = self.evaluate(x, self.validation_images, self.validation_labels)
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

    def data_fingerprint(self) -> str:
        """A digest of what the clients compute on: the training images and labels and the
        partition. A federation checks that every node built the same problem from its own
        copy of the data (focusfl.flower)."""
        cached = getattr(self, "_data_fingerprint", None)
        if cached is None:
            digest = hashlib.sha256()
            for tensor in (self.train_images, self.train_labels, self.client_order, self.sizes):
                array = tensor.detach().cpu().contiguous().numpy()
                digest.update(f"{array.dtype.str}{array.shape}".encode())
                digest.update(array.reshape(-1).view(np.uint8))
            cached = self._data_fingerprint = digest.hexdigest()[:32]
        return cached

    def input_paths(self) -> dict[str, Path | tuple[Path, ...]]:
        """The dataset's files: ``data``, the file or the files it was read from."""
        files = tuple(Path(f).resolve() for f in getattr(self, "_dataset_files", ()))
        return {"data": files[0] if len(files) == 1 else files} if files else {}

    def settle(self) -> None:
        """Choose the formulation now (measured, if asked): describe() then records it."""
        self.formulation()

    def describe(self) -> dict[str, Any]:
        """The parameters, with the measured formulation once a run has chosen it (so that a
        rerun from config.json computes in the same way, to the bit)."""
        params = dict(self.params)
        if self._tuned:
            params["client_chunk"] = self._chunk or 0
            params["layout"] = self._layout
        return {"name": self.name, **params}


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _validate(p: dict[str, Any]) -> None:
    where = "problem 'nn'"
    for key in ("clients", "batch", "min_size", "shards"):
        if not isinstance(p[key], int) or p[key] < 1:
            raise ConfigError(f"{where}: {key} must be an integer >= 1, got {p[key]!r}")
    if p["eval_batch"] != "auto" and (not isinstance(p["eval_batch"], int) or p["eval_batch"] < 1):
        raise ConfigError(f"{where}: eval_batch must be auto or an integer >= 1, got {p['eval_batch']!r}")
    if p["layout"] not in ("auto", "measure", "channels_last", "nchw"):
        raise ConfigError(f"{where}: layout must be auto, measure, channels_last or nchw, got {p['layout']!r}")
    if p["augment"] not in ("none", "crop-flip"):
        raise ConfigError(f"{where}: augment must be none or crop-flip, got {p['augment']!r}")
    if p["client_chunk"] not in ("auto", "measure") and (
        isinstance(p["client_chunk"], bool) or not isinstance(p["client_chunk"], int) or p["client_chunk"] < 0
    ):
        raise ConfigError(f"{where}: client_chunk must be auto, measure or an integer >= 0, got {p['client_chunk']!r}")
    if not isinstance(p["seed"], int) or p["seed"] < 0:
        raise ConfigError(f"{where}: seed must be an integer >= 0, got {p['seed']!r}")
    if p["client_batching"] not in ("auto", "vmap"):
        raise ConfigError(f"{where}: client_batching must be auto or vmap, got {p['client_batching']!r}")
    if not 0.0 <= float(p["test_fraction"]) < 1.0:
        raise ConfigError(f"{where}: test_fraction must be in [0, 1), got {p['test_fraction']}")
    if not 0.0 <= float(p["validation"]) < 1.0:
        raise ConfigError(f"{where}: validation must be in [0, 1), got {p['validation']}")
    if p["evaluate"] not in ("test", "validation"):
        raise ConfigError(f"{where}: evaluate must be test or validation, got {p['evaluate']!r}")
    if p["evaluate"] == "validation" and not float(p["validation"]) > 0:
        raise ConfigError(f"{where}: evaluate=validation needs a validation share (validation=0.1, say)")
    if not float(p["alpha"]) > 0 or not math.isfinite(float(p["alpha"])):
        raise ConfigError(f"{where}: alpha must be a positive number, got {p['alpha']}")


def _activation_elements(module: nn.Module, input_shape, dtype: torch.dtype, device: torch.device) -> int:
    """Output elements of the module's leaf layers for one sample: what a forward pass keeps for
    the backward pass, from shapes alone (one forward pass of a zero sample, hooks on leaves)."""
    counted = [0]

    def count(layer, inputs, output) -> None:
        if isinstance(output, torch.Tensor):
            counted[0] += output.numel()

    leaves = [m for m in module.modules() if next(m.children(), None) is None]
    hooks = [m.register_forward_hook(count) for m in leaves]
    try:
        with torch.no_grad():
            module(torch.zeros((1, *input_shape), dtype=dtype, device=device))
    except (RuntimeError, ValueError, TypeError, IndexError):
        return 0  # the probe that follows names the mismatch in one line
    finally:
        for hook in hooks:
            hook.remove()
    return max(counted[0], 1)


def _chunk_candidates(clients: int) -> list[int]:
    """1, 2, 4, ... up to the number of clients (0 = all of them, when that is few enough)."""
    chunks, k = [], 1
    while k < clients and k <= _TUNE_MAX_CHUNK:
        chunks.append(k)
        k *= 2
    if clients <= _TUNE_MAX_CHUNK:
        chunks.append(0)
    return chunks


def crop_flip(images: torch.Tensor, bits: torch.Tensor, padding: int, channels_last: bool = False) -> torch.Tensor:
    """Random crop with zero padding and horizontal flip of stored images ``[..., C, H, W]``.

    ``bits`` (32-bit hashes, one per image, shape ``images.shape[:-3]``) fix each image's crop
    offsets (0..2*padding in each direction, uniform) and its flip (probability 1/2): the
    transforms RandomCrop(H, padding) then RandomHorizontalFlip of the papers' code. Padding
    is 0 in stored units, which standardisation maps where Normalize maps a black border.

    One gather from the unpadded images, a pixel of the padding reading a clamped one that is
    then zeroed: no padded copy. With ``channels_last`` the result has the same values laid
    out channels-last (each image's pixels in H, W, C order), so the convolutions get them
    without a copy of standardised floats. Small images read every value's source from a table
    of every (offset, flip) case (128 CIFAR-10 images with their gather: 0.20 ms, against 0.39 ms
    making each pixel's source); larger ones make each pixel's source from tables of rows and
    columns (_crop_by_pixel).
    """
    *lead, c, h, w = images.shape
    count = math.prod(lead)
    bits = bits.reshape(-1)
    span = 2 * padding + 1
    top = bits % span
    left_flip = (bits // span) % span + (bits >> 31) * span  # the column table's row: left, then flipped
    tables = _crop_value_tables(c, h, w, padding, channels_last, images.device)
    if tables is not None:
        sources, inside = tables
        case = top * (2 * span) + left_flip
        picked = images.reshape(count, c * h * w).gather(1, sources.index_select(0, case))
        picked.mul_(inside.index_select(0, case))
    else:
        picked = _crop_by_pixel(images.reshape(count, c, h * w), top, left_flip, (h, w), padding, channels_last)
    if channels_last:
        return picked.view(*lead, h, w, c).movedim(-1, -3)
    return picked.view(*lead, c, h, w)


def _crop_by_pixel(flat: torch.Tensor, top: torch.Tensor, left_flip: torch.Tensor, side: tuple[int, int],
                   padding: int, channels_last: bool) -> torch.Tensor:
    """crop_flip of ``flat`` [count, C, H*W] with one source index per pixel, shared by the
    channels: for images whose table of every value would be too large."""
    count, c, hw = flat.shape
    row_starts, rows_inside, columns, columns_inside = _crop_tables(*side, padding, flat.device)
    source = (row_starts.index_select(0, top)[:, :, None] + columns.index_select(0, left_flip)[:, None, :])
    inside = rows_inside.index_select(0, top)[:, :, None] & columns_inside.index_select(0, left_flip)[:, None, :]
    picked = flat.gather(2, source.view(count, 1, hw).expand(count, c, hw))
    if channels_last:
        hwc = torch.empty((count, hw, c), dtype=flat.dtype, device=flat.device)
        torch.mul(picked.transpose(1, 2), inside.view(count, hw, 1), out=hwc)
        return hwc
    return picked.mul_(inside.view(count, 1, hw))


# The largest table of every crop case's sources (int64) and masks that crop_flip keeps per
# image shape and layout: CIFAR-10's is 4.5 MB, a 64 x 64 x 3 image's 18 MB.
CROP_TABLE_BYTES = 32 * 2**20


@functools.lru_cache(maxsize=16)
def _crop_value_tables(c: int, h: int, w: int, padding: int, channels_last: bool,
                       device: torch.device) -> tuple[torch.Tensor, torch.Tensor] | None:
    """For every case ``top * 2 * span + left_flip``: the source of each output value in an
    image's C*H*W values (``[2 * span**2, C*H*W]``, in the output's layout, clamped) and whether
    it is inside the image; None when the tables would exceed CROP_TABLE_BYTES."""
    span = 2 * padding + 1
    cases = 2 * span * span
    if cases * c * h * w * 9 > CROP_TABLE_BYTES:
        return None
    row_starts, rows_inside, columns, columns_inside = _crop_tables(h, w, padding, device)
    top = torch.arange(span, device=device).repeat_interleave(2 * span)
    left_flip = torch.arange(2 * span, device=device).repeat(span)
    pixels = (row_starts[top][:, :, None] + columns[left_flip][:, None, :]).view(cases, 1, h * w)
    inside = (rows_inside[top][:, :, None] & columns_inside[left_flip][:, None, :]).view(cases, 1, h * w)
    planes = torch.arange(c, device=device).view(1, c, 1) * (h * w)
    sources, inside = pixels + planes, inside.expand(cases, c, h * w)
    if channels_last:
        sources, inside = sources.transpose(1, 2), inside.transpose(1, 2)
    return sources.reshape(cases, -1).contiguous(), inside.reshape(cases, -1).contiguous()


@functools.lru_cache(maxsize=16)
def _crop_tables(h: int, w: int, padding: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """For every crop offset: the first pixel of each source row (``[span, h]``, clamped) and
    whether the row is inside the image; for every (left offset, flip): the source column of
    each output column (``[2 * span, w]``, clamped) and whether it is inside."""
    span = 2 * padding + 1
    rows = torch.arange(span, device=device)[:, None] + torch.arange(h, device=device) - padding
    left = torch.arange(2 * span, device=device) % span
    flipped = torch.arange(2 * span, device=device) >= span
    columns = torch.arange(w, device=device).expand(2 * span, w)
    columns = torch.where(flipped[:, None], w - 1 - columns, columns) + left[:, None] - padding
    return (rows.clamp(0, h - 1) * w, (rows >= 0) & (rows < h),
            columns.clamp(0, w - 1), (columns >= 0) & (columns < w))


def standard_strides(array: np.ndarray) -> np.ndarray:
    """``array`` C-ordered with the strides a fresh array of its shape has.

    Indexing can leave an axis of size 1 with another stride: MNIST's [M, 1, 28, 28] after a
    split has strides (784, 1, 28, 1). numpy and torch call that contiguous, so neither
    ``np.ascontiguousarray`` nor ``.contiguous()`` changes it, but torch also reads it as
    channels-last: convolutions then run channels-last and a model's ``x.view(x.size(0), -1)``
    fails. A size-1 axis's stride addresses nothing, so the fix is a view, not a copy."""
    array = np.ascontiguousarray(array)
    standard, step = [], array.itemsize
    for size in reversed(array.shape):
        standard.append(step)
        step *= max(size, 1)
    standard = tuple(reversed(standard))
    if array.strides == standard or array.size == 0:
        return array
    return np.lib.stride_tricks.as_strided(array, shape=array.shape, strides=standard, writeable=array.flags.writeable)


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


def carve_validation(parts, fraction: float, seed: int) -> tuple[Any, np.ndarray]:
    """(training parts, pooled validation indices): each client holds out round(fraction * m_i)
    of its own samples, drawn by a key of (seed, client), and keeps at least one to train on.
    A fraction of 0 changes nothing (the same parts, no validation samples). A partition given as
    ClientRows comes back as ClientRows (the draw is a generator per client: a loop over clients,
    at set-up only)."""
    if fraction <= 0:
        return parts, np.zeros(0, dtype=np.int64)
    kept, held = [], []
    for client, part in enumerate(parts):
        count = min(int(round(fraction * len(part))), len(part) - 1)
        order = np.random.default_rng(np.random.SeedSequence([seed, 17, client])).permutation(len(part))
        kept.append(np.sort(part[order[count:]]))
        held.append(part[order[:count]])
    pooled = np.sort(np.concatenate(held)).astype(np.int64)
    if not len(pooled):
        raise ConfigError(f"validation={fraction} holds out no sample: the clients have too few")
    return (ClientRows.from_parts(kept) if isinstance(parts, ClientRows) else kept), pooled


def _seeded_model(name: str, input_shape, num_classes: int, seed: int, allow_import: bool = False) -> nn.Module:
    """Build a model with its default initialisation drawn from ``seed`` (global RNG untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = make_model(name, input_shape, num_classes, allow_import=allow_import)
        return _materialized(module, input_shape)


def _materialized(module: nn.Module, input_shape) -> nn.Module:
    """A model whose lazy layers (nn.LazyLinear, ...) have their shapes and initial values: one
    forward pass of a zero batch, inside the caller's seeded RNG, so the initialisation is still
    drawn from the seed. In eval mode (BatchNorm statistics and dropout untouched)."""
    if not any(isinstance(t, UninitializedParameter) for t in [*module.parameters(), *module.buffers()]):
        return module
    training = module.training
    module.eval()
    with torch.no_grad():
        module(torch.zeros((2, *input_shape)))
    return module.train(training)


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

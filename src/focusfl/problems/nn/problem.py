"""Neural networks as federated problems: any ``torch.nn.Module`` plus per-client image data.

The problem turns a module into the flat-parameter interface the algorithms use: a model is a
vector of d floats, and ``oracle(clients)`` returns minibatch gradients for a stack of points
``[n, d]``, one row per active client, computed for all of them in ONE batched call.

It is three parts, as FedJAX splits data, model and batching, so that a new backend or device
changes one of them:

- ``data.py``: the clients' data on the device and their keyed draws (minibatches, dropout keys,
  crops), all from (seed, round, client, step);
- ``formulation.py``: the module as a function of flat parameters and the grouped gradient call
  per device (clients per call, convolution layout);
- ``evaluation.py``: test and validation metrics, F and its exact gradient.

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
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn
from torch.nn.parameter import UninitializedParameter

from ...data import Dataset, load_dataset, label_histograms, make_partition
from ...device import device_policy
from ...errors import ConfigError
from ...limits import check_allocation
from ...spec import parse_spec
from ..base import Oracle, Problem
from ..models import default_model, make_model
from .data import ClientData, carve_validation, split_test
from .evaluation import Evaluation
from .formulation import GroupedFormulation

# Model-sized vectors a run holds besides the algorithm's state: the training model, its
# evaluation copy, the flat initial point and the server model (a lower bound: the size check).
MODEL_COPIES = 4


def _client_data_view(name: str) -> property:
    """A read-only attribute of the problem that is its client data's (train_images, sizes, ...)."""
    return property(lambda self: getattr(self.client_data, name), doc=f"The client data's ``{name}``.")


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
        self._store(train, test, parts, held, standardise=True)
        if module is None:
            if p["model"] == "auto":
                p["model"] = default_model(dataset.name, self.input_shape)
            module = _seeded_model(p["model"], self.input_shape, self.num_classes, int(p["seed"]), allow_model_import)
        else:
            p["model"] = f"custom:{type(module).__name__}"
        self._start(module, p)

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
        # What the device type decides (layout, chunk budget, evaluation batch): device.py.
        self.policy = device_policy(self.device)
        self.eval_batch = int(p["eval_batch"]) if p["eval_batch"] != "auto" else self.policy.eval_batch
        self.augment = p["augment"] != "none"

    def _store(self, train, test, parts, held: np.ndarray, *, standardise: bool) -> None:
        """The clients' data on the device (``standardise``: images, not token sequences)."""
        self.client_data = ClientData(train, test, parts, held, batch=self.batch, num_clients=self.num_clients,
                                      dtype=self.dtype, device=self.device, augment=self.augment,
                                      standardise=standardise)

    def _start(self, module: nn.Module, p: dict[str, Any]) -> None:
        """Take the model and the parameters, then try one forward and one gradient call."""
        built = [t for t in module.parameters() if not isinstance(t, UninitializedParameter)]
        self.check_model_memory(sum(t.numel() for t in built), f"model {p['model']!r}")
        self.params = p
        self._setup_model(module)
        self.grouped.probe()

    def _setup_model(self, module: nn.Module) -> None:
        """The model's formulation and its evaluation (a subclass may set the training mode here)."""
        self.grouped = GroupedFormulation(
            module, self.params, self.client_data, self.inputs, self.policy, input_shape=self.input_shape,
            num_classes=self.num_classes, num_clients=self.num_clients, batch=self.batch, dtype=self.dtype,
            device=self.device,
        )
        self.evaluation = Evaluation(self.client_data, self.grouped, self.inputs, self.eval_batch)
        self.dim = self.grouped.dim

    train_images = _client_data_view("train_images")
    train_labels = _client_data_view("train_labels")
    test_images = _client_data_view("test_images")
    test_labels = _client_data_view("test_labels")
    validation_images = _client_data_view("validation_images")
    validation_labels = _client_data_view("validation_labels")
    client_order = _client_data_view("client_order")
    client_starts = _client_data_view("client_starts")
    sizes = _client_data_view("sizes")

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
        """Stored images (any leading shape) as standardised model inputs (ClientData.standardised)."""
        return self.client_data.standardised(images)

    def label_histograms(self) -> np.ndarray:
        """Counts ``[N, C]`` of each class held by each client (what label participation uses)."""
        return self._histograms.copy()

    # -- formulation -----------------------------------------------------------------------------
    @property
    def batched_sequential(self) -> bool:
        """Whether the grouped-weights path (problems/client_batched.py) computes the gradients."""
        return self.grouped.batched_sequential

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
        """(clients per batched call or None for all, convolution layout): GroupedFormulation.formulation."""
        return self.grouped.formulation()

    def unflatten(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """A flat parameter vector [d] as the module's named parameters (views, no copies)."""
        return self.grouped.unflatten(flat)

    def initial_point(self) -> torch.Tensor:
        return self.grouped.x0.clone()

    # -- gradients --------------------------------------------------------------------------------
    def client_gradients(self, x, clients, *, seed, round, step):
        return self.oracle(clients, seed=seed, round=round)(x, step)

    def oracle(self, clients: torch.Tensor, *, seed: int, round: int, steps: int | None = None) -> Oracle:
        """Minibatch gradients of the clients; the oracle keeps each call's minibatch losses,
        which the round returns for the rows' ``train_loss`` (nothing is kept here). ``steps``
        (the local steps 0..steps-1 the round will ask for, when the engine knows) lets the
        minibatches of several steps be drawn together; the gradients are the same."""
        channels_last = self.channels_last
        call = self.grouped.gradient_call(clients, seed=seed, round=round, channels_last=channels_last, steps=steps)

        def compute(z: torch.Tensor, step: int) -> tuple[torch.Tensor, torch.Tensor | None]:
            if clients.numel() == 0:
                return torch.zeros_like(z), None
            return call(z, step)

        return Oracle(compute)

    def sample_ids(self, clients: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The training samples at ``positions`` of the clients' own index sets (ClientData.sample_ids)."""
        return self.client_data.sample_ids(clients, positions)

    def minibatch(self, seed, round_, clients, step, sizes, span=None) -> tuple[torch.Tensor, torch.Tensor]:
        """The keyed minibatch positions and weights (ClientData.minibatch)."""
        return self.client_data.minibatch(seed, round_, clients, step, sizes, span)

    # -- evaluation ------------------------------------------------------------------------------
    def test_inputs(self) -> torch.Tensor:
        """The test images standardised once, in the layout evaluation uses (kept for the run)."""
        return self.evaluation.standardised_test_inputs()

    def evaluate(self, x: torch.Tensor, images: torch.Tensor, labels: torch.Tensor) -> tuple[float, float]:
        """(mean cross-entropy, accuracy) of the model x on a split (Evaluation.evaluate)."""
        return self.evaluation.evaluate(x, images, labels)

    def metrics(self, x: torch.Tensor) -> dict[str, float]:
        row = {}
        if self.params["evaluate"] == "test":  # a step-size search never looks at the test set
            row["test_loss"], row["test_accuracy"] = self.evaluate(x, self.test_inputs(), self.test_labels)
        if len(self.validation_labels):
            row["val_loss"], row["val_accuracy"] = self.evaluate(x, self.validation_images, self.validation_labels)
        return row

    def loss(self, x: torch.Tensor) -> torch.Tensor:
        """F(x) = (1/N) sum_i f_i(x) over all training data (dropout off); costs a full pass."""
        return self.evaluation.loss(x)

    def gradient(self, x: torch.Tensor) -> torch.Tensor:
        """Exact gradient of F at x (dropout off), accumulated over batches of training data."""
        return self.evaluation.gradient(x)

    # -- identity ----------------------------------------------------------------------------------
    def data_fingerprint(self) -> str:
        """A digest of what the clients compute on: the training images and labels and the
        partition. A federation checks that every node built the same problem from its own
        copy of the data (focusfl.flower)."""
        cached = getattr(self, "_data_fingerprint", None)
        if cached is None:
            cached = self._data_fingerprint = self.client_data.fingerprint()
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
        if self.grouped.tuned:
            params["client_chunk"] = self.grouped.chunk or 0
            params["layout"] = self.grouped.layout
        return {"name": self.name, **params}


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

"""The Algorithm protocol (DEVELOPERS.md, "The house").

An algorithm is a small immutable object: hyperparameters are validated dataclass fields, and
the update rule is a set of pure functions over explicit state:

- ``init(x0, num_clients) -> State``: server state and per-client state (every client-state
  tensor has a leading dimension N).
- ``client_round(server, clients, oracle, ctx) -> (clients', message)``: runs the local work of
  ALL active clients at once; ``clients`` holds the active clients' rows only ([n, ...]) and
  every message field is [n, ...].
- ``server_round(server, message, ctx) -> server'``: aggregates the stacked messages.
- ``client_finish(server', clients, ctx) -> clients'``: optional; what active clients do with
  the new server state at the end of the round (FedAWE receives the new model then).

No state lives in Python variables: engines gather the active rows, call these functions and
scatter the rows back, so the same object runs in the vectorized engine, the per-client
reference loop and a distributed adapter.
"""
from __future__ import annotations

import abc
import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, NamedTuple, Sequence

import torch

from ..device import host_values
from ..errors import ConfigError
from ..limits import check_allocation
from ..problems.base import GradientFn


class State(NamedTuple):
    """Whole-federation state: ``server`` (NamedTuple of tensors) and ``clients`` (NamedTuple of
    tensors with leading dimension N)."""

    server: Any
    clients: Any


class RoundContext(NamedTuple):
    """What a round knows besides state: its index, the active clients and the population."""

    round: int
    active: torch.Tensor  # int64 [n], sorted client indices of S_r
    num_clients: int
    # Multiplies every step size of this round (1.0 = constant steps); engines set it from a
    # step-size schedule such as eta_r = eta / sqrt(r/10 + 1).
    lr_scale: float = 1.0
    # int64 [n]: the active clients' numbers of local steps tau_i (each in 1..local_steps), drawn
    # by a work process (focusfl.work). None: every client does the algorithm's local_steps,
    # which is the classical setting and today's runs byte for byte.
    steps: torch.Tensor | None = None
    # A batch of runs' step sizes, one per row (engine/batched.py), when runs with different step
    # sizes share this client round; None: the algorithm's own lr * lr_scale. Read through
    # :func:`step_size`, never directly.
    row_lr: "RowSteps | None" = None


class Tracking(NamedTuple):
    """A gradient-tracking invariant: after every round the server field ``server`` equals the
    sum over ALL clients of their field ``clients`` (FOCUS: y = sum_i g_prev_i). A federation's
    audit checks it against the rows the nodes hold."""

    server: str
    clients: str


class StateSize(NamedTuple):
    """The elements of an algorithm's state (server and clients) for N clients and a model of d
    parameters: ``floats`` in the model's dtype, ``integers`` int64 (round counters)."""

    floats: int
    integers: int = 0

    def nbytes(self, float_bytes: int) -> int:
        return self.floats * float_bytes + self.integers * 8


class Communication(NamedTuple):
    """Vectors (each d floats) sent per participating client, and persistent memory."""

    down: float  # server -> client, per participating client
    up: float  # client -> server, per participating client
    server_memory: float  # vectors kept by the server
    client_memory: float  # vectors kept by each client between rounds
    # Vectors the server keeps PER CLIENT (MIFA's and FedVARP's N-row tables): the server's
    # total is server_memory + server_memory_per_client * N vectors.
    server_memory_per_client: float = 0.0


@dataclass(frozen=True)
class Algorithm(abc.ABC):
    """Base class: the hyperparameters every local-update algorithm shares."""

    name: ClassVar[str]
    summary: ClassVar[str] = ""
    # Set by aliases that exist for naming only (e.g. SG-FOCUS is FOCUS fed stochastic
    # gradients); figures that show every algorithm skip them.
    alias_of: ClassVar[str | None] = None
    # Algorithms derived here without a published analysis (push-sum); paper reproductions
    # leave them out.
    experimental: ClassVar[bool] = False
    # False for a baseline that adds nothing to the paper's ridge figure (reproduce ridge), e.g.
    # FedNova, which is FedAvg exactly when every client does its tau steps, as there.
    in_paper_figure: ClassVar[bool] = True
    # The invariant its state keeps, if it tracks a sum of the clients' state (None: none).
    tracking: ClassVar[Tracking | None] = None
    # True when client_round honours RoundContext.steps (clients that stop early). Engines refuse
    # step counts for the others (check_work) instead of silently running every client tau steps.
    partial_work: ClassVar[bool] = False
    # True for an algorithm that converges to the exact minimizer under full participation with a
    # constant step (drift-corrected methods); the conformance kit (focusfl check) holds it to that.
    exact_at_full: ClassVar[bool] = False

    lr: float = 1e-3
    local_steps: int = 1

    def __post_init__(self) -> None:
        self._check_positive("lr", self.lr)
        if not isinstance(self.local_steps, int) or self.local_steps < 1:
            raise ConfigError(f"{self.name}: local_steps must be an integer >= 1, got {self.local_steps}")
        self.validate()

    def validate(self) -> None:
        """Subclasses check their own fields here (raise ConfigError)."""

    def _check_positive(self, field: str, value: float) -> None:
        if not (isinstance(value, (int, float)) and value > 0 and value == value and value != float("inf")):
            raise ConfigError(f"{self.name}: {field} must be a positive number, got {value!r}")

    # -- protocol ----------------------------------------------------------------------------
    def prepare(self, problem: Any, participation: Any, *, seed: int | None = None) -> "Algorithm":
        """Resolve hyperparameters that depend on the run (known participation rates, the run's
        ``seed`` for an algorithm's own randomness; ``participation`` None: a federation that takes
        whoever answers). Returns a new object; the default has nothing to resolve."""
        return self

    @abc.abstractmethod
    def init(self, x0: torch.Tensor, num_clients: int) -> State:
        """Initial state for the model x0 [d] and N clients."""

    @abc.abstractmethod
    def state_size(self, num_clients: int, dim: int) -> StateSize:
        """The elements :meth:`init` allocates for N clients and d parameters (a Python integer
        formula: a run checks it against the memory available before anything is allocated,
        and tests/test_algorithm_suite.py checks it against ``init`` for every algorithm)."""

    @abc.abstractmethod
    def client_round(
        self, server: Any, clients: Any, oracle: GradientFn, ctx: RoundContext
    ) -> tuple[Any, Any]:
        """Local work of the active clients (stacked): returns (new client rows, message)."""

    @abc.abstractmethod
    def server_round(self, server: Any, message: Any, ctx: RoundContext) -> Any:
        """Aggregate the stacked messages of the active clients into the new server state."""

    def client_finish(self, server: Any, clients: Any, ctx: RoundContext) -> Any:
        """Active clients' rows after the server step; default: unchanged."""
        return clients

    def round_steps(self, ctx: RoundContext) -> int:
        """The local steps client_round takes this round at most (its oracle calls for steps
        0..k-1): a problem may draw their minibatches together. A hint, never a rule: any step
        asked for is served, with the same gradients."""
        return self.local_steps if ctx.steps is None else max_steps(ctx.steps)

    def auto_lr(self, smoothness: float, num_clients: int) -> float:
        """A step size stable on a problem whose clients are L-smooth (``--lr auto``).

        Default 1/(tau L): tau local gradient steps of at most 1/L each. Algorithms whose
        server steps on a sum of client gradients (FOCUS) or extrapolates stale models (FedAWE)
        override it.
        """
        return 1.0 / (self.local_steps * smoothness)

    def model(self, state: State) -> torch.Tensor:
        """The server model that is evaluated (default: ``state.server.x``)."""
        return state.server.x

    @abc.abstractmethod
    def communication(self) -> Communication:
        """Vectors per participating client and persistent memory of this algorithm."""

    def check_work(self, ctx: RoundContext) -> None:
        """Refuse per-client step counts (``ctx.steps``) when this algorithm does not honour them."""
        if ctx.steps is not None and not self.partial_work:
            raise ConfigError(f"{self.name}: per-client step counts (a work process other than fixed) are not supported")

    # -- helpers -----------------------------------------------------------------------------
    def hyperparameters(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def describe(self) -> dict[str, Any]:
        params = {}
        for key, value in self.hyperparameters().items():
            params[key] = list(value) if isinstance(value, tuple) else value
        return {"name": self.name, **params}


def check_state_size(algorithm: Algorithm, problem: Any) -> None:
    """Refuse, in one line, an algorithm state (its [N, d] tables) beyond the memory available,
    before :meth:`Algorithm.init` allocates it."""
    n, d = problem.num_clients, problem.dim
    size = algorithm.state_size(n, d)
    float_bytes = torch.empty((), dtype=problem.dtype).element_size()
    check_allocation(size.nbytes(float_bytes),
                     f"{algorithm.name}'s state for {n:,} clients x {d:,} parameters "
                     f"({size.floats:,} floats of {float_bytes} bytes)", error=ConfigError)


def check_work_process(algorithm: Algorithm, work: Any) -> None:
    """ConfigError unless ``algorithm`` can run the step counts of the work process ``work``
    (None or fixed: every client does local_steps, which every algorithm can). The one check a
    run makes before it starts; a round with counts checks them again (``check_work``)."""
    if work is None or work.fixed:
        return
    if work.local_steps != algorithm.local_steps:
        raise ConfigError(f"work draws up to {work.local_steps} steps, {algorithm.name} takes {algorithm.local_steps}")
    none = torch.zeros(0, dtype=torch.int64)
    algorithm.check_work(RoundContext(round=0, active=none, num_clients=work.num_clients, steps=none))


def live_mask(steps: torch.Tensor, step: int, like: torch.Tensor) -> torch.Tensor:
    """Bool ``[n, 1, ...]`` (broadcastable to ``like``): clients whose count exceeds ``step``, i.e.
    that still take local step ``step`` (0-based). Batched rounds run max(tau_i) steps and keep
    the finished clients' rows unchanged with it."""
    return (steps > step).view(-1, *([1] * (like.dim() - 1)))


def max_steps(steps: torch.Tensor) -> int:
    """Steps a batched round runs: the largest tau_i (0 for a round with no client). Read on
    the host where the round loop's copy of the counts is (device.host_values): on a GPU a read
    of the device's copy would wait for every kernel queued."""
    if not steps.numel():
        return 0
    host = host_values(steps)
    return int(host.max()) if host is not None else int(steps.max())


def per_row(counts: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The step counts as ``[n, 1, ...]`` in ``like``'s dtype: what a per-client mean divides by."""
    return counts.to(like.dtype).view(-1, *([1] * (like.dim() - 1)))


class RowSteps:
    """The step sizes of a batch of runs that share one client round (engine/batched.py): each
    run's lr * lr_scale as the run alone computes it (a Python float), and the number of rows
    (active clients) it has, in the order the rows are stacked."""

    def __init__(self, values: Sequence[float], sizes: Sequence[int], dtype: torch.dtype, device: torch.device) -> None:
        self.values, self.sizes, self.dtype, self.device = list(values), list(sizes), dtype, device
        self.steps = self._rows(self.values)  # the column of the steps themselves, made once

    def column(self, derive: Callable[[float], float] | None) -> torch.Tensor:
        """[n, 1]: each row its run's step size, or ``derive`` of it computed in Python for each
        run (a scalar derived from the step size is rounded once, as alone, not per operation)."""
        return self.steps if derive is None else self._rows([derive(value) for value in self.values])

    def _rows(self, values: list[float]) -> torch.Tensor:
        rows = [value for value, size in zip(values, self.sizes) for _ in range(size)]
        return torch.tensor(rows, dtype=self.dtype, device=self.device).unsqueeze(1)


# A client round's step size: a Python float for one run, an [n, 1] column in a batch of runs.
Step = float | torch.Tensor


def step_size(algorithm: Algorithm, ctx: RoundContext, derive: Callable[[float], float] | None = None) -> Step:
    """The local step size of this round's client round, lr * lr_scale (or ``derive`` of it,
    e.g. ``lambda lr: p / lr``): a Python float, or in a batch of runs with several step sizes
    (``ctx.row_lr``) an [n, 1] column of each row's own value. Every operation that combines a
    step with an [n, d] tensor gives each row the bits its run alone gets with the float: a
    product or quotient elementwise (``lr * g``, ``g / lr``), an ``alpha=`` step through
    :func:`descend` / :func:`descend_` (tests/test_batched.py holds every stacked algorithm to it)."""
    if ctx.row_lr is None:
        lr = algorithm.lr * ctx.lr_scale
        return lr if derive is None else derive(lr)
    return ctx.row_lr.column(derive)


def descend(z: torch.Tensor, u: torch.Tensor, lr: Step) -> torch.Tensor:
    """z - lr * u, a new tensor: ``torch.add(z, u, alpha=-lr)``, or with a column of step sizes
    the fused ``addcmul`` (the same rounding: one multiply-add per element)."""
    if isinstance(lr, torch.Tensor):
        return torch.addcmul(z, lr.neg(), u)
    return torch.add(z, u, alpha=-lr)


def descend_(z: torch.Tensor, u: torch.Tensor, lr: Step) -> torch.Tensor:
    """z -= lr * u in place (``z.sub_(u, alpha=lr)``; with a column, ``addcmul_``)."""
    if isinstance(lr, torch.Tensor):
        return z.addcmul_(lr.neg(), u)
    return z.sub_(u, alpha=lr)


def broadcast(vector: torch.Tensor, n: int) -> torch.Tensor:
    """The server vector [d] as a stack of n client copies [n, d] (a view, no copy). A stack
    [n, d] already (a batch of runs, each row its run's server vector: engine/batched.py) is
    returned as it is."""
    if vector.dim() == 2 and vector.shape[0] == n:
        return vector
    return vector.expand(n, *vector.shape)

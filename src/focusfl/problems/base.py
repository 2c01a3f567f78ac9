"""The Problem protocol: what an algorithm needs from an optimization problem.

A problem owns the model structure and the clients' data. Algorithms see only flat
parameter vectors: a stack ``[n, d]`` of points, one row per active client.

Objective (ALGORITHMS.md section 0): F(x) = (1/N) sum_i f_i(x), clients weighted equally.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, ClassVar, Sequence

import torch

GradientFn = Callable[[torch.Tensor, int], torch.Tensor]
"""``oracle(z, step) -> grads``: gradients of the bound clients at the stack ``z`` [n, d].

``step`` indexes the local step inside the round; stochastic problems key the minibatch on
(seed, round, client, step), so the same call gives the same draw in every engine."""


class Oracle:
    """A :data:`GradientFn` bound to one round's clients that keeps what its calls measured.

    ``compute(z, step) -> (gradients [n, d], losses [n] or None)``. The minibatch losses
    (problems whose rows report a training loss: neural networks) are kept on this object, which
    lives for one client round; the round that made it reads them back with :func:`live_losses`
    and returns them. Nothing accumulates on the problem, so any engine and any chunking of the
    clients computes the same rows (FedJAX's ``apply`` returning its diagnostics)."""

    def __init__(self, compute: Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor | None]]) -> None:
        self._compute = compute
        # (step, losses [n], live rows [n] or None) of every call that measured any
        self.calls: list[tuple[int, torch.Tensor, torch.Tensor | None]] = []

    def __call__(self, z: torch.Tensor, step: int) -> torch.Tensor:
        return self.masked(z, step, None)

    def masked(self, z: torch.Tensor, step: int, live: torch.Tensor | None) -> torch.Tensor:
        """The gradients of a step that only the ``live`` rows take (bool [n]; None: judged by the
        round's step counts, see live_losses): only their losses count."""
        gradients, losses = self._compute(z, step)
        if losses is not None:
            self.calls.append((step, losses.detach(), None if live is None else live.reshape(-1).detach()))
        return gradients


class PendingLosses:
    """Minibatch losses still on the problem's device, read as numbers only when asked
    (:meth:`values`): a round hands them on without waiting for the device, and the round loop
    reads them when it writes a row (engine/loop.py TrainLoss), so a GPU run does not stop for
    the host every round. ``losses`` [calls, n] and ``keep`` (bool, the same shape): which count."""

    def __init__(self, losses: torch.Tensor, keep: torch.Tensor) -> None:
        self.losses, self.keep = losses, keep

    def values(self) -> list[float]:
        """The kept losses as float64 numbers, call by call (the host waits for the device here)."""
        return self.losses[self.keep].to(torch.float64).reshape(-1).tolist()


def pending_losses(oracle: Any, steps: torch.Tensor | None) -> PendingLosses | None:
    """The minibatch losses an oracle's calls measured at the steps its clients really took: a
    call made for some rows only (Oracle.masked) counts those; otherwise a client with
    ``steps[k]`` local steps counts the calls of steps ``0..steps[k]-1`` only (a batched round
    runs max(tau_i) steps for everyone and masks the finished clients, the reference loop runs
    each client's own tau_i). ``steps`` None: all. None for an oracle that measured nothing (or a
    plain function). Nothing here waits for the device."""
    calls = getattr(oracle, "calls", None)
    if not calls:
        return None
    losses = torch.stack([values for _, values, _ in calls])  # [calls, n]
    keep = torch.ones_like(losses, dtype=torch.bool)
    if steps is not None:  # compared with each call's step as a number: no copy to the device
        taken = steps.to(losses.device)
        keep = torch.stack([taken > step for step, _, _ in calls])
    for k, (_, _, live) in enumerate(calls):
        if live is not None:
            keep[k] = live.to(losses.device)
    return PendingLosses(losses, keep)


def live_losses(oracle: Any, steps: torch.Tensor | None) -> list[float]:
    """:func:`pending_losses` as float64 numbers now ([] when none were measured)."""
    pending = pending_losses(oracle, steps)
    return [] if pending is None else pending.values()


def masked_gradients(oracle: Any, z: torch.Tensor, step: int, live: torch.Tensor) -> torch.Tensor:
    """``oracle(z, step)`` for a step that only the ``live`` rows take (bool, one per row): an
    oracle that keeps its calls' losses counts theirs only (Oracle.masked)."""
    masked = getattr(oracle, "masked", None)
    return oracle(z, step) if masked is None else masked(z, step, live)


class Problem(abc.ABC):
    """A federated objective with per-client gradients for stacks of points."""

    name: ClassVar[str]
    num_clients: int
    dim: int
    dtype: torch.dtype
    device: torch.device
    batch: int | None = None  # minibatch size; None = exact (full-batch) gradients
    # Metrics some rows lack (the round-0 row has no training loss yet): a metrics.csv that is
    # written row by row still needs their columns from its header on.
    late_metrics: ClassVar[tuple[str, ...]] = ()
    # The metrics its rows may carry (:meth:`metrics`); focusfl/metrics.py says which one
    # matters and which way is better.
    metric_names: ClassVar[tuple[str, ...]] = ("loss", "grad_norm", "rel_error")
    # What a negative ``loss`` means, for objectives with a linear term (said where it is printed).
    negative_loss: ClassVar[str] = ""

    @property
    def client_chunk(self) -> int | None:
        """How many active clients the vectorized engine batches at once (None = all).

        On a CPU, batched per-client mat-vecs are memory-bound: a chunk of clients whose data
        stays in cache through all local steps runs faster than one batch of every client,
        which streams all their data from memory at every step. Problems that know their
        per-client footprint override this; the result is the same for any chunk size.
        """
        return None

    @abc.abstractmethod
    def client_gradients(
        self, x: torch.Tensor, clients: torch.Tensor, *, seed: int, round: int, step: int
    ) -> torch.Tensor:
        """Gradients of f_{clients[k]} at x[k]: ``[n, d]`` for ``x`` [n, d] and ``clients`` [n]."""

    def oracle(self, clients: torch.Tensor, *, seed: int, round: int, steps: int | None = None) -> GradientFn:
        """Gradient function bound to one round's active clients.

        Subclasses may gather per-client data once here instead of at every local step, and
        prepare the minibatches of the ``steps`` local steps the round will take (a hint: every
        step is served, with the same gradients).
        """

        def gradients(z: torch.Tensor, step: int) -> torch.Tensor:
            return self.client_gradients(z, clients, seed=seed, round=round, step=step)

        return gradients

    def runs_oracle(self, segments: Sequence[tuple[torch.Tensor, int]], *, round: int,
                    steps: int | None = None) -> "RunsOracle":
        """One gradient function for the stacked clients of several runs of this problem (a
        batch of runs, engine/batched.py): ``segments`` are each run's (clients, seed), stacked
        in that order. The default asks :meth:`oracle` of each run for its own rows, so every row
        gets the gradient its run alone gets; problems whose gradients do not depend on the seed
        (exact gradients) may serve all rows with one call (the result the same, row by row)."""
        return RunsOracle([self.oracle(clients, seed=seed, round=round, steps=steps) for clients, seed in segments],
                          [int(clients.numel()) for clients, _ in segments])

    @abc.abstractmethod
    def loss(self, x: torch.Tensor) -> torch.Tensor:
        """Global objective F(x) for one point ``x`` [d] (a 0-d tensor)."""

    @abc.abstractmethod
    def gradient(self, x: torch.Tensor) -> torch.Tensor:
        """Exact global gradient of F at ``x`` [d]."""

    @property
    def x_star(self) -> torch.Tensor | None:
        """The exact minimizer of F when known, else None."""
        return None

    def smoothness(self) -> float | None:
        """L: the largest smoothness constant of the clients' objectives f_i, when known
        (``--lr auto`` derives stable step sizes from it); None otherwise."""
        return None

    def initial_point(self) -> torch.Tensor:
        """The common starting model x_0 (zeros unless a problem says otherwise)."""
        return torch.zeros(self.dim, dtype=self.dtype, device=self.device)

    def metrics(self, x: torch.Tensor) -> dict[str, float]:
        """The evaluation row for the server model x: loss, grad_norm, rel_error (if x* known)."""
        row = {
            "loss": float(self.loss(x)),
            "grad_norm": float(torch.linalg.vector_norm(self.gradient(x))),
        }
        x_star = self.x_star
        if x_star is not None:
            row["rel_error"] = relative_error(x, x_star)
        return row

    def settle(self) -> None:
        """Make the choices a problem defers to run time now (a neural network's formulation,
        when measured), so that :meth:`describe` records them before a run writes its record:
        a run stopped at any point resumes computing the same way. Default: nothing deferred."""

    def input_paths(self) -> dict[str, Path | tuple[Path, ...]]:
        """The files and folders the problem was built from, by what they are (``data``,
        ``tokenizer``, ``model``; an entry may be several files): a run records their digest and a
        resume refuses changed ones (runs/inputs.py). Problems drawn from the seed alone read none."""
        return {}

    @abc.abstractmethod
    def describe(self) -> dict[str, Any]:
        """``{"name": ..., **parameters}``: enough to rebuild the problem (JSON-serialisable)."""


def relative_error(x: torch.Tensor, x_star: torch.Tensor) -> float:
    """||x - x*|| / ||x*|| (absolute error when x* = 0)."""
    scale = float(torch.linalg.vector_norm(x_star))
    err = float(torch.linalg.vector_norm(x - x_star))
    return err / scale if scale > 0 else err


@dataclass(frozen=True)
class ClientData:
    """Per-client samples stacked with padding: features [N, m, d], targets [N, m], sizes [N]."""

    features: torch.Tensor
    targets: torch.Tensor
    sizes: torch.Tensor


class RunsOracle:
    """The oracle of a batch of runs' stacked clients (:meth:`Problem.runs_oracle`): its rows in
    segments, one per run, each served by that run's own oracle (``parts``; one part for all
    when the problem serves every row at once). :meth:`losses` gives each run the minibatch
    losses of its own rows."""

    def __init__(self, parts: Sequence[Any], sizes: Sequence[int]) -> None:
        self.parts, self.sizes = list(parts), list(sizes)

    def __call__(self, z: torch.Tensor, step: int) -> torch.Tensor:
        return self.masked(z, step, None)

    def masked(self, z: torch.Tensor, step: int, live: torch.Tensor | None) -> torch.Tensor:
        if len(self.parts) == 1:
            return self._call(self.parts[0], z, step, live)
        zs = z.split(self.sizes)
        lives = [None] * len(zs) if live is None else live.reshape(-1).split(self.sizes)
        return torch.cat([self._call(part, zk, step, lk) for part, zk, lk in zip(self.parts, zs, lives)])

    @staticmethod
    def _call(part: Any, z: torch.Tensor, step: int, live: torch.Tensor | None) -> torch.Tensor:
        return part(z, step) if live is None else masked_gradients(part, z, step, live)

    def losses(self, steps: Sequence[torch.Tensor | None]) -> list[list[PendingLosses | None]]:
        """Per run, the minibatch losses of its rows at the steps they took (pending_losses: still
        on the device, read when the run writes a row, as a run alone does); ``steps``: each
        run's step counts (None: all)."""
        if len(self.parts) == len(self.sizes):
            return [[pending_losses(part, run_steps)] for part, run_steps in zip(self.parts, steps)]
        calls, result, offset = getattr(self.parts[0], "calls", None) or [], [], 0
        for size, run_steps in zip(self.sizes, steps):
            mine = SimpleNamespace(calls=[(step, values[offset:offset + size],
                                           None if live is None else live[offset:offset + size])
                                          for step, values, live in calls])
            result.append([pending_losses(mine, run_steps)])
            offset += size
        return result

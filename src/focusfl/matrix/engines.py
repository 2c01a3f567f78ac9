"""Matrix-form engines: single-index recursions on (N+1) x d stacks, exactly as the matrices say.

These are an independent derivation of the algorithms from the paper's equations, not wrappers
around the per-client code; the equivalence tests compare the two. Row 0 of every stack is the
server (f_0 = 0: its gradient row is zero), rows 1..N the clients. ``x`` starts with every row
equal to x_0. Gradients are computed only on the rows a D matrix switches on (the others are
multiplied by zero, so computing them would change nothing but the cost); they are keyed on
(seed, round, client, step) like the per-client engines, so minibatch problems agree too.

FedAvg (eq. 6):      y_k = R_k x_k;  y+_k = y_k - eta D_k grad f(y_k);  x_{k+1} = A_k y+_k.
                     Server model of round r: x_{r tau, 0}.
FedAvg (eq. 8):      x_{k+1} = W_k (x_k - eta grad f(x_k)), all clients compute (virtually).
FOCUS (eqs. 13-14):  x_{k+1} = R_k (x_k - eta D_k y_k);  y_{k+1} = C_k (y_k + g_{k+1} - g_k),
                     g_k = grad f(x_k) stored per row (rows that did not move keep theirs),
                     y_0 = g_0 = grad f(x_0) (so 1^T y_k = 1^T g_k at every k). Because the
                     server's step is taken at the next round's pull, Algorithm 1's x_r is the
                     readout x_{r tau, 0} - eta d_0 y_{r tau, 0} (d_0 = whether the pull steps).
Push-sum (seed 003): z_{k+1} = C_k (z_k - eta D_k grad f(x_k));  w_{k+1} = C_k w_k;
                     x = z / w row-wise. Server model = z_0 / w_0 after each round.
Push-sum tracking:   u_{k+1} = C_k (u_k - eta D_k y_k);  w_{k+1} = C_k w_k;  x = u / w;
                     y_{k+1} = C_k y_k + g_{k+1} - g_k with g refreshed on the rows that step
                     next (the gradient at the point after the last local step is deferred to
                     the client's next participation, like FOCUS's g_prev); y_0 = g_0 = 0.

Per-client step counts (``steps`` [R, N], from a work process: :func:`work_steps`): client i
steps at iterations t < tau_{i,r} of round r only (sequences.py). The recursions above are
unchanged; D_k switches on the live clients L_k, and only they get a fresh gradient (FOCUS: a
client that has stopped keeps its stored g, exactly like the per-client g_prev). FedAvg's eq. (8)
lets absent clients compute virtually and stops the finished active ones.

Only constant step sizes: the per-client engines' lr_scale schedules have no single-index form
here (FOCUS's server step would belong to the previous round's schedule).
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import torch

from ..algorithms.fedavg import FedAvg
from ..algorithms.fednova import FedNova
from ..algorithms.focus import Focus
from ..algorithms.pushsum import PushSum
from ..algorithms.pushsum_tracking import PushSumTracking
from ..errors import ConfigError
from ..participation.statistics import as_mask
from ..problems.base import Problem
from .sequences import (
    fedavg_mixing_sequence,
    fedavg_sequence,
    focus_sequence,
    focus_server_steps,
    pushsum_sequence,
)


class MatrixRun(NamedTuple):
    """``server`` [R+1, d]: the server model at the start of every round and after the last;
    the final stacks (None where the method has no such variable)."""

    server: torch.Tensor
    x: torch.Tensor
    y: torch.Tensor | None
    w: torch.Tensor | None


class IterationView(NamedTuple):
    """What an observer sees after iteration k: its matrices and the new stacks."""

    iteration: Any  # a FedAvgIteration, MixingIteration, FocusIteration or PushSumIteration
    x: torch.Tensor  # (N+1) x d model rows after the iteration
    y: torch.Tensor | None  # tracking / intermediate variable (FOCUS y, push-sum tracking y)
    grads: torch.Tensor | None  # stored gradient rows g_{k+1} (FOCUS, push-sum tracking)
    w: torch.Tensor | None  # push-sum weights


Observer = Callable[[IterationView], None]


def _stack(x0: torch.Tensor, num_clients: int) -> torch.Tensor:
    return x0.expand(num_clients + 1, -1).clone()


def gradient_rows(
    problem: Problem, points: torch.Tensor, nodes: list[int], *, seed: int, round_: int, step: int
) -> torch.Tensor:
    """(N+1) x d stack with grad f_i(points_i) on the rows ``nodes`` and zeros elsewhere."""
    out = torch.zeros_like(points)
    if nodes:
        index = torch.tensor(nodes, device=points.device)
        grads = problem.client_gradients(
            points.index_select(0, index), index - 1, seed=seed, round=round_, step=step
        )
        out = out.index_copy(0, index, grads)
    return out


def _start(problem: Problem, mask, x0) -> tuple[Any, torch.Tensor]:
    m = as_mask(mask)
    if m.shape[1] != problem.num_clients:
        raise ConfigError(f"mask has {m.shape[1]} clients, problem has {problem.num_clients}")
    x0 = problem.initial_point() if x0 is None else x0.to(problem.dtype)
    return m, x0


def work_steps(work, rounds: int) -> torch.Tensor | None:
    """The [R, N] step-count table of a work process for the matrix engines (None: fixed)."""
    return None if work is None or work.fixed else work.table(rounds)


def fedavg_matrix(
    problem: Problem, mask, *, lr: float, local_steps: int = 1, server_lr: float = 1.0,
    weighting: str = "active", p=None, seed: int = 0, x0: torch.Tensor | None = None,
    observer: Observer | None = None, steps=None, normalized: bool = False,
) -> MatrixRun:
    """FedAvg as eq. (6): pull, local update, average, over the sequence of eq. (7).
    ``normalized``: FedNova (A_k's server row reweighted by tau_eff / tau_i, sequences.py)."""
    m, x0 = _start(problem, mask, x0)
    x = _stack(x0, problem.num_clients)
    servers = [x[0]]
    for it in fedavg_sequence(
        m, local_steps, server_lr=server_lr, weighting=weighting, p=p, steps=steps, normalized=normalized,
        dtype=x.dtype, device=x.device
    ):
        y = it.R @ x
        grads = gradient_rows(problem, y, it.live, seed=seed, round_=it.round, step=it.t)
        y_plus = y - lr * (it.D @ grads)
        x = it.A @ y_plus
        if observer is not None:
            observer(IterationView(it, x, y_plus, None, None))
        if it.t == local_steps - 1:
            servers.append(x[0])
    return MatrixRun(torch.stack(servers), x, None, None)


def fedavg_mixing(
    problem: Problem, mask, *, lr: float, local_steps: int = 1, seed: int = 0,
    x0: torch.Tensor | None = None, observer: Observer | None = None, steps=None,
) -> MatrixRun:
    """FedAvg as eq. (8): every client steps (absent ones virtually, finished ones not), W_k
    mixes at round ends: x_{k+1} = W_k (x_k - eta D_k grad f(x_k))."""
    m, x0 = _start(problem, mask, x0)
    n = problem.num_clients
    x = _stack(x0, n)
    servers = [x[0]]
    everyone = list(range(1, n + 1))
    for it in fedavg_mixing_sequence(m, local_steps, steps=steps, dtype=x.dtype, device=x.device):
        grads = gradient_rows(problem, x, everyone, seed=seed, round_=it.round, step=it.t)
        x = it.W @ (x - lr * (it.D @ grads))
        if observer is not None:
            observer(IterationView(it, x, None, None, None))
        if it.t == local_steps - 1:
            servers.append(x[0])
    return MatrixRun(torch.stack(servers), x, None, None)


def focus_matrix(
    problem: Problem, mask, *, lr: float, local_steps: int = 1, skip_empty: bool = False,
    seed: int = 0, x0: torch.Tensor | None = None, observer: Observer | None = None, steps=None,
) -> MatrixRun:
    """FOCUS as eqs. (13)-(14) with y_0 = grad f(x_0); see the module docstring for the readout."""
    m, x0 = _start(problem, mask, x0)
    n = problem.num_clients
    x = _stack(x0, n)
    clients = list(range(1, n + 1))
    grads = gradient_rows(problem, x, clients, seed=seed, round_=0, step=0)
    y = grads.clone()
    server_steps = focus_server_steps(m, skip_empty)
    servers = []
    for it in focus_sequence(m, local_steps, skip_empty=skip_empty, steps=steps, dtype=x.dtype, device=x.device):
        if it.t == 0:
            servers.append(x[0] - lr * float(server_steps[it.round]) * y[0])
        x_next = it.R @ (x - lr * (it.D @ y))
        # Only the live rows L_k moved (the server's f_0 = 0; R_k puts S_r = L_k at t = 0), so
        # only they get a new gradient; a finished client keeps its stored one.
        fresh = gradient_rows(problem, x_next, it.live, seed=seed, round_=it.round, step=it.t)
        moved = torch.zeros(n + 1, dtype=torch.bool, device=x.device)
        moved[it.live] = True
        grads_next = torch.where(moved[:, None], fresh, grads)
        y = it.C @ (y + grads_next - grads)
        x, grads = x_next, grads_next
        if observer is not None:
            observer(IterationView(it, x, y, grads, None))
    servers.append(x[0] - lr * float(server_steps[m.shape[0]]) * y[0])
    return MatrixRun(torch.stack(servers), x, y, None)


def pushsum_matrix(
    problem: Problem, mask, *, lr: float, local_steps: int = 1, share: float, fraction: float,
    seed: int = 0, x0: torch.Tensor | None = None, observer: Observer | None = None,
) -> MatrixRun:
    """Push-sum with column-stochastic matrices only (authors' answer, seed 003)."""
    m, x0 = _start(problem, mask, x0)
    n = problem.num_clients
    z = _stack(x0, n)
    w = torch.ones(n + 1, dtype=z.dtype, device=z.device)
    servers = [z[0] / w[0]]
    for it in pushsum_sequence(m, local_steps, share=share, fraction=fraction, dtype=z.dtype, device=z.device):
        x = z / w[:, None]
        stepping = it.nodes if it.t > 0 else []
        grads = gradient_rows(problem, x, stepping, seed=seed, round_=it.round, step=it.t - 1)
        z = it.C @ (z - lr * (it.D @ grads))
        w = it.C @ w
        if observer is not None:
            observer(IterationView(it, z / w[:, None], z, None, w))
        if it.t == local_steps:
            servers.append(z[0] / w[0])
    x = z / w[:, None]
    return MatrixRun(torch.stack(servers), x, z, w)


def pushsum_tracking_matrix(
    problem: Problem, mask, *, lr: float, local_steps: int = 1, share: float, fraction: float,
    seed: int = 0, x0: torch.Tensor | None = None, observer: Observer | None = None,
) -> MatrixRun:
    """Push-sum with gradient tracking (Push-DIGing form over the participation matrices)."""
    m, x0 = _start(problem, mask, x0)
    n = problem.num_clients
    u = _stack(x0, n)
    w = torch.ones(n + 1, dtype=u.dtype, device=u.device)
    y = torch.zeros_like(u)
    grads = torch.zeros_like(u)  # stored gradients g_k; 0 = "not computed yet" (g_prev = 0)
    servers = [u[0] / w[0]]
    for it in pushsum_sequence(
        m, local_steps, share=share, fraction=fraction, server_step=True, dtype=u.dtype, device=u.device
    ):
        u = it.C @ (u - lr * (it.D @ y))
        w = it.C @ w
        x = u / w[:, None]
        # The active clients step at iterations t+1 <= tau: refresh their gradient now.
        refresh = it.nodes if it.t < local_steps else []
        fresh = gradient_rows(problem, x, refresh, seed=seed, round_=it.round, step=it.t)
        moved = torch.zeros(n + 1, dtype=torch.bool, device=u.device)
        moved[refresh] = True
        grads_next = torch.where(moved[:, None], fresh, grads)
        y = it.C @ y + grads_next - grads
        grads = grads_next
        if observer is not None:
            observer(IterationView(it, x, y, grads, w))
        if it.t == local_steps:
            servers.append(u[0] / w[0])
    return MatrixRun(torch.stack(servers), u / w[:, None], y, w)


def run_matrix_form(
    algorithm, problem: Problem, mask, *, seed: int = 0, observer: Observer | None = None, steps=None
) -> MatrixRun:
    """The matrix form of a registered algorithm object (FedAvg and its weightings, FedNova, FOCUS,
    push-sum variants); ``steps`` [R, N]: per-client step counts (FedAvg, FedNova, FOCUS only)."""
    common = dict(lr=algorithm.lr, local_steps=algorithm.local_steps, seed=seed, observer=observer)
    if steps is not None and not isinstance(algorithm, (FedAvg, Focus)):
        raise ConfigError(f"the matrix form of {algorithm.name!r} has no per-client step counts (have: fedavg, fednova, focus)")
    if steps is not None:
        common["steps"] = steps
    if isinstance(algorithm, FedAvg):
        if algorithm.weighting == "known_p" and algorithm.p is None:
            raise ConfigError("fedavg: the matrix form of weighting=known_p needs p given explicitly")
        return fedavg_matrix(
            problem, mask, server_lr=algorithm.server_lr, weighting=algorithm.weighting, p=algorithm.p,
            normalized=isinstance(algorithm, FedNova), **common
        )
    if isinstance(algorithm, Focus):
        return focus_matrix(problem, mask, skip_empty=algorithm.skip_empty, **common)
    if isinstance(algorithm, PushSumTracking):
        share = algorithm.pull / problem.num_clients
        return pushsum_tracking_matrix(problem, mask, share=share, fraction=algorithm.push, **common)
    if isinstance(algorithm, PushSum):
        share = algorithm.pull / problem.num_clients
        return pushsum_matrix(problem, mask, share=share, fraction=algorithm.push, **common)
    raise ConfigError(f"no matrix form for algorithm {algorithm.name!r} (have: fedavg, fednova, focus, pushsum, pushsum_tracking)")

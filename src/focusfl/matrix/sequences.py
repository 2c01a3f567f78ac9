"""Time-varying matrix sequences of FedAvg, FOCUS and push-sum for any participation sequence.

Index conventions (derived here; the paper counts local steps from 1, we count from 0):

- One iteration k per local step: k = r * tau + t, t = 0..tau-1 (push-sum: tau + 1 iterations
  per round, see below). Round r uses the participation row ``mask[r]`` (clients 0..N-1, that is
  nodes 1..N).
- FedAvg (eqs. 6-7): R_k = R(S_r) at t = 0, A_k = A(S_r) at t = tau - 1, I otherwise; D_k = D(S_r)
  at every t. For tau = 1 one iteration carries both.
- FedAvg, condensed (eq. 8, appendix D eqs. 41-44): W_k = W_mix(S_r) at t = tau - 1, I otherwise;
  every client computes (virtually), so no D.
- FOCUS (eqs. 13-14): R_k = R(S_r) at t = 0 and C_k = C(S_r) at t = tau - 1 (the push closes the
  round, eqs. 17-19; "C_k = R_k^T" holds for the patterns, not for the same k unless tau = 1).
  D_k = diag(d_0, 1_{S_r}) where d_0 = 1 at t = 0 only: the server's step x_0 <- x_0 - eta y_0 is
  taken at the pull, so the step that Algorithm 1 calls x_{r+1} = x_r - eta y_{r+1} happens at
  iteration (r+1) tau (the paper's shift of the x/y order). With ``skip_empty`` (the authors'
  PyTorch server; not their ridge notebook) that step is dropped when S_r was empty.
- Push-sum (seed 003): k = r (tau+1) + t, t = 0..tau. t = 0 is the pull (server shares its mass;
  D holds the server only, which matters for the tracking variant), t = 1..tau are local steps of
  S_r, and the push to the server closes t = tau.

Per-client step counts (a work process, focusfl.work): ``steps`` [R, N] gives tau_{i,r} in 1..tau
(entries of absent clients are ignored). Round r still has tau iterations; client i steps at
t < tau_{i,r} only. Its D entry is 0 for t >= tau_{i,r} (it neither moves nor computes a new
gradient), and the pull at t = 0 and the push/average at t = tau - 1 are as before: a client that
stopped early waits, its row unchanged, for the round's end. ``live`` lists the clients that step
at iteration k, L_k = {i in S_r : t < tau_{i,r}} (= S_r without step counts). For FedAvg's eq. (8)
the switch is D_k = diag(0, 1 - 1_F), F = S_r minus L_k: absent clients still compute virtually,
finished active clients stop. FedNova is eq. (6) with A(S)'s weights w_i tau_eff / tau_i.
"""
from __future__ import annotations

from typing import Iterator, NamedTuple

import numpy as np
import torch

from ..errors import ConfigError
from ..participation.statistics import as_mask
from .stochastic import (
    average_matrix,
    fedavg_mixing_matrix,
    local_update_mask,
    nodes_from_mask,
    pull_matrix,
    push_matrix,
    pushsum_pull_matrix,
    pushsum_push_matrix,
)


class FedAvgIteration(NamedTuple):
    k: int
    round: int
    t: int
    nodes: list[int]  # S_r as node labels 1..N
    R: torch.Tensor  # pull (row stochastic) or I
    D: torch.Tensor  # local-update switch: the live clients L_k
    A: torch.Tensor  # average (row stochastic) or I
    live: list[int]  # L_k: the clients of S_r that still step at this iteration


class MixingIteration(NamedTuple):
    k: int
    round: int
    t: int
    nodes: list[int]
    W: torch.Tensor  # FedAvg mixing matrix W_mix(S_r) or I
    D: torch.Tensor  # who computes: every client but the active ones that have finished
    live: list[int]  # L_k (as in FedAvgIteration)


class FocusIteration(NamedTuple):
    k: int
    round: int
    t: int
    nodes: list[int]
    R: torch.Tensor  # pull of x (row stochastic) or I
    C: torch.Tensor  # push of y (column stochastic) or I
    D: torch.Tensor  # who steps: the server at the pull, the live clients L_k
    live: list[int]  # L_k: the clients of S_r that still step (and get a new gradient) here


class PushSumIteration(NamedTuple):
    k: int
    round: int
    t: int
    nodes: list[int]
    C: torch.Tensor  # pull share, push share, or I (all column stochastic)
    D: torch.Tensor  # who steps


def _check_tau(tau: int) -> int:
    if isinstance(tau, bool) or not isinstance(tau, int) or tau < 1:
        raise ConfigError(f"local steps tau must be an integer >= 1, got {tau!r}")
    return tau


def _rounds(mask) -> tuple[np.ndarray, int]:
    m = as_mask(mask)
    return m, m.shape[1]


def step_table(steps, mask: np.ndarray, tau: int) -> np.ndarray:
    """int64 [R, N] tau_{i,r}: ``steps`` checked against the mask's shape and 1..tau on the active
    entries (absent entries are ignored), or tau everywhere when ``steps`` is None."""
    rounds, n = mask.shape
    if steps is None:
        return np.full((rounds, n), tau, dtype=np.int64)
    table = np.asarray(steps.cpu() if isinstance(steps, torch.Tensor) else steps)
    if table.shape != (rounds, n) or not np.issubdtype(table.dtype, np.integer):
        raise ConfigError(f"step counts must be integers of shape {(rounds, n)}, got {table.dtype} {table.shape}")
    active = table[mask]
    if active.size and (active.min() < 1 or active.max() > tau):
        raise ConfigError(f"step counts of active clients must be in 1..{tau}, got {active.min()}..{active.max()}")
    return table.astype(np.int64)


def live_nodes(nodes: list[int], counts: np.ndarray, t: int) -> list[int]:
    """L_k: the nodes of S_r whose count tau_{i,r} (counts[node - 1]) exceeds t."""
    return [i for i in nodes if counts[i - 1] > t]


def fedavg_weights(nodes: list[int], num_clients: int, weighting: str, p) -> list[float] | None:
    """The server's averaging weights for FedAvg's ``weighting`` (None = 1/|S|)."""
    if weighting == "active":
        return None
    if weighting == "all":
        return [1.0 / num_clients] * len(nodes)
    if weighting == "known_p":
        return [1.0 / (num_clients * float(p[i - 1])) for i in nodes]
    raise ConfigError(f"unknown FedAvg weighting {weighting!r}")


def normalized_weights(weights: list[float], counts: list[int]) -> list[float]:
    """FedNova's averaging row as A(S)'s weights: w_i tau_eff / tau_i with tau_eff = sum w_i tau_i /
    sum w_i, so that x + gamma sum_i w'_i (z_i - x) = x - gamma tau_eff sum_i w_i (x - z_i)/tau_i."""
    tau_eff = sum(w * c for w, c in zip(weights, counts)) / sum(weights)
    return [w * tau_eff / c for w, c in zip(weights, counts)]


def fedavg_sequence(
    mask, tau: int, *, server_lr: float = 1.0, weighting: str = "active", p=None,
    steps=None, normalized: bool = False, dtype=torch.float64, device="cpu",
) -> Iterator[FedAvgIteration]:
    """(R_k, D_k, A_k) of eq. (7) for every k, round by round; ``steps``: per-client counts
    (module docstring), D_k = D(L_k). ``normalized``: FedNova, whose server row is A(S) with the
    weights of :func:`normalized_weights` (the same matrices otherwise)."""
    m, n = _rounds(mask)
    tau = _check_tau(tau)
    counts = step_table(steps, m, tau)
    eye = torch.eye(n + 1, dtype=dtype, device=device)
    for r, row in enumerate(m):
        nodes = nodes_from_mask(row)
        pull = pull_matrix(nodes, n, dtype=dtype, device=device)
        weights = fedavg_weights(nodes, n, weighting, p)
        if normalized and nodes:
            weights = normalized_weights(weights or [1.0 / len(nodes)] * len(nodes),
                                         [int(counts[r, i - 1]) for i in nodes])
        avg = average_matrix(nodes, n, weights=weights, server_lr=server_lr, dtype=dtype, device=device)
        for t in range(tau):
            live = live_nodes(nodes, counts[r], t)
            d = local_update_mask(live, n, dtype=dtype, device=device)
            yield FedAvgIteration(
                r * tau + t, r, t, nodes, pull if t == 0 else eye, d, avg if t == tau - 1 else eye, live
            )


def fedavg_mixing_sequence(
    mask, tau: int, *, steps=None, dtype=torch.float64, device="cpu"
) -> Iterator[MixingIteration]:
    """W_k of eq. (8)/(43): W_mix(S_r) at the last local step of round r, I otherwise; D_k switches
    off the active clients that have finished their tau_{i,r} steps (module docstring)."""
    m, n = _rounds(mask)
    tau = _check_tau(tau)
    counts = step_table(steps, m, tau)
    eye = torch.eye(n + 1, dtype=dtype, device=device)
    everyone = list(range(1, n + 1))
    for r, row in enumerate(m):
        nodes = nodes_from_mask(row)
        mix = fedavg_mixing_matrix(nodes, n, dtype=dtype, device=device)
        for t in range(tau):
            live = live_nodes(nodes, counts[r], t)
            finished = set(nodes) - set(live)
            computing = [i for i in everyone if i not in finished]
            d = local_update_mask(computing, n, dtype=dtype, device=device)
            yield MixingIteration(r * tau + t, r, t, nodes, mix if t == tau - 1 else eye, d, live)


def focus_server_steps(mask, skip_empty: bool = False) -> np.ndarray:
    """d_0 of every round's pull: whether the server steps at k = r tau (bool [R + 1]).

    Entry r is the step that turns Algorithm 1's x_{r-1} into x_r; entry 0 is the step of the
    first pull, which moves nothing (y = 0). With ``skip_empty`` a round after an empty one has
    no step. Entry R is the readout step after the last round.
    """
    m = as_mask(mask)
    steps = np.ones(m.shape[0] + 1, dtype=bool)
    if skip_empty:
        steps[1:] = m.any(axis=1)
    return steps


def focus_sequence(
    mask, tau: int, *, skip_empty: bool = False, steps=None, dtype=torch.float64, device="cpu"
) -> Iterator[FocusIteration]:
    """(R_k, C_k, D_k) of eqs. (13)-(14) for every k, round by round; ``steps``: per-client
    counts (module docstring), D_k = diag(d_0, 1_{L_k})."""
    m, n = _rounds(mask)
    tau = _check_tau(tau)
    counts = step_table(steps, m, tau)
    eye = torch.eye(n + 1, dtype=dtype, device=device)
    server_steps = focus_server_steps(m, skip_empty)
    for r, row in enumerate(m):
        nodes = nodes_from_mask(row)
        pull = pull_matrix(nodes, n, dtype=dtype, device=device)
        push = push_matrix(nodes, n, dtype=dtype, device=device)
        for t in range(tau):
            live = live_nodes(nodes, counts[r], t)  # t = 0: all of S_r (every tau_{i,r} >= 1)
            d = local_update_mask(live, n, server=t == 0 and bool(server_steps[r]), dtype=dtype, device=device)
            yield FocusIteration(
                r * tau + t, r, t, nodes,
                pull if t == 0 else eye,
                push if t == tau - 1 else eye,
                d, live,
            )


def pushsum_sequence(
    mask, tau: int, *, share: float, fraction: float, server_step: bool = False,
    dtype=torch.float64, device="cpu",
) -> Iterator[PushSumIteration]:
    """(C_k, D_k) of push-sum: pull (t = 0), tau local steps (t = 1..tau), push closing t = tau.

    ``share``: fraction of the server's mass sent to each active client; ``fraction``: part of its
    mass an active client pushes back. ``server_step`` switches the server on at the pull (used
    by the tracking variant, where the server holds gradient mass).
    """
    m, n = _rounds(mask)
    tau = _check_tau(tau)
    eye = torch.eye(n + 1, dtype=dtype, device=device)
    for r, row in enumerate(m):
        nodes = nodes_from_mask(row)
        pull = pushsum_pull_matrix(nodes, n, share, dtype=dtype, device=device)
        push = pushsum_push_matrix(nodes, n, fraction, dtype=dtype, device=device)
        d_pull = local_update_mask([], n, server=server_step, dtype=dtype, device=device)
        d_clients = local_update_mask(nodes, n, dtype=dtype, device=device)
        base = r * (tau + 1)
        yield PushSumIteration(base, r, 0, nodes, pull, d_pull)
        for t in range(1, tau + 1):
            yield PushSumIteration(base + t, r, t, nodes, push if t == tau else eye, d_clients)

"""Stochastic matrices over nodes 0..N for one active set S (FOCUS paper, section 3, Figure 1).

Node 0 is the server, node i (1..N) is client i. A matrix M acts on a stack of row vectors
``x`` [(N+1), d] as ``M @ x``; a non-zero M[i, j] is a link j -> i (node i takes from node j).
Active sets are given in the PAPER's numbering, clients 1..N (the figures' S = {1, 3}); a
participation mask row (clients 0..N-1) converts with :func:`nodes_from_mask`.

- R(S)  pull, row stochastic: row i in S is e_0 (client i copies the server); every other row
        is e_i.
- A(S)  average, row stochastic: row 0 is (1/|S|) on the columns in S; rows i >= 1 are e_i.
        The paper's formula (eq. 4) puts 1/|S| at [i in S, j = 0], i.e. transposed; its
        Figure 1 and eq. 5 show the intended matrix, which is what is built here.
        A(empty set) keeps the server: row 0 = e_0 (FedAvg leaves x unchanged in an empty round).
- C(S)  push, column stochastic: column j in S is e_0 (client j hands all its mass to the
        server); every other column is e_j. C(S) = R(S)^T.
- W(S)  doubly stochastic and symmetric: W[0, i] = W[i, 0] = w for i in S, diagonal = 1 minus
        the rest of its row. The text's formula takes w = 1/|S|; Figure 1 draws w = 1/(|S|+1)
        (the server and the active clients averaged as equals). Both are doubly stochastic;
        ``weight`` picks.
- D(S)  diagonal 0/1 switch of local computation: 1 for clients in S (and for the server when
        asked: FOCUS's server step).

Two more families are built from these for the engines: the FedAvg mixing matrix W_k of eqs.
(8), (43)-(44) (every row = the server's averaging row; the "all clients pull virtually" form)
and the push-sum pull/push matrices of the authors' answer in seed 003 (column stochastic only).
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np
import torch

from ..errors import ConfigError

# Entries and sums are compared to this tolerance: the matrices hold 1/|S| fractions.
TOLERANCE = 1e-12


# -- active sets --------------------------------------------------------------------------------
def active_nodes(active: Iterable[int] | torch.Tensor | np.ndarray, num_clients: int) -> list[int]:
    """Sorted client node labels (1..N) of S; ConfigError for labels outside 1..N or repeats."""
    if isinstance(active, (torch.Tensor, np.ndarray)):
        active = active.tolist()
    if any(isinstance(v, bool) or int(v) != v for v in active):
        raise ConfigError(f"active set {list(active)} must hold whole client numbers")
    nodes = [int(v) for v in active]
    if len(set(nodes)) != len(nodes):
        raise ConfigError(f"active set {nodes} repeats a client")
    bad = [v for v in nodes if not 1 <= v <= num_clients]
    if bad:
        raise ConfigError(f"active client {bad[0]} is outside 1..{num_clients} (node 0 is the server)")
    return sorted(nodes)


def nodes_from_mask(row: np.ndarray | Sequence[bool]) -> list[int]:
    """Node labels (1..N) of the clients set in one participation-mask row (clients 0..N-1)."""
    return [int(i) + 1 for i in np.flatnonzero(np.asarray(row, dtype=bool))]


def _identity(num_clients: int, dtype: torch.dtype, device) -> torch.Tensor:
    return torch.eye(num_clients + 1, dtype=dtype, device=device)


# -- the four matrices of Figure 1 --------------------------------------------------------------
def pull_matrix(active, num_clients: int, *, dtype=torch.float64, device="cpu") -> torch.Tensor:
    """R(S): every active client's row becomes e_0 (it copies the server's model)."""
    nodes = active_nodes(active, num_clients)
    m = _identity(num_clients, dtype, device)
    for i in nodes:
        m[i, i] = 0.0
        m[i, 0] = 1.0
    return m


def average_matrix(
    active,
    num_clients: int,
    *,
    weights: Sequence[float] | None = None,
    server_lr: float = 1.0,
    dtype=torch.float64,
    device="cpu",
) -> torch.Tensor:
    """A(S): the server's row averages the active clients; other rows are unchanged.

    Row 0 = (1 - server_lr * sum(w)) e_0 + server_lr * sum_{i in S} w_i e_i, with w_i = 1/|S|
    by default: the server moves by server_lr times the weighted mean of the clients' updates.
    With the defaults this is the paper's A(S); other weights or server_lr > 1 keep every row
    summing to one (the recursion stays exact) but may leave the stochastic matrices.
    ``weights`` lists w_i in the order of the sorted active nodes. A(empty) = I.
    """
    nodes = active_nodes(active, num_clients)
    m = _identity(num_clients, dtype, device)
    if not nodes:
        return m
    if weights is None:
        weights = [1.0 / len(nodes)] * len(nodes)
    if len(weights) != len(nodes):
        raise ConfigError(f"average_matrix: {len(weights)} weights for {len(nodes)} active clients")
    m[0, 0] = 1.0 - server_lr * float(sum(weights))
    for i, w in zip(nodes, weights):
        m[0, i] = server_lr * float(w)
    return m


def push_matrix(active, num_clients: int, *, dtype=torch.float64, device="cpu") -> torch.Tensor:
    """C(S) = R(S)^T: every active client's column becomes e_0 (its mass moves to the server)."""
    return pull_matrix(active, num_clients, dtype=dtype, device=device).T.contiguous()


def doubly_stochastic_matrix(
    active, num_clients: int, *, weight: float | None = None, dtype=torch.float64, device="cpu"
) -> torch.Tensor:
    """W(S): symmetric server <-> client exchange with weight w (default 1/|S|, the text's formula;
    Figure 1 uses 1/(|S|+1)). W(empty) = I."""
    nodes = active_nodes(active, num_clients)
    m = _identity(num_clients, dtype, device)
    if not nodes:
        return m
    w = 1.0 / len(nodes) if weight is None else float(weight)
    if not 0.0 < w <= 1.0 / len(nodes):
        raise ConfigError(f"W(S): weight must be in (0, 1/|S|] = (0, {1.0 / len(nodes):g}], got {w:g}")
    for i in nodes:
        m[0, i] = m[i, 0] = w
        m[i, i] = 1.0 - w
    m[0, 0] = 1.0 - w * len(nodes)
    return m


def local_update_mask(
    active, num_clients: int, *, server: bool = False, dtype=torch.float64, device="cpu"
) -> torch.Tensor:
    """D: diagonal 0/1 matrix, 1 for the clients in S (and for the server when ``server``)."""
    nodes = active_nodes(active, num_clients)
    diag = torch.zeros(num_clients + 1, dtype=dtype, device=device)
    diag[nodes] = 1.0
    if server:
        diag[0] = 1.0
    return torch.diag(diag)


# Short names in the paper's notation.
R = pull_matrix
A = average_matrix
C = push_matrix
W = doubly_stochastic_matrix
D = local_update_mask


# -- matrices the engines build from them -------------------------------------------------------
def fedavg_mixing_matrix(active, num_clients: int, *, dtype=torch.float64, device="cpu") -> torch.Tensor:
    """W_k of eqs. (8), (43)-(44): every row is the server's averaging row (0, 1_S/|S|).

    It is R_all A(S): average into the server, then every node (also the absent clients, which
    only compute virtually) copies it. For the empty set every row is e_0 (all copy the server).
    Row stochastic, rank one; E[W_k] = 1 (P(S empty), q_1, ..., q_N).
    """
    nodes = active_nodes(active, num_clients)
    row = torch.zeros(num_clients + 1, dtype=dtype, device=device)
    if nodes:
        row[nodes] = 1.0 / len(nodes)
    else:
        row[0] = 1.0
    return row.expand(num_clients + 1, -1).clone()


def pushsum_pull_matrix(
    active, num_clients: int, share: float, *, dtype=torch.float64, device="cpu"
) -> torch.Tensor:
    """Push-sum pull (seed 003): the server sends ``share`` of its mass to each active client and
    keeps 1 - share*|S|; clients keep their own mass. Column stochastic."""
    nodes = active_nodes(active, num_clients)
    if not 0.0 < share * max(len(nodes), 1) <= 1.0:
        raise ConfigError(f"push-sum pull: share*|S| must be in (0, 1], got {share * len(nodes):g}")
    m = _identity(num_clients, dtype, device)
    m[0, 0] = 1.0 - share * len(nodes)
    for i in nodes:
        m[i, 0] = share
    return m


def pushsum_push_matrix(
    active, num_clients: int, fraction: float, *, dtype=torch.float64, device="cpu"
) -> torch.Tensor:
    """Push-sum push (seed 003): every active client sends ``fraction`` of its mass to the server
    and keeps the rest. Column stochastic."""
    nodes = active_nodes(active, num_clients)
    if not 0.0 < fraction <= 1.0:
        raise ConfigError(f"push-sum push: fraction must be in (0, 1], got {fraction:g}")
    m = _identity(num_clients, dtype, device)
    for j in nodes:
        m[0, j] = fraction
        m[j, j] = 1.0 - fraction
    return m


# -- checks -------------------------------------------------------------------------------------
def _as_numpy(m) -> np.ndarray:
    return m.detach().cpu().numpy() if isinstance(m, torch.Tensor) else np.asarray(m, dtype=float)


def is_nonnegative(m, tol: float = TOLERANCE) -> bool:
    return bool(np.all(_as_numpy(m) >= -tol))


def is_row_stochastic(m, tol: float = TOLERANCE) -> bool:
    """Non-negative with every row summing to one (R 1 = 1: the consensus property)."""
    a = _as_numpy(m)
    return is_nonnegative(a, tol) and bool(np.allclose(a.sum(axis=1), 1.0, rtol=0.0, atol=tol))


def is_column_stochastic(m, tol: float = TOLERANCE) -> bool:
    """Non-negative with every column summing to one (1^T C = 1^T: mass preservation)."""
    return is_row_stochastic(_as_numpy(m).T, tol)


def is_doubly_stochastic(m, tol: float = TOLERANCE) -> bool:
    return is_row_stochastic(m, tol) and is_column_stochastic(m, tol)


def stochasticity(m, tol: float = TOLERANCE) -> str:
    """"doubly", "row", "column" or "none"."""
    row, col = is_row_stochastic(m, tol), is_column_stochastic(m, tol)
    if row and col:
        return "doubly"
    return "row" if row else "column" if col else "none"

"""The vectorized simulator: all active clients of a round in batched tensor ops.

One round = gather the active clients' state rows, run the algorithm's client round on the
whole stack [n, d] (no Python loop over clients), run the server round, let the active
clients finish, scatter their rows back.
"""
from __future__ import annotations

import torch

from ..algorithms.base import Algorithm, RoundContext, State
from ..problems.base import Problem
from .tree import gather_rows, scatter_rows


def vectorized_round(
    algorithm: Algorithm,
    state: State,
    problem: Problem,
    active: torch.Tensor,
    round_: int,
    seed: int,
    lr_scale: float = 1.0,
) -> State:
    ctx = RoundContext(round=round_, active=active, num_clients=problem.num_clients, lr_scale=lr_scale)
    oracle = problem.oracle(active, seed=seed, round=round_)
    rows = gather_rows(state.clients, active)
    rows, message = algorithm.client_round(state.server, rows, oracle, ctx)
    server = algorithm.server_round(state.server, message, ctx)
    rows = algorithm.client_finish(server, rows, ctx)
    return State(server, scatter_rows(state.clients, active, rows))

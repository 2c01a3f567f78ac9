"""The per-client reference loop: one client at a time, in plain Python.

It runs the same algorithm object as the vectorized engine but never batches clients: each
active client gets its own one-row state, its own gradient oracle and its own call of the
client round, and the messages are stacked only for the server. Tests compare the two engines
(they must agree to rounding error) and benchmarks use this loop as the baseline.
"""
from __future__ import annotations

import torch

from ..algorithms.base import Algorithm, RoundContext, State
from ..problems.base import Problem
from .tree import concat_rows, gather_rows, scatter_rows


def reference_round(
    algorithm: Algorithm,
    state: State,
    problem: Problem,
    active: torch.Tensor,
    round_: int,
    seed: int,
    lr_scale: float = 1.0,
    donate: bool = False,
    steps: torch.Tensor | None = None,
) -> State:
    """One round, client by client; ``donate`` and ``steps`` as in the vectorized engine."""
    ctx = RoundContext(round=round_, active=active, num_clients=problem.num_clients, lr_scale=lr_scale,
                       steps=steps)
    algorithm.check_work(ctx)
    if active.numel() == 0:
        # Nobody computes; the server still gets an (empty) message of the right shape.
        _, message = algorithm.client_round(
            state.server, gather_rows(state.clients, active), problem.oracle(active, seed=seed, round=round_), ctx
        )
        server = algorithm.server_round(state.server, message, ctx)
        return State(server, state.clients)

    client_rows, messages = [], []
    for k, client in enumerate(active.tolist()):
        one = torch.tensor([client], device=active.device)
        one_ctx = RoundContext(round=round_, active=one, num_clients=problem.num_clients, lr_scale=lr_scale,
                               steps=None if steps is None else steps[k : k + 1])
        oracle = problem.oracle(one, seed=seed, round=round_)
        rows, message = algorithm.client_round(state.server, gather_rows(state.clients, one), oracle, one_ctx)
        client_rows.append(rows)
        messages.append(message)
    server = algorithm.server_round(state.server, concat_rows(messages), ctx)

    finished = []
    for k, (client, rows) in enumerate(zip(active.tolist(), client_rows)):
        one = torch.tensor([client], device=active.device)
        one_ctx = RoundContext(round=round_, active=one, num_clients=problem.num_clients, lr_scale=lr_scale,
                               steps=None if steps is None else steps[k : k + 1])
        finished.append(algorithm.client_finish(server, rows, one_ctx))
    # One write-back for the round: a per-client out-of-place scatter would copy all N rows
    # per client and make this baseline slower than a plain loop needs to be.
    return State(server, scatter_rows(state.clients, active, concat_rows(finished), in_place=donate))

"""The vectorized simulator: all active clients of a round in batched tensor ops.

One round = gather the active clients' state rows, run the algorithm's client round on the
stack [n, d] (no Python loop over clients), run the server round, let the active clients
finish, scatter their rows back.

On a CPU the problem may ask for the active clients in chunks (``problem.client_chunk``): each
chunk runs all its local steps as one batch while its data stays in cache. Client rounds are
independent across clients (the reference loop, chunks of one, is held equal to this engine
by the tests), so chunking changes speed, not results.
"""
from __future__ import annotations

import torch

from ..algorithms.base import Algorithm, RoundContext, State
from ..problems.base import Problem
from .tree import concat_rows, gather_rows, scatter_rows


def client_chunks(active: torch.Tensor, chunk: int | None) -> list[torch.Tensor]:
    if chunk is None or active.numel() <= chunk:
        return [active]
    return list(active.split(chunk))


def vectorized_round(
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
    """One round; ``donate=True`` lets the round update ``state``'s client table in place (the
    caller promises not to read the old state again). ``steps``: the active clients' local step
    counts (int64 [n]; None: every client does the algorithm's local_steps)."""
    ctx = RoundContext(round=round_, active=active, num_clients=problem.num_clients, lr_scale=lr_scale,
                       steps=steps)
    algorithm.check_work(ctx)
    row_parts, message_parts = [], []
    parts = client_chunks(active, problem.client_chunk)
    step_parts = [None] * len(parts) if steps is None else list(steps.split([p.numel() for p in parts]))
    for part, part_steps in zip(parts, step_parts):
        oracle = problem.oracle(part, seed=seed, round=round_)
        rows, message = algorithm.client_round(
            state.server, gather_rows(state.clients, part), oracle, ctx._replace(active=part, steps=part_steps)
        )
        row_parts.append(rows)
        message_parts.append(message)
    rows = row_parts[0] if len(row_parts) == 1 else concat_rows(row_parts)
    message = message_parts[0] if len(message_parts) == 1 else concat_rows(message_parts)
    server = algorithm.server_round(state.server, message, ctx)
    rows = algorithm.client_finish(server, rows, ctx)
    return State(server, scatter_rows(state.clients, active, rows, in_place=donate))

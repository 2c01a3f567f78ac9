"""The vectorized simulator: all active clients of a round in batched tensor ops.

One round = gather the active clients' state rows, run the algorithm's client round on the
stack [n, d] (no Python loop over clients), run the server round, let the active clients
finish, scatter their rows back.

On a CPU the problem may ask for the active clients in chunks (``problem.client_chunk``): each
chunk runs all its local steps as one batch while its data stays in cache. Client rounds are
independent across clients (the reference loop, chunks of one, is held equal to this engine
by the tests), and the minibatch losses a chunk's oracle measured are returned per client and
step, never summed on the way, so chunking changes speed, not results.
"""
from __future__ import annotations

import torch

from ..algorithms.base import Algorithm, RoundContext, State
from ..problems.base import Problem, live_losses
from .round import Collected, Engine
from .tree import concat_rows, gather_rows, scatter_rows


def client_chunks(active: torch.Tensor, chunk: int | None) -> list[torch.Tensor]:
    if chunk is None or active.numel() <= chunk:
        return [active]
    return list(active.split(chunk))


def vectorized_collect(algorithm: Algorithm, state: State, problem: Problem, ctx: RoundContext,
                       seed: int) -> Collected:
    """Every active client's client round, one batched call per chunk of clients."""
    row_parts, message_parts, losses = [], [], []
    parts = client_chunks(ctx.active, problem.client_chunk)
    step_parts = [None] * len(parts) if ctx.steps is None else list(ctx.steps.split([p.numel() for p in parts]))
    for part, part_steps in zip(parts, step_parts):
        oracle = problem.oracle(part, seed=seed, round=ctx.round)
        rows, message = algorithm.client_round(
            state.server, gather_rows(state.clients, part), oracle, ctx._replace(active=part, steps=part_steps)
        )
        row_parts.append(rows)
        message_parts.append(message)
        losses.extend(live_losses(oracle, part_steps))
    rows = row_parts[0] if len(row_parts) == 1 else concat_rows(row_parts)
    message = message_parts[0] if len(message_parts) == 1 else concat_rows(message_parts)
    return Collected(ctx.active, rows, message, ctx.steps, losses)


def vectorized_commit(algorithm: Algorithm, state: State, server, collected: Collected, ctx: RoundContext,
                      donate: bool) -> State:
    """The active clients finish with the new server state; their rows go back in one scatter."""
    rows = algorithm.client_finish(server, collected.rows, ctx)
    return State(server, scatter_rows(state.clients, ctx.active, rows, in_place=donate))


VECTORIZED = Engine("vectorized", vectorized_collect, vectorized_commit)
vectorized_round = VECTORIZED  # one round: vectorized_round(algorithm, state, problem, active, r, seed, ...)

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

from typing import Any, NamedTuple

import torch

from ..algorithms.base import Algorithm, RoundContext, State
from ..problems.base import Problem, pending_losses
from ..threads import chunk_workers
from .round import Collected, Engine
from .tree import concat_rows, gather_rows, scatter_rows


class ChunkRows(NamedTuple):
    """One chunk's new client rows, with its clients and their local step counts."""

    active: torch.Tensor
    steps: torch.Tensor | None
    rows: Any


def client_chunks(active: torch.Tensor, chunk: int | None) -> list[torch.Tensor]:
    if chunk is None or active.numel() <= chunk:
        return [active]
    return list(active.split(chunk))


def vectorized_collect(algorithm: Algorithm, state: State, problem: Problem, ctx: RoundContext,
                       seed: int) -> Collected:
    """Every active client's client round, one batched call per chunk of clients; on a CPU, the
    chunks side by side when the run has client workers (focusfl/threads.py: each chunk is
    computed as it is alone, so their number never changes a bit)."""
    parts = client_chunks(ctx.active, problem.client_chunk)
    step_parts = [None] * len(parts) if ctx.steps is None else list(ctx.steps.split([p.numel() for p in parts]))

    def chunk_round(part: torch.Tensor, part_steps: torch.Tensor | None):
        part_ctx = ctx._replace(active=part, steps=part_steps)
        oracle = problem.oracle(part, seed=seed, round=ctx.round, steps=algorithm.round_steps(part_ctx))
        rows, message = algorithm.client_round(state.server, gather_rows(state.clients, part), oracle, part_ctx)
        return rows, message, pending_losses(oracle, part_steps)

    pool = chunk_workers() if len(parts) > 1 and torch.device(problem.device).type == "cpu" else None
    done = list(map(chunk_round, parts, step_parts) if pool is None else pool.map(chunk_round, parts, step_parts))
    # The rows stay in their chunks: the commit writes each chunk's into the table, so the
    # round's [n, d] rows are never concatenated (14 MB a round on the CIFAR-10 benchmark).
    rows = [ChunkRows(part, part_steps, part_rows) for part, part_steps, (part_rows, _, _) in zip(parts, step_parts, done)]
    message_parts = [message for _, message, _ in done]
    message = message_parts[0] if len(message_parts) == 1 else concat_rows(message_parts)
    return Collected(ctx.active, rows, message, ctx.steps, [losses for _, _, losses in done])


def vectorized_commit(algorithm: Algorithm, state: State, server, collected: Collected, ctx: RoundContext,
                      donate: bool) -> State:
    """The active clients finish with the new server state, a chunk at a time, and each chunk's
    rows are written into the table. Only the first write may copy the table (when it is not
    donated, or a field shares its memory): the table the later chunks write into is this
    round's own."""
    clients = state.clients
    for k, chunk in enumerate(collected.rows):
        finished = algorithm.client_finish(server, chunk.rows, ctx._replace(active=chunk.active, steps=chunk.steps))
        clients = scatter_rows(clients, chunk.active, finished, in_place=donate or k > 0)
    return State(server, clients)


VECTORIZED = Engine("vectorized", vectorized_collect, vectorized_commit)
vectorized_round = VECTORIZED  # one round: vectorized_round(algorithm, state, problem, active, r, seed, ...)

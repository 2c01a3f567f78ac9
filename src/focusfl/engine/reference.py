"""The per-client reference loop: one client at a time, in plain Python.

It runs the same algorithm object as the vectorized engine but never batches clients: each
active client gets its own one-row state, its own gradient oracle and its own call of the
client round, and the messages are stacked only for the server. Tests compare the two engines
(they must agree to rounding error) and benchmarks use this loop as the baseline.
"""
from __future__ import annotations


from ..algorithms.base import Algorithm, RoundContext, State
from ..problems.base import Problem, pending_losses
from .round import Collected, Engine
from .tree import concat_rows, gather_rows, scatter_rows


def one_client(ctx: RoundContext, k: int) -> RoundContext:
    """The context of the k-th active client alone (its own step count)."""
    return ctx._replace(active=ctx.active[k : k + 1], steps=None if ctx.steps is None else ctx.steps[k : k + 1])


def reference_collect(algorithm: Algorithm, state: State, problem: Problem, ctx: RoundContext,
                      seed: int) -> Collected:
    """Each active client's client round on its own (no message when nobody is active: the
    server step makes the empty one)."""
    if ctx.active.numel() == 0:
        return Collected(ctx.active, None, None, ctx.steps, [])
    client_rows, messages, losses = [], [], []
    for k in range(ctx.active.numel()):
        one = one_client(ctx, k)
        oracle = problem.oracle(one.active, seed=seed, round=ctx.round, steps=algorithm.round_steps(one))
        rows, message = algorithm.client_round(state.server, gather_rows(state.clients, one.active), oracle, one)
        client_rows.append(rows)
        messages.append(message)
        losses.append(pending_losses(oracle, one.steps))
    return Collected(ctx.active, client_rows, concat_rows(messages), ctx.steps, losses)


def reference_commit(algorithm: Algorithm, state: State, server, collected: Collected, ctx: RoundContext,
                     donate: bool) -> State:
    """Each client finishes on its own; the rows go back in one write."""
    if ctx.active.numel() == 0:
        return State(server, state.clients)
    finished = [algorithm.client_finish(server, rows, one_client(ctx, k)) for k, rows in enumerate(collected.rows)]
    # One write-back for the round: a per-client out-of-place scatter would copy all N rows
    # per client and make this baseline slower than a plain loop needs to be.
    return State(server, scatter_rows(state.clients, ctx.active, concat_rows(finished), in_place=donate))


REFERENCE = Engine("reference", reference_collect, reference_commit)
reference_round = REFERENCE  # one round: reference_round(algorithm, state, problem, active, r, seed, ...)

"""One round in three phases, shared by every engine and the Flower adapter.

1. **collect**: the active clients run ``client_round`` on their rows (all at once, in chunks,
   one by one, or on remote nodes) and their stacked messages come back, with the local steps
   each took and the minibatch losses their oracles measured;
2. **server step** (:func:`server_step`, the same for everyone): ``server_round`` on the
   messages, including the round in which nobody's work arrived;
3. **commit**: the clients' ``client_finish`` with the new server state and their rows written
   back (engines), or the finish messages and acknowledgements sent (Flower).

An :class:`Engine` is a (collect, commit) pair; calling it runs one whole round and returns
the new state, which is what tests and benchmarks time. The round loop (engine/loop.py) calls
the phases itself, so a federation and a simulation step the server in one place.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import torch

from ..algorithms.base import Algorithm, RoundContext, State
from ..problems.base import Problem
from .heap import retain_freed_memory
from .tree import gather_rows


class Collected(NamedTuple):
    """What the collect phase of a round brought back.

    ``active``: the clients whose work the server takes (sorted; a federation drops the ones
    that failed); ``rows``: their new client rows, in the form the engine's own commit reads
    (None where nodes keep them); ``message``: their stacked messages (None when nobody's work
    arrived); ``steps``: the local steps each took (int64 [n]; None: the algorithm's
    local_steps); ``losses``: the minibatch losses of those steps, as float64 numbers (a
    federation's nodes send them so) or problems/base.py PendingLosses still on the device (None
    items: calls that measured none), read when a row is written (engine/loop.py TrainLoss)."""

    active: torch.Tensor
    rows: Any
    message: Any
    steps: torch.Tensor | None
    losses: list


def server_step(algorithm: Algorithm, state: State, collected: Collected, ctx: RoundContext,
                problem: Problem, seed: int) -> Any:
    """The server's new state from the collected messages. A round in which nobody's work
    arrived still takes the server step, on the empty message a client round over no clients
    gives (FOCUS's Algorithm 1 steps on its tracked sum every round)."""
    message = collected.message
    if message is None:
        nobody = ctx.active[:0]
        oracle = problem.oracle(nobody, seed=seed, round=ctx.round)
        _, message = algorithm.client_round(state.server, gather_rows(state.clients, nobody), oracle,
                                            ctx._replace(active=nobody, steps=None))
    return algorithm.server_round(state.server, message, ctx)


@dataclass(frozen=True)
class Engine:
    """How a simulation reaches its clients: ``collect(algorithm, state, problem, ctx, seed)``
    -> :class:`Collected` and ``commit(algorithm, state, server, collected, ctx, donate)`` ->
    the new :class:`State`. Called, it runs one whole round."""

    name: str
    collect: Callable[..., Collected]
    commit: Callable[..., State]

    def __call__(self, algorithm: Algorithm, state: State, problem: Problem, active: torch.Tensor, round_: int,
                 seed: int, lr_scale: float = 1.0, donate: bool = False,
                 steps: torch.Tensor | None = None) -> State:
        """One round; ``donate=True`` lets it update ``state``'s client table in place (the
        caller promises not to read the old state again); ``steps``: the active clients' local
        step counts (int64 [n]; None: every client does the algorithm's local_steps)."""
        retain_freed_memory()  # once per process: no page faults on every step's regrown heap
        ctx = RoundContext(round=round_, active=active, num_clients=problem.num_clients, lr_scale=lr_scale,
                           steps=steps)
        algorithm.check_work(ctx)
        collected = self.collect(algorithm, state, problem, ctx, seed)
        server = server_step(algorithm, state, collected, ctx, problem, seed)
        return self.commit(algorithm, state, server, collected, ctx, donate)

"""Deadlines: a node stops its local work when its time budget for the round is spent.

A node given ``deadline=SECONDS`` in its node config (``flower-supernode --node-config
"partition-id=0 deadline=0.5"``; ``focusfl federation local --deadline``) starts a clock when it
begins a round's local work. Before local step t (t >= 1, counted from 0) it looks at the
clock; once ``SECONDS`` have passed it stops and sends the work it has finished, t steps (at
least one: step 0 always runs). The server accepts it as partial work, tau_i,r = t, and records
it (work.csv), so the reference engine replays the round exactly.

How, without touching any algorithm: the round runs with an oracle that raises
:class:`DeadlineReached` (t) when it is asked for step t >= 1 after the deadline; the node then
reruns the round from the same inputs with ``RoundContext.steps = [t]``, the batched
algorithms' own way of stopping a client after t steps. The rerun is what the replay computes
(bit for bit); a cut round costs at most twice its work. Algorithms that do not honour
per-client step counts (``partial_work`` False) ignore the deadline and do all their steps.
"""
from __future__ import annotations

import math
import time
from typing import Any

import torch

from ..errors import ConfigError
from ..problems.base import live_losses, masked_gradients
from .codec import Malformed
from .per_node import per_node


class DeadlineReached(Exception):
    """The deadline passed before local step ``step`` (so ``step`` steps are done)."""

    def __init__(self, step: int) -> None:
        super().__init__(step)
        self.step = step


def node_deadline(node_config: dict) -> float | None:
    """The node's ``deadline`` in seconds (None: no deadline); Malformed if it is not >= 0."""
    value = (node_config or {}).get("deadline")
    if value is None or value == "":
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if isinstance(value, bool) or not math.isfinite(seconds) or seconds < 0:
        raise Malformed("malformed", f"node config deadline={value!r} is not a number of seconds >= 0")
    return seconds


class _WithDeadline:
    """``oracle`` that raises DeadlineReached(t) when asked for step t >= 1 at or after ``end``."""

    def __init__(self, oracle, end: float) -> None:
        self.oracle, self.end = oracle, end

    def __call__(self, z: torch.Tensor, step: int) -> torch.Tensor:
        self._check(step)
        return self.oracle(z, step)

    def masked(self, z: torch.Tensor, step: int, live: torch.Tensor) -> torch.Tensor:
        self._check(step)
        return masked_gradients(self.oracle, z, step, live)

    def _check(self, step: int) -> None:
        if step >= 1 and time.monotonic() >= self.end:
            raise DeadlineReached(step)


def _with_deadline(oracle, end: float) -> _WithDeadline:
    return _WithDeadline(oracle, end)


def local_work(algorithm, problem, server: Any, rows: Any, ctx, seed: int,
               deadline: float | None) -> tuple[Any, Any, int, list[float]]:
    """One client's round: ``(rows', message, steps done, losses)``; cut short by ``deadline``
    seconds. ``losses``: the minibatch losses of the steps done (problems/base.py live_losses;
    empty for problems that measure none), which the server's rows report as ``train_loss``.

    ``ctx`` is the one-client RoundContext (``ctx.steps``: the count the server asked for, or
    None for the algorithm's local_steps)."""
    asked = algorithm.local_steps if ctx.steps is None else int(ctx.steps[0])
    if deadline is None or not algorithm.partial_work:
        # The steps the round will ask for, as the engines tell it (drawn ahead; the same gradients).
        oracle = problem.oracle(ctx.active, seed=seed, round=ctx.round, steps=algorithm.round_steps(ctx))
        return (*algorithm.client_round(server, rows, oracle, ctx), asked, live_losses(oracle, ctx.steps))
    # No drawing ahead under a deadline: it would spend the node's time on steps it may not reach.
    oracle = problem.oracle(ctx.active, seed=seed, round=ctx.round)
    end = time.monotonic() + deadline
    try:
        return (*algorithm.client_round(server, rows, _with_deadline(oracle, end), ctx), asked,
                live_losses(oracle, ctx.steps))
    except DeadlineReached as stop:
        done = stop.step
    short = ctx._replace(steps=torch.tensor([done], device=ctx.active.device))
    fresh = problem.oracle(ctx.active, seed=seed, round=ctx.round, steps=done)
    return (*algorithm.client_round(server, rows, fresh, short), done, live_losses(fresh, short.steps))


def parse_deadlines(text: str, nodes: int) -> dict[int, float]:
    """``--deadline`` of ``federation local``: ``SECONDS`` (every node) or ``K=SECONDS,...``
    (node K; node K runs client K), e.g. ``0.5`` or ``1=0.5,2=0``."""
    return per_node(text, nodes, "--deadline", "SECONDS", ("0.5", "1=0.5,2=0"), _seconds)


def _seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0:
        raise ConfigError(f"--deadline: {text.strip()!r} is not a number of seconds >= 0")
    return seconds

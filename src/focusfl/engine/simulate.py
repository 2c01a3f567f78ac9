"""Run an algorithm on a problem under a participation process, with any engine."""
from __future__ import annotations

import math
from typing import Callable

from ..algorithms.base import Algorithm
from ..errors import ConfigError
from ..problems.base import Problem
from .loop import (ROUND_CHUNK, EngineExchange, RecordedParticipation, RecordedWork, Resume, RunResult, TrainLoss,
                   active_sets, participants_before, round_actives, run_rounds)
from .reference import REFERENCE
from .vectorized import VECTORIZED

ENGINES = {"vectorized": VECTORIZED, "reference": REFERENCE}

__all__ = ["ENGINES", "ROUND_CHUNK", "SCHEDULES", "RecordedParticipation", "RecordedWork", "Resume", "RunResult",
           "TrainLoss", "active_sets", "participants_before", "round_actives", "schedule_of", "simulate"]


def constant_schedule(round_: int) -> float:
    return 1.0


def sqrt_decay_schedule(round_: int) -> float:
    """eta_r = eta / sqrt(r/10 + 1), the decaying schedule of the FOCUS paper's experiments."""
    return 1.0 / math.sqrt(round_ / 10 + 1)


SCHEDULES: dict[str, Callable[[int], float]] = {"constant": constant_schedule, "sqrt": sqrt_decay_schedule}


def schedule_of(schedule: str | Callable[[int], float]) -> Callable[[int], float]:
    """A step-size schedule by name (or the function itself)."""
    if not isinstance(schedule, str):
        return schedule
    if schedule not in SCHEDULES:
        raise ConfigError(f"unknown step-size schedule {schedule!r} (known: {', '.join(SCHEDULES)})")
    return SCHEDULES[schedule]


def simulate(
    algorithm: Algorithm,
    problem: Problem,
    participation,
    rounds: int,
    *,
    seed: int = 0,
    engine: str = "vectorized",
    eval_every: int | None = 1,
    resume: Resume | None = None,
    on_row: Callable[[dict], None] | None = None,
    on_round: Callable[[RunResult], None] | None = None,
    keep_rows: bool = True,
    progress=None,
    schedule: str | Callable[[int], float] = "constant",
    work=None,
    privacy=None,
) -> RunResult:
    """Simulate ``rounds`` rounds and evaluate the server model every ``eval_every`` rounds: the
    round loop (engine/loop.py) with ``engine``'s collect and commit on this process.

    Round r draws its active set from ``participation`` and its minibatches from
    (seed, r, client, step), so a run continued from a :class:`Resume` (a saved state after its
    ``start_round`` rounds) goes on exactly as the uninterrupted run would. Rows
    (engine/rows.py) carry ``round`` (rounds completed), ``active`` (participants of the last
    round), cumulative ``comm_down``/``comm_up`` (floats sent per direction), the problem's
    metrics and, for problems whose oracles measure them, ``train_loss``. A non-finite model
    stops the run, and so does a blow-up (engine/divergence.py); the last row then has
    ``diverged = True``. ``schedule`` maps the round to a factor on every step size ("constant"
    or "sqrt"). ``work``: a work process (focusfl.work) giving each active client's number of
    local steps in each round; None or a fixed one: every client does the algorithm's local_steps.
    ``keep_rows``, ``on_row``, ``on_round``, ``progress``, ``privacy``: see :func:`~focusfl.engine.loop.run_rounds`.
    """
    if engine not in ENGINES:
        raise ConfigError(f"unknown engine {engine!r} (known: {', '.join(ENGINES)})")
    start = 0 if resume is None else resume.start_round
    exchange = EngineExchange(ENGINES[engine], algorithm.prepare(problem, participation, seed=seed), problem, seed,
                              start)
    return run_rounds(algorithm, problem, participation, rounds, exchange, seed=seed, eval_every=eval_every,
                      schedule=schedule_of(schedule), work=work, resume=resume, on_row=on_row, on_round=on_round,
                      keep_rows=keep_rows, progress=progress, privacy=privacy)

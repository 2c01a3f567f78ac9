"""Run an algorithm on a problem under a participation process, with any engine."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from ..algorithms.base import Algorithm, State
from ..errors import ConfigError
from ..problems.base import Problem
from .divergence import BlowUpDetector
from .reference import reference_round
from .vectorized import vectorized_round

ENGINES: dict[str, Callable] = {"vectorized": vectorized_round, "reference": reference_round}


def constant_schedule(round_: int) -> float:
    return 1.0


def sqrt_decay_schedule(round_: int) -> float:
    """eta_r = eta / sqrt(r/10 + 1), the decaying schedule of the FOCUS paper's experiments."""
    return 1.0 / math.sqrt(round_ / 10 + 1)


SCHEDULES: dict[str, Callable[[int], float]] = {"constant": constant_schedule, "sqrt": sqrt_decay_schedule}


@dataclass
class RunResult:
    """Evaluated rows (one dict per evaluated round), the final state, and how it ended."""

    rows: list[dict] = field(default_factory=list)
    state: State | None = None
    rounds_done: int = 0
    diverged_at: int | None = None  # round count at which the model stopped being finite


def active_sets(mask: np.ndarray, device: torch.device) -> list[torch.Tensor]:
    """Per-round sorted int64 index tensors of the active clients."""
    return [torch.as_tensor(np.flatnonzero(row), dtype=torch.int64, device=device) for row in mask]


def simulate(
    algorithm: Algorithm,
    problem: Problem,
    participation,
    rounds: int,
    *,
    seed: int = 0,
    engine: str = "vectorized",
    eval_every: int = 1,
    state: State | None = None,
    start_round: int = 0,
    on_row: Callable[[dict], None] | None = None,
    progress=None,
    schedule: str | Callable[[int], float] = "constant",
) -> RunResult:
    """Simulate ``rounds`` rounds and evaluate the server model every ``eval_every`` rounds.

    Round r draws its active set from ``participation`` and its minibatches from
    (seed, r, client, step), so a run started from a saved ``state`` at ``start_round``
    continues exactly as the uninterrupted run would. Rows carry ``round`` (rounds completed),
    ``active`` (participants of the last round), cumulative ``comm_down``/``comm_up`` (floats
    sent per direction) and the problem's metrics. A non-finite model stops the run, and so does a
    blow-up (engine/divergence.py); the last row then has ``diverged = True``.
    ``schedule`` maps the round to a factor on every step size ("constant" or "sqrt").
    """
    if engine not in ENGINES:
        raise ConfigError(f"unknown engine {engine!r} (known: {', '.join(ENGINES)})")
    if participation.num_clients != problem.num_clients:
        raise ConfigError(
            f"participation has {participation.num_clients} clients, problem has {problem.num_clients}"
        )
    if rounds < 0 or eval_every < 1:
        raise ConfigError("rounds must be >= 0 and eval_every >= 1")
    step_round = ENGINES[engine]
    if isinstance(schedule, str):
        if schedule not in SCHEDULES:
            raise ConfigError(f"unknown step-size schedule {schedule!r} (known: {', '.join(SCHEDULES)})")
        schedule = SCHEDULES[schedule]
    algorithm = algorithm.prepare(problem, participation)
    if state is None:
        state = algorithm.init(problem.initial_point(), problem.num_clients)
    end = start_round + rounds
    mask = participation.mask(end)
    actives = active_sets(mask[start_round:], problem.device)
    comm = algorithm.communication()
    # Cumulative traffic before start_round, so resumed runs report the same totals.
    participants_before = int(mask[:start_round].sum())
    floats_down = participants_before * comm.down * problem.dim
    floats_up = participants_before * comm.up * problem.dim

    result = RunResult(state=state, rounds_done=start_round)
    blow_up = BlowUpDetector()  # a finite loss far above its start, sustained: engine/divergence.py

    def evaluate(done: int, active_count: int) -> bool:
        x = algorithm.model(result.state)
        finite = bool(torch.isfinite(x).all())
        row = {"round": done, "active": active_count, "comm_down": float(floats_down), "comm_up": float(floats_up)}
        if finite:
            row.update(problem.metrics(x))
            finite = all(math.isfinite(v) for v in row.values())
        else:
            row.update({"loss": math.inf, "grad_norm": math.inf})
        if finite and blow_up.update(row):
            finite = False
        if not finite:
            row["diverged"] = True
        result.rows.append(row)
        if on_row is not None:
            on_row(row)
        return finite

    if not evaluate(start_round, 0):
        result.diverged_at = start_round
        return result
    for offset, active in enumerate(actives):
        r = start_round + offset
        # From the second round on the state is the engine's own, so its client table can be
        # updated in place; a state passed in by the caller is never modified.
        result.state = step_round(
            algorithm, result.state, problem, active, r, seed, schedule(r), donate=offset > 0
        )
        result.rounds_done = r + 1
        floats_down += active.numel() * comm.down * problem.dim
        floats_up += active.numel() * comm.up * problem.dim
        if progress is not None:
            progress.update(1)
        if (r + 1 - start_round) % eval_every == 0 or r + 1 == end:
            if not evaluate(r + 1, active.numel()):
                result.diverged_at = r + 1
                break
    return result

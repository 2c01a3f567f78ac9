"""Run an algorithm on a problem under a participation process, with any engine."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterator, NamedTuple

import numpy as np
import torch

from ..algorithms.base import Algorithm, RoundContext, State
from ..errors import ConfigError
from ..problems.base import Problem
from .divergence import BlowUpDetector
from .reference import reference_round
from .rows import diverged, evaluation_row
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

    rows: list[dict] = field(default_factory=list)  # empty when simulate(keep_rows=False)
    state: State | None = None
    rounds_done: int = 0
    diverged_at: int | None = None  # round count at which the model stopped being finite
    last_row: dict | None = None  # the latest evaluated row (kept even without rows)
    comm: tuple[float, float] = (0.0, 0.0)  # cumulative floats sent (down, up) after rounds_done
    blow_up: BlowUpDetector | None = None  # the run's detector (its state goes into checkpoints)


class Resume(NamedTuple):
    """Where a run continues from: its state after ``start_round`` rounds and what it had counted.

    ``comm_before``: the traffic before ``start_round`` (None: recounted from the participation);
    ``evaluate_start``: False when the row of ``start_round`` was already written;
    ``eval_origin``: the round the run started from, so that it evaluates the rounds the
    uninterrupted run evaluates; ``blow_up``: the run's detector as it was (None: a fresh one)."""

    state: State
    start_round: int
    comm_before: tuple[float, float] | None = None
    evaluate_start: bool = True
    eval_origin: int = 0
    blow_up: BlowUpDetector | None = None


# Rounds whose active sets are drawn at once: memory stays independent of the run's length.
ROUND_CHUNK = 4096


def active_sets(mask: np.ndarray, device: torch.device) -> list[torch.Tensor]:
    """Per-round sorted int64 index tensors of the active clients."""
    return [torch.as_tensor(np.flatnonzero(row), dtype=torch.int64, device=device) for row in mask]


def participants_before(participation, start_round: int) -> int:
    """Client-rounds of rounds 0..start_round-1, counted chunk by chunk (bounded memory)."""
    total = 0
    for lo in range(0, start_round, ROUND_CHUNK):
        total += int(participation.rows(lo, min(start_round, lo + ROUND_CHUNK)).sum())
    return total


def round_actives(participation, start: int, end: int, device: torch.device) -> Iterator[tuple[int, torch.Tensor]]:
    """(r, active index tensor) for rounds start..end-1, drawn ROUND_CHUNK rounds at a time."""
    for lo in range(start, end, ROUND_CHUNK):
        hi = min(end, lo + ROUND_CHUNK)
        for offset, active in enumerate(active_sets(participation.rows(lo, hi), device)):
            yield lo + offset, active


def simulate(
    algorithm: Algorithm,
    problem: Problem,
    participation,
    rounds: int,
    *,
    seed: int = 0,
    engine: str = "vectorized",
    eval_every: int = 1,
    resume: Resume | None = None,
    on_row: Callable[[dict], None] | None = None,
    on_round: Callable[[RunResult], None] | None = None,
    keep_rows: bool = True,
    progress=None,
    schedule: str | Callable[[int], float] = "constant",
    work=None,
) -> RunResult:
    """Simulate ``rounds`` rounds and evaluate the server model every ``eval_every`` rounds.

    Round r draws its active set from ``participation`` and its minibatches from
    (seed, r, client, step), so a run continued from a :class:`Resume` (a saved state after its
    ``start_round`` rounds) goes on exactly as the uninterrupted run would. Rows
    (engine/rows.py) carry ``round`` (rounds completed), ``active`` (participants of the last
    round), cumulative ``comm_down``/``comm_up`` (floats sent per direction) and the problem's
    metrics. A non-finite model stops the run, and so does a blow-up (engine/divergence.py); the
    last row then has ``diverged = True``.
    ``schedule`` maps the round to a factor on every step size ("constant" or "sqrt").
    ``work``: a work process (focusfl.work) giving each active client's number of local steps in
    each round; None or a fixed one: every client does the algorithm's local_steps.

    For long runs: active sets are drawn in chunks (memory does not grow with ``rounds``);
    ``keep_rows=False`` hands rows to ``on_row`` only; ``on_round(result)`` is called after every
    round, at a point where ``result.state`` is consistent (a checkpoint can be taken, or an
    exception raised to stop). ``resume``: where a continued run starts (None: from
    ``problem.initial_point()`` at round 0).
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
    if work is not None:
        if work.num_clients != problem.num_clients:
            raise ConfigError(f"work has {work.num_clients} clients, problem has {problem.num_clients}")
        if work.local_steps != algorithm.local_steps:
            raise ConfigError(f"work draws up to {work.local_steps} steps, {algorithm.name} takes {algorithm.local_steps}")
        if work.fixed:
            work = None  # everyone does local_steps: exactly the run without a work process
        else:
            algorithm.check_work(RoundContext(round=0, active=torch.zeros(0, dtype=torch.int64),
                                              num_clients=problem.num_clients, steps=torch.zeros(0, dtype=torch.int64)))
    if resume is None:
        resume = Resume(algorithm.init(problem.initial_point(), problem.num_clients), 0)
    start_round, comm_before = resume.start_round, resume.comm_before
    end = start_round + rounds
    comm = algorithm.communication()
    if comm_before is None:  # cumulative traffic before start_round, so resumed runs report the same totals
        before = participants_before(participation, start_round)
        comm_before = (before * comm.down * problem.dim, before * comm.up * problem.dim)
    floats_down, floats_up = (float(v) for v in comm_before)

    result = RunResult(state=resume.state, rounds_done=start_round, comm=(floats_down, floats_up))
    # A finite loss far above its start, sustained, is a divergence too (engine/divergence.py).
    result.blow_up = resume.blow_up if resume.blow_up is not None else BlowUpDetector()

    def evaluate(done: int, active_count: int) -> bool:
        row = evaluation_row(algorithm.model(result.state), problem, result.blow_up, done=done,
                             active=active_count, comm=(floats_down, floats_up))
        result.last_row = row
        if keep_rows:
            result.rows.append(row)
        if on_row is not None:
            on_row(row)
        return not diverged(row)

    if resume.evaluate_start and not evaluate(start_round, 0):
        result.diverged_at = start_round
        return result
    for r, active in round_actives(participation, start_round, end, problem.device):
        # From the second round on the state is the engine's own, so its client table can be
        # updated in place; a state passed in by the caller is never modified.
        result.state = step_round(
            algorithm, result.state, problem, active, r, seed, schedule(r), donate=r > start_round,
            steps=None if work is None else work.steps(r, active),
        )
        result.rounds_done = r + 1
        floats_down += active.numel() * comm.down * problem.dim
        floats_up += active.numel() * comm.up * problem.dim
        result.comm = (floats_down, floats_up)
        if progress is not None:
            progress.update(1)
        if (r + 1 - resume.eval_origin) % eval_every == 0 or r + 1 == end:
            if not evaluate(r + 1, active.numel()):
                result.diverged_at = r + 1
                break
        if on_round is not None:
            on_round(result)
    return result

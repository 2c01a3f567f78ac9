"""The round loop: one for simulations (engine/simulate.py), Flower federations
(flower/strategy.py) and server trajectories (matrix/bias.py).

Round r: the participation process draws S_r (chunks of rounds at a time: memory does not
grow with the run's length); the exchange says whom it asks (a simulation: S_r; a federation:
those of S_r with a live node); the work process draws their local step counts; the exchange
**collects** their work (engine/round.py); the server steps (:func:`~focusfl.engine.round.
server_step`, the empty round included); the exchange **commits** (rows written back, or finish
messages and acknowledgements sent). The loop then counts the traffic of the clients whose work
arrived, evaluates on its cadence (engine/rows.py: metrics, the minibatch losses the rounds
returned as ``train_loss``, the blow-up rule), and calls ``on_round``. An exchange supplies the
three verbs and its own row counters, nothing else (Flower's Strategy hooks, pfl-research's
Backend).

Evaluation cadence: rows at the start, every ``eval_every`` rounds counted from the run's
origin, and after the last round. A last row off that cadence (a *closing* row) changes nothing
the run carries on with (the blow-up rule's state, the training losses since the previous row),
so a run continued past its end (``run --resume --rounds R``) drops it and goes on exactly as
the uninterrupted R-round run, which never wrote it.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, NamedTuple, Protocol

import numpy as np
import torch

from ..algorithms.base import Algorithm, RoundContext, State, check_work_process
from ..device import mirrored_copy
from ..errors import ConfigError, FocusflError
from ..problems.base import PendingLosses, Problem
from .divergence import BlowUpDetector
from .heap import retain_freed_memory
from .round import Collected, Engine, server_step
from .rows import diverged, evaluation_row

# Rounds whose active sets are drawn at once: memory stays independent of the run's length ...
ROUND_CHUNK = 4096
# ... and of N: rounds x clients drawn at once stays below this (16 rounds at N = 10^6).
ROUND_CELLS = 1 << 24


class Exchange(Protocol):
    """How a run reaches its clients (see the module docstring)."""

    def requested(self, r: int, drawn: torch.Tensor | None) -> torch.Tensor:
        """The clients asked in round r, given the participation process's draw (None: the
        run has no process; a federation then asks whoever it knows)."""

    def collect(self, state: State, ctx: RoundContext) -> Collected:
        """The asked clients' work (``ctx.active``, ``ctx.steps``)."""

    def commit(self, state: State, server: Any, collected: Collected, ctx: RoundContext) -> State:
        """The state after the clients whose work arrived finished the round."""

    def counters(self) -> dict[str, Any]:
        """Columns of the exchange's own for the next row (a federation's rejections)."""


class EngineExchange:
    """A simulation's exchange: an engine's collect and commit on this process's client table.

    From the second round of a run on, the table is the loop's own, so the commit may update it
    in place; a state passed in by the caller (``start_round``'s) is never modified."""

    def __init__(self, engine: Engine, algorithm: Algorithm, problem: Problem, seed: int, start_round: int) -> None:
        self.engine, self.algorithm, self.problem, self.seed, self.start_round = \
            engine, algorithm, problem, seed, start_round
        retain_freed_memory()  # once per process: no page faults on every step's regrown heap

    def requested(self, r: int, drawn: torch.Tensor | None) -> torch.Tensor:
        return drawn

    def collect(self, state: State, ctx: RoundContext) -> Collected:
        return self.engine.collect(self.algorithm, state, self.problem, ctx, self.seed)

    def commit(self, state: State, server: Any, collected: Collected, ctx: RoundContext) -> State:
        return self.engine.commit(self.algorithm, state, server, collected, ctx, ctx.round > self.start_round)

    def counters(self) -> dict[str, Any]:
        return {}


@dataclass
class TrainLoss:
    """The minibatch losses returned since the last row (what its ``train_loss`` averages):
    each round's losses are summed exactly (``math.fsum``, whatever order the clients came in),
    then added in round order, so every engine and chunking gives the same bits. Losses still on
    the device (problems/base.py PendingLosses) are kept as they are until a row or a checkpoint
    reads them: a round does not wait for the device to hand them to the host."""

    total: float = 0.0
    count: int = 0
    pending: list = field(default_factory=list)  # each round's losses not read yet, in round order

    def __copy__(self) -> "TrainLoss":
        return TrainLoss(self.total, self.count, list(self.pending))

    def add(self, losses: list) -> None:
        measured = [item for item in losses if item is not None]
        if measured:
            self.pending.append(measured)

    def _settle(self) -> None:
        for round_losses in self.pending:
            values = [v for item in round_losses
                      for v in (item.values() if isinstance(item, PendingLosses) else (item,))]
            if values:
                self.total += math.fsum(values)
                self.count += len(values)
        self.pending = []

    def row(self) -> dict[str, float]:
        self._settle()
        return {"train_loss": self.total / self.count} if self.count else {}

    def state(self) -> dict[str, float | int]:
        self._settle()
        return {"train_loss_sum": self.total, "train_loss_count": self.count}

    @classmethod
    def restore(cls, state: dict) -> "TrainLoss":
        return cls(float(state.get("train_loss_sum", 0.0)), int(state.get("train_loss_count", 0)))


@dataclass
class RunResult:
    """Evaluated rows (one dict per evaluated round), the final state, and how it ended."""

    rows: list[dict] = field(default_factory=list)  # empty when keep_rows=False
    state: State | None = None
    rounds_done: int = 0
    diverged_at: int | None = None  # round count at which the model stopped being finite
    last_row: dict | None = None  # the latest evaluated row (kept even without rows)
    comm: tuple[float, float] = (0.0, 0.0)  # cumulative floats sent (down, up) after rounds_done
    blow_up: BlowUpDetector | None = None  # the run's detector (its state goes into checkpoints)
    train_loss: TrainLoss = field(default_factory=TrainLoss)  # losses since the last row (checkpointed)
    closing: bool = False  # the last row is a closing row (off the cadence: see the module docstring)
    stopped: str | None = None  # why a run stopped before its last round other than diverging (a DP budget)


class Resume(NamedTuple):
    """Where a run continues from: its state after ``start_round`` rounds and what it had counted.

    ``comm_before``: the traffic before ``start_round`` (None: recounted from the participation);
    ``evaluate_start``: False when the row of ``start_round`` was already written;
    ``eval_origin``: the round the run started from, so that it evaluates the rounds the
    uninterrupted run evaluates; ``blow_up``: the run's detector as it was (None: a fresh one);
    ``train_loss``: the losses returned since the last row (None: none)."""

    state: State
    start_round: int
    comm_before: tuple[float, float] | None = None
    evaluate_start: bool = True
    eval_origin: int = 0
    blow_up: BlowUpDetector | None = None
    train_loss: TrainLoss | None = None


def active_sets(mask: np.ndarray, device: torch.device) -> list[torch.Tensor]:
    """Per-round sorted int64 index tensors of the active clients: views of one copy to the
    device, which the host keeps (as round_actives' are: a problem reads them on the host)."""
    sets = [np.flatnonzero(row).astype(np.int64) for row in mask]
    flat = mirrored_copy(np.concatenate(sets) if sets else np.zeros(0, dtype=np.int64), device)
    return list(flat.split([len(s) for s in sets]))


def _rounds_per_chunk(participation) -> int:
    """Rounds whose active sets are drawn at once: ROUND_CHUNK, fewer when N is large, so that a
    chunk never holds more than about ROUND_CELLS client indices (or rows' bools)."""
    return max(1, min(ROUND_CHUNK, ROUND_CELLS // max(1, participation.num_clients)))


def participants_before(participation, start_round: int) -> int:
    """Client-rounds of rounds 0..start_round-1, counted chunk by chunk (bounded memory)."""
    total, step = 0, _rounds_per_chunk(participation)
    for lo in range(0, start_round, step):
        total += sum(len(s) for s in participation.active_sets(lo, min(start_round, lo + step)))
    return total


def round_actives(participation, start: int, end: int, device: torch.device, work=None
                  ) -> Iterator[tuple[int, torch.Tensor | None, torch.Tensor | None]]:
    """(r, active index tensor, their step counts) for rounds start..end-1, drawn a chunk of
    rounds at a time (``participation.active_sets``: O(|S_r|) a round for the processes that draw
    sets directly); the counts are ``work``'s (None: no work process); ``participation`` None:
    (r, None, None) (a federation that asks whoever answers; its loop draws counts for them)."""
    if participation is None:
        for r in range(start, end):
            yield r, None, None
        return
    step = _rounds_per_chunk(participation)
    for lo in range(start, end, step):
        sets = participation.active_sets(lo, min(end, lo + step))
        counts, refused = _chunk_steps(work, lo, sets)
        # One copy to the device a chunk of rounds, not one a round: a blocking copy to a GPU
        # waits for the work queued before it, so a copy a round stopped the host every round.
        # The host keeps what it copied: a problem reads a round's clients there, and the
        # algorithms their largest step count (device.host_values).
        actives = _chunk_copy(sets, device)
        steps = _chunk_copy(counts, device) if work is not None else [None] * len(counts)
        for offset, (active, drawn) in enumerate(zip(actives, steps)):
            yield lo + offset, active, drawn
        if refused is not None:
            raise refused


def _chunk_steps(work, lo: int, sets: list) -> tuple[list, Exception | None]:
    """The host step counts of a chunk's rounds (``sets``, from round ``lo``), and the refusal of
    the first round whose counts the process cannot give: the chunk stops before that round, so
    the rounds before it run and the refusal comes when that round does (as a round at a time)."""
    if work is None:
        return [None] * len(sets), None
    counts = []
    for offset, active in enumerate(sets):
        try:
            counts.append(work.host_steps(lo + offset, np.asarray(active, dtype=np.int64).reshape(-1)))
        except FocusflError as refusal:
            return counts, refusal
    return counts, None


def _chunk_copy(parts: list, device: torch.device) -> list[torch.Tensor]:
    """Host int64 arrays as views of one mirrored copy on ``device`` (device.mirrored_copy)."""
    arrays = [np.asarray(a, dtype=np.int64).reshape(-1) for a in parts]
    flat = mirrored_copy(np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64), device)
    return list(flat.split([len(a) for a in arrays]))


class RecordedParticipation:
    """A recorded active set per round (a bool mask [R, N]) as a participation process."""

    name = "recorded"

    def __init__(self, mask: np.ndarray) -> None:
        self.mask_ = np.asarray(mask, dtype=bool)
        self.num_clients = self.mask_.shape[1]

    def rows(self, start: int, stop: int) -> np.ndarray:
        return self.mask_[start:stop]

    def active_sets(self, start: int, stop: int) -> list[np.ndarray]:
        return [np.flatnonzero(row).astype(np.int64) for row in self.mask_[start:stop]]


class RecordedWork:
    """A recorded step count per round and client (int [R, N]) as a work process."""

    fixed = False

    def __init__(self, table, local_steps: int) -> None:
        self.table = torch.as_tensor(table, dtype=torch.int64)
        self.num_clients, self.local_steps = self.table.shape[1], local_steps

    def steps(self, r: int, active: torch.Tensor) -> torch.Tensor:
        return self.table[r].to(active.device).index_select(0, active)

    def host_steps(self, r: int, active: np.ndarray) -> np.ndarray:
        return self.table[r].numpy()[active]


class RunLoop:
    """One run's round loop, a round at a time: :func:`run_rounds` drives one run with it, and
    engine/batched.py drives several in lockstep (their clients' work collected together). The
    arguments are run_rounds'; ``exchange.collect`` is the caller's to call between
    :meth:`open` and :meth:`close`."""

    def __init__(self, algorithm: Algorithm, problem: Problem, participation, rounds: int, exchange: Exchange, *,
                 seed: int = 0, eval_every: int | None = 1, schedule: Callable[[int], float] = lambda r: 1.0,
                 work=None, resume: Resume | None = None, on_row: Callable[[dict], None] | None = None,
                 on_round: Callable[[RunResult], None] | None = None, keep_rows: bool = True, progress=None,
                 privacy=None) -> None:
        n = problem.num_clients
        if participation is not None and participation.num_clients != n:
            raise ConfigError(f"participation has {participation.num_clients} clients, problem has {n}")
        if rounds < 0 or (eval_every is not None and eval_every < 1):
            raise ConfigError("rounds must be >= 0 and eval_every >= 1")
        algorithm = algorithm.prepare(problem, participation, seed=seed)
        if work is not None:
            if work.num_clients != n:
                raise ConfigError(f"work has {work.num_clients} clients, problem has {n}")
            check_work_process(algorithm, work)
            if work.fixed:
                work = None  # everyone does local_steps: exactly the run without a work process
        if resume is None:
            resume = Resume(algorithm.init(problem.initial_point(), n), 0)
        start_round, self.end = resume.start_round, resume.start_round + rounds
        self.comm = algorithm.communication()
        floats = resume.comm_before
        if floats is None:  # the traffic before start_round, so resumed runs report the same totals
            before = 0 if participation is None else participants_before(participation, start_round)
            floats = (before * self.comm.down * problem.dim, before * self.comm.up * problem.dim)
        self.result = RunResult(
            state=resume.state, rounds_done=start_round, comm=(float(floats[0]), float(floats[1])),
            blow_up=resume.blow_up if resume.blow_up is not None else BlowUpDetector(),
            train_loss=copy.copy(resume.train_loss) if resume.train_loss is not None else TrainLoss())
        self.algorithm, self.problem, self.exchange, self.seed = algorithm, problem, exchange, seed
        self.eval_every, self.schedule, self.work, self.resume = eval_every, schedule, work, resume
        self.on_row, self.on_round, self.keep_rows, self.progress = on_row, on_round, keep_rows, progress
        self.privacy = privacy
        self.actives = round_actives(participation, start_round, self.end, problem.device, work)

    def evaluate(self, done: int, active_count: int, closing: bool = False) -> bool:
        """The row after ``done`` rounds; False when the run diverged there."""
        result = self.result
        # A closing row leaves what the run carries untouched (see the module docstring).
        detector = copy.deepcopy(result.blow_up) if closing else result.blow_up
        row = evaluation_row(self.algorithm.model(result.state), self.problem, detector, done=done,
                             active=active_count, comm=result.comm,
                             extra={**result.train_loss.row(), **self.exchange.counters(),
                                    **(self.privacy.columns() if self.privacy is not None else {})})
        if not closing:
            result.train_loss = TrainLoss()
        result.last_row, result.closing = row, closing
        if self.keep_rows:
            result.rows.append(row)
        if self.on_row is not None:
            self.on_row(row)
        return not diverged(row)

    def start(self) -> bool:
        """The starting row (unless it was written already); False when the run diverged there."""
        start_round = self.resume.start_round
        if self.eval_every is not None and self.resume.evaluate_start and not self.evaluate(start_round, 0):
            self.result.diverged_at = start_round
            return False
        return True

    def open(self) -> RoundContext | None:
        """The context of the run's next round (whom it asks, their step counts); None when the
        run has done its rounds, or its privacy budget would be exceeded by this round (``stopped``)."""
        r, drawn, drawn_steps = next(self.actives, (None, None, None))
        if r is None:
            return None
        requested = self.exchange.requested(r, drawn)
        steps = None
        if self.work is not None:  # the chunk's counts, unless the exchange asked others than drawn
            steps = drawn_steps if requested is drawn else self.work.steps(r, requested)
        ctx = RoundContext(round=r, active=requested, num_clients=self.problem.num_clients,
                           lr_scale=self.schedule(r), steps=steps)
        self.algorithm.check_work(ctx)
        if self.privacy is not None and (reason := self.privacy.exhausted(r, requested)) is not None:
            self.result.stopped = reason
            if self.eval_every is not None and (self.result.last_row or {}).get("round") != r:
                self.evaluate(r, 0, closing=True)
            return None
        return ctx

    def close(self, collected: Collected, ctx: RoundContext) -> bool:
        """The round ``ctx`` after its clients' work was ``collected``: the server step, the
        commit, the traffic, the row on the cadence and ``on_round``; False when the run
        diverged (it stops there)."""
        result, problem, comm = self.result, self.problem, self.comm
        ctx = ctx._replace(active=collected.active, steps=collected.steps)
        if self.privacy is not None:  # the clients' messages, as the server receives them
            collected = collected._replace(message=self.privacy.messages(collected.message, ctx.round, collected.active))
        server = server_step(self.algorithm, result.state, collected, ctx, problem, self.seed)
        result.state = self.exchange.commit(result.state, server, collected, ctx)
        r = ctx.round
        result.rounds_done = r + 1
        result.train_loss.add(collected.losses)
        arrived = collected.active.numel()
        result.comm = (result.comm[0] + arrived * comm.down * problem.dim,
                       result.comm[1] + arrived * comm.up * problem.dim)
        if self.progress is not None:
            self.progress.update(1)
        if self.eval_every is not None:
            on_cadence = (r + 1 - self.resume.eval_origin) % self.eval_every == 0
            if (on_cadence or r + 1 == self.end) and not self.evaluate(r + 1, arrived, closing=not on_cadence):
                result.diverged_at = r + 1
                return False
        if self.on_round is not None:
            self.on_round(result)
        return True


def run_rounds(
    algorithm: Algorithm,
    problem: Problem,
    participation,
    rounds: int,
    exchange: Exchange,
    *,
    seed: int = 0,
    eval_every: int | None = 1,
    schedule: Callable[[int], float] = lambda r: 1.0,
    work=None,
    resume: Resume | None = None,
    on_row: Callable[[dict], None] | None = None,
    on_round: Callable[[RunResult], None] | None = None,
    keep_rows: bool = True,
    progress=None,
    privacy=None,
) -> RunResult:
    """Run ``rounds`` rounds of ``algorithm`` through ``exchange`` (see the module docstring).

    ``participation``: the process that draws S_r (None: the exchange decides whom it asks);
    ``work``: the process of the clients' local step counts (None or fixed: local_steps each);
    ``eval_every``: the row cadence (None: no rows at all, for trajectories); ``resume``: where
    a continued run starts (None: from ``problem.initial_point()`` at round 0); ``keep_rows``
    False hands rows to ``on_row`` only; ``on_round(result)`` is called after every round, at a
    point where ``result.state`` is consistent (a checkpoint can be taken, or an exception
    raised to stop); ``progress``: a bar whose ``update(1)`` is called per round. A non-finite
    model or a blow-up (engine/divergence.py) stops the run: its last row has ``diverged``.
    ``privacy`` (focusfl.privacy.RunPrivacy, None: none): clips and noises the messages that
    arrived before the server step, adds its columns to the rows, and stops the run (``stopped``)
    before a round that would exceed its budget."""
    loop = RunLoop(algorithm, problem, participation, rounds, exchange, seed=seed, eval_every=eval_every,
                   schedule=schedule, work=work, resume=resume, on_row=on_row, on_round=on_round,
                   keep_rows=keep_rows, progress=progress, privacy=privacy)
    if not loop.start():
        return loop.result
    while (ctx := loop.open()) is not None:
        if not loop.close(exchange.collect(loop.result.state, ctx), ctx):
            break
    return loop.result

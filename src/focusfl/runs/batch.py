"""A batch of runs into their folders: R runs of one problem stepped together (engine/batched.py),
each writing its own folder as ``focusfl run`` writes it.

Each run opens its folder as run_to_folder or resume_folder would (runs/folder.py's
``new_run`` / ``resumed_run``: checked, locked, config.json "running", a killed run's rows cut
back to its checkpoint), streams its own metrics.csv and takes its own checkpoints; the batch
steps them round by round. A run that diverges stops alone and is published as diverged; a run
whose folder cannot be opened fails alone. On SIGINT, SIGTERM or SIGHUP every run not yet
finished saves a checkpoint where it is and is published as interrupted, so the same command
resumes each from its own checkpoint (to the bytes the uninterrupted run writes: the rows do not
depend on which runs share a batch). config.json records the batch size asked for
(``batch_runs``), never part of the run's key.

What may share a batch (:func:`batch_key`): runs of one problem (its SPEC, dtype and device:
the data is built once and shared, so runs that differ in the problem's own ``seed`` are not
batched together), one algorithm (its name: hyperparameters and step sizes may differ), one
device policy (``deterministic``), engine and thread count; the batch computes under that
policy, as each run alone does (runs/driver.py). The run's own ``seed`` (participation, work, minibatches), its
step size, hyperparameters, participation and work processes, rounds and evaluation cadence
may all differ.
"""
from __future__ import annotations

import contextlib
import json
import signal
from dataclasses import dataclass
from typing import Sequence

import torch

from ..engine.batched import BatchMember, RunBatch
from ..engine.loop import Resume, RunResult
from ..privacy import run_privacy
from ..errors import ConfigError, DataError, FocusflError
from ..spec import parse_spec
from ..threads import fixed_threads
from .checkpoint import CHECKPOINT, resume_from
from .config import BATCH_RUNS, RunConfig, defaults_for
from ..device import policy_applied
from .driver import policy_of, starting_state
from .folder import (
    METRICS,
    Interrupted,
    OnCheckpoint,
    OpenedRun,
    _Checkpointer,
    _close_quietly,
    _complete,
    _finish,
    _MetricsWriter,
    _SIGNAL_CODES,
    _stop_on_signals,
    _StopFlag,
    _StopRequested,
    new_run,
    resumed_run,
    told_of_checkpoints,
)


@dataclass(frozen=True)
class BatchEntry:
    """One run of a batch: its record, its folder, whether to resume it from its checkpoint."""

    config: RunConfig
    out: str
    resume: bool = False


@dataclass
class BatchOutcome:
    """How one run of a batch ended: its result, or the error that stopped it alone; ``restarted``:
    why a run that was to be resumed ran again from its start (its checkpoint unreadable)."""

    result: RunResult | None = None
    error: BaseException | None = None
    restarted: str | None = None


# ``--batch-runs auto``: runs per batch, from a budget of memory that is never measured (a result
# may not depend on what a machine has free): a batch holds as many runs as their states and a
# round's stacked rows fit in BATCH_MEMORY, at most AUTO_MAX (beyond it a CPU gains nothing more:
# the per-round work of each run is then the kernels' own).
BATCH_MEMORY = 1 << 30
AUTO_MAX = 32


def run_bytes(built) -> int:
    """The memory one run adds to a batch, counted from its configuration alone: its algorithm's
    state (state_size) and four [N, d] stacks of a round's rows (gathered rows, the new rows, the
    message, a gradient) in the problem's dtype."""
    problem = built.problem
    itemsize = torch.empty((), dtype=problem.dtype).element_size()
    state = built.algorithm.state_size(problem.num_clients, problem.dim).nbytes(itemsize)
    return state + 4 * problem.num_clients * problem.dim * itemsize


def batch_size(asked: int | str, bytes_per_run: int) -> int:
    """The runs per batch ``--batch-runs`` asks for: a count as given, or ``auto`` (see BATCH_MEMORY)."""
    if asked == "auto":
        return max(1, min(AUTO_MAX, BATCH_MEMORY // max(1, bytes_per_run)))
    if isinstance(asked, bool) or not isinstance(asked, int) or asked < 1:
        raise ConfigError(f"batch_runs must be 'auto' or an integer >= 1, got {asked!r}")
    return asked


def group_batches(items: Sequence, config_of, bytes_of, asked: int | str) -> list[list]:
    """``items`` (runs in any form: ``config_of(item)`` their RunConfig, ``bytes_of(item)`` their
    run_bytes) grouped into batches: runs of one batch_key in their order, at most
    ``batch_size(asked, the largest run's bytes)`` per batch."""
    groups: dict[str, list] = {}
    for item in items:
        groups.setdefault(batch_key(config_of(item)), []).append(item)
    batches = []
    for members in groups.values():
        size = batch_size(asked, max(bytes_of(item) for item in members))
        batches.extend(members[k:k + size] for k in range(0, len(members), size))
    return batches


def batch_key(config: RunConfig) -> str:
    """What runs must share to be stepped in one batch (see the module docstring)."""
    filled = config if config.dtype is not None else config.replace(dtype=defaults_for(config.problem)["dtype"])
    problem = parse_spec(filled.problem)
    return json.dumps([problem, filled.dtype, filled.device, filled.deterministic, filled.engine, filled.threads,
                       parse_spec(filled.algorithm)[0]], sort_keys=True, default=str)


def run_batch_to_folders(entries: Sequence[BatchEntry], *, batch_runs: int, checkpoint_every: int | None = None,
                         allow_model_import: bool = False, on_checkpoint: OnCheckpoint | None = None
                         ) -> list[BatchOutcome]:
    """Run ``entries`` (runs of one batch_key) as one batch, each into its folder; an outcome per
    entry. A signal stops the batch: every run not finished then saved its checkpoint and was
    published as interrupted, and its outcome's error is :class:`Interrupted`. A full disk or a
    fault of the batch itself is raised. ``on_checkpoint``: as run_to_folder's, for each run."""
    outcomes = [BatchOutcome() for _ in entries]
    problems: dict = {}
    extra = {BATCH_RUNS: batch_runs}
    with contextlib.ExitStack() as stack:
        opened: list[tuple[int, OpenedRun]] = []
        for k, entry in enumerate(entries):
            try:
                run = _open(stack, entry, outcomes[k], problems, extra, allow_model_import)
            except FocusflError as exc:
                outcomes[k].error = exc
                continue
            if run.done is not None:
                outcomes[k].result = run.done
            else:
                opened.append((k, run))
        stopped: Interrupted | None = None
        for group in _by_problem(opened):
            if stopped is not None:  # opened, never driven: nothing to keep
                for k, run in group:
                    run.output.discard()
                    outcomes[k].error = stopped
                continue
            results, stopped = _drive_together([run for _, run in group], checkpoint_every=checkpoint_every,
                                               on_checkpoint=on_checkpoint)
            for (k, _), result in zip(group, results):
                outcomes[k].result = result
                if result is None:
                    outcomes[k].error = stopped
    return outcomes


def _open(stack: contextlib.ExitStack, entry: BatchEntry, outcome: BatchOutcome, problems: dict, extra: dict,
          allow_model_import: bool) -> OpenedRun:
    """The entry's folder opened in ``stack`` (resumed, or started again when its checkpoint
    cannot be read, as a sweep's single runs are)."""
    if entry.resume:
        try:
            return stack.enter_context(resumed_run(entry.out, curve=False, allow_model_import=allow_model_import,
                                                   problems=problems, extra=extra))
        except DataError as exc:
            outcome.restarted = str(exc).splitlines()[0] if str(exc) else "DataError"
    return stack.enter_context(new_run(entry.config, entry.out, restart=True, allow_model_import=allow_model_import,
                                       problems=problems, extra=extra))


def _by_problem(opened: list[tuple[int, OpenedRun]]) -> list[list[tuple[int, OpenedRun]]]:
    """The opened runs grouped by their problem as built (a resumed run's problem comes from its
    config.json, a new one's from its SPEC: equal descriptions are the same data)."""
    groups: dict[str, list] = {}
    for k, run in opened:
        problem = run.built.problem
        key = json.dumps([problem.describe(), str(problem.dtype), str(problem.device)], sort_keys=True, default=str)
        groups.setdefault(key, []).append((k, run))
    return list(groups.values())


def _drive_together(runs: list[OpenedRun], *, checkpoint_every: int | None, on_checkpoint: OnCheckpoint | None = None
                    ) -> tuple[list[RunResult | None], Interrupted | None]:
    """runs/folder.py's _drive for several runs of one problem at once (see the module
    docstring): each run's result, or None for a run a signal stopped (then also the
    Interrupted that says so)."""
    flag = _StopFlag()
    writers = [_MetricsWriter(run.output.work / METRICS, truncate_to=None if run.start is None else run.start.metrics_bytes,
                              late_columns=(*run.built.problem.late_metrics, "diverged")) for run in runs]
    checkpointers = [_Checkpointer(run.built, run.output.work, metrics, checkpoint_every,
                                   on_save=told_of_checkpoints(on_checkpoint, run.output))
                     for run, metrics in zip(runs, writers)]
    members = [_member(run, metrics, checkpointer, flag) for run, metrics, checkpointer in zip(runs, writers, checkpointers)]
    batch = RunBatch(runs[0].built.problem, members, engine=runs[0].built.config.engine)
    try:
        with _stop_on_signals(flag), fixed_threads(runs[0].built.config.threads), \
                policy_applied(policy_of(runs[0].built.config)):
            results: list[RunResult | None] = list(batch.run())
    except _StopRequested as stop:
        name = signal.Signals(stop.signum).name
        stopped = Interrupted(f"{name}: stopped with a checkpoint; run the same command again to continue",
                              _SIGNAL_CODES.get(stop.signum, 130))
        return _stop_all(runs, writers, checkpointers, batch), stopped
    except BaseException as exc:
        for run, metrics in zip(runs, writers):
            _close_quietly(metrics, None)
            if not (run.output.work / CHECKPOINT).is_file():
                run.output.discard()
        if isinstance(exc, KeyboardInterrupt):
            raise Interrupted("interrupted; the runs of the batch keep their last checkpoints") from None
        raise
    for run, result, metrics in zip(runs, results, writers):
        _complete(run.built, run.output, result, metrics, curve=False, recorded=run.recorded)
    return results, None


def _member(run: OpenedRun, metrics: _MetricsWriter, checkpointer: _Checkpointer, flag: _StopFlag) -> BatchMember:
    built, config = run.built, run.built.config
    if run.start is None:
        resume = Resume(starting_state(built, run.output.work), 0)
    else:
        resume = resume_from(run.start, built.participation)

    def on_round(result: RunResult) -> None:
        if flag.signum is not None:
            raise _StopRequested(flag.signum)
        if checkpointer.due(result.rounds_done):
            checkpointer.save(result)

    privacy = run_privacy(config.dp, built.algorithm, built.problem, built.participation, seed=config.seed,
                          end_round=config.rounds, start_round=resume.start_round, nonce=built.dp_nonce)
    return BatchMember(built.algorithm, built.participation, config.rounds - resume.start_round, seed=config.seed,
                       eval_every=config.eval_every, schedule=config.schedule, work=built.work, resume=resume,
                       on_row=metrics.write, on_round=on_round, keep_rows=False, privacy=privacy)


def _stop_all(runs: list[OpenedRun], writers: list[_MetricsWriter], checkpointers: list[_Checkpointer],
              batch: RunBatch) -> list[RunResult | None]:
    """After a signal: each finished run is completed (its result kept), each other one saves a
    checkpoint where it is (its state is consistent between rounds) and is published as
    interrupted (None)."""
    results: list[RunResult | None] = []
    for run, metrics, checkpointer, loop in zip(runs, writers, checkpointers, batch.loops):
        result = loop.result
        if result.diverged_at is not None or result.rounds_done == loop.end:
            _complete(run.built, run.output, result, metrics, curve=False, recorded=run.recorded)
            results.append(result)
            continue
        checkpointer.save(result)
        metrics.close()
        _finish(run.built, run.output.work, status="interrupted", rounds_done=checkpointer.last_round, curve=False,
                recorded=run.recorded)
        run.output.publish()
        results.append(None)
    return results

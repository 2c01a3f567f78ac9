"""``focusfl run``'s output folder: metrics streamed to disk, checkpoints, signals and resume.

A run works in the output's partial folder (``io.folders``), which becomes ``--out``
only when the run ends:

- every evaluated row is appended to ``metrics.csv`` as it is computed (flushed at least once
  a second), so memory does not grow with the number of rounds;
- a checkpoint (``checkpoint.pt``: algorithm state, round, traffic so far, participation stream,
  and the length of metrics.csv that belongs to it) is saved atomically every
  ``checkpoint_every`` rounds (default: once a minute of wall clock) and when SIGINT, SIGTERM
  or SIGHUP arrives; the run then stops at the end of the round in progress and publishes
  what it has, and ``focusfl run --resume OUT`` continues it;
- killed outright (SIGKILL, power loss), the partial folder keeps the last checkpoint, and
  ``--resume OUT`` continues from there: rows written after it are cut and recomputed, so the
  resumed run's metrics.csv and model are byte for byte those of an uninterrupted run.

With ``tensorboard=DIR`` a run also logs every evaluated row, as it is computed, into the
TensorBoard folder ``DIR/<name of out>`` (``-2``, ``-3``... if that is taken: a new run never
mixes its steps into another's log), and its configuration as hparams when it ends
(``runs.tensorboard``). config.json records that folder (key ``tensorboard``, not part of
the run's identity), so ``resume_folder`` keeps logging there, purging the steps after the
checkpoint it continues from.
"""
from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import json
import math
import os
import shutil
import signal
import time
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from ..data.plots import plot_label_histograms, plot_training_curves
from ..engine import RunResult
from ..errors import ConfigError, DataError
from ..io.atomic import csv_cell, disk_full, full_disk, write_csv, write_json
from ..io.folders import MARKER, PARTIAL_SUFFIX, Output, open_output, read_marker, waiting_output
from ..limits import check_disk_space
from ..plots import plot_curve
from ..problems.models import refuse_model_import
from ..signals import handled
from .checkpoint import (
    CHECKPOINT,
    MODEL,
    Checkpoint,
    load_checkpoint,
    resume_from,
    save_checkpoint,
    save_model,
    take_checkpoint,
)
from .config import ASKED, RunConfig, as_requested, asked, config_from_json, run_key, state_budget
from .driver import BuiltRun, build, execute, noise_as_recorded, reference_of
from .inputs import CHANGED, INPUTS, check_inputs, input_digests, recorded_changes, recorded_inputs, unpinned
from .store import TABLE, MappedClients, copy_table, table_disk_bytes
from .tensorboard import RunLogger, check_root, claim_log_dir, has_events, iter_metrics, require

METRICS = "metrics.csv"
CONFIG = "config.json"
MAX_CONFIG_BYTES = 1 << 20  # a config.json is a few kB; a larger file is not one of ours
# config.json's "status": a run is running, then ends complete, diverged or interrupted.
RUNNING, COMPLETE, DIVERGED, INTERRUPTED = "running", "complete", "diverged", "interrupted"
BUDGET_EXHAUSTED = "budget_exhausted"  # stopped by --dp target_epsilon before a client would exceed it
FINISHED = (COMPLETE, DIVERGED, BUDGET_EXHAUSTED)  # nothing left to run
TENSORBOARD = "tensorboard"  # config.json: the run's TensorBoard folder (an output option, not its identity)
CHECKPOINT_SECONDS = 60.0  # default cadence: one checkpoint a minute of wall clock
FLUSH_SECONDS = 1.0
PLOT_POINTS = 4000  # rows drawn in curve.png: a long run's metrics.csv is thinned evenly
_SIGNAL_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}


class Interrupted(KeyboardInterrupt):
    """A run stopped by a signal; the message says where its results are and how to resume."""

    def __init__(self, message: str, exit_code: int = 130) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class _StopRequested(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class _StopFlag:
    signum: int | None = None


class _StopNow(KeyboardInterrupt):
    """A second signal: the run stops at once, in the middle of its round (a round that never
    ends, a user's algorithm that hangs); its last checkpoint stays."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"{signal.Signals(signum).name}")
        self.exit_code = _SIGNAL_CODES.get(signum, 130)


def _signals_to(flag: _StopFlag | None):
    """:func:`_stop_on_signals` for ``flag``; nothing when None (the caller catches them)."""
    return contextlib.nullcontext() if flag is None else _stop_on_signals(flag)


def _stop_on_signals(flag: _StopFlag):
    """The first SIGINT/SIGTERM/SIGHUP asks the run to stop at the end of its round; a second one
    stops it at once, a round that never ends included (the last checkpoint stays). Only the main
    thread can do this, and signals ignored by the process's parent stay ignored."""
    def handler(signum, frame) -> None:
        if flag.signum is not None:
            raise _StopNow(signum)
        flag.signum = signum

    return handled(_SIGNAL_CODES, handler, keep_ignored=True)


class _MetricsWriter:
    """metrics.csv, appended row by row; ``sync`` makes it durable, and ``kept(result)`` is the
    length a checkpoint of ``result`` records: all of it, or all but a closing row (a last row
    off the evaluation cadence, which a run continued past its end leaves out: engine/loop.py)."""

    def __init__(self, path: Path, truncate_to: int | None = None, late_columns: tuple[str, ...] = ()) -> None:
        self.path = path
        self.late_columns = late_columns  # columns the first row may lack (Problem.late_metrics)
        self.columns: list[str] | None = None
        self.size = 0  # bytes written so far (the file's length once flushed)
        if truncate_to is not None:  # resume: keep the rows of rounds up to the checkpoint
            with open(path, "r+b") as handle:
                if handle.seek(0, os.SEEK_END) < truncate_to:
                    raise DataError(f"{path} is shorter than its checkpoint records; the run cannot be resumed")
                handle.truncate(truncate_to)
            with open(path, newline="", encoding="utf-8") as handle:
                self.columns = next(csv.reader(handle), None)
            self.size = truncate_to
        self.row_start = self.size  # where the last row written begins
        self.handle = open(path, "a" if truncate_to is not None else "w", newline="", encoding="utf-8")
        self.buffer = io.StringIO()  # each row is formatted here first, so its length in bytes is known
        self.writer = None if self.columns is None else self._writer()
        self.flushed = time.monotonic()

    def _writer(self) -> csv.DictWriter:
        return csv.DictWriter(self.buffer, fieldnames=self.columns, extrasaction="ignore")

    def _emit(self) -> None:
        text = self.buffer.getvalue()
        self.buffer.seek(0)
        self.buffer.truncate()
        self.handle.write(text)
        self.size += len(text.encode("utf-8"))

    def write(self, row: dict) -> None:
        if self.writer is None:
            self.columns = list(row) + [k for k in self.late_columns if k not in row]
            self.writer = self._writer()
            self.writer.writeheader()
            self._emit()
        self.row_start = self.size
        self.writer.writerow({k: csv_cell(row.get(k)) for k in self.columns})
        self._emit()
        if time.monotonic() - self.flushed > FLUSH_SECONDS:
            self.handle.flush()
            self.flushed = time.monotonic()

    def sync(self) -> int:
        self.handle.flush()
        os.fsync(self.handle.fileno())
        return self.size

    def kept(self, result: RunResult) -> int:
        """The durable length a checkpoint of ``result`` records (a closing row left out)."""
        size = self.sync()
        return self.row_start if result.closing else size

    def close(self) -> None:
        if not self.handle.closed:
            self.handle.flush()
            self.handle.close()


# Told of each checkpoint a run saves: (the run's folder, its partial folder, the checkpoint).
OnCheckpoint = Callable[[Path, Path, Checkpoint], None]


def told_of_checkpoints(on_checkpoint: OnCheckpoint | None, output: Output) -> Callable[[Checkpoint], None] | None:
    """A _Checkpointer's ``on_save`` for the run in ``output``: ``on_checkpoint`` told its folders."""
    if on_checkpoint is None:
        return None
    return lambda checkpoint: on_checkpoint(output.target, output.work, checkpoint)


class _Checkpointer:
    """Saves checkpoints every ``every`` rounds (None: every CHECKPOINT_SECONDS; 0: never)."""

    def __init__(self, built: BuiltRun, work: Path, metrics: _MetricsWriter, every: int | None, logger=None,
                 on_save: Callable[[Checkpoint], None] | None = None) -> None:
        self.built, self.path, self.metrics, self.every = built, work / CHECKPOINT, metrics, every
        self.logger = logger  # a TensorBoard log: flushed first, so it has every row the checkpoint keeps
        self.on_save = on_save  # told of each checkpoint once it is on disk (a Ray task ships it: sweeps/executors.py)
        self.saved_at = time.monotonic()
        self.last_round: int | None = None

    def due(self, rounds_done: int) -> bool:
        if self.every is None:
            return time.monotonic() - self.saved_at >= CHECKPOINT_SECONDS
        return self.every > 0 and rounds_done % self.every == 0

    def save(self, result: RunResult) -> None:
        if self.logger is not None:
            self.logger.flush()
        checkpoint = take_checkpoint(result, self.built.participation, self.metrics.kept(result))
        save_checkpoint(self.path, checkpoint)
        self.saved_at = time.monotonic()
        self.last_round = result.rounds_done
        if self.on_save is not None:
            self.on_save(checkpoint)


# -- entry points --------------------------------------------------------------------------------
def run_to_folder(
    config: RunConfig,
    out: str | Path,
    *,
    progress: bool = False,
    checkpoint_every: int | None = None,
    restart: bool = False,
    allow_model_import: bool = False,
    curve: bool = True,
    tensorboard: str | Path | None = None,
    expected_inputs: dict | None = None,
    accept_changed_inputs: bool = False,
    extra: dict | None = None,
    on_checkpoint: OnCheckpoint | None = None,
) -> RunResult:
    """Build, run and write metrics.csv, config.json, curve.png, checkpoint.pt and model.pt into ``out``.

    Everything is validated before anything is written. A partial run left in ``out`` by a
    killed process is continued only by :func:`resume_folder`; ``restart`` discards it instead.
    ``allow_model_import`` is the caller's permission to import a user's model (never stored).
    ``curve=False`` leaves out curve.png (a sweep draws its runs together; drawing one costs more
    than a small run). ``tensorboard``: a folder to log the run into, as ``DIR/<name of out>``.
    ``expected_inputs``: a replay's recorded input digests (runs/inputs.py: ``{"recorded": ...,
    "skip": parts}``); inputs that differ are refused unless ``accept_changed_inputs``. ``extra``:
    keys config.json records beside the run (a sweep's batch size, runs.config.BATCH_RUNS).
    ``on_checkpoint(out, work, checkpoint)``: called after each checkpoint is saved in the partial
    folder ``work`` (a Ray task ships it to the driver's node).
    """
    flag = _StopFlag()
    with new_run(config, out, restart=restart, allow_model_import=allow_model_import, tensorboard=tensorboard,
                 expected_inputs=expected_inputs, accept_changed_inputs=accept_changed_inputs,
                 extra=extra, flag=flag) as opened:
        return _drive(opened.built, opened.output, None, flag, progress=progress, checkpoint_every=checkpoint_every,
                      curve=curve, recorded=opened.recorded, on_checkpoint=on_checkpoint)


@dataclass
class OpenedRun:
    """A run folder opened to be driven: its built run, its locked output, the checkpoint it
    continues from (None: a new run), what config.json records beside the run, and ``done``: the
    result of a run that opening finished (its files written, nothing to drive)."""

    built: BuiltRun
    output: Output
    start: Checkpoint | None
    recorded: dict
    done: RunResult | None = None


@contextlib.contextmanager
def new_run(config: RunConfig, out: str | Path, *, restart: bool = False, allow_model_import: bool = False,
            tensorboard: str | Path | None = None, expected_inputs: dict | None = None,
            accept_changed_inputs: bool = False, problems: dict | None = None,
            extra: dict | None = None, flag: _StopFlag | None = None) -> Iterator[OpenedRun]:
    """run_to_folder's folder, checked, locked, emptied and with config.json "running", for the
    block to drive (:func:`run_to_folder`, or a batch of runs: runs/batch.py). ``problems``: the
    builder's cache of problems (a batch shares one); ``extra``: keys config.json records beside
    the run (a batch's size); ``flag``: set by SIGINT, SIGTERM and SIGHUP from the moment the
    folder is opened (None: the caller catches signals itself, as a batch does)."""
    root = _tensorboard_root(tensorboard, out)
    if expected_inputs is not None:
        config = unpinned(config)
    built = build(config, allow_model_import=allow_model_import, problems=problems)
    recorded = _inputs_record(built, expected_inputs, accept_changed_inputs, "the run replayed")
    recorded.update(extra or {})
    # From here on a signal stops the run where it can publish (_drive reads ``flag``).
    with _signals_to(flag), open_output(out, kind="run") as output:
        killed = output.found_partial and (output.work / CHECKPOINT).is_file()
        if (killed or _stopped(output.target)) and not restart:
            if not output.found_partial:
                output.discard()  # made just now: a refused command leaves the folders as they were
            raise ConfigError(
                f"{out} holds an interrupted run; continue it with `focusfl run --resume {out}`, "
                "discard it and start over with --restart, or keep it and choose another --out"
            )
        _clear(output.work)
        # Choices deferred to run time (a measured nn formulation) are made before config.json is
        # first written, so a run killed at any point resumes computing the same way.
        built.problem.settle()
        if root is not None:
            recorded[TENSORBOARD] = str(claim_log_dir(root, output.target.name, avoid=[output.target]))
        write_json(output.work / CONFIG, {**built.resolved, "status": "running", **recorded})
        yield OpenedRun(built, output, None, recorded)


def _inputs_record(built: BuiltRun, expected: dict | None, accept: bool, what: str, earlier: list = ()) -> dict:
    """config.json's ``inputs`` (and ``inputs_changed``) of ``built``, after comparing them with
    the ``expected`` ones of a replay or resume (ConfigError on a change not accepted)."""
    current = input_digests(built)
    record: dict[str, Any] = {INPUTS: current} if current else {}
    if expected is not None:
        changes = check_inputs(expected["recorded"], current, accept=accept, what=what, skip=expected.get("skip", ()))
        if changes or earlier:
            record[CHANGED] = [*earlier, *changes]
    return record


def expected_inputs_of(data: dict, where: str, skip: tuple[str, ...] = ()) -> dict:
    """What a replay of the config.json content ``data`` expects to read (see run_to_folder);
    ``skip``: the parts (problem, participation, work) given anew beside it."""
    return {"recorded": recorded_inputs(data, where), "skip": skip}


def _refuse_import_on_resume(problem, out: Path) -> None:
    try:
        refuse_model_import(problem, f"{out}/{CONFIG}")
    except ConfigError as exc:
        if "cannot rebuild" in str(exc):
            raise
        raise ConfigError(f"{exc}; to resume a run of your own model, give --resume {out} "
                          "--allow-model-import") from None


def resume_folder(
    out: str | Path, *, rounds: int | None = None, progress: bool = False, checkpoint_every: int | None = None,
    curve: bool = True, tensorboard: str | Path | None = None, allow_model_import: bool = False,
    accept_changed_inputs: bool = False, extra: dict | None = None, on_checkpoint: OnCheckpoint | None = None,
) -> RunResult:
    """Continue the run in ``out`` from its checkpoint; ``rounds`` extends a finished run.

    Everything is read where it is and checked before anything is written: config.json and the
    checkpoint (its size against what a checkpoint of this run takes, then its tensors), the
    rounds, metrics.csv and the inputs (runs/inputs.py: a run whose data changed goes on only
    with ``accept_changed_inputs``). A refused resume leaves ``out`` and its surroundings as they
    were. Only then does a partial folder get the rows of metrics.csv up to the checkpoint.

    A run of a user's model (``nn:model=package.module:factory``) resumes only with
    ``allow_model_import``: the caller's permission to import the model its config.json names
    (focusfl run --resume DIR --allow-model-import); a file's word alone never runs code.

    A run that logs to TensorBoard (config.json's ``tensorboard``) goes on logging there;
    ``tensorboard`` starts a log for a run that had none (the rows so far are logged first), and
    must name the folder it logs in if it has one."""
    flag = _StopFlag()
    with resumed_run(out, rounds=rounds, curve=curve, tensorboard=tensorboard, allow_model_import=allow_model_import,
                     accept_changed_inputs=accept_changed_inputs, extra=extra, flag=flag) as opened:
        if opened.done is not None:
            _stopped_once_complete(flag, Path(out), opened.done.rounds_done)
            return opened.done
        return _drive(opened.built, opened.output, opened.start, flag, progress=progress,
                      checkpoint_every=checkpoint_every, curve=curve, recorded=opened.recorded,
                      on_checkpoint=on_checkpoint)


@contextlib.contextmanager
def resumed_run(out: str | Path, *, rounds: int | None = None, curve: bool = True,
                tensorboard: str | Path | None = None, allow_model_import: bool = False,
                accept_changed_inputs: bool = False, problems: dict | None = None,
                extra: dict | None = None, flag: _StopFlag | None = None) -> Iterator[OpenedRun]:
    """resume_folder's folder, checked, locked and set to continue from its checkpoint, for the
    block to drive (see new_run); a run whose last files only were missing is finished here
    (``done``)."""
    out = Path(out)
    _check_resumable(out)
    root = _tensorboard_root(tensorboard, out)
    # From here on a signal stops the run where it can publish (_drive reads ``flag``).
    with _signals_to(flag), open_output(out, kind="run", create=False) as output:
        # A killed run's partial folder is newer than anything published in out.
        unpublished = output.found_partial and (output.work / CHECKPOINT).is_file()
        source = output.work if unpublished else out
        if not (source / CHECKPOINT).is_file():
            raise ConfigError(f"nothing to resume in {str(out)!r}: it holds no checkpoint of a focusfl run")
        data = _read_json(source / CONFIG)
        config = config_from_json(data, where=f"{source}/{CONFIG}")
        if not allow_model_import:  # a file's word alone never runs code
            _refuse_import_on_resume(config.problem, out)
        log_dir = _stored_log_dir(data, out, root)
        if rounds is not None:
            config = config.replace(rounds=rounds)
        built = _asked_as_before(build(unpinned(config), allow_model_import=allow_model_import, problems=problems), data)
        built = noise_as_recorded(built, data)
        recorded = _inputs_record(built, expected_inputs_of(data, f"{source}/{CONFIG}"), accept_changed_inputs,
                                  f"the run in {out}", earlier=recorded_changes(data))
        recorded.update(extra or {})
        checkpoint = _read_checkpoint(built, source / CHECKPOINT)
        # An unpublished run whose last checkpoint is its final one (its last files did not fit on
        # the disk, or it was killed just then) is finished: no round runs again, its files are written.
        finishing = unpublished and rounds is None and checkpoint.round == config.rounds
        if checkpoint.round >= config.rounds and not finishing:
            raise ConfigError(
                f"{out} has run {checkpoint.round} of {config.rounds} rounds already; "
                f"give --rounds R with R > {checkpoint.round} to run it further"
            )
        _check_metrics(source / METRICS, checkpoint.metrics_bytes, out)
        work = output.work
        if source != work:
            table = checkpoint.state.clients if isinstance(checkpoint.state.clients, MappedClients) else None
            needed = checkpoint.metrics_bytes + (table_disk_bytes(table.path) if table is not None else 0)
            check_disk_space(needed, out.parent, f"the {needed:,} bytes of {out}'s metrics.csv (and client table) "
                                                 "to continue from")
            _start_from(output, source / METRICS, checkpoint.metrics_bytes, table=table)
            if table is not None:  # the run goes on writing its own copy, never the published table
                checkpoint = dataclasses.replace(
                    checkpoint, state=checkpoint.state._replace(clients=table.reopened(output.work / TABLE)))
        if log_dir is None and root is not None:
            log_dir = claim_log_dir(root, output.target.name, avoid=[output.target])
        if log_dir is not None:
            recorded[TENSORBOARD] = str(log_dir)
        if finishing:
            yield OpenedRun(built, output, checkpoint, recorded,
                            done=_publish_finished(built, output, checkpoint, curve=curve, recorded=recorded))
            return
        write_json(work / CONFIG, {**built.resolved, "status": "running", **recorded})
        yield OpenedRun(built, output, checkpoint, recorded)


def _asked_as_before(built: BuiltRun, data: dict) -> BuiltRun:
    """A resumed run rebuilt from its resolved record, keeping the ASKED block its config.json had
    (with the rounds it now runs to): its config.json is the uninterrupted run's, and its
    configuration (runs.config.configuration_key) the same. A record without one, or with one of
    other keys, gets the block of the record it was rebuilt from."""
    before = data.get(ASKED)
    if not isinstance(before, dict) or set(before) != set(asked(built.config)):
        return built
    return dataclasses.replace(built, asked_record={**before, "rounds": built.config.rounds})


def _publish_finished(built: BuiltRun, output: Output, checkpoint: Checkpoint, *, curve: bool,
                      recorded: dict) -> RunResult:
    """A run whose final checkpoint was written but whose folder was not published: its model,
    config.json and figures from that checkpoint and the metrics.csv it kept (its last row, a
    closing row included, is there: metrics.csv is flushed before the final checkpoint)."""
    work, out = output.work, output.target
    try:
        save_model(work / MODEL, built.algorithm.model(checkpoint.state))
        _finish(built, work, status=COMPLETE, rounds_done=checkpoint.round, curve=curve, recorded=recorded)
        output.publish()
    except BaseException as exc:
        if full_disk(exc):
            raise disk_full(out, exc, f"then finish it with `focusfl run --resume {out}`") from None
        raise
    return RunResult(state=checkpoint.state, rounds_done=checkpoint.round, comm=checkpoint.comm)


def _check_resumable(out: Path) -> None:
    """``out`` is a folder, or a killed run's partial folder stands beside it: else one line,
    before anything (not even a lock file) is made."""
    partial = out.parent / f".{out.name}{PARTIAL_SUFFIX}"
    if out.is_dir() or partial.is_dir():
        return
    what = "is not a folder" if out.exists() else "does not exist"
    raise ConfigError(f"nothing to resume in {str(out)!r}: it {what}")


def _read_checkpoint(built: BuiltRun, path: Path) -> Checkpoint:
    """The checkpoint at ``path``, read in place and checked against a fresh state of ``built``."""
    # Shapes and dtypes without N rows in memory; a mapped table is opened beside the checkpoint.
    return load_checkpoint(path, reference_of(built), built.problem.num_clients, budget=state_budget(built.config))


def _check_metrics(path: Path, length: int, out: Path) -> None:
    """metrics.csv holds at least the ``length`` bytes its checkpoint records."""
    try:
        size = path.stat().st_size
    except OSError:
        raise DataError(f"{out}: metrics.csv is missing; the run cannot be resumed") from None
    if size < length:
        raise DataError(f"{path} is shorter than its checkpoint records ({size} of {length} bytes); "
                        "the run cannot be resumed")


def _start_from(output: Output, metrics: Path, length: int, table: MappedClients | None = None) -> None:
    """A fresh partial folder with the first ``length`` bytes of the published ``metrics`` (and a
    copy of the published client ``table``, its written rows only); on a failure (a full disk) no
    partial folder is left."""
    output.create()
    try:
        _clear(output.work)
        _copy_prefix(metrics, output.work / METRICS, length)
        if table is not None:
            copy_table(table.path, output.work / TABLE)
    except BaseException:
        if not output.found_partial:
            output.discard()
        raise


def _copy_prefix(source: Path, target: Path, length: int) -> None:
    """The first ``length`` bytes of ``source`` into ``target``."""
    with open(source, "rb") as reader, open(target, "wb") as writer:
        left = length
        while left > 0:
            chunk = reader.read(min(left, 1 << 20))
            if not chunk:
                raise DataError(f"{source} is shorter than its checkpoint records; the run cannot be resumed")
            writer.write(chunk)
            left -= len(chunk)


def _tensorboard_root(tensorboard: str | Path | None, out: str | Path) -> Path | None:
    """The checked ``--tensorboard`` folder (None without one): before anything is written."""
    if tensorboard is None:
        return None
    require()
    return check_root(tensorboard, out)


def _stored_log_dir(data: dict, out: Path, root: Path | None) -> Path | None:
    """The TensorBoard folder a run being resumed logs into, from its config.json."""
    stored = data.get(TENSORBOARD)
    if stored is None:
        return None
    if not isinstance(stored, str) or not os.path.isabs(stored):
        raise ConfigError(f"{out}/{CONFIG}: {TENSORBOARD!r} must be the absolute path of a folder, got {stored!r}")
    log_dir = Path(stored)
    if root is not None and log_dir.parent != root:
        raise ConfigError(f"{out} logs to TensorBoard in {stored}; --tensorboard cannot change that "
                          f"(give --tensorboard {log_dir.parent}, or none)")
    require()  # the package is needed to go on logging
    return log_dir


# -- the run -------------------------------------------------------------------------------------
def _drive(
    built: BuiltRun, output: Output, start: Checkpoint | None, flag: _StopFlag, *, progress: bool,
    checkpoint_every: int | None, curve: bool = True, recorded: dict | None = None,
    on_checkpoint: OnCheckpoint | None = None,
) -> RunResult:
    """Run ``built`` in ``output``'s partial folder and publish it. The caller has set ``flag`` to
    catch SIGINT, SIGTERM and SIGHUP since it opened ``output``: a signal stops the run at the end
    of its round in progress (the first one, if it came before), publishing it as interrupted; one
    after the last round lets the run finish, publish itself complete, and then stop."""
    work, out = output.work, output.target
    recorded = recorded or {}
    # "diverged" marks the row where a run blew up (engine/divergence.py): no earlier row has it.
    metrics = _MetricsWriter(work / METRICS, truncate_to=None if start is None else start.metrics_bytes,
                             late_columns=(*built.problem.late_metrics, "diverged"))
    logger = _open_log(recorded, start, work / METRICS)
    checkpointer = _Checkpointer(built, work, metrics, checkpoint_every, logger,
                                 on_save=told_of_checkpoints(on_checkpoint, output))
    on_row = metrics.write if logger is None else _both(metrics.write, logger.log_row)

    def on_round(result: RunResult) -> None:
        # The last round's stop is the run's end: it completes (model.pt, a resumable checkpoint).
        if flag.signum is not None and result.rounds_done < built.config.rounds:
            checkpointer.save(result)
            raise _StopRequested(flag.signum)
        if checkpointer.due(result.rounds_done):
            checkpointer.save(result)

    resume = None if start is None else resume_from(start, built.participation)
    try:
        result = execute(built, progress=progress, on_row=on_row, resume=resume, keep_rows=False,
                         on_round=on_round, folder=work)
    except _StopRequested as stop:
        metrics.close()
        rounds = checkpointer.last_round
        info = _finish(built, work, status="interrupted", rounds_done=rounds, curve=curve, recorded=recorded)
        output.publish()
        _end_log(logger, info, rounds)
        name = signal.Signals(stop.signum).name
        raise Interrupted(
            f"{name}: stopped after round {rounds}; results so far are in {out}; "
            f"continue with `focusfl run --resume {out}`",
            _SIGNAL_CODES.get(stop.signum, 130),
        ) from None
    except BaseException as exc:
        _close_quietly(metrics, logger)  # on a full disk their last rows may not fit: a resume drops them
        if not (work / CHECKPOINT).is_file():
            output.discard()
            if full_disk(exc):
                raise disk_full(out, exc) from None
            raise
        kept = f"{out}: the checkpoint of round {checkpointer.last_round or start.round} is kept; " \
               f"continue with `focusfl run --resume {out}`"
        if full_disk(exc):
            raise disk_full(out, exc, f"then continue with `focusfl run --resume {out}` (the checkpoint of round "
                                      f"{checkpointer.last_round or start.round} is kept)") from None
        if isinstance(exc, KeyboardInterrupt):
            raise Interrupted(f"{exc or 'interrupted'}: stopped in the middle of a round; {kept}",
                              getattr(exc, "exit_code", 130)) from None
        if isinstance(exc, (ConfigError, DataError)):
            raise type(exc)(f"{exc} ({kept})") from None
        raise
    try:
        info = _complete(built, output, result, metrics, curve=curve, recorded=recorded)
    except KeyboardInterrupt:  # a second Ctrl-C while the last files were written
        # Nothing is deleted here: the publication may be half done, which the next command
        # writing DIR completes (io.folders).
        _close_quietly(metrics, logger)
        if not (work / CHECKPOINT).is_file():
            raise Interrupted(f"interrupted while the run wrote its last files, before any checkpoint; "
                              f"run the command again to redo {out}") from None
        raise Interrupted(f"interrupted while the run wrote its last files; {out}: finish it with "
                          f"`focusfl run --resume {out}`") from None
    except BaseException as exc:
        if not full_disk(exc):
            raise
        _close_quietly(metrics, logger)
        if not (work / CHECKPOINT).is_file():
            output.discard()
            raise disk_full(out, exc) from None
        raise disk_full(out, exc, f"then finish it with `focusfl run --resume {out}`") from None
    _end_log(logger, info, result.rounds_done)
    if result.diverged_at is None:  # a diverged run says so (exit 1), whatever came after
        _stopped_once_complete(flag, out, result.rounds_done)
    return result


def _stopped_once_complete(flag: _StopFlag, out: Path, rounds_done: int) -> None:
    """Interrupted when a signal came after the last round: the run is complete and published,
    and the command still ends as the signal asked (a sweep stops after this run)."""
    if flag.signum is not None:
        name = signal.Signals(flag.signum).name
        raise Interrupted(f"{name}: arrived after the last round; the run is complete in {out} "
                          f"({rounds_done} rounds)", _SIGNAL_CODES.get(flag.signum, 130))


def _complete(built: BuiltRun, output: Output, result: RunResult, metrics: "_MetricsWriter", *, curve: bool,
              recorded: dict) -> dict:
    """Write a finished run's last files (metrics flushed, model.pt before the final checkpoint,
    config.json, curve.png) and publish its folder; config.json's final contents."""
    work = output.work
    kept = metrics.kept(result)
    metrics.close()
    if result.diverged_at is None:
        # model.pt first: a full disk between the two leaves the previous checkpoint, so a resume
        # runs the last rounds again and writes both.
        save_model(work / MODEL, built.algorithm.model(result.state))
        save_checkpoint(work / CHECKPOINT, take_checkpoint(result, built.participation, kept))
        status = "complete" if result.stopped is None else BUDGET_EXHAUSTED
        if result.stopped is not None:
            recorded = {**recorded, "stopped": result.stopped}
    else:  # a non-finite state is nothing to resume from
        (work / CHECKPOINT).unlink(missing_ok=True)
        status = "diverged"
    info = _finish(built, work, status=status, rounds_done=result.rounds_done, diverged_at=result.diverged_at,
                   curve=curve, recorded=recorded)
    output.publish()
    return info


def _close_quietly(metrics: "_MetricsWriter", logger) -> None:
    """Close metrics.csv and the TensorBoard log after a failure, whatever their last flush says."""
    with contextlib.suppress(OSError, RuntimeError):
        metrics.close()
    if logger is not None:
        with contextlib.suppress(OSError, RuntimeError):
            logger.close()


def _both(first, second):
    def call(row: dict) -> None:
        first(row)
        second(row)
    return call


def _open_log(recorded: dict, start: Checkpoint | None, metrics_path: Path):
    """The run's TensorBoard logger (None without one). A resumed run purges what its log holds
    after the checkpoint; a log that is new (or lost) first gets the rows metrics.csv keeps."""
    if TENSORBOARD not in recorded:
        return None
    log_dir = Path(recorded[TENSORBOARD])
    if start is not None and has_events(log_dir):
        # Steps after the last row metrics.csv keeps: a closing row the resume dropped included.
        return RunLogger(log_dir, purge_step=_last_round(metrics_path, start.round) + 1)
    logger = RunLogger(log_dir, purge_step=0)
    if start is not None:
        try:
            for row in iter_metrics(metrics_path):
                logger.log_row(row)
        except BaseException:
            logger.close()
            raise
    return logger


def _last_round(metrics_path: Path, default: int) -> int:
    """The round of the last row of a metrics.csv (``default`` when it has none): its tail is
    read, never the whole file."""
    with open(metrics_path, "rb") as handle:
        size = handle.seek(0, os.SEEK_END)
        handle.seek(max(0, size - 65536))
        lines = [line for line in handle.read().decode("utf-8", "replace").splitlines() if line.strip()]
    if len(lines) < 2 and size <= 65536:  # the header alone
        return default
    try:
        return int(float(next(csv.reader([lines[-1]]))[0]))
    except (ValueError, IndexError, StopIteration):
        return default


def _end_log(logger, info: dict, rounds_done: int | None) -> None:
    """The run has ended: its configuration as text and hparams (the log folder itself left out)."""
    if logger is not None:
        logger.finish({k: v for k, v in info.items() if k != TENSORBOARD}, status=info["status"], step=rounds_done)


def _finish(built: BuiltRun, work: Path, *, status: str, rounds_done: int | None, diverged_at: int | None = None,
            curve: bool = True, recorded: dict | None = None) -> dict:
    """config.json's final content (returned) and the figures."""
    info = {**built.resolved, "status": status, "rounds_done": rounds_done, **(recorded or {})}
    if diverged_at is not None:
        info["diverged_at_round"] = diverged_at
    if status == "interrupted":
        info["interrupted_after_round"] = rounds_done
    write_json(work / CONFIG, info)
    if not curve:
        (work / "curve.png").unlink(missing_ok=True)  # a resumed run's copy of an older one
        return info
    rows = read_rows_for_plot(work / METRICS)
    if rows:
        _plot(built, rows, work)
    return info


def _plot(built: BuiltRun, rows: list[dict], work: Path) -> None:
    title = f"{built.algorithm.name} on {built.problem.name}, {built.participation.name} participation"
    if "test_accuracy" in rows[0]:  # neural networks: accuracy and losses
        plot_training_curves({built.algorithm.name: rows}, work / "curve.png", title=title)
    else:
        plot_curve(rows, work / "curve.png", title)
    if hasattr(built.problem, "label_histograms"):  # clients hold labelled data: show the split
        plot_label_histograms(built.problem.label_histograms(), work / "partition.png")


def read_rows_for_plot(path: Path, max_rows: int = PLOT_POINTS) -> list[dict]:
    """At most ``max_rows`` rows of a metrics.csv, evenly thinned (the last one always kept),
    with numbers as floats; read twice, streaming, so memory does not grow with the file."""
    with open(path, newline="") as handle:
        count = sum(1 for _ in csv.reader(handle)) - 1
    if count <= 0:
        return []
    stride = max(1, math.ceil(count / max_rows))
    rows = []
    with open(path, newline="") as handle:
        for k, row in enumerate(csv.DictReader(handle)):
            if k % stride == 0 or k == count - 1:
                rows.append({key: _number(value) for key, value in row.items()})
    return rows


def _number(text: str | None) -> float:
    try:
        return float(text) if text else math.nan
    except ValueError:
        return math.nan


def _stopped(folder: Path) -> bool:
    """A run stopped by a signal (SIGTERM, Ctrl-C) and published so: its config.json says
    ``interrupted`` and its checkpoint is there to continue from. A folder that is not a run's
    (or unreadable) is not one; open_output has judged it already."""
    try:
        info = _read_json(folder / CONFIG) if (folder / CONFIG).is_file() else None
    except ConfigError:
        return False
    return isinstance(info, dict) and info.get("status") == "interrupted" and (folder / CHECKPOINT).is_file()


def read_config(folder_or_path: str | Path) -> dict:
    """The JSON object in a run folder's config.json (or in the file given), read with the size
    guard: the one reader of config.json. ConfigError, one line, if it is missing, larger than
    1 MiB, not JSON or not an object."""
    path = Path(folder_or_path)
    if path.is_dir():
        path = path / CONFIG
    data = _read_json(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object, got {type(data).__name__}; not a focusfl config")
    return data


def _read_json(path: Path) -> Any:
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise ConfigError(f"{path} is larger than 1 MiB; it is not a focusfl config")
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc).splitlines()[0]
        raise ConfigError(f"cannot read {str(path)!r}: {reason}") from None


def is_run_folder(folder: str | Path) -> bool:
    """A folder with a run's metrics.csv and config.json (published, any status)."""
    return (Path(folder) / METRICS).is_file() and (Path(folder) / CONFIG).is_file()


def run_state(folder: Path, key: str, expected: dict | None = None) -> str:
    """'done' (complete or diverged, under run key ``key``), 'resume' (a checkpoint to continue
    from) or 'new' (nothing usable: run it from the start). ``expected``: the run's resolved
    config as it was asked for (see ``as_requested``). A config.json that is there but cannot be
    read (too large, not JSON) is a ConfigError: a published run folder always has a good one."""
    partial = folder.parent / f".{folder.name}{PARTIAL_SUFFIX}"
    waiting = waiting_output(folder)
    if waiting is not None:
        folder = waiting  # a finished run whose publication was cut short: the next writer publishes it
    elif (partial / CHECKPOINT).is_file() and (read_marker(partial) or {}).get("state") == "partial":
        return "resume"  # a killed run: newer than anything published in folder
    if not (folder / CONFIG).is_file():
        return "new"
    info = read_config(folder)
    if run_key(as_requested(info, expected)) != key:
        return "new"
    if info.get("status") in FINISHED:
        return "done"
    if info.get("status") == INTERRUPTED and (folder / CHECKPOINT).is_file():
        return "resume"
    return "new"


def write_finished(work: Path, config: dict, rows: list[dict], *, status: str, rounds_done: int,
                   columns: list[str] | None = None, title: str | None = None) -> None:
    """A finished run's files into the partial folder ``work``, as ``focusfl run`` writes them:
    metrics.csv (``rows``), config.json (``config``: the run keys of runs.config.record, with
    ``status`` and ``rounds_done``) and, with a ``title``, curve.png. For runs computed elsewhere
    (a Flower federation); the caller publishes the folder."""
    write_csv(work / METRICS, rows, columns)
    write_json(work / CONFIG, {**config, "status": status, "rounds_done": rounds_done})
    if rows and title is not None:
        plot_curve(rows, work / "curve.png", title)


def _clear(work: Path) -> None:
    """Empty the partial folder (it is focusfl's own), keeping its marker."""
    for entry in work.iterdir():
        if entry.name == MARKER:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()

"""Where a sweep's runs execute: this process, a local process pool, or a Ray cluster.

An executor only moves tasks and outcomes: every run is ``run_task``, which calls
``run_to_folder`` or ``resume_folder`` exactly as ``focusfl run`` does, so a run's files are the
same bytes whichever executor ran it, given the same torch thread count (``DEFAULT_THREADS``).

- ``local`` with one worker runs the tasks here, one after another.
- ``local`` with K workers uses ``concurrent.futures.ProcessPoolExecutor`` with the ``spawn``
  context (a fork of a process that has started torch's thread pools is unsafe); each worker
  sets its own torch thread count, ignores Ctrl-C while idle, and is stopped with SIGTERM (a
  run then saves a checkpoint at the end of its round) when the sweep stops or dies.
- ``ray`` submits ``ray.remote`` tasks to a cluster (``ray.init(address=...)``), a run or a
  batch of runs each (the local executor's batches). A task asks Ray for what it needs:
  ``cpus_per_task`` CPUs (default: its torch threads) and ``gpus_per_task`` GPUs (fractional:
  0.25 packs four tasks on a GPU); Ray then places it and sets its ``CUDA_VISIBLE_DEVICES`` to the
  GPU it assigned, so a run on ``cuda`` computes there and never on a GPU another
  task holds. A task writes its run folders in place when the sweep folder is visible on its node
  (one machine, or a shared file system); otherwise it runs in a temporary folder and ships the
  files back to the driver, which publishes them.
  A task lost with its node (or its worker process) is run again by Ray, at most ``retries``
  times, and the new attempt resumes each run from the checkpoint the lost one left
  (``checkpoint_every``), so a lost node costs the rounds since its last checkpoint and the files
  are the bytes of a sweep that lost none. Where the sweep folder is shared the checkpoint is in
  it; a shipped run hands each checkpoint, as it is written, to the sweep's tracker actor on the
  driver's node (ray_tracker.py), and the next attempt installs the latest one, its files'
  sizes and SHA-256 checked, in its temporary folder. A shipped run whose task failed or was
  stopped has that checkpoint put in the sweep folder (a partial run folder, as a killed run
  leaves it), and a sweep run again hands it to the tracker before the run's task starts.
- Ctrl-C (SIGINT), SIGTERM or SIGHUP to a Ray sweep cancels its tasks: Ray delivers SIGINT to
  each run in flight, which saves a checkpoint at the end of its round and is published as
  interrupted (a shipped one by the driver); queued tasks never start. The sweep then ends as on
  one machine (``SweepStopped``), counting the runs stopped with a checkpoint.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import math
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable, Iterator

import torch

import focusfl

from .. import __version__
from ..algorithms.importing import ChangedCode, algorithm_imports, planned_code, user_code_error, user_tracebacks
from ..errors import ConfigError, DataError, DiskFullError, FocusflError
from ..io.atomic import disk_full, full_disk, open_atomic
from ..io.folders import LOCK_SUFFIX, MARKER, PARTIAL_SUFFIX, _sibling, open_output, read_marker
from ..runs.batch import BatchEntry, BatchOutcome, run_batch_to_folders
from ..runs.checkpoint import CHECKPOINT
from ..runs.config import BATCH_RUNS, RunConfig
from ..runs.folder import (
    METRICS,
    Interrupted,
    OnCheckpoint,
    _clear,
    _SIGNAL_CODES,
    resume_folder,
    run_state,
    run_to_folder,
)
from ..signals import handled
from ..threads import DEFAULT_THREADS
from .ray_tracker import Tracker

EXECUTORS = ("local", "ray")
RAY_RETRIES = 3  # Ray's own default for a task lost with its node or worker (max_retries)
CONNECT_SECONDS = 5.0  # --address HOST:PORT: how long to wait for a Ray head to accept a connection


@dataclass(frozen=True)
class RunTask:
    """One run to execute: its configuration (RunConfig fields), its folder, how to start it."""

    key: str
    config: dict
    out: str
    resume: bool = False
    checkpoint_every: int | None = None
    ship: bool = False  # run in a temporary folder and return the files (no shared file system)
    # The caller's permission to import a user's model (run_sweep(allow_model_import=True)); never
    # read from a file. With Ray, the model's module must be importable on the nodes.
    allow_model_import: bool = False
    # The sweep command's permission to import the user's algorithm code (--allow-algorithm-import,
    # algorithms/importing.py), passed on to the worker that builds the run; never read from a file.
    allow_algorithm_import: bool = False
    # {import target: SHA-256} of the user's algorithm code the run was planned (and keyed) with
    # (algorithms/importing.py recorded_code): the worker refuses to build other code.
    algorithm_code: dict | None = None
    # --debug: an error of the user's algorithm code prints its traceback in the worker (stderr).
    user_tracebacks: bool = False
    # The size of the batches the sweep asked for (runs/batch.py), recorded in the run's config.json
    # (None: not recorded; a Ray task).
    batch_runs: int | None = None


def run_task(task: RunTask, on_checkpoint: OnCheckpoint | None = None) -> dict:
    """Execute one run (:func:`_run_task`) with the permission to import algorithm code its task
    carries, and only the code it was planned with. ``on_checkpoint``: run_to_folder's."""
    if task.ship:
        return _shipped(task, {}, on_checkpoint)[0][0]
    with algorithm_imports(task.allow_algorithm_import), planned_code(task.algorithm_code or {}), \
            user_tracebacks(task.user_tracebacks):
        return _run_task(task, on_checkpoint)


def _run_task(task: RunTask, on_checkpoint: OnCheckpoint | None = None) -> dict:
    """Execute one run; never raises for the run's own failure: the outcome says what happened
    (``status`` complete / diverged / interrupted / failed, ``error``, ``seconds``; ``restarted``:
    why a run that was to be resumed ran again from its start)."""
    started = time.perf_counter()
    config = RunConfig.from_dict(task.config, where=f"run {task.key}")
    extra = None if task.batch_runs is None else {BATCH_RUNS: task.batch_runs}
    options = dict(checkpoint_every=task.checkpoint_every, curve=False, allow_model_import=task.allow_model_import,
                   extra=extra, on_checkpoint=on_checkpoint)
    try:
        if task.resume:
            try:
                result = resume_folder(task.out, **options)
            except DataError as exc:  # an unreadable checkpoint: run it again from the start, and say so
                result = run_to_folder(config, task.out, restart=True, **options)
                return _outcome(result, started, restarted=str(exc).splitlines()[0] if str(exc) else "DataError")
        else:
            # run_state found no checkpoint to lose: clear whatever partial folder is there.
            result = run_to_folder(config, task.out, restart=True, **options)
        return _outcome(result, started)
    except Interrupted as exc:
        return {"status": "interrupted", "error": str(exc), "seconds": time.perf_counter() - started,
                "exit_code": exc.exit_code}
    except FocusflError as exc:
        _stop_on_full_disk(exc, task)
        _stop_on_sweep_error(exc)
        return {"status": "failed", "error": str(exc), "seconds": time.perf_counter() - started}
    except MemoryError:
        return {"status": "failed", "error": "out of memory", "seconds": time.perf_counter() - started}
    except Exception as exc:  # a bug or an environment fault in one run must not end the sweep
        _stop_on_full_disk(exc, task)
        return {"status": "failed", "error": _error_text(exc), "seconds": time.perf_counter() - started}


@dataclass(frozen=True)
class BatchTask:
    """Runs of one batch key (runs/batch.py) to step together, ``batch_runs`` the size asked for
    (recorded in each run's config.json); each keeps its own folder and outcome."""

    tasks: tuple[RunTask, ...]
    batch_runs: int


def run_batch_task(batch: BatchTask, on_checkpoint: OnCheckpoint | None = None) -> list[dict]:
    """Execute a batch of runs; an outcome per run, as run_task gives it (a fault of the batch
    itself fails each of its runs; a full disk ends the sweep). The batch's runs come from one
    command, so its first task carries their permission to import algorithm code; each run
    builds only the code it was planned with. ``on_checkpoint``: run_to_folder's, for each run."""
    planned = {target: sha for task in batch.tasks for target, sha in (task.algorithm_code or {}).items()}
    with algorithm_imports(batch.tasks[0].allow_algorithm_import), planned_code(planned), \
            user_tracebacks(batch.tasks[0].user_tracebacks):
        return _run_batch_task(batch, on_checkpoint)


def _run_batch_task(batch: BatchTask, on_checkpoint: OnCheckpoint | None = None) -> list[dict]:
    started = time.perf_counter()
    first = batch.tasks[0]
    entries = [BatchEntry(RunConfig.from_dict(task.config, where=f"run {task.key}"), task.out, task.resume)
               for task in batch.tasks]
    try:
        outcomes = run_batch_to_folders(entries, batch_runs=batch.batch_runs, checkpoint_every=first.checkpoint_every,
                                        allow_model_import=first.allow_model_import, on_checkpoint=on_checkpoint)
    except Interrupted as exc:
        return [{"status": "interrupted", "error": str(exc), "seconds": time.perf_counter() - started,
                 "exit_code": exc.exit_code}] * len(batch.tasks)
    except BaseException as exc:
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        _stop_on_full_disk(exc, first)
        _stop_on_sweep_error(exc)
        error = "out of memory" if isinstance(exc, MemoryError) else _error_text(exc)
        return [{"status": "failed", "error": error, "seconds": time.perf_counter() - started}] * len(batch.tasks)
    for outcome in outcomes:  # the batch's other runs are published: they ran the planned code
        _stop_on_sweep_error(outcome.error)
    return [_batch_outcome(outcome, started) for outcome in outcomes]


def _batch_outcome(outcome: BatchOutcome, started: float) -> dict:
    extra = {"restarted": outcome.restarted} if outcome.restarted else {}
    if outcome.result is not None:
        return _outcome(outcome.result, started, **extra)
    error = outcome.error
    if isinstance(error, Interrupted):
        return {"status": "interrupted", "error": str(error), "seconds": time.perf_counter() - started,
                "exit_code": error.exit_code, **extra}
    return {"status": "failed", "error": _error_text(error), "seconds": time.perf_counter() - started, **extra}


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, FocusflError):
        return str(exc)
    error = user_code_error(exc)  # a user's algorithm raised: their file and line
    if error is not None:
        return str(error)
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"


def execute_item(item: RunTask | BatchTask) -> list[tuple[RunTask, dict]]:
    """A run or a batch of runs executed here: (task, outcome) per run."""
    if isinstance(item, BatchTask):
        return list(zip(item.tasks, run_batch_task(item)))
    return [(item, run_task(item))]


def _stop_on_full_disk(exc: BaseException, task: RunTask) -> None:
    """A full disk ends the sweep, in one line (every other run would fail the same way): the
    runs done and the checkpoints written stay, and the same command resumes once there is space."""
    if isinstance(exc, DiskFullError):
        raise exc
    if full_disk(exc):
        raise disk_full(task.out, exc) from None


def _stop_on_sweep_error(cause: BaseException | None) -> None:
    """What a run raises to end the whole sweep, in one line, raised again here: a full disk, or
    algorithm code edited since the runs were planned (their keys and folders name the planned
    code, and no run may publish results of other code under them); also when it comes wrapped
    from another process (a Ray task's error carries it as ``cause``)."""
    if isinstance(cause, (DiskFullError, ChangedCode)):
        raise cause from None


def _outcome(result, started: float, **extra) -> dict:
    status = "diverged" if result.diverged_at is not None else "complete"
    return {"status": status, "seconds": time.perf_counter() - started, "version": __version__, **extra}


def publish_shipped(task: RunTask, files: dict[str, bytes]) -> None:
    """Write a run folder that a remote task returned as bytes (atomically, like any run)."""
    with open_output(task.out, kind="run") as output:
        _clear(output.work)
        for name, data in files.items():
            if "/" in name or name.startswith("."):
                raise DataError(f"a remote run returned a file named {name!r}")
            (output.work / name).write_bytes(data)
        output.publish()


# One torch thread per worker unless told otherwise (focusfl/threads.py). Measured on this 2-core
# machine (the benchmark sweep, d = 40): two intra-op threads made small runs 5x slower, and they
# split reductions differently, so the bytes changed with the thread count. With one thread each,
# K workers write the bytes one worker writes; give big models more with --threads (each run's
# config.json records it).


# -- this machine --------------------------------------------------------------------------------
def _ignore_interrupt(signum, frame) -> None:
    """An idle worker ignores Ctrl-C (the sweep decides); a run replaces this handler with its own."""


def _init_worker(threads: int, parent: int) -> None:
    torch.set_num_threads(threads)
    signal.signal(signal.SIGINT, _ignore_interrupt)
    if sys.platform.startswith("linux"):
        # If the sweep dies (SIGKILL, OOM), its workers get SIGTERM: a run saves a checkpoint at
        # the end of its round and stops, instead of finishing while a rerun starts beside it.
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


# How long a stopped worker has to finish its round and write its checkpoint before it is killed
# (its run then resumes from the checkpoint before). Without a bound, a worker that never exits
# (seen in CI: the sweep printed its full-disk line, then waited 300 s at exit for a worker) keeps
# the sweep, and whoever reads its output, waiting for ever.
STOP_GRACE_SECONDS = 60.0
RESEND_SECONDS = 0.5


def _terminated(signum, frame) -> None:
    """SIGTERM or SIGHUP to a sweep with worker processes: stop them (each run checkpoints at the
    end of its round; one that does not end its round is stopped by the SIGTERM sent again), then
    end as the signal asks, instead of leaving the workers running."""
    raise Interrupted(f"{signal.Signals(signum).name}: the sweep stopped its workers; the same command "
                      "continues it", 128 + signum)


def _stop_workers(processes, grace: float = STOP_GRACE_SECONDS) -> None:
    """SIGTERM to every live worker (a run checkpoints and stops at the end of its round), then
    SIGKILL to those still alive ``grace`` seconds later; returns when all have exited.

    SIGTERM is sent again every RESEND_SECONDS: a run's handler takes the first one, and its
    worker, idle once the run has stopped, would otherwise wait out the whole grace (a second
    SIGTERM only asks a run again to stop at the end of its round)."""
    deadline = time.monotonic() + grace
    alive = [process for process in processes if process.is_alive()]
    while alive and time.monotonic() < deadline:
        for process in alive:
            process.terminate()
        left = max(0.0, deadline - time.monotonic())
        multiprocessing.connection.wait([process.sentinel for process in alive], min(RESEND_SECONDS, left))
        alive = [process for process in alive if process.is_alive()]
    for process in alive:
        process.kill()
    for process in processes:
        process.join()


class LocalExecutor:
    def __init__(self, workers: int, threads: int | None):
        if workers < 1:
            raise ConfigError(f"--workers must be >= 1, got {workers}")
        self.workers = workers
        self.threads = threads or DEFAULT_THREADS
        self.slots = workers

    def describe(self) -> str:
        if self.workers == 1:
            return f"this process, {self.threads} thread(s)"
        return f"{self.workers} worker processes x {self.threads} thread(s)"

    def run(self, tasks: Iterable[RunTask | BatchTask]) -> Iterator[tuple[RunTask, dict]]:
        """(task, outcome) per run; ``tasks`` may hold batches of runs (BatchTask)."""
        tasks = list(tasks)
        if not tasks:
            return
        if self.workers == 1:
            torch.set_num_threads(self.threads)
            for item in tasks:
                done = execute_item(item)
                yield from done
                if any(outcome["status"] == "interrupted" for _, outcome in done):  # Ctrl-C: checkpoints saved; stop
                    return
            return
        pool = ProcessPoolExecutor(min(self.workers, len(tasks)), mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_init_worker, initargs=(self.threads, os.getpid()))
        futures = {pool.submit(execute_item, item): item for item in tasks}
        try:
            with handled((signal.SIGTERM, signal.SIGHUP), _terminated, keep_ignored=True):
                yield from self._results(futures)
        except BaseException:  # Ctrl-C, SIGTERM, a full disk, or the consumer stopped: stop the runs in flight
            processes = list((getattr(pool, "_processes", None) or {}).values())  # shutdown forgets them
            pool.shutdown(wait=False, cancel_futures=True)
            _stop_workers(processes)
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    @staticmethod
    def _results(futures) -> Iterator[tuple[RunTask, dict]]:
        for future in as_completed(futures):
            item = futures[future]
            try:
                yield from future.result()
            except BrokenProcessPool:
                died = {"status": "failed", "error": "its worker process died (killed, or out of memory)"}
                for task in (item.tasks if isinstance(item, BatchTask) else (item,)):
                    yield task, died

    def check(self) -> None:
        """Nothing to reach before the runs: worker processes start with them."""

    def close(self) -> None:
        """Nothing to release: ``run`` shuts its process pool down itself."""


# -- Ray -----------------------------------------------------------------------------------------
def ray_runtime_env() -> dict:
    """For a Ray started here: its workers import the focusfl this process imported."""
    root = str(Path(focusfl.__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    return {"env_vars": {"PYTHONPATH": path}}


def _ray_item(item: RunTask | BatchTask, threads: int, tracker=None) -> dict:
    """A Ray task: a run or a batch of runs, in place when the sweep folder is visible here, else
    shipped back. Returns ``outcomes`` (one per run, as run_task gives it) and where it ran:
    ``node`` (Ray's node id), ``gpus`` (the GPU ids Ray assigned it: its CUDA_VISIBLE_DEVICES),
    ``started`` / ``ended`` (wall-clock seconds), ``resumed_after_loss`` (runs this attempt
    resumed from a checkpoint a lost attempt left)."""
    import ray

    started = time.time()
    tasks = item.tasks if isinstance(item, BatchTask) else (item,)
    if tracker is not None:  # fire and forget: a lost tracker costs the status file, not the runs
        tracker.start.remote([task.key for task in tasks], ray.get_runtime_context().get_node_id())
    if not ray.get_gpu_ids():
        # A task that asked for no GPU computes on none, whatever Ray's version does with its
        # CUDA_VISIBLE_DEVICES (Ray says it will stop hiding the GPUs from such tasks): it never
        # computes on a GPU another task holds.
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    torch.set_num_threads(threads)
    try:
        shared = sees_sweep_folder(Path(tasks[0].out).parent.parent)
    except ConfigError as exc:
        outcomes, resumed = [{"status": "failed", "error": str(exc), "seconds": 0.0} for _ in tasks], []
    else:
        outcomes, resumed = _in_place(item) if shared else _shipped(item, _held(ray, tracker, tasks),
                                                                     _shipping_to(ray, tracker))
    if any(outcome["status"] == "interrupted" and outcome.get("exit_code") != _SIGNAL_CODES[signal.SIGINT]
           for outcome in outcomes):
        # A signal stopped the runs (a node shutting down: preemption, a reboot) and they saved
        # their checkpoints. The worker exits as a lost one does, so that Ray runs the task again
        # (on another node), and the new attempt resumes them. SIGINT is the sweep's own stop
        # (ray.cancel, or Ctrl-C where the workers share its terminal): the outcomes go back.
        os._exit(1)
    for outcome in outcomes:
        outcome.setdefault("version", __version__)
    context = ray.get_runtime_context()
    return {"outcomes": outcomes, "node": context.get_node_id(), "gpus": [str(g) for g in ray.get_gpu_ids()],
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "assigned": context.get_assigned_resources(),
            "started": started, "ended": time.time(), "resumed_after_loss": resumed}


SHIP_RUNS = "FOCUSFL_SHIP_RUNS"  # "1" in a node's environment: its tasks ship their runs back


def sees_sweep_folder(sweep_folder: Path) -> bool:
    """Whether a task here writes its runs in the sweep folder: the folder (its marker) is
    visible here, unless this node's environment says FOCUSFL_SHIP_RUNS=1 (a node that sees the
    folder read-only, slowly, or sees another folder at that path); "0" or unset: look.
    ConfigError (one line) for another value."""
    ship = os.environ.get(SHIP_RUNS, "")
    if ship not in ("", "0", "1"):
        raise ConfigError(f"{SHIP_RUNS} must be 0 or 1 on node {socket.gethostname()}, got {ship!r}")
    return ship != "1" and (sweep_folder / MARKER).is_file()


def _in_place(item: RunTask | BatchTask) -> tuple[list[dict], list[str]]:
    """The runs of ``item`` in their folders of the shared sweep folder: (outcomes, the runs
    resumed from a checkpoint a lost attempt left)."""
    tasks = item.tasks if isinstance(item, BatchTask) else (item,)
    # A task run again after its node was lost finds the checkpoints the lost attempt left: it
    # resumes from them (the folder's state now, not the one the sweep planned with).
    for task in tasks:
        _wait_for_writer(Path(task.out))
    fresh = tuple(_as_found(task) for task in tasks)
    resumed = [task.key for task, planned in zip(fresh, tasks) if task.resume and not planned.resume]
    if isinstance(item, BatchTask):
        return run_batch_task(replace(item, tasks=fresh)), resumed
    return [run_task(fresh[0])], resumed

LOST_WRITER_SECONDS = 120.0  # how long a retried task waits for the lost attempt's worker to be gone


def _wait_for_writer(out: Path) -> None:
    """Wait, a bounded time, until no process holds the run folder's lock: the worker of a lost
    attempt may still be dying when Ray starts the new one (past the bound, the run fails in one
    line naming the holder, as any second writer does)."""
    lock = _sibling(out, LOCK_SUFFIX)
    deadline = time.monotonic() + LOST_WRITER_SECONDS
    while time.monotonic() < deadline:
        try:
            fd = os.open(lock, os.O_RDONLY)
        except OSError:
            return  # no lock file: nobody writes the folder
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        finally:
            os.close(fd)
        time.sleep(0.5)


def _shipped(item: RunTask | BatchTask, held: dict[str, dict], on_checkpoint: OnCheckpoint | None
             ) -> tuple[list[dict], list[str]]:
    """The runs of ``item`` in a temporary folder, each run's files returned as bytes (``files``)
    for the driver to publish (complete, diverged, or interrupted with its checkpoint): a node
    without the sweep folder still steps a batch together. A run with a checkpoint in ``held``
    (folder_snapshot's, from the tracker) resumes from it, once its files are checked; one whose
    files do not check out runs from round 0 and says why (``restarted``). ``on_checkpoint``:
    told of each checkpoint the runs write. (outcomes, the runs resumed after a lost attempt.)"""
    tasks = item.tasks if isinstance(item, BatchTask) else (item,)
    with tempfile.TemporaryDirectory(prefix="focusfl-ship-") as tmp:
        here, restarted = [], {}
        for task in tasks:
            out = Path(tmp) / task.key
            try:
                resume = task.key in held and install_checkpoint(out, checked_files(held[task.key], task.key))
            except DataError as exc:
                restarted[task.key], resume = str(exc), False
            if task.resume and task.key not in held:
                restarted[task.key] = "its checkpoint did not reach this node (the sweep's tracker holds none)"
            here.append(replace(task, out=str(out), ship=False, resume=resume))
        if isinstance(item, BatchTask):
            outcomes = run_batch_task(replace(item, tasks=tuple(here)), on_checkpoint)
        else:
            outcomes = [run_task(here[0], on_checkpoint)]
        outcomes = [dict(outcome) for outcome in outcomes]  # a batch's fault is one outcome for all its runs
        for task, outcome in zip(here, outcomes):
            if task.key in restarted:
                outcome.setdefault("restarted", restarted[task.key])
            if outcome["status"] in ("complete", "diverged", "interrupted") and Path(task.out).is_dir():
                outcome["files"] = _files_of(Path(task.out))
    resumed = [task.key for task, planned in zip(here, tasks) if task.resume and not planned.resume]
    return outcomes, resumed


def _files_of(folder: Path) -> dict[str, bytes]:
    """A run folder's files (focusfl's own hidden ones, its marker and temporary files, left out)."""
    return {entry.name: entry.read_bytes() for entry in sorted(folder.iterdir())
            if entry.is_file() and not entry.is_symlink() and not entry.name.startswith(".")}


def folder_snapshot(folder: Path, round_done: int, metrics_bytes: int | None = None) -> dict:
    """What a run resumes from, as bytes that travel: the files of its (partial) run folder
    (config.json, metrics.csv cut to ``metrics_bytes``, checkpoint.pt, a client table), each
    file's size and SHA-256, and the round of the checkpoint (-1: not known)."""
    files = _files_of(folder)
    if metrics_bytes is not None and METRICS in files:
        files[METRICS] = files[METRICS][:metrics_bytes]  # rows past the checkpoint are cut on resume anyway
    return {"round": round_done, "files": files,
            "digests": {name: [len(data), hashlib.sha256(data).hexdigest()] for name, data in files.items()}}


def checked_files(snapshot: dict, key: str) -> dict[str, bytes]:
    """The files of a checkpoint that travelled (folder_snapshot's dict), each one's size and
    SHA-256 checked against what the writer recorded; DataError (one line) if any differs."""
    where = f"the shipped checkpoint of run {key[:12]}"
    files, digests = snapshot.get("files"), snapshot.get("digests")
    if not isinstance(files, dict) or not isinstance(digests, dict) or set(files) != set(digests) or \
            not all(isinstance(entry, list) and len(entry) == 2 for entry in digests.values()):
        raise DataError(f"{where} is not a checkpoint focusfl shipped")
    if CHECKPOINT not in files:
        raise DataError(f"{where} holds no {CHECKPOINT}")
    for name, data in files.items():
        if not isinstance(name, str) or "/" in name or name.startswith(".") or not isinstance(data, bytes):
            raise DataError(f"{where} holds a file named {name!r}")
        size, digest = digests[name]
        if len(data) != size:
            raise DataError(f"{where}: {name} is {len(data)} bytes, {size} were written")
        if hashlib.sha256(data).hexdigest() != digest:
            raise DataError(f"{where}: {name} has changed since it was written (SHA-256 differs)")
    return files


def install_checkpoint(out: Path, files: dict[str, bytes]) -> bool:
    """``files`` (checked_files') as the partial folder of run folder ``out``, as a killed run
    leaves it, for resume_folder to continue from: each file written atomically, the
    checkpoint last (until then the folder holds the previous one, which the longer metrics.csv
    still fits). True; ConfigError (one line) when the folder cannot be written."""
    with open_output(out, kind="run") as output:
        for name in sorted(files, key=lambda name: name == CHECKPOINT):
            with open_atomic(output.work / name, "wb") as handle:
                handle.write(files[name])
    return True


SHIP_SECONDS = 60.0  # how long a shipped run waits for its checkpoint to reach the tracker


def _shipping_to(ray, tracker) -> OnCheckpoint | None:
    """A shipped run's on_checkpoint: each checkpoint handed to the tracker on the driver's node,
    and waited for (Ray's object transfer), so that it is there before the run goes on; a
    tracker lost or slow costs this checkpoint, not the run (Ray's next attempt would start
    from an earlier one, or from round 0)."""
    if tracker is None:
        return None

    def ship(out: Path, work: Path, checkpoint) -> None:
        snapshot = folder_snapshot(work, checkpoint.round, checkpoint.metrics_bytes)
        try:
            ray.get(tracker.keep.remote(out.name, snapshot), timeout=SHIP_SECONDS)
        except Exception:  # noqa: BLE001 - see the docstring
            pass

    return ship


def _held(ray, tracker, tasks: Iterable[RunTask]) -> dict[str, dict]:
    """The checkpoints the tracker holds for ``tasks``' runs (none without a tracker)."""
    if tracker is None:
        return {}
    try:
        return ray.get(tracker.latest.remote([task.key for task in tasks]), timeout=SHIP_SECONDS)
    except Exception:  # noqa: BLE001 - a tracker lost: the runs start from round 0
        return {}


def _as_found(task: RunTask) -> RunTask:
    if not task.resume and run_state(Path(task.out), task.key) == "resume":
        return replace(task, resume=True)
    return task


def resumable_snapshot(out: Path) -> dict | None:
    """The files a run in the sweep folder resumes from (folder_snapshot's dict): those of its
    partial folder when a killed run left its checkpoint there, else of the published folder of
    an interrupted run; None when neither holds a checkpoint."""
    partial = _sibling(out, PARTIAL_SUFFIX)
    if (partial / CHECKPOINT).is_file() and (read_marker(partial) or {}).get("state") == "partial":
        return folder_snapshot(partial, -1)
    if (out / CHECKPOINT).is_file():
        return folder_snapshot(out, -1)
    return None


def check_resource(value: float | None, option: str) -> float | None:
    """A task's request of CPUs or GPUs as Ray takes it: a number > 0, whole above 1 (Ray packs
    fractions of one CPU or GPU, not of several); ConfigError (one line) otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ConfigError(f"{option} must be a positive number, got {value!r}")
    if value > 1 and value != int(value):
        raise ConfigError(f"{option} above 1 must be a whole number (Ray shares one device between tasks, "
                          f"not several), got {value:g}")
    return float(value)


class RayExecutor:
    def __init__(self, address: str | None, threads: int | None, *, gpus_per_task: float | None = None,
                 cpus_per_task: float | None = None, retries: int = RAY_RETRIES):
        try:
            import ray  # noqa: F401
        except ImportError:
            raise ConfigError("--executor ray needs Ray: pip install ray, or '.[ray]' in a clone of focusfl "
                              "(Flower's simulation extra brings it too)") from None
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ConfigError(f"--retries must be a whole number >= 0, got {retries!r}")
        self.address = address
        self.threads = threads or DEFAULT_THREADS
        self.gpus = check_resource(gpus_per_task, "--gpus-per-task")
        self.cpus = check_resource(cpus_per_task, "--cpus-per-task") or float(self.threads)
        self.retries = retries
        self.slots = 1
        self.placements: list[dict] = []  # where each task ran (node, GPUs, times), in the order received
        self.on_progress = None  # called with the runs running and where (run's docstring)
        self._started = False

    def describe(self) -> str:
        where = self.address or "a local Ray"
        gpus = f", {self.gpus:g} GPU" if self.gpus else ""
        return (f"Ray tasks on {where}, {self.cpus:g} CPU(s){gpus} and {self.threads} thread(s) each, "
                f"up to {self.retries} retries on a lost node")

    def check_devices(self, devices: Iterable[str]) -> None:
        """The runs' devices against the GPUs a task asks for, before anything is written: a run
        on ``cuda`` needs ``--gpus-per-task`` (a task that asks for none sees no GPU), and a task
        sees only the GPUs Ray assigned it, as ``cuda:0`` up (``cuda`` takes the first)."""
        for device in sorted(set(devices)):
            if device.startswith("cuda") and not self.gpus:
                raise ConfigError(f"device {device!r} on Ray needs --gpus-per-task (a task that asks Ray for no GPU "
                                  "sees none)")
            index = device.partition(":")[2]
            if index.isdigit() and int(index) >= max(1, int(self.gpus or 0)):
                raise ConfigError(f"device {device!r}: a Ray task sees only the GPU(s) Ray assigned it, from cuda:0; "
                                  "give device 'cuda'")

    def check(self) -> None:
        """Connect to the cluster ``--address`` names before anything is written: a wrong address
        is one line and leaves no folder behind; so is a GPU request no node can meet. (A local
        cluster without GPU requests starts with the first run.)"""
        import ray

        if self.gpus and self.address is None and not ray.is_initialized() and torch.cuda.device_count() == 0:
            raise ConfigError(f"--gpus-per-task {self.gpus:g}: this machine has no GPU for a local Ray; "
                              "give --address of a cluster with GPUs, or leave --gpus-per-task out")
        if self.address is not None or self.gpus:
            self._connect()

    def _connect(self):
        import ray

        if not ray.is_initialized():
            kwargs = {"include_dashboard": False, "log_to_driver": False}
            if self.address is None:
                kwargs["runtime_env"] = ray_runtime_env()
            else:
                _check_listening(self.address)
            try:
                ray.init(address=self.address, **kwargs)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise ConfigError(f"cannot connect to Ray at {self.address or 'a new local cluster'}: "
                                  f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
            self._started = True
        nodes = [node.get("Resources", {}) for node in ray.nodes() if node.get("Alive")]
        if self.gpus:
            most = max((node.get("GPU", 0) for node in nodes), default=0)
            if most < self.gpus:
                where = self.address or "the local Ray"
                raise ConfigError(f"--gpus-per-task {self.gpus:g}: no node of the Ray cluster at {where} has "
                                  f"{'a GPU' if most == 0 else f'{self.gpus:g} GPUs (at most {most:g})'}")
        self.slots = max(1, sum(int(_fits(node, self.cpus, self.gpus)) for node in nodes))
        return ray

    def run(self, tasks: Iterable[RunTask | BatchTask]) -> Iterator[tuple[RunTask, dict]]:
        """(task, outcome) per run; ``tasks`` may hold batches of runs (BatchTask). While they
        run, ``on_progress`` (when set) gets ``{"running": {run key: node}, "retried": n}`` every
        PROGRESS_SECONDS that it changed. SIGINT, SIGTERM or SIGHUP stops the sweep (see the
        module docstring): the runs in flight report, then SweepStopped is raised; a second
        signal stops it at once."""
        tasks = list(tasks)
        if not tasks:
            return
        ray = self._connect()
        # retry_exceptions stays off: a task raises only what ends the sweep (a full disk, changed
        # code); a run's own failure is its outcome. max_retries covers a lost worker or node.
        remote = ray.remote(_ray_item).options(num_cpus=self.cpus, num_gpus=self.gpus or 0,
                                               max_retries=self.retries, retry_exceptions=False)
        tracker = _start_tracker(ray)
        queue = iter(tasks)
        pending: dict = {}
        self._seen: dict = {}
        self._finished: set[str] = set()
        shown = None
        stop = _SweepStop()
        # At most a few tasks per slot in flight: the driver's wait stays cheap on 10^5 runs.
        limit = 2 * self.slots + 2
        try:
            with handled((signal.SIGINT, signal.SIGTERM, signal.SIGHUP), stop.ask, keep_ignored=True):
                while True:
                    if stop.signum is None:
                        for item in queue:
                            _hand_checkpoints(ray, tracker, item)
                            pending[remote.remote(item, self.threads, tracker)] = item
                            if len(pending) >= limit:
                                break
                    elif stop.deadline is None:
                        stop.cancel(ray, pending)
                    if not pending or stop.expired():
                        break
                    done, _ = ray.wait(list(pending), num_returns=1, timeout=PROGRESS_SECONDS)
                    if done or self.on_progress:
                        self._seen = _snapshot(ray, tracker, self._seen)
                    for ref in done:
                        item = pending.pop(ref)
                        yield from stop.marked(self._receive(ray, ref, item, tracker))
                    if self.on_progress:
                        progress = self._progress()
                        if progress != shown:
                            self.on_progress(progress)
                            shown = progress
            if stop.signum is not None:
                yield from stop.marked(self._abandon(ray, tracker, pending))
                pending = {}
                raise SweepStopped(f"{signal.Signals(stop.signum).name}: the sweep stopped its Ray tasks",
                                   128 + stop.signum)
        except BaseException:
            for ref in pending:
                ray.cancel(ref)
            raise
        finally:
            if tracker is not None:
                ray.kill(tracker)

    def _progress(self) -> dict:
        running = {key: node for key, (node, _) in self._seen.items() if key not in self._finished}
        return {"running": dict(sorted(running.items())),
                "retried": sum(attempts > 1 for _, attempts in self._seen.values())}

    def _receive(self, ray, ref, item: RunTask | BatchTask, tracker=None) -> list[tuple[RunTask, dict]]:
        tasks = item.tasks if isinstance(item, BatchTask) else (item,)
        self._finished = getattr(self, "_finished", set()) | {task.key for task in tasks}
        try:
            answer = ray.get(ref)
        except Exception as exc:  # the task or its worker died, retries spent; or the sweep cancelled it
            from ray.exceptions import TaskCancelledError

            _stop_on_sweep_error(getattr(exc, "cause", None))  # Ray wraps what the task raised
            _keep_checkpoints(ray, tracker, tasks)  # the same command resumes a shipped run from it
            if isinstance(exc, TaskCancelledError):
                return []  # stopped before it started: nothing ran
            text = str(exc).strip().splitlines()
            failed = {"status": "failed", "error": f"Ray: {type(exc).__name__}: {text[-1] if text else ''}"}
            return [(task, dict(failed)) for task in tasks]
        finally:
            if tracker is not None:  # fire and forget: the runs' checkpoints are of no more use
                tracker.forget.remote([task.key for task in tasks])
        placement = {key: answer[key] for key in ("node", "gpus", "visible", "assigned", "started", "ended",
                                                  "resumed_after_loss")}
        seen = getattr(self, "_seen", {})
        attempts = {task.key: seen.get(task.key, ("", 1))[1] for task in tasks}
        placement["retried"] = [key for key, count in attempts.items() if count > 1]
        self.placements.append({"runs": [task.key for task in tasks], **placement})
        return [(task, self._publish(task, outcome, placement)) for task, outcome in zip(tasks, answer["outcomes"])]

    def _abandon(self, ray, tracker, pending: dict) -> list[tuple[RunTask, dict]]:
        """The tasks still running when a stopped sweep stops waiting: ended (their workers
        killed), their shipped runs' latest checkpoints kept in the sweep folder; a run whose
        folder then holds a checkpoint is reported interrupted (resumable)."""
        stopped = []
        for ref, item in pending.items():
            ray.cancel(ref, force=True)
            tasks = item.tasks if isinstance(item, BatchTask) else (item,)
            _keep_checkpoints(ray, tracker, tasks)
            stopped += [(task, {"status": "interrupted", "error": "stopped with the sweep"}) for task in tasks
                        if run_state(Path(task.out), task.key) == "resume"]
        return stopped

    def _publish(self, task: RunTask, outcome: dict, placement: dict) -> dict:
        if outcome.get("version", __version__) != __version__:
            return {"status": "failed", "error": f"the Ray worker runs focusfl {outcome['version']}, "
                                                  f"this driver {__version__}: install the same version on every node"}
        outcome = {**outcome, "node": placement["node"]}
        if task.key in placement["resumed_after_loss"]:
            outcome["resumed_after_loss"] = True
        if task.key in placement["resumed_after_loss"] or task.key in placement["retried"]:
            outcome["retried"] = True
        files = outcome.pop("files", None)
        if files is not None and outcome["status"] in ("complete", "diverged", "interrupted"):
            try:
                publish_shipped(task, files)
            except FocusflError as exc:
                return {"status": "failed", "error": str(exc)}
        return outcome

    def close(self) -> None:
        if self._started:
            import ray

            ray.shutdown()
            self._started = False


PROGRESS_SECONDS = 2.0  # how often a Ray sweep asks its tracker which runs are running where


class SweepStopped(Interrupted):
    """A Ray sweep stopped by a signal, once every run it stopped was reported (run_sweep then
    says how many it can resume, as a sweep on one machine does)."""


class _SweepStop:
    """The first SIGINT/SIGTERM/SIGHUP to a Ray sweep: its tasks are cancelled (each run in flight
    stops at the end of its round with a checkpoint), and their outcomes awaited up to
    STOP_GRACE_SECONDS; a second signal stops the sweep at once."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.deadline: float | None = None

    def ask(self, signum, frame) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum

    def cancel(self, ray, pending: dict) -> None:
        for ref in pending:
            ray.cancel(ref)  # a running task gets SIGINT: its runs checkpoint and return
        self.deadline = time.monotonic() + STOP_GRACE_SECONDS

    def expired(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline

    def marked(self, received: Iterable[tuple[RunTask, dict]]) -> Iterator[tuple[RunTask, dict]]:
        """Outcomes as they are, but those of runs stopped by the sweep's signal exit with its status."""
        for task, outcome in received:
            if self.signum is not None and outcome["status"] == "interrupted":
                outcome = {**outcome, "exit_code": 128 + self.signum}
            yield task, outcome


def _hand_checkpoints(ray, tracker, item: RunTask | BatchTask) -> None:
    """Before a task starts: the checkpoints its runs to be resumed have in the sweep folder,
    handed to the tracker, so that a task on a node without the folder resumes them too."""
    if tracker is None:
        return
    for task in item.tasks if isinstance(item, BatchTask) else (item,):
        snapshot = resumable_snapshot(Path(task.out)) if task.resume else None
        if snapshot is None:
            continue
        try:  # waited for: the task's own look at the tracker comes after it
            ray.get(tracker.keep.remote(task.key, snapshot), timeout=SHIP_SECONDS)
        except Exception:  # noqa: BLE001 - a tracker lost: the run starts from round 0 there, and says so
            return


def _keep_checkpoints(ray, tracker, tasks: Iterable[RunTask]) -> None:
    """The latest checkpoints the tracker holds of ``tasks``' shipped runs, checked and put in the
    sweep folder (a partial run folder each, as a killed run leaves it), so that the same command
    resumes them; a checkpoint that does not check out, or a folder another writer holds, is left."""
    tasks = list(tasks)
    if tracker is None:
        return
    try:
        held = ray.get(tracker.latest.remote([task.key for task in tasks]), timeout=SHIP_SECONDS)
    except Exception:  # noqa: BLE001 - a tracker lost: nothing to keep
        return
    for task in tasks:
        if task.key in held and held[task.key]["round"] >= 0:  # -1: handed from the folder itself
            with contextlib.suppress(FocusflError):
                install_checkpoint(Path(task.out), checked_files(held[task.key], task.key))


TRACKER_SECONDS = 30.0  # how long a sweep waits for its tracker to start before going on without one


def _start_tracker(ray):
    """The sweep's tracker actor (ray_tracker.py), on the driver's node (it outlives any worker
    node lost), asking for no CPU; None where it cannot start there (the runs go on without it:
    no live status, and a lost shipped run starts again from round 0). The affinity is hard: a
    soft one was seen placing it on a worker node of a ``ray.cluster_utils.Cluster``, which then
    took the shipped checkpoints with it when it died."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    tracker = None
    try:
        here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
        tracker = ray.remote(Tracker).options(num_cpus=0, scheduling_strategy=here).remote()
        ray.get(tracker.snapshot.remote(), timeout=TRACKER_SECONDS)
        return tracker
    except Exception:  # a Ray without node affinity, a client connection, a node that cannot host it
        if tracker is not None:
            with contextlib.suppress(Exception):
                ray.kill(tracker)
        return None


def _snapshot(ray, tracker, last: dict) -> dict:
    if tracker is None:
        return last
    try:
        return ray.get(tracker.snapshot.remote(), timeout=PROGRESS_SECONDS)
    except Exception:  # a tracker busy or lost: the last snapshot stands
        return last


def _fits(node: dict, cpus: float, gpus: float | None) -> int:
    """How many tasks asking ``cpus`` CPUs and ``gpus`` GPUs a node with ``node`` resources runs at once."""
    counts = [int(node.get("CPU", 0) / cpus + 1e-9) if cpus else 10**6]
    if gpus:
        counts.append(int(node.get("GPU", 0) / gpus + 1e-9))
    return min(counts)


def _check_listening(address: str) -> None:
    """A HOST:PORT (or ray://HOST:PORT) where nothing listens is one line within seconds; Ray
    itself retries such an address for minutes. ``auto`` and other forms are left to Ray."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_SECONDS):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError(f"cannot connect to Ray at {address}: nothing answers there ({reason}); "
                          "start it with `ray start --head`, or give --address auto for a cluster on this "
                          "machine") from None


def make_executor(name: str, *, workers: int = 1, threads: int | None = None, address: str | None = None,
                  gpus_per_task: float | None = None, cpus_per_task: float | None = None, retries: int | None = None):
    if name not in EXECUTORS:
        raise ConfigError(f"--executor must be one of {', '.join(EXECUTORS)}, got {name!r}")
    if threads is not None and threads < 1:
        raise ConfigError(f"--threads must be >= 1, got {threads}")
    if name == "ray":
        return RayExecutor(address, threads, gpus_per_task=gpus_per_task, cpus_per_task=cpus_per_task,
                           retries=RAY_RETRIES if retries is None else retries)
    given = [option for option, value in (("--address", address), ("--gpus-per-task", gpus_per_task),
                                          ("--cpus-per-task", cpus_per_task), ("--retries", retries))
             if value is not None]
    if given:
        raise ConfigError(f"{given[0]} is for the tasks of a Ray cluster: give it with --executor ray")
    return LocalExecutor(workers, threads)

"""Where a sweep's runs execute: this process, a local process pool, or a Ray cluster.

An executor only moves tasks and outcomes: every run is ``run_task``, which calls
``run_to_folder`` or ``resume_folder`` exactly as ``focusfl run`` does, so a run's files are the
same bytes whichever executor ran it, given the same torch thread count (``DEFAULT_THREADS``).

- ``local`` with one worker runs the tasks here, one after another.
- ``local`` with K workers uses ``concurrent.futures.ProcessPoolExecutor`` with the ``spawn``
  context (a fork of a process that has started torch's thread pools is unsafe); each worker
  sets its own torch thread count, ignores Ctrl-C while idle, and is stopped with SIGTERM (a
  run then saves a checkpoint at the end of its round) when the sweep stops or dies.
- ``ray`` submits ``ray.remote`` tasks to a cluster (``ray.init(address=...)``). A task writes
  its run folder in place when the sweep folder is visible on its node (one machine, or a shared
  file system); otherwise it runs in a temporary folder and ships the files back to the driver,
  which publishes them (such a run cannot be resumed half way, only rerun).
"""
from __future__ import annotations

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
from ..io.atomic import disk_full, full_disk
from ..io.folders import MARKER, open_output
from ..runs.batch import BatchEntry, BatchOutcome, run_batch_to_folders
from ..runs.config import BATCH_RUNS, RunConfig
from ..runs.folder import Interrupted, _clear, resume_folder, run_to_folder
from ..signals import handled
from ..threads import DEFAULT_THREADS

EXECUTORS = ("local", "ray")
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


def run_task(task: RunTask) -> dict:
    """Execute one run (:func:`_run_task`) with the permission to import algorithm code its task
    carries, and only the code it was planned with."""
    with algorithm_imports(task.allow_algorithm_import), planned_code(task.algorithm_code or {}), \
            user_tracebacks(task.user_tracebacks):
        return _run_task(task)


def _run_task(task: RunTask) -> dict:
    """Execute one run; never raises for the run's own failure: the outcome says what happened
    (``status`` complete / diverged / interrupted / failed, ``error``, ``seconds``; ``restarted``:
    why a run that was to be resumed ran again from its start)."""
    started = time.perf_counter()
    config = RunConfig.from_dict(task.config, where=f"run {task.key}")
    extra = None if task.batch_runs is None else {BATCH_RUNS: task.batch_runs}
    try:
        if task.ship:
            with tempfile.TemporaryDirectory(prefix="focusfl-run-") as tmp:
                out = Path(tmp) / "run"
                result = run_to_folder(config, out, checkpoint_every=0, curve=False,
                                       allow_model_import=task.allow_model_import)
                files = {entry.name: entry.read_bytes() for entry in out.iterdir()
                         if entry.is_file() and not entry.name.startswith(".")}
            return _outcome(result, started, files=files)
        if task.resume:
            try:
                result = resume_folder(task.out, checkpoint_every=task.checkpoint_every, curve=False,
                                       allow_model_import=task.allow_model_import, extra=extra)
            except DataError as exc:  # an unreadable checkpoint: run it again from the start, and say so
                result = run_to_folder(config, task.out, checkpoint_every=task.checkpoint_every, restart=True,
                                       curve=False, allow_model_import=task.allow_model_import, extra=extra)
                return _outcome(result, started, restarted=str(exc).splitlines()[0] if str(exc) else "DataError")
        else:
            # run_state found no checkpoint to lose: clear whatever partial folder is there.
            result = run_to_folder(config, task.out, checkpoint_every=task.checkpoint_every, restart=True,
                                   curve=False, allow_model_import=task.allow_model_import, extra=extra)
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


def run_batch_task(batch: BatchTask) -> list[dict]:
    """Execute a batch of runs; an outcome per run, as run_task gives it (a fault of the batch
    itself fails each of its runs; a full disk ends the sweep). The batch's runs come from one
    command, so its first task carries their permission to import algorithm code; each run
    builds only the code it was planned with."""
    planned = {target: sha for task in batch.tasks for target, sha in (task.algorithm_code or {}).items()}
    with algorithm_imports(batch.tasks[0].allow_algorithm_import), planned_code(planned), \
            user_tracebacks(batch.tasks[0].user_tracebacks):
        return _run_batch_task(batch)


def _run_batch_task(batch: BatchTask) -> list[dict]:
    started = time.perf_counter()
    first = batch.tasks[0]
    entries = [BatchEntry(RunConfig.from_dict(task.config, where=f"run {task.key}"), task.out, task.resume)
               for task in batch.tasks]
    try:
        outcomes = run_batch_to_folders(entries, batch_runs=batch.batch_runs, checkpoint_every=first.checkpoint_every,
                                        allow_model_import=first.allow_model_import)
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


def _ray_task(task: RunTask, threads: int) -> dict:
    """A Ray task: one run, in place when the sweep folder is visible here, else shipped back."""
    torch.set_num_threads(threads)
    sweep_folder = Path(task.out).parent.parent
    if not (sweep_folder / MARKER).is_file():
        task = replace(task, ship=True, resume=False)
    outcome = run_task(task)
    outcome.setdefault("version", __version__)
    return outcome


class RayExecutor:
    def __init__(self, address: str | None, threads: int | None):
        try:
            import ray  # noqa: F401
        except ImportError:
            raise ConfigError("--executor ray needs Ray: pip install ray, or '.[ray]' in a clone of focusfl "
                              "(Flower's simulation extra brings it too)") from None
        self.address = address
        self.threads = threads or DEFAULT_THREADS
        self.slots = 1
        self._started = False

    def describe(self) -> str:
        where = self.address or "a local Ray"
        return f"Ray tasks on {where}, {self.threads} CPU(s) each"

    def check(self) -> None:
        """Connect to the cluster ``--address`` names before anything is written: a wrong address
        is one line and leaves no folder behind. (A local cluster starts with the first run.)"""
        if self.address is not None:
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
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.slots = max(1, cpus // self.threads)
        return ray

    def run(self, tasks: Iterable[RunTask]) -> Iterator[tuple[RunTask, dict]]:
        tasks = list(tasks)
        if not tasks:
            return
        ray = self._connect()
        remote = ray.remote(num_cpus=self.threads, max_retries=0)(_ray_task)
        queue = iter(tasks)
        pending: dict = {}
        # At most a few tasks per CPU in flight: the driver's wait stays cheap on 10^5 runs.
        limit = 2 * self.slots + 2
        try:
            while True:
                for task in queue:
                    pending[remote.remote(task, self.threads)] = task
                    if len(pending) >= limit:
                        break
                if not pending:
                    return
                done, _ = ray.wait(list(pending), num_returns=1)
                for ref in done:
                    task = pending.pop(ref)
                    yield task, self._receive(ray, ref, task)
        except BaseException:
            for ref in pending:
                ray.cancel(ref)
            raise

    def _receive(self, ray, ref, task: RunTask) -> dict:
        try:
            outcome = ray.get(ref)
        except Exception as exc:  # the task or its worker died
            _stop_on_sweep_error(getattr(exc, "cause", None))  # Ray wraps what the task raised
            text = str(exc).strip().splitlines()
            return {"status": "failed", "error": f"Ray: {type(exc).__name__}: {text[-1] if text else ''}"}
        if outcome.get("version", __version__) != __version__:
            return {"status": "failed", "error": f"the Ray worker runs focusfl {outcome['version']}, "
                                                  f"this driver {__version__}: install the same version on every node"}
        files = outcome.pop("files", None)
        if files is not None and outcome["status"] in ("complete", "diverged"):
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


def make_executor(name: str, *, workers: int = 1, threads: int | None = None, address: str | None = None):
    if name not in EXECUTORS:
        raise ConfigError(f"--executor must be one of {', '.join(EXECUTORS)}, got {name!r}")
    if threads is not None and threads < 1:
        raise ConfigError(f"--threads must be >= 1, got {threads}")
    if name == "ray":
        return RayExecutor(address, threads)
    if address is not None:
        raise ConfigError("--address is the address of a Ray cluster: give it with --executor ray")
    return LocalExecutor(workers, threads)

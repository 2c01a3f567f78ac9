"""One run: a RunConfig built into objects (:func:`build`, the only place a run's problem,
algorithm, step size, participation and work process are made and checked), and executed
(:func:`execute`: the round loop of engine/loop.py through ``simulate``).

``focusfl run``, every run of a sweep, a tune trial, a study of the report, a preset's run and
a federation's server build through here, so a setting means the same everywhere and a run's
resolved record (config.json) and its key come from one place.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from tqdm import tqdm

from ..algorithms import algorithm_record, algorithm_state_size, make_algorithm
from ..algorithms.base import check_work_process
from ..algorithms.base import RoundContext, State
from ..algorithms.importing import UserCodeError, algorithm_source, refuse_unpermitted, user_code_error
from ..engine import Resume, RunResult, simulate
from ..engine.tree import gather_rows
from ..engine.batched import BatchMember, run_batch
from ..device import DevicePolicy, device_policy, policy_applied, require_numerics
from ..errors import ConfigError, FocusflError
from ..limits import allocation_failure
from ..metrics import progress_metrics
from ..participation import make_participation
from ..privacy import check_privacy, dp_nonce, epsilon_bound, parse_dp, run_privacy
from ..problems import make_problem
from ..spec import parse_spec
from ..threads import client_workers, fixed_threads
from ..work import make_work
from .config import ASKED, DP_NONCE, DTYPES, RunConfig, as_requested, check_config, horizon_free_key, record, run_key, \
    state_budget
from .store import StateInMemory, check_state_memory, initial_state, reference_state

# The parts of a run, in the order build() makes them; an error raised while making one carries
# its name as ``exc.part`` (a sweep names its file's key by it): "work-algorithm" is an algorithm
# that cannot run the work process's step counts.
PARTS = ("config", "problem", "algorithm", "participation", "work", "work-algorithm")


@dataclass(frozen=True)
class BuiltRun:
    """A run made into objects: its record (with the problem's defaults filled in), the
    algorithm with its step size, the problem, the participation and the work process."""

    config: RunConfig
    algorithm: Any
    problem: Any
    participation: Any
    work: Any = None  # a focusfl.work process; None: fixed (every client does local_steps)
    asked: dict | None = None  # the problem as it was asked for, before any choice deferred to run time
    # config.json's ASKED block when the run was asked for before this build (a resumed run keeps
    # its own, with the rounds it now runs to); None: the block of ``config`` (runs.config.asked).
    asked_record: dict | None = None
    # A DP run recorded before the noise was keyed by a nonce (config.json with a dp and no
    # dp_nonce), resumed: its noise keyed by the seed alone, as its first rounds drew it, and its
    # config.json without a dp_nonce, as before (noise_as_recorded).
    legacy_key: bool = False

    @property
    def resolved(self) -> dict[str, Any]:
        """config.json's run keys: every part resolved (describe()), the algorithm as the run uses
        it (Algorithm.prepare: a period, rates or seed derived from the run recorded as its value;
        a user's class with its import target and digest), the seed and the version; an nn
        problem's formulation once the run has chosen it (Problem.settle)."""
        info = record(self.config, algorithm=algorithm_record(prepared_algorithm(self)), problem=self.problem.describe(),
                      participation=self.participation.describe(),
                      work=None if self.work is None else self.work.describe())
        info.update(epsilon_bound(self.config.dp, self.participation))
        info = info if self.asked_record is None else {**info, ASKED: self.asked_record}
        if parse_dp(self.config.dp) is None or self.legacy_key:
            return info
        return {**info, DP_NONCE: dp_nonce(self.config.dp, horizon_free_key(self._requested(info)))}

    def _requested(self, resolved: dict[str, Any]) -> dict[str, Any]:
        return as_requested(resolved, {"problem": self.asked, "algorithm": self.algorithm.describe()})

    @property
    def requested(self) -> dict[str, Any]:
        """The resolved record with the choices deferred to run time as they were asked for
        (runs.config.as_requested): what the run is, whenever one looks."""
        return self._requested(self.resolved)

    @property
    def dp_nonce(self) -> int | None:
        """The nonce its DP noise is keyed by beside the seed (config.json's ``dp_nonce``; 0 without
        DP; None: ``legacy_key``, the seed alone)."""
        return None if self.legacy_key else self.resolved.get(DP_NONCE, 0)

    @property
    def key(self) -> str:
        """The run's identity: runs.config.run_key of its requested record."""
        return run_key(self.requested)


def noise_as_recorded(built: BuiltRun, recorded: dict[str, Any]) -> BuiltRun:
    """``built``, rebuilt from the config.json content ``recorded`` to continue it, drawing the
    noise that record's run drew: a DP run recorded before the nonce (a dp without a nonce of its
    own, and no dp_nonce) was keyed by the seed alone, and a resume with the nonce would draw
    other noise than its first rounds did (docs/privacy.md)."""
    dp = parse_dp(built.config.dp)
    if dp is None or dp.nonce is not None or DP_NONCE in recorded:
        return built
    return dataclasses.replace(built, legacy_key=True)


def resolve_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device 'cuda' asked for, but torch sees no CUDA device")
    try:
        return torch.device(name)
    except RuntimeError:
        raise ConfigError(f"unknown device {name!r} (use cpu or cuda)") from None


def policy_of(config: RunConfig) -> DevicePolicy:
    """The run's device policy (device.py): its device type and its ``deterministic`` field."""
    return device_policy(resolve_device(config.device), config.deterministic)


def _part(part: str, make: Callable[[], Any]) -> Any:
    """``make()``; a FocusflError it raises leaves with ``part`` (one of PARTS) attached."""
    try:
        return make()
    except FocusflError as exc:
        if getattr(exc, "part", None) is None:
            exc.part = part
        raise


def problem_of(config: RunConfig, *, problems: dict | None = None,
               allow_model_import: bool = False) -> tuple[Any, dict]:
    """The run's problem and its description as asked for (before any choice deferred to run
    time is made); ``problems``: a cache by SPEC, dtype, device and threads, so a sweep builds each
    problem once."""
    key = json.dumps([config.problem, config.dtype, config.device, config.threads, allow_model_import],
                     sort_keys=True, default=str)
    if problems is not None and key in problems:
        return problems[key]
    device = _part("problem", lambda: resolve_device(config.device))
    # A neural network checks its model and the algorithm's declared state before it builds it
    # (the clients' table not counted where it will be mapped on disk: runs/store.py).
    state_size = _state_in_memory(config)
    # The device's policy before the problem's first tensor starts CUDA (its probe computes).
    with policy_applied(device_policy(device, config.deterministic)):
        problem = _part("problem", lambda: make_problem(
            config.problem, dtype=DTYPES[config.dtype], device=str(device), allow_model_import=allow_model_import,
            state_size=state_size))
    made = (problem, problem.describe())
    if problems is not None:
        problems[key] = made
    return made


def _state_in_memory(config: RunConfig):
    """The run's algorithm's state size as memory will hold it (store.StateInMemory), or None
    where the algorithm or the budget cannot be made (the run refuses them later, in its words)."""
    size = algorithm_state_size(config.algorithm, config.local_steps)
    if size is None:
        return None
    try:
        budget = state_budget(config)
    except ConfigError:
        return size
    return StateInMemory(size.__self__, budget, DTYPES[config.dtype])


def build(config: RunConfig, *, problems: dict | None = None, allow_model_import: bool = False) -> BuiltRun:
    """Validate and construct everything before anything runs or is written; the first part
    that cannot be made raises its one-line error with ``exc.part`` naming it (PARTS).

    ``problems``: a cache of problems shared by the runs a caller builds (see problem_of);
    ``allow_model_import``: see make_problem; the caller's permission, never part of the config.
    """
    _part("config", lambda: check_config(config))
    _part("config", lambda: require_numerics(config.numerics))  # before anything computes
    _part("algorithm", lambda: refuse_unpermitted(config.algorithm))  # before a problem's data is read
    # What is computed before the rounds (a problem's data and exact minimizer, its smoothness for
    # lr=auto, what an algorithm derives in prepare) is part of the result as much as the rounds
    # are: it runs with the run's thread count, not the caller's (a notebook, a console script).
    with fixed_threads(config.threads):
        return _build(config.with_problem_defaults(), problems, allow_model_import)


def _build(config: RunConfig, problems: dict | None, allow_model_import: bool) -> BuiltRun:
    problem, asked = problem_of(config, problems=problems, allow_model_import=allow_model_import)
    algorithm = _part("algorithm", lambda: make_run_algorithm(config, problem))
    # its [N, d] tables, before init (a client table beyond state_memory is mapped: runs/store.py)
    _part("algorithm", lambda: check_state_memory(algorithm, problem, state_budget(config)))
    # The problem is passed along for processes that depend on the clients' data (label).
    participation = _part("participation", lambda: make_participation(
        config.participation, problem.num_clients, seed=config.seed, problem=problem))
    work = _part("work", lambda: make_work(config.work, problem.num_clients, algorithm.local_steps, seed=config.seed))
    _part("work-algorithm", lambda: check_work_process(algorithm, work))
    _part("algorithm", lambda: check_privacy(config.dp, algorithm, participation))
    built = BuiltRun(config, algorithm, problem, participation, work, asked)
    # what the algorithm derives from the run (known rates, a period) is config.json's: checked now
    _part("algorithm", lambda: prepared_algorithm(built))
    return built


def make_run_algorithm(config: RunConfig, problem) -> Any:
    """The algorithm with its step size: ``lr="auto"`` derives it from the problem's smoothness
    constant (:meth:`Algorithm.auto_lr`) unless the algorithm SPEC gives ``lr`` itself."""
    algorithm = _with_step(config, problem)
    _check_fits(algorithm, problem.dtype)
    return algorithm


def _check_fits(algorithm, dtype: torch.dtype) -> None:
    """A step beyond the float type's range cannot even be applied (torch refuses the scalar with a
    RuntimeError mid-run); a huge step that fits is allowed: the run diverges and says so."""
    largest = torch.finfo(dtype).max
    for field_ in dataclasses.fields(algorithm):
        value = getattr(algorithm, field_.name)
        if isinstance(value, float) and abs(value) > largest:
            name = str(dtype).removeprefix("torch.")
            raise ConfigError(f"{algorithm.name}: {field_.name}={value:g} is beyond {name}'s range "
                              f"(largest {largest:.3g}); give a smaller value")


def _with_step(config: RunConfig, problem) -> Any:
    if config.lr != "auto":
        return make_algorithm(config.algorithm, lr=config.lr, local_steps=config.local_steps)
    algorithm = make_algorithm(config.algorithm, local_steps=config.local_steps)
    if "lr" in parse_spec(config.algorithm)[1]:
        return algorithm
    smoothness = problem.smoothness()
    if smoothness is None or not math.isfinite(smoothness) or smoothness <= 0:
        raise ConfigError(
            f"--lr auto needs a problem whose smoothness constant is known (ridge, logistic); "
            f"give a step size for {problem.name!r} with --lr (e.g. find one with `focusfl tune`)"
        )
    return dataclasses.replace(algorithm, lr=algorithm.auto_lr(smoothness, problem.num_clients))


def prepared_algorithm(built: BuiltRun) -> Any:
    """The algorithm as the round loop runs it (``Algorithm.prepare`` for this run)."""
    return built.algorithm.prepare(built.problem, built.participation, seed=built.config.seed)


def starting_state(built: BuiltRun, folder: Path | None) -> Any:
    """The state a run starts from, its client table in memory or mapped in ``folder``
    (runs/store.py: by the run's ``state_memory``). An algorithm's init computes (gradients at
    the starting point): with the run's threads and device policy, as its rounds do."""
    with fixed_threads(built.config.threads), policy_applied(policy_of(built.config)):
        return initial_state(prepared_algorithm(built), built.problem.initial_point(), built.problem.num_clients,
                             folder, state_budget(built.config))


def reference_of(built: BuiltRun) -> Any:
    """A fresh state's shapes and dtypes without N rows in memory: what a checkpoint is checked against."""
    return reference_state(prepared_algorithm(built), built.problem.initial_point(), built.problem.num_clients)


def resolved_config(built: BuiltRun) -> dict[str, Any]:
    """config.json: resolved defaults of every part, the seed and the version (BuiltRun.resolved)."""
    return built.resolved


def execute_batch(runs: Sequence[BuiltRun]) -> list[RunResult]:
    """Run ``runs`` (built with one cache of problems, so that they share their problem object,
    and of one runs.batch.batch_key) from their start as one batch (engine/batched.py), rows kept:
    each result is the one :func:`execute` gives the run alone."""
    members = [BatchMember(run.algorithm, run.participation, run.config.rounds, seed=run.config.seed,
                           eval_every=run.config.eval_every, schedule=run.config.schedule, work=run.work,
                           privacy=run_privacy(run.config.dp, run.algorithm, run.problem, run.participation,
                                               seed=run.config.seed, end_round=run.config.rounds, start_round=0,
                                               nonce=run.dp_nonce))
               for run in runs]
    with fixed_threads(runs[0].config.threads), policy_applied(policy_of(runs[0].config)):
        return run_batch(runs[0].problem, members, engine=runs[0].config.engine)


def execute(
    built: BuiltRun, *, progress: bool = False, on_row: Callable[[dict], None] | None = None,
    resume: Resume | None = None, keep_rows: bool = True, on_round: Callable[[RunResult], None] | None = None,
    folder: Path | None = None,
) -> RunResult:
    """Run ``built``, continuing from ``resume`` when given, to ``config.rounds`` rounds in all;
    ``keep_rows`` and ``on_round`` are simulate's (streaming rows, checkpoints). ``folder``: the
    run's folder, where a client table larger than ``state_memory`` is memory-mapped
    (runs/store.py); without one the table is kept in memory."""
    cfg = built.config
    if resume is None and folder is not None:
        resume = Resume(starting_state(built, folder), 0)
    start_round = 0 if resume is None else resume.start_round
    privacy = run_privacy(cfg.dp, built.algorithm, built.problem, built.participation, seed=cfg.seed,
                          end_round=cfg.rounds, start_round=start_round, nonce=built.dp_nonce)
    bar = None
    if progress:
        bar = tqdm(total=cfg.rounds, initial=start_round, desc=built.algorithm.name,
                   unit="round", disable=None, leave=False)

    def show(row: dict) -> None:
        if on_row is not None:
            on_row(row)
        if bar is not None:
            bar.set_postfix(progress_metrics(row), refresh=False)

    try:
        with fixed_threads(cfg.threads), client_workers(cfg.client_workers, cfg.threads), \
                policy_applied(policy_of(cfg)):
            return simulate(
                built.algorithm,
                built.problem,
                built.participation,
                cfg.rounds - start_round,
                seed=cfg.seed,
                engine=cfg.engine,
                eval_every=cfg.eval_every,
                resume=resume,
                on_row=show,
                progress=bar,
                schedule=cfg.schedule,
                keep_rows=keep_rows,
                on_round=on_round,
                work=built.work,
                privacy=privacy,
            )
    except Exception as exc:  # a user's algorithm raised: their line, in one (algorithms/importing.py)
        error = user_code_error(exc)
        if (error is None and isinstance(exc, RuntimeError) and allocation_failure(exc) is None
                and algorithm_source(built.algorithm) is not None):
            error = _shape_fault(built, exc)  # torch's "size mismatch", "index_copy_()": which field
        if error is None:
            raise
        raise error from None
    finally:
        if bar is not None:
            bar.close()


def _shape_fault(built: BuiltRun, exc: BaseException) -> UserCodeError | None:
    """Why torch refused the state of a user's algorithm (``size mismatch``, ``index_copy_``), when
    it is a shape its methods returned (:func:`shape_fault`); runs only after a run failed."""
    fault = shape_fault(built.algorithm, built.problem, built.participation, built.config.seed)
    return None if fault is None else UserCodeError(algorithm_source(built.algorithm).target, fault, exc)


def shape_fault(algorithm: Any, problem: Any, participation: Any, seed: int) -> str | None:
    """The first field of the wrong shape that ``algorithm``'s methods return, said as ``client_round
    returned clients.m of shape [2, 21], expected [2, 20] (the rows it was given)``: one small round
    on two clients, each field compared with what it should be. None when every shape is right, or
    when that round fails too (the error the caller has says more)."""
    try:
        algorithm = algorithm.prepare(problem, participation, seed=seed)
        x0 = problem.initial_point()
        state = algorithm.init(x0, problem.num_clients)
        active = torch.arange(min(2, problem.num_clients))
        ctx = RoundContext(round=0, active=active, num_clients=problem.num_clients)
        rows = gather_rows(state.clients, active)
        oracle = problem.oracle(active, seed=seed, round=0, steps=algorithm.round_steps(ctx))
        new_rows, message = algorithm.client_round(state.server, rows, oracle, ctx)
        server = algorithm.server_round(state.server, message, ctx)
        finished = algorithm.client_finish(server, new_rows, ctx)
        checks = [("init", "model()", algorithm.model(state), tuple(x0.shape), "the problem's model")]
        for method, returned in (("client_round", new_rows), ("client_finish", finished)):
            checks += [(method, f"clients.{name}", getattr(returned, name), tuple(getattr(rows, name).shape),
                        "the rows it was given") for name in rows._fields]
        checks += [("client_round", f"message.{name}", value, (len(active), *value.shape[1:]),
                    "one row per active client") for name, value in zip(message._fields, message)]
        checks += [("server_round", f"server.{name}", getattr(server, name), tuple(getattr(state.server, name).shape),
                    "as init made it") for name in state.server._fields]
        checks.append(("server_round", "model()", algorithm.model(State(server, state.clients)), tuple(x0.shape),
                       "the problem's model"))
    except Exception:  # the small round fails too
        return None
    for method, field, got, expected, why in checks:
        if tuple(got.shape) != tuple(expected):
            return f"{method} returned {field} of shape {list(got.shape)}, expected {list(expected)} ({why})"
    return None

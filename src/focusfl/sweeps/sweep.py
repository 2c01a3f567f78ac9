"""``focusfl sweep``: a grid of runs declared in a TOML file, run in parallel, resumable.

An experiment file declares axes: algorithms (with hyperparameters), problems, participation
processes, step sizes, seeds, rounds, local steps, eval-every; the sweep is their product. An
algorithm given as a table may override the run axes (``lr``, ``local_steps``, ``rounds``,
``eval_every``, ``schedule``) for itself, and any list among its hyperparameters is an axis too. A
participation process given as a table may override ``lr``, ``local_steps``, ``rounds`` and
``eval_every`` for the runs under it (a step size per participation process, as in the FOCUS
authors' notebook); an algorithm's own override comes first. ``work`` (a work SPEC or a list of
them, an axis; ``focusfl sweep --work SPEC`` replaces it) gives each active client's number of
local steps (focusfl.work); a sweep that declares it has a ``work`` column after
``participation`` in its tables, one that does not runs every client its tau steps (fixed).
The whole file is validated, expanded and every run's configuration resolved before anything is
written; an error is one line naming the key (``algorithms[2].lr``).

Each run lives in ``DIR/runs/<hash>/``, a ``focusfl run`` folder written by ``run_to_folder``,
where ``<hash>`` is the SHA-256 of the run's resolved configuration (config.json without the
version and status). A rerun of the sweep skips every run whose folder says ``complete`` or
``diverged`` under the same hash, resumes the ones a kill left with a checkpoint
(``resume_folder``), and runs the rest. Failures are collected, not fatal.

With ``tensorboard=TB`` every finished run (complete or diverged) is also logged to TensorBoard,
in ``TB/<algorithm>-lr<lr>-seed<seed>-<hash8>``, with the sweep's axes as hparams. The driver
writes these logs, from each run folder once its run has finished (:func:`log_name`).
"""
from __future__ import annotations

import dataclasses
import difflib
import itertools
import json
import math
import re
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from tqdm import tqdm

from ..algorithms import ALGORITHMS, algorithm_class, algorithm_keys
from ..algorithms.importing import (imports_permitted, is_algorithm_import, planned_code, recorded_code,
                                   tracebacks_shown)
from ..device import require_numerics
from ..engine.simulate import ENGINES, SCHEDULES
from ..errors import ConfigError, FocusflError
from ..privacy.config import parse_dp
from ..io.atomic import write_json, write_text
from ..io.folders import finish_waiting, open_store
from ..runs.config import DTYPES, NUMERICS, RunConfig, field_defaults, run_key  # noqa: F401 (re-exported)
from ..runs.batch import batch_size, group_batches, run_bytes
from ..runs.driver import build, execute_batch
from ..runs.folder import Interrupted, run_state
from ..runs.tensorboard import check_root, has_hparams, log_folder, require, safe_name
from ..spec import format_spec, parse_spec
from ..threads import DEFAULT_THREADS
from .aggregate import aggregate
from .executors import BatchTask, RunTask, SweepStopped, make_executor
from .layout import EXPERIMENT, RUNS, STATUS

MAX_RUNS = 100_000
MAX_FILE_BYTES = 1 << 20

# Run settings that are axes (a list sweeps them) and may be overridden per algorithm.
RUN_AXES = ("lr", "local_steps", "rounds", "eval_every")
ALGORITHM_OVERRIDES = (*RUN_AXES, "schedule")
# The run's own keys that an algorithm SPEC may not hold: a key of the experiment or of a table.
SPEC_RUN_KEYS = ("lr", "local_steps")
TOP_KEYS = ("name", "algorithms", "problems", "participation", "work", "seeds", *RUN_AXES, "dtype", "device",
            "engine", "schedule", "metric", "targets", "band", "dp", "numerics")
# The run fields' defaults (runs.config); dtype and eval_every None: each problem's own
# (defaults_for: float32 and every 50 rounds for neural networks), filled in by expand.
DEFAULTS = {**{k: v for k, v in field_defaults().items() if k in (*RUN_AXES, "schedule", "device", "engine")},
            "dtype": None, "eval_every": None, "band": "std"}


@dataclass(frozen=True)
class AlgorithmEntry:
    """One element of ``algorithms``: its name, fixed hyperparameters, hyperparameter axes and
    run-axis overrides (every axis a non-empty list)."""

    where: str
    name: str
    params: dict[str, Any]
    param_axes: dict[str, list]
    overrides: dict[str, list]


@dataclass(frozen=True)
class Experiment:
    name: str
    algorithms: list[AlgorithmEntry]
    problems: list
    participation: list
    seeds: range | list[int]
    axes: dict[str, list]  # lr, local_steps, rounds, eval_every; schedule (one value)
    dtype: str | None
    device: str
    engine: str
    metric: str | None
    targets: tuple[float, ...]
    band: str
    text: str = ""  # the file as given (copied into DIR)
    # Run-axis overrides of each participation process (participation[k] = {name, lr, ...}).
    participation_overrides: list[dict[str, list]] = field(default_factory=list)
    # Work SPECs (an axis); None: the file declares none, every run is fixed and the tables
    # have no work column (the sweeps written before work processes existed, byte for byte).
    work: list | None = None
    # Client-level DP of every run (the --dp record, focusfl.privacy; "none": without).
    dp: str | dict = "none"
    # The numerical environment of every run (runs.config.NUMERICS): one for the whole sweep, as
    # its variables are read when torch loads, in this process and the workers it starts.
    numerics: str = "native"


@dataclass
class SweepRun:
    """One run of the grid: its configuration, its column values and its folder's hash."""

    config: RunConfig
    axes: dict[str, Any]
    resolved: dict[str, Any]
    key: str
    where: str  # the algorithm entry it comes from, for error messages
    run_bytes: int = 0  # the memory it adds to a batch of runs (runs.batch.run_bytes)

    @property
    def group(self) -> tuple:
        """The configuration it belongs to: every axis but the seed."""
        return tuple(self.axes[k] for k in self.axes if k != "seed")


# -- reading and checking the file ---------------------------------------------------------------
def load_experiment(path: str | Path, *, work: str | None = None, dp: str | None = None,
                    numerics: str | None = None) -> Experiment:
    """Read, parse and check an experiment file; ConfigError (one line, naming the key) if bad.

    ``work``: a work SPEC that replaces the file's ``work`` axis (``focusfl sweep --work``); the
    experiment's text (copied into the sweep folder) is then the file rewritten with it, so that
    the copy reruns the same grid. ``dp``, ``numerics``: likewise, the file's ``dp`` and
    ``numerics`` (``focusfl sweep --dp``, ``--numerics``)."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise ConfigError(f"{path}: larger than 1 MiB; not an experiment file")
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read experiment file {str(path)!r}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    try:
        given = {key: value for key, value in (("work", work), ("dp", dp), ("numerics", numerics))
                 if value is not None}
        if given:
            data = {**data, **given}
            text = experiment_text(data)
        return parse_experiment(data, text)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def experiment_text(data: dict) -> str:
    """``data`` (an experiment as parse_experiment takes it) as an experiment file that
    ``focusfl sweep FILE`` runs: what tune and the nn presets write as their experiment.toml."""

    def key(name: str) -> str:
        return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else json.dumps(name)

    def value(item: Any) -> str:
        if isinstance(item, bool):
            return "true" if item else "false"
        if isinstance(item, (int, float)):
            return repr(item) if not isinstance(item, float) or math.isfinite(item) else ("inf" if item > 0 else "-inf")
        if isinstance(item, str):
            return json.dumps(item)  # a TOML basic string: JSON's escapes are TOML's
        if isinstance(item, (list, tuple, range)):
            return "[" + ", ".join(value(v) for v in item) + "]"
        if isinstance(item, dict):
            return "{" + ", ".join(f"{key(k)} = {value(v)}" for k, v in item.items()) + "}"
        raise ConfigError(f"cannot write {item!r} in an experiment file")

    # None is a key left out (its default: a dtype of None is the problem's).
    return "".join(f"{key(k)} = {value(v)}\n" for k, v in data.items() if v is not None)


def make_experiment(**data: Any) -> Experiment:
    """An experiment from its keys as Python values (those of an experiment file: ``algorithms``,
    ``problems``, ``participation``, ``work``, ``seeds``, ``lr``, ``rounds``, ...), checked as a file
    is; its experiment.toml is written from them. The library's way to make one (tune and the
    presets do): no TOML is written or parsed."""
    return parse_experiment(data)


def parse_experiment(data: dict, text: str | None = None) -> Experiment:
    """An experiment from a parsed file's (or make_experiment's) keys; ``text``: the file as
    given (None: written from ``data``, for the copy a sweep folder keeps)."""
    _unknown_keys(data, TOP_KEYS, "")
    if "algorithms" not in data:
        raise ConfigError("algorithms: missing; list at least one algorithm, e.g. algorithms = [\"focus\"]")
    name = data.get("name", "sweep")
    if not isinstance(name, str):
        raise ConfigError(f"name: expected a string, got {_show(name)}")
    algorithms = [_algorithm_entry(item, f"algorithms[{k}]")
                  for k, item in enumerate(_as_axis(data["algorithms"], "algorithms"))]
    problems = [_spec(item, f"problems[{k}]") for k, item in enumerate(_as_axis(data.get("problems", "ridge"), "problems"))]
    participation, participation_overrides = [], []
    for k, item in enumerate(_as_axis(data.get("participation", "full"), "participation")):
        spec, overrides = _participation_entry(item, f"participation[{k}]")
        participation.append(spec)
        participation_overrides.append(overrides)
    work = ([_spec(item, f"work[{k}]" if isinstance(data["work"], list) else "work")
             for k, item in enumerate(_as_axis(data["work"], "work"))] if "work" in data else None)
    axes = {key: [_run_value(key, v, f"{key}[{k}]" if isinstance(data.get(key), list) else key)
                  for k, v in enumerate(_as_axis(data[key], key))] if key in data else [DEFAULTS[key]]
            for key in RUN_AXES}
    axes["schedule"] = [_run_value("schedule", data.get("schedule", DEFAULTS["schedule"]), "schedule")]
    seeds = _seeds(data.get("seeds", 1))
    dtype = data.get("dtype", DEFAULTS["dtype"])
    if dtype is not None and dtype not in DTYPES:
        raise ConfigError(f"dtype: expected one of {', '.join(DTYPES)}, got {_show(dtype)}")
    device = data.get("device", DEFAULTS["device"])
    if not isinstance(device, str):
        raise ConfigError(f"device: expected a string such as 'cpu' or 'cuda', got {_show(device)}")
    engine = _choice(data, "engine", tuple(ENGINES))
    band = _choice(data, "band", ("std", "minmax"))
    metric = data.get("metric")
    if metric is not None and not (isinstance(metric, str) and metric):
        raise ConfigError(f"metric: expected a metric name such as 'rel_error' or 'loss', got {_show(metric)}")
    targets = data.get("targets", [])
    if not isinstance(targets, list):
        targets = [targets]
    for k, value in enumerate(targets):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
            raise ConfigError(f"targets[{k}]: expected a positive number, got {_show(value)}")
    if text is None:
        text = experiment_text(data)
    dp = data.get("dp", "none")
    try:
        parse_dp(dp)
    except ConfigError as exc:
        raise ConfigError(f"dp: {exc}") from None
    experiment = Experiment(name, algorithms, problems, participation, seeds, axes, dtype, device, engine,
                            metric, tuple(float(t) for t in targets), band, text, participation_overrides, work, dp,
                            _numerics(data.get("numerics", "native")))
    check_size(experiment)
    return experiment


def check_size(experiment: Experiment, names: dict[str, str] | None = None) -> None:
    """ConfigError if the grid has more than MAX_RUNS runs, naming its longest axis (as
    ``names`` calls it: a command's option that set the axis)."""
    count, largest = count_runs(experiment)
    if count > MAX_RUNS:
        largest = (names or {}).get(largest, largest)
        raise ConfigError(f"{largest}: the grid has {count:,} runs, more than the {MAX_RUNS:,} a sweep may have; "
                          "shorten an axis or split the experiment")


def _unknown_keys(data: dict, known: Sequence[str], prefix: str) -> None:
    for key in data:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f" (known: {', '.join(known)})"
            raise ConfigError(f"{prefix}{key}: unknown key{hint}")


def _show(value: Any) -> str:
    text = repr(value)
    kind = type(value).__name__
    return f"{text[:60]}{'...' if len(text) > 60 else ''} ({kind})"


def _as_axis(value: Any, where: str) -> list:
    """A TOML value as an axis: a list (which must not be empty) or one value."""
    if isinstance(value, list):
        if not value:
            raise ConfigError(f"{where}: empty list; give at least one value")
        return value
    return [value]


def _spec(value: Any, where: str) -> str | dict:
    """A problem or participation SPEC: a string, or a table with 'name' (checked when resolved)."""
    if isinstance(value, str) and value.strip():
        return value
    if isinstance(value, dict) and isinstance(value.get("name"), str) and value["name"]:
        return dict(value)
    raise ConfigError(f"{where}: expected a SPEC string such as 'ridge:dim=50' or a table with a 'name', got {_show(value)}")


def _participation_entry(item: Any, where: str) -> tuple[str | dict, dict[str, list]]:
    """A participation SPEC, and the run axes its table overrides (``{name = "full", lr = 3e-4}``)."""
    spec = _spec(item, where)
    if not isinstance(spec, dict):
        return spec, {}
    overrides = {}
    for key in RUN_AXES:
        if key in spec:
            value = spec.pop(key)
            overrides[key] = [_run_value(key, v, f"{where}.{key}[{k}]" if isinstance(value, list) else f"{where}.{key}")
                              for k, v in enumerate(_as_axis(value, f"{where}.{key}"))]
    return spec, overrides


def _run_value(key: str, value: Any, where: str) -> Any:
    if key == "lr":
        if value == "auto":
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
            raise ConfigError(f"{where}: expected a positive number or \"auto\", got {_show(value)}")
        return float(value)
    if key == "schedule":
        if value not in SCHEDULES:
            raise ConfigError(f"{where}: expected one of {', '.join(json.dumps(k) for k in SCHEDULES)}, "
                              f"got {_show(value)}")
        return value
    if key == "local_steps" and value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where}: expected an integer >= 1, got {_show(value)}")
    return value


def _numerics(value: Any) -> str:
    """The sweep's one numerical environment: a grid cannot vary it, since its variables must be
    in force before torch loads, in the sweep's process and in every worker it starts."""
    if isinstance(value, list):
        if len({json.dumps(v) for v in value}) > 1:
            raise ConfigError(f"numerics: one value for the whole sweep (the environment is set before torch "
                              f"loads, for every run), got {_show(value)}; split it into one sweep per value")
        value = value[0] if value else None
    if value not in NUMERICS:
        raise ConfigError(f"numerics: expected one of {', '.join(NUMERICS)}, got {_show(value)}")
    return value


def _seeds(value: Any) -> range | list[int]:
    """``seeds = 5`` means seeds 0 to 4; a list gives them one by one."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise ConfigError(f"seeds: expected a count >= 1 or a list of seeds, got {_show(value)}")
        return range(value)
    if not isinstance(value, list):
        raise ConfigError(f"seeds: expected a count (seeds = 5: seeds 0-4) or a list of seeds, got {_show(value)}")
    if not value:
        raise ConfigError("seeds: empty list; give at least one seed")
    for k, seed in enumerate(value):
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ConfigError(f"seeds[{k}]: expected an integer >= 0, got {_show(seed)}")
    if len(set(value)) != len(value):
        raise ConfigError(f"seeds: seed {next(s for s in value if value.count(s) > 1)} is listed twice")
    return list(value)


def _choice(data: dict, key: str, choices: Sequence[str]) -> str:
    value = data.get(key, DEFAULTS[key])
    if value not in choices:
        raise ConfigError(f"{key}: expected one of {', '.join(choices)}, got {_show(value)}")
    return value


def _algorithm_entry(item: Any, where: str) -> AlgorithmEntry:
    """``"focus"``, ``"fedavg:weighting=p"`` or a table ``{name = "fedavg", lr = [...], ...}``."""
    if isinstance(item, str):
        try:
            name, params = parse_spec(item)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        table: dict[str, Any] = {}
    elif isinstance(item, dict):
        name, params, table = item.get("name"), {}, {k: v for k, v in item.items() if k != "name"}
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{where}.name: expected an algorithm name such as 'focus', got {_show(name)}")
    else:
        raise ConfigError(f"{where}: expected an algorithm name, SPEC or table, got {_show(item)}")
    if name not in ALGORITHMS and not is_algorithm_import(name):
        close = difflib.get_close_matches(name, ALGORITHMS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f" (known: {', '.join(ALGORITHMS)})"
        raise ConfigError(f"{where}: unknown algorithm {name!r}{hint}")
    try:
        cls = algorithm_class(name)  # a user's own class: imported here, with the command's permission
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    fields = [key for key in algorithm_keys(cls) if key not in SPEC_RUN_KEYS]
    for key in params:
        if key in ALGORITHM_OVERRIDES:
            raise ConfigError(f"{where}: give {key} as a key of the experiment or of an algorithm table "
                              f"({{name = \"{name}\", {key} = ...}}), not inside the SPEC")
    _unknown_keys(params, fields, f"{where}.")  # a SPEC holds the algorithm's own keys only
    _unknown_keys(table, [*ALGORITHM_OVERRIDES, *fields], f"{where}.")
    overrides, param_axes, fixed = {}, {}, dict(params)
    for key, value in table.items():
        sub = f"{where}.{key}"
        if key in ALGORITHM_OVERRIDES:
            values = _as_axis(value, sub) if key != "schedule" else [value]
            overrides[key] = [_run_value(key, v, f"{sub}[{k}]" if isinstance(value, list) else sub)
                              for k, v in enumerate(values)]
        elif isinstance(value, list):
            param_axes[key] = _as_axis(value, sub)
        else:
            fixed[key] = value
    for key, value in [*fixed.items(), *((k, v) for k, vs in param_axes.items() for v in vs)]:
        if isinstance(value, dict):
            raise ConfigError(f"{where}.{key}: expected a number, string or boolean, got {_show(value)}")
    return AlgorithmEntry(where, name, fixed, param_axes, overrides)


def _entry_axes(entry: AlgorithmEntry, experiment: Experiment, q_index: int = 0) -> dict[str, list]:
    """The run axes of an algorithm under participation process ``q_index``: the algorithm's own
    overrides, else the participation process's, else the experiment's."""
    under = experiment.participation_overrides[q_index] if experiment.participation_overrides else {}
    return {key: entry.overrides.get(key, under.get(key, experiment.axes[key])) for key in (*RUN_AXES, "schedule")}


def count_runs(experiment: Experiment) -> tuple[int, str]:
    """How many runs the grid has, and the key of its longest axis (named when it is too many)."""
    lengths = {"seeds": len(experiment.seeds), "problems": len(experiment.problems),
               "participation": len(experiment.participation), "work": len(experiment.work or [None])}
    per_problem = 0
    for q_index in range(len(experiment.participation)):
        under = experiment.participation_overrides[q_index] if experiment.participation_overrides else {}
        for entry in experiment.algorithms:
            size = 1
            for key, values in _entry_axes(entry, experiment, q_index).items():
                size *= len(values)
                where = (f"{entry.where}.{key}" if key in entry.overrides
                         else f"participation[{q_index}].{key}" if key in under else key)
                lengths[where] = max(lengths.get(where, 0), len(values))
            for key, values in entry.param_axes.items():
                size *= len(values)
                lengths[f"{entry.where}.{key}"] = len(values)
            per_problem += size
    lengths["algorithms"] = len(experiment.algorithms)
    count = per_problem * len(experiment.seeds) * len(experiment.problems) * lengths["work"]
    return count, max(lengths, key=lambda k: lengths[k])


# -- the grid ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PlannedRun:
    """One run of the grid before it is built: its record, its column values (lr and
    local_steps as given, eval_every as the file gives it) and where each part comes from."""

    config: RunConfig
    axes: dict[str, Any]
    label: str  # the algorithm's column: its SPEC without lr and local_steps
    where: dict[str, str]  # part of a run (runs.driver.PARTS) -> the file's key it comes from


def plan(experiment: Experiment, *, threads: int = DEFAULT_THREADS) -> Iterator[PlannedRun]:
    """Every run of the grid as a RunConfig, in the order of the tables: problems, participation
    processes and work processes, algorithms, their hyperparameter axes, the run axes, seeds.
    ``threads``: each run's torch threads (the executor's; part of the run and of its key)."""
    for p_index, problem_spec in enumerate(experiment.problems):
        for (q_index, participation_spec), (w_index, work_spec) in itertools.product(
                enumerate(experiment.participation), enumerate(experiment.work or [None])):
            work_key = f"work[{w_index}]" if experiment.work and len(experiment.work) > 1 else "work"
            for entry in experiment.algorithms:
                axes = _entry_axes(entry, experiment, q_index)
                names = list(entry.param_axes)
                where = {"config": entry.where, "problem": f"problems[{p_index}]", "algorithm": entry.where,
                         "participation": f"participation[{q_index}]", "work": work_key,
                         "work-algorithm": entry.where}
                for values in itertools.product(*(entry.param_axes[k] for k in names)):
                    params = {**entry.params, **dict(zip(names, values))}
                    label = format_spec(entry.name, params)
                    for lr, local_steps, rounds, eval_every in itertools.product(*(axes[k] for k in RUN_AXES)):
                        for seed in experiment.seeds:
                            try:
                                config = RunConfig(
                                    algorithm={"name": entry.name, **params}, problem=problem_spec,
                                    participation=participation_spec, rounds=rounds, local_steps=local_steps, lr=lr,
                                    seed=seed, dtype=experiment.dtype, device=experiment.device,
                                    engine=experiment.engine, eval_every=eval_every, schedule=axes["schedule"][0],
                                    threads=threads, dp=experiment.dp, numerics=experiment.numerics,
                                    **({} if work_spec is None else {"work": work_spec}))
                            except FocusflError as exc:
                                raise ConfigError(f"{entry.where}: {exc}") from None
                            yield PlannedRun(config, {
                                "problem": _label(problem_spec), "participation": _label(participation_spec),
                                **({} if work_spec is None else {"work": _label(work_spec)}),
                                "algorithm": label, "lr": lr, "local_steps": local_steps, "rounds": rounds,
                                "eval_every": eval_every, "seed": seed,
                            }, label, where)


def expand(experiment: Experiment, *, threads: int = DEFAULT_THREADS, allow_model_import: bool = False) -> list[SweepRun]:
    """Every run of the grid, built (runs.driver.build: step sizes, defaults) and hashed;
    ConfigError naming the key of the first run that cannot be built. Problems are built once each."""
    runs: list[SweepRun] = []
    seen: dict[str, SweepRun] = {}
    problems: dict[str, Any] = {}
    metric_checked: set[str] = set()
    for planned in plan(experiment, threads=threads):
        try:
            built = build(planned.config, problems=problems, allow_model_import=allow_model_import)
        except FocusflError as exc:
            raise ConfigError(_where(planned, exc)) from None
        problem_key = planned.where["problem"]
        if problem_key not in metric_checked:
            _check_metric(experiment, built.problem, problem_key)
            metric_checked.add(problem_key)
        resolved = built.requested
        described = resolved["algorithm"]
        run = SweepRun(
            config=built.config,
            axes={**planned.axes, "lr": described.get("lr", planned.axes["lr"]),
                  "local_steps": described.get("local_steps", planned.axes["local_steps"]),
                  "eval_every": built.config.eval_every},
            resolved=resolved, key=built.key, where=planned.where["algorithm"], run_bytes=run_bytes(built),
        )
        if run.key in seen:
            other = seen[run.key]
            raise ConfigError(
                f"{run.where}: gives the same run as {other.where} ({planned.label}, seed {run.axes['seed']}, "
                f"lr {run.axes['lr']:g}); remove one of them"
            )
        seen[run.key] = run
        runs.append(run)
    return runs


def _where(planned: PlannedRun, exc: FocusflError) -> str:
    """The one-line error of a run that cannot be built, naming the file's key of the part at fault."""
    part = getattr(exc, "part", "config")
    if part == "work-algorithm":
        work = planned.config.work
        return f"{planned.where[part]}: {exc} ({planned.where['work']} = {_label(work)!r})"
    return f"{planned.where.get(part, planned.where['config'])}: {exc}"


def _label(spec: str | dict) -> str:
    return spec if isinstance(spec, str) else format_spec(*parse_spec(spec))


def _check_metric(experiment: Experiment, problem, where: str) -> None:
    if experiment.metric is None:
        return
    names = set(problem.metrics(problem.initial_point())) | set(problem.late_metrics)
    if experiment.metric not in names:
        raise ConfigError(f"metric: {experiment.metric!r} is not reported by {where} "
                          f"(its metrics: {', '.join(sorted(names))})")


@dataclass
class SweepReport:
    """What a sweep did: counts, failures and the files it wrote."""

    total: int
    skipped: int = 0
    resumed: int = 0
    ran: int = 0
    failed: list[dict] = field(default_factory=list)
    interrupted: int = 0
    seconds: float = 0.0
    written: list[str] = field(default_factory=list)
    runs: list[SweepRun] = field(default_factory=list)
    logged: int = 0  # runs logged to TensorBoard by this call
    # Runs that were to be resumed but ran again from their start (their checkpoint could not be
    # read): {"run": key, **axes, "reason": ...}.
    restarted: list[dict] = field(default_factory=list)


def run_sweep(
    experiment: Experiment,
    out: str | Path,
    *,
    workers: int = 1,
    threads: int | None = None,
    executor: str = "local",
    address: str | None = None,
    checkpoint_every: int | None = None,
    band: str | None = None,
    progress: bool = False,
    allow_model_import: bool = False,
    kind: str = "sweep",
    tables=None,
    tensorboard: str | Path | None = None,
    experiment_identity: dict | None = None,
    batch_runs: int | str = "auto",
    gpus_per_task: float | None = None,
    cpus_per_task: float | None = None,
    retries: int | None = None,
) -> SweepReport:
    """Run every run of ``experiment`` not yet finished in ``out``, then write results.csv,
    summary.csv and the figures from all of them (or what ``tables(experiment, runs, folder,
    band=, failures=)`` writes instead: ``focusfl tune``'s tables; it returns the names).
    ``tensorboard``: a folder in which to log every finished run (:func:`log_name`), those
    finished earlier included unless their log is complete already. ``experiment_identity``:
    what makes two experiments the same (io.folders.open_store refuses a folder of another).
    ``batch_runs``: runs stepped together in one batch (runs/batch.py), ``auto`` or a count;
    each run's config.json records it; a Ray task runs a batch. ``gpus_per_task``,
    ``cpus_per_task``, ``retries``: what each Ray task asks for, and how often Ray runs a task
    lost with its node again (executors.RayExecutor). While a Ray sweep's runs go, ``status.json``
    in ``out`` says how many are queued, running (on which nodes), done, retried and failed, and the
    ETA (:func:`write_status`)."""
    # Before anything computes or is written: the sweep's process is in the numerical environment
    # its runs ask for (the CLI starts itself again in it; its workers inherit it).
    require_numerics(experiment.numerics)
    root = None
    if tensorboard is not None:
        require()
        root = check_root(tensorboard, out, what="the sweep folder")
    pool = make_executor(executor, workers=workers, threads=threads, address=address,  # checks Ray is there
                         gpus_per_task=gpus_per_task, cpus_per_task=cpus_per_task, retries=retries)
    try:
        # The executor's threads per worker are the runs' threads: part of each run and its key.
        runs = expand(experiment, threads=pool.threads, allow_model_import=allow_model_import)
    except BaseException:
        pool.close()
        raise
    try:
        if executor == "ray":
            pool.check_devices(run.config.device for run in runs)
        pool.check()  # reaches a Ray cluster now: a wrong address must leave no folder behind
    except BaseException:
        pool.close()
        raise
    batch_size(batch_runs, 1)  # a bad value is one line before anything is written
    report = SweepReport(total=len(runs), runs=runs)
    started = time.monotonic()
    with open_store(out, kind=kind, experiment=experiment_identity) as store:
        write_text(store.path / EXPERIMENT, experiment.text)
        folder = store.path / RUNS
        folder.mkdir(exist_ok=True)
        tasks = []
        for run in runs:
            state = run_state(folder / run.key, run.key, run.resolved)
            if state == "done":
                finish_waiting(folder / run.key)  # killed while publishing: its files are read below
                report.skipped += 1
                report.logged += _log_run(root, run, folder)
                continue
            tasks.append(RunTask(key=run.key, config=run.config.to_dict(),
                                 out=str(folder / run.key),
                                 resume=state == "resume", checkpoint_every=checkpoint_every,
                                 allow_model_import=allow_model_import,
                                 allow_algorithm_import=imports_permitted(),
                                 user_tracebacks=tracebacks_shown(),
                                 algorithm_code=recorded_code(run.resolved["algorithm"])))
        report.resumed = sum(task.resume for task in tasks)
        if progress:
            print(f"sweep {experiment.name!r}: {len(runs)} runs; {report.skipped} finished earlier, "
                  f"{report.resumed} to resume, {len(tasks) - report.resumed} to run; {pool.describe()}"
                  + (f"; TensorBoard logs in {root}" if root is not None else ""))
        by_key = {run.key: run for run in runs}
        items = batches(tasks, by_key, batch_runs)
        exit_code = None
        # A sweep on Ray says what it does in status.json (on one machine, the terminal line does).
        status = SweepStatus(store.path / STATUS if executor == "ray" else None, total=len(runs),
                             skipped=report.skipped, queued=len(tasks), slots=pool.slots)
        if status.path is not None:
            pool.on_progress = status.progress  # which runs run where, between finished runs
        stopped: SweepStopped | None = None
        try:
            for task, outcome in _with_progress(status.follow(pool.run(items)), len(tasks), progress, pool.slots):
                if outcome.get("restarted"):
                    report.restarted.append({"run": task.key, **by_key[task.key].axes, "reason": outcome["restarted"]})
                if outcome["status"] in ("complete", "diverged"):
                    report.ran += 1
                    report.logged += _log_run(root, by_key[task.key], folder)
                elif outcome["status"] == "interrupted":
                    report.interrupted += 1
                    exit_code = exit_code or outcome.get("exit_code")  # 130, 143, 129: the signal's
                else:
                    report.failed.append({"run": task.key, **by_key[task.key].axes, "error": outcome.get("error", "")})
        except SweepStopped as exc:  # a Ray sweep's signal: the runs it stopped were counted above
            stopped = exc
        finally:
            pool.close()
            status.finish()
        if report.interrupted or stopped is not None:
            raise Interrupted(f"sweep interrupted: {report.interrupted} run(s) stopped with a checkpoint; "
                              "run the same command again to continue",
                              exit_code or (stopped.exit_code if stopped is not None else 130))
        report.written = (tables or aggregate)(experiment, runs, store.path, band=band or experiment.band,
                                               failures=report.failed)
        store.mark([EXPERIMENT, STATUS, *report.written], folders=[RUNS])
    report.seconds = time.monotonic() - started
    return report


def batches(tasks: list[RunTask], by_key: dict[str, SweepRun], batch_runs: int | str) -> list[RunTask | BatchTask]:
    """The tasks grouped into batches of runs (runs.batch.group_batches), in the order of the
    grid; a batch of one is a plain task. Every task records the batch size asked for."""
    items: list[RunTask | BatchTask] = []
    for members in group_batches(tasks, lambda task: by_key[task.key].config, lambda task: by_key[task.key].run_bytes,
                                 batch_runs):
        size = batch_size(batch_runs, max(by_key[task.key].run_bytes for task in members))
        batch = tuple(dataclasses.replace(task, batch_runs=size) for task in members)
        items.append(batch[0] if len(batch) == 1 else BatchTask(batch, size))
    return items


def compute_runs(runs: Sequence[SweepRun], batch_runs: int | str = "auto") -> dict[str, Any]:
    """The results (rows kept) of ``runs`` computed in this process, in batches of runs
    (:func:`compute_configs`), by run key: what a preset that keeps its runs in a result cache
    rather than in run folders computes (each result the one the run alone gives)."""
    planned = {target: sha for run in runs for target, sha in recorded_code(run.resolved["algorithm"]).items()}
    results = compute_configs([run.config for run in runs], batch_runs, planned=planned)
    return {run.key: result for run, result in zip(runs, results)}


def compute_configs(configs: Sequence[RunConfig], batch_runs: int | str = "auto", *,
                    planned: dict[str, str] | None = None) -> list:
    """The results (rows kept) of the runs ``configs`` describe, computed in this process in
    batches of runs (runs.batch.group_batches: runs of one batch key, at most ``batch_runs`` at a
    time), in the order of ``configs``: each result the one the run alone gives. ``planned``: the
    code of users' algorithms the runs were keyed with (algorithms/importing.py)."""
    problems: dict = {}
    with planned_code(planned or {}):  # the code the runs were keyed with, or none
        built = [build(config, problems=problems) for config in configs]
    position = {id(b): k for k, b in enumerate(built)}
    results: list = [None] * len(built)
    for group in group_batches(built, lambda b: b.config, run_bytes, batch_runs):
        for b, result in zip(group, execute_batch(group)):
            results[position[id(b)]] = result
    return results


def counts_line(report: SweepReport, summary: Sequence[dict] = ()) -> str:
    """The line that closes a sweep: its runs finished earlier, ran (resumed), failed and, from
    ``summary`` (summary.csv's rows), diverged: a diverged run finished, it did not fail."""
    diverged = sum(int(row.get("diverged") or 0) for row in summary)
    return (f"{report.total} runs: {report.skipped} finished earlier, {report.ran} ran"
            f"{f' ({report.resumed} resumed)' if report.resumed else ''}, {len(report.failed)} failed"
            f"{f', {diverged} diverged' if diverged else ''}; {report.seconds:.1f} s")


def restart_note(report: SweepReport) -> str:
    """The line that says which runs a sweep ran again from their start instead of resuming them,
    and why (their checkpoint could not be read)."""
    first = report.restarted[0]
    return (f"{len(report.restarted)} run(s) restarted from round 0 instead of resumed (the first, "
            f"{first['algorithm']} seed {first['seed']}: {first['reason']})")


def log_name(run: SweepRun) -> str:
    """The TensorBoard run of a sweep's run: readable, and unique by its hash, e.g.
    ``focus-lr0.0002-seed3-1f2e3d4c``."""
    lr = run.axes.get("lr")
    lr = f"{lr:g}" if isinstance(lr, (int, float)) and not isinstance(lr, bool) else str(lr)
    readable = safe_name(f"{run.axes['algorithm']}-lr{lr}-seed{run.axes['seed']}")
    return f"{readable}-{run.key[:8]}"


def _log_run(root: Path | None, run: SweepRun, folder: Path) -> int:
    """Log a finished run to TensorBoard (1), unless there is no TensorBoard folder or its log
    there is complete already (0).

    The driver does this, for every executor, after the run has finished: a Ray task on another
    machine cannot write to this one's disk, and a log written from the run folder's files alone
    is the same whichever executor, worker count or order ran the runs (and a sweep run earlier
    without --tensorboard gets its logs on the next call)."""
    if root is None:
        return 0
    log_dir = root / log_name(run)
    if has_hparams(log_dir):
        return 0
    hparams = {k: v for k, v in run.axes.items() if v is not None}
    log_folder(folder / run.key, log_dir, hparams=hparams)
    return 1


class SweepStatus:
    """What a sweep is doing, in ``status.json`` of its folder for another shell (or a notebook)
    to read while it runs: runs ``total``, ``finished_earlier``, ``to_run``, ``queued`` (not yet
    started), ``running`` with ``running_on`` (Ray's node id: runs running there now), ``nodes``
    (node id: runs finished there), ``done``, ``retried`` (run again after their node or worker
    was lost), ``resumed_after_loss`` (of those, the runs that continued from a checkpoint the lost
    attempt left rather than from round 0), ``failed``, ``interrupted``,
    ``eta_seconds`` (the runs left at the pace so far; null before the first finishes) and
    ``state`` (running / finished / stopped). Rewritten atomically after each run; never read by
    focusfl, and no result file depends on it. ``path`` None: kept in memory only."""

    def __init__(self, path: Path | None, *, total: int, skipped: int, queued: int, slots: int):
        self.path, self.slots = path, slots
        self.counts = {"total": total, "finished_earlier": skipped, "to_run": queued, "done": 0, "retried": 0,
                       "resumed_after_loss": 0, "failed": 0, "interrupted": 0}
        self.nodes: dict[str, int] = {}
        self.running_on: dict[str, str] | None = None  # run key -> node, where the executor says
        self.retried_live = 0
        self.started = time.monotonic()
        self.write("running")

    def follow(self, outcomes: Iterable):
        for task, outcome in outcomes:
            status = outcome["status"]
            key = "done" if status in ("complete", "diverged") else "interrupted" if status == "interrupted" else "failed"
            self.counts[key] += 1
            self.counts["retried"] += bool(outcome.get("retried"))
            self.counts["resumed_after_loss"] += bool(outcome.get("resumed_after_loss"))
            if outcome.get("node"):
                self.nodes[outcome["node"]] = self.nodes.get(outcome["node"], 0) + 1
            self.write("running")
            yield task, outcome

    def progress(self, info: dict) -> None:
        """The executor's word on the runs running now and where, and the runs it ran again."""
        self.running_on, self.retried_live = info["running"], info["retried"]
        self.write("running")

    def left(self) -> int:
        counts = self.counts
        return counts["to_run"] - counts["done"] - counts["failed"] - counts["interrupted"]

    def eta(self) -> float | None:
        finished = self.counts["to_run"] - self.left()
        if not finished:
            return None
        return round((time.monotonic() - self.started) / finished * self.left(), 1)

    def write(self, state: str) -> None:
        if self.path is None:
            return
        left = self.left()
        on: dict[str, int] = {}
        if self.running_on is not None:
            for node in self.running_on.values():
                on[node] = on.get(node, 0) + 1
            running = min(len(self.running_on), left)
        else:
            running = min(self.slots, left)
        running = running if state == "running" else 0
        counts = {**self.counts, "retried": max(self.counts["retried"], self.retried_live)}
        write_json(self.path, {"state": state, **counts, "queued": left - running, "running": running,
                               "running_on": dict(sorted(on.items())) if state == "running" else {},
                               "nodes": dict(sorted(self.nodes.items())), "eta_seconds": self.eta(),
                               "elapsed_seconds": round(time.monotonic() - self.started, 1)})

    def finish(self) -> None:
        self.write("finished" if self.left() == 0 and not self.counts["interrupted"] else "stopped")


def _with_progress(outcomes: Iterable, total: int, progress: bool, slots: int):
    """Pass outcomes through, showing runs done / running (on how many nodes) / retried / failed
    and an ETA, on one updating line."""
    if not progress or total == 0:
        yield from outcomes
        return
    failed = retried = 0
    nodes: set[str] = set()
    with tqdm(total=total, desc="runs", unit="run", disable=None, leave=False) as bar:
        bar.set_postfix_str(f"running {min(slots, total)}, failed 0", refresh=False)
        for task, outcome in outcomes:
            failed += outcome["status"] not in ("complete", "diverged", "interrupted")
            retried += bool(outcome.get("retried"))
            if outcome.get("node"):
                nodes.add(outcome["node"])
            bar.update(1)
            where = f" on {len(nodes)} node(s)" if nodes else ""
            again = f", retried {retried}" if retried else ""
            bar.set_postfix_str(f"running {min(slots, total - bar.n)}{where}{again}, failed {failed}", refresh=True)
            yield task, outcome


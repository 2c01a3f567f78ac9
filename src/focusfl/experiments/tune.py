"""``focusfl tune``: grid search of the step size, per algorithm.

Both papers tune step sizes by grid search; this runs every algorithm asked for at each step
size of a small log-spaced grid (same problem, participation, seed and rounds) and keeps the
best one per algorithm:

- convex problems (ridge, logistic) track rel_error when the minimizer is known, else the loss:
  a run that reaches ``target`` (default 1e-10) beats every run that does not, and among those
  the one that gets there first wins; otherwise the lowest final value wins;
- neural networks are tuned on a validation split carved from the clients' own training data
  (the problem's ``validation=`` fraction, 0.1 unless the SPEC gives one; never the test set):
  the score is the mean ``val_loss`` over the last third of the evaluations, so that a step
  whose loss oscillates or drifts up at the end of the horizon loses against a steady one, and
  no target applies; trials evaluate the validation share only. The chosen step stays one grid
  point below the observed edge of stability (:func:`pick_stable`): a step whose next larger
  neighbour diverged is not taken. The final runs of a tuned step train on all of the clients' data.

Diverged runs count as +inf. Only the (local) step size ``lr`` is searched; other
hyperparameters (server_lr, local_steps, ...) are fixed by the algorithm SPEC and the options.

The command runs the grid x ``--seeds`` as a sweep (experiments/sweep.py): every trial is a run
folder under ``OUT/runs/`` (the sweep's experiment.toml beside them), ``--workers`` runs them in
parallel, and the same command again skips finished trials. With several seeds a step size is
ranked by its mean over the seeds: the mean round at which it reaches the target (only if every
seed reaches it), else its mean score; grid.csv and summary.csv give the spread (std, min, max)
beside the mean.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from ..algorithms import ALGORITHMS, make_algorithm
from ..errors import ConfigError, DivergenceError, FocusflError
from ..io.atomic import write_csv, write_json
from ..metrics import selection_metric
from ..runs.config import RunConfig, WithRun
from ..runs.driver import build, execute
from ..spec import format_spec, parse_spec
from .sweep import make_experiment, restart_note, run_sweep

DEFAULT_TARGET = 1e-10
DEFAULT_VALIDATION = 0.1  # the clients' share held out to tune neural networks on
# Metrics of stochastic runs, scored by their mean over the last third of the evaluations.
TAIL_METRICS = ("val_loss",)


def lr_grid(lo: float, hi: float, points: int) -> list[float]:
    """``points`` step sizes from lo to hi, equally spaced in log scale (both ends included)."""
    if not (0 < lo <= hi and math.isfinite(hi)):
        raise ConfigError(f"step-size grid needs 0 < lr-min <= lr-max, got {lo:g} and {hi:g}")
    if points < 1 or (points == 1 and lo != hi):
        raise ConfigError(f"step-size grid needs at least 2 points between different ends, got {points}")
    if points == 1:
        return [lo]
    ratio = math.log(hi / lo) / (points - 1)
    return [float(f"{lo * math.exp(k * ratio):.6g}") for k in range(points)]


@dataclass(frozen=True)
class TuneSetup(WithRun):
    """What every trial shares: a RunConfig (problem, participation, budget, ...; its algorithm and
    lr are each trial's) and the success target (None: no success level, neural networks)."""

    run: RunConfig
    target: float | None = DEFAULT_TARGET

    def trial(self, algorithm: str | dict, lr: float) -> RunConfig:
        """The record of one trial: ``algorithm`` at step ``lr``, the rest shared."""
        return self.run.replace(algorithm=algorithm, lr=lr)


def setup(*, target: float | None = DEFAULT_TARGET, **run_fields) -> TuneSetup:
    """A TuneSetup from run fields (``problem=..., participation=..., rounds=...``) and a target;
    the record's own defaults where a field is not given (rounds: TUNE_DEFAULTS')."""
    return TuneSetup(RunConfig(**{**TUNE_DEFAULTS, **run_fields}), target)


def tracked_metric(rows: Sequence[dict]) -> str:
    """What a trial is ranked by (focusfl/metrics.py's selection metric); never a test-set metric."""
    metric = selection_metric(rows[0]) if rows else None
    if metric is not None:
        return metric
    raise ConfigError("tune: the problem reports none of rel_error, loss or val_loss (a neural network needs "
                      "validation=F in its SPEC)")


def trial_score(values: Sequence[float], metric: str, diverged: bool) -> float:
    """The value a step size is ranked by (lower is better): the final value, or for a
    stochastic metric the mean of the last third of the evaluations; +inf for a diverged run."""
    if diverged or not values:
        return math.inf
    tail = values[-max(1, len(values) // 3):] if metric in TAIL_METRICS else values[-1:]
    return math.fsum(tail) / len(tail) if all(math.isfinite(v) for v in tail) else math.inf


def summarize_trial(algorithm: str, lr: float, rows: Sequence[dict], diverged_at: int | None,
                    target: float | None) -> dict:
    """One grid point as a row: its score, best value, first round below the target."""
    metric = tracked_metric(rows)
    values = [float(row[metric]) for row in rows]
    final = trial_score(values, metric, diverged_at is not None)
    finite = [v for v in values if math.isfinite(v)]
    first = None if target is None else next((row["round"] for row in rows if float(row[metric]) <= target), None)
    return {
        "algorithm": algorithm,
        "lr": lr,
        "metric": metric,
        "final": final,
        "best": min(finite) if finite else math.inf,
        "first_round_below_target": first,
        "diverged_at": diverged_at,
    }


def run_trial(algorithm: str | dict, lr: float, setup: TuneSetup, *, rows: bool = False) -> dict:
    """Run one (algorithm, lr) pair of the grid through the one builder; returns its summary row
    (with ``rows=True``, the run's evaluated rows too, under "rows")."""
    result = execute(build(setup.trial(algorithm, lr)))
    summary = summarize_trial(algorithm_label(algorithm), lr, result.rows, result.diverged_at, setup.target)
    return {**summary, "rows": result.rows} if rows else summary


def algorithm_label(algorithm: str | dict) -> str:
    if isinstance(algorithm, dict):
        params = {k: v for k, v in algorithm.items() if k != "name"}
        return format_spec(str(algorithm["name"]), params)
    return algorithm


def ranking_key(trial: dict) -> tuple[float, float, float]:
    """Reaching the target first beats everything; then the lowest final value."""
    first = trial["first_round_below_target"]
    return (math.inf if first is None else float(first), trial["final"], trial["lr"])


def pick_best(trials: Iterable[dict]) -> dict:
    return min(trials, key=ranking_key)


def pick_stable(trials: Sequence[dict]) -> dict:
    """The best step among those at least one grid point below the observed edge of stability:
    a step is eligible when none of its seeds diverged and neither did the next larger step's.
    Stochastic runs near the edge blow up later than a short horizon sees (SCAFFOLD at 0.02 on
    mnist-demo: steady for 50 rounds on two seeds, diverged at round 75 in the full run, in
    float32 and float64 alike), so the step that beats its neighbour only by sitting at the
    edge is not taken. Without an eligible step, the best of all."""
    ordered = sorted(trials, key=lambda t: t["lr"])
    eligible = [t for k, t in enumerate(ordered)
                if not t["diverged"] and (k + 1 == len(ordered) or not ordered[k + 1]["diverged"])]
    return pick_best(eligible or ordered)


def choose(trials: Sequence[dict]) -> dict:
    """Convex problems: :func:`pick_best`; stochastic metrics (neural networks): :func:`pick_stable`."""
    stochastic = any(t["metric"] in TAIL_METRICS for t in trials)
    return pick_stable(trials) if stochastic else pick_best(trials)


def format_best(best: Sequence[dict], target: float | None) -> str:
    """The best run per algorithm; the first line names the metric it was ranked by."""
    metrics = sorted({row["metric"] for row in best})
    seeds = max((int(row.get("seeds", 1)) for row in best), default=1)
    spread = seeds > 1
    score = "final" if not set(metrics) & set(TAIL_METRICS) else "score"
    columns = [f"{'algorithm':<28}", f"{'best lr':>10}", f"{score:>11}"]
    columns += [f"{'(min - max)':>23}"] if spread else []
    columns += [f"{'min':>11}"] + ([f"{'first <= ' + format(target, 'g'):>16}"] if target is not None else [])
    header = " ".join(columns)
    what = f"means over {seeds} seeds" if spread else "its values"
    how = "; score = mean of the last third of the evaluations" if score == "score" else ""
    lines = [f"ranked by {', '.join(metrics) or 'nothing'}: {score} and min are {what}{how}", header, "-" * len(header)]
    for row in best:
        cells = [f"{row['algorithm']:<28}", f"{row['lr']:>10.4g}", f"{row['final']:>11.3e}"]
        if spread:
            cells.append(f"{'(' + format(row['final_min'], '.2e') + ' - ' + format(row['final_max'], '.2e') + ')':>23}")
        cells.append(f"{row['best']:>11.3e}")
        if target is not None:
            first = row["first_round_below_target"]
            cells.append(f"{'never' if first is None else format(first, 'g'):>16}")
        lines.append(" ".join(cells))
    return "\n".join(lines)


def _value(cell: str) -> float:
    """A metrics.csv cell as a number (an empty cell, a metric not measured that round, is NaN)."""
    try:
        return float(cell)
    except (TypeError, ValueError):
        return math.nan


def _number(value: float) -> int | float:
    return int(value) if value.is_integer() else value


def grid_rows(runs, folder: Path, target: float | None) -> list[dict]:
    """One row per (algorithm, lr) of a tune sweep: means over its seeds and their spread.

    ``first_round_below_target`` is the mean round at which the seeds reach ``target``, and
    only if every seed does (else None); ``final`` is the mean final value (inf if one diverged).
    """
    import csv

    from .aggregate import Series, _Reducer, _stats
    from ..runs.folder import METRICS, read_config
    from .layout import RUNS

    groups: dict[tuple, list] = {}
    metric = None
    for run in runs:
        path = folder / RUNS / run.key
        if not (path / METRICS).is_file():
            continue  # a failed trial
        info = read_config(path)
        with open(path / METRICS, newline="") as handle:
            reader = csv.DictReader(handle)
            rows = list(reader)
        metric = metric or tracked_metric(rows)
        status = info.get("status", "complete")
        reducer = _Reducer(Series(dict(run.axes), status), metric, () if target is None else (target,), 1 << 30)
        for row in rows:
            reducer.add(row)
        series = reducer.finish()
        series.final = trial_score([_value(row[metric]) for row in rows], metric, status == "diverged")
        series.axes["diverged_at"] = info.get("diverged_at_round")
        groups.setdefault((run.axes["algorithm"], run.axes["lr"]), []).append(series)
    out = []
    for (algorithm, lr), members in groups.items():
        finals = [m.final for m in members]
        reached = [m.reached[target][0] for m in members if target in m.reached]
        if target is None:
            reached = []
        diverged = [m.axes["diverged_at"] for m in members if m.axes["diverged_at"] is not None]
        stats = _stats(finals, "final")
        out.append({
            "algorithm": algorithm, "lr": lr, "metric": metric, "seeds": len(members),
            "final": stats["final_mean"], "final_std": stats["final_std"], "final_min": stats["final_min"],
            "final_max": stats["final_max"],
            "best": math.fsum(m.best for m in members) / len(members),
            "first_round_below_target": _number(math.fsum(reached) / len(reached))
            if reached and len(reached) == len(members) else None,
            "reached": len(reached), "diverged": len(diverged), "diverged_at": min(diverged) if diverged else None,
        })
    return out


# -- the search ---------------------------------------------------------------------------------
# The run fields tune takes (its trials' configuration), and its own defaults for them.
RUN_OPTIONS = ("problem", "participation", "work", "rounds", "local_steps", "seed", "dtype", "device",
               "eval_every", "schedule", "threads")
TUNE_DEFAULTS = {"rounds": 300}


def split_algorithms(text: str) -> list[str]:
    """``focus,fedavg:weighting=p,server_lr=1`` -> ["focus", "fedavg:weighting=p,server_lr=1"]: a
    comma starts a new algorithm unless what follows is one more key=value of the previous SPEC."""
    specs: list[str] = []
    for piece in text.split(","):
        piece = piece.strip()
        if specs and "=" in piece and ":" not in piece.split("=")[0]:
            specs[-1] += "," + piece
        elif piece:
            specs.append(piece)
    return specs


def expand_algorithms(names: Sequence[str]) -> list[str]:
    """'all' stands for every registered algorithm that is not a naming alias; each name may be
    a comma-separated list."""
    out: list[str] = []
    for name in (spec for text in names for spec in split_algorithms(text)):
        if name == "all":
            out.extend(n for n, cls in ALGORITHMS.items() if cls.alias_of is None)
        else:
            make_algorithm(name)  # fail now on unknown names or keys, before any run
            out.append(name)
    return out


def is_neural_network(problem: str | dict) -> bool:
    name = problem.get("name") if isinstance(problem, dict) else parse_spec(problem)[0]
    return name == "nn"


def with_validation(problem: str | dict, fraction: float | None) -> dict:
    """The nn problem as a dict with a validation split: ``fraction``, else the SPEC's own, else
    DEFAULT_VALIDATION. A SPEC that holds out nothing cannot be tuned without the test set."""
    spec = dict(problem) if isinstance(problem, dict) else {"name": "nn", **parse_spec(problem)[1]}
    if fraction is not None:
        spec["validation"] = fraction
    spec.setdefault("validation", DEFAULT_VALIDATION)
    spec["evaluate"] = "validation"  # trials skip the test set: it plays no part in the choice
    if not 0 < float(spec["validation"]) < 1:
        raise ConfigError(f"tuning a neural network needs a validation share in (0, 1), got {spec['validation']}")
    return spec


@dataclass(frozen=True)
class TuneSearch:
    """The search itself: which algorithms, the step-size grid, seeds, workers and the folder."""

    algorithms: tuple[str, ...]
    lr_min: float = 1e-5
    lr_max: float = 1e-1
    points: int = 9
    seeds: int = 1
    workers: int = 1  # trials at a time (each with the setup's threads)
    out: str = "runs/tune"


def make_setup(run: RunConfig, *, target: float | None, validation: float | None) -> TuneSetup:
    """A checked TuneSetup of the trials' shared ``run``: a neural network gets its validation
    split and no target; other problems the default target unless one is given."""
    if target is not None and not target > 0:
        raise ConfigError(f"target must be positive, got {target}")
    chosen = DEFAULT_TARGET if target is None else target
    if is_neural_network(run.problem):
        if target is not None:
            raise ConfigError("--target does not apply to neural networks: they are ranked by their validation loss")
        return TuneSetup(run.replace(problem=with_validation(run.problem, validation)), None)
    if validation is not None:
        raise ConfigError("--validation applies to neural networks (problem nn) only")
    return TuneSetup(run, chosen)


def _is_work(spec: str | dict) -> bool:
    """Whether ``spec`` asks for a work process other than fixed (fixed: no work axis at all)."""
    return parse_spec(spec)[0] != "fixed"


# What a tune's folder may be extended with (more steps, seeds or algorithms reuse its trials).
SEARCH_KEYS = ("name", "algorithms", "lr", "seeds", "targets")


def tune_identity(data: dict) -> dict:
    """The setup a tune's trials share (problem, participation, work, rounds, ...): a folder
    that holds a tune of another setup is refused rather than mixed with (io.folders)."""
    return {key: value for key, value in data.items() if key not in SEARCH_KEYS}


def tune(setup: TuneSetup, search: TuneSearch) -> int:
    """Run the grid as a sweep into ``search.out``, print the best step per algorithm; 0, or a
    FocusflError / DivergenceError when trials failed or every step diverged."""
    if search.seeds < 1 or search.workers < 1:
        raise ConfigError("seeds and workers must be >= 1")
    grid = lr_grid(search.lr_min, search.lr_max, search.points)
    algorithms = expand_algorithms(search.algorithms)
    seeds = list(range(setup.seed, setup.seed + search.seeds))
    run = setup.run.with_problem_defaults()
    data = dict(
        name="tune", algorithms=algorithms, problems=[run.problem], participation=[run.participation], lr=grid,
        seeds=seeds, rounds=run.rounds, eval_every=run.eval_every, schedule=run.schedule, dtype=run.dtype,
        device=run.device, engine=run.engine, targets=[] if setup.target is None else [setup.target],
        **({"local_steps": run.local_steps} if run.local_steps is not None else {}),
        # A work axis only when asked: a tune under fixed work writes the tables it always did.
        **({"work": [run.work]} if _is_work(run.work) else {}))
    experiment = make_experiment(**data)
    found: dict = {}

    def tables(experiment, runs, folder, *, band, failures) -> list[str]:
        trials = grid_rows(runs, folder, setup.target)
        best = [choose([t for t in trials if t["algorithm"] == name])
                for name in dict.fromkeys(t["algorithm"] for t in trials)]
        write_csv(folder / "grid.csv", trials)
        write_csv(folder / "summary.csv", best)
        write_json(folder / "config.json", {"tune": setup_record(setup), "grid": grid, "algorithms": algorithms,
                                            "seeds": seeds})
        found.update(trials=trials, best=best)
        return ["grid.csv", "summary.csv", "config.json"]

    # Every trial is a run folder under OUT/runs/: a rerun after a crash skips the finished ones.
    report = run_sweep(experiment, search.out, workers=search.workers, threads=run.threads, progress=True,
                       kind="tune", tables=tables, experiment_identity=tune_identity(data))
    if report.skipped:
        print(f"reused {report.skipped} trial(s) finished by an earlier run")
    if report.restarted:
        print(restart_note(report))
    best = found["best"]
    print(format_best(best, setup.target))
    print(f"\nwrote {Path(search.out) / 'summary.csv'} (best per algorithm), grid.csv (every step size"
          f"{', over ' + str(len(seeds)) + ' seeds' if len(seeds) > 1 else ''}), config.json, and the trials "
          "as a sweep: experiment.toml, runs/")
    if report.failed:
        raise FocusflError(f"{len(report.failed)} trial(s) failed (the first: {report.failed[0]['error']}); "
                           "run the same command again to retry them")
    diverged = [row["algorithm"] for row in best if row["diverged_at"] is not None]
    if diverged:
        raise DivergenceError(
            f"every step size in [{search.lr_min:g}, {search.lr_max:g}] diverged for {', '.join(diverged)}; "
            "lower --lr-min"
        )
    return 0


# The keys of the tune folder's config.json "tune" object, in the order it has always had them:
# the trials' shared run fields and the target.
SETUP_KEYS = ("problem", "participation", "rounds", "local_steps", "seed", "target", "dtype", "device", "eval_every",
              "schedule", "work")


def setup_record(setup: TuneSetup) -> dict:
    """The tune folder's record of its setup (config.json's "tune")."""
    run = setup.run.with_problem_defaults()
    return {key: setup.target if key == "target" else getattr(run, key) for key in SETUP_KEYS}

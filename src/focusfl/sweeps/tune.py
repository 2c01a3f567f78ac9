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

The command runs the grid x ``--seeds`` as a sweep (sweeps/sweep.py): every trial is a run
folder under ``OUT/runs/`` (the sweep's experiment.toml beside them), ``--workers`` runs them in
parallel, and the same command again skips finished trials. With several seeds a step size is
ranked by its mean over the seeds: the mean round at which it reaches the target (only if every
seed reaches it), else its mean score; grid.csv and summary.csv give the spread (std, min, max)
beside the mean.
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Hashable, Iterable, Mapping, NamedTuple, Sequence

from ..algorithms import ALGORITHMS, make_algorithm
from ..errors import ConfigError, DivergenceError, FocusflError
from ..io.atomic import write_csv, write_json
from ..metrics import selection_metric
from ..privacy.config import parse_dp
from ..runs.config import RunConfig, WithRun, resolved_dp
from ..runs.driver import build, execute
from ..runs.folder import METRICS, read_config
from ..spec import format_spec, parse_spec
from ..threads import DEFAULT_THREADS
from .aggregate import Series, _Reducer, _stats
from .layout import RUNS
from .sweep import SPEC_RUN_KEYS, compute_configs, make_experiment, restart_note, run_sweep

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


def trial_row(algorithm: str | dict, lr: float, setup: TuneSetup, result, *, rows: bool = False) -> dict:
    """The summary row of the trial (``algorithm``, ``lr``) under ``setup`` that ran to ``result``
    (with ``rows=True``, the run's evaluated rows too, under "rows"): the one definition of a
    trial's row, whichever way the trial was computed."""
    summary = summarize_trial(algorithm_label(algorithm), lr, result.rows, result.diverged_at, setup.target)
    return {**summary, "rows": result.rows} if rows else summary


def run_trial(algorithm: str | dict, lr: float, setup: TuneSetup, *, rows: bool = False) -> dict:
    """Run one (algorithm, lr) pair of the grid through the one builder; returns its summary row
    (:func:`trial_row`)."""
    return trial_row(algorithm, lr, setup, execute(build(setup.trial(algorithm, lr))), rows=rows)


class Trial(NamedTuple):
    """One trial: ``algorithm`` at step ``lr`` under ``setup``."""

    algorithm: str | dict
    lr: float
    setup: TuneSetup


def run_trials(trials: Sequence[Trial], *, rows: bool = False, batch_runs: int | str = "auto") -> list[dict]:
    """:func:`run_trial` of every (algorithm, lr, setup) of ``trials``, in their order, computed in
    batches of runs (sweep.compute_configs: the trials of one problem and algorithm stepped
    together, at most ``batch_runs`` at a time); each row the one the trial alone gives."""
    results = compute_configs([setup.trial(algorithm, lr) for algorithm, lr, setup in trials], batch_runs)
    return [trial_row(algorithm, lr, setup, result, rows=rows)
            for (algorithm, lr, setup), result in zip(trials, results)]


def trial_evaluator(cells: Mapping[Hashable, tuple], *, rows: bool = False, batch_runs: int | str = "auto",
                    reduce: Callable[[list[dict]], dict] | None = None
                    ) -> Callable[[dict[Hashable, list[float]]], dict[Hashable, list[dict]]]:
    """The ``evaluate`` of :func:`search_steps` for several searches at once: ``cells`` maps each
    search's key to (algorithm, setup) or (algorithm, [setup, ...]) (one setup per seed, say).
    Every trial a round of the search asks for (each key's steps, under each of its setups) runs
    in one call of :func:`run_trials`, so that the trials of all the searches are computed in
    batches; a step's row is ``reduce`` of its trials' rows (one per setup, in their order;
    default: the first). A search's choice depends on its own trials alone, so searching
    several keys together chooses what searching each alone does."""
    def setups(key) -> Sequence[TuneSetup]:
        given = cells[key][1]
        return [given] if isinstance(given, TuneSetup) else list(given)

    def evaluate(asked: dict[Hashable, list[float]]) -> dict[Hashable, list[dict]]:
        wanted = [(key, lr, one) for key, lrs in asked.items() for lr in lrs for one in setups(key)]
        found = iter(run_trials([Trial(cells[key][0], lr, one) for key, lr, one in wanted], rows=rows,
                                batch_runs=batch_runs))
        out: dict[Hashable, list[dict]] = {}
        for key, lrs in asked.items():
            for _ in lrs:
                trials = [next(found) for _ in setups(key)]
                out.setdefault(key, []).append(trials[0] if reduce is None else reduce(trials))
        return out

    return evaluate


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
                if not is_diverged(t) and (k + 1 == len(ordered) or not is_diverged(ordered[k + 1]))]
    return pick_best(eligible or ordered)


def choose(trials: Sequence[dict]) -> dict:
    """Convex problems: :func:`pick_best`; stochastic metrics (neural networks): :func:`pick_stable`."""
    stochastic = any(t.get("metric") in TAIL_METRICS for t in trials)
    return pick_stable(trials) if stochastic else pick_best(trials)


# -- the search rule: a grid extended until its best step is interior ----------------------------
# At most this many steps are added beyond each end of the given grid; a best step still at an
# end after that is reported as capped (its optimum may lie further out).
EXTEND_CAP = 6


def is_diverged(trial: dict) -> bool:
    """A trial that diverged (one seed of it, for a grid row over seeds) or scored +inf."""
    return bool(trial.get("diverged")) or trial.get("diverged_at") is not None or not trial["final"] < math.inf


def grid_ratio(grid: Sequence[float]) -> float:
    """The factor between neighbouring steps of a log-spaced grid (the extension keeps it): its
    round value at three significant digits where that gives back every step of the grid to the
    grid's own precision (the presets' x 1/9 .. 3, rounded to three digits, extend by 3, not
    2.9992), else the exact one (tune's 1e-5 .. 1e-4 in three steps extends by 10 ** 0.5, not 3.16)."""
    ordered = sorted(set(grid))
    if len(ordered) < 2:
        return 1.0  # a single given step is not extended (search_steps)
    exact = (ordered[-1] / ordered[0]) ** (1.0 / (len(ordered) - 1))
    rounded = float(f"{exact:.3g}")
    # Within one unit of the grid's last digit (its steps and its first step each rounded once).
    tolerance = 10.0 ** (1 - max(_digits(lr) for lr in ordered))
    if all(abs(ordered[0] * rounded ** k - lr) <= tolerance * lr for k, lr in enumerate(ordered)):
        return rounded
    return exact


def _digits(value: float) -> int:
    """The fewest significant digits that write ``value`` exactly (0.00556 -> 3, 3.16228e-05 -> 6)."""
    return next(d for d in range(1, 18) if float(f"{value:.{d}g}") == value)


def _step(value: float) -> float:
    return float(f"{value:.6g}")


@dataclass(frozen=True)
class StepChoice:
    """The step a search settled on for one algorithm: the chosen trial, its neighbours in the
    (extended) grid, why the search stopped there, and the steps it added beyond the given grid."""

    trial: dict
    lower: dict | None
    upper: dict | None
    reason: str
    added: tuple[float, ...] = ()
    capped: bool = False

    @property
    def lr(self) -> float:
        return self.trial["lr"]


def settle(trials: Sequence[dict], pick: Callable[[Sequence[dict]], dict] = choose) -> tuple[dict, int, list[dict]]:
    """(the chosen trial, its index, the trials ordered by step)."""
    ordered = sorted(trials, key=lambda t: t["lr"])
    best = pick(ordered)
    return best, next(k for k, t in enumerate(ordered) if t is best), ordered


def next_steps(trials: Sequence[dict], grid: Sequence[float], ratio: float, added_below: int, added_above: int, *,
               pick: Callable[[Sequence[dict]], dict] = choose, cap: int = EXTEND_CAP) -> list[float]:
    """The steps to try next: one grid step beyond the end the best step sits at (none when it is
    interior, when the step above it diverged, or when that end was extended ``cap`` times). The
    k-th step beyond an end is the grid's end times ``ratio ** k``, rounded once: a step is never
    the rounded previous step times the ratio (the drift would leave the grid: 0.00099856, not 0.001).
    Both ends count from the grid's largest step, which a grid of rounded steps (x 1/9 .. 3) holds
    exactly, unlike its smallest."""
    best, k, ordered = settle(trials, pick)
    top, span = max(grid), len(set(grid)) - 1
    wanted = []
    if k == len(ordered) - 1 and added_above < cap:
        wanted.append(_step(top * ratio ** (added_above + 1)))
    if k == 0 and added_below < cap:
        wanted.append(_step(top / ratio ** (span + added_below + 1)))
    return wanted


def describe_choice(trials: Sequence[dict], added: Sequence[float] = (), *, cap: int = EXTEND_CAP,
                    pick: Callable[[Sequence[dict]], dict] = choose, grid: Sequence[float] = ()) -> StepChoice:
    """The StepChoice of a finished search over ``trials`` (``added``: steps beyond ``grid``)."""
    best, k, ordered = settle(trials, pick)
    lower = ordered[k - 1] if k > 0 else None
    upper = ordered[k + 1] if k + 1 < len(ordered) else None
    below = sum(1 for lr in added if grid and lr < min(grid))
    above = len(added) - below
    capped = (upper is None and above >= cap) or (lower is None and below >= cap)
    if is_diverged(best):
        reason = "every step diverged"
    elif upper is None and lower is None:
        reason = "the only step tried"
    elif upper is None:
        reason = "the largest step tried" + (f" after {above} added above the grid, the cap" if capped else "")
    elif lower is None:
        reason = "the smallest step tried" + (f" after {below} added below the grid, the cap" if capped else "")
    elif is_diverged(upper):
        reason = "bounded by a diverged step above"
    elif k + 2 < len(ordered) and is_diverged(ordered[k + 2]) and ranking_key(upper) < ranking_key(best):
        reason = "one step below the edge of stability (the step above scores better but sits next to a diverged one)"
    else:
        reason = "interior: both neighbours score worse"
    return StepChoice(best, lower, upper, reason, tuple(sorted(added)), capped)


def search_steps(evaluate: Callable[[dict[str, list[float]]], dict[str, list[dict]]],
                 grids: dict[str, Sequence[float]], *, pick: Callable[[Sequence[dict]], dict] = choose,
                 cap: int = EXTEND_CAP) -> dict[str, StepChoice]:
    """The search rule of ``focusfl tune``, the presets and the studies: run each algorithm's grid
    (``evaluate({key: [lr, ...]})`` returns the trials of the steps asked, per key), then extend it
    geometrically (the grid's own ratio) past the end its best step sits at, one step at a time,
    until the best step is interior or bounded by a diverged step; at most ``cap`` steps beyond
    each end (a best step still at the end is reported as capped). A grid of one step is the
    caller's choice and is run as given."""
    trials = {key: [] for key in grids}
    added = {key: [] for key in grids}
    ratios = {key: grid_ratio(grid) for key, grid in grids.items()}
    asked = {key: sorted(set(float(lr) for lr in grid)) for key, grid in grids.items()}
    while asked:
        for key, found in evaluate(asked).items():
            trials[key].extend(found)
        nxt = {}
        for key in asked:
            if not trials[key]:
                continue  # its trials failed: nothing to choose from (the caller reports the failures)
            if len(set(grids[key])) < 2:
                continue  # one given step is a choice, not a search: it is not extended
            below = sum(1 for lr in added[key] if lr < min(grids[key]))
            wanted = next_steps(trials[key], grids[key], ratios[key], below, len(added[key]) - below, pick=pick,
                                cap=cap)
            if wanted:
                added[key] += wanted
                nxt[key] = wanted
        asked = nxt
    return {key: describe_choice(trials[key], added[key], cap=cap, pick=pick, grid=grids[key])
            for key in grids if trials[key]}


def format_neighbour(trial: dict | None) -> str:
    """A neighbouring step in a choice's description: its step and score, or that it diverged."""
    if trial is None:
        return "none tried"
    if is_diverged(trial):
        return f"{trial['lr']:.4g} (diverged)"
    first = trial.get("first_round_below_target")
    return f"{trial['lr']:.4g} ({trial['final']:.3g}" + (f", target at round {first:g})" if first is not None else ")")


def format_choice(name: str, choice: StepChoice) -> str:
    """One line: the chosen step, its neighbours, the reason (and the extension, when there was one)."""
    line = (f"{name}: lr {choice.lr:.4g}; below {format_neighbour(choice.lower)}, above "
            f"{format_neighbour(choice.upper)}; {choice.reason}")
    if choice.added:
        line += f" (added beyond the grid: {', '.join(f'{lr:.4g}' for lr in choice.added)})"
    return line


def choice_columns(choice: StepChoice) -> dict:
    """The search's columns of a summary row."""
    def score(trial):
        return None if trial is None else ("diverged" if is_diverged(trial) else trial["final"])

    return {"lower_lr": None if choice.lower is None else choice.lower["lr"], "lower_score": score(choice.lower),
            "upper_lr": None if choice.upper is None else choice.upper["lr"], "upper_score": score(choice.upper),
            "reason": choice.reason, "added_steps": ";".join(f"{lr:g}" for lr in choice.added),
            "capped": choice.capped}


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
               "eval_every", "schedule", "threads", "dp", "numerics")
TUNE_DEFAULTS = {"rounds": 300}


def split_algorithms(text: str) -> list[str]:
    """``focus,fedavg:weighting=p,server_lr=1`` -> ["focus", "fedavg:weighting=p,server_lr=1"]: a
    comma starts a new algorithm unless what follows is one more key=value of the previous SPEC.
    A blank piece (``' '``, ``','``, ``'focus,,fedavg'``) is a ConfigError."""
    specs: list[str] = []
    for piece in text.split(","):
        piece = piece.strip()
        if not piece:
            raise ConfigError(f"--algorithm {text!r}: an empty algorithm name; give NAME or NAME:key=value, "
                              "several as a comma-separated list (focus,fedavg)")
        if specs and "=" in piece and ":" not in piece.split("=")[0]:
            specs[-1] += "," + piece
        else:
            specs.append(piece)
    return specs


# Where tune takes the run keys that a SPEC may not hold (sweep.SPEC_RUN_KEYS).
SPEC_RUN_OPTIONS = {"lr": "--lr-min and --lr-max (tune searches the step between them)", "local_steps": "--local-steps"}


def _checked_spec(spec: str) -> dict:
    """The algorithm ``spec`` builds, as its describe() dict (its identity: every hyperparameter,
    defaults included); a ConfigError for an unknown name or key, or a run key inside the SPEC."""
    for key in parse_spec(spec)[1]:
        if key in SPEC_RUN_KEYS:
            raise ConfigError(f"--algorithm {spec!r}: give {key} as {SPEC_RUN_OPTIONS[key]}, not inside the SPEC")
    return make_algorithm(spec).describe()


def expand_algorithms(names: Sequence[str]) -> list[str]:
    """'all' stands for every registered algorithm that is not a naming alias; each name may be
    a comma-separated list. Every SPEC is checked before any trial runs: blank names, lr or
    local_steps inside a SPEC, unknown names or keys, and one algorithm listed twice are refused."""
    out: list[str] = []
    for name in (spec for text in names for spec in split_algorithms(text)):
        out.extend((n for n, cls in ALGORITHMS.items() if cls.alias_of is None) if name == "all" else [name])
    seen: dict[str, str] = {}
    for spec in out:
        identity = repr(_checked_spec(spec))
        if identity in seen:
            twice = f"'{spec}' is listed twice" + (f" (as '{seen[identity]}' too)" if seen[identity] != spec else "")
            raise ConfigError(f"--algorithm: {twice}; give each algorithm once")
        seen[identity] = spec
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
    batch_runs: int | str = "auto"  # trials stepped together (runs/batch.py)


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


def algorithm_table(spec: str, lrs: Sequence[float]) -> dict:
    """A sweep's algorithm table of ``spec`` at the steps ``lrs`` (its own lr axis)."""
    name, params = parse_spec(spec)
    return {"name": name, **params, "lr": sorted(lrs)}


# What a tune's folder may be extended with (more steps, seeds or algorithms reuse its trials).
SEARCH_KEYS = ("name", "algorithms", "lr", "seeds", "targets")


def tune_identity(data: dict, threads: int = DEFAULT_THREADS) -> dict:
    """The setup a tune's trials share (problem, participation, work, rounds, dp, ...): a folder
    that holds a tune of another setup is refused rather than mixed with (io.folders).
    ``threads``: the trials' torch threads, which change their bytes at the rounding level; named
    where not the default, so a folder made before keeps its identity."""
    identity = {key: value for key, value in data.items() if key not in SEARCH_KEYS}
    return identity if threads == DEFAULT_THREADS else {**identity, "threads": threads}


def tune(setup: TuneSetup, search: TuneSearch) -> int:
    """Run the grid as a sweep into ``search.out``, extending it past an end where an algorithm's
    best step sits (:func:`search_steps`), print the chosen step per algorithm with its neighbours
    and the reason; 0, or a FocusflError / DivergenceError when trials failed or every step diverged."""
    if search.seeds < 1 or search.workers < 1:
        raise ConfigError("seeds and workers must be >= 1")
    grid = lr_grid(search.lr_min, search.lr_max, search.points)
    algorithms = expand_algorithms(search.algorithms)
    labels = {spec: algorithm_label({"name": parse_spec(spec)[0], **parse_spec(spec)[1]}) for spec in algorithms}
    seeds = list(range(setup.seed, setup.seed + search.seeds))
    run = setup.run.with_problem_defaults()
    steps = {spec: list(grid) for spec in algorithms}  # every step tried so far, per algorithm
    found: dict = {}
    reports = []

    def data() -> dict:
        # Each algorithm's table carries the steps its search has tried so far.
        return dict(
            name="tune", algorithms=[algorithm_table(spec, lrs) for spec, lrs in steps.items()],
            problems=[run.problem], participation=[run.participation], seeds=seeds, rounds=run.rounds,
            eval_every=run.eval_every, schedule=run.schedule, dtype=run.dtype, device=run.device, engine=run.engine,
            targets=[] if setup.target is None else [setup.target],
            **({"local_steps": run.local_steps} if run.local_steps is not None else {}),
            # A work axis only when asked: a tune under fixed work writes the tables it always did.
            **({"work": [run.work]} if _is_work(run.work) else {}),
            # The trials' DP (the sweep refuses what run refuses before any trial starts).
            **({} if parse_dp(run.dp) is None else {"dp": run.dp}),
            # The trials' numerical environment; native left out, as every tune before it wrote.
            **({} if run.numerics == "native" else {"numerics": run.numerics}))

    def tables(experiment, runs, folder, *, band, failures) -> list[str]:
        trials = grid_rows(runs, folder, setup.target)
        best = []
        for spec in algorithms:
            mine = [t for t in trials if t["algorithm"] == labels[spec]]
            if mine:
                choice = describe_choice(mine, [lr for lr in steps[spec] if lr not in grid], grid=grid)
                best.append({**choice.trial, **choice_columns(choice)})
        write_csv(folder / "grid.csv", trials)
        write_csv(folder / "summary.csv", best)
        write_json(folder / "config.json", {"tune": setup_record(setup), "grid": grid, "algorithms": algorithms,
                                            "seeds": seeds, "steps": steps, "extend_cap": EXTEND_CAP})
        found.update(trials=trials, best=best)
        return ["grid.csv", "summary.csv", "config.json"]

    def evaluate(asked: dict[str, list[float]]) -> dict[str, list[dict]]:
        if reports:
            for spec, new in asked.items():
                print(f"extending the grid of {labels[spec]}: {', '.join(f'{lr:.4g}' for lr in new)} (its best step "
                      "was at the end of the steps tried)")
        for spec, new in asked.items():
            steps[spec] = sorted(set(steps[spec]) | set(new))
        # Every trial is a run folder under OUT/runs/: a rerun after a crash skips the finished ones.
        asked_data = data()
        reports.append(run_sweep(make_experiment(**asked_data), search.out, workers=search.workers,
                                 threads=run.threads, progress=True, kind="tune", tables=tables,
                                 experiment_identity=tune_identity(asked_data, run.threads),
                                 batch_runs=search.batch_runs))
        return {spec: [t for t in found["trials"] if t["algorithm"] == labels[spec] and t["lr"] in new]
                for spec, new in asked.items()}

    choices = search_steps(evaluate, {spec: grid for spec in algorithms})
    if reports[0].skipped:
        print(f"reused {reports[0].skipped} trial(s) finished by an earlier run")
    for report in reports:
        if report.restarted:
            print(restart_note(report))
    print(format_best(found["best"], setup.target))
    print("\nthe chosen steps (the search extends the grid past an end until the best step is interior or bounded "
          f"by a diverged step, at most {EXTEND_CAP} steps beyond each end):")
    for spec, choice in choices.items():
        print("  " + format_choice(labels[spec], choice) + ("; CAPPED: a step further out may do better"
                                                             if choice.capped else ""))
    print(f"\nwrote {Path(search.out) / 'summary.csv'} (best per algorithm), grid.csv (every step size"
          f"{', over ' + str(len(seeds)) + ' seeds' if len(seeds) > 1 else ''}), config.json, and the trials "
          "as a sweep: experiment.toml, runs/")
    failed = [f for report in reports for f in report.failed]
    if failed:
        raise FocusflError(f"{len(failed)} trial(s) failed (the first: {failed[0]['error']}); "
                           "run the same command again to retry them")
    diverged = [labels[spec] for spec, choice in choices.items() if is_diverged(choice.trial)]
    if diverged:
        tried = [lr for lrs in steps.values() for lr in lrs]
        raise DivergenceError(
            f"every step size in [{min(tried):g}, {max(tried):g}] diverged for {', '.join(diverged)}; "
            "lower --lr-min"
        )
    return 0


# The keys of the tune folder's config.json "tune" object: the trials' shared run fields and the
# target in the order they have always had, then every other run field tune takes (threads, dp,
# numerics), so that the record names every setting that changes a trial's bytes
# (tests/test_tune.py).
_SETUP_FIRST = ("problem", "participation", "rounds", "local_steps", "seed", "target", "dtype", "device",
                "eval_every", "schedule", "work")
SETUP_KEYS = (*_SETUP_FIRST, *(key for key in RUN_OPTIONS if key not in _SETUP_FIRST))


def setup_record(setup: TuneSetup) -> dict:
    """The tune folder's record of its setup (config.json's "tune")."""
    run = setup.run.with_problem_defaults()
    shown = {"target": setup.target, "dp": resolved_dp(run.dp)}  # dp as a run's config.json keeps it
    return {key: shown[key] if key in shown else getattr(run, key) for key in SETUP_KEYS}

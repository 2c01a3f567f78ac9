"""``focusfl tune``: grid search of the step size, per algorithm.

Both papers tune step sizes by grid search; this runs every algorithm asked for at each step
size of a small log-spaced grid (same problem, participation, seed and rounds) and keeps the
best one per algorithm:

- a run that reaches ``target`` (default 1e-10 on the tracked metric) beats every run that
  does not, and among those the one that gets there first wins;
- otherwise the lowest final value wins (diverged runs count as +inf).

The tracked metric is rel_error when the problem knows its minimizer, else the loss (for neural
networks, the test loss: their rows carry no full training loss). Only the
(local) step size ``lr`` is searched; other hyperparameters (server_lr, local_steps, ...) are
fixed by the algorithm SPEC and the options.

The command runs the grid x ``--seeds`` as a sweep (experiments/sweep.py): every trial is a run
folder under ``OUT/runs/``, ``--workers`` runs them in parallel, and the same command again
skips finished trials. With several seeds a step size is ranked by its mean over the seeds: the
mean round at which it reaches the target (only if every seed reaches it), else its mean final
value; grid.csv and summary.csv give the spread (std, min, max) beside the mean.
"""
from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Sequence

from ..errors import ConfigError

DEFAULT_TARGET = 1e-10


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
class TuneSetup:
    """What every trial shares: problem, participation, budget and the success target."""

    problem: str | dict
    participation: str | dict = "full"
    rounds: int = 300
    local_steps: int | None = None
    seed: int = 0
    target: float = DEFAULT_TARGET
    dtype: str = "float64"
    device: str = "cpu"
    eval_every: int = 1
    schedule: str = "constant"


def tracked_metric(rows: Sequence[dict]) -> str:
    for metric in ("rel_error", "loss", "test_loss"):
        if rows and metric in rows[0]:
            return metric
    raise ConfigError("tune: the problem reports none of rel_error, loss or test_loss")


def summarize_trial(algorithm: str, lr: float, rows: Sequence[dict], diverged_at: int | None, target: float) -> dict:
    """One grid point as a row: final and best value, first round below the target."""
    metric = tracked_metric(rows)
    values = [float(row[metric]) for row in rows]
    final = math.inf if diverged_at is not None else values[-1]
    finite = [v for v in values if math.isfinite(v)]
    first = next((row["round"] for row in rows if float(row[metric]) <= target), None)
    return {
        "algorithm": algorithm,
        "lr": lr,
        "metric": metric,
        "final": final,
        "best": min(finite) if finite else math.inf,
        "first_round_below_target": first,
        "diverged_at": diverged_at,
    }


def run_trial(algorithm: str | dict, lr: float, setup: TuneSetup) -> dict:
    """Run one (algorithm, lr) pair of the grid; returns its summary row."""
    from .runner import RunConfig, build, execute

    config = RunConfig(
        algorithm=algorithm, problem=setup.problem, participation=setup.participation,
        rounds=setup.rounds, local_steps=setup.local_steps, lr=lr, seed=setup.seed,
        dtype=setup.dtype, device=setup.device, eval_every=setup.eval_every, schedule=setup.schedule,
    )
    built = build(config)
    result = execute(built)
    return summarize_trial(algorithm_label(algorithm), lr, result.rows, result.diverged_at, setup.target)


def algorithm_label(algorithm: str | dict) -> str:
    if isinstance(algorithm, dict):
        from ..spec import format_spec

        params = {k: v for k, v in algorithm.items() if k != "name"}
        return format_spec(str(algorithm["name"]), params)
    return algorithm


def ranking_key(trial: dict) -> tuple[float, float, float]:
    """Reaching the target first beats everything; then the lowest final value."""
    first = trial["first_round_below_target"]
    return (math.inf if first is None else float(first), trial["final"], trial["lr"])


def pick_best(trials: Iterable[dict]) -> dict:
    return min(trials, key=ranking_key)


def format_best(best: Sequence[dict], target: float) -> str:
    """The best run per algorithm; the first line names the metric it was ranked by."""
    metrics = sorted({row["metric"] for row in best})
    seeds = max((int(row.get("seeds", 1)) for row in best), default=1)
    spread = seeds > 1
    header = (f"{'algorithm':<28} {'best lr':>10} {'final':>11} {'(min - max)':>23} {'min':>11} "
              f"{'first <= ' + format(target, 'g'):>16}") if spread else \
        f"{'algorithm':<28} {'best lr':>10} {'final':>11} {'min':>11} {'first <= ' + format(target, 'g'):>16}"
    what = f"means over {seeds} seeds" if spread else "its values"
    lines = [f"ranked by {', '.join(metrics) or 'nothing'}: final and min are {what}", header, "-" * len(header)]
    for row in best:
        first = row["first_round_below_target"]
        first_text = "never" if first is None else f"{first:g}"
        if spread:
            span = f"({row['final_min']:.2e} - {row['final_max']:.2e})"
            lines.append(f"{row['algorithm']:<28} {row['lr']:>10.4g} {row['final']:>11.3e} {span:>23} "
                         f"{row['best']:>11.3e} {first_text:>16}")
        else:
            lines.append(f"{row['algorithm']:<28} {row['lr']:>10.4g} {row['final']:>11.3e} {row['best']:>11.3e} "
                         f"{first_text:>16}")
    return "\n".join(lines)


def _number(value: float) -> int | float:
    return int(value) if value.is_integer() else value


def grid_rows(runs, folder: Path, target: float) -> list[dict]:
    """One row per (algorithm, lr) of a tune sweep: means over its seeds and their spread.

    ``first_round_below_target`` is the mean round at which the seeds reach ``target``, and
    only if every seed does (else None); ``final`` is the mean final value (inf if one diverged).
    """
    import csv

    from .aggregate import Series, _Reducer, _stats
    from .run_folder import CONFIG, METRICS
    from .sweep import RUNS

    groups: dict[tuple, list] = {}
    metric = None
    for run in runs:
        path = folder / RUNS / run.key
        if not (path / METRICS).is_file():
            continue  # a failed trial
        info = json.loads((path / CONFIG).read_text())
        with open(path / METRICS, newline="") as handle:
            reader = csv.DictReader(handle)
            rows = list(reader)
        metric = metric or tracked_metric(rows)
        reducer = _Reducer(Series(dict(run.axes), info.get("status", "complete")), metric, (target,), 1 << 30)
        for row in rows:
            reducer.add(row)
        series = reducer.finish()
        series.axes["diverged_at"] = info.get("diverged_at_round")
        groups.setdefault((run.axes["algorithm"], run.axes["lr"]), []).append(series)
    out = []
    for (algorithm, lr), members in groups.items():
        finals = [m.final for m in members]
        reached = [m.reached[target][0] for m in members if target in m.reached]
        diverged = [m.axes["diverged_at"] for m in members if m.axes["diverged_at"] is not None]
        stats = _stats(finals, "final")
        out.append({
            "algorithm": algorithm, "lr": lr, "metric": metric, "seeds": len(members),
            "final": stats["final_mean"], "final_std": stats["final_std"], "final_min": stats["final_min"],
            "final_max": stats["final_max"],
            "best": math.fsum(m.best for m in members) / len(members),
            "first_round_below_target": _number(math.fsum(reached) / len(reached)) if len(reached) == len(members) else None,
            "reached": len(reached), "diverged": len(diverged), "diverged_at": min(diverged) if diverged else None,
        })
    return out


# -- command line ------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--algorithm", action="append", required=True,
                        help="algorithm NAME or NAME:key=value,... (repeat for several; 'all' = every non-alias)")
    parser.add_argument("--problem", default="ridge", help="problem SPEC (default ridge)")
    parser.add_argument("--participation", default="full", help="participation SPEC (default full)")
    parser.add_argument("--rounds", type=int, default=300, help="rounds per trial (default 300)")
    parser.add_argument("--local-steps", type=int, default=None, help="local steps tau for every algorithm")
    parser.add_argument("--lr-min", type=float, default=1e-5, help="smallest step size (default 1e-5)")
    parser.add_argument("--lr-max", type=float, default=1e-1, help="largest step size (default 1e-1)")
    parser.add_argument("--points", type=int, default=9, help="grid points, log-spaced (default 9)")
    parser.add_argument("--target", type=float, default=DEFAULT_TARGET,
                        help="success level of the tracked metric (default 1e-10)")
    parser.add_argument("--seed", type=int, default=0, help="the first seed")
    parser.add_argument("--seeds", type=int, default=1,
                        help="seeds per step size (--seed, --seed + 1, ...); the best step is the best on average")
    parser.add_argument("--workers", type=int, default=1, help="trials at a time on this machine")
    parser.add_argument("--threads", type=int, default=None, help="torch threads per worker (default 1)")
    parser.add_argument("--dtype", choices=["float32", "float64"], default=None,
                        help="default: the problem's (float32 for neural networks, float64 otherwise)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--eval-every", type=int, default=1, help="evaluate every E rounds")
    parser.add_argument("--schedule", choices=["constant", "sqrt"], default="constant")
    parser.add_argument("--out", default="runs/tune", help="output folder (default runs/tune)")


def expand_algorithms(names: Sequence[str]) -> list[str]:
    """'all' stands for every registered algorithm that is not a naming alias."""
    from ..algorithms import ALGORITHMS, make_algorithm

    out: list[str] = []
    for name in names:
        if name == "all":
            out.extend(n for n, cls in ALGORITHMS.items() if cls.alias_of is None)
        else:
            make_algorithm(name)  # fail now on unknown names or keys, before any run
            out.append(name)
    return out


def setup_from_args(args: argparse.Namespace) -> TuneSetup:
    if args.rounds < 1 or args.eval_every < 1:
        raise ConfigError("rounds and eval-every must be >= 1")
    if args.local_steps is not None and args.local_steps < 1:
        raise ConfigError(f"local-steps must be >= 1, got {args.local_steps}")
    if not args.target > 0:
        raise ConfigError(f"target must be positive, got {args.target}")
    from ..problems import default_dtype

    return TuneSetup(
        problem=args.problem, participation=args.participation, rounds=args.rounds,
        local_steps=args.local_steps, seed=args.seed, target=args.target,
        dtype=args.dtype or default_dtype(args.problem),
        device=args.device, eval_every=args.eval_every, schedule=args.schedule,
    )


def run(args: argparse.Namespace) -> int:
    from .sweep import parse_experiment, run_sweep
    from .outputs import write_csv, write_json

    setup = setup_from_args(args)
    if args.seeds < 1 or args.workers < 1 or (args.threads is not None and args.threads < 1):
        raise ConfigError("seeds, workers and threads must be >= 1")
    grid = lr_grid(args.lr_min, args.lr_max, args.points)
    algorithms = expand_algorithms(args.algorithm)
    seeds = list(range(setup.seed, setup.seed + args.seeds))
    experiment = parse_experiment({
        "name": "tune", "algorithms": algorithms, "problems": [setup.problem], "participation": [setup.participation],
        "lr": grid, "seeds": seeds, "rounds": setup.rounds, "eval_every": setup.eval_every,
        "schedule": setup.schedule, "dtype": setup.dtype, "device": setup.device, "targets": [setup.target],
        **({"local_steps": setup.local_steps} if setup.local_steps is not None else {}),
    })
    found: dict = {}

    def tables(experiment, runs, folder, *, band, failures) -> list[str]:
        trials = grid_rows(runs, folder, setup.target)
        best = [pick_best([t for t in trials if t["algorithm"] == name])
                for name in dict.fromkeys(t["algorithm"] for t in trials)]
        write_csv(folder / "grid.csv", trials)
        write_csv(folder / "summary.csv", best)
        write_json(folder / "config.json", {"tune": asdict(setup), "grid": grid, "algorithms": algorithms,
                                            "seeds": seeds})
        found.update(trials=trials, best=best)
        return ["grid.csv", "summary.csv", "config.json"]

    # Every trial is a run folder under OUT/runs/: a rerun after a crash skips the finished ones.
    report = run_sweep(experiment, args.out, workers=args.workers, threads=args.threads, progress=True,
                       kind="tune", tables=tables)
    if report.skipped:
        print(f"reused {report.skipped} trial(s) finished by an earlier run")
    best = found["best"]
    print(format_best(best, setup.target))
    print(f"\nwrote {Path(args.out) / 'summary.csv'} (best per algorithm), grid.csv (every step size"
          f"{', over ' + str(len(seeds)) + ' seeds' if len(seeds) > 1 else ''}), config.json, runs/")
    if report.failed:
        from ..errors import FocusflError

        raise FocusflError(f"{len(report.failed)} trial(s) failed (the first: {report.failed[0]['error']}); "
                           "run the same command again to retry them")
    diverged = [row["algorithm"] for row in best if row["diverged_at"] is not None]
    if diverged:
        from ..errors import DivergenceError

        raise DivergenceError(
            f"every step size in [{args.lr_min:g}, {args.lr_max:g}] diverged for {', '.join(diverged)}; "
            "lower --lr-min"
        )
    return 0

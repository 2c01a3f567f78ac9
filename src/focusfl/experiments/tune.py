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
"""
from __future__ import annotations

import argparse
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


def tune(algorithms: Sequence[str | dict], grid: Sequence[float], setup: TuneSetup, progress=None, cache=None):
    """Every algorithm at every step size: returns (all trial rows, best row per algorithm).

    With a ``ResultCache``, trials finished by an interrupted earlier call are not run again.
    """
    trials, best = [], []
    for algorithm in algorithms:
        mine = []
        for lr in grid:
            if cache is None:
                mine.append(run_trial(algorithm, lr, setup))
            else:
                key = {"command": "tune", "algorithm": algorithm, "lr": lr, "setup": asdict(setup)}
                mine.append(cache.get_or_compute(key, lambda: [run_trial(algorithm, lr, setup)])[0])
            if progress is not None:
                progress.update(1)
        trials.extend(mine)
        best.append(pick_best(mine))
    return trials, best


def format_best(best: Sequence[dict], target: float) -> str:
    """The best run per algorithm; the first line names the metric it was ranked by."""
    metrics = sorted({row["metric"] for row in best})
    header = f"{'algorithm':<28} {'best lr':>10} {'final':>11} {'min':>11} {'first <= ' + format(target, 'g'):>16}"
    lines = [f"ranked by {', '.join(metrics) or 'nothing'}: final and min are its values", header, "-" * len(header)]
    for row in best:
        first = row["first_round_below_target"]
        lines.append(
            f"{row['algorithm']:<28} {row['lr']:>10.4g} {row['final']:>11.3e} {row['best']:>11.3e} "
            f"{'never' if first is None else first:>16}"
        )
    return "\n".join(lines)


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
    parser.add_argument("--seed", type=int, default=0)
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
    from .outputs import ResultCache, output_folder, write_csv, write_json
    from .runner import RunConfig, build

    import torch

    setup = setup_from_args(args)
    grid = lr_grid(args.lr_min, args.lr_max, args.points)
    if setup.device == "cpu":
        # Many short runs of small problems: intra-op threads cost more than they save.
        torch.set_num_threads(1)
    algorithms = expand_algorithms(args.algorithm)
    # Validate problem and participation once, before the first trial writes anything.
    build(RunConfig(algorithm=algorithms[0], problem=setup.problem, participation=setup.participation,
                    rounds=setup.rounds, seed=setup.seed, dtype=setup.dtype, device=setup.device))
    # An interrupted tune keeps its finished trials in the partial folder; a rerun skips them.
    with output_folder(args.out, kind="tune", keep_partial=True) as scratch:
        from tqdm import tqdm

        cache = ResultCache(scratch)
        with tqdm(total=len(algorithms) * len(grid), desc="tune", unit="run", disable=None, leave=False) as bar:
            trials, best = tune(algorithms, grid, setup, progress=bar, cache=cache)
        write_csv(scratch / "grid.csv", trials)
        write_csv(scratch / "summary.csv", best)
        write_json(scratch / "config.json", {"tune": asdict(setup), "grid": grid, "algorithms": algorithms})
    if cache.reused:
        print(f"reused {cache.reused} trial(s) finished by an interrupted earlier run")
    print(format_best(best, setup.target))
    print(f"\nwrote {Path(args.out) / 'summary.csv'} (best per algorithm), grid.csv (every trial), config.json")
    diverged = [row["algorithm"] for row in best if row["diverged_at"] is not None]
    if diverged:
        from ..errors import DivergenceError

        raise DivergenceError(
            f"every step size in [{args.lr_min:g}, {args.lr_max:g}] diverged for {', '.join(diverged)}; "
            "lower --lr-min"
        )
    return 0

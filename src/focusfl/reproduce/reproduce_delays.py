"""``focusfl reproduce delays``: the delay metrics of the FedSUM paper's participation patterns.

The FedSUM paper (seed 004, section 2 and appendices F-H) measures participation with two
delay metrics (ALGORITHMS.md section 3): with l_i(r) the last round t <= r in which client i
took part, tau(r) = max_i (r - l_i(r)); tau_max = max over rounds and tau_avg = mean over
rounds. Its convergence bounds grow with both. This preset computes them, as a table and a
figure, for its Cases 1-4 (section 2) and its experimental patterns P1-P3 (appendix H.2),
with 100 clients and 2000 rounds as in its experiments, averaged over several seeds.

The paper's numbers (how many clients P1 selects, the rates of P2 and P3) were lost in
extraction; the parameters below are our choices, stated in every label:
- Cases 1-4 share the mean rate 1/10, so that they differ only in how presence is arranged
  in time: 10 of 100 uniformly; independent coins with p = 0.1; 10 cyclic groups; 10 groups
  reshuffled every epoch.
- P1 selects 20 of 100 uniformly (about the mean rate of P2); P2 draws independent coins with
  the FOCUS rate preset (p_i ~ U(0.1, 0.3) for 90% of the clients, U(0.1, 0.9) for the rest);
  P3 modulates the same p_i by the sine trajectory of FedAWE (a = 0.3, period 20).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from ..io.atomic import write_csv
from ..io.folders import output_folder
from ..participation import make_participation, summarize
from ..sweeps.cache import ResultCache
from .preset import Preset

PATTERNS = {
    "Case 1: uniform, 10 of N": "uniform:m={m}",
    "Case 2: independent, p = 0.1": "bernoulli:p=0.1",
    "Case 3: cyclic, 10 groups": "cyclic:groups=10",
    "Case 4: reshuffled cyclic, 10 groups": "reshuffled_cyclic:groups=10",
    "P1: uniform, 20 of N": "uniform:m={m2}",
    "P2: independent, FOCUS preset p_i": "bernoulli",
    "P3: sine p_i(r), a = 0.3, period 20": "sine:a=0.3,period=20",
}
SHOWN_ROUNDS = 200  # rounds of tau(r) drawn in the left panel


def pattern_specs(clients: int) -> dict[str, str]:
    """The specs for N clients: "10 of N" and "20 of N" keep the rates 1/10 and 1/5."""
    if clients < 10:
        raise ConfigError(f"delays needs at least 10 clients (10 cyclic groups), got {clients}")
    m, m2 = max(1, clients // 10), max(1, clients // 5)
    return {label: spec.format(m=m, m2=m2) for label, spec in PATTERNS.items()}


def measure(clients: int, rounds: int, seeds: list[int], cache=None):
    """Per-seed rows and the per-round tau of the first seed, for every pattern.

    With a ``ResultCache``, (pattern, seed) pairs measured by an interrupted run are reused.
    """
    rows, traces = [], {}
    for label, spec in pattern_specs(clients).items():
        for seed in seeds:
            trace = seed == seeds[0]
            key = {"preset": "delays", "pattern": label, "spec": spec, "clients": clients, "rounds": rounds,
                   "seed": seed, "trace": trace}
            compute = partial(measure_one, label, spec, clients, rounds, seed, trace)
            row, *taus = compute() if cache is None else cache.get_or_compute(key, compute)
            rows.append(row)
            if trace:
                traces[label] = np.array([t["tau"] for t in taus], dtype=np.int64)
    return rows, traces


def measure_one(label: str, spec: str, clients: int, rounds: int, seed: int, trace: bool) -> list[dict]:
    """One pattern and seed: its row, then (if ``trace``) one row {"tau": tau(r)} per round."""
    stats = summarize(make_participation(spec, clients, seed=seed).mask(rounds))
    row = {"pattern": label, "spec": spec, "seed": seed, "tau_max": stats.tau_max,
           "tau_avg": stats.tau_avg, "mean_active": stats.mean_active, "empty_rounds": stats.empty_rounds}
    return [row, *({"tau": int(t)} for t in stats.tau)] if trace else [row]


def summarize_rows(rows: list[dict]) -> list[dict]:
    """Mean and spread over seeds, one row per pattern (in pattern order)."""
    out = []
    for label in dict.fromkeys(row["pattern"] for row in rows):
        mine = [row for row in rows if row["pattern"] == label]
        tau_max = np.array([row["tau_max"] for row in mine], dtype=float)
        tau_avg = np.array([row["tau_avg"] for row in mine], dtype=float)
        out.append(
            {"pattern": label, "spec": mine[0]["spec"], "seeds": len(mine),
             "tau_max_mean": float(tau_max.mean()), "tau_max_min": float(tau_max.min()),
             "tau_max_max": float(tau_max.max()), "tau_avg_mean": float(tau_avg.mean()),
             "tau_avg_std": float(tau_avg.std()),
             "mean_active": float(np.mean([row["mean_active"] for row in mine]))}
        )
    return out


def format_table(summary: list[dict]) -> str:
    header = f"{'pattern':<38} {'tau_max (mean, min-max)':>24} {'tau_avg (mean ± std)':>22} {'mean |S_r|':>11}"
    lines = [header, "-" * len(header)]
    for row in summary:
        tmax = f"{row['tau_max_mean']:.1f} ({row['tau_max_min']:.0f}-{row['tau_max_max']:.0f})"
        tavg = f"{row['tau_avg_mean']:.2f} ± {row['tau_avg_std']:.2f}"
        lines.append(f"{row['pattern']:<38} {tmax:>24} {tavg:>22} {row['mean_active']:>11.2f}")
    return "\n".join(lines)


def plot_delays(summary: list[dict], traces: dict[str, np.ndarray], paths: list[Path], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5.4), gridspec_kw={"width_ratios": [3, 2]})
    for label, tau in traces.items():
        shown = tau[:SHOWN_ROUNDS]
        left.step(np.arange(shown.size), shown, where="post", label=label, linewidth=1.1)
    left.set_xlabel("round r")
    left.set_ylabel(r"$\tau(r) = \max_i\,(r - l_i(r))$")
    left.set_title(f"per-round delay, first {SHOWN_ROUNDS} rounds (first seed)")
    left.grid(True, alpha=0.3)
    # Below the axes: inside, the seven labels covered the highest curves.
    left.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3, frameon=False)

    positions = np.arange(len(summary))
    width = 0.4
    # A linear axis from 0 with each bar's value written on it: a log axis started near the
    # smallest values (9.0 and 8.98 under Case 3) left those bars a few pixels high.
    for offset, key, label in ((-width / 2, "tau_max_mean", r"$\tau_{max}$"), (width / 2, "tau_avg_mean", r"$\tau_{avg}$")):
        bars = right.bar(positions + offset, [row[key] for row in summary], width, label=label)
        right.bar_label(bars, fmt="%.3g", fontsize=7, padding=2)
    right.set_xticks(positions, [row["pattern"].split(":")[0] for row in summary])
    right.set_ylim(0, 1.1 * max(row["tau_max_mean"] for row in summary))
    right.set_ylabel("delay (rounds)")
    right.set_title("delay metrics (mean over seeds)")
    right.grid(True, axis="y", which="both", alpha=0.3)
    right.legend()
    fig.suptitle(title)
    fig.tight_layout()
    for path in paths:
        fig.savefig(path)
    plt.close(fig)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="runs/reproduce-delays", help="output folder")
    parser.add_argument("--clients", type=int, default=100, help="number of clients (default 100)")
    parser.add_argument("--rounds", type=int, default=2000, help="rounds (default 2000)")
    parser.add_argument("--seeds", type=int, default=5, help="seeds to average over (default 5)")
    parser.add_argument("--seed", type=int, default=0, help="first seed (default 0)")


@dataclass(frozen=True)
class DelaysOptions:
    """``focusfl reproduce delays``'s options."""

    out: str = "runs/reproduce-delays"
    clients: int = 100
    rounds: int = 2000
    seeds: int = 5
    seed: int = 0


def run(args: DelaysOptions) -> int:
    if args.rounds < 1 or args.seeds < 1 or args.seed < 0:
        raise ConfigError("rounds and seeds must be >= 1 and seed >= 0")
    pattern_specs(args.clients)  # validates the number of clients before anything is written
    seeds = list(range(args.seed, args.seed + args.seeds))
    with output_folder(args.out, kind="reproduce-delays", keep_partial=True) as scratch:
        rows, traces = measure(args.clients, args.rounds, seeds, cache=ResultCache(scratch))
        summary = summarize_rows(rows)
        write_csv(scratch / "summary.csv", summary)
        write_csv(scratch / "per_seed.csv", rows)
        write_csv(
            scratch / "tau_per_round.csv",
            [{"round": r, **{label: int(tau[r]) for label, tau in traces.items()}} for r in range(args.rounds)],
        )
        plot_delays(
            summary, traces, [scratch / "figure.png", scratch / "figure.pdf"],
            f"FedSUM delay metrics: N={args.clients}, {args.rounds} rounds, {args.seeds} seed(s)",
        )
    print(format_table(summary))
    print(f"\nwrote {Path(args.out) / 'summary.csv'}, per_seed.csv, tau_per_round.csv, figure.png and figure.pdf")
    return 0


PRESETS = (Preset("delays", "FedSUM paper: tau_max and tau_avg of its Cases 1-4 and patterns P1-P3", add_arguments,
                  DelaysOptions, run),)

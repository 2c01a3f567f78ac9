"""``focusfl reproduce ridge``: Figure 4 of the FOCUS paper (seed 002, section 5).

Ridge regression with d = 100, N = 16 clients of 100 samples, reg = 0.01, tau = 5 local steps
and one learning rate eta = 2e-4 for every algorithm, under three participation scenarios:
full, uniform (4 of 16) and arbitrary (4 of 16 drawn with probabilities proportional to
q_i ~ U(0,1) + 0.01, the authors' notebook setting). The figure plots the relative error
||x_r - x*|| / ||x*|| of the server model on a log scale.

Every registered algorithm except naming aliases takes part: the paper's FedAvg, FedAU, MIFA,
SCAFFOLD, ProxSkip and FOCUS, plus the FedSUM family, FedVARP and FedAWE. A second figure
(figure_communication.*) draws the same runs against the floats communicated (down + up, the
simulator's cumulative comm_down + comm_up columns), as in the FedSUM paper's Figure 1(b):
algorithms that send two vectors per client and round (SCAFFOLD, FedSUM) pay for it there.
"""
from __future__ import annotations

import argparse
import math
from dataclasses import asdict
from pathlib import Path

import torch

from ..algorithms import ALGORITHMS
from ..errors import ConfigError
from .outputs import ResultCache, output_folder, write_csv
from .plots import plot_panels
from .reproduce import Preset, cached_run, register
from .runner import RunConfig, build, execute

SCENARIOS = {
    "full participation": "full",
    "uniform participation (4 of 16)": "uniform:m=4",
    "arbitrary participation (4 of 16, q_i ∝ U(0,1)+0.01)": "weighted:m=4",
}
PROBLEM = "ridge:clients=16,samples=100,dim=100,reg=0.01"
LR = 2e-4
LOCAL_STEPS = 5
THRESHOLD = 1e-8


def figure_algorithms() -> list[str]:
    """Every registered algorithm except naming aliases (SG-FOCUS is FOCUS on this problem) and
    experimental ones (push-sum), which no paper's figure shows."""
    return [name for name, cls in ALGORITHMS.items() if cls.alias_of is None and not cls.experimental]


def first_below(rows, threshold: float) -> int | None:
    for row in rows:
        if row["rel_error"] < threshold:
            return row["round"]
    return None


def run_figure4(rounds: int = 500, seed: int = 0, algorithms=None, progress: bool = False, cache=None):
    """Run every (scenario, algorithm) pair; returns (panels, summary rows)."""
    algorithms = algorithms or figure_algorithms()
    panels: dict[str, dict[str, list[dict]]] = {}
    summary = []
    for scenario, participation in SCENARIOS.items():
        panels[scenario] = {}
        for name in algorithms:
            config = RunConfig(
                algorithm=name, problem=PROBLEM, participation=participation, rounds=rounds,
                local_steps=LOCAL_STEPS, lr=LR, seed=seed,
            )
            key = {"preset": "ridge", **asdict(config)}
            result, _ = cached_run(cache, key, lambda: execute(build(config), progress=progress))
            panels[scenario][name] = result.rows
            final = result.rows[-1]["rel_error"] if result.diverged_at is None else math.inf
            summary.append(
                {
                    "algorithm": name,
                    "scenario": participation,
                    "final_rel_error": final,
                    "first_round_below_1e-8": first_below(result.rows, THRESHOLD),
                    "floats_communicated": result.rows[-1]["comm_down"] + result.rows[-1]["comm_up"],
                }
            )
    return panels, summary


def with_total_traffic(panels: dict[str, dict[str, list[dict]]]) -> dict[str, dict[str, list[dict]]]:
    """The same curves with a ``floats`` column: cumulative floats sent down plus up."""
    return {
        scenario: {
            name: [{**row, "floats": row["comm_down"] + row["comm_up"]} for row in rows]
            for name, rows in curves.items()
        }
        for scenario, curves in panels.items()
    }


def format_table(summary: list[dict]) -> str:
    header = f"{'algorithm':<16} {'scenario':<14} {'final rel_error':>16} {'first round < 1e-8':>19}"
    lines = [header, "-" * len(header)]
    for row in summary:
        below = row["first_round_below_1e-8"]
        lines.append(
            f"{row['algorithm']:<16} {row['scenario']:<14} {row['final_rel_error']:>16.3e} "
            f"{'never' if below is None else below:>19}"
        )
    return "\n".join(lines)


def many_lines_style():
    """Matplotlib settings for a dozen curves: 20 distinct styles (10 dark solid colours, then
    10 light dashed ones) instead of the 10-colour default, and scientific tick labels for the
    large float counts of the communication figure."""
    import matplotlib
    from cycler import cycler

    colors = list(matplotlib.colormaps["tab20"].colors)
    styles = cycler(color=colors[0::2] + colors[1::2]) + cycler(linestyle=["-"] * 10 + ["--"] * 10)
    return matplotlib.rc_context({"axes.prop_cycle": styles, "axes.formatter.limits": (-3, 4)})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="runs/reproduce-ridge", help="output folder")
    parser.add_argument("--rounds", type=int, default=500, help="rounds per run (default 500)")
    parser.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    if args.rounds < 1:
        raise ConfigError(f"rounds must be >= 1, got {args.rounds}")
    # d = 100, n <= 16: every tensor op is tiny, and intra-op threads only add synchronisation
    # (on a busy 2-core machine they made this preset ~20x slower).
    torch.set_num_threads(1)
    with output_folder(args.out, kind="reproduce-ridge", keep_partial=True) as scratch:
        panels, summary = run_figure4(args.rounds, args.seed, progress=True, cache=ResultCache(scratch))
        write_csv(scratch / "summary.csv", summary)
        with many_lines_style():
            plot_figures(panels, scratch)
    print(format_table(summary))
    print(f"\nwrote {Path(args.out) / 'summary.csv'}, figure.png/.pdf and figure_communication.png/.pdf")
    return 0


def plot_figures(panels: dict[str, dict[str, list[dict]]], folder: Path) -> None:
    """figure.* against rounds and figure_communication.* against floats communicated."""
    plot_panels(
        panels,
        [folder / "figure.png", folder / "figure.pdf"],
        suptitle=f"Ridge regression (d=100, N=16, tau={LOCAL_STEPS}, eta={LR:g})",
    )
    plot_panels(
        with_total_traffic(panels),
        [folder / "figure_communication.png", folder / "figure_communication.pdf"],
        x="floats",
        xlabel="floats communicated (down + up)",
        suptitle=f"Ridge regression against communication (d=100, N=16, tau={LOCAL_STEPS}, eta={LR:g})",
    )


register(Preset("ridge", "FOCUS paper Figure 4: ridge regression, three participation scenarios", add_arguments, run))

"""``focusfl reproduce ridge``: Figure 4 of the FOCUS paper (seed 002, section 5).

Two settings (``--setting``):

- ``paper`` (default), the setting the paper's text states: ridge regression with d = 100,
  N = 16 clients of 100 samples, reg = 0.01, tau = 5 local steps and one learning rate
  eta = 2e-4 for every algorithm. Every registered algorithm except naming aliases takes part:
  the paper's FedAvg, FedAU, MIFA, SCAFFOLD, ProxSkip and FOCUS, plus the FedSUM family, FedVARP
  and FedAWE.
- ``notebook``, the setting of the authors' notebook that drew the published figure
  (BichengYing/FedASL, figures/focus.ipynb): d = 50, 500 rows per client, no ridge term, the loss
  1/2 ||A_i x - b_i||^2, tau = 3, eta = 6e-4 / 1.5e-4 / 1e-4 for full / uniform / arbitrary
  participation. Our ridge loss is ||A_i x - b_i||^2 (twice theirs), and every algorithm here
  gives the same iterates on 2f with eta/2 as on f with eta, so the notebook's steps are run
  as 3e-4 / 7.5e-5 / 5e-5. Its algorithms (FOCUS, FedAvg, FedAU, SCAFFOLD, ProxSkip, MIFA) run
  as published in their papers, plus the notebook's own MIFA (``mifa:notebook=true``) and
  ProxSkip (``proxskip:partial=deferred``), and ProxSkip with a plain average. The notebook's
  plot counts SCAFFOLD's and ProxSkip's rounds twice on its x-axis ("communication cost per
  model size"); figure_notebook_axis.* draws that axis.

Both run full, uniform (4 of 16) and arbitrary participation (4 of 16 drawn without replacement
with probabilities proportional to w_i ~ U(0,1) + 0.01; the notebook draws its own w_i). The
figure plots the relative error ||x_r - x*|| / ||x*|| of the server model on a log scale. A second figure
(figure_communication.*) draws the same runs against the floats communicated (down + up, the
simulator's cumulative comm_down + comm_up columns), as in the FedSUM paper's Figure 1(b):
algorithms that send two vectors per client and round (SCAFFOLD, FedSUM) pay for it there.
"""
from __future__ import annotations

import argparse
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..algorithms import ALGORITHMS
from ..errors import ConfigError
from .outputs import ResultCache, output_folder, write_csv
from .plots import plot_panels
from .reproduce import Preset, cached_run, register
from .runner import RunConfig, build, execute

# The sampling weights of the arbitrary scenario are called w_i here: q_i means
# E[1{i in S}/|S|] everywhere else in focusfl.
SCENARIOS = {
    "full participation": "full",
    "uniform participation (4 of 16)": "uniform:m=4",
    "arbitrary (4 of 16, weights w_i ∝ U(0,1)+0.01)": "weighted:m=4",
}
PROBLEM = "ridge:clients=16,samples=100,dim=100,reg=0.01"
LR = 2e-4
LOCAL_STEPS = 5
THRESHOLD = 1e-8


@dataclass(frozen=True)
class Setting:
    """One setting of the figure: problem, tau, a step size per scenario, algorithms."""

    name: str
    problem: str
    local_steps: int
    lrs: dict[str, float]  # participation spec -> eta
    title: str
    algorithms: tuple[str, ...] | None = None  # None: figure_algorithms()


SETTINGS = {
    "paper": Setting(
        "paper", PROBLEM, LOCAL_STEPS, {spec: LR for spec in SCENARIOS.values()},
        f"Ridge regression, the paper's stated setting (d=100, N=16, tau={LOCAL_STEPS}, eta={LR:g})",
    ),
    "notebook": Setting(
        "notebook", "ridge:clients=16,samples=500,dim=50,reg=0", 3,
        # The notebook's 6e-4 / 1.5e-4 / 1e-4 on 1/2 ||Ax - b||^2, halved for our ||Ax - b||^2.
        {"full": 3e-4, "uniform:m=4": 7.5e-5, "weighted:m=4": 5e-5},
        "Ridge regression, the authors' notebook setting (d=50, 500 rows/client, no reg, tau=3, "
        "eta = 6e-4 / 1.5e-4 / 1e-4 on 1/2||Ax-b||^2)",
        ("focus", "fedavg", "fedau", "scaffold", "mifa", "mifa:notebook=true", "proxskip",
         "proxskip:partial=plain", "proxskip:partial=deferred"),
    ),
}
# The notebook's x-axis ("communication cost per model size") counts these rounds twice.
NOTEBOOK_AXIS = {"scaffold": 2.0, "proxskip": 2.0, "proxskip:partial=plain": 2.0, "proxskip:partial=deferred": 2.0}


def figure_algorithms() -> list[str]:
    """Every registered algorithm except naming aliases (SG-FOCUS is FOCUS on this problem) and
    experimental ones (push-sum), which no paper's figure shows."""
    return [name for name, cls in ALGORITHMS.items() if cls.alias_of is None and not cls.experimental]


def first_below(rows, threshold: float) -> int | None:
    for row in rows:
        if row["rel_error"] < threshold:
            return row["round"]
    return None


def run_figure4(rounds: int = 500, seed: int = 0, algorithms=None, progress: bool = False, cache=None,
                setting: str = "paper"):
    """Run every (scenario, algorithm) pair of a setting; returns (panels, summary rows).

    With a ``ResultCache``, runs finished by an interrupted earlier call are not run again."""
    chosen = SETTINGS[setting]
    algorithms = algorithms or list(chosen.algorithms or figure_algorithms())
    panels: dict[str, dict[str, list[dict]]] = {}
    summary = []
    for scenario, participation in SCENARIOS.items():
        panels[scenario] = {}
        for name in algorithms:
            config = RunConfig(
                algorithm=name, problem=chosen.problem, participation=participation, rounds=rounds,
                local_steps=chosen.local_steps, lr=chosen.lrs[participation], seed=seed,
            )
            key = {"preset": "ridge", **asdict(config)}
            result, _ = cached_run(cache, key, lambda: execute(build(config), progress=progress))
            panels[scenario][name] = result.rows
            final = result.rows[-1]["rel_error"] if result.diverged_at is None else math.inf
            summary.append(
                {
                    "algorithm": name,
                    "scenario": participation,
                    "lr": chosen.lrs[participation],
                    "final_rel_error": final,
                    "diverged_at": result.diverged_at,
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
    header = f"{'algorithm':<26} {'scenario':<14} {'final rel_error':>16} {'first round < 1e-8':>19}"
    lines = [header, "-" * len(header)]
    for row in summary:
        below = row["first_round_below_1e-8"]
        diverged = f"  (diverged at round {row['diverged_at']})" if row.get("diverged_at") is not None else ""
        lines.append(
            f"{row['algorithm']:<26} {row['scenario']:<14} {row['final_rel_error']:>16.3e} "
            f"{'never' if below is None else below:>19}{diverged}"
        )
    return "\n".join(lines)


def many_lines_style():
    """Matplotlib settings for the figures: scientific tick labels for the large float counts of
    the communication figure, and 20 distinct styles for any curve drawn without its own
    (``plot_panels`` gives every algorithm its colour and marker itself)."""
    import matplotlib
    from cycler import cycler

    colors = list(matplotlib.colormaps["tab20"].colors)
    styles = cycler(color=colors[0::2] + colors[1::2]) + cycler(linestyle=["-"] * 10 + ["--"] * 10)
    return matplotlib.rc_context({"axes.prop_cycle": styles, "axes.formatter.limits": (-3, 4)})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="runs/reproduce-ridge", help="output folder")
    parser.add_argument("--rounds", type=int, default=500, help="rounds per run (default 500)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--setting", choices=list(SETTINGS), default="paper",
                        help="paper: the setting the FOCUS paper states (default); notebook: the authors' "
                        "notebook that drew the published figure")


def run(args: argparse.Namespace) -> int:
    if args.rounds < 1:
        raise ConfigError(f"rounds must be >= 1, got {args.rounds}")
    # d = 100, n <= 16: every tensor op is tiny, and intra-op threads only add synchronisation
    # (on a busy 2-core machine they made this preset ~20x slower).
    torch.set_num_threads(1)
    with output_folder(args.out, kind="reproduce-ridge", keep_partial=True) as scratch:
        panels, summary = run_figure4(args.rounds, args.seed, progress=True, cache=ResultCache(scratch),
                                      setting=args.setting)
        write_csv(scratch / "summary.csv", summary)
        with many_lines_style():
            written = plot_figures(panels, scratch, args.setting)
    print(format_table(summary))
    print(f"\nwrote {Path(args.out) / 'summary.csv'}, " + ", ".join(written))
    return 0


def plot_figures(panels: dict[str, dict[str, list[dict]]], folder: Path, setting: str = "paper") -> list[str]:
    """figure.* against rounds and figure_communication.* against floats communicated (and, for
    the notebook setting, figure_notebook_axis.*: the notebook's own x-axis). Returns the names."""
    title = SETTINGS[setting].title
    plot_panels(panels, [folder / "figure.png", folder / "figure.pdf"], suptitle=title)
    plot_panels(
        with_total_traffic(panels),
        [folder / "figure_communication.png", folder / "figure_communication.pdf"],
        x="floats",
        xlabel="floats communicated (down + up)",
        suptitle=f"{title}, against communication",
    )
    written = ["figure.png/.pdf", "figure_communication.png/.pdf"]
    if setting == "notebook":
        plot_panels(
            panels, [folder / "figure_notebook_axis.png", folder / "figure_notebook_axis.pdf"],
            x_factor=NOTEBOOK_AXIS, xlabel="rounds x 2 for SCAFFOLD and ProxSkip (the notebook's axis)",
            suptitle=f"{title}, on the notebook's x-axis",
        )
        written.append("figure_notebook_axis.png/.pdf")
    return written


register(Preset("ridge", "FOCUS paper Figure 4: ridge regression, three participation scenarios (--setting paper|notebook)", add_arguments, run))

"""``focusfl reproduce ridge``: Figure 4 of the FOCUS paper (seed 002, section 5).

Both settings are experiment files shipped with focusfl (``presets/ridge.toml`` and
``presets/ridge-notebook.toml``), run by the sweep machinery (``focusfl sweep``): ``--seeds 5``
draws the mean over five seeds with a band, ``--workers`` runs them in parallel, a rerun skips
finished runs, and ``--export FILE`` writes the file for a user to copy and change.

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

``run_figure4`` runs the same files in this process without folders, for ``reproduce report``.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import re
import tomllib
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

import torch
from cycler import cycler

from ..algorithms import ALGORITHMS
from ..argtypes import BATCH_RUNS_HELP, batch_runs_value, non_negative_int, positive_int
from ..errors import ConfigError
from ..io.atomic import read_csv, write_text
from ..metrics import first_below
from ..plots import palette, plot_panels
from ..runs.driver import build, execute
from ..sweeps.aggregate import aggregate, plot_series, read_folders
from .preset import Preset, cached_run
from ..sweeps.sweep import check_size, compute_runs, counts_line, expand, parse_experiment, restart_note, run_sweep

# Panel titles of the figures run_figure4 draws (reproduce report), by participation SPEC. The
# sampling weights of the arbitrary scenario are called w_i here: q_i means E[1{i in S}/|S|]
# everywhere else in focusfl.
SCENARIOS = {
    "full participation": "full",
    "uniform participation (4 of 16)": "uniform:m=4",
    "arbitrary (4 of 16, weights w_i ∝ U(0,1)+0.01)": "weighted:m=4",
}
THRESHOLD = 1e-8
PRESET_FILES = {"paper": "ridge.toml", "notebook": "ridge-notebook.toml"}
TITLES = {
    "paper": "Ridge regression, the paper's stated setting (d=100, N=16, tau=5, eta=0.0002)",
    "notebook": "Ridge regression, the authors' notebook setting (d=50, 500 rows/client, no reg, tau=3, "
                "eta = 6e-4 / 1.5e-4 / 1e-4 on 1/2||Ax-b||^2)",
}
# The notebook's x-axis ("communication cost per model size") counts these rounds twice.
NOTEBOOK_AXIS = {"scaffold": 2.0, "proxskip": 2.0, "proxskip:partial=plain": 2.0, "proxskip:partial=deferred": 2.0}


def preset_text(setting: str) -> str:
    """The experiment file of a setting, as shipped with focusfl."""
    return resources.files("focusfl.reproduce").joinpath("presets").joinpath(PRESET_FILES[setting]).read_text(encoding="utf-8")


@lru_cache(maxsize=None)
def load_setting(setting: str):
    """The shipped experiment of a setting, parsed and checked (sweep.Experiment)."""
    text = preset_text(setting)
    return parse_experiment(tomllib.loads(text), text)


def figure_algorithms() -> list[str]:
    """Every registered algorithm except naming aliases (SG-FOCUS is FOCUS on this problem),
    experimental ones (push-sum), which no paper's figure shows, and those whose line would repeat
    another's (``in_paper_figure`` False: FedNova is FedAvg when all clients do tau steps); the
    paper setting's file lists exactly these (a test checks it)."""
    return [name for name, cls in ALGORITHMS.items()
            if cls.alias_of is None and not cls.experimental and cls.in_paper_figure]


def configured(setting_name: str, *, rounds: int | None = None, seeds: int | None = None, seed: int = 0):
    """The setting's experiment with ``rounds`` and seeds ``seed .. seed + seeds - 1`` (if given)."""
    experiment = load_setting(setting_name)
    changes = {}
    if rounds is not None:
        changes["axes"] = {**experiment.axes, "rounds": [rounds]}
        changes["participation_overrides"] = [{k: v for k, v in o.items() if k != "rounds"}
                                              for o in experiment.participation_overrides]
    if seeds is not None or seed:
        count = seeds if seeds is not None else len(experiment.seeds)
        changes["seeds"] = range(seed, seed + count)
    changes["text"] = exported_text(setting_name, rounds=rounds, seeds=seeds, seed=seed)
    experiment = dataclasses.replace(experiment, **changes)
    check_size(experiment, names={"seeds": "--seeds"})
    return experiment


def exported_text(setting_name: str, *, rounds: int | None = None, seeds: int | None = None, seed: int = 0) -> str:
    """The shipped file with ``rounds`` and ``seeds`` set as asked (its comments kept)."""
    text = preset_text(setting_name)
    if rounds is not None:
        text = _set_line(text, "rounds", str(rounds))
    if seeds is not None or seed:
        count = seeds if seeds is not None else len(load_setting(setting_name).seeds)
        text = _set_line(text, "seeds", str(count) if not seed else "[" + ", ".join(map(str, range(seed, seed + count))) + "]")
    return text


def _set_line(text: str, key: str, value: str) -> str:
    pattern = re.compile(rf"^{key} = [^#\n]*?(\s*#.*)?$", re.MULTILINE)
    if len(pattern.findall(text)) != 1:  # a shipped file is written so that this holds (a test checks)
        raise AssertionError(f"the preset file has no single top-level {key!r} line")
    return pattern.sub(lambda m: f"{key} = {value}{m.group(1) or ''}", text)


def run_figure4(rounds: int = 500, seed: int = 0, algorithms=None, progress: bool = False, cache=None,
                setting: str = "paper", batch_runs: int | str = "auto"):
    """Run every (scenario, algorithm) pair of a setting in this process; returns (panels,
    summary rows). With a ``ResultCache``, runs finished by an interrupted earlier call are not
    run again. ``focusfl reproduce ridge`` runs the same experiment through the sweep machinery.
    The runs not in the cache are computed in batches of ``batch_runs`` (runs/batch.py: the
    same rows as one at a time); ``progress`` shows a bar per run, one at a time."""
    chosen = setting_name = setting
    experiment = configured(setting_name, rounds=rounds, seeds=1, seed=seed)
    titles = {spec: title for title, spec in SCENARIOS.items()}
    panels: dict[str, dict[str, list[dict]]] = {}
    summary = []
    runs = [run for run in expand(experiment) if algorithms is None or run.axes["algorithm"] in algorithms]
    keys = {run.key: {"preset": "ridge", "setting": chosen, **run.config.to_dict()} for run in runs}
    missing = [run for run in runs if cache is None or not cache.has(keys[run.key])]
    computed = {} if progress else compute_runs(missing, batch_runs)
    for run in runs:
        name, participation = run.axes["algorithm"], run.axes["participation"]
        config = run.config
        key = keys[run.key]
        result, _ = cached_run(cache, key, lambda: computed.get(run.key) or execute(build(config), progress=progress))
        panels.setdefault(titles.get(participation, participation), {})[name] = result.rows
        final = result.rows[-1]["rel_error"] if result.diverged_at is None else math.inf
        summary.append(
            {
                "algorithm": name,
                "scenario": participation,
                "lr": run.axes["lr"],
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
    styles = cycler(color=palette(20)) + cycler(linestyle=["-"] * 10 + ["--"] * 10)
    return matplotlib.rc_context({"axes.prop_cycle": styles, "axes.formatter.limits": (-3, 4)})


DEFAULT_OUT = {"paper": "runs/reproduce-ridge", "notebook": "runs/reproduce-ridge-notebook"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default=None,
                        help="output folder; a rerun skips the runs finished there (default runs/reproduce-ridge, "
                        "runs/reproduce-ridge-notebook for --setting notebook)")
    parser.add_argument("--setting", choices=list(PRESET_FILES), default="paper",
                        help="paper: the setting the FOCUS paper states; notebook: the authors' notebook that drew "
                        "the published figure")
    parser.add_argument("--rounds", type=positive_int, help="rounds per run (default: the file's, 500)")
    parser.add_argument("--seeds", type=positive_int,
                        help="seeds per configuration: the figures draw their mean and a band (default: the file's, 1)")
    parser.add_argument("--seed", type=non_negative_int, default=0, help="the first seed")
    parser.add_argument("--workers", type=positive_int, default=1, help="runs at a time on this machine")
    parser.add_argument("--batch-runs", type=batch_runs_value, default="auto", metavar="auto|K", help=BATCH_RUNS_HELP)
    parser.add_argument("--band", choices=["std", "minmax"], help="band around the mean (default: the file's, std)")
    parser.add_argument("--tensorboard", metavar="TB",
                        help="also log every run to TensorBoard in TB/ALGORITHM-lrLR-seedS-HASH8, its axes as hparams "
                        "(pip install tensorboard)")
    parser.add_argument("--export", metavar="FILE",
                        help="write the setting's experiment file (with --rounds/--seeds applied) to FILE and stop; "
                        "run it with focusfl sweep FILE")


@dataclass(frozen=True)
class RidgeOptions:
    """``focusfl reproduce ridge``'s options (None: the setting's file decides)."""

    out: str | None = None  # None: the setting's own folder (DEFAULT_OUT)
    setting: str = "paper"
    rounds: int | None = None
    seeds: int | None = None
    seed: int = 0
    workers: int = 1
    batch_runs: int | str = "auto"
    band: str | None = None
    tensorboard: str | None = None
    export: str | None = None  # write the experiment file there and stop


def run(args: RidgeOptions) -> int:
    if args.export is not None:
        return export(args)
    experiment = configured(args.setting, rounds=args.rounds, seeds=args.seeds, seed=args.seed)
    # Each setting has its own default folder: the notebook's must not replace the paper's runs.
    args = dataclasses.replace(args, out=args.out or DEFAULT_OUT[args.setting])
    # d <= 100, n <= 16: every tensor op is tiny, and intra-op threads only add synchronisation
    # (on a busy 2-core machine they made this preset ~20x slower); workers use one each.
    torch.set_num_threads(1)
    report = run_sweep(experiment, args.out, workers=args.workers, band=args.band, progress=True,
                       tensorboard=args.tensorboard, batch_runs=args.batch_runs,
                       kind="reproduce-ridge", tables=lambda *a, **k: figure_tables(*a, setting=args.setting, **k))
    out = Path(args.out)
    summary = read_csv(out / "summary.csv")
    print(format_summary(summary))
    print(f"\n{counts_line(report, summary)}")
    if report.restarted:
        print(restart_note(report))
    print(f"wrote {out / 'summary.csv'}, " + ", ".join(n for n in report.written if n != "summary.csv"))
    if report.failed:
        first = report.failed[0]
        raise ConfigError(f"{len(report.failed)} of {report.total} runs failed (the first, {first['algorithm']} "
                          f"seed {first['seed']}: {first['error']}); see {out / 'failures.csv'}")
    return 0


def export(args: RidgeOptions) -> int:
    """``--export FILE``: the experiment file, never over an existing file."""
    if not args.export.strip():
        raise ConfigError("--export needs a file name, e.g. --export experiment.toml")
    target = Path(args.export)
    if target.exists() or target.is_symlink():
        what = "is a folder" if target.is_dir() else "exists"
        raise ConfigError(f"--export {str(target)!r} {what}; give a new file name (focusfl does not overwrite it)")
    if not target.parent.is_dir():
        why = "is not a folder" if target.parent.exists() else "does not exist"
        raise ConfigError(f"--export {str(target)!r}: {str(target.parent)!r} {why}")
    write_text(target, exported_text(args.setting, rounds=args.rounds, seeds=args.seeds, seed=args.seed))
    print(f"wrote {target}; run it with: focusfl sweep {target} --out runs/{target.stem}")
    return 0


def figure_tables(experiment, runs, folder: Path, *, band: str, failures, setting: str) -> list[str]:
    """The sweep's results.csv, summary.csv, figure.* and figure_communication.*, plus, for the
    notebook setting, figure_notebook_axis.*."""
    with many_lines_style():
        titles = {spec: f"{title} ({spec})" for title, spec in SCENARIOS.items()}
        written = aggregate(experiment, runs, folder, band=band, failures=failures, panel_titles=titles)
        if setting == "notebook" and "results.csv" in written:
            series, metric = read_folders([folder], experiment.metric)
            written += plot_series(
                series, folder, metric=metric, band=band, title=f"{experiment.name}, on the notebook's x-axis",
                xs=("round",), stems=("figure_notebook_axis",), x_factor=NOTEBOOK_AXIS,
                xlabel="rounds x 2 for SCAFFOLD and ProxSkip (the notebook's axis)", panel_titles=titles,
            )
    return written


def format_summary(rows: list[dict]) -> str:
    """summary.csv as a table: final relative error and rounds to 1e-8, mean over seeds."""
    seeds = max((int(row["seeds"]) for row in rows), default=1)
    final = "final rel_error" + (" (mean)" if seeds > 1 else "")
    below = "first round < 1e-8" + (" (mean)" if seeds > 1 else "")
    header = f"{'algorithm':<26} {'scenario':<14} {final:>22} {below:>26}"
    lines = [header, "-" * len(header)]
    for row in rows:
        reached = int(row["reached_1e-08"])
        rounds = "never" if reached == 0 else f"{float(row['rounds_to_1e-08_mean']):g}"
        if 0 < reached < int(row["seeds"]):
            rounds += f" ({reached} of {row['seeds']} seeds)"
        diverged = f"  ({row['diverged']} diverged)" if int(row["diverged"]) else ""
        lines.append(f"{row['algorithm']:<26} {row['participation']:<14} {float(row['final_rel_error_mean']):>22.3e} "
                     f"{rounds:>26}{diverged}")
    return "\n".join(lines)


def plot_figures(panels: dict[str, dict[str, list[dict]]], folder: Path, setting: str = "paper") -> list[str]:
    """figure.* against rounds and figure_communication.* against floats communicated (and, for
    the notebook setting, figure_notebook_axis.*: the notebook's own x-axis). Returns the names."""
    title = TITLES[setting]
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


PRESETS = (
    Preset("ridge", "FOCUS paper Figure 4: ridge regression, three participation scenarios (--setting paper|notebook)",
           add_arguments, RidgeOptions, run),
)

"""The suite under one roof: every exact and inexact method of the registry under the same
participation processes, at tuned step sizes, with verdicts computed from the numbers.

The report section of ``focusfl reproduce report`` ("The suite under one roof"). One small
problem (``PROBLEM``: ridge, 8 clients) under four processes: Bernoulli with unequal rates
p_i = 0.2..0.9, Markov with the same rates and persistence rho = 0.9 (absences of tens of
rounds), cyclic with 4 groups (periodic: Amplified SCAFFOLD's setting), and a trace imported
from a FedScale-format client behaviour file (:func:`synthetic_fedscale` writes one, seeded;
``focusfl participation import`` turns it into a trace). Every (algorithm, process) cell is tuned
on the step-size grid ``GRID`` by the rule of ``focusfl tune`` with several seeds: a step is
ranked by the mean round at which its runs reach rel. error 1e-8 if every seed's does, else by
its mean final error (:func:`mean_over_seeds`); each run is a :class:`RunConfig` built and
executed by runs/driver.py, the trials of every cell in batches of runs
(:func:`focusfl.sweeps.tune.run_trials`).

Verdicts are pure functions of named numbers, each returning the outcome with the criterion
it applied; :func:`claims` states them beside the numbers. A comparison whose tuned step sits at
an end of the grid (no interior optimum) is "inconclusive".
"""
from __future__ import annotations

import math
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import FocusflError
from ..io.atomic import open_atomic, write_text
from ..recordings.importing import ImportOptions, import_trace, statistics_lines, trace_text
from ..plots import legend_below, palette, pyplot
from ..words import counted
from .studies import TARGET, tuned_steps, with_curve
from ..sweeps.tune import TuneSetup, lr_grid
from ..sweeps.tune import setup as tune_setup
from .verdicts import FOCUS, Criterion, Verdict

PROBLEM = "ridge:dim=10,clients=8,samples=20"
CLIENTS = 8
RATES = "0.2;0.3;0.4;0.5;0.6;0.7;0.8;0.9"
TRACE = "FedScale-format trace"
PROCESSES = {
    "bernoulli": f"bernoulli:p={RATES}",
    "markov (rho 0.9)": f"markov:p={RATES},rho=0.9",
    "cyclic (4 groups)": "cyclic:groups=4",
    TRACE: None,  # imported at run time: study_processes()
}
UNEQUAL = ("bernoulli", "markov (rho 0.9)", TRACE)  # the processes whose rates differ across clients
CYCLIC = "cyclic (4 groups)"
# The exact methods (FOCUS paper Table 1, FedSUM) and the FedAvg-type ones; Amplified SCAFFOLD
# and the FedStale endpoints (beta 0 = FedAvg, beta 1 = FedVARP, with FedStale's weights) beside.
EXACT = ("focus", "fedsum_b", "fedsum", "fedsum_cr", "scaffold")
PLATEAU = ("proxskip", "mifa", "fedvarp", "fedstale", "fedau", "fedawe", "fedpbc", "debiasing_fedavg", "fedavg")
FEDSTALE_ENDS = ("fedstale:beta=0", "fedstale:beta=1")
ALGORITHMS = (*EXACT, "amplified_scaffold", *PLATEAU, *FEDSTALE_ENDS)
LOCAL_STEPS = 2
GRID = lr_grid(1e-4, 1e-1, 10)  # three points a decade: brackets every method's stable steps on PROBLEM
ROUND_SECONDS = 3600  # the synthetic trace: rounds of an hour over days of spells


@dataclass(frozen=True)
class SuiteSizes:
    rounds: int = 1000
    seeds: int = 3
    grid_every: int = 1  # every k-th point of GRID
    eval_every: int = 10


FULL = SuiteSizes()
QUICK = SuiteSizes(rounds=150, seeds=1, grid_every=3, eval_every=10)


# -- the imported trace -----------------------------------------------------------------------------
def synthetic_fedscale(clients: int = CLIENTS, seed: int = 0) -> dict:
    """A FedScale client behaviour trace (the pickle's dict) of ``clients`` devices with daily
    spells: each device repeats one to three spells of 2 to 8 hours every finish_time of one or
    two days (seeded, so the trace is the same on every machine)."""
    rng = np.random.default_rng([seed, 29])
    trace = {}
    for client in range(clients):
        day = 86400 * int(rng.integers(1, 3))
        starts = np.sort(rng.uniform(0, day - 8 * 3600, size=int(rng.integers(1, 4))))
        lengths = rng.uniform(2 * 3600, 8 * 3600, size=starts.size)
        active = [int(s) for s in starts]
        inactive = [int(min(s + length, day)) for s, length in zip(starts, lengths)]
        trace[client] = {"duration": day, "active": active, "inactive": inactive, "finish_time": day,
                         "model": f"device-{client}"}
    return trace


def import_synthetic_trace(folder: Path, rounds: int) -> tuple[str, list[str]]:
    """Write the synthetic FedScale pickle into ``folder``, import it with the command's code
    (recordings/importing.py) and write the trace: returns the participation SPEC and the
    statistics lines the import prints."""
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / "fedscale_behaviour.pkl"
    with open_atomic(source, "wb") as handle:
        pickle.dump(synthetic_fedscale(), handle, protocol=4)
    trace = import_trace("fedscale", source, ImportOptions(round_seconds=ROUND_SECONDS, rounds=rounds))
    if trace.mask.shape[1] != CLIENTS:  # a change of synthetic_fedscale that leaves a device never available
        raise FocusflError(f"the synthetic FedScale trace lost devices {trace.dropped}: every one must be available")
    path = folder / "fedscale_trace.csv"
    write_text(path, trace_text(trace))
    return f"trace:path={path.resolve()}", statistics_lines(trace, shown=CLIENTS)


# -- tuning ---------------------------------------------------------------------------------------
def mean_over_seeds(trials: Sequence[dict]) -> dict:
    """One step size over several seeds, as ``focusfl tune --seeds`` ranks it: the mean round at
    which the runs reach the target if every seed's run does (else None), the mean final value
    (inf if one diverged); the first seed's curve."""
    reached = [t["first_round_below_target"] for t in trials]
    finals = [t["final"] for t in trials]
    return {**trials[0], "first_round_below_target": sum(reached) / len(reached) if None not in reached else None,
            "final": math.fsum(finals) / len(finals) if all(math.isfinite(f) for f in finals) else math.inf,
            "diverged_at": next((t["diverged_at"] for t in trials if t["diverged_at"] is not None), None),
            "seeds": len(trials)}


def tuned_cells(cells: dict, grid: Sequence[float], seeds: int, *, batch_runs: int | str = "auto") -> dict:
    """The step of every cell (key -> (algorithm, setup)), each ranked by its mean over ``seeds``
    seeds (:func:`mean_over_seeds`), by the search rule of ``focusfl tune``: ``grid`` extended past
    an end until the best step is interior or bounded by a diverged step; all cells searched
    together, their trials in batches of runs. Per key: the cell's row; ``edge``: the search hit
    its cap with the best step still at an end."""
    per_seed = {key: (algorithm, [TuneSetup(setup.run.replace(seed=seed), setup.target) for seed in range(seeds)])
                for key, (algorithm, setup) in cells.items()}
    choices = tuned_steps(per_seed, grid, batch_runs=batch_runs, rows=True,
                          reduce=lambda trials: mean_over_seeds([with_curve(t) for t in trials]))
    rows = {}
    for key, choice in choices.items():
        best = choice.trial
        rows[key] = {"algorithm": cells[key][0], "lr": best["lr"], "rounds_to_target": best["first_round_below_target"],
                     "final": best["final"], "diverged": best["diverged_at"] is not None, "curve": best["curve"],
                     "edge": choice.capped, "lr_reason": choice.reason}
    return rows


def tuned_cell(algorithm: str, setup: TuneSetup, grid: Sequence[float], seeds: int) -> dict:
    """One cell of :func:`tuned_cells`."""
    return tuned_cells({algorithm: (algorithm, setup)}, grid, seeds)[algorithm]


def run_study(sizes: SuiteSizes, processes: dict[str, str], algorithms: Sequence[str] = ALGORITHMS, *,
              batch_runs: int | str = "auto") -> list[dict]:
    """Every (process, algorithm) cell, tuned."""
    cells = {}
    for label, spec in processes.items():
        setup = tune_setup(problem=PROBLEM, participation=spec, rounds=sizes.rounds, local_steps=LOCAL_STEPS,
                           target=TARGET, eval_every=sizes.eval_every)
        cells.update({(label, algorithm): (algorithm, setup) for algorithm in algorithms})
    rows = tuned_cells(cells, GRID[:: sizes.grid_every], sizes.seeds, batch_runs=batch_runs)
    return [{"process": label, **rows[(label, algorithm)]} for label, algorithm in cells]


# -- verdicts ---------------------------------------------------------------------------------------
# Each claim's criterion over named numbers (reproduce/verdicts.py): the report judges the claim
# with it, and the functions below give the verdict of raw cells (what claims() reads).
# A miss (a run that did not reach 1e-8) decides only in a run of the study's full length: the
# quick study's 150 rounds cannot tell slow from never.
DECISIVE_ROUNDS = FULL.rounds

EXACT_EVERYWHERE = Criterion(
    "suite-exact-everywhere", "reproduced if every run reaches rel. error 1e-8 within the budget (a miss counts "
    f"in runs of at least {DECISIVE_ROUNDS} rounds)",
    ("runs", "runs_reaching_1e-8", "rounds"),
    lambda v: True if v["runs_reaching_1e-8"] == v["runs"] else (False if v["rounds"] >= DECISIVE_ROUNDS else None))

PLATEAU_EVERYWHERE = Criterion(
    "suite-plateau-everywhere", "reproduced if no run reaches rel. error 1e-8 (every one stays on a plateau) in "
    f"runs of at least {DECISIVE_ROUNDS} rounds",
    ("runs", "runs_reaching_1e-8", "rounds"),
    lambda v: False if v["runs_reaching_1e-8"] > 0 else (True if v["rounds"] >= DECISIVE_ROUNDS else None))


def _unless_edge(decide):
    """A comparison at a tuned step still at the end of its extended grid (the search's cap) decides nothing."""
    return lambda v: None if v["step_at_grid_edge"] else decide(v)


FASTER = Criterion(
    "suite-faster", "reproduced if the candidate reaches 1e-8 in fewer rounds than the baseline; not reproduced if "
    "not fewer; inconclusive if either never reaches it or a tuned step sits at the grid's edge",
    ("candidate_rounds", "baseline_rounds", "step_at_grid_edge"),
    _unless_edge(lambda v: None if v["candidate_rounds"] is None or v["baseline_rounds"] is None
                 else v["candidate_rounds"] < v["baseline_rounds"]))

LOWER_PLATEAU = Criterion(
    "suite-lower-plateau", "reproduced if the candidate's final error is below the baseline's under every process "
    "with unequal rates; not reproduced if below under none; inconclusive otherwise or at the grid's edge",
    ("processes", "processes_below", "step_at_grid_edge"),
    _unless_edge(lambda v: True if v["processes_below"] == v["processes"] else
                 (False if v["processes_below"] == 0 else None)))

BETWEEN_ENDS = Criterion(
    "suite-between-ends", "reproduced if the mixed weight is at least as good (within 1%) as both ends in at least "
    "half of the processes; not reproduced if in none; inconclusive otherwise or at the grid's edge",
    ("processes", "processes_at_least_as_good", "step_at_grid_edge"),
    _unless_edge(lambda v: True if 2 * v["processes_at_least_as_good"] >= v["processes"] else
                 (False if v["processes_at_least_as_good"] == 0 else None)))


def exact_everywhere_values(rounds: dict[str, int | float | None], budget: int = DECISIVE_ROUNDS) -> dict:
    """``rounds``: (algorithm / process) -> mean rounds to 1e-8, None when not reached, in runs of
    ``budget`` rounds."""
    return {"runs": len(rounds), "runs_reaching_1e-8": sum(value is not None for value in rounds.values()),
            "rounds": budget}


def plateau_everywhere_values(finals: dict[str, float], budget: int = DECISIVE_ROUNDS) -> dict:
    """``finals``: (algorithm / process) -> final rel. error (mean over seeds), in runs of ``budget`` rounds."""
    return {"runs": len(finals), "runs_reaching_1e-8": sum(value <= TARGET for value in finals.values()),
            "rounds": budget}


def faster_values(candidate: int | float | None, baseline: int | float | None, edge: bool) -> dict:
    """Rounds to 1e-8 of the candidate against the baseline's (both tuned)."""
    return {"candidate_rounds": candidate, "baseline_rounds": baseline, "step_at_grid_edge": edge}


def lower_plateau_values(ratios: dict[str, float], edge: bool) -> dict:
    """``ratios``: process -> candidate's final error / baseline's (both tuned)."""
    return {"processes": len(ratios), "processes_below": sum(r < 1 for r in ratios.values()), "step_at_grid_edge": edge}


def between_ends_values(mixed: dict[str, float], ends: dict[str, float], edge: bool) -> dict:
    """FedStale's final error per process against the better of its two ends (beta 0 and 1)."""
    return {"processes": len(mixed), "processes_at_least_as_good": sum(mixed[p] <= 1.01 * ends[p] for p in mixed),
            "step_at_grid_edge": edge}


def exact_everywhere_verdict(rounds: dict[str, int | float | None], budget: int = DECISIVE_ROUNDS) -> Verdict:
    return EXACT_EVERYWHERE.judge(exact_everywhere_values(rounds, budget))


def plateau_everywhere_verdict(finals: dict[str, float], budget: int = DECISIVE_ROUNDS) -> Verdict:
    return PLATEAU_EVERYWHERE.judge(plateau_everywhere_values(finals, budget))


def faster_verdict(candidate: int | float | None, baseline: int | float | None, edge: bool) -> Verdict:
    return FASTER.judge(faster_values(candidate, baseline, edge))


def lower_plateau_verdict(ratios: dict[str, float], edge: bool) -> Verdict:
    return LOWER_PLATEAU.judge(lower_plateau_values(ratios, edge))


def between_ends_verdict(mixed: dict[str, float], ends: dict[str, float], edge: bool) -> Verdict:
    return BETWEEN_ENDS.judge(between_ends_values(mixed, ends, edge))


# -- the section ------------------------------------------------------------------------------------
AMPLIFIED = "Amplified SCAFFOLD (Crawshaw and Liu, NeurIPS 2024)"
FEDSTALE = "FedStale (Rodio and Neglia, 2024)"
FEDPBC = "FedPBC (Xiang et al., IEEE CDC 2023)"
DEBIASING = "Debiasing FedAvg (Sun et al., ICLR 2025)"
FOCUS_PAPER = FOCUS


def _cell(rows: list[dict], algorithm: str, process: str) -> dict:
    return next(r for r in rows if r["algorithm"] == algorithm and r["process"] == process)


def _shown(row: dict) -> str:
    """Rounds to 1e-8 (a mean over seeds, to the round), or the final error when never reached."""
    return f"{row['rounds_to_target']:.0f}" if row["rounds_to_target"] is not None else f"never ({row['final']:.1e})"


def claims(rows: list[dict], budget: int = DECISIVE_ROUNDS) -> list[dict]:
    """The section's claims, each with the numbers and the verdict its criterion gives (``budget``:
    the runs' rounds)."""
    processes = list(dict.fromkeys(r["process"] for r in rows))
    cell = lambda algorithm, process: _cell(rows, algorithm, process)  # noqa: E731
    out = []

    exact = exact_everywhere_verdict({f"{a} / {p}": cell(a, p)["rounds_to_target"] for a in EXACT for p in processes},
                                     budget)
    out.append(_claim(FOCUS_PAPER, "Table 1; FedSUM §3", "the tracking and control-variate methods (FOCUS, the "
                      "FedSUM family, SCAFFOLD) converge exactly under any participation, a real-format trace "
                      "included", "rounds to 1e-8", "; ".join(
                          f"{a}: " + "/".join(_shown(cell(a, p)) for p in processes) for a in EXACT), exact))

    plateau = plateau_everywhere_verdict({f"{a} / {p}": cell(a, p)["final"] for a in PLATEAU for p in processes},
                                         budget)
    out.append(_claim(FOCUS_PAPER, "Table 1 (older and newer FedAvg-type methods)", "with τ > 1 local steps the "
                      "FedAvg-type methods, FedStale, FedPBC and Debiasing FedAvg included, stop on a plateau",
                      "final rel. error", "; ".join(
                          f"{a}: " + "/".join(f"{cell(a, p)['final']:.1e}" for p in processes) for a in PLATEAU),
                      plateau))

    amplified, scaffold = cell("amplified_scaffold", CYCLIC), cell("scaffold", CYCLIC)
    converges = exact_everywhere_verdict({CYCLIC: amplified["rounds_to_target"]}, budget)
    out.append(_claim(AMPLIFIED, "Theorem (cyclic participation)", "Amplified SCAFFOLD converges under cyclic "
                      "participation", f"{CYCLIC}, period = the cycle (4 rounds), γ = 1.5",
                      f"rounds to 1e-8: {_shown(amplified)}", converges))
    faster = faster_verdict(amplified["rounds_to_target"], scaffold["rounds_to_target"],
                            amplified["edge"] or scaffold["edge"])
    others = ", ".join(f"{p}: {_shown(cell('amplified_scaffold', p))} vs {_shown(cell('scaffold', p))}"
                       for p in processes if p != CYCLIC)
    out.append(_claim(AMPLIFIED, "§5, periodic participation", "under periodic participation Amplified SCAFFOLD "
                      "needs fewer rounds than SCAFFOLD", f"{CYCLIC}, both tuned",
                      f"rounds to 1e-8: Amplified SCAFFOLD {_shown(amplified)} (η={amplified['lr']:.3g}), SCAFFOLD "
                      f"{_shown(scaffold)} (η={scaffold['lr']:.3g}); elsewhere {others}", faster,
                      "the paper's advantage is in communication rounds for nonconvex stochastic objectives with "
                      "heterogeneous data; this is a deterministic strongly convex problem"))

    unequal = [p for p in UNEQUAL if p in processes]
    ends = {p: min(cell(e, p)["final"] for e in FEDSTALE_ENDS) for p in processes}
    mixed = {p: cell("fedstale", p)["final"] for p in processes}
    stale_edge = any(cell(a, p)["edge"] for a in ("fedstale", *FEDSTALE_ENDS) for p in processes)
    stale_wins = sum(cell(FEDSTALE_ENDS[1], p)["final"] < cell(FEDSTALE_ENDS[0], p)["final"] for p in processes)
    out.append(_claim(FEDSTALE, "abstract, §6", "a mixed weight β of stale updates beats both FedAvg (β = 0) and "
                      "FedVARP (β = 1) in many settings", "fedstale β = 0.5 against β = 0 and β = 1 (FedStale's "
                      "estimated weights), every process", "; ".join(
                          f"{p}: {mixed[p]:.1e} vs {cell(FEDSTALE_ENDS[0], p)['final']:.1e} / "
                          f"{cell(FEDSTALE_ENDS[1], p)['final']:.1e}" for p in processes),
                      between_ends_verdict(mixed, ends, stale_edge),
                      f"the all-stale end (β = 1) is the better end in {stale_wins} of {len(processes)} processes; "
                      "the paper finds stale updates the more useful the more heterogeneous the data and the less "
                      "unequal the participation"))

    for paper, candidate, where, said in (
            (FEDPBC, "fedpbc", "Theorem 1", "FedPBC corrects FedAvg's bias under non-uniform participation"),
            (DEBIASING, "debiasing_fedavg", "§4, Theorem 2", "Debiasing FedAvg removes FedAvg's bias under "
             "unequal (and correlated) participation")):
        ratios = {p: cell(candidate, p)["final"] / cell("fedavg", p)["final"] for p in unequal}
        edge = any(cell(a, p)["edge"] for a in (candidate, "fedavg") for p in unequal)
        out.append(_claim(paper, where, said, "final rel. error against FedAvg's, both tuned, processes with "
                          "unequal rates", "; ".join(f"{p}: {cell(candidate, p)['final']:.1e} vs "
                                                     f"{cell('fedavg', p)['final']:.1e}" for p in unequal),
                          lower_plateau_verdict(ratios, edge),
                          "with τ = 2 both keep client drift, which no reweighting removes"))
    return out


def _claim(paper: str, where: str, claim: str, ran: str, number: str, verdict: Verdict, reason: str = "") -> dict:
    """A claim's fields; ``criterion`` (its name) and ``values`` let the report judge it again with
    its own sizes (reproduce/reproduce_report.py suite_section)."""
    return {"paper": paper, "where": where, "claim": claim, "ran": ran, "number": number,
            "verdict": verdict.outcome, "reason": f"{verdict.criterion}" + (f"; {reason}" if reason else ""),
            "criterion": verdict.name, "values": verdict.values, "note": reason}


def exactness_table(rows: list[dict]) -> str:
    processes = list(dict.fromkeys(r["process"] for r in rows))
    lines = ["| algorithm | " + " | ".join(processes) + " |", "|---" * (len(processes) + 1) + "|"]
    for algorithm in dict.fromkeys(r["algorithm"] for r in rows):
        cells = []
        for process in processes:
            row = _cell(rows, algorithm, process)
            edge = ", edge" if row["edge"] else ""
            if row["diverged"] or not math.isfinite(row["final"]):
                cells.append("diverged")
            elif row["rounds_to_target"] is not None:
                cells.append(f"**exact**, round {row['rounds_to_target']:.0f} (η={row['lr']:.3g}{edge})")
            else:
                cells.append(f"plateau {row['final']:.1e} (η={row['lr']:.3g}{edge})")
        lines.append(f"| {algorithm} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_curves(rows: list[dict], path: Path, rounds: int) -> None:
    """One panel per process: rel. error against rounds of every algorithm at its tuned step (seed 0)."""
    plt = pyplot()
    processes = list(dict.fromkeys(r["process"] for r in rows))
    algorithms = list(dict.fromkeys(r["algorithm"] for r in rows))
    colors = dict(zip(algorithms, palette(len(algorithms))))
    styles = {a: "-" if a in (*EXACT, "amplified_scaffold") else "--" for a in algorithms}
    fig, axes = plt.subplots(1, len(processes), figsize=(3.2 * len(processes), 3.4), sharey=True, squeeze=False,
                             layout="constrained")
    for ax, process in zip(axes[0], processes):
        for row in (r for r in rows if r["process"] == process):
            xs, ys = zip(*row["curve"]) if row["curve"] else ((), ())
            ax.plot(xs, [max(y, 1e-17) for y in ys], styles[row["algorithm"]], color=colors[row["algorithm"]],
                    label=row["algorithm"], lw=1.1)
        ax.set_yscale("log")
        ax.set_title(process, fontsize=9)
        ax.set_xlabel("round", fontsize=8)
        ax.set_xlim(0, rounds)
        ax.grid(True, which="major", alpha=0.3)
        ax.tick_params(labelsize=7)
    axes[0][0].set_ylabel("‖x − x*‖/‖x*‖ (tuned η)", fontsize=8)
    # One legend below the panels, every algorithm once (the figure grows to hold it).
    handles = [plt.Line2D([], [], color=colors[a], linestyle=styles[a], lw=1.1) for a in algorithms]
    legend_below(fig, handles, algorithms, fontsize=7)
    fig.savefig(path, dpi=80)
    plt.close(fig)


def report_section(quick: bool, images: Path, batch_runs: int | str = "auto") -> dict:
    """The report section: title, claims (Claim fields) and markdown text; the figure is written
    to ``images``/suite.png and the imported trace beside the report (suite/)."""
    sizes = QUICK if quick else FULL
    spec, trace_lines = import_synthetic_trace(images.parent.parent / "suite", sizes.rounds)
    processes = {label: spec if label == TRACE else process for label, process in PROCESSES.items()}
    rows = run_study(sizes, processes, batch_runs=batch_runs)
    plot_curves(rows, images / "suite.png", sizes.rounds)
    grid = GRID[:: sizes.grid_every]
    text = [
        f"Every method under the same four processes: `{PROBLEM}`, τ = {LOCAL_STEPS} local steps, {sizes.rounds} "
        f"rounds; Bernoulli and Markov (ρ = 0.9: absences of tens of rounds) with p_i = {RATES.replace(';', ', ')}, "
        f"cyclic with 4 groups, and a trace imported with `focusfl participation import fedscale` from a seeded "
        f"FedScale-format behaviour file of {CLIENTS} devices (spells of 2 to 8 hours a day or two, rounds of "
        f"{ROUND_SECONDS // 60} minutes; the file and the trace are in `suite/`). Each cell: the step tuned on "
        f"{', '.join(f'{lr:g}' for lr in grid)} (extended past an end until interior) by the rule of `focusfl tune` over {counted(sizes.seeds, 'seed')} (mean "
        "round to 1e-8 if every seed gets there, else mean final error); **exact, round r**: every seed below 1e-8 "
        "(mean round); **plateau e**: the mean final error; *edge*: the tuned step is still an end of the grid after the search extended it to its cap.",
        "The imported trace, as the import printed it:\n\n```text\n" + "\n".join(trace_lines) + "\n```",
        exactness_table(rows),
        f"![the suite]({images.parent.name}/{images.name}/suite.png)",
        "*Relative error against rounds at each method's tuned step (seed 0), one panel per process*: solid, "
        "the tracking and control-variate methods; dashed, the FedAvg-type ones.",
    ]
    return {"title": "The suite under one roof", "claims": claims(rows, sizes.rounds), "text": text}


__all__ = [name for name in dir() if not name.startswith("_") and name not in ("annotations",)]

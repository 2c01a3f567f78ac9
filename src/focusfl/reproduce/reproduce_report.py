"""``focusfl reproduce report``: every claim of the papers that fits a CPU, checked by one command,
with computed verdicts.

Writes ``DIR/report.md`` (one row per claim: which paper and where, what we ran, our number,
the verdict with its criterion and the numbers it read), the figures it refers to under
``DIR/images/reproductions/``, and ``DIR/summary.csv`` (the claim rows). docs/reproductions.md
is this report:
    focusfl reproduce report --out runs/report --data PATH/mnist10k.npz
    cp runs/report/report.md docs/reproductions.md
    cp runs/report/images/reproductions/*.png docs/images/reproductions/

Every claim declares a criterion over named measured numbers (focusfl/reproduce/verdicts.py)
and its verdict is computed from them: **reproduced**, **reproduced on another axis** (the claim
holds measured differently, e.g. per float instead of per round), **not reproduced**, or
**inconclusive** (the measurement cannot separate: too few seeds, overlapping spreads, a run
too short). ``--quick`` runs every check at toy sizes (for tests): the report says so in its
first lines and its verdicts are **inconclusive (quick)** wherever those sizes cannot decide.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..argtypes import BATCH_RUNS_SAME, BATCH_RUNS_WHAT, batch_runs_value
from ..data.loaders import read_npz_dataset
from ..errors import ConfigError, FocusflError
from ..io.atomic import write_csv
from ..io.folders import output_folder
from ..matrix import bias
from ..matrix.bias import DEFAULT_BIAS_PROBLEM, FEDAVG_STEP, WARMUP_EFOLDS
from ..participation import make_participation
from ..plots import coinciding_groups, palette, pyplot
from ..problems import make_problem
from ..runs.batch import batch_size
from ..words import counted
from . import baselines_study, studies
from .exactness import PROBLEMS, PROCESSES, TABLE, format_markdown, measure_table
from .nn_study import FULL_STUDY, QUICK_STUDY, check_study_folder, nn_section
from .privacy_study import privacy_section
from .preset import Preset
from .reproduce_delays import measure, plot_delays, summarize_rows
from .reproduce_ridge import SCENARIOS, many_lines_style, plot_figures, run_figure4
from .studies import as_table, reductions, scaffold_against_focus, scaffold_fixed_point
from .suite_study import report_section as suite_report_section
from .verdicts import (
    ANOTHER_AXIS,
    CRITERIA,
    FEDSUM,
    FOCUS,
    NOT_REPRODUCED,
    REPRODUCED,
    REVIEWS,
    Claim,
    Criterion,
    Section,
    ahead,
    all_of,
    claims_rows,
    claims_table,
    finite,
    show,
)

FEDNOVA = "FedNova paper (Wang et al., NeurIPS 2020)"
SOURCE_WORK = "focusfl (arbitrary work)"
FIGURES = Path("images") / "reproductions"

__all__ = ["Claim", "Section", "Sizes", "FULL", "QUICK", "build_report", "run"]


@dataclass(frozen=True)
class Sizes:
    """Sizes of every check; ``QUICK`` shrinks them for tests."""

    ridge_rounds: int = 500
    study_rounds: int = 3000
    prox_rounds: int = 1000
    push_rounds: int = 3000
    delay_clients: int = 100
    delay_rounds: int = 2000
    delay_seeds: int = 5
    exactness: bool = True
    low_p: tuple = (0.3, 0.1, 0.03, 0.01)
    rhos: tuple = (0.0, 0.5, 0.9, 0.97, 0.99)
    absences: float = 20.0  # each rho of the long-absence study runs for this many of the rarest client's absences
    versus_seeds: int = 3
    work_rounds: int = 1000
    work_problems: tuple = ("ridge", "logistic")
    work_processes: tuple = ("fixed", "uniform", "rates (slow clients)", "markov (slow spells)")
    work_grid_points: int = 0  # 0: the studies' grids; k: every k-th point of them (quick)
    quick: bool = False
    # Runs stepped together by the convex sections (runs/batch.py; --batch-runs): how they are
    # computed, never what they compute.
    batch_runs: int | str = "auto"


FULL = Sizes()
QUICK = Sizes(ridge_rounds=40, study_rounds=300, prox_rounds=200, push_rounds=300, delay_clients=20,
              delay_rounds=200, delay_seeds=1, exactness=False, low_p=(0.3, 0.03), rhos=(0.0, 0.9), absences=0.0,
              work_rounds=100, work_problems=("ridge",), work_processes=("uniform", "rates (slow clients)"),
              work_grid_points=2, quick=True)

# -- horizons that decide -------------------------------------------------------------------------
# Figure 4 runs 500 rounds: a method that has not reached 1e-8 by then is judged not to (a shorter
# run, the quick report's, decides only what it reached).
FIGURE4_ROUNDS = 500
# The work study's 1,000 rounds: its exact methods get there within 100; half of it decides.
WORK_DECISIVE_ROUNDS = 500
# A client seen this many times in expectation (rounds x p_min) has had its chance to converge.
VISITS_TO_DECIDE = 20
# An absence study decides at rho when its run lasted this many of the rarest client's mean absences.
ABSENCES_TO_DECIDE = 20


def _first(summary: list[dict], algorithm: str, scenario: str, key: str):
    """The ``key`` of the summary row of (algorithm, scenario); a missing row is a bug of the report
    (a renamed preset entry), said in one line rather than as a bare StopIteration."""
    for row in summary:
        if row["algorithm"] == algorithm and row["scenario"] == scenario:
            return row[key]
    raise FocusflError(f"the report needs the run {algorithm} under {scenario}, which its preset did not produce")


def never_inf(value) -> float:
    """Rounds (or floats) to a target, with "never reached" as +inf: the numbers criteria compare."""
    return math.inf if value is None else value


def _rounds(value) -> str:
    return "never" if value is None or (isinstance(value, float) and math.isinf(value)) else f"{value:g}"


def sooner(first: float, second: float, long_enough: bool) -> bool | None:
    """Whether ``first`` reached the target no later than ``second`` (rounds, +inf: never): a method
    that never got there is slower than one that did in the same run; both never, or only the
    second never in a run too short to call "never", cannot be told."""
    if finite(first) and finite(second):
        return first <= second
    if finite(first):
        return True if long_enough else None
    if finite(second):
        return False
    return None


def reached_in_time(values: list[float], long_enough: bool) -> bool | None:
    """True when every run reached the target, False when one did not in a run long enough to say
    so, None when one did not in a shorter run."""
    if all(finite(v) for v in values):
        return True
    return False if long_enough else None


# -- ridge figure -----------------------------------------------------------------------------------
FIG4_EXACT = Criterion(
    "fig4-focus-exact", "FOCUS's rel. error reaches 1e-8 under full, uniform and arbitrary participation "
    f"(a miss counts only in a run of at least {FIGURE4_ROUNDS} rounds)",
    ("focus_rounds", "rounds"),
    lambda v: reached_in_time(list(v["focus_rounds"]), v["rounds"] >= FIGURE4_ROUNDS))

FIG4_FASTEST = Criterion(
    "fig4-focus-fastest", "per round: FOCUS reaches 1e-8 no later than the fastest other method under uniform and "
    "arbitrary participation (at the figure's common η); on another axis: the same per float communicated",
    ("focus_rounds", "fastest_other_rounds", "focus_floats", "fewest_other_floats", "rounds"),
    lambda v: all_of([sooner(a, b, v["rounds"] >= FIGURE4_ROUNDS)
                      for a, b in zip(v["focus_rounds"], v["fastest_other_rounds"])]),
    another_axis=lambda v: all_of([sooner(a, b, v["rounds"] >= FIGURE4_ROUNDS)
                                   for a, b in zip(v["focus_floats"], v["fewest_other_floats"])]),
    reasons={ANOTHER_AXIS: "per round another method gets there first at the common η; per float communicated "
                           "FOCUS does (it sends 2 vectors per participant and round, SCAFFOLD and FedSUM 4)"})

FIG4_FEDAVG_INEXACT = Criterion(
    "fig4-fedavg-fedau-inexact", "neither FedAvg nor FedAU reaches 1e-8 in any scenario, in a run of at least "
    f"{FIGURE4_ROUNDS} rounds",
    ("fedavg_rounds", "fedau_rounds", "rounds"),
    lambda v: False if any(map(finite, [*v["fedavg_rounds"], *v["fedau_rounds"]]))
    else (True if v["rounds"] >= FIGURE4_ROUNDS else None))

FIG4_COINCIDE = Criterion(
    "fig4-coincide", "under full participation one group of coinciding curves (2% on the log axis at every point) "
    "holds FedAvg, FedAU and MIFA, and one holds SCAFFOLD and ProxSkip",
    ("fedavg_fedau_mifa_coincide", "scaffold_proxskip_coincide"),
    lambda v: v["fedavg_fedau_mifa_coincide"] and v["scaffold_proxskip_coincide"])

FIG4_SCAFFOLD = Criterion(
    "fig4-scaffold-converges", "SCAFFOLD's rel. error reaches 1e-8 under full, uniform and arbitrary participation "
    f"(a miss counts only in a run of at least {FIGURE4_ROUNDS} rounds)",
    ("scaffold_rounds", "rounds"),
    lambda v: reached_in_time(list(v["scaffold_rounds"]), v["rounds"] >= FIGURE4_ROUNDS))

FIG4_PROXSKIP = Criterion(
    "fig4-proxskip-diverges", "ProxSkip (as published, shifted average) diverges under uniform or arbitrary "
    f"participation in the paper's setting (stability judged over at least {FIGURE4_ROUNDS} rounds)",
    ("proxskip_diverged", "rounds"),
    lambda v: True if v["proxskip_diverged"] else (False if v["rounds"] >= FIGURE4_ROUNDS else None))

FIG4_MIFA = Criterion(
    "fig4-mifa-diverges", "MIFA (as published) diverges under uniform or arbitrary participation in the paper's "
    f"setting (stability judged over at least {FIGURE4_ROUNDS} rounds)",
    ("mifa_diverged", "rounds"),
    lambda v: True if v["mifa_diverged"] else (False if v["rounds"] >= FIGURE4_ROUNDS else None))

FIG4_SETTING = Criterion(
    "fig4-setting", "the published picture (FOCUS at 1e-8 before SCAFFOLD under arbitrary participation) follows "
    "from the stated setting: FOCUS's rounds to 1e-8 below SCAFFOLD's in the paper setting",
    ("focus_rounds_paper", "scaffold_rounds_paper", "rounds"),
    lambda v: (v["focus_rounds_paper"] < v["scaffold_rounds_paper"])
    if finite(v["focus_rounds_paper"]) and finite(v["scaffold_rounds_paper"])
    else sooner(v["focus_rounds_paper"], v["scaffold_rounds_paper"], v["rounds"] >= FIGURE4_ROUNDS))


def _floats_to(rows: list[dict], threshold: float = 1e-8) -> float:
    """Floats communicated (down + up) when the run first reached ``threshold``; +inf if never."""
    for row in rows:
        if row["rel_error"] <= threshold:
            return float(row["comm_down"] + row["comm_up"])
    return math.inf


def ridge_section(sizes: Sizes, images: Path) -> Section:
    section = Section("FOCUS paper, Figure 4: ridge regression")
    paper_panels, paper = run_figure4(sizes.ridge_rounds, setting="paper", batch_runs=sizes.batch_runs)
    nb_panels, notebook = run_figure4(sizes.ridge_rounds, setting="notebook", batch_runs=sizes.batch_runs)
    with many_lines_style():
        for name, panels, setting in (("ridge_paper", paper_panels, "paper"), ("ridge_notebook", nb_panels, "notebook")):
            scratch = images / f".{name}"
            scratch.mkdir(exist_ok=True)
            plot_figures(panels, scratch, setting)
            for path in scratch.glob("*.png"):
                path.replace(images / f"{name}_{path.name}")
            for path in scratch.iterdir():
                path.unlink()
            scratch.rmdir()
    titles = {spec: title for title, spec in SCENARIOS.items()}
    first = lambda alg, sc, rows=paper: never_inf(_first(rows, alg, sc, "first_round_below_1e-8"))  # noqa: E731
    final = lambda alg, sc, rows=paper: _first(rows, alg, sc, "final_rel_error")  # noqa: E731
    diverged_at = lambda alg, sc, rows: _first(rows, alg, sc, "diverged_at")  # noqa: E731
    floats = lambda alg, sc: _floats_to(paper_panels[titles[sc]][alg])  # noqa: E731
    uniform, arbitrary = "uniform:m=4", "weighted:m=4"
    scenarios = ("full", uniform, arbitrary)
    others = [a for a in dict.fromkeys(row["algorithm"] for row in paper) if a != "focus"]
    fastest = lambda sc: min(others, key=lambda a: (first(a, sc), a))  # noqa: E731
    cheapest = lambda sc: min(others, key=lambda a: (floats(a, sc), a))  # noqa: E731
    full_groups = coinciding_groups(paper_panels[titles["full"]])
    rounds = sizes.ridge_rounds
    shown = lambda alg, rows=paper: " / ".join(_rounds(first(alg, sc, rows)) for sc in scenarios)  # noqa: E731
    section.claims.append(Claim(
        FOCUS, "§5, Figure 4", "FOCUS converges linearly and exactly under full, uniform and arbitrary participation",
        f"`reproduce ridge` (paper setting), η = 2e-4, τ = 5, {rounds} rounds",
        f"rel. error < 1e-8 at rounds {shown('focus')}; final {final('focus', arbitrary):.1e} (arbitrary)",
        FIG4_EXACT.judge({"focus_rounds": [first("focus", sc) for sc in scenarios], "rounds": rounds},
                         quick=sizes.quick)))
    section.claims.append(Claim(
        FOCUS, "§5, Figure 4", "FOCUS outperforms the other algorithms in every scenario, especially under arbitrary "
        "participation", "the same runs: rounds and floats communicated to 1e-8 (the tuned comparison is below)",
        f"uniform: FOCUS {_rounds(first('focus', uniform))} rounds, fastest other {fastest(uniform)} "
        f"{_rounds(first(fastest(uniform), uniform))}; arbitrary: FOCUS {_rounds(first('focus', arbitrary))}, "
        f"{fastest(arbitrary)} {_rounds(first(fastest(arbitrary), arbitrary))}; floats (arbitrary): FOCUS "
        f"{show(floats('focus', arbitrary))}, fewest other {cheapest(arbitrary)} "
        f"{show(floats(cheapest(arbitrary), arbitrary))}",
        FIG4_FASTEST.judge({"focus_rounds": [first("focus", sc) for sc in (uniform, arbitrary)],
                            "fastest_other_rounds": [first(fastest(sc), sc) for sc in (uniform, arbitrary)],
                            "focus_floats": [floats("focus", sc) for sc in (uniform, arbitrary)],
                            "fewest_other_floats": [floats(cheapest(sc), sc) for sc in (uniform, arbitrary)],
                            "rounds": rounds}, quick=sizes.quick)))
    section.claims.append(Claim(
        FOCUS, "Figure 4 caption", "FedAvg and FedAU fail to converge to x* in every scenario", "the same runs",
        f"FedAvg at {final('fedavg', 'full'):.1e} / {final('fedavg', uniform):.1e} / {final('fedavg', arbitrary):.1e}"
        f" after {rounds} rounds; FedAU at {final('fedau', arbitrary):.1e} (arbitrary)",
        FIG4_FEDAVG_INEXACT.judge({"fedavg_rounds": [first("fedavg", sc) for sc in scenarios],
                                   "fedau_rounds": [first("fedau", sc) for sc in scenarios], "rounds": rounds},
                                  quick=sizes.quick)))
    section.claims.append(Claim(
        FOCUS, "Figure 4 caption", "under full participation FedAvg, FedAU and MIFA coincide, and so do SCAFFOLD and "
        "ProxSkip", "curves compared point by point (2% on the log axis)",
        "; ".join(" = ".join(group) for group in full_groups) or "none coincide",
        FIG4_COINCIDE.judge({"fedavg_fedau_mifa_coincide": any({"fedavg", "fedau", "mifa"} <= set(g) for g in full_groups),
                             "scaffold_proxskip_coincide": any({"scaffold", "proxskip"} <= set(g) for g in full_groups)},
                            quick=sizes.quick)))
    section.claims.append(Claim(
        FOCUS, "Figure 4 caption", "SCAFFOLD converges in all cases", "the same runs",
        f"rel. error < 1e-8 at rounds {shown('scaffold')}; final {final('scaffold', arbitrary):.1e} (arbitrary)",
        FIG4_SCAFFOLD.judge({"scaffold_rounds": [first("scaffold", sc) for sc in scenarios], "rounds": rounds},
                            quick=sizes.quick)))
    deferred_at = diverged_at("proxskip:partial=deferred", arbitrary, notebook)
    section.claims.append(Claim(
        FOCUS, "Figure 4 caption", "ProxSkip diverges under uniform and arbitrary participation",
        "ProxSkip's three adaptations (paper and notebook settings)",
        f"shifted average (paper setting): final {final('proxskip', arbitrary):.1e}; the notebook's deferred control "
        f"update: {'diverges at round ' + str(deferred_at) if deferred_at is not None else 'does not diverge'}; plain "
        f"average (notebook setting): {final('proxskip:partial=plain', arbitrary, notebook):.1e} after {rounds} rounds",
        FIG4_PROXSKIP.judge(
            {"proxskip_diverged": any(diverged_at("proxskip", sc, paper) is not None for sc in (uniform, arbitrary)),
             "rounds": rounds}, quick=sizes.quick,
            reason="the notebook's ProxSkip (h_i updated at the client's next participation against the server model "
                   f"of then) diverges at round {deferred_at}: the divergence of the figure comes from that form"
                   if deferred_at is not None else "")))
    notebook_mifa_at = diverged_at("mifa:notebook=true", arbitrary, notebook)
    section.claims.append(Claim(
        FOCUS, "Figure 4 caption", "MIFA diverges (\"we do not understand why\")",
        "MIFA as published, and the notebook's MIFA (`mifa:notebook=true`)",
        f"MIFA (paper setting) final {final('mifa', arbitrary):.1e} (FedAvg's full-participation error "
        f"{final('fedavg', 'full'):.1e}); the notebook's MIFA: "
        f"{'diverges at round ' + str(notebook_mifa_at) if notebook_mifa_at is not None else 'does not diverge'}",
        FIG4_MIFA.judge(
            {"mifa_diverged": any(diverged_at("mifa", sc, paper) is not None for sc in (uniform, arbitrary)),
             "rounds": rounds}, quick=sizes.quick,
            reason="the notebook's MIFA client pushes (its own previous local model − z) instead of (x_r − z): an "
                   f"absent client's row, a one-time move, is applied again every round; it diverges at round "
                   f"{notebook_mifa_at}" if notebook_mifa_at is not None else "")))
    nb_focus, nb_scaffold = first("focus", arbitrary, notebook), first("scaffold", arbitrary, notebook)
    notebook_axis = sooner(nb_focus, 2 * nb_scaffold, rounds >= FIGURE4_ROUNDS)
    section.claims.append(Claim(
        FOCUS, "§5 text", "the figure's setting: d = 100, N = 16, K = 100 rows, λ = 0.01, τ = 5, η = 2e-4 for all",
        "the authors' notebook, read: d = 50, 500 rows, λ = 0, ½‖Ax − b‖², τ = 3, η = 6e-4 / 1.5e-4 / 1e-4; both "
        "settings run",
        f"arbitrary: paper setting FOCUS {_rounds(first('focus', arbitrary))}, SCAFFOLD "
        f"{_rounds(first('scaffold', arbitrary))} rounds; notebook setting FOCUS {_rounds(nb_focus)}, SCAFFOLD "
        f"{_rounds(nb_scaffold)} (×2 on the notebook's axis: {_rounds(2 * nb_scaffold)})",
        FIG4_SETTING.judge({"focus_rounds_paper": first("focus", arbitrary), "scaffold_rounds_paper":
                            first("scaffold", arbitrary), "rounds": rounds}, quick=sizes.quick,
                           reason="the notebook's setting on the notebook's x-axis (SCAFFOLD's rounds counted twice) "
                                  "gives the published picture" if notebook_axis else "")))
    per_float = {alg: _first(paper, alg, arbitrary, "floats_communicated") for alg in ("focus", "scaffold")}
    section.text += [
        f"![paper setting]({FIGURES}/ridge_paper_figure.png)",
        "*Paper setting, against rounds.* Under full participation FOCUS reaches 1e-8 at round "
        f"{_rounds(first('focus', 'full'))}; the curves that coincide are named under each panel. Under partial "
        "participation the exact methods (FOCUS, FedSUM family, SCAFFOLD) separate from the plateaus of the others.",
        f"![paper setting, communication]({FIGURES}/ridge_paper_figure_communication.png)",
        "*The same runs against floats communicated.* SCAFFOLD and FedSUM pay for their second vector: "
        f"after {rounds} arbitrary rounds FOCUS has sent {per_float['focus']:.3g} floats, SCAFFOLD "
        f"{per_float['scaffold']:.3g}.",
        f"![notebook setting]({FIGURES}/ridge_notebook_figure.png)",
        "*Notebook setting.* The notebook's MIFA and ProxSkip are drawn beside MIFA as published and ProxSkip with a "
        "shifted and with a plain average; a cross marks a run that diverged.",
        f"![notebook axis]({FIGURES}/ridge_notebook_figure_notebook_axis.png)",
        "*Notebook setting on the notebook's own x-axis* (SCAFFOLD and ProxSkip rounds counted twice): the "
        "axis of the published figure.",
    ]
    return section


# -- exactness, SCAFFOLD, bias ------------------------------------------------------------------------
TABLE1_FOCUS = Criterion(
    "table1-focus-exact", "FOCUS reaches rel. error 1e-10 in every cell of the exactness table (ridge and logistic "
    "× bernoulli, markov, cyclic)", ("focus_exact_cells", "cells"),
    lambda v: None if v["focus_exact_cells"] is None else v["focus_exact_cells"] == v["cells"])

TABLE1_INEXACT = Criterion(
    "table1-averaging-inexact", "FedAvg, FedAU, FedAWE and MIFA reach 1e-10 in no cell of the table (each plateaus)",
    ("exact_cells_of_averaging_methods",),
    lambda v: None if v["exact_cells_of_averaging_methods"] is None else v["exact_cells_of_averaging_methods"] == 0)

TABLE1_MARKOV = Criterion(
    "table1-focus-markov", "FOCUS reaches 1e-10 in both Markov cells (ridge and logistic, ρ = 0.5)",
    ("focus_markov_rounds",),
    lambda v: None if v["focus_markov_rounds"] is None else all(map(finite, v["focus_markov_rounds"])))

SCAFFOLD_FIXED_POINT = Criterion(
    "scaffold-fixed-point", "started at (x*, c_i = ∇f_i(x*)) with c = mean c_i SCAFFOLD stays within 1e-12 of x* "
    "under partial participation, and with c off that mean by 0.1 it leaves x* by more than 1e-6",
    ("gap_at_mean", "gap_off_mean"),
    lambda v: v["gap_at_mean"] < 1e-12 and v["gap_off_mean"] > 1e-6,
    reasons={REPRODUCED: "(x*, ∇f_i(x*)) is a fixed point for every active set: the corrected local gradient is 0; "
                         "only bookkeeping that breaks c = mean c_i (which the 1/N server update keeps) biases it"})

FOCUS_VS_SCAFFOLD = Criterion(
    "focus-faster-than-scaffold", "each at its tuned step, on every seed: FOCUS's rounds to 1e-8 below SCAFFOLD's "
    "(spreads over ≥ 3 seeds separated); on another axis: the same per vector communicated",
    ("focus_rounds", "scaffold_rounds", "focus_vectors", "scaffold_vectors"),
    lambda v: ahead(v["scaffold_rounds"], v["focus_rounds"]),
    another_axis=lambda v: ahead(v["scaffold_vectors"], v["focus_vectors"]),
    reasons={ANOTHER_AXIS: "per round tuned SCAFFOLD needs fewer rounds; per vector communicated FOCUS needs fewer"})


def exactness_section(sizes: Sizes) -> Section:
    section = Section("Exact convergence (FOCUS Table 1), SCAFFOLD")
    cells = [(p, q) for p in PROBLEMS for q in PROCESSES]
    table = measure_table(batch_runs=sizes.batch_runs) if sizes.exactness else None
    if table is not None:
        exact = {alg: [isinstance(table[(alg, p, q)][1], int) for p, q in cells]
                 for alg in dict.fromkeys(k[0] for k in table)}
        section.text += [f"Cells rerun from the stored step sizes of `focusfl/reproduce/exactness.py` "
                         f"(TABLE, {len(TABLE)} cells).", format_markdown(table)]
        exact_names = ", ".join(a for a, ok in exact.items() if all(ok))
        inexact = ", ".join(a for a, ok in exact.items() if not all(ok))
        focus_rounds = "/".join(show(table[("focus", p, q)][1]) for p, q in cells)
        markov = [table[("focus", p, "markov")][1] for p in PROBLEMS]
        values = {"focus_exact_cells": sum(exact["focus"]), "cells": len(cells),
                  "exact_cells_of_averaging_methods": sum(sum(exact[a]) for a in ("fedavg", "fedau", "fedawe", "mifa")),
                  "focus_markov_rounds": [m if isinstance(m, int) else math.inf for m in markov]}
        numbers = (f"exact in {sum(exact['focus'])}/{len(cells)} cells (rounds to 1e-10: {focus_rounds})",
                   f"exact everywhere: {exact_names}; plateau somewhere: {inexact}",
                   f"ridge {show(markov[0])}, logistic {show(markov[1])} rounds")
    else:
        values = {"focus_exact_cells": None, "cells": len(cells), "exact_cells_of_averaging_methods": None,
                  "focus_markov_rounds": None}
        numbers = ("not measured in a quick report",) * 3
        section.text.append("The exactness table is not rerun by a quick report.")
    section.claims += [
        Claim(FOCUS, "Table 1, Theorem 1", "FOCUS converges exactly with a constant step under arbitrary "
              "participation", "exactness table: ridge and logistic × bernoulli, markov, cyclic, tuned η", numbers[0],
              TABLE1_FOCUS.judge(values, quick=sizes.quick)),
        Claim(FOCUS, "Table 1", "FedAvg, FedAU, FedAWE and MIFA are not exact with a constant step", "the same table",
              numbers[1], TABLE1_INEXACT.judge(values, quick=sizes.quick)),
        Claim(FOCUS, "§6 Limitations", "FOCUS still converges exactly under Markov participation (not proved)",
              "markov cells (ρ = 0.5) and the long-absence study below", numbers[2],
              TABLE1_MARKOV.judge(values, quick=sizes.quick)),
    ]
    fixed = scaffold_fixed_point(rounds=min(200, sizes.study_rounds))
    biased = scaffold_fixed_point(rounds=min(200, sizes.study_rounds), offset=0.1)
    versus = {row["algorithm"]: row for row in scaffold_against_focus(rounds=sizes.ridge_rounds,
                                                                      seeds=sizes.versus_seeds,
                                                                      batch_runs=sizes.batch_runs)}
    f, s = versus["focus"], versus["scaffold"]
    section.claims += [
        Claim(FOCUS, "Table 1, footnote 3", "SCAFFOLD: no proof under arbitrary participation; \"empirically "
              "possible\"", "SCAFFOLD started at (x*, c_i = ∇f_i(x*)) under Bernoulli with p_i = 0.1..0.9 "
              "(200 rounds); and with c off mean c_i by 0.1",
              f"c = mean c_i: max ‖x − x*‖/‖x*‖ = {fixed:.1e}; c = mean c_i + 0.1: {biased:.1e}",
              SCAFFOLD_FIXED_POINT.judge({"gap_at_mean": fixed, "gap_off_mean": biased}, quick=sizes.quick)),
        Claim(FOCUS, "§5", "FOCUS converges faster than SCAFFOLD under arbitrary participation",
              f"both tuned (the search rule of `focusfl tune`) on the paper's ridge, weights ∝ U(0,1)+0.01, 4 of 16, "
              f"{sizes.ridge_rounds} rounds, seeds 0-{sizes.versus_seeds - 1}",
              f"rounds to 1e-8 per seed: FOCUS {show(f['rounds_per_seed'])} (η={f['lr']:.3g}), SCAFFOLD "
              f"{show(s['rounds_per_seed'])} (η={s['lr']:.3g}); vectors sent: FOCUS {show(f['vectors_per_seed'])}, "
              f"SCAFFOLD {show(s['vectors_per_seed'])}",
              FOCUS_VS_SCAFFOLD.judge({"focus_rounds": f["rounds_per_seed"], "scaffold_rounds": s["rounds_per_seed"],
                                       "focus_vectors": f["vectors_per_seed"],
                                       "scaffold_vectors": s["vectors_per_seed"]}, quick=sizes.quick)),
    ]
    return section


BIAS_THEOREM3 = Criterion(
    "bias-theorem3", "FedAvg's average lies at the weighted target's distance from x* within 2% at η and at η/2 "
    "(a window starting after ≥ 10 e-folds of the slowest mode decides), and FOCUS ends within 1e-10 of x*",
    ("distance_ratio", "distance_ratio_half_step", "focus_error", "efolds_before_window"),
    lambda v: None if v["efolds_before_window"] < 10 else (
        abs(v["distance_ratio"] - 1) < 0.02 and abs(v["distance_ratio_half_step"] - 1) < 0.02
        and v["focus_error"] < 1e-10),
    reasons={REPRODUCED: "the distance to x* does not shrink with η; what is left between x̄ and x_q is the "
                         "fluctuation of the iterate, which a longer window shrinks"})

BIAS_OLD_WINDOW = Criterion(
    "bias-old-window", "the warm-up left in the old averaging window (rounds 1,500..3,000) is below 1.5% of "
    "‖x_q − x*‖, so that \"98.5% of the distance\" measures the bias and not the start",
    ("warmup_share",), lambda v: v["warmup_share"] < 0.015,
    reasons={NOT_REPRODUCED: "the old window began 2.5 e-folds in; `focusfl bias` now starts it after 10 e-folds and "
                             "prints the warm-up share"})


def bias_section(sizes: Sizes) -> Section:
    section = Section("FedAvg's bias (FOCUS Theorem 3)")
    problem = make_problem(DEFAULT_BIAS_PROBLEM)
    process = make_participation("bernoulli", problem.num_clients, seed=0)
    quad = bias.client_quadratics(problem)
    q = bias.participation_weights(process).q
    lipschitz = bias.smoothness(quad)
    x_star, target = problem.x_star, bias.weighted_target(quad, q)
    gap = float((target - x_star).norm())
    results = {}
    for label, lr in (("η", FEDAVG_STEP / lipschitz), ("η/2", FEDAVG_STEP / (2 * lipschitz))):
        mode = bias.slowest_mode(quad, q, lr)
        start = math.ceil(WARMUP_EFOLDS * mode.rounds_per_efold) if not sizes.quick else 200
        rounds = 2 * start
        limits = bias.limit_points(problem, process, rounds=rounds, fedavg_lr=lr, focus_lr=0.5 / (16 * lipschitz),
                                   average_from=start)
        results[label] = (mode, start, rounds, float((limits.fedavg_average - x_star).norm()) / gap,
                          float((limits.fedavg_average - target).norm()) / gap,
                          float((limits.focus_last - x_star).norm()))
    mode, start, rounds, ratio, off, focus = results["η"]
    section.text.append(
        f"`focusfl bias` on its default problem: q_i = E[1{{i∈S}}/|S|] in closed form, the weighted target x_q = "
        f"argmin Σ q_i f_i at ‖x_q − x*‖ = {gap:.4f} (‖x*‖ = {float(x_star.norm()):.4f}). FedAvg's slowest mode "
        f"(λ_min(Σ q_i H_i) = {mode.eigenvalue:.4g}) takes {mode.rounds_per_efold:.0f} rounds per e-fold, so the "
        f"average runs over rounds {start}..{rounds}. Its distance from x* is the target's to "
        f"{100 * abs(ratio - 1):.1f}% and, at η/2, to {100 * abs(results['η/2'][3] - 1):.1f}% (Theorem 3's "
        "sampling-bias term is independent of η). FOCUS ends at "
        f"‖x − x*‖ = {focus:.1e}.")
    old = bias.warmup_in_average(quad, q, problem.initial_point(), FEDAVG_STEP / lipschitz, 1500, 3000)
    section.claims += [
        Claim(FOCUS, "Theorem 3, Appendix D", "FedAvg converges to a neighbourhood of argmin Σ q_i f_i, "
              "with a sampling-bias term independent of η", f"`focusfl bias` default problem (16 clients, "
              f"Bernoulli preset, τ = 1), FedAvg averaged over rounds {start}..{rounds} "
              f"({start / mode.rounds_per_efold:.1f} e-folds of its slowest mode in); again with η/2",
              f"‖x̄ − x*‖ = {ratio:.4f} × ‖x_q − x*‖ (η), {results['η/2'][3]:.4f} × (η/2); ‖x̄ − x_q‖ = "
              f"{off:.3f} × ‖x_q − x*‖; FOCUS ‖x − x*‖ = {focus:.1e}",
              BIAS_THEOREM3.judge({"distance_ratio": ratio, "distance_ratio_half_step": results["η/2"][3],
                                   "focus_error": focus, "efolds_before_window": start / mode.rounds_per_efold},
                                  quick=sizes.quick)),
        Claim("focusfl docs", "docs/framework.md (before this report)", "FedAvg's average is at 98.5% of the "
              "weighted target's distance (rounds 1,500..3,000)", "warm-up left in that window, from the "
              "expected iteration", f"slowest mode: one e-fold every {mode.rounds_per_efold:.0f} rounds; the "
              f"start left in the old window: {100 * old / gap:.1f}% of ‖x_q − x*‖",
              BIAS_OLD_WINDOW.judge({"warmup_share": old / gap}, quick=sizes.quick)),
    ]
    return section


# -- FedSUM: reductions and delays ------------------------------------------------------------------
FEDSUM_REDUCTIONS = Criterion(
    "fedsum-reductions", "every pair of the equivalences gives server models within 1e-12 (relative to ‖x*‖) "
    "over 60 rounds in float64", ("largest_difference",), lambda v: v["largest_difference"] < 1e-12,
    reasons={REPRODUCED: "of our reconstruction: the paper's formulas are lost"})

FEDSUM_DELAYS = Criterion(
    "fedsum-delays", "cyclic participation with 10 groups has τ_max = 9, and the reshuffled cyclic and Bernoulli "
    "(p = 0.1) patterns at the same rate have τ_max at least twice that",
    ("cyclic_tau_max", "reshuffled_tau_max", "bernoulli_tau_max"),
    lambda v: v["cyclic_tau_max"] == 9 and v["reshuffled_tau_max"] >= 18 and v["bernoulli_tau_max"] >= 18,
    reasons={REPRODUCED: "the paper's rates for P1-P3 were lost; ours are stated in `reproduce delays`"})


def fedsum_section(sizes: Sizes, images: Path) -> Section:
    section = Section("FedSUM family: reductions and delay metrics")
    gaps = reductions()
    worst = max(gaps.values())
    section.claims.append(Claim(
        FEDSUM, "§3 prose (formulas lost; ALGORITHMS.md §3.4)", "FedSUM = FedSUM-CR = SCAFFOLD under full "
        "participation; FedSUM-B (K = 1) is FOCUS (τ = 1); FedSUM (K = 1) = FedSUM-B",
        "server models of each pair, 60 rounds, float64", f"largest difference {worst:.1e} (relative to ‖x*‖)",
        FEDSUM_REDUCTIONS.judge({"largest_difference": worst}, quick=sizes.quick)))
    section.text.append("| equivalence | max ‖x_a − x_b‖ / ‖x*‖ |\n|---|---|\n" +
                        "\n".join(f"| {k} | {v:.1e} |" for k, v in gaps.items()))
    seeds = list(range(sizes.delay_seeds))
    rows, traces = measure(sizes.delay_clients, sizes.delay_rounds, seeds)
    summary = {row["pattern"].split(":")[0]: row for row in summarize_rows(rows)}
    plot_delays(list(summarize_rows(rows)), traces, [images / "delays.png"],
                f"FedSUM delay metrics: N={sizes.delay_clients}, {sizes.delay_rounds} rounds, {counted(len(seeds), 'seed')}")
    cyclic, reshuffled, bernoulli = (summary[c]["tau_max_mean"] for c in ("Case 3", "Case 4", "Case 2"))
    section.claims.append(Claim(
        FEDSUM, "§2.2, Appendix F", "cyclic participation with E groups has τ_max = E − 1; random patterns "
        "at the same rate have far longer delays", f"delay metrics of Cases 1-4, P1-P3, N = {sizes.delay_clients}, "
        f"{sizes.delay_rounds} rounds, mean over {counted(len(seeds), 'seed')}",
        f"cyclic (10 groups) τ_max = {cyclic:.0f}; reshuffled {reshuffled:.0f}; Bernoulli p = 0.1: {bernoulli:.0f}",
        FEDSUM_DELAYS.judge({"cyclic_tau_max": cyclic, "reshuffled_tau_max": reshuffled,
                             "bernoulli_tau_max": bernoulli}, quick=sizes.quick)))
    section.text += [f"![delays]({FIGURES}/delays.png)",
                     "*Delay metrics.* Left: τ(r) over the first 200 rounds; cyclic participation is the flat line "
                     "at E − 1 = 9, the random patterns climb until their slowest client returns. Right: τ_max "
                     "and τ_avg per pattern (log scale)."]
    return section


# -- studies --------------------------------------------------------------------------------------
def _table(rows, row_key, column_key, title_row: str, cell=None) -> str:
    row_labels, column_labels, cells = as_table(rows, row_key, column_key, **({} if cell is None else {"cell": cell}))
    header = f"| {title_row} | " + " | ".join(str(c) for c in column_labels) + " |"
    lines = [header, "|---" * (len(column_labels) + 1) + "|"]
    for r in row_labels:
        lines.append(f"| {r} | " + " | ".join(cells.get((r, c), "") for c in column_labels) + " |")
    return "\n".join(lines)


def _plot_rounds(rows, x_key: str, path: Path, xlabel: str, title: str, log_x: bool) -> None:
    plt = pyplot()
    algorithms = list(dict.fromkeys(r["algorithm"] for r in rows))
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for color, algorithm in zip(palette(len(algorithms)), algorithms):
        mine = [r for r in rows if r["algorithm"] == algorithm]
        xs = [r[x_key] if not log_x else max(r[x_key], 1e-3) for r in mine]
        ys = [r["rounds_to_target"] if r["rounds_to_target"] is not None else math.nan for r in mine]
        reached = any(math.isfinite(y) for y in ys)
        # An algorithm that never reaches 1e-8 keeps its legend entry (an empty line), named as such.
        ax.plot(xs, ys, marker="o", color=color, label=algorithm if reached else f"{algorithm} (never reaches 1e-8)")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("rounds to rel. error 1e-8 (tuned η)")
    if log_x:
        ax.set_xscale("log")
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(f"{title}\na missing point: 1e-8 not reached in the run", fontsize=9)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)


LOW_P_FOCUS = Criterion(
    "low-p-focus-converges", f"FOCUS reaches 1e-8 at every p_min (a miss counts only when the run gives the rarest "
    f"client ≥ {VISITS_TO_DECIDE} visits in expectation: rounds × p_min)",
    ("p_min", "focus_rounds", "rounds"),
    lambda v: all_of([True if finite(r) else (False if v["rounds"] * p >= VISITS_TO_DECIDE else None)
                      for p, r in zip(v["p_min"], v["focus_rounds"])]),
    reasons={REPRODUCED: "the rounds grow as the rarest client returns less often (table below)"})


def _comparable(v) -> bool | None:
    """MIFA and FedVARP within a factor 2 of SCAFFOLD's rounds and no faster than FOCUS."""
    scaffold, focus = v["scaffold_rounds"], v["focus_rounds"]
    if not finite(scaffold):
        return None  # nothing to be comparable to
    verdicts = []
    for other in (v["mifa_rounds"], v["fedvarp_rounds"]):
        if finite(other):
            verdicts.append(scaffold / 2 <= other <= 2 * scaffold and (not finite(focus) or focus <= other))
        else:  # never in this run: slower than 2x SCAFFOLD if the run lasted that long
            verdicts.append(False if v["rounds"] >= 2 * scaffold else None)
    return all_of(verdicts)


MIFA_FEDVARP = Criterion(
    "mifa-fedvarp-comparable", "MIFA's and FedVARP's rounds to 1e-8 within a factor 2 of SCAFFOLD's, and FOCUS's "
    "no later than theirs (a miss counts in a run of at least twice SCAFFOLD's rounds)",
    ("scaffold_rounds", "mifa_rounds", "fedvarp_rounds", "focus_rounds", "rounds"), _comparable,
    reasons={NOT_REPRODUCED: "with τ > 1 local steps MIFA and FedVARP keep the client drift (their tables store "
                             "drifted updates): they plateau where SCAFFOLD and FOCUS are exact"})

LONG_ABSENCES = Criterion(
    "long-absences-focus-exact", f"FOCUS reaches 1e-8 at every ρ (a miss counts only in a run of ≥ "
    f"{ABSENCES_TO_DECIDE} mean absences of the rarest client, 1 / (p_min (1 − ρ)) rounds each)",
    ("rho", "focus_rounds", "rounds", "mean_absence"),
    lambda v: all_of([True if finite(r) else (False if n >= ABSENCES_TO_DECIDE * a else None)
                      for r, n, a in zip(v["focus_rounds"], v["rounds"], v["mean_absence"])]),
    reasons={REPRODUCED: "SCAFFOLD behaves alike; FedAU and MIFA plateau (table below)"})

PUSHSUM = Criterion(
    "pushsum-exact", "plain push-sum reaches 1e-8 under Bernoulli participation (a miss counts when FOCUS reached "
    "it in a run of the same length)", ("pushsum_rounds", "focus_rounds"),
    lambda v: True if finite(v["pushsum_rounds"]) else (False if finite(v["focus_rounds"]) else None),
    reasons={NOT_REPRODUCED: "plain push-sum is not exact (w_i are refilled at every pull whatever the rate); "
                             "push-sum with gradient tracking is (table below)"})

PROXSKIP_EXACT_ONLY_FULL = Criterion(
    "proxskip-exact-only-full", "ProxSkip as published (Scaffnew's shifted average) reaches 1e-8 under full "
    "participation and under none of the partial processes (decided once it reached 1e-8 under full participation "
    "in the same run length)", ("shifted_exact_full", "shifted_exact_partial"),
    lambda v: None if not v["shifted_exact_full"] else not v["shifted_exact_partial"])


def studies_section(sizes: Sizes, images: Path) -> Section:
    section = Section("Studies the reviewers asked for and ProxSkip's adaptations")
    low = studies.low_participation(sizes.low_p, rounds=sizes.study_rounds, batch_runs=sizes.batch_runs)
    _plot_rounds(low, "p_min", images / "low_participation.png", "smallest participation rate p_min",
                 f"Bernoulli, client 0 at p_min, others 0.3..0.9 (8 clients, τ = 2, {sizes.study_rounds} rounds)",
                 log_x=True)
    focus_low = {r["p_min"]: r for r in low if r["algorithm"] == "focus"}
    low_rounds = [never_inf(focus_low[p]["rounds_to_target"]) for p in sizes.low_p]
    section.claims.append(Claim(
        REVIEWS, "answer to reviewer (low participation)", "with very infrequent clients FOCUS is slower, with "
        "temporary plateaus, but still converges", f"rounds to 1e-8 at tuned η against p_min = "
        f"{', '.join(f'{p:g}' for p in sizes.low_p)} ({sizes.study_rounds} rounds)",
        "FOCUS: " + ", ".join(_rounds(r) for r in low_rounds),
        LOW_P_FOCUS.judge({"p_min": list(sizes.low_p), "focus_rounds": low_rounds, "rounds": sizes.study_rounds},
                          quick=sizes.quick)))
    section.text += ["**Low-probability clients** (rounds to 1e-8; \"never: e\" = final error after "
                     f"{sizes.study_rounds} rounds; each step size by the search rule of `focusfl tune` from "
                     f"{', '.join(f'{lr:g}' for lr in studies.GRID)}, extended past an end until interior):",
                     _table(low, "algorithm", "p_min", "algorithm \\ p_min"),
                     f"![low participation]({FIGURES}/low_participation.png)",
                     "*Rounds to 1e-8 against the smallest rate*, each algorithm at its tuned step."]
    mixing = {r["algorithm"]: r for r in low if r["p_min"] == sizes.low_p[0]}
    section.claims.append(Claim(
        REVIEWS, "answer to reviewer (MIFA, FedVARP)", "MIFA and FedVARP perform comparably to SCAFFOLD and "
        "below FOCUS", f"the same study at p_min = {sizes.low_p[0]:g}",
        f"rounds to 1e-8: SCAFFOLD {_rounds(mixing['scaffold']['rounds_to_target'])}, FOCUS "
        f"{_rounds(mixing['focus']['rounds_to_target'])}, MIFA {_rounds(mixing['mifa']['rounds_to_target'])} (final "
        f"{mixing['mifa']['final']:.1e}), FedVARP {_rounds(mixing['fedvarp']['rounds_to_target'])} (final "
        f"{mixing['fedvarp']['final']:.1e})",
        MIFA_FEDVARP.judge({f"{a}_rounds": never_inf(mixing[a]["rounds_to_target"])
                            for a in ("scaffold", "mifa", "fedvarp", "focus")} | {"rounds": sizes.study_rounds},
                           quick=sizes.quick)))

    markov = studies.long_absences(sizes.rhos, rounds=sizes.study_rounds, absences=sizes.absences,
                                   batch_runs=sizes.batch_runs)
    _plot_rounds(markov, "rho", images / "long_absences.png", "persistence ρ (lag-one autocorrelation of presence)",
                 "Markov participation, stationary rates 0.2..0.9 (8 clients, τ = 2)", log_x=False)
    focus_m = {r["rho"]: r for r in markov if r["algorithm"] == "focus"}
    delays = {r["rho"]: (r["tau_max"], r["tau_avg"], r["rounds"]) for r in markov}
    absence_rounds = [never_inf(focus_m[r]["rounds_to_target"]) for r in sizes.rhos]
    section.claims.append(Claim(
        REVIEWS, "reviewers' request; FOCUS §6", "FOCUS converges exactly under Markov participation with long "
        "absences", f"ρ = {', '.join(f'{r:g}' for r in sizes.rhos)} (τ_max = "
        f"{', '.join(str(delays[r][0]) for r in sizes.rhos)}; rounds run: "
        f"{', '.join(str(delays[r][2]) for r in sizes.rhos)})",
        "FOCUS rounds to 1e-8: " + ", ".join(_rounds(r) for r in absence_rounds)
        + "".join(f" (ρ = {r:g}: {focus_m[r]['final']:.1e} after {delays[r][2]} rounds)"
                  for r in sizes.rhos if focus_m[r]["rounds_to_target"] is None),
        LONG_ABSENCES.judge({"rho": list(sizes.rhos), "focus_rounds": absence_rounds,
                             "rounds": [delays[r][2] for r in sizes.rhos],
                             "mean_absence": [focus_m[r]["mean_absence"] for r in sizes.rhos]}, quick=sizes.quick)))
    section.text += ["**Long absences** (Markov, rounds to 1e-8):", _table(markov, "algorithm", "rho", "algorithm \\ ρ"),
                     "Delay metrics of each ρ: " + "; ".join(f"ρ = {r:g}: τ_max {m}, τ_avg {a:.1f}, {n} rounds run"
                                                             for r, (m, a, n) in delays.items()),
                     f"![long absences]({FIGURES}/long_absences.png)",
                     "*Rounds to 1e-8 against persistence*: absences grow with ρ and so do the rounds."]

    push = studies.pushsum_against_focus(rounds=sizes.push_rounds, batch_runs=sizes.batch_runs)
    pmap = {(r["process"], r["algorithm"]): r for r in push}
    bern = "bernoulli (FOCUS preset)"
    section.claims.append(Claim(
        REVIEWS, "answer to reviewer (push-sum)", "push-sum FL compensates for unequal participation through its "
        "weights w", f"pushsum, pushsum_tracking, FOCUS, τ = 1, tuned η, {sizes.push_rounds} rounds",
        f"Bernoulli: push-sum final {pmap[(bern, 'pushsum')]['final']:.2g} "
        f"({_rounds(pmap[(bern, 'pushsum')]['rounds_to_target'])} rounds to 1e-8); with tracking "
        f"{_rounds(pmap[(bern, 'pushsum_tracking')]['rounds_to_target'])} rounds, FOCUS "
        f"{_rounds(pmap[(bern, 'focus')]['rounds_to_target'])}",
        PUSHSUM.judge({"pushsum_rounds": never_inf(pmap[(bern, "pushsum")]["rounds_to_target"]),
                       "focus_rounds": never_inf(pmap[(bern, "focus")]["rounds_to_target"])}, quick=sizes.quick)))
    section.text += ["**Push-sum** (rounds to 1e-8):", _table(push, "algorithm", "process", "algorithm")]

    prox = studies.proxskip_adaptations(rounds=sizes.prox_rounds, batch_runs=sizes.batch_runs)
    section.text += [
        "**ProxSkip under partial participation** (`proxskip:partial=...`, rounds to 1e-8 at tuned η, "
        f"{sizes.prox_rounds} rounds; see docs/algorithms.md):", _table(prox, "algorithm", "process", "adaptation")]
    exact_under = lambda variant: [r["process"] for r in prox  # noqa: E731
                                   if r["algorithm"] == variant and r["rounds_to_target"] is not None]
    shifted, plain = exact_under("proxskip"), exact_under("proxskip:partial=plain")
    partial_shifted = [p for p in shifted if p != "full"]
    plain_partial = [p for p in plain if p != "full"]
    section.claims.append(Claim(
        FOCUS, "Table 1", "ProxSkip/Scaffnew is exact only under full participation",
        "three adaptations × six processes", f"shifted average (as published) exact under: "
        f"{', '.join(shifted) or 'none'}; plain average exact under: {', '.join(plain) or 'none'}",
        PROXSKIP_EXACT_ONLY_FULL.judge(
            {"shifted_exact_full": "full" in shifted, "shifted_exact_partial": partial_shifted}, quick=sizes.quick,
            reason=f"a plain average (not in the paper) keeps Σ h_i = 0 and (x*, ∇f_i(x*)) as a fixed point and is "
                   f"exact under: {', '.join(plain_partial)}" if plain_partial else "")))
    return section


# -- arbitrary work -------------------------------------------------------------------------------
WORK_FOCUS_EXACT = Criterion(
    "work-focus-exact", f"FOCUS reaches 1e-8 in every (problem, work, participation) cell (a miss counts in a run of "
    f"≥ {WORK_DECISIVE_ROUNDS} rounds)", ("focus_exact_cells", "cells", "rounds"),
    lambda v: True if v["focus_exact_cells"] == v["cells"] else (False if v["rounds"] >= WORK_DECISIVE_ROUNDS else None))

FEDNOVA_CONSISTENT = Criterion(
    "fednova-below-fedavg", "with unequal steps (rates work, full participation) FedNova's final error is below "
    f"FedAvg's on every problem (at their tuned steps; decided in runs of ≥ {WORK_DECISIVE_ROUNDS} rounds, where "
    "both sit on their plateaus)", ("fedavg_final", "fednova_final", "rounds"),
    lambda v: None if v["rounds"] < WORK_DECISIVE_ROUNDS else all(
        n < a for a, n in zip(v["fedavg_final"], v["fednova_final"])),
    reasons={REPRODUCED: "FedNova's remaining error is client drift (it shrinks with η); it is not exact, and under "
                         "arbitrary participation it keeps FedAvg's participation bias (argmin Σ q_i f_i)"})

WORK_PREDICTION = Criterion(
    "work-fedavg-prediction", "in every cell whose work and participation draw afresh every round, FedAvg's averaged "
    "iterate is within 3 standard errors (+1e-6) of the predicted fixed point x_w",
    ("cells_within", "memoryless_cells"),
    lambda v: None if not v["memoryless_cells"] else v["cells_within"] == v["memoryless_cells"],
    reasons={REPRODUCED: "x_w is exact for processes that draw afresh every round (the round's draw is then "
                         "independent of x_r); Markov work and participation correlate them, so there it is an "
                         "approximation"})


def work_section(sizes: Sizes, images: Path) -> Section:
    section = Section("Exactness under arbitrary work")
    problems = {k: studies.WORK_PROBLEMS[k] for k in sizes.work_problems}
    works = {k: studies.WORK_PROCESSES[k] for k in sizes.work_processes}
    grids = {k: (g[:: sizes.work_grid_points] if sizes.work_grid_points else g) for k, g in studies.WORK_GRIDS.items()}
    rows = studies.exactness_under_work(problems, works, rounds=sizes.work_rounds, grids=grids,
                                        batch_runs=sizes.batch_runs)
    _plot_work_curves(rows, images / "work_exactness.png", sizes.work_rounds)
    for row in rows:
        row["column"] = f"{row['work']} / {row['participation']}"
    algorithms = list(dict.fromkeys(r["algorithm"] for r in rows))
    exact = {a: all(r["verdict"] == "exact" for r in rows if r["algorithm"] == a) for a in algorithms}
    section.text.append(
        f"One algorithm of each way of treating a short client ({', '.join(algorithms)}; docs/algorithms.md says what "
        "every algorithm does) on ridge and "
        f"logistic regression (8 clients, τ = {studies.WORK_LOCAL_STEPS} local steps asked), under the work processes "
        "of `--work` (fixed: all τ; uniform: τ_i,r uniform on 1..τ; rates: clients 0-1 do 1 step, 2-3 do 2, the rest "
        "4; markov: a device is slow, 1 step, 30% of the time in spells, ρ = 0.8), with full participation and with "
        "Bernoulli participation at p_i = 0.2..0.9. Step sizes tuned per cell by the search rule of `focusfl tune` "
        f"from {', '.join(f'{k}: ' + ', '.join(f'{lr:g}' for lr in grids[k]) for k in problems)} (extended past an end "
        f"until interior); {sizes.work_rounds} rounds. A cell: **exact** (rel. error below 1e-8 at the end; the round "
        "it first got there), **plateau at E** (the final rel. error), or **diverged**.")
    for problem in problems:
        mine = [r for r in rows if r["problem"] == problem]
        section.text += [f"**{problem}**:", _table(mine, "algorithm", "column", "algorithm \\ work / participation",
                                                   cell=_work_cell)]
    section.text += [f"![exactness under work]({FIGURES}/work_exactness.png)",
                     "*Relative error against rounds, Bernoulli participation, one panel per work process*, each "
                     "algorithm at its tuned step."]
    predictions = [r for r in rows if "prediction" in r]
    if predictions:
        section.text += [
            "**FedAvg's limit against the framework's prediction** (ridge, at FedAvg's tuned step). Predicted: x_w, "
            "the fixed point of FedAvg's expected round, Σ_i q_i G_i (H_i x − b_i) = 0 with G_i = E[P_i(τ_i)] the "
            "expected gain of τ_i local steps (docs/work.md); as η → 0 it tends to argmin Σ q_i E[τ_i] f_i. Measured: "
            f"the server model averaged over the second half of a {5 * sizes.work_rounds}-round run. Mismatch = "
            "‖x̄ − x_w‖ / ‖x_w − x*‖, beside the standard error of the average on the same scale (batch means):",
            "| work / participation | predicted ‖x_w − x*‖/‖x*‖ | measured ‖x̄ − x*‖/‖x*‖ | mismatch | std. error |\n"
            "|---|---|---|---|---|\n" + "\n".join(
                f"| {r['column']} | {r['prediction']['predicted']:.3e} | {r['prediction']['measured']:.3e} | "
                f"{r['prediction']['mismatch']:.2g} | {r['prediction']['standard_error']:.2g} |" for r in predictions)]
    focus_cells = [r for r in rows if r["algorithm"] == "focus"]
    focus_exact = sum(r["verdict"] == "exact" for r in focus_cells)
    section.claims.append(Claim(
        SOURCE_WORK, "FOCUS's tracking (y = Σ_i g_prev_i whatever the step counts)", "FOCUS stays exact when "
        "participation AND work are arbitrary", f"{len(focus_cells)} cells: {', '.join(problems)} × "
        f"{len(works)} work processes × full and Bernoulli participation, tuned η, {sizes.work_rounds} rounds",
        f"exact in {focus_exact}/{len(focus_cells)} cells; rounds to 1e-8: "
        + "/".join(_rounds(r["rounds_to_target"]) for r in focus_cells)
        + "; also exact everywhere: " + (", ".join(a for a in algorithms if exact[a] and a != "focus") or "none"),
        WORK_FOCUS_EXACT.judge({"focus_exact_cells": focus_exact, "cells": len(focus_cells),
                                "rounds": sizes.work_rounds}, quick=sizes.quick)))
    unequal = [r for r in rows if r["algorithm"] in ("fedavg", "fednova") and r["work"].startswith("rates")
               and r["participation"] == "full"]
    if unequal:
        plateau = {r["algorithm"] + "/" + r["problem"]: r["final"] for r in unequal}
        section.claims.append(Claim(
            FEDNOVA, "§3-4", "with unequal local steps FedAvg converges to a different (step-weighted) objective; "
            "FedNova's normalized averaging removes that inconsistency",
            f"rates work (slow clients), full participation, tuned η, {sizes.work_rounds} rounds",
            "; ".join(f"{p}: FedAvg final {plateau.get(f'fedavg/{p}', math.nan):.1e}, FedNova "
                      f"{plateau.get(f'fednova/{p}', math.nan):.1e}" for p in problems),
            FEDNOVA_CONSISTENT.judge({"fedavg_final": [plateau.get(f"fedavg/{p}", math.inf) for p in problems],
                                      "fednova_final": [plateau.get(f"fednova/{p}", math.inf) for p in problems],
                                      "rounds": sizes.work_rounds}, quick=sizes.quick)))
    if predictions:
        memoryless = [r for r in predictions if not r["work"].startswith("markov")]
        within = [r for r in memoryless if r["prediction"]["mismatch"] <= 3 * r["prediction"]["standard_error"] + 1e-6]
        deterministic = [r for r in predictions if r["work"].startswith("rates") and r["participation"] == "full"]
        section.claims.append(Claim(
            SOURCE_WORK, "matrix framework (FOCUS Theorem 3's argument with step counts)", "FedAvg's limit under "
            "unequal work is the fixed point of its expected round (→ argmin Σ q_i E[τ_i] f_i for small η)",
            "predicted x_w against FedAvg's averaged iterate, ridge, every work × participation cell",
            (f"deterministic cell (rates, full): mismatch {deterministic[0]['prediction']['mismatch']:.1e}; "
             if deterministic else "") + f"within 3 standard errors in {len(within)}/{len(memoryless)} cells with fresh "
            "draws every round" + "".join(f"; {r['column']}: {r['prediction']['mismatch']:.2g} (std. error "
                                          f"{r['prediction']['standard_error']:.2g})"
                                          for r in predictions if r["work"].startswith("markov")),
            WORK_PREDICTION.judge({"cells_within": len(within), "memoryless_cells": len(memoryless)},
                                  quick=sizes.quick)))
    return section


def _work_cell(row: dict) -> str:
    verdict = row["verdict"]
    if verdict == "exact":
        return f"exact ({row['rounds_to_target']}, η={row['lr']:.2g})"
    return f"{verdict} (η={row['lr']:.2g})" if verdict != "diverged" else "diverged"


def _plot_work_curves(rows: list[dict], path: Path, rounds: int) -> None:
    """One panel per work process: rel. error against rounds of every algorithm at its tuned step,
    on the first problem under arbitrary participation; one legend for all panels, beside them."""
    plt = pyplot()
    problem = rows[0]["problem"]
    works = list(dict.fromkeys(r["work"] for r in rows))
    algorithms = list(dict.fromkeys(r["algorithm"] for r in rows))
    colors = dict(zip(algorithms, palette(len(algorithms))))
    fig, axes = plt.subplots(1, len(works), figsize=(3.0 * len(works), 3.0), sharey=True, squeeze=False)
    for ax, work in zip(axes[0], works):
        for r in rows:
            if r["problem"] == problem and r["work"] == work and r["participation"] == "arbitrary":
                xs, ys = zip(*r["curve"]) if r["curve"] else ((), ())
                ax.plot(xs, [max(y, 1e-17) for y in ys], color=colors[r["algorithm"]], label=r["algorithm"], lw=1.2)
        ax.set_yscale("log")
        ax.set_title(work, fontsize=9)
        ax.set_xlabel("round", fontsize=8)
        ax.set_xlim(0, rounds)
        ax.grid(True, which="major", alpha=0.3)
        ax.tick_params(labelsize=7)
    axes[0][0].set_ylabel(f"‖x − x*‖/‖x*‖ ({problem}, Bernoulli)", fontsize=8)
    handles = [plt.Line2D([], [], color=colors[a], lw=1.2) for a in algorithms]
    fig.legend(handles, algorithms, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 0.95))
    fig.tight_layout()
    fig.savefig(path, dpi=80, bbox_inches="tight")
    plt.close(fig)


def suite_section(sizes: Sizes, images: Path) -> Section:
    """The suite under one roof (reproduce/suite_study.py owns its runs and criteria): each claim
    judged here by its criterion over the numbers the study measured."""
    part = suite_report_section(quick=sizes.quick, images=images, batch_runs=sizes.batch_runs)
    claims = [Claim(c["paper"], c["where"], c["claim"], c["ran"], c["number"],
                    CRITERIA[c["criterion"]].judge(c["values"], quick=sizes.quick, reason=c["note"]))
              for c in part["claims"]]
    return Section(part["title"], claims, part["text"])


def baselines_section(sizes: Sizes) -> Section:
    """The baselines' own claims about participation (reproduce/baselines_study.py owns runs and criteria)."""
    return baselines_study.baselines_section(baselines_study.QUICK if sizes.quick else baselines_study.FULL,
                                             quick=sizes.quick, batch_runs=sizes.batch_runs)


# -- the report -----------------------------------------------------------------------------------
QUICK_BANNER = ("**This is a quick report** (`--quick`): every check ran at toy sizes to test the command, so its "
                "numbers are not the report's and a verdict reads **inconclusive (quick)** wherever those sizes "
                "cannot decide. Run without `--quick` for the findings.")


def build_report(sections: list[Section], total: float, data: str | None, workers: int = 1,
                 quick: bool = False) -> str:
    nn_seconds = sum(s.nn_seconds for s in sections)  # every section's neural networks, as it measured them
    lines = ["# Reproduction report" + (" (quick: toy sizes, not findings)" if quick else ""), ""]
    if quick:
        lines += [QUICK_BANNER, ""]
    lines += [
        "Generated by `focusfl reproduce report` (`focusfl/reproduce/reproduce_report.py`); regenerate with",
        "",
        "```",
        "focusfl reproduce report --out runs/report --data PATH/mnist10k.npz --workers 2",
        "cp runs/report/report.md docs/reproductions.md",
        "cp runs/report/images/reproductions/*.png docs/images/reproductions/",
        "```",
        "",
        "focusfl's FOCUS, FedAvg and SCAFFOLD were checked independently against the FOCUS authors' published "
        "code on identical data, masks and step sizes (trajectories agree to about 1e-15; SG-FOCUS against a "
        "re-creation of the authors' client/server loop in the neural-network section), so where a number below "
        "differs from a paper's, the difference is a finding. Every verdict is computed: each claim states its "
        "criterion over named numbers beside the verdict, with the numbers it read. Verdicts: **reproduced**; "
        "**reproduced on another axis** (the claim holds measured differently); **not reproduced**; "
        "**inconclusive** (the measurement cannot separate: too few seeds, overlapping spreads over seeds, or a run "
        "too short to call a miss). Algorithms are compared at tuned step sizes (the search rule of `focusfl "
        "tune`: a grid extended past an end until the best step is interior or bounded by a diverged step), and "
        "two methods are called different only when their spreads over at least 3 seeds separate.",
        "",
        f"This run took {total / 60:.1f} minutes on one CPU thread"
        + (f" (the neural-network runs {workers} at a time, one thread each)" if data and workers > 1 else "")
        + (f", {(total - nn_seconds) / 60:.1f} of them without the neural-network part" if data
           else " (the neural-network part was skipped)")
        + "; per section: " + ", ".join(f"{s.title.split(':')[0]} {s.seconds:.0f} s" for s in sections) + ". "
        "Times depend on the machine and its load; the numbers do not (every run is seeded).",
        "",
        "## Claims",
        "",
        *claims_table(sections),
    ]
    for section in sections:
        lines += ["", f"## {section.title}", ""]
        for paragraph in section.text:
            lines += [paragraph, ""]
    return "\n".join(lines).rstrip() + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="runs/report", help="output folder (default runs/report)")
    parser.add_argument("--data", default=None,
                        help="an .npz of MNIST digits for the neural-network parts, the nn study and the privacy "
                             "study's MNIST half (skipped, with a note, without it)")
    parser.add_argument("--quick", action="store_true", help="toy sizes (a smoke test; not the report's numbers)")
    parser.add_argument("--workers", type=int, default=1,
                        help="neural-network runs at a time (one thread each; the numbers do not depend on it)")
    parser.add_argument("--nn-study", default=None, metavar="DIR",
                        help="where the neural-network study keeps its runs (default OUT/nn-study): a folder of an "
                        "earlier `reproduce report` or `reproduce nn-study` with the same sizes is reused, its "
                        "finished runs skipped")
    parser.add_argument("--batch-runs", type=batch_runs_value, default="auto", metavar="auto|K",
                        help=f"{BATCH_RUNS_WHAT}, for the runs of the convex and privacy sections; the report is "
                             f"{BATCH_RUNS_SAME.removeprefix('the results are ')}")


@dataclass(frozen=True)
class ReportOptions:
    """``focusfl reproduce report``'s options."""

    out: str = "runs/report"
    data: str | None = None  # an .npz of MNIST digits for the neural-network part
    quick: bool = False  # toy sizes
    workers: int = 1
    nn_study: str | None = None  # the nn study's folder (None: inside the report)
    batch_runs: int | str = "auto"  # runs stepped together by the convex sections (runs/batch.py)


def run(args: ReportOptions) -> int:
    if args.workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {args.workers}")
    if args.data and not Path(args.data).expanduser().is_file():
        raise ConfigError(f"--data {args.data!r} is not a file")
    if args.data:  # read (size-checked) now: a damaged file is one line before hours of sections
        read_npz_dataset(Path(args.data).expanduser())
    if args.nn_study and not args.data:
        raise ConfigError("--nn-study needs --data (the digits the study runs on)")
    if args.nn_study:
        check_study_folder(args.nn_study)
    torch.set_num_threads(1)  # hundreds of small runs: threads only add synchronisation
    batch_size(args.batch_runs, 1)  # a bad value is one line before anything is written
    sizes = dataclasses.replace(QUICK if args.quick else FULL, batch_runs=args.batch_runs)
    if args.quick:
        print("quick report: toy sizes to test the command; its numbers are not findings", flush=True)
    begin = time.perf_counter()
    with output_folder(args.out) as scratch:
        images = scratch / FIGURES
        images.mkdir(parents=True, exist_ok=True)
        study_folder = Path(args.nn_study) if args.nn_study else scratch / "nn-study"
        sections = []
        for make in (lambda: ridge_section(sizes, images), lambda: exactness_section(sizes),
                     lambda: bias_section(sizes), lambda: fedsum_section(sizes, images),
                     lambda: studies_section(sizes, images), lambda: work_section(sizes, images),
                     lambda: suite_section(sizes, images),
                     lambda: baselines_section(sizes), lambda: privacy_section(sizes.quick, args.data, sizes.batch_runs),
                     lambda: nn_section(args.data, QUICK_STUDY if args.quick else FULL_STUDY, images,
                                        study_folder, args.workers)):
            start = time.perf_counter()
            section = make()
            section.seconds = time.perf_counter() - start
            print(f"{section.title}: {counted(len(section.claims), 'claim')}, {section.seconds:.0f} s", flush=True)
            sections.append(section)
        total = time.perf_counter() - begin
        (scratch / "report.md").write_text(build_report(sections, total, args.data, args.workers, quick=args.quick))
        write_csv(scratch / "summary.csv", claims_rows(sections))
    print(f"\nwrote {Path(args.out) / 'report.md'}{' (a QUICK report: toy sizes)' if args.quick else ''}, summary.csv "
          f"and {FIGURES}/*.png in {total / 60:.1f} minutes")
    return 0


PRESETS = (
    Preset("report", "every claim of the papers that fits a CPU, with computed verdicts (report.md)",
           add_arguments, ReportOptions, run),
)

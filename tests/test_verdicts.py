"""Every verdict of the reproduction report is computed: each claim's criterion, fed numbers on both
sides of it, gives both verdicts (and "inconclusive" where it says the numbers cannot decide); no
claim is given a verdict literal."""
from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest

from focusfl.reproduce import (baselines_study, nn_study, privacy_study, reproduce_report,  # noqa: F401 (they register
                               suite_study)  # their criteria)
from focusfl.reproduce.verdicts import (ANOTHER_AXIS, CRITERIA, INCONCLUSIVE, INCONCLUSIVE_QUICK, NOT_REPRODUCED,
                                        OUTCOMES, REPRODUCED, Claim, Criterion, Verdict, ahead, show)

INF = math.inf
R, N, A, I = REPRODUCED, NOT_REPRODUCED, ANOTHER_AXIS, INCONCLUSIVE
three = lambda *v: list(v)  # noqa: E731  (values over three seeds)

# criterion -> [(numbers, verdict)]: each list crosses its criterion's threshold.
CASES: dict[str, list[tuple[dict, str]]] = {
    "fig4-focus-exact": [
        ({"focus_rounds": [65, 196, 310], "rounds": 500}, R),
        ({"focus_rounds": [65, INF, 310], "rounds": 500}, N),
        ({"focus_rounds": [30, INF, INF], "rounds": 40}, I)],
    "fig4-focus-fastest": [
        ({"focus_rounds": [100, 200], "fastest_other_rounds": [150, 250], "focus_floats": [1, 2],
          "fewest_other_floats": [3, 4], "rounds": 500}, R),
        ({"focus_rounds": [196, 310], "fastest_other_rounds": [179, 284], "focus_floats": [1e5, 2e5],
          "fewest_other_floats": [2e5, 3e5], "rounds": 500}, A),
        ({"focus_rounds": [196, 310], "fastest_other_rounds": [179, 284], "focus_floats": [3e5, 4e5],
          "fewest_other_floats": [2e5, 3e5], "rounds": 500}, N),
        ({"focus_rounds": [INF, INF], "fastest_other_rounds": [INF, INF], "focus_floats": [INF, INF],
          "fewest_other_floats": [INF, INF], "rounds": 40}, I)],
    "fig4-fedavg-fedau-inexact": [
        ({"fedavg_rounds": [INF] * 3, "fedau_rounds": [INF] * 3, "rounds": 500}, R),
        ({"fedavg_rounds": [INF, 300, INF], "fedau_rounds": [INF] * 3, "rounds": 500}, N),
        ({"fedavg_rounds": [INF] * 3, "fedau_rounds": [INF] * 3, "rounds": 40}, I)],
    "fig4-coincide": [
        ({"fedavg_fedau_mifa_coincide": True, "scaffold_proxskip_coincide": True}, R),
        ({"fedavg_fedau_mifa_coincide": True, "scaffold_proxskip_coincide": False}, N)],
    "fig4-scaffold-converges": [
        ({"scaffold_rounds": [60, 180, 284], "rounds": 500}, R),
        ({"scaffold_rounds": [60, INF, 284], "rounds": 500}, N),
        ({"scaffold_rounds": [30, INF, INF], "rounds": 40}, I)],
    "fig4-proxskip-diverges": [
        ({"proxskip_diverged": True, "rounds": 40}, R),
        ({"proxskip_diverged": False, "rounds": 500}, N),
        ({"proxskip_diverged": False, "rounds": 40}, I)],
    "fig4-mifa-diverges": [
        ({"mifa_diverged": True, "rounds": 500}, R),
        ({"mifa_diverged": False, "rounds": 500}, N),
        ({"mifa_diverged": False, "rounds": 40}, I)],
    "fig4-setting": [
        ({"focus_rounds_paper": 250, "scaffold_rounds_paper": 284, "rounds": 500}, R),
        ({"focus_rounds_paper": 310, "scaffold_rounds_paper": 284, "rounds": 500}, N),
        ({"focus_rounds_paper": INF, "scaffold_rounds_paper": INF, "rounds": 40}, I)],
    "table1-focus-exact": [
        ({"focus_exact_cells": 6, "cells": 6}, R), ({"focus_exact_cells": 5, "cells": 6}, N),
        ({"focus_exact_cells": None, "cells": 6}, I)],
    "table1-averaging-inexact": [
        ({"exact_cells_of_averaging_methods": 0}, R), ({"exact_cells_of_averaging_methods": 1}, N),
        ({"exact_cells_of_averaging_methods": None}, I)],
    "table1-focus-markov": [
        ({"focus_markov_rounds": [200, 140]}, R), ({"focus_markov_rounds": [200, INF]}, N),
        ({"focus_markov_rounds": None}, I)],
    "scaffold-fixed-point": [
        ({"gap_at_mean": 4e-16, "gap_off_mean": 5e-3}, R), ({"gap_at_mean": 1e-9, "gap_off_mean": 5e-3}, N),
        ({"gap_at_mean": 4e-16, "gap_off_mean": 1e-8}, N)],
    "focus-faster-than-scaffold": [
        ({"focus_rounds": three(200, 210, 220), "scaffold_rounds": three(260, 270, 280),
          "focus_vectors": three(1, 2, 3), "scaffold_vectors": three(4, 5, 6)}, R),
        ({"focus_rounds": three(300, 310, 320), "scaffold_rounds": three(260, 270, 280),
          "focus_vectors": three(2400, 2480, 2560), "scaffold_vectors": three(4160, 4320, 4480)}, A),
        ({"focus_rounds": three(300, 310, 320), "scaffold_rounds": three(160, 170, 180),
          "focus_vectors": three(2400, 2480, 2560), "scaffold_vectors": three(1000, 1100, 1200)}, N),
        ({"focus_rounds": three(250, 310, 320), "scaffold_rounds": three(260, 270, 330),
          "focus_vectors": three(2000, 2480, 2560), "scaffold_vectors": three(2100, 2200, 2600)}, I),
        ({"focus_rounds": [200, 210], "scaffold_rounds": [260, 270], "focus_vectors": [1, 2],
          "scaffold_vectors": [4, 5]}, I)],
    "bias-theorem3": [
        ({"distance_ratio": 1.004, "distance_ratio_half_step": 1.004, "focus_error": 1e-14,
          "efolds_before_window": 10}, R),
        ({"distance_ratio": 1.05, "distance_ratio_half_step": 1.004, "focus_error": 1e-14,
          "efolds_before_window": 10}, N),
        ({"distance_ratio": 1.004, "distance_ratio_half_step": 1.004, "focus_error": 1e-14,
          "efolds_before_window": 0.3}, I)],
    "bias-old-window": [({"warmup_share": 0.001}, R), ({"warmup_share": 0.082}, N)],
    "fedsum-reductions": [({"largest_difference": 1e-15}, R), ({"largest_difference": 1e-9}, N)],
    "fedsum-delays": [
        ({"cyclic_tau_max": 9, "reshuffled_tau_max": 18, "bernoulli_tau_max": 98}, R),
        ({"cyclic_tau_max": 9, "reshuffled_tau_max": 12, "bernoulli_tau_max": 98}, N),
        ({"cyclic_tau_max": 10, "reshuffled_tau_max": 18, "bernoulli_tau_max": 98}, N)],
    "low-p-focus-converges": [
        ({"p_min": [0.3, 0.01], "focus_rounds": [90, 620], "rounds": 3000}, R),
        ({"p_min": [0.3, 0.01], "focus_rounds": [90, INF], "rounds": 3000}, N),
        ({"p_min": [0.3, 0.03], "focus_rounds": [90, INF], "rounds": 300}, I)],
    "mifa-fedvarp-comparable": [
        ({"scaffold_rounds": 60, "mifa_rounds": 80, "fedvarp_rounds": 70, "focus_rounds": 60, "rounds": 3000}, R),
        ({"scaffold_rounds": 60, "mifa_rounds": INF, "fedvarp_rounds": INF, "focus_rounds": 90, "rounds": 3000}, N),
        ({"scaffold_rounds": INF, "mifa_rounds": INF, "fedvarp_rounds": INF, "focus_rounds": INF, "rounds": 300}, I),
        ({"scaffold_rounds": 200, "mifa_rounds": INF, "fedvarp_rounds": INF, "focus_rounds": 150, "rounds": 300}, I)],
    "long-absences-focus-exact": [
        ({"rho": [0.0, 0.99], "focus_rounds": [100, 5000], "rounds": [3000, 10000], "mean_absence": [5, 500]}, R),
        ({"rho": [0.0, 0.99], "focus_rounds": [100, INF], "rounds": [3000, 10000], "mean_absence": [5, 500]}, N),
        ({"rho": [0.0, 0.99], "focus_rounds": [100, INF], "rounds": [3000, 3000], "mean_absence": [5, 500]}, I)],
    "pushsum-exact": [
        ({"pushsum_rounds": 900, "focus_rounds": 340}, R), ({"pushsum_rounds": INF, "focus_rounds": 340}, N),
        ({"pushsum_rounds": INF, "focus_rounds": INF}, I)],
    "proxskip-exact-only-full": [
        ({"shifted_exact_full": True, "shifted_exact_partial": []}, R),
        ({"shifted_exact_full": True, "shifted_exact_partial": ["uniform (2 of 8)"]}, N),
        ({"shifted_exact_full": False, "shifted_exact_partial": []}, I)],
    "work-focus-exact": [
        ({"focus_exact_cells": 16, "cells": 16, "rounds": 1000}, R),
        ({"focus_exact_cells": 15, "cells": 16, "rounds": 1000}, N),
        ({"focus_exact_cells": 3, "cells": 4, "rounds": 100}, I)],
    "fednova-below-fedavg": [
        ({"fedavg_final": [2.6e-3, 0.1], "fednova_final": [5e-5, 1e-3], "rounds": 1000}, R),
        ({"fedavg_final": [2.6e-3, 0.1], "fednova_final": [5e-3, 1e-3], "rounds": 1000}, N),
        ({"fedavg_final": [2.6e-3, 0.1], "fednova_final": [5e-5, 1e-3], "rounds": 100}, I)],
    "work-fedavg-prediction": [
        ({"cells_within": 6, "memoryless_cells": 6}, R), ({"cells_within": 5, "memoryless_cells": 6}, N),
        ({"cells_within": 0, "memoryless_cells": 0}, I)],
    "figure9-sg-focus-best-mnist": [
        ({"sg_focus": three(0.96, 0.965, 0.97), "fedavg": three(0.93, 0.94, 0.95), "fedau": three(0.92, 0.93, 0.94),
          "scaffold": three(0.90, 0.91, 0.92), "largest_late_change": 0.002}, R),
        ({"sg_focus": three(0.92, 0.921, 0.923), "fedavg": three(0.974, 0.975, 0.976),
          "fedau": three(0.972, 0.972, 0.973), "scaffold": three(0.926, 0.927, 0.927), "largest_late_change": 0.004}, N),
        ({"sg_focus": three(0.96, 0.965, 0.97), "fedavg": three(0.93, 0.94, 0.95), "fedau": three(0.92, 0.93, 0.94),
          "scaffold": three(0.90, 0.91, 0.92), "largest_late_change": 0.05}, I),
        ({"sg_focus": three(0.94, 0.965, 0.97), "fedavg": three(0.93, 0.95, 0.96), "fedau": three(0.92, 0.93, 0.94),
          "scaffold": three(0.90, 0.91, 0.92), "largest_late_change": 0.002}, I)],
    "sg-focus-is-the-authors-loop": [({"max_relative_gap": 3e-14}, R), ({"max_relative_gap": 2.1}, N)],
    "figure9-markov-panel": [({"autocorrelation": 0.3}, R), ({"autocorrelation": 0.0}, N)],
    "gap-driver-minibatch-noise": [
        ({"gap_as_run": three(0.05, 0.06, 0.055), "gap_without": three(0.01, 0.0, 0.02), "rounds": 300}, R),
        ({"gap_as_run": three(0.05, 0.06, 0.055), "gap_without": three(0.05, 0.04, 0.06), "rounds": 300}, N),
        ({"gap_as_run": three(0.05, -0.01, 0.055), "gap_without": three(0.0, 0.0, 0.0), "rounds": 300}, I),
        ({"gap_as_run": three(0.05, 0.06, 0.055), "gap_without": three(0.01, 0.0, 0.02), "rounds": 4}, I)],
    "gap-driver-staleness": [
        ({"gap_as_run": three(0.05, 0.06, 0.055), "gap_without": three(0.01, 0.0, 0.02), "rounds": 300}, R),
        ({"gap_as_run": three(0.05, 0.06, 0.055), "gap_without": three(0.05, 0.04, 0.06), "rounds": 300}, N),
        ({"gap_as_run": three(0.05, 0.06, 0.055), "gap_without": three(0.01, 0.05, 0.02), "rounds": 300}, I)],
    "gap-driver-rare-clients": [
        ({"gap_as_run": three(0.05, 0.06, 0.055), "gap_without": three(0.01, 0.0, 0.02), "rounds": 300}, R),
        ({"gap_as_run": three(0.05, 0.06, 0.055), "gap_without": three(0.05, 0.04, 0.06), "rounds": 300}, N),
        ({"gap_as_run": [0.05, 0.06], "gap_without": [0.0, 0.0], "rounds": 300}, I)],
    "gap-driver-step": [
        ({"sg_focus_bounded": True, "sg_focus_effective_step": 0.05, "fedavg_effective_step": 0.75, "rounds": 200}, R),
        ({"sg_focus_bounded": False, "sg_focus_effective_step": 0.05, "fedavg_effective_step": 0.75, "rounds": 200}, N),
        ({"sg_focus_bounded": True, "sg_focus_effective_step": 0.9, "fedavg_effective_step": 0.75, "rounds": 200}, N),
        ({"sg_focus_bounded": True, "sg_focus_effective_step": 0.05, "fedavg_effective_step": 0.75, "rounds": 2}, I)],
    "gap-driver-non-iid": [
        ({"gap_smallest_alpha": three(0.05, 0.06, 0.07), "gap_largest_alpha": three(0.0, 0.01, 0.02), "rounds": 2000}, R),
        ({"gap_smallest_alpha": three(0.0, 0.01, 0.02), "gap_largest_alpha": three(0.05, 0.06, 0.07), "rounds": 2000}, N),
        ({"gap_smallest_alpha": three(0.0, 0.06, 0.02), "gap_largest_alpha": three(0.05, 0.01, 0.07), "rounds": 2000}, I)],
    "gap-driver-horizon": [
        ({"gap_as_run": three(0.1, 0.12, 0.11), "gap_without": three(0.01, 0.02, 0.0), "rounds": 100}, R),
        ({"gap_as_run": three(0.1, 0.12, 0.11), "gap_without": three(0.09, 0.1, 0.08), "rounds": 100}, N),
        ({"gap_as_run": three(0.1, 0.12, 0.11), "gap_without": three(0.01, 0.02, 0.0), "rounds": 2}, I)],
    "suite-exact-everywhere": [
        ({"runs": 20, "runs_reaching_1e-8": 20, "rounds": 150}, R), ({"runs": 20, "runs_reaching_1e-8": 19, "rounds": 1000}, N),
        ({"runs": 20, "runs_reaching_1e-8": 19, "rounds": 150}, I)],
    "suite-plateau-everywhere": [
        ({"runs": 36, "runs_reaching_1e-8": 0, "rounds": 1000}, R), ({"runs": 36, "runs_reaching_1e-8": 1, "rounds": 150}, N),
        ({"runs": 36, "runs_reaching_1e-8": 0, "rounds": 150}, I)],
    "suite-faster": [
        ({"candidate_rounds": 80, "baseline_rounds": 110, "step_at_grid_edge": False}, R),
        ({"candidate_rounds": 110, "baseline_rounds": 110, "step_at_grid_edge": False}, N),
        ({"candidate_rounds": None, "baseline_rounds": 110, "step_at_grid_edge": False}, I),
        ({"candidate_rounds": 80, "baseline_rounds": 110, "step_at_grid_edge": True}, I)],
    "suite-lower-plateau": [
        ({"processes": 3, "processes_below": 3, "step_at_grid_edge": False}, R),
        ({"processes": 3, "processes_below": 0, "step_at_grid_edge": False}, N),
        ({"processes": 3, "processes_below": 1, "step_at_grid_edge": False}, I),
        ({"processes": 3, "processes_below": 3, "step_at_grid_edge": True}, I)],
    "suite-between-ends": [
        ({"processes": 4, "processes_at_least_as_good": 2, "step_at_grid_edge": False}, R),
        ({"processes": 4, "processes_at_least_as_good": 0, "step_at_grid_edge": False}, N),
        ({"processes": 4, "processes_at_least_as_good": 1, "step_at_grid_edge": False}, I),
        ({"processes": 4, "processes_at_least_as_good": 4, "step_at_grid_edge": True}, I)],
    "amplified-fedavg-lower-error": [
        ({"amplified_final": three(9e-6, 6e-6, 2e-5), "plain_final": three(5e-5, 3e-5, 8e-5), "step_at_grid_edge": False}, R),
        ({"amplified_final": three(5e-5, 3e-5, 8e-5), "plain_final": three(9e-6, 6e-6, 2e-5), "step_at_grid_edge": False}, N),
        ({"amplified_final": three(9e-6, 4e-5, 2e-5), "plain_final": three(5e-5, 3e-5, 8e-5), "step_at_grid_edge": False}, I),
        ({"amplified_final": [9e-6], "plain_final": [5e-5], "step_at_grid_edge": False}, I),
        ({"amplified_final": three(9e-6, 6e-6, 2e-5), "plain_final": three(5e-5, 3e-5, 8e-5), "step_at_grid_edge": True}, I)],
    **{name: [
        ({"candidate_rounds": three(430, 360, 360), "fedavg_rounds": [INF] * 3, "rounds": 1000}, R),
        ({"candidate_rounds": three(430, INF, 360), "fedavg_rounds": [INF] * 3, "rounds": 1000}, N),
        ({"candidate_rounds": three(430, 360, 360), "fedavg_rounds": three(INF, 800, INF), "rounds": 1000}, N),
        ({"candidate_rounds": [INF] * 3, "fedavg_rounds": [INF] * 3, "rounds": 100}, I),
        ({"candidate_rounds": [60], "fedavg_rounds": [INF], "rounds": 100}, I)]
       for name in ("feddyn-exact-partial", "fedlaavg-unbiased-intermittent")},
    "privacy-exact-ahead": [
        ({"exact_bernoulli": three(0.1, 0.2, 0.15), "fedavg_bernoulli": three(0.3, 0.4, 0.5),
          "exact_markov": three(0.2, 0.1, 0.1), "fedavg_markov": three(0.6, 0.5, 0.7)}, R),
        ({"exact_bernoulli": three(0.6, 0.7, 0.65), "fedavg_bernoulli": three(0.3, 0.4, 0.5),
          "exact_markov": three(0.2, 0.1, 0.1), "fedavg_markov": three(0.6, 0.5, 0.7)}, N),
        ({"exact_bernoulli": three(0.1, 0.45, 0.15), "fedavg_bernoulli": three(0.3, 0.4, 0.5),
          "exact_markov": three(0.2, 0.1, 0.1), "fedavg_markov": three(0.6, 0.5, 0.7)}, I)],
    "privacy-audit-within-accounted": [
        ({"accounted": 2.79, "audited": 1.71}, R),
        ({"accounted": 1.39, "audited": 1.71}, N),  # an accountant that halved epsilon
        ({"accounted": 2.79, "audited": INF}, I)],
    "privacy-exact-ahead-accuracy": [  # test accuracies: higher is better
        ({"exact_bernoulli": three(0.8, 0.85, 0.82), "fedavg_bernoulli": three(0.6, 0.7, 0.65),
          "exact_markov": three(0.7, 0.75, 0.72), "fedavg_markov": three(0.5, 0.6, 0.55)}, R),
        ({"exact_bernoulli": three(0.8, 0.85, 0.82), "fedavg_bernoulli": three(0.6, 0.7, 0.65),
          "exact_markov": three(0.3, 0.35, 0.32), "fedavg_markov": three(0.5, 0.6, 0.55)}, N),
        ({"exact_bernoulli": three(0.8, 0.65, 0.82), "fedavg_bernoulli": three(0.6, 0.7, 0.65),
          "exact_markov": three(0.7, 0.75, 0.72), "fedavg_markov": three(0.5, 0.6, 0.55)}, I),
        ({"exact_bernoulli": [0.8], "fedavg_bernoulli": [0.6], "exact_markov": [0.7], "fedavg_markov": [0.5]}, I)],
}


def test_every_criterion_of_the_report_has_flip_cases():
    assert set(CASES) == set(CRITERIA), "a claim's criterion needs numbers on both sides of it in CASES"


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_criterion_flips_with_its_numbers(name):
    criterion = CRITERIA[name]
    outcomes = set()
    for values, expected in CASES[name]:
        verdict = criterion.judge(values)
        assert verdict.outcome == expected, (name, values)
        outcomes.add(verdict.outcome)
        assert criterion.judge(values, quick=True).outcome == (INCONCLUSIVE_QUICK if expected == I else expected)
        assert verdict.criterion == criterion.statement and set(verdict.values) == set(criterion.names)
    assert REPRODUCED in outcomes and NOT_REPRODUCED in outcomes  # the verdict flips across the criterion


def _claim_calls(path: Path) -> list[ast.Call]:
    tree = ast.parse(path.read_text())
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)
            and getattr(node.func, "id", getattr(node.func, "attr", None)) == "Claim"]


def _verdict_argument(call: ast.Call) -> ast.expr:
    keyword = [k.value for k in call.keywords if k.arg == "verdict"]
    return keyword[0] if keyword else call.args[5]


EXPERIMENTS = Path(reproduce_report.__file__).parent


def test_no_claim_is_given_a_verdict_literal():
    calls = {path.name: _claim_calls(path) for path in EXPERIMENTS.glob("*.py")}
    assert sum(len(found) for found in calls.values()) >= 25
    for name, found in calls.items():
        for call in found:
            argument = _verdict_argument(call)
            where = f"{name}:{call.lineno}"
            # The verdict is a criterion's judgement of numbers: CRITERION.judge({...}).
            assert isinstance(argument, ast.Call) and getattr(argument.func, "attr", None) == "judge", where
            strings = [n for n in ast.walk(argument) if isinstance(n, ast.Constant) and n.value in OUTCOMES]
            assert not strings, f"{where}: an outcome spelled out in the verdict argument"


def test_no_verdict_is_built_outside_a_criterion():
    # A Verdict made by hand could carry any outcome: only Criterion.judge makes them.
    for path in EXPERIMENTS.glob("*.py"):
        if path.name == "verdicts.py":
            continue
        built = [node.lineno for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Call)
                 and getattr(node.func, "id", getattr(node.func, "attr", None)) == "Verdict"]
        assert not built, f"{path.name}: Verdict(...) at lines {built}"


def test_the_literal_check_catches_a_literal():
    source = 'Claim("p", "w", "c", "r", "n", "reproduced")\nClaim("p", "w", "c", "r", "n", verdict=X if ok else "no")'
    for call in [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call)]:
        argument = _verdict_argument(call)
        assert not (isinstance(argument, ast.Call) and getattr(argument.func, "attr", None) == "judge")


def test_a_claim_refuses_a_verdict_it_was_not_given_by_a_criterion():
    with pytest.raises(TypeError, match="computed by a Criterion"):
        Claim("paper", "where", "claim", "ran", "number", "reproduced")
    assert isinstance(CRITERIA["fedsum-reductions"].judge({"largest_difference": 0.0}), Verdict)


def test_a_criterion_says_which_numbers_it_misses():
    from focusfl.errors import FocusflError

    with pytest.raises(FocusflError, match="largest_difference"):
        CRITERIA["fedsum-reductions"].judge({})


def test_separated_spreads_over_three_seeds_or_none():
    assert ahead([3, 4, 5], [0, 1, 2]) is True and ahead([0, 1, 2], [3, 4, 5]) is False
    assert ahead([0, 3, 5], [1, 2, 4]) is None  # overlapping spreads
    assert ahead([3, 4], [0, 1]) is None  # two seeds do not separate
    assert ahead([INF, INF, INF], [1, 2, 3]) is True and ahead([math.nan, 4, 5], [0, 1, 2]) is None


def test_numbers_never_print_as_python_none():
    assert show(None) == "—" and show(math.nan) == "—" and show(INF) == "∞" and show([1, None]) == "1/—"
    verdict = Criterion("test-only-show", "x below 1", ("x",), lambda v: None).judge({"x": None})
    assert "None" not in verdict.markdown() and verdict.outcome == INCONCLUSIVE
    del CRITERIA["test-only-show"]

"""The report section "The suite under one roof" (reproduce/suite_study.py): its verdicts are
computed from the numbers and flip when fed the opposite ones; its tuning is `focusfl tune`'s
rule over seeds; its imported trace is a FedScale-format file through the import command's code.
(`focusfl reproduce report --quick`, which runs the section, is tests/test_report.py's.)"""
from __future__ import annotations

import math

from focusfl.reproduce import suite_study
from focusfl.reproduce.suite_study import (
    ALGORITHMS, CYCLIC, EXACT, FEDSTALE_ENDS, PLATEAU, PROCESSES, Verdict, between_ends_verdict, claims,
    exact_everywhere_verdict, faster_verdict, lower_plateau_verdict, plateau_everywhere_verdict,
)
from focusfl.sweeps.tune import TuneSearch, lr_grid, setup as tune_setup, tune
from focusfl.io.atomic import read_csv


# -- the verdict functions, each flipped ------------------------------------------------------------
def test_exact_and_plateau_verdicts_flip():
    assert exact_everywhere_verdict({"focus / a": 100, "focus / b": 250.5}).outcome == "reproduced"
    assert exact_everywhere_verdict({"focus / a": 100, "focus / b": None}).outcome == "not reproduced"
    assert plateau_everywhere_verdict({"fedavg / a": 1e-3, "mifa / b": 2e-4}).outcome == "reproduced"
    assert plateau_everywhere_verdict({"fedavg / a": 1e-3, "mifa / b": 1e-9}).outcome == "not reproduced"


def test_faster_verdict_flips_and_is_inconclusive_without_both_numbers_or_at_the_edge():
    assert faster_verdict(80, 110, edge=False).outcome == "reproduced"
    assert faster_verdict(110, 80, edge=False).outcome == "not reproduced"
    assert faster_verdict(110, 110, edge=False).outcome == "not reproduced"
    assert faster_verdict(None, 80, edge=False).outcome == "inconclusive"
    assert faster_verdict(80, None, edge=False).outcome == "inconclusive"
    assert faster_verdict(80, 110, edge=True).outcome == "inconclusive"


def test_lower_plateau_verdict_flips():
    assert lower_plateau_verdict({"a": 0.5, "b": 0.9}, edge=False).outcome == "reproduced"
    assert lower_plateau_verdict({"a": 2.0, "b": 1.1}, edge=False).outcome == "not reproduced"
    assert lower_plateau_verdict({"a": 0.5, "b": 1.1}, edge=False).outcome == "inconclusive"
    assert lower_plateau_verdict({"a": 0.5, "b": 0.9}, edge=True).outcome == "inconclusive"


def test_between_ends_verdict_flips():
    ends = {"a": 1e-3, "b": 1e-3, "c": 1e-3}
    assert between_ends_verdict({"a": 5e-4, "b": 1.005e-3, "c": 2e-3}, ends, edge=False).outcome == "reproduced"
    assert between_ends_verdict({"a": 2e-3, "b": 3e-3, "c": 2e-3}, ends, edge=False).outcome == "not reproduced"
    assert between_ends_verdict({"a": 5e-4, "b": 3e-3, "c": 2e-3}, ends, edge=False).outcome == "inconclusive"
    assert between_ends_verdict({"a": 5e-4, "b": 5e-4, "c": 5e-4}, ends, edge=True).outcome == "inconclusive"


def test_every_verdict_states_its_criterion():
    for verdict in (exact_everywhere_verdict({}), plateau_everywhere_verdict({}), faster_verdict(1, 2, False),
                    lower_plateau_verdict({"a": 1.0}, False), between_ends_verdict({"a": 1.0}, {"a": 1.0}, False)):
        assert isinstance(verdict, Verdict) and verdict.criterion.startswith("reproduced if")


# -- the claims over a whole table, and over the opposite table --------------------------------------
def _row(algorithm, process):
    return {"algorithm": algorithm, "process": process, "lr": 1e-2, "rounds_to_target": None, "final": 1e-3,
            "diverged": False, "curve": [(0, 1.0)], "edge": False}


def _table(flip: bool) -> list[dict]:
    """A table in which every claim holds (``flip``: every claim fails)."""
    rows = []
    for process in PROCESSES:
        for algorithm in ALGORITHMS:
            row = _row(algorithm, process)
            if algorithm in EXACT or algorithm == "amplified_scaffold":
                row.update(rounds_to_target=None if flip else 100, final=1e-3 if flip else 1e-13)
            if algorithm in PLATEAU and flip:
                row.update(rounds_to_target=300, final=1e-12)
            if algorithm == "amplified_scaffold" and process == CYCLIC:
                row.update(rounds_to_target=None if flip else 80, final=1e-3 if flip else 1e-13)
            if algorithm == "scaffold" and process == CYCLIC and flip:
                row.update(rounds_to_target=60, final=1e-13)
            if algorithm == "fedstale":
                row["final"] = 1e-11 if flip else 5e-4
            if algorithm in FEDSTALE_ENDS:
                row["final"] = 1e-12 if flip else 1e-3
            if algorithm in ("fedpbc", "debiasing_fedavg"):
                row["final"] = 1e-11 if flip else 5e-4
            if algorithm == "fedavg":
                row["final"] = 1e-12 if flip else 1e-3
            rows.append(row)
    return rows


def test_claims_are_reproduced_on_a_table_where_they_hold_and_flip_on_the_opposite_one():
    holding = claims(_table(flip=False))
    assert [c["verdict"] for c in holding] == ["reproduced"] * len(holding) and len(holding) == 7
    opposite = claims(_table(flip=True))
    assert [c["verdict"] for c in opposite] == ["not reproduced", "not reproduced", "not reproduced",
                                                "inconclusive", "not reproduced", "not reproduced", "not reproduced"]
    # The faster claim needs both rounds; with the baseline slower it flips from reproduced.
    slower = [dict(r) for r in _table(flip=False)]
    for row in slower:
        if row["algorithm"] == "amplified_scaffold" and row["process"] == CYCLIC:
            row["rounds_to_target"] = 200
    assert claims(slower)[3]["verdict"] == "not reproduced"
    for claim in holding:  # the criterion is stated beside the verdict
        assert claim["reason"].startswith("reproduced if")


def test_a_tuned_step_at_the_grids_edge_makes_a_comparison_inconclusive():
    rows = _table(flip=False)
    for row in rows:
        if row["algorithm"] == "fedavg":
            row["edge"] = True
    verdicts = [c["verdict"] for c in claims(rows)]
    assert verdicts[-2:] == ["inconclusive", "inconclusive"] and verdicts[:5] == ["reproduced"] * 5


# -- tuning and the runs --------------------------------------------------------------------------
def test_tuning_over_seeds_picks_what_focusfl_tune_picks(tmp_path):
    grid = lr_grid(1e-3, 1e-2, 3)
    setup = tune_setup(problem="ridge:dim=4,clients=4,samples=10", participation="bernoulli:p=0.3;0.5;0.7;0.9",
                       rounds=60, local_steps=2, target=1e-8, eval_every=10)
    for algorithm in ("focus", "fedavg"):
        assert tune(setup, TuneSearch(algorithms=(algorithm,), lr_min=grid[0], lr_max=grid[-1], points=3, seeds=2,
                                      out=str(tmp_path / algorithm))) == 0
        best = read_csv(tmp_path / algorithm / "summary.csv")[0]
        mine = suite_study.tuned_cell(algorithm, setup, grid, seeds=2)
        assert float(best["lr"]) == mine["lr"]
        assert math.isclose(float(best["final"]), mine["final"], rel_tol=1e-9)
        assert not mine["edge"] and not mine["lr_reason"].startswith(("the largest", "the smallest"))


def test_the_synthetic_fedscale_file_imports_to_every_device(tmp_path):
    spec, lines = suite_study.import_synthetic_trace(tmp_path, rounds=200)
    assert spec.startswith("trace:path=") and (tmp_path / "fedscale_behaviour.pkl").is_file()
    assert lines[1] == "200 rounds x 8 clients" and not any(line.startswith("dropped") for line in lines)
    assert suite_study.synthetic_fedscale() == suite_study.synthetic_fedscale()  # seeded: every machine's


def test_a_small_study_runs_every_cell_and_keeps_curves(tmp_path):
    sizes = suite_study.SuiteSizes(rounds=40, seeds=1, grid_every=4, eval_every=10)
    rows = suite_study.run_study(sizes, {"cyclic": "cyclic:groups=4"}, ("scaffold", "amplified_scaffold", "fedavg"))
    assert [r["algorithm"] for r in rows] == ["scaffold", "amplified_scaffold", "fedavg"]
    for row in rows:
        assert row["curve"][-1][0] == 40 and row["lr"] > 0 and row["lr_reason"]
    table = suite_study.exactness_table(rows)
    assert table.count("\n") == 4 and "| cyclic |" in table
    suite_study.plot_curves(rows, tmp_path / "suite.png", 40)
    assert (tmp_path / "suite.png").stat().st_size > 0

"""The exactness table (docs/algorithms.md), asserted cell by cell.

Every cell of focusfl.reproduce.exactness.TABLE is rerun with its tuned constant step size:
a cell marked exact must reach rel_error <= 1e-10 within the round budget and stay there; a
plateau cell must stay above a tenth of its recorded plateau over the whole second half of
the run (outside SLOW the smallest recorded plateau, 1.4e-5, is five orders of magnitude above
1e-10).
"""
from pathlib import Path

import pytest

from focusfl.reproduce import exactness
from focusfl.runs.config import RunConfig
from focusfl.runs.driver import build, execute

DOCS = Path(__file__).resolve().parents[1] / "docs" / "algorithms.md"
CELLS = sorted(exactness.TABLE.items())


def test_table_covers_every_cell_with_margins():
    keys = {(a, p, q) for a in exactness.ALGORITHMS for p in exactness.PROBLEMS for q in exactness.PROCESSES}
    assert set(exactness.TABLE) == keys
    for key, (lr, outcome) in exactness.TABLE.items():
        if key[0] in exactness.SLOW:
            continue  # near the budget or still falling at its end: asserted as recorded below
        if isinstance(outcome, int):
            assert outcome <= exactness.ROUNDS // 2, key  # exact cells get there with room to spare
        else:
            assert outcome >= 1e-5, key  # plateau cells sit far above the 1e-10 target


@pytest.mark.parametrize("key,entry", CELLS, ids=["-".join(key) for key, _ in CELLS])
def test_cell_outcome(key, entry):
    lr, outcome = entry
    row = exactness.run_cell(*key, lr)
    assert row["diverged_at"] is None
    if isinstance(outcome, int):
        assert row["first_round_below_target"] is not None, f"{key} no longer converges exactly"
        assert row["final"] <= exactness.TARGET
    else:
        assert row["first_round_below_target"] is None
        assert row["plateau"] >= outcome / 10, f"{key} now goes below its plateau {outcome:g}"


def test_every_registered_algorithm_is_in_the_table():
    from focusfl.algorithms import ALGORITHMS

    assert sorted(set(ALGORITHMS) - set(exactness.ALGORITHMS)) == [], "left out of the exactness table"
    assert set(exactness.ALGORITHMS) <= set(ALGORITHMS)


def test_documented_table_is_the_stored_one():
    assert exactness.format_markdown(exactness.TABLE) in DOCS.read_text()


def test_the_exact_methods_are_exactly_the_drift_and_participation_corrected_ones():
    exact = {a for (a, _, _), (_, outcome) in exactness.TABLE.items() if isinstance(outcome, int)}
    never = {a for a in exactness.ALGORITHMS if all(
        not isinstance(exactness.TABLE[(a, p, q)][1], int) for p in exactness.PROBLEMS for q in exactness.PROCESSES
    )}
    assert exact == {"focus", "sg_focus", "fedsum_b", "fedsum", "fedsum_cr", "scaffold", "amplified_scaffold",
                     "pushsum_tracking"}
    assert never == set(exactness.ALGORITHMS) - exact


@pytest.mark.parametrize("name", ["mifa", "fedvarp"])
def test_table_methods_are_exact_with_one_local_step(name):
    """MIFA's and FedVARP's plateau is client drift, not participation: with tau = 1 their
    tables hold plain gradients (SAG / SAGA) and they converge exactly."""
    config = RunConfig(
        algorithm=name, problem=exactness.PROBLEMS["ridge"], participation=exactness.PROCESSES["bernoulli"],
        rounds=400, local_steps=1, lr=3e-3, eval_every=400,
    )
    assert execute(build(config)).rows[-1]["rel_error"] <= exactness.TARGET

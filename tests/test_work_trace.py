"""The ``trace`` work process (``trace:path=PATH``): recorded step counts, the form of a
federation's work.csv. Its format, its one-line errors, its size and SHA-256 checks, and the
property a federation's replay rests on: a client given tau steps through a trace computes the
same bits as a client given no step count (FedAvg, FedNova, FOCUS, SCAFFOLD)."""
from __future__ import annotations

import pytest
import torch

from cli_harness import run_cli
from focusfl.algorithms import make_algorithm
from focusfl.engine import simulate
from focusfl.errors import ConfigError, DataError
from focusfl.participation import make_participation
from focusfl.problems import make_problem
from focusfl.work import make_work
from focusfl.work import trace as work_trace

PARTIAL = ["fedavg", "fednova", "focus", "scaffold"]  # the algorithms that honour per-client step counts


def assert_same(a, b):
    for name, x, y in zip(a._fields, a, b):
        assert x.dtype == y.dtype and x.shape == y.shape, name
        assert torch.equal(x, y), f"{name} differs by {float((x - y).abs().max())}"


@pytest.mark.parametrize("name", PARTIAL)
def test_steps_equal_to_tau_compute_what_no_step_counts_compute(name):
    """A federation runs uncut clients without step counts and its replay gives them tau through
    the trace: the two must be the same bits (FedAvg, FedNova, FOCUS, SCAFFOLD; the loop with a
    mask and the plain loop)."""
    for spec in ("ridge:clients=4,dim=5", "logistic:clients=4,dim=5,batch=3"):
        problem = make_problem(spec, dtype=torch.float64)
        algorithm = make_algorithm({"name": name, "lr": 0.01, "local_steps": 4})
        runs = [simulate(algorithm, problem, make_participation("bernoulli", 4), rounds=8, seed=1, engine=engine,
                         work=work).state.server
                for engine in ("reference", "vectorized") for work in (None, make_work("rates:r=1", 4, 4))]
        for other in runs[1:]:
            assert_same(runs[0], other)


def write(tmp_path, text, name="w.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_trace_replays_its_rows_and_records_path_and_sha256(tmp_path):
    path = write(tmp_path, "round,client,steps\n0,0,3\n0,1,1\n\n1,1,2\n")
    process = make_work(f"trace:path={path}", 2, 3)
    assert process.steps(0, torch.tensor([0, 1])).tolist() == [3, 1]
    assert process.steps(1, torch.tensor([1])).tolist() == [2]
    described = process.describe()
    assert described["path"] == str(path.resolve()) and len(described["sha256"]) == 64
    assert make_work(described, 2, 3).steps(0, torch.tensor([1])).tolist() == [1]
    assert work_trace.trace_record(path, path.read_text()) == described
    with pytest.raises(DataError, match="no row for round 1, client 0"):
        process.steps(1, torch.tensor([0, 1]))
    with pytest.raises(DataError, match="no row for round 7, client 1"):
        process.steps(7, torch.tensor([1]))
    path.write_text("round,client,steps\n0,0,2\n0,1,1\n1,1,2\n")  # edited after it was recorded
    with pytest.raises(DataError, match="has changed since it was recorded"):
        make_work(described, 2, 3)


@pytest.mark.parametrize("text, why", [
    ("", "is empty"),
    ("r,c,s\n0,0,1\n", "expected the header round,client,steps"),
    ("round,client,steps\n", "no rows"),
    ("round,client,steps\n0,0\n", "line 2: expected round,client,steps"),
    ("round,client,steps\n0,0,1\n0,x,1\n", "line 3: round, client and steps must be integers"),
    ("round,client,steps\n0,0,0\n", "line 2: steps=0 must be at least 1"),
    ("round,client,steps\n-1,0,1\n", "must be >= 0"),
    ("round,client,steps\n0,0,1\n0,0,2\n", "line 3: round 0, client 0 is given twice"),
    ("round,client,steps\n0,0,4\n", "took 4 steps, more than local_steps=3"),
    ("round,client,steps\n0,5,1\n", "names client 5, but the problem has 2 clients"),
    ("round,client,steps\n1000000000000,1,1\n", None),  # sparse: a huge round number allocates nothing
])
def test_trace_errors_are_one_line(tmp_path, text, why):
    path = write(tmp_path, text)
    if why is None:
        assert make_work(f"trace:path={path}", 2, 3).steps(10**12, torch.tensor([1])).tolist() == [1]
        return
    with pytest.raises((DataError, ConfigError), match=why) as caught:
        make_work(f"trace:path={path}", 2, 3)
    assert "\n" not in str(caught.value)


def test_trace_size_is_checked_before_reading(tmp_path, monkeypatch):
    path = write(tmp_path, "round,client,steps\n" + "0,0,1\n" * 20)
    monkeypatch.setattr(work_trace, "MAX_CSV_BYTES", 64)
    with pytest.raises(DataError, match="more than the 64 B read as text"):
        make_work(f"trace:path={path}", 2, 3)
    with pytest.raises(ConfigError, match="needs path=PATH"):
        make_work("trace", 2, 3)
    with pytest.raises(DataError, match="not found"):
        make_work(f"trace:path={tmp_path / 'none.csv'}", 2, 3)


def test_run_with_a_bad_work_trace_says_one_line_and_writes_nothing(tmp_path):
    path = write(tmp_path, "round,client,steps\n0,0,9\n")
    result = run_cli("run", "--algorithm", "fedavg", "--problem", "ridge:clients=2,dim=3", "--local-steps", "2",
                     "--work", f"trace:path={path}", "--rounds", "2", "--out", str(tmp_path / "out"))
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().count("\n") == 0 and "more than local_steps=2" in result.stderr
    assert not (tmp_path / "out").exists()

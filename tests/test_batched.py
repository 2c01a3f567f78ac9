"""Runs as a batch dimension (engine/batched.py, runs/batch.py): a batch of runs computes each
run's rows as the run alone does, byte for byte in float64 on a CPU; a diverging run stops
alone; a batched sweep writes the files an unbatched one writes, and replays."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from cli_harness import assert_one_line_error, run_cli
from focusfl.algorithms import ALGORITHMS, make_algorithm
from focusfl.engine import simulate
from focusfl.engine.batched import STACKED, BatchMember, RunBatch
from focusfl.participation import make_participation
from focusfl.problems import make_problem
from focusfl.runs.batch import AUTO_MAX
from focusfl.work import make_work

CLIENTS, ROUNDS, STEPS = 8, 12, 3


def _runs(name: str):
    """Five runs of ``name`` that differ in seed, lr, step-size schedule, participation, work and a
    hyperparameter (server_lr where the algorithm has one) and evaluation cadence; the first four
    share their client round (the third and fourth with step sizes of their own)."""
    base = make_algorithm(name, lr=0.01, local_steps=STEPS)
    other = {"server_lr": 0.5} if "server_lr" in base.hyperparameters() else {"lr": 0.02}
    algorithms = [base, base, make_algorithm(name, lr=0.013, local_steps=STEPS),
                  make_algorithm(name, lr=0.007, local_steps=STEPS),
                  make_algorithm(name, **{"lr": 0.01, "local_steps": STEPS, **other})]
    participation = ["full", "bernoulli:p=0.5", "cyclic", "full", "bernoulli:p=0.3"]
    schedules = ["constant", "constant", "constant", "sqrt", "constant"]
    work = "uniform" if ALGORITHMS[name].partial_work else "fixed"
    return [dict(algorithm=a, participation=q, seed=seed, eval_every=1 + seed % 3, work=work, schedule=schedule)
            for seed, (a, q, schedule) in enumerate(zip(algorithms, participation, schedules))]


def _alone(problem, run: dict, rounds: int = ROUNDS) -> list[dict]:
    return simulate(run["algorithm"], problem, make_participation(run["participation"], CLIENTS, seed=run["seed"]),
                    rounds, seed=run["seed"], eval_every=run["eval_every"], schedule=run["schedule"],
                    work=make_work(run["work"], CLIENTS, STEPS, seed=run["seed"])).rows


def _batched(problem, runs: list[dict], rounds: int = ROUNDS) -> list[list[dict]]:
    members = [BatchMember(run["algorithm"], make_participation(run["participation"], CLIENTS, seed=run["seed"]),
                           rounds, seed=run["seed"], eval_every=run["eval_every"], schedule=run["schedule"],
                           work=make_work(run["work"], CLIENTS, STEPS, seed=run["seed"])) for run in runs]
    return [result.rows for result in RunBatch(problem, members).run()]


@pytest.mark.parametrize("spec", ["ridge:clients=8,dim=6,samples=5,hetero=0.5",
                                  "ridge:clients=8,dim=6,samples=5,hetero=0.5,batch=2",
                                  "logistic:clients=8,dim=5,samples=7"])
@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_a_batch_of_runs_equals_each_run_alone(spec, name):
    problem = make_problem(spec, dtype=torch.float64, device="cpu")
    runs = _runs(name)
    for rows, run in zip(_batched(problem, runs), runs):
        assert rows == _alone(problem, run)


@pytest.mark.parametrize("spec", ["ridge:clients=8,dim=6,samples=5,hetero=0.5", "logistic:clients=8,dim=5,samples=7"])
@pytest.mark.parametrize("name", ["focus", "scaffold", "fedavg"])
def test_runs_that_all_ask_every_client_equal_each_run_alone(spec, name):
    """Full participation in every run: exact gradients served run by run from the client tables
    as they are (no stacked copy), each row as alone."""
    problem = make_problem(spec, dtype=torch.float64, device="cpu")
    runs = [dict(run, participation="full", work="fixed") for run in _runs(name)]
    for rows, run in zip(_batched(problem, runs), runs):
        assert rows == _alone(problem, run)


def test_stacked_runs_share_one_client_round(monkeypatch):
    """The runs of one algorithm up to its step size are collected in ONE client round (the batch
    is not a loop over runs in disguise), whatever their step sizes and schedules."""
    import focusfl.engine.batched as batched

    calls = []
    original = batched.stacked_collect
    monkeypatch.setattr(batched, "stacked_collect", lambda problem, opened: calls.append(len(opened))
                        or original(problem, opened))
    problem = make_problem("ridge:clients=8,dim=6,samples=5", dtype=torch.float64, device="cpu")
    _batched(problem, _runs("focus"))
    assert calls == [5] * ROUNDS and "focus" in STACKED  # focus's fifth run differs in lr only


def test_an_mlp_in_float64_batched_equals_each_run_alone(tmp_path):
    rng = np.random.default_rng(0)
    data = tmp_path / "toy.npz"
    np.savez(data, images=rng.integers(0, 255, size=(240, 8, 8)).astype(np.uint8), labels=rng.integers(0, 10, 240))
    problem = make_problem(f"nn:data={data},test_fraction=0.2,clients={CLIENTS},batch=8,model=mlp",
                           dtype=torch.float64)
    runs = _runs("sg_focus")[:3] + [dict(_runs("sg_focus")[3], algorithm=make_algorithm("sg_focus", lr=0.05,
                                                                                           local_steps=STEPS))]
    for rows, run in zip(_batched(problem, runs, rounds=4), runs):
        assert rows == _alone(problem, run, rounds=4)
        assert "train_loss" in rows[-1]


def test_a_diverging_run_stops_alone_with_the_row_it_has_alone():
    problem = make_problem("ridge:clients=8,dim=6,samples=5", dtype=torch.float64, device="cpu")
    runs = _runs("focus")
    runs[1] = dict(runs[1], algorithm=make_algorithm("focus", lr=5.0, local_steps=STEPS))
    batched = _batched(problem, runs, rounds=40)
    alone = [_alone(problem, run, rounds=40) for run in runs]
    assert batched == alone
    assert alone[1][-1].get("diverged") and alone[1][-1]["round"] < 40
    assert all(rows[-1]["round"] == 40 and not rows[-1].get("diverged") for k, rows in enumerate(alone) if k != 1)


# -- through the command line ---------------------------------------------------------------------
GRID = """
name = "batch"
algorithms = [{name = "focus", lr = [0.002, 0.004]}, {name = "fedavg", lr = 0.01}]
problems = ["ridge:clients=8,dim=6,samples=5"]
participation = ["full", "bernoulli:p=0.5"]
seeds = 3
rounds = 15
"""


def _files(folder):
    """Every file of a sweep folder (config.json without its batch size) by path."""
    files = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not path.name.startswith("."):
            data = path.read_bytes()
            if path.name == "config.json" and "runs" in path.parts:
                record = json.loads(data)
                record.pop("batch_runs")
                data = json.dumps(record, sort_keys=True).encode()
            files[str(path.relative_to(folder))] = data
    return files


def test_a_batched_sweep_writes_the_files_of_one_run_at_a_time_and_replays(tmp_path):
    path = tmp_path / "grid.toml"
    path.write_text(GRID)
    outs = {}
    for batch in ("1", "5", "auto"):
        outs[batch] = tmp_path / f"sweep-{batch}"
        done = run_cli("sweep", str(path), "--out", str(outs[batch]), "--batch-runs", batch, "--threads", "1")
        assert done.returncode == 0, done.stderr
    assert _files(outs["5"]) == _files(outs["1"]) == _files(outs["auto"])
    runs = sorted((outs["5"] / "runs").iterdir())
    assert len(runs) == 18
    recorded = {json.loads((run / "config.json").read_text())["batch_runs"] for run in runs}
    assert recorded == {5}
    # auto is resolved from the configuration alone (runs.batch.batch_size) and recorded as a count
    auto = {json.loads((run / "config.json").read_text())["batch_runs"] for run in (outs["auto"] / "runs").iterdir()}
    assert auto == {AUTO_MAX}
    # A batched run's config.json replays it alone, to the same bytes.
    replay = tmp_path / "replay"
    done = run_cli("run", "--config", str(runs[0] / "config.json"), "--out", str(replay))
    assert done.returncode == 0, done.stderr
    assert (replay / "metrics.csv").read_bytes() == (runs[0] / "metrics.csv").read_bytes()
    # A rerun skips every finished run, whatever the batch size.
    again = run_cli("sweep", str(path), "--out", str(outs["5"]), "--batch-runs", "2", "--threads", "1")
    assert again.returncode == 0 and "18 finished earlier" in again.stdout


@pytest.mark.parametrize("command", [("sweep", "GRID"), ("tune", "--algorithm", "focus", "--problem", "ridge"),
                                     ("reproduce", "ridge"), ("reproduce", "report")])
@pytest.mark.parametrize("value", ["0", "two", "-1"])
def test_a_bad_batch_size_is_one_line(tmp_path, command, value):
    args = [str(tmp_path / "grid.toml") if word == "GRID" else word for word in command]
    (tmp_path / "grid.toml").write_text(GRID)
    done = run_cli(*args, "--out", str(tmp_path / "out"), "--batch-runs", value)
    assert "--batch-runs" in assert_one_line_error(done)
    assert not (tmp_path / "out").exists()


def test_a_sigterm_stops_every_run_of_the_batch_with_a_checkpoint_and_the_rerun_ends_the_same(tmp_path):
    import signal
    import time

    from cli_harness import popen_cli

    path = tmp_path / "grid.toml"
    path.write_text(GRID.replace("rounds = 15", "rounds = 3000").replace("seeds = 3", "seeds = 2"))
    reference = tmp_path / "reference"
    assert run_cli("sweep", str(path), "--out", str(reference), "--batch-runs", "1", "--threads", "1",
                   timeout=600).returncode == 0
    out = tmp_path / "sweep"
    proc = popen_cli("sweep", str(path), "--out", str(out), "--batch-runs", "4", "--checkpoint-every", "50",
                     "--threads", "1")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if len(list((out / "runs").glob(".*.focusfl-partial/checkpoint.pt"))) >= 2:
            break
        time.sleep(0.01)
    assert proc.poll() is None, "the sweep ended before it could be stopped"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 143
    interrupted = [run for run in (out / "runs").iterdir() if not run.name.startswith(".")
                   and json.loads((run / "config.json").read_text())["status"] == "interrupted"]
    assert len(interrupted) >= 2 and all((run / "checkpoint.pt").is_file() for run in interrupted)
    again = run_cli("sweep", str(path), "--out", str(out), "--batch-runs", "4", "--threads", "1", timeout=600)
    assert again.returncode == 0, again.stderr
    # metrics, models, checkpoints and tables (a resumed run's config.json records its "asked"
    # part resolved, batched or not)
    results = lambda folder: {k: v for k, v in _files(folder).items() if k.endswith((".csv", ".pt"))}  # noqa: E731
    assert results(out) == results(reference)


def test_the_ridge_figure_computed_in_batches_equals_one_run_at_a_time():
    from focusfl.reproduce.reproduce_ridge import run_figure4

    chosen = ["focus", "fedavg", "scaffold", "fedsum_cr"]
    assert run_figure4(10, algorithms=chosen, batch_runs=1) == run_figure4(10, algorithms=chosen, batch_runs="auto")

"""Checkpoints and resume: killed runs continue to the same bytes; streaming draws; safe defaults."""
from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from cli_harness import assert_one_line_error, cli_env, killer_script, popen_cli, run_cli, run_main, snapshot
from focusfl.algorithms import ALGORITHMS
from focusfl.cli import main
from focusfl.engine import simulate
from focusfl.runs.checkpoint import load_model
from focusfl.runs.config import RunConfig
from focusfl.runs.driver import build, make_run_algorithm
from focusfl.participation import available_participation, make_participation
from focusfl.problems import make_problem

# A child that runs `focusfl ARGS` and SIGKILLs itself at the end of round KILL_AT (after any
# checkpoint of that round), as `kill -9` from outside would at an unlucky moment.
KILLER = killer_script()

CASES = {
    # sequential participation (its stream is checkpointed) and minibatches keyed by round
    "float64": ["--algorithm", "sg_focus", "--problem", "ridge:clients=8,dim=6,samples=12,batch=4,hetero=1",
                "--participation", "markov", "--dtype", "float64"],
    # client memory of another shape, float32 state
    "float32": ["--algorithm", "fedau", "--problem", "logistic:clients=8,dim=5,samples=10",
                "--participation", "bernoulli", "--dtype", "float32", "--local-steps", "3"],
}
ROUNDS = 240


def _killed_at(round_: int, args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", KILLER, str(round_), *args], env=cli_env(),
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", sorted(CASES))
def test_sigkill_at_ten_random_rounds_then_resume_gives_the_same_bytes(tmp_path, dtype):
    common = [*CASES[dtype], "--rounds", str(ROUNDS), "--eval-every", "7"]
    whole = tmp_path / "whole"
    assert run_main("run", *common, "--out", str(whole)).returncode == 0

    out = tmp_path / "killed"
    kills = sorted(random.Random(dtype).sample(range(12, ROUNDS - 5), 10))
    first = _killed_at(kills[0], ["run", *common, "--checkpoint-every", "11", "--out", str(out)])
    assert first.returncode == -signal.SIGKILL, first.stderr
    for round_ in kills[1:]:
        proc = _killed_at(round_, ["run", "--resume", str(out), "--checkpoint-every", "11"])
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        assert not out.exists()  # a killed run never publishes a half-written folder
    done = run_main("run", "--resume", str(out))
    assert done.returncode == 0, done.stderr

    assert (out / "metrics.csv").read_bytes() == (whole / "metrics.csv").read_bytes()
    assert torch.equal(load_model(out / "model.pt"), load_model(whole / "model.pt"))
    assert load_model(out / "model.pt").dtype == getattr(torch, dtype)
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no partial left


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["SIGTERM", "Ctrl-C"])
def test_a_stopped_run_is_kept_from_a_retyped_command_and_resume_finishes(tmp_path, sig, code):
    out = tmp_path / "run"
    args = ["run", "--algorithm", "focus", "--problem", "ridge:clients=4,dim=3,samples=5", "--rounds", "10000000",
            "--eval-every", "1000", "--out", str(out)]
    proc = popen_cli(*args)
    # Wait until rounds are running (a signal during start-up just ends the process, writing nothing).
    metrics = tmp_path / ".run.focusfl-partial" / "metrics.csv"
    deadline = time.monotonic() + 90
    while not (metrics.exists() and metrics.stat().st_size > 0) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    lines = [line for line in err.splitlines() if line.strip() and "round/s" not in line and "%" not in line]
    assert lines[-1].startswith(f"focusfl: {sig.name}: stopped after round") and f"--resume {out}" in lines[-1]
    info = json.loads((out / "config.json").read_text())
    assert info["status"] == "interrupted" and (out / "checkpoint.pt").is_file()
    stopped = info["interrupted_after_round"]

    # The same command typed again (recalled from the shell's history) must not replace the stopped run.
    before = snapshot(tmp_path)
    retyped = run_main(*args)
    line = assert_one_line_error(retyped, 2, contains="holds an interrupted run")
    assert f"--resume {out}" in line and "--restart" in line and "another --out" in line
    assert snapshot(tmp_path) == before  # nothing changed, and no partial folder was left beside it

    resumed = run_cli("run", "--resume", str(out), "--rounds", str(stopped + 3000))
    assert resumed.returncode == 0, resumed.stderr
    info = json.loads((out / "config.json").read_text())
    assert info["status"] == "complete" and info["rounds_done"] == stopped + 3000


def test_restart_replaces_a_stopped_run_and_a_finished_run_is_replaced_without_it(tmp_path):
    out = tmp_path / "a"
    assert main([*RUN, "--eval-every", "10", "--out", str(out)]) == 0
    info = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**info, "status": "interrupted"}))  # as a signal leaves it
    assert_one_line_error(run_main(*RUN, "--out", str(out)), 2, contains="--restart")
    assert run_cli(*RUN, "--out", str(out), "--restart").returncode == 0
    assert json.loads((out / "config.json").read_text())["status"] == "complete"
    assert run_main(*RUN, "--out", str(out)).returncode == 0  # complete: same command, same bytes


RUN = ["run", "--algorithm", "focus", "--problem", "ridge:clients=4,dim=3,samples=5", "--rounds", "40"]


def test_resume_extends_a_finished_run_to_the_same_bytes(tmp_path):
    assert main([*RUN, "--eval-every", "10", "--out", str(tmp_path / "a")]) == 0
    assert main(["run", "--resume", str(tmp_path / "a"), "--rounds", "90"]) == 0
    assert main([*RUN[:-1], "90", "--eval-every", "10", "--out", str(tmp_path / "b")]) == 0
    for name in ("metrics.csv", "model.pt"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_resume_refuses_what_it_cannot_honour(tmp_path, capsys):
    assert main([*RUN, "--out", str(tmp_path / "a")]) == 0
    capsys.readouterr()
    assert main(["run", "--resume", str(tmp_path / "a"), "--lr", "0.1"]) == 2
    assert "--lr cannot change it" in capsys.readouterr().err
    assert main(["run", "--resume", str(tmp_path / "a")]) == 2  # finished: nothing to run
    assert "give --rounds R" in capsys.readouterr().err
    (tmp_path / "user").mkdir()
    assert main(["run", "--resume", str(tmp_path / "user")]) == 2
    assert "no checkpoint" in capsys.readouterr().err


def test_a_killed_partial_is_neither_lost_nor_silently_reused(tmp_path):
    out = tmp_path / "k"
    proc = _killed_at(25, [*RUN, "--checkpoint-every", "10", "--out", str(out)])
    assert proc.returncode == -signal.SIGKILL
    again = run_main(*RUN, "--out", str(out))
    assert_one_line_error(again, 2, contains="--resume")
    assert run_main(*RUN, "--out", str(out), "--restart").returncode == 0
    assert json.loads((out / "config.json").read_text())["status"] == "complete"


@pytest.mark.parametrize("payload", [b"", b"not a checkpoint", b"PK\x03\x04" + b"\0" * 40])
def test_a_damaged_checkpoint_is_a_one_line_error(tmp_path, payload):
    out = tmp_path / "a"
    assert main([*RUN, "--out", str(out)]) == 0
    (out / "checkpoint.pt").write_bytes(payload)
    proc = run_main("run", "--resume", str(out), "--rounds", "50")
    assert_one_line_error(proc, 2, contains="checkpoint")


def test_a_checkpoint_of_another_problem_is_refused(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert main([*RUN, "--out", str(a)]) == 0
    assert main(["run", "--algorithm", "focus", "--problem", "ridge:clients=4,dim=5,samples=5", "--rounds", "4",
                 "--out", str(b)]) == 0
    (a / "checkpoint.pt").write_bytes((b / "checkpoint.pt").read_bytes())
    proc = run_main("run", "--resume", str(a), "--rounds", "50")
    assert_one_line_error(proc, 2, contains="server.x")


# -- config.json: type-checked, and flags beside --config are applied ------------------------------
@pytest.mark.parametrize("key,value,needle", [
    ("rounds", "100", "rounds must be an integer"),
    ("seed", -1, "seed must be an integer >= 0"),
    ("dtype", "float16", "dtype"),
    ("engine", 3, "engine"),
    ("algorithm", 7, "algorithm must be a SPEC"),
    ("surprise", 1, "unknown key 'surprise'"),
])
def test_config_files_are_type_checked(tmp_path, capsys, key, value, needle):
    assert main([*RUN, "--out", str(tmp_path / "a")]) == 0
    data = json.loads((tmp_path / "a" / "config.json").read_text())
    data[key] = value
    (tmp_path / "c.json").write_text(json.dumps(data))
    capsys.readouterr()
    assert main(["run", "--config", str(tmp_path / "c.json"), "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "b").exists()


def test_flags_beside_config_override_it(tmp_path):
    assert main([*RUN, "--out", str(tmp_path / "a")]) == 0
    config = str(tmp_path / "a" / "config.json")
    assert main(["run", "--config", config, "--lr", "1e-3", "--seed", "3", "--rounds", "5",
                 "--out", str(tmp_path / "b")]) == 0
    data = json.loads((tmp_path / "b" / "config.json").read_text())
    assert data["algorithm"]["lr"] == 1e-3 and data["seed"] == 3 and data["rounds"] == 5


# -- streaming participation --------------------------------------------------------------------
# label participation needs a labelled problem; test_nn covers it
@pytest.mark.parametrize("name", [n for n in available_participation() if n != "label"])
def test_rows_in_any_order_equal_the_whole_mask(name, tmp_path):
    params = {}
    if name == "trace":
        trace = tmp_path / "t.npy"
        np.save(trace, np.random.default_rng(0).random((37, 6)) < 0.5)
        params = {"path": str(trace)}
    spec = {"name": name, **params}
    whole = make_participation(spec, 6, seed=3).mask(700)
    process = make_participation(spec, 6, seed=3)
    for lo, hi in [(0, 5), (5, 300), (650, 700), (100, 120), (299, 301), (0, 700)]:
        np.testing.assert_array_equal(process.rows(lo, hi), whole[lo:hi])
    for r in (699, 3, 4, 256, 257, 0):
        np.testing.assert_array_equal(process.active(r), np.flatnonzero(whole[r]))


def test_a_sequential_stream_continues_from_its_saved_state():
    whole = make_participation("markov", 5, seed=1).mask(900)
    first = make_participation("markov", 5, seed=1)
    first.rows(0, 333)
    saved = first.stream_state()
    second = make_participation("markov", 5, seed=1)
    second.restore_stream(saved)
    np.testing.assert_array_equal(second.rows(333, 900), whole[333:])


def test_simulate_in_small_round_chunks_equals_one_chunk(monkeypatch):
    import importlib

    sim = importlib.import_module("focusfl.engine.simulate")  # the module, not the function
    problem = make_problem("ridge:clients=6,dim=4,samples=5")
    algorithm = make_run_algorithm(RunConfig(algorithm="focus", lr="auto"), problem)
    one = simulate(algorithm, problem, make_participation("markov", 6, seed=2), 50, eval_every=5)
    monkeypatch.setattr(sim, "ROUND_CHUNK", 3)
    chunked = simulate(algorithm, problem, make_participation("markov", 6, seed=2), 50, eval_every=5)
    assert one.rows == chunked.rows
    assert torch.equal(one.state.server.x, chunked.state.server.x)


# -- safe default step sizes ------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(ALGORITHMS))
@pytest.mark.parametrize("problem", ["ridge", "logistic:clients=16"])
def test_lr_auto_never_diverges_on_the_default_problems(name, problem):
    for participation in ("bernoulli", "markov", "cyclic"):
        built = build(RunConfig(algorithm=name, problem=problem, participation=participation, rounds=150,
                                lr="auto", local_steps=2, eval_every=150))
        result = simulate(built.algorithm, built.problem, built.participation, 150, eval_every=150)
        assert result.diverged_at is None, (name, participation)
        start, end = result.rows[0]["rel_error"], result.rows[-1]["rel_error"]
        assert end < start, (name, participation, start, end)


def test_lr_auto_is_one_over_n_l_for_focus_and_refused_without_l():
    problem = make_problem("ridge")
    focus = make_run_algorithm(RunConfig(algorithm="focus", lr="auto"), problem)
    assert focus.lr == pytest.approx(1 / (16 * problem.smoothness()))
    fedavg = make_run_algorithm(RunConfig(algorithm="fedavg", lr="auto", local_steps=5), problem)
    assert fedavg.lr == pytest.approx(1 / (5 * problem.smoothness()))
    given = make_run_algorithm(RunConfig(algorithm="focus:lr=0.5", lr="auto"), problem)
    assert given.lr == 0.5  # the SPEC's own lr wins over auto


def test_default_run_converges_and_nn_without_lr_says_so(tmp_path):
    assert main(["run", "--algorithm", "focus", "--out", str(tmp_path / "a")]) == 0
    from focusfl.io.atomic import read_csv

    last = read_csv(tmp_path / "a" / "metrics.csv")[-1]
    assert float(last["rel_error"]) < 1e-5 and last["diverged"] == ""
    proc = run_main("run", "--algorithm", "focus", "--problem", "nn:data=tests/fixtures/mnist1500.npz,test_fraction=0.2",
                    "--out", str(tmp_path / "b"))
    assert_one_line_error(proc, 2, contains="--lr")

"""One Ctrl-C at any moment of ``focusfl run``: before its folder is opened nothing is written;
from then on the run ends with DIR published (interrupted, or complete when the last round was
done), and a resume gives the uninterrupted run's files, config.json included, byte for byte.

Each phase is reached deterministically: the command runs in a child whose function of that
phase sends SIGINT to its own process before doing its work (no timing). The runs that are not
interrupted (the reference, the resumes) call focusfl.cli.main in this process (run_main): the
signals are the subject here, the console script's own tests are elsewhere."""
from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from cli_harness import cli_env, default_signals, killer_script, run_main

ARGS = ["--algorithm", "sg_focus", "--problem", "ridge:clients=8,dim=6,samples=12,batch=4",
        "--participation", "markov:rho=0.8", "--local-steps", "2", "--eval-every", "7"]
ROUNDS = 30
FILES = ("metrics.csv", "model.pt", "config.json")

# A child that runs `focusfl ARGV[2:]` and sends itself SIGINT as the phase ARGV[1] begins.
_INTERRUPTER = """
import os, signal, sys
import focusfl.io.folders as folders
import focusfl.runs.driver as driver
import focusfl.runs.folder as folder
from focusfl.cli import main

phase = sys.argv[1]


def interrupt_before(owner, name, when=lambda *a, **k: True):
    real = getattr(owner, name)
    sent = []

    def wrapped(*args, **kwargs):
        if not sent and when(*args, **kwargs):
            sent.append(1)
            os.kill(os.getpid(), signal.SIGINT)
        return real(*args, **kwargs)

    setattr(owner, name, wrapped)


def interrupt_at_round(at):
    real = driver.simulate

    def simulate(*args, on_round, **kwargs):
        def then(result):
            if result.rounds_done == at:
                os.kill(os.getpid(), signal.SIGINT)
            on_round(result)
        return real(*args, on_round=then, **kwargs)

    driver.simulate = simulate


if phase == "start-up":
    interrupt_before(folder, "build")
elif phase == "first-write":
    interrupt_before(folder, "write_json")
elif phase.startswith("round-"):
    interrupt_at_round(int(phase.split("-")[1]))
elif phase == "model":
    interrupt_before(folder, "save_model")
elif phase == "figure":
    interrupt_before(folder, "_plot")
elif phase == "publish":
    interrupt_before(folders.Output, "publish")
sys.exit(main(sys.argv[2:]))
"""


def interrupted_at(phase: str, *argv: str) -> subprocess.CompletedProcess:
    # default_signals: a suite started as a background job ignores SIGINT, and children inherit that
    return subprocess.run([sys.executable, "-c", _INTERRUPTER, phase, *argv], env=cli_env(),
                          capture_output=True, text=True, timeout=180, preexec_fn=default_signals)


def last_line(proc: subprocess.CompletedProcess) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines and "Traceback" not in proc.stderr, proc.stderr
    return lines[-1]


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    """The uninterrupted run."""
    out = tmp_path_factory.mktemp("whole") / "run"
    proc = run_main("run", *ARGS, "--rounds", str(ROUNDS), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    return out


def assert_same_files(out, whole):
    for name in FILES:
        assert (out / name).read_bytes() == (whole / name).read_bytes(), name


def test_a_ctrl_c_during_start_up_writes_nothing(tmp_path):
    out = tmp_path / "run"
    proc = interrupted_at("start-up", "run", *ARGS, "--rounds", str(ROUNDS), "--out", str(out))
    assert proc.returncode == 130 and last_line(proc) == "focusfl: interrupted"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("phase,stopped", [("first-write", 1), ("round-12", 12)])
def test_a_ctrl_c_before_the_last_round_publishes_the_run_and_resume_finishes_it(tmp_path, whole, phase, stopped):
    """Once its folder is opened (its config.json being written, a round in progress) a Ctrl-C
    stops the run at the end of that round (the first one, if it came before) and publishes it."""
    out = tmp_path / "run"
    proc = interrupted_at(phase, "run", *ARGS, "--rounds", str(ROUNDS), "--out", str(out))
    assert proc.returncode == 130, proc.stderr
    assert last_line(proc).startswith(f"focusfl: SIGINT: stopped after round {stopped}; results so far are in {out}")
    info = json.loads((out / "config.json").read_text())
    assert info["status"] == "interrupted" and info["interrupted_after_round"] == stopped
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no partial folder, no lock left
    resumed = run_main("run", "--resume", str(out))
    assert resumed.returncode == 0, resumed.stderr
    assert_same_files(out, whole)


@pytest.mark.parametrize("phase", [f"round-{ROUNDS}", "model", "figure", "publish"])
def test_a_ctrl_c_after_the_last_round_publishes_the_complete_run(tmp_path, whole, phase):
    """In the last round or the final writes (model.pt, the figure, the publication itself) a
    Ctrl-C lets the run finish: DIR is the uninterrupted run's, and the command says so with 130."""
    out = tmp_path / "run"
    proc = interrupted_at(phase, "run", *ARGS, "--rounds", str(ROUNDS), "--out", str(out))
    assert proc.returncode == 130, proc.stderr
    assert last_line(proc) == (f"focusfl: SIGINT: arrived after the last round; the run is complete in {out} "
                               f"({ROUNDS} rounds)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    assert (out / "curve.png").is_file()
    assert_same_files(out, whole)


def test_a_ctrl_c_in_a_resumed_run_after_its_last_round_publishes_it_complete(tmp_path, whole):
    out = tmp_path / "run"
    assert interrupted_at("round-9", "run", *ARGS, "--rounds", str(ROUNDS), "--out", str(out)).returncode == 130
    proc = interrupted_at("publish", "run", "--resume", str(out))
    assert proc.returncode == 130 and "the run is complete in" in last_line(proc)
    assert_same_files(out, whole)


def test_config_json_after_a_sigkill_and_a_resume_is_the_uninterrupted_runs(tmp_path, whole):
    """The resumed run's config.json keeps what was asked (lr "auto", local_steps 2), not the
    resolved record it was rebuilt from."""
    out = tmp_path / "run"
    killed = subprocess.run([sys.executable, "-c", killer_script(), "17", "run", *ARGS, "--rounds", str(ROUNDS),
                             "--checkpoint-every", "5", "--out", str(out)],
                            env=cli_env(), capture_output=True, text=True, timeout=180)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert run_main("run", "--resume", str(out)).returncode == 0
    assert_same_files(out, whole)
    asked = json.loads((out / "config.json").read_text())["asked"]
    assert asked["lr"] == "auto" and asked["local_steps"] == 2


def test_config_json_after_resume_with_more_rounds_is_the_longer_runs(tmp_path, whole):
    short = tmp_path / "short"
    assert run_main("run", *ARGS, "--rounds", "10", "--out", str(short)).returncode == 0
    assert run_main("run", "--resume", str(short), "--rounds", str(ROUNDS)).returncode == 0
    assert_same_files(short, whole)

"""Neural-network runs give the same bytes in every process, under load, and after a resume.

Issue 17: the local-step formulation was chosen by timing, so the same command gave SG-FOCUS
0.485 test accuracy in one process and 0.721 in another; a resumed nn run differed from the
uninterrupted one from its first row on. These tests run `focusfl` as a user types it.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import gpu_check  # noqa: E402
from cli_harness import cli_env, killer_script, run_cli, run_main
from focusfl.runs.checkpoint import load_model

MNIST = Path(__file__).resolve().parent / "fixtures" / "mnist1500.npz"
# 8 clients of about 150 real digits, batch 16: the MNIST CNN's chunk rule picks all 8 at once
# (grouped convolutions), which round differently from the per-client calls a timer could pick.
NN_RUN = ["run", "--algorithm", "sg_focus", "--lr", "0.005", "--local-steps", "2", "--participation", "bernoulli",
          "--problem", f"nn:data={MNIST},test_fraction=0.2,clients=8,alpha=0.5,batch=16",
          "--eval-every", "5"]

# Every formulation timed as if the slowest were the fastest: the timer cannot change an `auto` run.
SKEWED_TIMER = """
import focusfl.problems.nn as nn
nn.GroupedFormulation._time_gradients = lambda self, k, layout, repeats=2: (1.0 if layout == "nchw" else 50.0) * (k or 99)
"""

# Runs `focusfl ARGV[2:]` and sends itself SIGTERM at the end of round ARGV[1], as a user's kill
# or a scheduler's preemption would; the run stops at its next round boundary with a checkpoint
# (gpu_check's, which stops a CUDA run the same way).
STOPPER = gpu_check.STOP_AFTER


def _script(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", script, *args], env=cli_env(), capture_output=True, text=True,
                          timeout=300)


def _burn() -> subprocess.Popen:
    """A busy process on every core while a run measures nothing: load must not change bytes."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def test_the_same_nn_command_gives_the_same_bytes_under_load_and_any_timer(tmp_path):
    quiet = run_cli(*NN_RUN, "--rounds", "10", "--out", str(tmp_path / "quiet"))
    assert quiet.returncode == 0, quiet.stderr
    burners = [_burn() for _ in range(os.cpu_count() or 2)]
    try:
        setup = SKEWED_TIMER + "\nfrom focusfl.cli import main\nimport sys\nsys.exit(main(sys.argv[1:]))\n"
        loaded = _script(setup, *NN_RUN, "--rounds", "10", "--out", str(tmp_path / "loaded"))
    finally:
        for proc in burners:
            proc.kill()
            proc.wait()
    assert loaded.returncode == 0, loaded.stderr
    for name in ("metrics.csv", "config.json"):
        assert (tmp_path / "quiet" / name).read_bytes() == (tmp_path / "loaded" / name).read_bytes()
    assert torch.equal(load_model(tmp_path / "quiet" / "model.pt"), load_model(tmp_path / "loaded" / "model.pt"))
    config = json.loads((tmp_path / "quiet" / "config.json").read_text())
    assert config["threads"] == 1 and config["problem"]["client_chunk"] == 0  # the rule's choice, recorded
    assert config["problem"]["layout"] == "channels_last"


def test_threads_are_part_of_the_run_and_recorded(tmp_path):
    two = run_cli(*NN_RUN, "--rounds", "5", "--threads", "2", "--out", str(tmp_path / "two"))
    assert two.returncode == 0, two.stderr
    assert json.loads((tmp_path / "two" / "config.json").read_text())["threads"] == 2
    replay = run_main("run", "--config", str(tmp_path / "two" / "config.json"), "--out", str(tmp_path / "replay"))
    assert replay.returncode == 0, replay.stderr
    assert (tmp_path / "two" / "metrics.csv").read_bytes() == (tmp_path / "replay" / "metrics.csv").read_bytes()


def test_a_sigtermed_nn_run_resumed_between_evaluations_writes_the_same_bytes(tmp_path):
    whole = tmp_path / "whole"
    assert run_main(*NN_RUN, "--rounds", "15", "--out", str(whole)).returncode == 0
    out = tmp_path / "stopped"
    stopped = _script(STOPPER, "7", *NN_RUN, "--rounds", "15", "--out", str(out))
    assert stopped.returncode == 143, stopped.stderr
    info = json.loads((out / "config.json").read_text())
    assert info["status"] == "interrupted" and info["interrupted_after_round"] == 8  # between rows 5 and 10
    resumed = run_main("run", "--resume", str(out))
    assert resumed.returncode == 0, resumed.stderr
    metrics = (out / "metrics.csv").read_text()
    assert metrics == (whole / "metrics.csv").read_text()
    assert "train_loss" in metrics.splitlines()[0]
    assert torch.equal(load_model(out / "model.pt"), load_model(whole / "model.pt"))


def test_a_killed_nn_run_resumed_from_its_checkpoint_writes_the_same_bytes(tmp_path):
    whole = tmp_path / "whole"
    assert run_main(*NN_RUN, "--rounds", "15", "--out", str(whole)).returncode == 0
    out = tmp_path / "killed"
    killed = _script(killer_script(), "9", *NN_RUN, "--rounds", "15", "--checkpoint-every", "3", "--out", str(out))
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    resumed = run_main("run", "--resume", str(out))  # from round 9's checkpoint, between rows 5 and 10
    assert resumed.returncode == 0, resumed.stderr
    assert (out / "metrics.csv").read_bytes() == (whole / "metrics.csv").read_bytes()
    assert torch.equal(load_model(out / "model.pt"), load_model(whole / "model.pt"))

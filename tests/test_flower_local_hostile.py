"""`focusfl federation local` under hostile conditions, as a user types it.

- Every option is checked before anything starts: a --timeout of 0, nan, -5 or inf, an --out
  that is a file, '/', the home folder or a user's folder, and a work trace that does not cover
  the rounds each end in one line (exit 2), with no process started and nothing written.
- Called by the full path of the interpreter's `focusfl` with PATH stripped to the system's (an
  unactivated venv, a pipx install), it finds Flower's executables next to the interpreter.
- A node whose copy of the data differs is refused at the handshake, and says so on the console
  and in federation.json's audit.
(Ctrl-C and SIGTERM keeping the rounds done, with 20,000 rounds accepted at start:
tests/test_flower_deployment.py.)
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr", reason="Flower is not installed (pip install 'focusfl[flower]')")

from cli_harness import (assert_one_line_error, cli_env, focusfl_command, run_cli, run_cli_together,  # noqa: E402
                         run_main)
from focusfl.flower.cli import federation_wait  # noqa: E402
from focusfl.flower.local import _communicate  # noqa: E402

pytestmark = [pytest.mark.flower]

LOCAL = ["federation", "local", "--nodes", "2", "--problem", "ridge:clients=2,dim=4"]


def test_every_bad_option_is_one_line_before_anything_starts(tmp_path):
    (tmp_path / "a-file").write_text("mine")
    user = tmp_path / "mine"
    user.mkdir()
    (user / "notes.txt").write_text("mine")
    trace = tmp_path / "work.csv"
    trace.write_text("round,client,steps\n0,0,1\n0,1,2\n1,0,2\n")  # round 1 lacks client 1
    workdir = tmp_path / "wd"
    cases = {
        "timeout 0": (["--timeout", "0"], "--timeout"),
        "timeout nan": (["--timeout", "nan"], "--timeout"),
        "timeout -5": (["--timeout", "-5"], "--timeout"),
        "timeout inf": (["--timeout", "inf"], "--timeout"),
        "min-nodes -1": (["--min-nodes", "-1"], "--min-nodes"),
        "min-nodes 1.5": (["--min-nodes", "1.5"], "--min-nodes"),
        "min-nodes beyond the clients": (["--min-nodes", "3"], "min_nodes is 3, but the problem has 2 clients"),
        "out a file": (["--out", str(tmp_path / "a-file")], "is not a folder"),
        "out root": (["--out", "/"], "root folder"),
        "out home": (["--out", str(Path.home())], "home folder"),
        "out a user's folder": (["--out", str(user)], "not focusfl's"),
        "short work trace": (["--algorithm", "fedavg", "--local-steps", "2", "--rounds", "3",
                              "--work", f"trace:path={trace}", "--out", str(tmp_path / "w")],
                             "no row for round 1, client 1"),
    }
    # Two through the console script (one refused as it parses, one as it reads the trace); the
    # others in this process (run_main).
    typed = ("timeout 0", "short work trace", "min-nodes beyond the clients")
    commands = {name: (*LOCAL, *args, "--workdir", str(workdir)) for name, (args, _) in cases.items()}
    procs = dict(zip(typed, run_cli_together([commands[name] for name in typed])))
    procs.update({name: run_main(*command) for name, command in commands.items() if name not in typed})
    for name, (_, words) in cases.items():
        proc = procs[name]
        assert_one_line_error(proc, 2, contains=words), name
        assert proc.stdout == "", (name, proc.stdout)  # "federation: ..." is printed when it starts
    assert not workdir.exists() and not (tmp_path / "w").exists()
    assert (tmp_path / "a-file").read_text() == "mine" and os.listdir(user) == ["notes.txt"]


def test_waits_of_any_length_are_floats_and_split_up():
    assert federation_wait(20_000, 60.0) == 20_000 * 210.0  # more than poll() takes in one wait
    assert federation_wait(10**12, 1e300) == float("inf")  # waits for ever, no OverflowError


def test_a_wait_longer_than_poll_allows_does_not_overflow():
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "print('ok')"], stdout=subprocess.PIPE, text=True)
    assert _communicate(proc, 20_000 * 210.0).strip() == "ok"  # one poll() of 4.2e6 s overflows
    proc = subprocess.Popen([sys.executable, "-c", "print('ok')"], stdout=subprocess.PIPE, text=True)
    assert _communicate(proc, float("inf")).strip() == "ok"


@pytest.mark.slow
def test_federation_local_by_full_path_with_path_stripped_to_the_systems(tmp_path):
    system_path = os.pathsep.join(p for p in ("/usr/local/bin", "/usr/bin", "/bin") if os.path.isdir(p))
    command = focusfl_command()
    assert os.path.isabs(command[0])
    env = cli_env(PATH=system_path)
    out = tmp_path / "fed"
    proc = run_cli(*LOCAL, "--rounds", "2", "--out", str(out), "--workdir", str(tmp_path / "wd"), env=env,
                   timeout=600)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert json.loads((out / "config.json").read_text())["status"] == "complete"


def _dataset(path: Path, flip: bool = False) -> Path:
    rng = np.random.default_rng(0)
    labels = np.arange(80) % 2
    np.savez(path, images=rng.integers(0, 255, (80, 6, 6), dtype=np.uint8),
             labels=1 - labels if flip else labels,
             test_images=rng.integers(0, 255, (20, 6, 6), dtype=np.uint8), test_labels=np.arange(20) % 2)
    return path


@pytest.mark.slow
def test_a_refused_node_is_in_the_audit_and_on_the_console(tmp_path):
    data = _dataset(tmp_path / "d.npz")
    copies = tmp_path / "copies"
    copies.mkdir()
    _dataset(copies / "node0.npz")
    _dataset(copies / "node1.npz", flip=True)  # node 1's copy differs: every label flipped
    out = tmp_path / "fed"
    proc = run_cli("federation", "local", "--nodes", "2", "--algorithm", "fedavg", "--lr", "0.05", "--rounds", "2",
                   "--problem", f"nn:data={data},clients=2,partition=iid,batch=4,model=mlp",
                   "--data-path", str(copies / "node{k}.npz"), "--out", str(out), "--workdir", str(tmp_path / "wd"),
                   timeout=600)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    said = [line for line in proc.stdout.splitlines() if "refused at the handshake" in line]
    assert len(said) == 1 and "client 1: its data differs" in said[0], proc.stdout
    audit = json.loads((out / "federation.json").read_text())["audit"]
    assert list(audit["refused_nodes"].values())[0].startswith("client 1: its data differs")
    assert audit["clients_without_node"] == [1]

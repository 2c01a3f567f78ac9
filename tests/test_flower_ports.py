"""Federations side by side on one machine: ports never collide.

A SuperLink or SuperNode binds the port focusfl gives it seconds after focusfl chose it; one
run ended with "flower-superlink exited with status 3" when another federation took the port in
between. Ports are now drawn outside the system's ephemeral range, and a process that finds its
port taken is started again on another (flower/local.py). Tested: two `focusfl federation local`
started at once both finish with the results of a lone run, and a federation whose first ports
are taken (held by the test) starts on others.
"""
from __future__ import annotations

import re
import socket
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="Flower is not installed (pip install 'focusfl[flower]')")

import focusfl.flower.local as local  # noqa: E402
from cli_harness import run_cli_together  # noqa: E402
from focusfl.flower.local import LocalFederation  # noqa: E402
from focusfl.flower.server_app import FederationConfig  # noqa: E402

pytestmark = [pytest.mark.flower, pytest.mark.slow]

FEDERATION = ("federation", "local", "--nodes", "2", "--algorithm", "focus", "--problem", "ridge:clients=2,dim=4",
              "--participation", "full", "--rounds", "3", "--lr", "1e-3")


def test_two_federations_at_once_both_finish(tmp_path):
    """Also: the temporary folder a federation without --workdir makes is removed once it has
    succeeded (the other one's --workdir stays)."""
    runs = [tmp_path / "a", tmp_path / "b"]
    procs = run_cli_together([(*FEDERATION, "--out", str(runs[0]), "--workdir", str(runs[0].with_suffix(".fed"))),
                              (*FEDERATION, "--out", str(runs[1]))], limit_gib=None, timeout=600)
    for out, proc in zip(runs, procs):
        assert proc.returncode == 0, proc.stderr[-2000:] + proc.stdout[-2000:]
        assert (out / "metrics.csv").is_file()
    temporary = re.search(r"logs in (\S+)/logs \(a temporary folder", procs[1].stdout)
    assert temporary and "focusfl-federation-" in temporary[1], procs[1].stdout
    assert not Path(temporary[1]).exists()
    assert (runs[0].with_suffix(".fed") / "logs").is_dir()
    assert (runs[0] / "metrics.csv").read_bytes() == (runs[1] / "metrics.csv").read_bytes()
    assert (runs[0] / "model.pt").read_bytes() == (runs[1] / "model.pt").read_bytes()


def test_taken_ports_are_drawn_again(tmp_path, monkeypatch):
    """The first port drawn for the SuperLink and for each SuperNode is one this test listens on."""
    held = []

    def taken_port() -> int:
        holder = socket.socket()
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        held.append(holder)
        return holder.getsockname()[1]

    real, drawn = local.free_port, []

    def free_port() -> int:
        drawn.append(None)
        return taken_port() if len(drawn) in (1, 3) else real()  # the SuperLink's first port, node 0's first

    monkeypatch.setattr(local, "free_port", free_port)
    out = tmp_path / "run"
    config = FederationConfig(algorithm="focus", problem="ridge:clients=2,dim=4", participation="full", rounds=2,
                              lr=1e-3, local_steps=1, timeout=25.0, out=str(out))
    try:
        with LocalFederation(tmp_path / "fed", nodes=2) as federation:
            result = federation.run(config, timeout=300)
            logs = sorted(p.name for p in federation.logs.iterdir())
    finally:
        for holder in held:
            holder.close()
    assert result.returncode == 0, result.stdout[-2000:]
    assert (out / "metrics.csv").is_file()
    assert any(name.startswith("superlink.port-") for name in logs), logs
    assert sum(name.startswith("node") for name in logs) >= 3, logs  # a node's log moved aside on its retry


def test_ports_are_drawn_outside_the_ephemeral_range():
    low, high = local._ephemeral_range()
    ports = {local.free_port() for _ in range(20)}
    assert all(not low <= port <= high for port in ports) and len(ports) > 1
    with subprocess.Popen(["sleep", "0"]) as process:
        process.wait()
    assert not local._port_taken(local.Path("/nonexistent.log"), process)

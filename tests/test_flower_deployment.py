"""A real Flower deployment on loopback: 1 SuperLink + 3 SuperNodes as subprocesses.

One SuperNode is killed with SIGKILL mid-run and restarted from its durable state: the run
completes, the rounds it missed are recorded as dropped, the result equals the reference
engine replaying the realized trace (bit for bit, float64), FOCUS reaches the optimum to 1e-10
and the audit confirms y = sum_i g_prev_i. Every process is stopped afterwards.
"""
from __future__ import annotations

import csv
import json
import os
import threading
import time

import pytest
import torch

pytest.importorskip("flwr", reason="Flower is not installed (pip install 'focusfl[flower]')")

from focusfl.experiments.run_folder import run_to_folder  # noqa: E402
from focusfl.experiments.runner import config_from_json  # noqa: E402
from focusfl.flower.local import LocalFederation  # noqa: E402
from focusfl.flower.server_app import FederationConfig  # noqa: E402
from focusfl.problems import make_problem  # noqa: E402

pytestmark = [pytest.mark.flower, pytest.mark.slow]

PROBLEM = "ridge:clients=3,dim=4,samples=30,reg=1000"


def best_focus_lr(spec: str) -> float:
    """2 / (N (lambda_min + lambda_max)) of F's Hessian: FOCUS steps on a sum of N gradients."""
    problem = make_problem(spec)
    hessian = torch.autograd.functional.jacobian(problem.gradient, problem.initial_point())
    eigen = torch.linalg.eigvalsh(hessian)
    return 2.0 / (problem.num_clients * float(eigen[0] + eigen[-1]))


def received(federation: LocalFederation, k: int) -> int:
    log = federation.logs / f"node{k}.log"
    return log.read_text(errors="replace").count("Received successfully") if log.is_file() else 0


def assert_no_survivors(groups: list[int], seconds: float = 15.0) -> None:
    """Every process group started by the federation is gone (no orphan SuperNode or app)."""
    deadline = time.monotonic() + seconds
    alive = list(groups)
    while alive and time.monotonic() < deadline:
        alive = [g for g in alive if _group_alive(g)]
        time.sleep(0.2)
    assert not alive, f"process groups still alive: {alive}"


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def test_loopback_sigkill_and_restart_stays_exact(tmp_path):
    out = tmp_path / "run"
    config = FederationConfig(algorithm="focus", problem=PROBLEM, participation="full", rounds=9,
                              lr=best_focus_lr(PROBLEM), local_steps=1, timeout=25.0, out=str(out))
    with LocalFederation(tmp_path / "fed", nodes=3) as federation:
        done = {}
        thread = threading.Thread(target=lambda: done.setdefault("result", federation.run(config, timeout=540)))
        thread.start()
        deadline = time.monotonic() + 300
        while received(federation, 1) < 3 and time.monotonic() < deadline and thread.is_alive():
            time.sleep(0.2)  # handshake + two train rounds
        federation.kill_node(1)  # SIGKILL to its process group
        time.sleep(20)
        federation.start_node(1)  # a new SuperNode process: new node id, same state-dir
        thread.join(timeout=560)
        assert not thread.is_alive()
        groups = federation.pids()
    assert_no_survivors(groups)
    result = done["result"]
    assert result.returncode == 0, result.stdout[-2000:]
    info = json.loads((out / "federation.json").read_text())
    assert info["lost_clients"] == []
    assert info["audit"]["tracking_gap"] <= 1e-12
    with open(out / "trace.csv") as handle:
        trace = [row for row in csv.reader(handle)][1:]
    column = [row[1] for row in trace]
    assert "0" in column and column[-1] == "1", column  # dropped while down, back at the end
    rows = list(csv.DictReader(open(out / "metrics.csv")))
    assert float(rows[-1]["rel_error"]) <= 1e-10
    # The reference engine replaying the realized trace: the same model, bit for bit.
    replay = run_to_folder(config_from_json(json.loads((out / "config.json").read_text())), tmp_path / "replay",
                           checkpoint_every=0)
    model = torch.load(tmp_path / "replay" / "model.pt", weights_only=True)
    replayed = list(csv.DictReader(open(tmp_path / "replay" / "metrics.csv")))
    assert replayed[-1]["rel_error"] == rows[-1]["rel_error"]
    assert replay.rounds_done == 9 and model is not None

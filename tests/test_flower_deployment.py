"""A real Flower deployment on loopback: 1 SuperLink + 3 SuperNodes as subprocesses.

- Plain: one SuperNode is killed with SIGKILL mid-run and restarted from its durable state:
  the run completes, the rounds it missed are recorded as dropped, the result equals the
  reference engine replaying the realized trace (bit for bit, float64), FOCUS reaches the
  optimum to 1e-10 and the audit confirms y = sum_i g_prev_i.
- TLS + node authentication: the same equality, while three strangers try to join the same
  SuperLink and are refused: a node whose key was never registered, a TLS node without a
  key, and a plaintext node.

Every process is stopped afterwards.
"""
from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import threading
import time

import pytest
import torch

pytest.importorskip("flwr", reason="Flower is not installed (pip install 'focusfl[flower]')")

from cli_harness import popen_cli  # noqa: E402
from focusfl.runs.folder import run_to_folder  # noqa: E402
from focusfl.runs.config import config_from_json  # noqa: E402
from focusfl.flower.local import LocalFederation  # noqa: E402
from focusfl.flower.server_app import FederationConfig  # noqa: E402
from focusfl.flower.tls import make_node_key  # noqa: E402
from focusfl.problems import make_problem  # noqa: E402

pytestmark = [pytest.mark.flower, pytest.mark.slow]

PROBLEM = "ridge:clients=3,dim=4,samples=30,reg=1000"


def best_focus_lr(spec: str) -> float:
    """2 / (N (lambda_min + lambda_max)) of F's Hessian: FOCUS steps on a sum of N gradients."""
    problem = make_problem(spec)
    hessian = torch.autograd.functional.jacobian(problem.gradient, problem.initial_point())
    eigen = torch.linalg.eigvalsh(hessian)
    return 2.0 / (problem.num_clients * float(eigen[0] + eigen[-1]))


def received(federation: LocalFederation, k: int | str) -> int:
    """Messages SuperNode k (or the node started under that name) has received so far."""
    log = federation.logs / (f"node{k}.log" if isinstance(k, int) else f"{k}.log")
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
    replayed = list(csv.DictReader(open(tmp_path / "replay" / "metrics.csv")))
    assert replayed[-1]["rel_error"] == rows[-1]["rel_error"]
    assert replay.rounds_done == 9
    assert_same_model(out, tmp_path / "replay")


def assert_same_model(federated, replayed) -> None:
    """model.pt of the federation equals model.pt of the reference replay, bit for bit."""
    ours = torch.load(federated / "model.pt", weights_only=True)["x"]
    theirs = torch.load(replayed / "model.pt", weights_only=True)["x"]
    assert ours.dtype == theirs.dtype == torch.float64 and torch.equal(ours, theirs), \
        float((ours - theirs).abs().max())


def node_id(federation: LocalFederation, name: str) -> int | None:
    """The id a SuperNode printed once the SuperLink accepted it (None: it never was)."""
    log = federation.logs / f"{name}.log"
    found = re.search(r"SuperNode ID: (\d+)", log.read_text(errors="replace")) if log.is_file() else None
    return int(found.group(1)) if found else None


def test_loopback_tls_and_node_auth_refuses_strangers(tmp_path):
    """TLS + SuperNode authentication: the three registered nodes run FOCUS to the reference
    replay's bits, while three strangers started against the same SuperLink never join.

    How Flower 1.41 refuses them: a node whose key is not registered, and a TLS node without a
    key, are turned away when they activate (SuperLink API errors 2004 and 2001); the SuperNode
    exits with a non-zero status. A plaintext node cannot complete a request to the TLS
    SuperLink and retries forever; it never gets a node id. None of them may appear among the
    run's nodes or send a reply (which would show as a duplicate claim of its client)."""
    out = tmp_path / "run"
    config = FederationConfig(algorithm="focus", problem=PROBLEM, participation="full", rounds=3,
                              lr=best_focus_lr(PROBLEM), local_steps=1, timeout=40.0, out=str(out))
    with LocalFederation(tmp_path / "fed", nodes=3, tls=True, auth=True) as federation:
        registered = {node_id(federation, f"node{k}") for k in range(3)}
        assert None not in registered
        stranger, _ = make_node_key(federation.workdir / "stranger-keys", 0)  # never registered
        strangers = {"unregistered": federation.start_node(0, name="unregistered", key=stranger),
                     "keyless": federation.start_node(1, name="keyless", key=False),
                     "plaintext": federation.start_node(2, name="plaintext", tls=False, key=False)}
        result = federation.run(config, timeout=300)
        for name in ("unregistered", "keyless"):  # refused at activation: the SuperNode exits
            try:
                strangers[name].wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
            assert strangers[name].returncode not in (None, 0), (name, strangers[name].returncode)
        assert strangers["plaintext"].poll() != 0  # still retrying, or given up
        for name in strangers:
            assert node_id(federation, name) is None, name
            assert received(federation, name) == 0, name
        groups = federation.pids()
    assert_no_survivors(groups)
    assert result.returncode == 0, result.stdout[-2000:]
    info = json.loads((out / "federation.json").read_text())
    assert {int(node) for node in info["nodes"]} == registered
    assert sorted(info["nodes"].values()) == [0, 1, 2]
    assert not {"duplicate", "unknown_node", "malformed"} & set(info["rejections"]), info["rejections"]
    assert info["audit"]["tracking_gap"] <= 1e-12
    replay = run_to_folder(config_from_json(json.loads((out / "config.json").read_text())), tmp_path / "replay",
                           checkpoint_every=0)
    assert replay.rounds_done == 3
    assert_same_model(out, tmp_path / "replay")


def federation_processes(home) -> list[str]:
    """Live (not zombie) processes whose environment names ``home`` as FLWR_HOME: everything a
    federation started, the ServerApp that Flower starts in a session of its own included."""
    wanted = f"FLWR_HOME={home}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            environ = open(f"/proc/{entry.name}/environ", "rb").read()
            stat = open(f"/proc/{entry.name}/stat").read()
            command = open(f"/proc/{entry.name}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if wanted in environ.split(b"\0") and stat.rsplit(")", 1)[1].split()[0] != "Z":
            found.append(f"{entry.name} {command[:120]}")
    return found


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_federation_local_leaves_no_process_and_keeps_the_rounds_done(tmp_path, sig):
    """Ctrl-C (or SIGTERM) to `focusfl federation local` while the ServerApp runs 20,000 rounds
    (accepted at start: the wait is no OverflowError): focusfl says it was interrupted and where
    the rounds done are, exits 128+N, and no process it started survives it, in particular not
    the flwr-serverapp that the SuperLink's SuperExec starts outside focusfl's process groups.
    The rounds done are a run folder (config.json: interrupted) whose replay gives the same model."""
    workdir, out = tmp_path / "fed", tmp_path / "run"
    proc = popen_cli("federation", "local", "--nodes", "2", "--problem", "ridge:clients=2,dim=5",
                     "--participation", "full", "--rounds", "20000", "--timeout", "5", "--out", str(out),
                     "--workdir", str(workdir))
    home = workdir / "flwr-home"
    deadline = time.monotonic() + 120
    while not any("flwr-serverapp" in p for p in federation_processes(home)) or not (
            (workdir / "logs" / "node0.log").is_file()
            and (workdir / "logs" / "node0.log").read_text(errors="replace").count("Received successfully") >= 4):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err
    assert "focusfl: interrupted" in err and "Traceback" not in err, err
    assert len([line for line in err.splitlines() if line.strip()]) == 1, err
    deadline = time.monotonic() + 3
    while federation_processes(home) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert federation_processes(home) == []
    info = json.loads((out / "config.json").read_text())
    done = info["rounds_done"]
    assert info["status"] == "interrupted" and 1 <= done < 20000 and f"the {done} rounds done are in {out}" in err
    assert json.loads((out / "federation.json").read_text())["interrupted"] == "SIGTERM"  # as focusfl stops it
    with open(out / "metrics.csv") as handle:
        assert int(list(csv.DictReader(handle))[-1]["round"]) == done
    replay = run_to_folder(config_from_json(info), tmp_path / "replay", checkpoint_every=0)
    assert replay.rounds_done == done
    assert_same_model(out, tmp_path / "replay")

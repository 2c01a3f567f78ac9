"""Stragglers and deadlines in federations (issue 20, item 3), and the work trace that replays them.

- In process (FakeGrid, the real ClientApp): a node whose deadline is 0 s stops every round
  after one local step; the server accepts that partial work; the realized counts, replayed
  with the reference engine through ``trace:path=`` work and ``trace:path=`` participation,
  give the federation's model bit for bit, for every algorithm that honours step counts.
  A federation with a work process asks each node for the simulator's tau_i,r (keyed draws),
  so it equals the simulator run with that work process, without any trace.
- On loopback (slow): ``focusfl federation local --deadline 1=0`` as a user types it, then
  ``focusfl run --work trace:path=RUN/work.csv``: the same model.pt bits.
"""
from __future__ import annotations

import csv
import dataclasses
import json

import numpy as np
import pytest
import torch

pytest.importorskip("flwr", reason="Flower is not installed (pip install 'focusfl[flower]')")

from cli_harness import run_cli, run_main  # noqa: E402
from focusfl.algorithms import ALGORITHMS, make_algorithm  # noqa: E402
from focusfl.engine import simulate  # noqa: E402
from focusfl.errors import ConfigError  # noqa: E402
from focusfl.flower.client_app import make_client_app  # noqa: E402
from focusfl.flower.deadline import node_deadline, parse_deadlines  # noqa: E402
from focusfl.flower.codec import Malformed  # noqa: E402
from focusfl.flower.strategy import AlgorithmStrategy  # noqa: E402
from focusfl.flower.testing import FakeGrid, Faults  # noqa: E402
from focusfl.participation import make_participation  # noqa: E402
from focusfl.problems import make_problem  # noqa: E402
from focusfl.work import make_work  # noqa: E402
from focusfl.work import trace as work_trace  # noqa: E402

pytestmark = pytest.mark.flower

PROBLEM = "ridge:clients=4,dim=4,samples=20"
PARTIAL = ["fedavg", "fednova", "focus", "scaffold"]  # the algorithms that honour per-client step counts
TAU = 3


def federate(name, *, rounds=6, participation="bernoulli", work=None, deadlines=None, faults=None):
    """The strategy over in-process nodes; ``deadlines``: {client: seconds} of its node."""
    problem = make_problem(PROBLEM)
    algorithm = make_algorithm(name, local_steps=TAU)
    algorithm = dataclasses.replace(algorithm, lr=algorithm.auto_lr(problem.smoothness(), problem.num_clients))
    process = None if participation is None else make_participation(participation, problem.num_clients, seed=0)
    process_work = None if work is None else make_work(work, problem.num_clients, TAU, seed=0)
    strategy = AlgorithmStrategy(algorithm, problem, rounds=rounds, participation=process, work=process_work, seed=0)
    grid = FakeGrid(make_client_app(), [], faults=faults or Faults())
    for client in range(problem.num_clients):
        extra = {} if client not in (deadlines or {}) else {"deadline": deadlines[client]}
        grid.add_node(client, **extra)
    return strategy, strategy.start(grid), problem


def write_traces(folder, result):
    """trace.csv and work.csv as the ServerApp writes them."""
    mask = folder / "trace.csv"
    np.savetxt(mask, result.mask.astype(int), fmt="%d", delimiter=",")
    rows = [(r, c, int(result.work[r, c])) for r, c in zip(*np.nonzero(result.work))]
    work = folder / "work.csv"
    work.write_text(work_trace.trace_text(rows))
    return mask, work


def assert_same(a, b):
    for name, x, y in zip(a._fields, a, b):
        assert x.dtype == y.dtype and x.shape == y.shape, name
        assert torch.equal(x, y), f"{name} differs by {float((x - y).abs().max())}"


@pytest.mark.parametrize("name", PARTIAL)
def test_a_node_past_its_deadline_sends_partial_work_that_replays_exactly(tmp_path, name):
    strategy, result, problem = federate(name, participation="full", deadlines={1: 0.0},
                                         faults=Faults({"drop_reply": 0.2}, seed=3))
    accepted = result.mask
    assert accepted[:, 1].sum() >= 2 and 0 < accepted.sum() < accepted.size
    # The 0 s node stops after its first step, every round; the others do all tau steps.
    assert (result.work[accepted[:, 1], 1] == 1).all()
    others = accepted.copy()
    others[:, 1] = False
    assert (result.work[others] == TAU).all() and (result.work[~accepted] == 0).all()
    assert result.partial == int(accepted[:, 1].sum()) and result.deadlines == {1: 0.0}
    mask, work = write_traces(tmp_path, result)
    replayed = simulate(make_algorithm(strategy.algorithm.describe()), problem,
                        make_participation(f"trace:path={mask}", problem.num_clients),
                        rounds=len(accepted), engine="reference", work=make_work(f"trace:path={work}", 4, TAU))
    assert_same(result.server, replayed.state.server)
    assert replayed.rows[-1]["rel_error"] == result.rows[-1]["rel_error"]
    # Without the recorded counts (every client tau steps) the replay is another model.
    plain = simulate(make_algorithm(strategy.algorithm.describe()), problem,
                     make_participation(f"trace:path={mask}", problem.num_clients),
                     rounds=len(accepted), engine="reference")
    assert not torch.equal(plain.state.server.x, result.server.x)


@pytest.mark.parametrize("work", ["uniform", "rates:r=0.34;1;0.67;1"])
def test_a_federation_with_a_work_process_asks_for_the_simulators_counts(work):
    """Keyed draws: the server asks client i for the simulator's tau_i,r, so the federation is
    the simulator's run with that work process (no trace needed); with a 0 s deadline on one
    node, that node takes 1 step of the tau_i,r it is asked for."""
    strategy, result, problem = federate("focus", participation="full", work=work)
    process = make_work(work, problem.num_clients, TAU, seed=0)
    every = torch.arange(problem.num_clients)
    expected = np.stack([process.steps(r, every).numpy() for r in range(6)])
    assert (result.work == expected).all() and result.partial == 0
    run = simulate(make_algorithm(strategy.algorithm.describe()), problem, make_participation("full", 4),
                   rounds=6, engine="reference", work=make_work(work, 4, TAU, seed=0))
    assert_same(result.server, run.state.server)
    _, cut, _ = federate("focus", participation="full", work=work, deadlines={2: 0.0})
    expected[:, 2] = 1
    assert (cut.work == expected).all()
    assert cut.partial == int((process.table(6)[:, 2] > 1).sum())


def test_unasked_or_impossible_step_counts_are_rejected_as_malformed():
    """A reply that claims 0 steps, or more than it was asked for, is not accepted."""
    strategy, result, problem = federate("fedavg", participation="full", rounds=1)
    entry = result.log[0]
    from flwr.app import ConfigRecord

    for claim in (0, TAU + 1, 1.5, True, None):
        record = ConfigRecord({"round": 0, "client": 0} | ({} if claim is None else {"steps": claim}))
        with pytest.raises(Malformed, match="local steps"):
            strategy._steps_done(entry, 0, record)
    assert strategy._steps_done(entry, 0, ConfigRecord({"round": 0, "client": 0, "steps": 2})) == 2


def test_node_deadline_and_the_cli_spec_read_strictly():
    assert node_deadline({}) is None and node_deadline({"deadline": 0}) == 0.0
    assert node_deadline({"deadline": "0.25"}) == 0.25
    for bad in (-1, "soon", float("nan"), True):
        with pytest.raises(Malformed, match="deadline"):
            node_deadline({"deadline": bad})
    assert parse_deadlines("0.5", 3) == {0: 0.5, 1: 0.5, 2: 0.5}
    assert parse_deadlines("1=0,node2=1.5", 3) == {1: 0.0, 2: 1.5}
    for bad, why in (("", "give SECONDS"), ("-1", "seconds >= 0"), ("3=1", "does not exist"),
                     ("1=1,1=2", "twice"), ("x=1", "NODE=SECONDS"), ("1=inf", "seconds >= 0")):
        with pytest.raises(ConfigError, match=why):
            parse_deadlines(bad, 3)


def test_federation_local_refuses_bad_deadlines_before_starting_anything(tmp_path):
    common = ["federation", "local", "--nodes", "2", "--problem", "ridge:clients=2,dim=3", "--local-steps", "2",
              "--workdir", str(tmp_path / "fed")]
    cases = [(["--deadline", "2=0.5"], "node 2 does not exist"), (["--deadline", "soon"], "is not a number of seconds")]
    whole = [name for name, cls in ALGORITHMS.items() if not cls.partial_work and cls.alias_of is None]
    if whole:  # an algorithm that cannot stop a client early refuses deadlines and work processes
        cases += [(["--deadline", "0", "--algorithm", whole[0]], f"{whole[0]} cannot take partial work"),
                  (["--work", "uniform", "--algorithm", whole[0]], "not supported")]
    for k, (extra, why) in enumerate(cases):  # the first through the console script, the others in this process
        result = (run_cli if k == 0 else run_main)(*common, *extra)
        assert result.returncode == 2, (extra, result.stderr)
        assert why in result.stderr and result.stderr.strip().count("\n") == 0, result.stderr
    assert not (tmp_path / "fed").exists()


def test_federation_app_carries_the_work_spec_to_the_server_app(tmp_path):
    """`focusfl federation app --work SPEC`: the run config the ServerApp reads names the work
    process (a deployment's nodes get their deadline from their own --node-config)."""
    from focusfl.flower.server_app import FederationConfig

    result = run_cli("federation", "app", str(tmp_path / "app"), "--algorithm", "fednova",
                     "--problem", "ridge:clients=3", "--local-steps", "4", "--work", "markov:p=0.5")
    assert result.returncode == 0, result.stderr
    text = (tmp_path / "app" / "run.toml").read_text()
    config = FederationConfig.from_json(json.loads(text.split("=", 1)[1]))
    assert config.work == "markov:p=0.5" and config.local_steps == 4


# -- on loopback, as a user types it ------------------------------------------------------------
@pytest.mark.slow
def test_loopback_deadline_partial_work_and_replay_from_work_csv(tmp_path):
    """Two warm SuperNodes, node 1 with a 0 s deadline: its client takes 1 of 3 steps every
    round and is accepted; work.csv says so; `focusfl run --work trace:path=RUN/work.csv`
    (and config.json) replays the federation's model.pt bit for bit."""
    out = tmp_path / "run"
    spec = ["--algorithm", "fedavg", "--problem", "ridge:clients=2,dim=5", "--local-steps", "3", "--rounds", "3"]
    result = run_cli("federation", "local", "--nodes", "2", *spec, "--participation", "full", "--deadline", "1=0",
                     "--timeout", "30", "--out", str(out), "--workdir", str(tmp_path / "fed"), timeout=240)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    with open(out / "work.csv") as handle:
        rows = [(int(r["round"]), int(r["client"]), int(r["steps"])) for r in csv.DictReader(handle)]
    assert rows == [(r, c, 3 if c == 0 else 1) for r in range(3) for c in range(2)]
    config = json.loads((out / "config.json").read_text())
    assert config["work"]["name"] == "trace" and config["work"]["path"] == str((out / "work.csv").resolve())
    info = json.loads((out / "federation.json").read_text())
    assert info["partial_work"] == 3 and info["deadlines"] == {"1": 0.0} and info["rejections"] == {}
    replay = run_main("run", *spec, "--participation", f"trace:path={out / 'trace.csv'}",
                      "--work", f"trace:path={out / 'work.csv'}", "--engine", "reference",
                      "--out", str(tmp_path / "replay"))
    assert replay.returncode == 0, replay.stderr
    recorded = run_main("run", "--config", str(out / "config.json"), "--out", str(tmp_path / "replay2"))
    assert recorded.returncode == 0, recorded.stderr
    ours = torch.load(out / "model.pt", weights_only=True)["x"]
    for folder in ("replay", "replay2"):
        theirs = torch.load(tmp_path / folder / "model.pt", weights_only=True)["x"]
        assert ours.dtype == theirs.dtype == torch.float64 and torch.equal(ours, theirs), folder

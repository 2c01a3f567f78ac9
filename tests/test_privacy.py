"""Client-level differential privacy (focusfl.privacy, docs/privacy.md): the mechanism around
every algorithm's messages, its noise, replay and resume, the accounting against Google's
dp-accounting recomputed from the run's own participation, and the bad --dp options."""
from __future__ import annotations

import csv
import dataclasses
import json
import math

from typing import NamedTuple

import numpy as np
import pytest
import torch

from cli_harness import assert_one_line_error, run_cli, run_cli_together, run_main
from focusfl.algorithms import ALGORITHMS, make_algorithm
from focusfl.algorithms.base import RoundContext
from focusfl.engine import simulate
from focusfl.engine.tree import gather_rows
from focusfl.errors import ConfigError
from focusfl.participation import make_participation
from focusfl.privacy import (READS_EACH_MESSAGE, DPConfig, central_covers, message_vectors, parse_dp,
                             run_privacy)
from focusfl.privacy.accounting import ORDERS, amplification, library, noise_multiplier
from focusfl.privacy.mechanism import clip_rows, keyed_gaussian, privatize, vector_fields
from focusfl.problems import make_problem

dp_accounting = pytest.importorskip("dp_accounting")
from dp_accounting.rdp import RdpAccountant  # noqa: E402

RIDGE = "ridge:clients=8,dim=6"


class Message(NamedTuple):
    v: torch.Tensor


def _problem(spec: str = RIDGE):
    return make_problem(spec, dtype=torch.float64)


def _message(name: str, problem, participation, rounds: int = 6):
    """``name``'s server state after a few rounds and its message for two active clients."""
    algorithm = make_algorithm(name, lr=0.01).prepare(problem, participation, seed=0)
    state = simulate(algorithm, problem, participation, rounds, eval_every=None).state
    active = torch.tensor([1, 3])
    ctx = RoundContext(round=rounds, active=active, num_clients=problem.num_clients)
    _, message = algorithm.client_round(state.server, gather_rows(state.clients, active),
                                        problem.oracle(active, seed=0, round=rounds), ctx)
    return algorithm, state, message, ctx


# -- the mechanism ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_clipping_bounds_every_vector_each_algorithm_sends(name):
    problem = _problem()
    participation = make_participation("bernoulli", problem.num_clients, seed=0, problem=problem)
    algorithm, _, message, ctx = _message(name, problem, participation)
    big = type(message)(*(f * 1e3 if k in vector_fields(message) else f for k, f in enumerate(message)))
    clipped = privatize(DPConfig(clip=0.5, noise=0.0), big, ctx.active, ctx.round, seed=0)
    assert len(vector_fields(message)) == message_vectors(algorithm)  # what the accountant assumes
    for k, (before, after) in enumerate(zip(big, clipped)):
        if k in vector_fields(message):
            assert float(after.flatten(1).norm(dim=1).max()) <= 0.5 * (1 + 1e-12)
        else:  # per-client scalars (push-sum's weight, FedNova's tau) carry no data: untouched
            assert torch.equal(before, after)


def test_rows_within_the_clip_norm_are_left_bit_for_bit():
    rows = torch.tensor([[0.3, 0.4], [3.0, 4.0]], dtype=torch.float64)
    clipped = clip_rows(rows, 1.0)
    assert torch.equal(clipped[0], rows[0])
    assert torch.allclose(clipped[1], torch.tensor([0.6, 0.8], dtype=torch.float64))


@pytest.mark.parametrize("mode", ["local", "central"])
def test_noise_has_the_stated_scale(mode):
    """Zero messages of 8 clients x 20,000 coordinates: each row's noise has sd sigma C (local)
    or sigma C / sqrt(n) (central: the sum has sigma C); mean 0, Gaussian tails."""
    n, d, clip, sigma = 8, 20_000, 0.7, 1.3
    active = torch.arange(n) * 3
    noised = privatize(DPConfig(clip=clip, noise=sigma, mode=mode), Message(torch.zeros(n, d, dtype=torch.float64)),
                       active, round_=5, seed=11).v
    expected = sigma * clip / (1.0 if mode == "local" else math.sqrt(n))
    assert abs(float(noised.std()) / expected - 1) < 0.01  # 160,000 draws: sd of the ratio ~0.002
    assert abs(float(noised.mean())) < 0.01 * expected
    total = noised.sum(0)
    assert abs(float(total.std()) / (sigma * clip * (math.sqrt(n) if mode == "local" else 1.0)) - 1) < 0.03
    beyond = float((noised.abs() > 2 * expected).double().mean())
    assert abs(beyond - 0.0455) < 0.003  # P(|Z| > 2) of a normal


def test_noise_is_keyed_by_seed_round_client_and_field():
    clients = torch.tensor([2, 5])
    base = keyed_gaussian(0, 3, clients, 0, 50)
    assert torch.equal(base, keyed_gaussian(0, 3, clients, 0, 50))
    assert torch.equal(base[1:], keyed_gaussian(0, 3, clients[1:], 0, 50))  # whoever else is in the batch
    for other in (keyed_gaussian(1, 3, clients, 0, 50), keyed_gaussian(0, 4, clients, 0, 50),
                  keyed_gaussian(0, 3, clients, 1, 50)):
        assert not torch.equal(base, other)


@pytest.mark.parametrize("name", ["focus", "scaffold", "fedavg"])
def test_vectorized_equals_reference_under_dp(name):
    problem = _problem()
    participation = make_participation("bernoulli", problem.num_clients, seed=0, problem=problem)
    algorithm = make_algorithm(name, lr=0.01)
    states = []
    for engine in ("vectorized", "reference"):
        privacy = run_privacy("clip=0.5,noise=0.8,mode=central", algorithm, problem, participation, seed=0,
                              end_round=15)
        states.append(simulate(algorithm, problem, participation, 15, engine=engine, eval_every=None,
                               privacy=privacy).state)
    for a, b in zip(states[0].server, states[1].server):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-12)


def test_central_mode_covers_exactly_the_algorithms_whose_server_reads_only_sums():
    """Moving mass between two clients' vectors leaves a sum-reading server's step unchanged;
    central_covers must say so for every registered algorithm (READS_EACH_MESSAGE stays true)."""
    problem = _problem()
    participation = make_participation("bernoulli", problem.num_clients, seed=0, problem=problem)
    generator = torch.Generator().manual_seed(1)
    reads_each = set()
    for name in ALGORITHMS:
        algorithm, state, message, ctx = _message(name, problem, participation, rounds=12)
        fields = list(message)
        for k in vector_fields(message):
            shift = torch.randn(fields[k].shape[1:], generator=generator, dtype=fields[k].dtype)
            moved = fields[k].clone()
            moved[0] += shift
            moved[1] -= shift
            fields[k] = moved
        base = algorithm.server_round(state.server, message, ctx)
        shifted = algorithm.server_round(state.server, type(message)(*fields), ctx)
        if not all(torch.allclose(a, b, atol=1e-9) for a, b in zip(base, shifted)):
            reads_each.add(name)
        assert central_covers(algorithm) == (name not in reads_each), name
    assert reads_each == READS_EACH_MESSAGE


# -- the record and the command line ------------------------------------------------------------
BAD_DP = {
    "clip=0,noise=1": "clip must be a positive number",
    "clip=1,noise=-1": "noise must be a number >= 0",
    "clip=1,noise=1,target_epsilon=3": "target_epsilon needs delta",
    "clip=1,noise=1,mode=secret": "mode must be central or local",
    "clip=1": "noise is required",
    "clip=1,noise=1,sigma=2": "unknown key 'sigma'",
    "clip=1,noise=1,delta=2": "delta must be a number in (0, 1)",
    "clip=1,noise=nan": "noise must be a number",
    "clip=1,noise=0,delta=1e-5,target_epsilon=1": "needs noise > 0",
    "clip=1,noise=1,clip=2": "given twice",
    "clip": "expected key=value",
}


@pytest.mark.parametrize("spec", BAD_DP)
def test_bad_dp_records(spec):
    with pytest.raises(ConfigError, match=BAD_DP[spec].replace("(", r"\(").replace(")", r"\)")):
        parse_dp(spec)


def test_bad_dp_options_on_the_command_line(tmp_path):
    commands = [("run", "--algorithm", "focus", "--problem", "ridge:clients=4,dim=3", "--rounds", "2", "--dp", spec,
                 "--out", str(tmp_path / f"r{k}")) for k, spec in enumerate(BAD_DP)]
    commands.append(("run", "--algorithm", "fedau", "--problem", "ridge:clients=4,dim=3", "--rounds", "2", "--dp",
                     "clip=1,noise=1", "--out", str(tmp_path / "fedau")))
    commands.append(("tune", "--algorithm", "focus", "--problem", "ridge:clients=4,dim=3", "--rounds", "2",
                     "--dp", "clip=-1,noise=1"))
    experiment = tmp_path / "bad.toml"
    experiment.write_text('algorithms = ["focus"]\nproblems = ["ridge:clients=4,dim=3"]\nrounds = 2\ndp = "clip=1"\n')
    commands.append(("sweep", str(experiment), "--out", str(tmp_path / "sweep")))
    commands.append(("sweep", str(experiment), "--dp", "clip=1,noise=1,mode=secret", "--out", str(tmp_path / "sweep")))
    federation = ("federation", "local", "--nodes", "2", "--problem", "ridge:clients=2,dim=3", "--rounds", "2")
    commands.append((*federation, "--algorithm", "focus", "--dp", "clip=0,noise=1,mode=local", "--out",
                     str(tmp_path / "fed")))
    commands.append((*federation, "--algorithm", "fedau", "--dp", "clip=1,noise=1", "--out", str(tmp_path / "fed")))
    expected = [*BAD_DP.values(), "use mode=local", "clip must be", "noise is required", "mode must be",
                "clip must be", "use mode=local"]
    # run --dp in this process (run_main: its console script runs below); tune's, sweep's and the
    # federation's --dp through the console script, started together.
    runs = len(BAD_DP) + 1
    results = [run_main(*command) for command in commands[:runs]] + run_cli_together(commands[runs:])
    for proc, contains in zip(results, expected, strict=True):
        assert_one_line_error(proc, 2, contains)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.toml"]


def test_without_the_library_a_dp_run_says_how_to_install(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "dp_accounting", None)
    with pytest.raises(ConfigError, match=r"pip install 'focusfl\[privacy\]'"):
        library()


# -- runs: replay, resume, accounting -----------------------------------------------------------
def _rows(folder) -> list[dict]:
    with open(folder / "metrics.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def _run(tmp_path, name, *extra, participation="bernoulli", dp="clip=0.5,noise=1.1,mode=central,delta=1e-5",
         rounds="12"):
    return ("run", "--algorithm", "focus", "--problem", "ridge:clients=8,dim=5", "--participation", participation,
            "--rounds", rounds, "--dp", dp, "--out", str(tmp_path / name), *extra)


def test_same_bytes_on_rerun_and_after_resume(tmp_path):
    # the first run as a user types it, the others in this process (run_main)
    first = run_cli(*_run(tmp_path, "a"))
    again, short = run_main(*_run(tmp_path, "b")), run_main(*_run(tmp_path, "c", rounds="5"))
    for proc in (first, again, short):
        assert proc.returncode == 0, proc.stderr
    resumed = run_main("run", "--resume", str(tmp_path / "c"), "--rounds", "12")
    assert resumed.returncode == 0, resumed.stderr
    for name in ("b", "c"):
        assert (tmp_path / name / "metrics.csv").read_bytes() == (tmp_path / "a" / "metrics.csv").read_bytes()
        assert (tmp_path / name / "model.pt").read_bytes() == (tmp_path / "a" / "model.pt").read_bytes()
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    assert config["dp"] == {"clip": 0.5, "noise": 1.1, "mode": "central", "delta": 1e-5}
    assert "privacy: client" in first.stdout


def test_dp_is_part_of_the_run_identity():
    from focusfl.runs.config import RunConfig
    from focusfl.runs.driver import build

    plain = build(RunConfig(problem=RIDGE, rounds=3))
    noised = build(RunConfig(problem=RIDGE, rounds=3, dp="clip=1,noise=1"))
    reordered = build(RunConfig(problem=RIDGE, rounds=3, dp="noise=1,clip=1,mode=central"))
    none = build(RunConfig(problem=RIDGE, rounds=3, dp="none"))
    assert plain.key == none.key != noised.key == reordered.key


def _library_epsilons(mask: np.ndarray, multiplier: float, delta: float, rates: np.ndarray | None) -> np.ndarray:
    """Each client's epsilon by the library's own accountant, from the realised participation."""
    out = []
    for i, joined in enumerate(mask.sum(axis=0)):
        gaussian = dp_accounting.GaussianDpEvent(multiplier)
        eps = RdpAccountant(list(ORDERS)).compose(dp_accounting.SelfComposedDpEvent(gaussian, int(joined))).get_epsilon(
            delta) if joined else 0.0
        if rates is not None:
            sampled = dp_accounting.PoissonSampledDpEvent(float(rates[i]), gaussian)
            eps = min(eps, RdpAccountant(list(ORDERS)).compose(
                dp_accounting.SelfComposedDpEvent(sampled, mask.shape[0])).get_epsilon(delta))
        out.append(eps)
    return np.array(out)


@pytest.mark.parametrize("participation, algorithm, amplified", [
    ("bernoulli", "focus", True), ("markov", "focus", False), ("bernoulli", "scaffold", True)])
def test_epsilon_equals_the_librarys_for_the_realised_participation(tmp_path, participation, algorithm, amplified):
    args = list(_run(tmp_path, "r", participation=participation))
    args[args.index("focus")] = algorithm
    proc = run_main(*args)
    assert proc.returncode == 0, proc.stderr
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    problem = _problem("ridge:clients=8,dim=5")
    process = make_participation(config["participation"], 8, seed=0, problem=problem)
    rows = _rows(tmp_path / "r")
    vectors = 2 if algorithm == "scaffold" else 1
    for row in rows[1:]:
        mask = process.rows(0, int(row["round"]))
        rates = process.nominal_p() if amplified else None
        eps = _library_epsilons(mask, noise_multiplier(1.1, vectors), 1e-5, rates)
        assert float(row["epsilon_max"]) == pytest.approx(eps.max(), rel=1e-9)
        assert float(row["epsilon_median"]) == pytest.approx(float(np.median(eps)), rel=1e-9)
        assert int(row["epsilon_client"]) == int(eps.argmax())


def test_no_amplification_for_markov_or_a_trace_or_local_mode(tmp_path):
    problem = _problem()
    markov = make_participation("markov", 8, seed=0, problem=problem)
    path = tmp_path / "trace.npy"
    recorded = np.zeros((8, 8), dtype=np.int8)
    recorded[:, 0] = 1  # client 0 every round, the others twice or once
    recorded[np.arange(8), np.arange(8)] = 1
    recorded[np.arange(4), np.arange(4) + 4] = 1
    np.save(path, recorded)
    trace = make_participation(f"trace:path={path}", 8, seed=0, problem=problem)
    bernoulli = make_participation("bernoulli", 8, seed=0, problem=problem)
    assert amplification(markov, "central").kind == "none"
    assert amplification(trace, "central").kind == "none"
    assert amplification(bernoulli, "local").kind == "none"
    assert amplification(bernoulli, "central").kind == "poisson"
    # ...and what a trace run reports is the plain composition over the rounds each client joined
    proc = run_main(*_run(tmp_path, "t", participation=f"trace:path={path}", rounds="8"))
    assert proc.returncode == 0, proc.stderr
    last = _rows(tmp_path / "t")[-1]
    mask = trace.rows(0, 8)
    assert float(last["epsilon_max"]) == pytest.approx(_library_epsilons(mask, 1.1, 1e-5, None).max(), rel=1e-9)


def test_target_epsilon_stops_the_run_before_a_client_exceeds_it(tmp_path):
    proc = run_main(*_run(tmp_path, "s", dp="clip=0.5,noise=1.1,mode=local,delta=1e-5,target_epsilon=6",
                          participation="markov", rounds="60"))
    assert proc.returncode == 0, proc.stderr
    assert "privacy budget exhausted" in proc.stdout
    config = json.loads((tmp_path / "s" / "config.json").read_text())
    assert config["status"] == "budget_exhausted" and config["rounds_done"] < 60
    assert "would take client" in config["stopped"]
    rows = _rows(tmp_path / "s")
    assert max(float(r["epsilon_max"]) for r in rows) <= 6
    # one more round by the client named would have gone beyond the target
    client = int(config["stopped"].split("client ")[1].split()[0])
    mask = make_participation(config["participation"], 8, seed=0, problem=_problem("ridge:clients=8,dim=5")).rows(
        0, config["rounds_done"] + 1)
    assert mask[-1, client]
    assert _library_epsilons(mask, 1.1, 1e-5, None)[client] > 6


def test_dp_on_sweep_and_a_federation(tmp_path):
    experiment = tmp_path / "e.toml"
    experiment.write_text('algorithms = ["focus", "fedavg"]\nproblems = ["ridge:clients=4,dim=3"]\nrounds = 3\n')
    # Local mode: the nodes noise their own messages, with the simulation's keyed noise, so the
    # federation's rows are those of `focusfl run` with the same options (every request answered).
    local = ("--algorithm", "scaffold", "--problem", "ridge:clients=3,dim=3", "--rounds", "4", "--participation",
             "bernoulli", "--dp", "clip=0.5,noise=0.8,mode=local,delta=1e-5")
    # Node owners' floors on local noise (--dp-min-noise): 0.5 under the local run's sigma 0.8
    # changes nothing; node 2 of the central-mode federation (its messages would leave bare)
    # refuses at the handshake, and its client never takes part.
    # The federations through the console script; sweep and run (launched so elsewhere) in this
    # process, which saves two interpreters' start-up.
    federation, local_federation = run_cli_together([
        ("federation", "local", "--nodes", "3", "--algorithm", "focus", "--problem", "ridge:clients=3,dim=3",
         "--rounds", "3", "--dp-min-noise", "2=0",
         "--dp", "clip=1,noise=0.5,delta=1e-5", "--out", str(tmp_path / "fed")),
        ("federation", "local", "--nodes", "3", *local, "--dp-min-noise", "0.5", "--out", str(tmp_path / "fed-local")),
    ], timeout=600)
    sweep = run_main("sweep", str(experiment), "--out", str(tmp_path / "sw"), "--dp", "clip=1,noise=0.5,delta=1e-5")
    local_run = run_main("run", *local, "--out", str(tmp_path / "run-local"))
    assert local_federation.returncode == 0 and local_run.returncode == 0, local_federation.stderr + local_run.stderr
    assert json.loads((tmp_path / "fed-local" / "config.json").read_text())["dp"]["mode"] == "local"
    assert json.loads((tmp_path / "fed-local" / "federation.json").read_text())["rejections"] == {}
    federated, simulated = _rows(tmp_path / "fed-local"), _rows(tmp_path / "run-local")
    assert len(federated) == len(simulated) == 5
    for key in ("round", "loss", "rel_error", "epsilon_max", "epsilon_median", "epsilon_client"):
        assert [r[key] for r in federated] == [r[key] for r in simulated], key
    assert sweep.returncode == 0, sweep.stderr
    configs = [json.loads(p.read_text()) for p in (tmp_path / "sw").rglob("config.json")]
    assert configs and all(c["dp"]["noise"] == 0.5 for c in configs)
    assert federation.returncode == 0, federation.stderr
    fed = tmp_path / "fed"
    assert json.loads((fed / "config.json").read_text())["dp"]["clip"] == 1
    refused = [line for line in federation.stdout.splitlines() if "refused at the handshake" in line]
    assert len(refused) == 1 and refused[0].startswith("audit: node "), federation.stdout
    assert "dp-min-noise=0 accepts only local DP" in refused[0] and "malformed malformed" not in refused[0]
    assert len(json.loads((fed / "federation.json").read_text())["audit"]["refused_nodes"]) == 1
    with open(fed / "trace.csv") as handle:
        assert {row["client2"] for row in csv.DictReader(handle)} == {"0"}  # node 2's client never joined
    assert "epsilon_max" in _rows(fed)[-1]
    # the federation's replay (config.json on its realised trace) gives its bytes again
    replay = run_main("run", "--config", str(fed / "config.json"), "--out", str(tmp_path / "replay"))
    assert replay.returncode == 0, replay.stderr
    replayed = _rows(tmp_path / "replay")
    for key in ("round", "loss", "epsilon_max", "epsilon_median", "epsilon_client"):
        assert [r[key] for r in replayed] == [r[key] for r in _rows(fed)], key


def test_bad_floors_on_local_noise_are_one_line(tmp_path):
    """`federation local --dp-min-noise` with a floor that is not one: one line before anything
    starts (the floor at work, through the entry point: test_dp_on_sweep_and_a_federation)."""
    pytest.importorskip("flwr")
    common = ["federation", "local", "--nodes", "2", "--problem", "ridge:clients=2,dim=3", "--rounds", "2",
              "--dp", "clip=1,noise=0.5,mode=local", "--workdir", str(tmp_path / "bad")]
    for floor, reason in (("-1", "'-1' is not a noise multiplier (sigma) >= 0"), ("nan", "'nan' is not a noise"),
                          ("abc", "'abc' is not a noise"), ("2=1", "node 2 does not exist")):
        assert_one_line_error(run_main(*common, "--dp-min-noise", floor), 2,
                              contains=f"--dp-min-noise: {reason}")
    assert not (tmp_path / "bad").exists()


# -- the study ----------------------------------------------------------------------------------
def test_calibrated_sigma_spends_the_budget_on_the_most_spending_client():
    from focusfl.experiments.privacy_study import calibrated_sigma
    from focusfl.privacy.accounting import Accountant

    problem = _problem()
    for name in ("markov", "bernoulli"):
        process = make_participation(name, 8, seed=0, problem=problem)
        counts = process.rows(0, 50).sum(axis=0)
        amp = amplification(process, "central")
        sigma = calibrated_sigma(counts, 50, 4.0, 1e-5, 2, amp)
        spent = Accountant(noise_multiplier(sigma, 2), 1e-5, amp, 8).epsilons(counts, 50).max()
        assert 4.0 * 0.98 < spent <= 4.0


def test_the_privacy_study_section_judges_its_claim_from_its_runs():
    from focusfl.experiments.privacy_study import EXACT_UNDER_DP, privacy_section

    section = privacy_section(quick=True)
    assert [c.where for c in section.claims] == ["local DP"]
    assert section.claims[0].verdict.name == EXACT_UNDER_DP.name
    assert "| local | markov | 8 |" in section.text[1] and "| none | bernoulli | ∞ |" in section.text[1]
    assert "MNIST half of the study was skipped" in section.text[-1]


def test_the_studys_runs_in_batches_are_the_runs_alone(monkeypatch):
    """The study's runs go through the batches of runs (the report's --batch-runs): the same rows
    as one at a time, and auto really stacks several runs."""
    from focusfl.experiments import sweep
    from focusfl.experiments.privacy_study import QUICK_PRIVACY, study_rows

    sizes = dataclasses.replace(QUICK_PRIVACY, rounds=12, seeds=1)
    groups, execute_batch = [], sweep.execute_batch
    monkeypatch.setattr(sweep, "execute_batch", lambda runs: groups.append(len(runs)) or execute_batch(runs))
    alone = study_rows(sizes, 1)
    assert set(groups) == {1}
    groups.clear()
    assert study_rows(sizes, "auto") == alone and max(groups) > 1


def test_the_mnist_half_of_the_study_runs_end_to_end_on_digits(monkeypatch):
    """The quick MNIST study on the test digits: its runs, its table of test accuracies and its
    claim, judged by its own criterion from those runs (the ridge half is stubbed here: the test
    above runs it)."""
    from pathlib import Path

    from focusfl.experiments import privacy_study
    from focusfl.experiments.privacy_study import (EXACT_UNDER_DP_ACCURACY, MNIST_ALGORITHMS, claim_values,
                                                   mnist_sizes, study_rows)

    digits = Path(__file__).resolve().parent / "fixtures" / "mnist1500.npz"
    sizes = mnist_sizes(str(digits), quick=True)
    rows = study_rows(sizes)
    assert {r["algorithm"] for r in rows} == set(MNIST_ALGORITHMS)
    assert {(r["mode"], r["budget"]) for r in rows} == {("none", math.inf), ("local", 8.0)}
    assert all(0 <= r["final"] <= 1 for r in rows)  # test accuracies
    private = [r for r in rows if r["mode"] == "local"]
    assert all(r["epsilon_max"] <= 8.0 * 1.001 for r in private)  # the budget is spent, not exceeded
    assert max(r["epsilon_max"] for r in private) > 8.0 * 0.95
    monkeypatch.setattr(privacy_study, "study_rows", lambda s, batch_runs="auto": rows if s == sizes else _ridge_stub(s))
    section = privacy_study.privacy_section(quick=True, data=str(digits))
    mnist = [c for c in section.claims if c.where.endswith("MNIST")]
    assert [c.where for c in mnist] == ["local DP, MNIST"]
    verdict = mnist[0].verdict
    assert verdict.name == EXACT_UNDER_DP_ACCURACY.name
    assert verdict == EXACT_UNDER_DP_ACCURACY.judge(claim_values(rows, "local", sizes=sizes), quick=True)
    assert "mnist1500.npz" in mnist[0].ran and "| local | markov | 8 |" in section.text[-1]
    assert "| mode | participation | epsilon | sg_focus | scaffold | fedavg | fedau |" in section.text[-1]


def _ridge_stub(sizes):
    """Rows of a ridge study where every run ended at error 1 (the ridge half's shape, no runs)."""
    from focusfl.experiments.privacy_study import PROCESSES

    return [{"mode": mode, "participation": p, "budget": budget, "algorithm": a, "seed": 0, "sigma": None,
             "clip": None, "final": 1.0, "epsilon_max": math.inf}
            for p in PROCESSES for mode, budget in (("none", math.inf), *((m, b) for m in sizes.modes
                                                                            for b in sizes.budgets))
            for a in sizes.algorithms]


def test_the_worked_example_of_the_docs_runs_as_written(tmp_path):
    from test_docs import ROOT, _commands, _markdown_texts

    commands = [c for _, text, whole in _markdown_texts(ROOT / "docs" / "privacy.md") if whole
                for c in _commands(text)]
    assert len(commands) == 2
    private, budget = (run_cli(*command, cwd=tmp_path) for command in commands)
    assert private.returncode == 0 and budget.returncode == 0, private.stderr + budget.stderr
    assert "privacy: client" in private.stdout
    assert "stopped: privacy budget exhausted" in budget.stdout and "beyond epsilon 8" in budget.stdout
    assert json.loads((tmp_path / "runs" / "budget" / "config.json").read_text())["status"] == "budget_exhausted"

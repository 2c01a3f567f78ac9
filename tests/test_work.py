"""Work processes (focusfl.work) and algorithms whose clients take different numbers of steps.

A work process gives each active client its number of local steps tau_i,r in 1..tau. The
checks: the processes' draws (range, keyed randomness, bad specs); a fixed process is today's
run byte for byte; a batched round with step counts equals each client run alone with its own
tau_i (the published meaning of a short client); vectorized == reference in float64; every
tracking invariant (FOCUS's y = sum_i g_prev_i, FedSUM's v = sum_j c_j, ...) under every work
process; FedNova == FedAvg when every tau_i is equal; ProxSkip's random_steps refuses step
counts. Every algorithm of the registry honours step counts, so each check runs over all of them.
"""
import dataclasses

import pytest
import torch

from focusfl.algorithms import ALGORITHMS, RoundContext, make_algorithm
from focusfl.algorithms.fedsum_b import FedSumB
from focusfl.algorithms.proxskip import ProxSkip
from focusfl.engine import simulate
from focusfl.engine.tree import gather_rows
from focusfl.errors import ConfigError
from focusfl.participation import make_participation
from focusfl.problems import make_problem
from focusfl.work import make_work

RIDGE = "ridge:clients=6,samples=12,dim=5,hetero=0.5"
RIDGE_SGD = RIDGE + ",batch=4"
TAU = 4
PARTIAL = [name for name, cls in ALGORITHMS.items() if cls.partial_work]
TRACKING = [name for name, cls in ALGORITHMS.items() if cls.tracking is not None]
# Variants whose client round takes another path: ProxSkip's adaptations and pull, MIFA's notebook rule.
VARIANTS = [(name, {}) for name in PARTIAL] + [
    ("proxskip", {"partial": "plain"}), ("proxskip", {"partial": "deferred"}), ("proxskip", {"pull": True}),
    ("mifa", {"notebook": True}), ("fedavg", {"weighting": "all", "server_lr": 0.5}),
]
WORKS = ["uniform", "rates", "rates:r=0.25;0.5;1;1;0.75;0.3", "markov:p=0.5,rho=0.5"]


def _run(name, problem, participation, work, engine="vectorized", rounds=8, **hyper):
    algorithm = make_algorithm(name, lr=hyper.pop("lr", 2e-3), local_steps=TAU, **hyper)
    return simulate(algorithm, problem, participation, rounds, seed=3, engine=engine, work=work)


def _alone(algorithm, k):
    """The algorithm as a client that is asked for k steps only. Where the nominal tau enters
    more than the loop count it is kept: the FedSUM family's server step gamma * eta * tau (and
    FedSUM-CR's chat_i, which divides by it) and ProxSkip's p = 1/tau."""
    if isinstance(algorithm, FedSumB):
        return dataclasses.replace(algorithm, local_steps=k, server_lr=algorithm.server_lr * algorithm.local_steps / k)
    if isinstance(algorithm, ProxSkip):
        return _NominalP(**{**algorithm.hyperparameters(), "local_steps": k})
    return dataclasses.replace(algorithm, local_steps=k)


class _NominalP(ProxSkip):
    p = property(lambda self: 1.0 / TAU)


def _states_equal(a, b, tol=None):
    for part_a, part_b in zip(a, b):
        for field_a, field_b in zip(part_a, part_b):
            if tol is None:
                assert torch.equal(field_a, field_b)
            else:
                torch.testing.assert_close(field_a, field_b, rtol=tol, atol=tol)


# -- the processes ------------------------------------------------------------------------------
def test_every_algorithm_honours_step_counts():
    assert PARTIAL == list(ALGORITHMS)
    assert set(TRACKING) == {"focus", "sg_focus", "fedsum_b", "fedsum", "fedsum_cr", "feddyn", "fedlaavg"}


@pytest.mark.parametrize("spec", ["fixed", *WORKS])
def test_counts_are_in_range_keyed_and_rebuildable(spec):
    work = make_work(spec, 6, TAU, seed=5)
    table = work.table(40)
    assert table.dtype == torch.int64 and table.shape == (40, 6)
    assert int(table.min()) >= 1 and int(table.max()) <= TAU
    # A client's count does not depend on who else is active, nor on the order rounds are asked.
    for r in (7, 3, 39, 0):
        assert torch.equal(work.steps(r, torch.tensor([1, 4])), table[r, [1, 4]])
        assert torch.equal(work.steps(r, torch.zeros(0, dtype=torch.int64)), table[r, :0])
    rebuilt = make_work(work.describe(), 6, TAU, seed=5)
    assert torch.equal(rebuilt.table(40), table)


def test_uniform_covers_every_count_and_fixed_is_tau():
    table = make_work("uniform", 1000, TAU, seed=1).table(20)
    assert sorted(table.unique().tolist()) == list(range(1, TAU + 1))
    for k in range(1, TAU + 1):  # 20,000 draws: a frequency's standard error is about 0.003
        assert abs((table == k).double().mean().item() - 1 / TAU) < 0.015
    assert (make_work("fixed", 5, TAU).table(3) == TAU).all() and make_work("fixed", 5, TAU).fixed


def test_rates_and_markov_slow_devices():
    assert make_work("rates:r=0.25;1", 2, 8).table(2).tolist() == [[2, 8], [2, 8]]
    markov = make_work("markov:p=0.3,rho=0.9,slow=0.5", 200, 8, seed=2)
    table = markov.table(60)
    assert set(table.unique().tolist()) == {4, 8}
    slow = (table == 4).double()
    assert abs(slow.mean().item() - 0.3) < 0.05
    # A device stays slow: the lag-one autocorrelation of the slow indicator is about rho.
    centred = slow - slow.mean()
    lag1 = (centred[1:] * centred[:-1]).mean() / (centred * centred).mean()
    assert abs(lag1.item() - 0.9) < 0.05


@pytest.mark.parametrize(
    "spec",
    ["nope", "uniform:p=1", "rates:r=0", "rates:r=1.5", "rates:r=0.5;1", "rates:r=x", "markov:rho=1",
     "markov:p=2", "markov:slow=0", "", "uniform:x", {"p": 1}],
)
def test_bad_work_specs_are_one_line_config_errors(spec):
    with pytest.raises(ConfigError) as info:
        make_work(spec, 6, TAU)
    assert "\n" not in str(info.value)


def test_bad_sizes_are_config_errors():
    for args in ((0, TAU), (6, 0), (6, 1.5)):
        with pytest.raises(ConfigError):
            make_work("uniform", *args)
    problem = make_problem(RIDGE)
    full = make_participation("full", problem.num_clients)
    with pytest.raises(ConfigError, match="clients"):
        _run("fedavg", problem, full, make_work("uniform", 5, TAU))
    with pytest.raises(ConfigError, match="steps"):
        _run("fedavg", problem, full, make_work("uniform", 6, TAU + 1))


# -- algorithms ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", PARTIAL)
def test_fixed_work_is_todays_run_byte_for_byte(name):
    problem = make_problem(RIDGE_SGD)
    process = make_participation("bernoulli:p=0.4", problem.num_clients, seed=3)
    today = _run(name, problem, process, None)
    fixed = _run(name, problem, process, make_work("fixed", problem.num_clients, TAU, seed=3))
    _states_equal(today.state, fixed.state)
    assert [r["rel_error"] for r in today.rows] == [r["rel_error"] for r in fixed.rows]


@pytest.mark.parametrize("name,hyper", VARIANTS, ids=[f"{n}{h or ''}" for n, h in VARIANTS])
def test_counts_of_tau_match_no_counts_byte_for_byte(name, hyper):
    # rates:r=1 passes step counts (all tau), so the masked loop runs: it is written with the
    # classical loop's arithmetic, so a constant work process gives today's bytes (on CPU).
    problem = make_problem(RIDGE_SGD)
    process = make_participation("bernoulli:p=0.4", problem.num_clients, seed=3)
    today = _run(name, problem, process, None, **hyper)
    full = _run(name, problem, process, make_work("rates:r=1", problem.num_clients, TAU, seed=3), **hyper)
    _states_equal(today.state, full.state)
    assert today.rows == full.rows


@pytest.mark.parametrize("name", PARTIAL)
@pytest.mark.parametrize("k", [1, 3])
def test_everyone_at_k_of_tau_steps_is_the_run_with_k_local_steps(name, k):
    # All tau_i = k (rates r = k/tau) at local_steps = tau is the classical run with local_steps
    # = k (with the nominal-tau parameters kept, _alone): whole runs, bernoulli participation.
    problem = make_problem(RIDGE_SGD)
    process = make_participation("bernoulli:p=0.5", problem.num_clients, seed=3)
    short = _run(name, problem, process, make_work(f"rates:r={k / TAU}", problem.num_clients, TAU, seed=3))
    algorithm = _alone(make_algorithm(name, lr=2e-3, local_steps=TAU), k)
    classical = simulate(algorithm, problem, process, 8, seed=3, engine="vectorized")
    _states_equal(short.state, classical.state, tol=1e-13)


@pytest.mark.parametrize("name,hyper", VARIANTS, ids=[f"{n}{h or ''}" for n, h in VARIANTS])
def test_a_short_client_is_the_client_run_alone_with_its_own_tau(name, hyper):
    # The batched round with counts [1, 3, 2, 4] gives each client what the classical round
    # with local_steps = tau_i gives it alone.
    problem = make_problem(RIDGE_SGD)
    algorithm = make_algorithm(name, lr=2e-3, local_steps=TAU, **hyper).prepare(problem, make_participation("full", 6))
    state = algorithm.init(problem.initial_point(), problem.num_clients)
    # A round first, so that the client state (g_prev, c_i) is not zero.
    active = torch.arange(6)
    from focusfl.engine.vectorized import vectorized_round
    state = vectorized_round(algorithm, state, problem, active, 0, 3)
    active = torch.tensor([0, 2, 3, 5])
    counts = torch.tensor([1, 3, 2, 4])
    ctx = RoundContext(round=1, active=active, num_clients=6, steps=counts)
    rows, message = algorithm.client_round(state.server, gather_rows(state.clients, active),
                                           problem.oracle(active, seed=3, round=1), ctx)
    for k in range(4):
        one = active[k : k + 1]
        alone = _alone(algorithm, int(counts[k]))
        one_rows, one_message = alone.client_round(
            state.server, gather_rows(state.clients, one), problem.oracle(one, seed=3, round=1),
            RoundContext(round=1, active=one, num_clients=6))
        for batched, single in zip((*rows, *message), (*one_rows, *one_message)):
            torch.testing.assert_close(batched[k : k + 1], single, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("name,hyper", VARIANTS, ids=[f"{n}{h or ''}" for n, h in VARIANTS])
@pytest.mark.parametrize("spec", WORKS)
def test_vectorized_matches_reference_under_work(name, hyper, spec, monkeypatch):
    problem = make_problem(RIDGE_SGD)
    process = make_participation("bernoulli:p=0.5", problem.num_clients, seed=3)
    work = make_work(spec, problem.num_clients, TAU, seed=4)
    fast = _run(name, problem, process, work, **hyper)
    slow = _run(name, problem, process, work, engine="reference", **hyper)
    _states_equal(fast.state, slow.state, tol=1e-12)
    # Chunks of clients (the CPU engine's cache blocking) split the counts with the clients.
    monkeypatch.setattr(type(problem), "client_chunk", property(lambda self: 2))
    chunked = _run(name, problem, process, work, **hyper)
    _states_equal(fast.state, chunked.state, tol=1e-12)


@pytest.mark.parametrize("name", TRACKING)
@pytest.mark.parametrize("spec", WORKS)
@pytest.mark.parametrize("participation", ["full", "bernoulli:p=0.3", "markov"])
def test_tracking_holds_under_every_work_process(name, spec, participation):
    problem = make_problem(RIDGE_SGD)
    process = make_participation(participation, problem.num_clients, seed=3)
    work = make_work(spec, problem.num_clients, TAU, seed=4)
    tracking = ALGORITHMS[name].tracking
    result = _run(name, problem, process, work, lr=1e-3, rounds=12)
    y = getattr(result.state.server, tracking.server)
    total = getattr(result.state.clients, tracking.clients).sum(0)
    torch.testing.assert_close(y, total, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["focus", "scaffold"])
@pytest.mark.parametrize("spec", ["uniform", "rates:r=0.25;0.5;1;1;0.75;0.3"])
def test_focus_and_scaffold_stay_exact_under_arbitrary_work(name, spec):
    # Measured (600 rounds, eta = 5e-3, bernoulli p = 0.5): FOCUS and SCAFFOLD reach rel_error
    # ~1e-15 under both work processes; FedAvg stalls at 0.13 and FedNova at 0.2-0.22.
    problem = make_problem(RIDGE)
    process = make_participation("bernoulli:p=0.5", problem.num_clients, seed=3)
    work = make_work(spec, problem.num_clients, TAU, seed=4)
    result = _run(name, problem, process, work, lr=5e-3, rounds=600)
    assert result.rows[-1]["rel_error"] < 1e-12


@pytest.mark.parametrize("weighting", ["active", "all", "known_p"])
def test_fednova_is_fedavg_when_every_tau_is_equal(weighting):
    problem = make_problem(RIDGE_SGD)
    process = make_participation("bernoulli:p=0.4", problem.num_clients, seed=3)
    for work in (None, make_work("rates:r=0.5", problem.num_clients, TAU)):
        nova = _run("fednova", problem, process, work, weighting=weighting, server_lr=0.7)
        avg = _run("fedavg", problem, process, work, weighting=weighting, server_lr=0.7)
        _states_equal(nova.state, avg.state, tol=1e-12)


def test_fednova_differs_from_fedavg_under_unequal_work():
    # FedAvg moves a fast client's way more; FedNova averages normalized updates scaled by tau_eff.
    problem = make_problem(RIDGE)
    process = make_participation("full", problem.num_clients)
    work = make_work("rates:r=0.25;1;1;1;1;1", problem.num_clients, TAU)
    nova = _run("fednova", problem, process, work, rounds=3)
    avg = _run("fedavg", problem, process, work, rounds=3)
    assert (nova.state.server.x - avg.state.server.x).abs().max() > 1e-8


def test_proxskip_random_steps_refuses_step_counts():
    # Its coin draws every round's count already (check_work); every engine refuses, in one line.
    problem = make_problem(RIDGE)
    process = make_participation("full", problem.num_clients)
    for engine in ("vectorized", "reference"):
        with pytest.raises(ConfigError, match="proxskip: random_steps") as info:
            _run("proxskip", problem, process, make_work("uniform", problem.num_clients, TAU), engine=engine,
                 random_steps=True)
        assert "\n" not in str(info.value)
    # ... and a fixed process is accepted: it is today's run.
    _run("proxskip", problem, process, make_work("fixed", problem.num_clients, TAU), rounds=1, random_steps=True)


def test_pushsum_tracking_and_scaffold_invariants_under_work():
    # Push-sum tracking: the network's total y (server + clients) is the sum of the clients'
    # latest gradients; SCAFFOLD: c = mean_j c_j. Neither is a Tracking field (y is split
    # between server and clients; c is a mean), so they are checked here.
    problem = make_problem(RIDGE_SGD)
    process = make_participation("bernoulli:p=0.3", problem.num_clients, seed=3)
    for spec in WORKS:
        work = make_work(spec, problem.num_clients, TAU, seed=4)
        push = _run("pushsum_tracking", problem, process, work, lr=1e-3, rounds=12).state
        torch.testing.assert_close(push.server.y + push.clients.y.sum(0), push.clients.g_prev.sum(0), rtol=0,
                                   atol=1e-12)
        scaffold = _run("scaffold", problem, process, work, lr=1e-3, rounds=12).state
        torch.testing.assert_close(scaffold.server.c, scaffold.clients.c.mean(0), rtol=0, atol=1e-12)


# -- the run configuration and `focusfl run --work` ---------------------------------------------
def test_work_is_a_run_field_recorded_and_read_back(tmp_path):
    import json

    from focusfl.runs.config import RunConfig, config_from_json, run_key
    from focusfl.runs.driver import build, resolved_config
    from focusfl.runs.folder import run_to_folder

    config = RunConfig(algorithm="focus", problem="ridge:clients=6,dim=5,samples=12", participation="bernoulli",
                       rounds=5, work="uniform", lr=1e-3, local_steps=TAU)
    run_to_folder(config, tmp_path / "uniform", checkpoint_every=0)
    recorded = json.loads((tmp_path / "uniform" / "config.json").read_text())
    assert recorded["work"] == {"name": "uniform"}
    replay = config_from_json(recorded)
    assert replay.work == {"name": "uniform"}
    run_to_folder(replay, tmp_path / "replay", checkpoint_every=0)
    assert (tmp_path / "replay" / "metrics.csv").read_bytes() == (tmp_path / "uniform" / "metrics.csv").read_bytes()

    # An old config.json (no "work") loads and means fixed; a fixed run keeps its old run key.
    fixed = resolved_config(build(RunConfig(**{**config.__dict__, "work": "fixed"})))
    assert fixed["work"] == {"name": "fixed"}
    old = {k: v for k, v in fixed.items() if k != "work"}
    assert config_from_json(old).work == "fixed"
    assert run_key(old) == run_key(fixed) != run_key({**fixed, "work": {"name": "uniform"}})


def test_run_cli_takes_work_and_refuses_bad_ones_in_one_line(tmp_path):
    from cli_harness import assert_one_line_error, run_cli

    small = ["--problem", "ridge:clients=4,dim=3,samples=5", "--rounds", "3"]
    proc = run_cli("run", "--algorithm", "scaffold", "--work", "markov:slow=0.5", "--local-steps", "4", *small,
                   "--out", str(tmp_path / "ok"))
    assert proc.returncode == 0, proc.stderr
    assert '"slow": 0.5' in (tmp_path / "ok" / "config.json").read_text()
    for bad, says in (("uniform:x=1", "unknown key"), ("nope", "unknown work"), ("rates:r=0", "outside")):
        assert_one_line_error(run_cli("run", "--algorithm", "focus", "--work", bad, *small,
                                      "--out", str(tmp_path / "bad")), contains=says)
    assert_one_line_error(run_cli("run", "--algorithm", "proxskip:random_steps=1", "--work", "uniform", *small,
                                  "--out", str(tmp_path / "bad")), contains="random_steps")
    assert not (tmp_path / "bad").exists()

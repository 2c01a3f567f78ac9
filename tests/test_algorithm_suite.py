"""The common suite: every registered algorithm, same checks.

Each check is the conformance kit's (focusfl.sweeps.conformance, what `focusfl check` runs on
any algorithm): construction and the record round trip, convergence on easy problems under full
participation, empty rounds, the step-size factor of schedules, the steps a round asks for,
the server step's independence of the message order, a declared tracking invariant, float32,
the communication accounting the simulator writes, and the declared state size. (Vectorized ==
reference loop and resume for every algorithm: tests/test_engines.py.) The tests here add
what is the registry's own: names, summaries, published figures, the exactness claims.
"""
import dataclasses

import pytest
import torch

from focusfl.algorithms import ALGORITHMS, RoundContext, make_algorithm
from focusfl.errors import ConfigError
from focusfl.sweeps import conformance as kit
from focusfl.sweeps.conformance import LOGISTIC, RIDGE, maker_of, steps_asked
from focusfl.participation import make_participation
from focusfl.problems import make_problem

NAMES = list(ALGORITHMS)
# FOCUS's server step is eta times a SUM over clients: its stable eta is N times smaller.
SUMMING = {"focus", "sg_focus"}
# Drift-corrected methods converge exactly under full participation; FedAvg-like ones (and
# any algorithm registered later without a claim here) must at least cut the error tenfold.
EXACT_AT_FULL = {"focus", "sg_focus", "fedsum_b", "fedsum", "fedsum_cr", "scaffold", "amplified_scaffold", "proxskip"}


def step_size(name: str, base: float, num_clients: int) -> float:
    return base / num_clients if name in SUMMING else base


def passes(check: kit.Check) -> None:
    assert check.passed, check.line()


@pytest.fixture(scope="module")
def problems():
    return {"ridge": make_problem(RIDGE), "logistic": make_problem(LOGISTIC)}


# -- construction ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_defaults_construct_and_describe_round_trips(name):
    algorithm = ALGORITHMS[name]()
    assert algorithm.name == name and algorithm.summary
    passes(kit.check_construction(name))


def test_the_exactness_claims_are_the_classes_own():
    """exact_at_full, which `focusfl check` holds to 1e-8, is claimed by exactly the drift-corrected methods."""
    assert {name for name in NAMES if ALGORITHMS[name].exact_at_full} == EXACT_AT_FULL


@pytest.mark.parametrize("name", NAMES)
def test_communication_figures_are_sane_and_counted(name):
    """communication()'s figures, and a run's comm_down / comm_up: 4 rounds x 3 clients x vectors x d."""
    passes(kit.check_communication(maker_of(name)))


def test_published_communication_costs():
    # ALGORITHMS.md sections 3-4: (down, up) per participating client.
    expected = {
        "fedsum_b": (1, 1), "fedsum": (2, 1), "fedsum_cr": (1, 1), "scaffold": (2, 2), "mifa": (1, 1),
        "fedvarp": (1, 1), "fedau": (1, 1), "fedawe": (1, 1), "proxskip": (1, 1), "focus": (1, 1),
        "amplified_scaffold": (2, 2), "fedstale": (1, 1), "fedpbc": (1, 1), "debiasing_fedavg": (1, 1),
    }
    for name, (down, up) in expected.items():
        comm = ALGORITHMS[name]().communication()
        assert (comm.down, comm.up) == (down, up), name
    # Only the table methods keep O(N d) on the server; FedSUM-CR pays one more client vector.
    assert {n for n in NAMES if ALGORITHMS[n]().communication().server_memory_per_client} == {"mifa", "fedvarp",
                                                                                               "fedstale"}
    memory = {name: ALGORITHMS[name]().communication().client_memory for name in ("fedsum", "fedsum_cr")}
    assert memory["fedsum_cr"] == memory["fedsum"] + 1


@pytest.mark.parametrize(
    "spec",
    ["fedsum:server_lr=0", "scaffold:server_lr=-1", "mifa:server_lr=nan", "fedvarp:server_lr=0",
     "fedau:cutoff=0", "fedawe:server_lr=0", "fedsum_b:local_steps=0", "proxskip:random_steps=2",
     "proxskip:coin_seed=-1", "fedsum_cr:lr=0", "fedstale:beta=1.5", "fedstale:beta=-0.1",
     "fedstale:weighting=p", "fedstale:p=2", "fedstale:cutoff=0", "amplified_scaffold:amplification=0",
     "amplified_scaffold:period=0", "amplified_scaffold:period=1.5", "fedpbc:server_lr=0",
     "debiasing_fedavg:server_lr=-1"],
)
def test_invalid_hyperparameters_raise_one_line_config_errors(spec):
    with pytest.raises(ConfigError) as info:
        make_algorithm(spec)
    assert "\n" not in str(info.value)


# -- convergence -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("problem_spec,base_lr", [(RIDGE, 8e-3), (LOGISTIC, 0.5)])
def test_converges_under_full_participation(name, problem_spec, base_lr):
    lr = step_size(name, base_lr, 8)
    passes(kit.check_convergence(maker_of(name), lr, problem_spec, exact=name in EXACT_AT_FULL))


@pytest.mark.parametrize("name", NAMES)
def test_converges_at_its_own_stable_step(name):
    """What `focusfl check` runs: the algorithm's auto_lr on the ridge problem, halved."""
    make = maker_of(name)
    passes(kit.check_convergence(make, kit.stable_lr(make) / 2))


# -- round mechanics ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_empty_round_keeps_client_state_and_messages_are_empty(name):
    passes(kit.check_empty_round(maker_of(name)))


@pytest.mark.parametrize("name", NAMES)
def test_lr_scale_multiplies_every_step_size(name):
    """A round at (lr, lr_scale = 0.5) is a round at (lr / 2, 1): schedules reach every step."""
    passes(kit.check_lr_scale(maker_of(name)))


@pytest.mark.parametrize("name", NAMES)
def test_round_steps_are_the_steps_a_round_asks_for(name):
    """round_steps, the hint by which a problem draws several steps' minibatches together, is
    what the client round asks for: steps 0..k-1, each once (every oracle call a fresh
    minibatch draw), every client doing tau or (work processes) its own count."""
    passes(kit.check_round_steps(maker_of(name)))


@pytest.mark.parametrize("name", NAMES)
def test_server_step_does_not_depend_on_the_message_order(name):
    passes(kit.check_server_order(maker_of(name)))


@pytest.mark.parametrize("name", [n for n in NAMES if ALGORITHMS[n].tracking is not None])
@pytest.mark.parametrize("participation", ["bernoulli", "markov", "cyclic"])
def test_declared_tracking_invariant_holds_every_round(name, participation):
    passes(kit.check_tracking(maker_of(name), participation))


def test_tracking_is_declared_where_the_state_tracks_a_sum():
    assert {n for n in NAMES if ALGORITHMS[n].tracking is not None} >= {"focus", "sg_focus"}
    assert kit.check_tracking(maker_of("fedavg")).passed is None  # not applicable, never a pass


def test_round_steps_of_proxskip_follow_its_coin(problems):
    algorithm = make_algorithm("proxskip", lr=1e-3, local_steps=4, random_steps=True, coin_seed=3)
    counts = set()
    for round_ in range(12):
        ctx = RoundContext(round=round_, active=torch.tensor([0, 2]), num_clients=problems["ridge"].num_clients)
        steps = steps_asked(algorithm, problems["ridge"], ctx)
        assert steps == list(range(algorithm.round_steps(ctx))), round_
        counts.add(len(steps))
    assert len(counts) > 1  # the coin drew several lengths


@pytest.mark.parametrize("name", NAMES)
def test_float32_and_stochastic_gradients_run(name):
    passes(kit.check_float32(maker_of(name), step_size(name, 2e-3, 8)))


# -- ProxSkip's coin ---------------------------------------------------------------------------
def test_proxskip_random_steps_are_geometric_with_mean_one_over_p():
    algorithm = make_algorithm("proxskip:random_steps=true,coin_seed=7", local_steps=4)
    steps = [algorithm.steps_this_round(r) for r in range(600)]
    assert min(steps) >= 1 and max(steps) > 4
    assert abs(sum(steps) / len(steps) - 4.0) < 0.5  # mean 1/p = 4; std of the mean 0.14
    assert steps[:50] == [algorithm.steps_this_round(r) for r in range(50)]  # keyed by (seed, round)
    other = dataclasses.replace(algorithm, coin_seed=8)
    assert steps[:50] != [other.steps_this_round(r) for r in range(50)]


def test_proxskip_coin_seed_defaults_to_the_run_seed(problems):
    process = make_participation("full", 8, seed=5)
    assert make_algorithm("proxskip").prepare(problems["ridge"], process).coin_seed == 5
    assert make_algorithm("proxskip:coin_seed=2").prepare(problems["ridge"], process).coin_seed == 2


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_prepare_keeps_the_algorithm_and_its_name(name):
    # prepare() may fill in problem-dependent values; it must not turn, say, fedavg_known_p
    # into plain fedavg.
    passes(kit.check_prepare(maker_of(name)))


# -- the size of the state, declared from (N, d) -----------------------------------------------------
# Every registered algorithm at its defaults, and the variants whose state differs.
STATE_SPECS = [*NAMES, "mifa:notebook=1"]


@pytest.mark.parametrize("spec", STATE_SPECS)
def test_declared_state_size_is_what_init_allocates(spec):
    passes(kit.check_state_size(maker_of(spec)))


@pytest.mark.parametrize("spec", STATE_SPECS)
def test_declared_state_size_at_a_hundred_thousand_clients(spec):
    """N = 10^5 clients of a 10^6-parameter model: 10^11 floats per table, far beyond memory. The
    formula is checked against init's shapes on the meta device, which allocates nothing; the
    N x d tables are counted, once each."""
    passes(kit.check_state_size_at_scale(maker_of(spec)))


def test_a_state_beyond_memory_is_refused_before_init(monkeypatch):
    from focusfl.algorithms import check_state_size
    import focusfl.limits as limits

    problem = make_problem("ridge:dim=10,clients=8,samples=4")
    monkeypatch.setattr(limits, "available_bytes", lambda: 8 * (8 * 10 + 10))  # x and one table, float64
    check_state_size(make_algorithm("fedavg"), problem)
    check_state_size(make_algorithm("mifa"), problem)
    with pytest.raises(ConfigError, match=r"focus's state for 8 clients x 10 parameters"):
        check_state_size(make_algorithm("focus"), problem)  # x, y and g_prev: one d more

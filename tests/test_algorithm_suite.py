"""The common suite: every registered algorithm, same checks.

Construction and validation, convergence on easy problems under full participation, empty
rounds, the step-size factor of schedules, distinct minibatch draws inside a round, float32,
and the communication accounting the simulator writes. (Vectorized == reference loop for every
algorithm is tests/test_engines.py.)
"""
import dataclasses

import pytest
import torch

from focusfl.algorithms import ALGORITHMS, RoundContext, StateSize, make_algorithm
from focusfl.engine import simulate
from focusfl.engine.tree import gather_rows
from focusfl.engine.vectorized import vectorized_round
from focusfl.errors import ConfigError
from focusfl.participation import make_participation
from focusfl.problems import make_problem

NAMES = list(ALGORITHMS)
RIDGE = "ridge:dim=10,clients=8,samples=20"
LOGISTIC = "logistic:dim=5,clients=8,samples=20,reg=0.1"
# FOCUS's server step is eta times a SUM over clients: its stable eta is N times smaller.
SUMMING = {"focus", "sg_focus"}
# Drift-corrected methods converge exactly under full participation; FedAvg-like ones (and
# any algorithm registered later without a claim here) must at least cut the error tenfold.
EXACT_AT_FULL = {"focus", "sg_focus", "fedsum_b", "fedsum", "fedsum_cr", "scaffold", "amplified_scaffold", "proxskip"}


def step_size(name: str, base: float, num_clients: int) -> float:
    return base / num_clients if name in SUMMING else base


@pytest.fixture(scope="module")
def problems():
    return {"ridge": make_problem(RIDGE), "logistic": make_problem(LOGISTIC)}


# -- construction ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_defaults_construct_and_describe_round_trips(name):
    algorithm = ALGORITHMS[name]()
    assert algorithm.name == name and algorithm.summary
    rebuilt = make_algorithm(algorithm.describe())
    assert rebuilt == algorithm


@pytest.mark.parametrize("name", NAMES)
def test_communication_figures_are_sane(name):
    comm = ALGORITHMS[name]().communication()
    assert comm.down >= 1 and comm.up >= 1
    assert comm.server_memory >= 1 and comm.client_memory >= 0 and comm.server_memory_per_client >= 0


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
@pytest.mark.parametrize("problem_name,base_lr", [("ridge", 8e-3), ("logistic", 0.5)])
def test_converges_under_full_participation(problems, name, problem_name, base_lr):
    problem = problems[problem_name]
    algorithm = make_algorithm(name, lr=step_size(name, base_lr, problem.num_clients), local_steps=2)
    result = simulate(algorithm, problem, make_participation("full", problem.num_clients), 150, eval_every=150)
    final = result.rows[-1]["rel_error"]
    assert result.diverged_at is None
    assert final <= (1e-8 if name in EXACT_AT_FULL else 0.1), final


# -- round mechanics ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_empty_round_keeps_client_state_and_messages_are_empty(problems, name):
    problem = problems["ridge"]
    algorithm = make_algorithm(name, lr=1e-3, local_steps=2).prepare(problem, make_participation("full", 8))
    state = algorithm.init(problem.initial_point(), problem.num_clients)
    nobody = torch.zeros(0, dtype=torch.int64)
    ctx = RoundContext(round=0, active=nobody, num_clients=problem.num_clients)
    rows, message = algorithm.client_round(state.server, gather_rows(state.clients, nobody),
                                           problem.oracle(nobody, seed=0, round=0), ctx)
    assert all(field.shape[0] == 0 for field in message)
    after = vectorized_round(algorithm, state, problem, nobody, 0, seed=0)
    for before_field, after_field in zip(state.clients, after.clients):
        assert torch.equal(before_field, after_field)
    assert torch.isfinite(algorithm.model(after)).all()


@pytest.mark.parametrize("name", NAMES)
def test_lr_scale_multiplies_every_step_size(problems, name):
    """A round at (lr, lr_scale = 0.5) is a round at (lr / 2, 1): schedules reach every step."""
    problem = problems["ridge"]
    process = make_participation("bernoulli:p=0.5", problem.num_clients, seed=1)
    scaled = make_algorithm(name, lr=2e-3, local_steps=2).prepare(problem, process)
    halved = make_algorithm(name, lr=1e-3, local_steps=2).prepare(problem, process)
    a = scaled.init(problem.initial_point(), problem.num_clients)
    b = halved.init(problem.initial_point(), problem.num_clients)
    for r in range(6):
        active = torch.as_tensor(process.active(r))
        a = vectorized_round(scaled, a, problem, active, r, seed=0, lr_scale=0.5)
        b = vectorized_round(halved, b, problem, active, r, seed=0, lr_scale=1.0)
    torch.testing.assert_close(scaled.model(a), halved.model(b), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", NAMES)
def test_minibatches_within_a_round_are_distinct_draws(problems, name):
    """Every oracle call of a round uses a new step index, so stochastic forms get fresh batches."""
    problem = problems["ridge"]
    algorithm = make_algorithm(name, lr=1e-3, local_steps=3)
    state = algorithm.init(problem.initial_point(), problem.num_clients)
    active = torch.tensor([1, 4, 6])
    steps = []
    inner = problem.oracle(active, seed=0, round=0)

    def recording_oracle(z, step):
        steps.append(step)
        return inner(z, step)

    ctx = RoundContext(round=0, active=active, num_clients=problem.num_clients)
    algorithm.client_round(state.server, gather_rows(state.clients, active), recording_oracle, ctx)
    assert steps and len(steps) == len(set(steps))


def steps_asked(algorithm, problem, ctx) -> list[int]:
    """The steps a client round asks its oracle for, in order."""
    state = algorithm.init(problem.initial_point(), problem.num_clients)
    inner, steps = problem.oracle(ctx.active, seed=0, round=ctx.round), []

    def recording_oracle(z, step):
        steps.append(step)
        return inner(z, step)

    algorithm.client_round(state.server, gather_rows(state.clients, ctx.active), recording_oracle, ctx)
    return steps


@pytest.mark.parametrize("name", NAMES)
def test_round_steps_are_the_steps_a_round_asks_for(problems, name):
    """round_steps, the hint by which a problem draws several steps' minibatches together, is
    what the client round asks for: steps 0..k-1, every client doing tau or (work processes)
    its own count."""
    problem = problems["ridge"]
    algorithm = make_algorithm(name, lr=1e-3, local_steps=3)
    active = torch.tensor([1, 4, 6])
    ctx = RoundContext(round=0, active=active, num_clients=problem.num_clients)
    assert algorithm.round_steps(ctx) == 3
    assert steps_asked(algorithm, problem, ctx) == [0, 1, 2]
    if algorithm.partial_work:
        short = ctx._replace(steps=torch.tensor([1, 2, 1]))
        assert algorithm.round_steps(short) == 2
        assert steps_asked(algorithm, problem, short) == [0, 1]


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
    problem = make_problem(RIDGE + ",batch=5", dtype=torch.float32)
    process = make_participation("uniform:m=3", problem.num_clients, seed=0)
    algorithm = make_algorithm(name, lr=step_size(name, 2e-3, problem.num_clients), local_steps=2)
    result = simulate(algorithm, problem, process, 30, eval_every=30)
    assert algorithm.model(result.state).dtype == torch.float32
    assert result.diverged_at is None and result.rows[-1]["rel_error"] < result.rows[0]["rel_error"]


@pytest.mark.parametrize("name", NAMES)
def test_metrics_count_floats_communicated(problems, name):
    problem = problems["ridge"]
    process = make_participation("uniform:m=3", problem.num_clients, seed=0)
    algorithm = make_algorithm(name, lr=1e-4)
    result = simulate(algorithm, problem, process, 4)
    comm = algorithm.communication()
    last = result.rows[-1]
    assert last["comm_down"] == 4 * 3 * comm.down * problem.dim
    assert last["comm_up"] == 4 * 3 * comm.up * problem.dim


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
def test_prepare_keeps_the_algorithm_and_its_name(problems, name):
    # prepare() may fill in problem-dependent values; it must not turn, say, fedavg_known_p
    # into plain fedavg.
    problem = problems["ridge"]
    process = make_participation("bernoulli", problem.num_clients, seed=0)
    algorithm = make_algorithm(name, lr=1e-3)
    prepared = algorithm.prepare(problem, process)
    assert type(prepared) is type(algorithm) and prepared.name == algorithm.name


# -- the size of the state, declared from (N, d) -----------------------------------------------------
# Every registered algorithm at its defaults, and the variants whose state differs.
STATE_SPECS = [*NAMES, "mifa:notebook=1"]


def _allocated(state) -> StateSize:
    """The elements init allocated: distinct storages, by dtype kind (float, int64)."""
    seen, floats, integers = set(), 0, 0
    for tensor in (*state.server, *state.clients):
        storage = tensor.untyped_storage()
        if storage.data_ptr() in seen or storage.nbytes() == 0:
            continue
        seen.add(storage.data_ptr())
        if tensor.is_floating_point():
            floats += storage.nbytes() // tensor.element_size()
        else:
            assert tensor.dtype == torch.int64, tensor.dtype
            integers += storage.nbytes() // 8
    return StateSize(floats, integers)


def _shapes(state) -> StateSize:
    """The elements of every field (a meta tensor has shapes, no memory)."""
    fields = (*state.server, *state.clients)
    return StateSize(sum(t.numel() for t in fields if t.is_floating_point()),
                     sum(t.numel() for t in fields if not t.is_floating_point()))


@pytest.mark.parametrize("spec", STATE_SPECS)
def test_declared_state_size_is_what_init_allocates(spec):
    algorithm = make_algorithm(spec)
    for n, d in [(1, 1), (3, 5), (7, 2), (16, 33)]:
        for dtype in (torch.float32, torch.float64):
            state = algorithm.init(torch.randn(d, dtype=dtype), n)
            declared = algorithm.state_size(n, d)
            assert _allocated(state) == declared == _shapes(state), (spec, n, d)
            assert declared.nbytes(torch.finfo(dtype).bits // 8) == sum(
                t.numel() * t.element_size() for t in (*state.server, *state.clients))


@pytest.mark.parametrize("spec", STATE_SPECS)
def test_declared_state_size_at_a_hundred_thousand_clients(spec):
    """N = 10^5 clients of a 10^6-parameter model: 10^11 floats per table, far beyond memory. The
    formula is checked against init's shapes on the meta device, which allocates nothing."""
    algorithm = make_algorithm(spec)
    n, d = 100_000, 1_000_000
    declared = algorithm.state_size(n, d)
    assert declared == _shapes(algorithm.init(torch.empty(d, device="meta"), n))
    assert declared.floats >= d and isinstance(declared.floats, int)
    keeps_tables = algorithm.communication().client_memory or algorithm.communication().server_memory_per_client
    assert (declared.floats >= n * d) == bool(keeps_tables)  # the N x d tables are counted, once each


def test_a_state_beyond_memory_is_refused_before_init(monkeypatch):
    from focusfl.algorithms import check_state_size
    import focusfl.limits as limits

    problem = make_problem("ridge:dim=10,clients=8,samples=4")
    monkeypatch.setattr(limits, "available_bytes", lambda: 8 * (8 * 10 + 10))  # x and one table, float64
    check_state_size(make_algorithm("fedavg"), problem)
    check_state_size(make_algorithm("mifa"), problem)
    with pytest.raises(ConfigError, match=r"focus's state for 8 clients x 10 parameters"):
        check_state_size(make_algorithm("focus"), problem)  # x, y and g_prev: one d more

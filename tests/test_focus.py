"""FOCUS acceptance on the paper's ridge problem (seed 002, section 5, Figure 4)."""
import pytest
import torch

from focusfl.algorithms import make_algorithm
from focusfl.engine import simulate
from focusfl.engine.vectorized import vectorized_round
from focusfl.participation import make_participation
from focusfl.problems import make_problem

LR, TAU = 2e-4, 5

# Rounds within which FOCUS reached 1e-10 with a margin (measured: 100 full, 250 uniform,
# 400 bernoulli/weighted, 200 cyclic, 600 sine, ~1300 markov).
EXACT_CASES = {
    "full": 300,
    "uniform:m=4": 500,
    "bernoulli": 700,
    "weighted:m=4": 700,
    "markov": 1800,
    "cyclic": 500,
    "sine": 900,
}
NON_UNIFORM = ["bernoulli", "weighted:m=4", "markov", "sine"]


@pytest.fixture(scope="module")
def ridge():
    return make_problem("ridge")  # 16 clients, 100 samples, d=100, reg=0.01


@pytest.mark.parametrize("spec,rounds", EXACT_CASES.items())
def test_focus_converges_exactly_with_constant_step(ridge, spec, rounds):
    process = make_participation(spec, ridge.num_clients, seed=0)
    result = simulate(make_algorithm("focus", lr=LR, local_steps=TAU), ridge, process, rounds, eval_every=rounds)
    assert result.rows[-1]["rel_error"] <= 1e-10


@pytest.mark.parametrize("spec", NON_UNIFORM)
def test_fedavg_with_same_step_plateaus(ridge, spec):
    process = make_participation(spec, ridge.num_clients, seed=0)
    result = simulate(make_algorithm("fedavg", lr=LR, local_steps=TAU), ridge, process, 600, eval_every=20)
    second_half = [row["rel_error"] for row in result.rows[len(result.rows) // 2 :]]
    assert min(second_half) > 1e-4


@pytest.mark.parametrize("spec", ["bernoulli", "markov", "cyclic"])
def test_tracking_invariant_every_round(ridge, spec):
    """After every round the server's y is the sum of every client's last gradient."""
    algorithm = make_algorithm("focus", lr=LR, local_steps=3)
    process = make_participation(spec, ridge.num_clients, seed=0)
    state = algorithm.init(ridge.initial_point(), ridge.num_clients)
    for r in range(40):
        active = torch.as_tensor(process.active(r))
        state = vectorized_round(algorithm, state, ridge, active, r, seed=0)
        tracked = state.clients.g_prev.sum(0)
        scale = max(1.0, float(tracked.norm()))
        assert float((state.server.y - tracked).norm()) <= 1e-12 * scale


def test_sg_focus_with_full_batch_reproduces_focus():
    """batch = samples draws every sample (in a hashed order): SG-FOCUS must equal FOCUS."""
    exact = make_problem("ridge")
    full_batch = make_problem("ridge:batch=100")
    process = make_participation("bernoulli", 16, seed=0)
    focus = simulate(make_algorithm("focus", lr=LR, local_steps=TAU), exact, process, 100)
    sg = simulate(make_algorithm("sg_focus", lr=LR, local_steps=TAU), full_batch, process, 100)
    scale = float(focus.state.server.x.norm())
    assert float((focus.state.server.x - sg.state.server.x).norm()) <= 1e-12 * scale
    for a, b in zip(focus.rows, sg.rows):
        assert b["rel_error"] == pytest.approx(a["rel_error"], rel=1e-9, abs=1e-13)


def test_sg_focus_stores_the_stochastic_gradient_it_used():
    """SG-FOCUS keeps g_prev = the minibatch gradient of the last local step, not a re-evaluation."""
    problem = make_problem("ridge:batch=10")
    algorithm = make_algorithm("sg_focus", lr=LR, local_steps=3)
    state = algorithm.init(problem.initial_point(), problem.num_clients)
    active = torch.tensor([0, 3, 7])
    new = vectorized_round(algorithm, state, problem, active, 0, seed=9)
    # Replay the local steps by hand with the same oracle.
    oracle = problem.oracle(active, seed=9, round=0)
    z = state.server.x.expand(3, -1)
    u = torch.zeros_like(z)
    g_prev = torch.zeros_like(z)
    for step in range(3):
        g = oracle(z, step)
        u = u + g - g_prev
        g_prev = g
        z = torch.add(z, u, alpha=-LR)  # z - LR * u rounded once, as the algorithm's fused update
    torch.testing.assert_close(new.clients.g_prev[active], g_prev, rtol=0, atol=0)
    torch.testing.assert_close(new.server.y, u.sum(0), rtol=0, atol=0)


def test_sg_focus_converges_to_a_noise_floor():
    problem = make_problem("ridge:batch=20")
    process = make_participation("bernoulli", 16, seed=0)
    result = simulate(make_algorithm("sg_focus", lr=LR, local_steps=TAU), problem, process, 300, eval_every=50)
    errors = [row["rel_error"] for row in result.rows]
    assert errors[-1] < 0.05 * errors[0]


def test_empty_round_steps_by_default_and_skips_on_request(ridge):
    algorithm = make_algorithm("focus", lr=LR, local_steps=TAU)
    skipping = make_algorithm("focus", lr=LR, local_steps=TAU, skip_empty=True)
    state = algorithm.init(ridge.initial_point(), ridge.num_clients)
    state = vectorized_round(algorithm, state, ridge, torch.tensor([0, 1]), 0, seed=0)
    nobody = torch.tensor([], dtype=torch.int64)
    stepped = vectorized_round(algorithm, state, ridge, nobody, 1, seed=0)
    skipped = vectorized_round(skipping, state, ridge, nobody, 1, seed=0)
    torch.testing.assert_close(stepped.server.x, state.server.x - LR * state.server.y, rtol=0, atol=0)
    torch.testing.assert_close(skipped.server.x, state.server.x, rtol=0, atol=0)


def test_float32_runs(ridge):
    problem = make_problem("ridge", dtype=torch.float32)
    process = make_participation("uniform:m=4", 16, seed=0)
    result = simulate(make_algorithm("focus", lr=LR, local_steps=TAU), problem, process, 200, eval_every=200)
    assert result.state.server.x.dtype == torch.float32
    assert result.rows[-1]["rel_error"] < 1e-4


def test_fedavg_known_p_uses_nominal_rates(ridge):
    process = make_participation("bernoulli", 16, seed=0)
    algorithm = make_algorithm("fedavg", lr=LR, local_steps=TAU, weighting="known_p")
    prepared = algorithm.prepare(ridge, process)
    assert prepared.p == pytest.approx(tuple(process.nominal_p()))

"""Push-sum FL and push-sum with gradient tracking (experimental): the per-client algorithms equal
their column-stochastic matrix forms, and the measured behaviour stated in their docstrings
holds: plain push-sum is inexact with a constant step, the tracking variant is exact."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from focusfl.algorithms import make_algorithm
from focusfl.algorithms.pushsum import PushSum
from focusfl.algorithms.pushsum_tracking import PushSumTracking
from focusfl.engine.reference import reference_round
from focusfl.engine.simulate import active_sets
from focusfl.errors import ConfigError
from focusfl.matrix import is_column_stochastic, run_matrix_form
from focusfl.matrix.bias import client_quadratics, participation_weights, server_trajectory, weighted_target
from focusfl.participation import make_participation
from focusfl.problems import make_problem

# The measurements of the docstrings: L = max_i lambda_max(H_i) = 2013 on this problem, so these
# steps are about 0.5/L and 0.25/L.
MEASURED = "ridge:dim=10,samples=50,hetero=1"
LR, HALF_LR = 2.5e-4, 1.25e-4


@pytest.fixture(scope="module")
def small():
    return make_problem("ridge:dim=4,clients=5,samples=12,hetero=1")


def mixed_mask(rounds: int = 30, n: int = 5) -> np.ndarray:
    mask = np.random.default_rng(0).random((rounds, n)) < 0.4
    mask[4] = False
    mask[2:20, 1] = False
    return mask


@pytest.mark.parametrize("cls", [PushSum, PushSumTracking])
@pytest.mark.parametrize("tau", [1, 3])
def test_per_client_equals_column_stochastic_matrix_form(small, cls, tau):
    algorithm = cls(lr=2e-3, local_steps=tau, pull=0.6, push=0.3)
    mask = mixed_mask()
    per_client = server_trajectory(algorithm, small, mask)
    checked = []

    def check(view):
        assert is_column_stochastic(view.iteration.C)
        assert bool((view.w > 0).all())
        # Mass is conserved: the weights always sum to N + 1.
        assert float(view.w.sum()) == pytest.approx(small.num_clients + 1, abs=1e-12)
        if view.grads is not None:  # tracking: total y = sum of the stored gradients
            torch.testing.assert_close(view.y.sum(0), view.grads.sum(0), rtol=0, atol=1e-9)
        checked.append(view.iteration.k)

    matrix = run_matrix_form(algorithm, small, mask, observer=check)
    assert len(checked) == mask.shape[0] * (tau + 1)
    gap = float((per_client - matrix.server).abs().max())
    assert gap <= 1e-12 * max(1.0, float(per_client.abs().max()))


@pytest.mark.parametrize("name", ["pushsum", "pushsum_tracking"])
def test_reference_loop_agrees_and_registry_marks_experimental(small, name):
    algorithm = make_algorithm(f"{name}:pull=0.4,push=0.6", lr=1e-3, local_steps=2)
    assert type(algorithm).experimental and algorithm.summary.startswith("[experimental]")
    mask = mixed_mask()
    state = algorithm.init(small.initial_point(), small.num_clients)
    for r, active in enumerate(active_sets(mask, small.device)):
        state = reference_round(algorithm, state, small, active, r, 0)
    vectorized = server_trajectory(algorithm, small, mask)[-1]
    torch.testing.assert_close(algorithm.model(state), vectorized, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("bad", ["pull=0", "pull=1", "push=0", "push=1.5"])
def test_shares_must_keep_weights_positive(bad):
    with pytest.raises(ConfigError):
        make_algorithm(f"pushsum:{bad}")


@pytest.fixture(scope="module")
def measured():
    problem = make_problem(MEASURED)
    return problem, client_quadratics(problem)


def relative_gap(x, problem) -> float:
    return float((x - problem.x_star).norm() / problem.x_star.norm())


def averaged_error(algorithm, problem, spec: str, rounds: int) -> tuple[torch.Tensor, float]:
    process = make_participation(spec, problem.num_clients, seed=0)
    trajectory = server_trajectory(algorithm, problem, process.mask(rounds))
    average = trajectory[rounds // 2 :].mean(0)
    return average, relative_gap(average, problem)


def test_plain_pushsum_full_participation_error_scales_with_the_step(measured):
    problem, _ = measured
    _, big = averaged_error(PushSum(lr=LR), problem, "full", 1500)
    _, small = averaged_error(PushSum(lr=HALF_LR), problem, "full", 1500)
    assert big > 0.05  # measured 0.087: not exact
    assert 0.4 < small / big < 0.7  # measured 0.048 / 0.087 = 0.56: an O(eta) fixed-point error


def test_plain_pushsum_bernoulli_bias_does_not_shrink_with_the_step(measured):
    problem, quad = measured
    process = make_participation("bernoulli", problem.num_clients, seed=0)
    p_target = weighted_target(quad, participation_weights(process).p)
    errors = []
    for lr in (LR, HALF_LR):
        average, error = averaged_error(PushSum(lr=lr), problem, "bernoulli", 3000)
        errors.append(error)
        # Pulled towards argmin sum p_i f_i: closer to it than to x*.
        assert float((average - p_target).norm()) < float((average - problem.x_star).norm())
    assert min(errors) > 0.08  # measured 0.14 and 0.12
    assert errors[1] / errors[0] > 0.7  # halving the step does not halve the error


@pytest.mark.parametrize("spec", ["full", "uniform", "bernoulli"])
def test_tracking_converges_exactly_with_a_constant_step(measured, spec):
    problem, _ = measured
    process = make_participation(spec, problem.num_clients, seed=0)
    trajectory = server_trajectory(PushSumTracking(lr=LR), problem, process.mask(2000))
    assert relative_gap(trajectory[-1], problem) < 1e-10

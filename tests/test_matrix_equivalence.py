"""The matrix-form engines reproduce the per-client FedAvg and FOCUS every round to 1e-12
(float64), for tau in {1, 3, 5}, on participation sequences with empty rounds and clients absent
for long stretches; every matrix is stochastic as claimed and FOCUS's tracking property
1^T y_k = 1^T grad f(x_k) holds at every k. With per-client step counts (uniform and markov
work) vectorized == reference == matrix form for FedAvg (eqs. 6 and 8), FedNova and FOCUS."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from focusfl.algorithms.fedavg import FedAvg
from focusfl.algorithms.fednova import FedNova
from focusfl.algorithms.focus import Focus
from focusfl.errors import ConfigError
from focusfl.matrix import (
    fedavg_matrix,
    fedavg_mixing,
    focus_matrix,
    is_column_stochastic,
    is_row_stochastic,
    run_matrix_form,
)
from focusfl.matrix.bias import server_trajectory
from focusfl.matrix.engines import gradient_rows, work_steps
from focusfl.problems import make_problem
from focusfl.work import make_work

N = 6
ROUNDS = 40
TOL = 1e-12


@pytest.fixture(scope="module")
def problem():
    return make_problem("ridge:dim=5,clients=6,samples=20,hetero=1")


def hard_mask(seed: int) -> np.ndarray:
    """Random sets, two empty rounds, client 2 absent for rounds 3..24, client 5 never before 30."""
    mask = np.random.default_rng(seed).random((ROUNDS, N)) < 0.35
    mask[[7, 8]] = False
    mask[3:25, 2] = False
    mask[:30, 5] = False
    mask[30, 5] = True
    return mask


def assert_same_trajectory(per_client: torch.Tensor, matrix: torch.Tensor) -> None:
    assert per_client.shape == matrix.shape
    assert torch.isfinite(per_client).all()
    gap = float((per_client - matrix).abs().max())
    assert gap <= TOL * max(1.0, float(per_client.abs().max())), gap


@pytest.mark.parametrize("tau", [1, 3, 5])
@pytest.mark.parametrize("seed", [0, 1])
def test_fedavg_matrix_form_equals_per_client(problem, tau, seed):
    mask = hard_mask(seed)
    algorithm = FedAvg(lr=1e-3, local_steps=tau)
    per_client = server_trajectory(algorithm, problem, mask)

    def check(view):
        it = view.iteration
        assert is_row_stochastic(it.R) and is_row_stochastic(it.A)

    matrix = fedavg_matrix(problem, mask, lr=1e-3, local_steps=tau, observer=check)
    assert_same_trajectory(per_client, matrix.server)
    assert_same_trajectory(per_client, fedavg_mixing(problem, mask, lr=1e-3, local_steps=tau).server)


def test_fedavg_variants_through_the_averaging_row(problem):
    mask = hard_mask(2)
    for algorithm in (
        FedAvg(lr=1e-3, local_steps=2, server_lr=0.7, weighting="all"),
        FedAvg(lr=1e-3, local_steps=2, weighting="known_p", p=(0.3,) * N),
    ):
        assert_same_trajectory(server_trajectory(algorithm, problem, mask), run_matrix_form(algorithm, problem, mask).server)


@pytest.mark.parametrize("tau", [1, 3, 5])
@pytest.mark.parametrize("skip_empty", [False, True])
def test_focus_matrix_form_equals_algorithm_1(problem, tau, skip_empty):
    mask = hard_mask(3)
    lr = 2e-4
    per_client = server_trajectory(Focus(lr=lr, local_steps=tau, skip_empty=skip_empty), problem, mask)
    everyone = list(range(1, N + 1))
    seen = []

    def check(view):
        it = view.iteration
        assert is_row_stochastic(it.R) and is_column_stochastic(it.C)
        # Tracking property against freshly computed gradients of the current rows.
        fresh = gradient_rows(problem, view.x, everyone, seed=0, round_=0, step=0)
        gap = float((view.y.sum(0) - fresh.sum(0)).abs().max())
        assert gap <= 1e-9 * max(1.0, float(fresh.abs().max())), gap
        seen.append(it.k)

    matrix = focus_matrix(problem, mask, lr=lr, local_steps=tau, skip_empty=skip_empty, observer=check)
    assert seen == list(range(ROUNDS * tau))
    assert_same_trajectory(per_client, matrix.server)


@pytest.mark.parametrize("tau", [1, 3])
def test_minibatch_gradients_agree_too(tau):
    problem = make_problem("ridge:dim=4,clients=6,samples=30,batch=5,hetero=1")
    mask = hard_mask(4)
    for algorithm in (FedAvg(lr=1e-3, local_steps=tau), Focus(lr=2e-4, local_steps=tau)):
        per_client = server_trajectory(algorithm, problem, mask, seed=7)
        assert_same_trajectory(per_client, run_matrix_form(algorithm, problem, mask, seed=7).server)


def test_engines_check_their_inputs(problem):
    with pytest.raises(ConfigError):
        focus_matrix(problem, np.ones((3, N + 1), dtype=bool), lr=1e-3)
    with pytest.raises(ConfigError):
        run_matrix_form(FedAvg(weighting="known_p"), problem, hard_mask(0))
    with pytest.raises(ConfigError):
        fedavg_matrix(problem, hard_mask(0), lr=1e-3, local_steps=0)


# -- per-client step counts ---------------------------------------------------------------------
WORK_SPECS = ["uniform", "markov:p=0.5,rho=0.6,slow=0.25"]


def work_table(spec: str, tau: int) -> torch.Tensor:
    table = work_steps(make_work(spec, N, tau, seed=4), ROUNDS)
    assert table is not None and int(table.min()) < tau  # the counts really differ from tau
    return table


def three_ways(algorithm, problem, mask, steps, seed=0, observer=None):
    """(vectorized, reference, matrix form) server trajectories under the step counts ``steps``."""
    return (server_trajectory(algorithm, problem, mask, seed, steps=steps),
            server_trajectory(algorithm, problem, mask, seed, steps=steps, engine="reference"),
            run_matrix_form(algorithm, problem, mask, seed=seed, steps=steps, observer=observer).server)


@pytest.mark.parametrize("spec", WORK_SPECS)
@pytest.mark.parametrize("tau", [3, 5])
def test_fedavg_with_step_counts_vectorized_reference_and_matrix_agree(problem, spec, tau):
    mask = hard_mask(5)
    steps = work_table(spec, tau)
    for algorithm in (FedAvg(lr=1e-3, local_steps=tau), FedNova(lr=1e-3, local_steps=tau),
                      FedAvg(lr=1e-3, local_steps=tau, weighting="known_p", p=(0.35,) * N)):
        vectorized, reference, matrix = three_ways(algorithm, problem, mask, steps)
        assert_same_trajectory(vectorized, reference)
        assert_same_trajectory(vectorized, matrix)
    # Eq. (8): absent clients compute virtually, finished ones stop; the same trajectory.
    mixing = fedavg_mixing(problem, mask, lr=1e-3, local_steps=tau, steps=steps).server
    assert_same_trajectory(server_trajectory(FedAvg(lr=1e-3, local_steps=tau), problem, mask, steps=steps), mixing)


@pytest.mark.parametrize("spec", WORK_SPECS)
@pytest.mark.parametrize("tau", [3, 5])
def test_focus_with_step_counts_vectorized_reference_and_matrix_agree(problem, spec, tau):
    mask = hard_mask(6)
    steps = work_table(spec, tau)
    everyone = list(range(1, N + 1))
    live_sizes = []

    def check(view):
        it = view.iteration
        assert is_row_stochastic(it.R) and is_column_stochastic(it.C)
        assert set(it.live) <= set(it.nodes) and float(it.D[1:].sum()) == len(it.live)
        live_sizes.append(len(it.live) < len(it.nodes))
        fresh = gradient_rows(problem, view.x, everyone, seed=0, round_=0, step=0)
        gap = float((view.y.sum(0) - fresh.sum(0)).abs().max())
        assert gap <= 1e-9 * max(1.0, float(fresh.abs().max())), gap

    vectorized, reference, matrix = three_ways(Focus(lr=2e-4, local_steps=tau), problem, mask, steps, observer=check)
    assert any(live_sizes)  # some iterations had a client that had stopped
    assert_same_trajectory(vectorized, reference)
    assert_same_trajectory(vectorized, matrix)


def test_step_counts_with_minibatch_gradients():
    problem = make_problem("ridge:dim=4,clients=6,samples=30,batch=5,hetero=1")
    mask = hard_mask(7)
    steps = work_table("uniform", 3)
    for algorithm in (FedAvg(lr=1e-3, local_steps=3), Focus(lr=2e-4, local_steps=3)):
        vectorized, reference, matrix = three_ways(algorithm, problem, mask, steps, seed=7)
        assert_same_trajectory(vectorized, reference)
        assert_same_trajectory(vectorized, matrix)


def test_full_step_counts_are_the_runs_without_them(problem):
    mask = hard_mask(8)
    full = torch.full((ROUNDS, N), 3, dtype=torch.int64)
    for algorithm in (FedAvg(lr=1e-3, local_steps=3), Focus(lr=2e-4, local_steps=3)):
        assert torch.equal(run_matrix_form(algorithm, problem, mask, steps=full).server,
                           run_matrix_form(algorithm, problem, mask).server)


def test_step_counts_are_checked(problem):
    mask = hard_mask(0)
    with pytest.raises(ConfigError, match="shape"):
        fedavg_matrix(problem, mask, lr=1e-3, local_steps=3, steps=np.ones((ROUNDS - 1, N), dtype=np.int64))
    with pytest.raises(ConfigError, match="1..3"):
        focus_matrix(problem, mask, lr=1e-3, local_steps=3, steps=np.full((ROUNDS, N), 4, dtype=np.int64))
    from focusfl.algorithms import make_algorithm

    with pytest.raises(ConfigError, match="no per-client step counts"):
        run_matrix_form(make_algorithm("pushsum", local_steps=3), problem, mask,
                        steps=np.full((ROUNDS, N), 2, dtype=np.int64))

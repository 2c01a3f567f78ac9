"""focusfl.matrix.bias: q_i, E[matrices], the weighted target, delta_q^2, and `focusfl bias`."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from focusfl.cli import main
from focusfl.errors import ConfigError
from focusfl.matrix import A, C, R, W, expected_matrices, fedavg_mixing_matrix, nodes_from_mask
from focusfl.matrix.bias import (
    client_quadratics,
    heterogeneity,
    independent_coin_weights,
    limit_points,
    monte_carlo_weights,
    participation_weights,
    sampling_bias,
    smoothness,
    weighted_target,
)
from focusfl.participation import make_participation
from focusfl.problems import make_problem

N = 8
ACCEPTANCE_PROBLEM = "ridge:dim=10,samples=50,hetero=1"


def test_independent_coins_match_enumeration_of_all_sets():
    p = np.array([0.1, 0.5, 0.9, 0.3, 1.0, 0.05])
    q = np.zeros_like(p)
    p_empty = 0.0
    for bits in itertools.product([0, 1], repeat=p.size):
        s = np.array(bits, dtype=bool)
        prob = np.prod(np.where(s, p, 1 - p))
        if s.any():
            q += prob * s / s.sum()
        else:
            p_empty += prob
    got_q, got_empty = independent_coin_weights(p)
    np.testing.assert_allclose(got_q, q, rtol=1e-12, atol=1e-15)
    assert got_empty == pytest.approx(p_empty, abs=1e-15)


@pytest.mark.parametrize(
    "spec",
    ["uniform:m=3", "bernoulli", "bernoulli:p=0.1,redraw=true", "markov:rho=0.3", "sine",
     "cyclic:groups=3", "reshuffled_cyclic:groups=3", "weighted:m=3"],
)
def test_closed_forms_agree_with_monte_carlo(spec):
    process = make_participation(spec, N, seed=3)
    exact = participation_weights(process)
    estimate = monte_carlo_weights(process, 8_000)
    # Standard errors of these estimates are about 0.002 (markov's chains are correlated in time).
    np.testing.assert_allclose(exact.q, estimate.q, atol=0.015)
    np.testing.assert_allclose(exact.p, estimate.p, atol=0.04)
    assert exact.p_empty == pytest.approx(estimate.p_empty, abs=0.015)
    assert exact.q.sum() == pytest.approx(1.0 - exact.p_empty, abs=1e-9)


def test_exact_cases_without_sampling():
    full = participation_weights(make_participation("full", N))
    np.testing.assert_allclose(full.q, 1.0 / N)
    single = participation_weights(make_participation("weighted:m=1", N, seed=1))
    np.testing.assert_allclose(single.q, single.p)
    assert single.q.sum() == pytest.approx(1.0)
    cyclic = participation_weights(make_participation("cyclic:groups=3", N))
    np.testing.assert_allclose(cyclic.q, [1 / 9] * 3 + [1 / 9] * 3 + [1 / 6] * 2)


def test_trace_weights_are_exact_over_the_recorded_rounds(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("1,0,0\n1,1,0\n0,0,1\n")
    w = participation_weights(make_participation({"name": "trace", "path": str(trace)}, 3))
    np.testing.assert_allclose(w.q, [(1 + 0.5) / 3, 0.5 / 3, 1 / 3])
    assert w.method == "exact over the trace"


def test_expected_matrices_are_the_mean_of_the_matrices():
    process = make_participation("bernoulli:p=0.3", 4, seed=0)
    rows = process.mask(1500)
    sums = {name: torch.zeros(5, 5, dtype=torch.float64) for name in ("R", "A", "C", "W", "W_fedavg")}
    for row in rows:
        nodes = nodes_from_mask(row)
        for name, build in (("R", R), ("A", A), ("C", C), ("W", W), ("W_fedavg", fedavg_mixing_matrix)):
            sums[name] += build(nodes, 4)
    empirical = monte_carlo_weights(process, 1500)
    expected = expected_matrices(empirical)
    for name, total in sums.items():
        np.testing.assert_allclose(getattr(expected, name), (total / len(rows)).numpy(), atol=1e-12)
    # E[W_k] of FedAvg: every row is (P(empty), q).
    assert np.allclose(expected.W_fedavg, expected.W_fedavg[0])


@pytest.fixture(scope="module")
def ridge():
    return make_problem("ridge:dim=6,clients=8,samples=20,hetero=1")


def test_quadratic_is_read_off_the_gradients(ridge):
    quad = client_quadratics(ridge)
    x = torch.linspace(-1, 1, ridge.dim, dtype=torch.float64)
    got = quad.gradients(x)
    want = ridge.client_gradients(x.expand(N, -1), torch.arange(N), seed=0, round=0, step=0)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-9)
    assert smoothness(quad) > 0


def test_uniform_weights_recover_x_star_with_no_sampling_bias(ridge):
    quad = client_quadratics(ridge)
    uniform = np.full(N, 1.0 / N)
    torch.testing.assert_close(weighted_target(quad, uniform), ridge.x_star, rtol=1e-9, atol=1e-10)
    assert sampling_bias(quad, uniform, ridge.x_star) == pytest.approx(0.0, abs=1e-12)
    skewed = np.linspace(1, 3, N) / np.linspace(1, 3, N).sum()
    assert sampling_bias(quad, skewed, ridge.x_star) > 1.0
    assert heterogeneity(quad, ridge.x_star) > 0


def test_non_quadratic_or_minibatch_problems_are_refused():
    with pytest.raises(ConfigError, match="not quadratic"):
        client_quadratics(make_problem("logistic:dim=4,clients=3,samples=10"))
    with pytest.raises(ConfigError, match="exact gradients"):
        client_quadratics(make_problem("ridge:dim=4,clients=3,samples=10,batch=2"))


def test_acceptance_fedavg_lands_on_weighted_target_and_focus_on_x_star():
    """Issue 3's acceptance, with `focusfl bias`'s defaults: tau = 1, FedAvg lr = 0.05/L averaged
    over the second half of 3000 rounds, FOCUS lr = 0.5/(N L)."""
    problem = make_problem(ACCEPTANCE_PROBLEM)
    process = make_participation("bernoulli", problem.num_clients, seed=0)
    quad = client_quadratics(problem)
    q = participation_weights(process).q
    lipschitz = smoothness(quad)
    limits = limit_points(
        problem, process, rounds=3000, fedavg_lr=0.05 / lipschitz, focus_lr=0.5 / (problem.num_clients * lipschitz)
    )
    x_star = problem.x_star
    target_gap = float((weighted_target(quad, q) - x_star).norm())
    fedavg_gap = float((limits.fedavg_average - x_star).norm())
    assert target_gap > 0.1 * float(x_star.norm())  # the bias is real, not rounding
    assert abs(fedavg_gap / target_gap - 1.0) < 0.10
    assert float((limits.focus_last - x_star).norm()) < 1e-10


def test_bias_command_prints_q_delta_and_distances(capsys):
    code = main(["bias", "--problem", "ridge:dim=4,clients=5,samples=10,hetero=1", "--participation",
                 "weighted:m=2", "--rounds", "200", "--mc-rounds", "2000"])
    out = capsys.readouterr().out
    assert code == 0
    for needle in ("delta_q^2 at x* =", "||x_q - x*||", "FedAvg (mean over rounds 100..200)", "FOCUS  (last round)"):
        assert needle in out
    assert len([line for line in out.splitlines() if line.strip().split(" ")[0].isdigit()]) == 5


@pytest.mark.parametrize(
    "argv",
    [["--problem", "logistic:dim=3,clients=3"], ["--participation", "nope"], ["--problem", "ridge:dim=0"]],
)
def test_bias_command_errors_are_one_line(capsys, argv):
    assert main(["bias", *argv, "--rounds", "10"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("focusfl: error:") and err.count("\n") == 1


# -- unequal work ---------------------------------------------------------------------------------
def _number(out: str, before: str) -> float:
    """The number printed right after ``before`` (the first occurrence)."""
    import re

    return float(re.search(re.escape(before) + r"\s*([-+0-9.e]+)", out).group(1))


def test_work_limit_is_the_fixed_point_of_the_expected_round():
    """Full participation and fixed per-client counts are deterministic: FedAvg converges to x_w
    itself, not to the small-step target, and FedNova to its own fixed point."""
    from focusfl.matrix.bias import fedavg_work_limit, fednova_work_limit, limit_points, step_weighted_target
    from focusfl.work import make_work, step_law

    problem = make_problem("ridge:dim=4,clients=4,samples=20,hetero=1")
    process = make_participation("full", 4)
    work = make_work("rates:r=0.25;0.5;1;1", 4, 4)
    quad = client_quadratics(problem)
    law = step_law(work)
    np.testing.assert_allclose(law.mean(), [1, 2, 4, 4])
    q = participation_weights(process).q
    lr = 0.05 / smoothness(quad)
    limits = limit_points(problem, process, rounds=3000, fedavg_lr=lr, focus_lr=0.5 / (4 * smoothness(quad)), local_steps=4, work=work,
                          fednova_lr=lr)
    predicted = fedavg_work_limit(quad, q, lr, law.probabilities)
    gap = float((predicted - problem.x_star).norm())
    assert gap > 0.05 * float(problem.x_star.norm())
    assert float((limits.fedavg_last - predicted).norm()) < 1e-8 * gap
    assert float((step_weighted_target(quad, q, law.mean()) - predicted).norm()) > 1e-3 * gap  # lr matters
    nova = fednova_work_limit(quad, lr, process.mask(10), work.table(10))
    assert float((limits.fednova_average - nova).norm()) < 1e-3 * float((nova - problem.x_star).norm())
    assert float(limits.focus_last.sub(problem.x_star).norm()) < 1e-10


def test_small_steps_tend_to_the_step_weighted_target():
    from focusfl.matrix.bias import fedavg_work_limit, step_weighted_target
    from focusfl.work import make_work, step_law

    problem = make_problem("ridge:dim=4,clients=4,samples=20,hetero=1")
    quad = client_quadratics(problem)
    law = step_law(make_work("markov:p=0.5,slow=0.25", 4, 4))
    q = np.array([0.1, 0.2, 0.3, 0.4])
    target = step_weighted_target(quad, q, law.mean())
    gaps = [float((fedavg_work_limit(quad, q, f / smoothness(quad), law.probabilities) - target).norm())
            for f in (1e-2, 1e-3)]
    assert gaps[1] < 0.2 * gaps[0]


def test_bias_command_with_work_predicts_fedavg_and_fednova_as_typed(tmp_path):
    from cli_harness import run_cli, run_main

    proc = run_cli("bias", "--problem", "ridge:dim=4,clients=4,samples=20,hetero=1", "--participation", "full",
                   "--local-steps", "4", "--work", "rates:r=0.25;0.5;1;1", "--rounds", "3000", "--mc-rounds", "100",
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "E[tau_i]" in out and "FedNova measured" in out
    gap = _number(out, "||x_w - x*|| =")
    assert gap > 0.05 and _number(out, "last round ||x - x_w|| =") < 1e-8 * gap
    bad = run_main("bias", "--work", "rates:r=2", "--local-steps", "4", "--rounds", "10", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "rates" in bad.stderr


@pytest.mark.parametrize("spec", ["fixed", "uniform", "rates:r=0.25;0.5;1;0.75", "markov:p=0.4,rho=0.7,slow=0.5"])
def test_step_law_closed_forms_agree_with_the_counts_drawn(spec):
    from focusfl.work import make_work, step_law

    work = make_work(spec, 4, 4, seed=2)
    law = step_law(work)
    assert law.method == "closed form" and np.allclose(law.probabilities.sum(1), 1.0)
    table = work.table(6000).numpy()
    drawn = np.stack([(table == t).mean(0) for t in range(1, 5)], axis=1)
    # 6,000 rounds: a frequency's standard error is below 0.007 (markov's rounds are correlated).
    np.testing.assert_allclose(law.probabilities, drawn, atol=0.04)

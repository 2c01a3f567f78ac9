"""Participation-bias diagnostics: q_i, E[matrices], the weighted target and delta_q^2.

FOCUS paper, Assumption 1, eq. (5), appendix D (Theorem 3):
- p_i = P(i in S) and q_i = E[1{i in S} / |S|] (empty rounds contribute 0, so sum_i q_i =
  P(S non-empty)). q is FedAvg's expected averaging weight.
- E[W_k] of FedAvg's condensed form (eq. 45) has every row (P(S empty), q_1, ..., q_N): FedAvg
  with a small step follows the expected gradient sum_i q_i grad f_i and settles near the
  participation-weighted target argmin sum_i q_i f_i instead of x* = argmin sum_i f_i.
- delta_q^2(x) = || sum_i (q_i - 1/N) grad f_i(x) ||^2 (eq. 37), the sampling-bias term of
  Theorem 3. The paper bounds it over all x; for a quadratic that supremum is infinite unless the
  Hessians line up, so we report it at x*, where it is exactly what moves the target:
  x_q - x* = -(sum_i q_i H_i)^{-1} sum_i q_i grad f_i(x*).
Eq. (5) writes q_i in the first column of E[R(S)]; the expectation of the indicator there is p_i,
which is what :func:`expected_matrices` returns.

Unequal work (client i takes tau_i <= tau local steps, drawn by a work process): on a quadratic,
tau local GD steps are affine, z_i = x - P_i(tau_i) (H_i x - b_i) with the gain
P_i(t) = eta sum_{s<t} (I - eta H_i)^s. FedAvg's round is x+ = x - gamma sum_{i in S} w_i
P_i(tau_i) (H_i x - b_i); with participation independent of work its expectation is
    E[x+ - x] = -gamma sum_i q_i G_i (H_i x - b_i),   G_i = E[P_i(tau_i)] = sum_t P(tau_i = t) P_i(t),
and the fixed point of the expected round map is x_w = (sum_i q_i G_i H_i)^{-1} sum_i q_i G_i b_i
(:func:`fedavg_work_limit`). When (S_r, tau_r) are drawn afresh every round (bernoulli, uniform,
rates) the mean of FedAvg's stationary iterate is exactly x_w, because x_r is independent of round
r's draw; Markov processes correlate them and x_w is then an approximation. For small eta,
G_i -> eta E[tau_i] I and x_w -> argmin sum_i q_i E[tau_i] f_i, the step-weighted target
(Wang et al., 2020). FedNova divides each update by tau_i and multiplies the average by
tau_eff; for small eta and counts drawn alike for every client it aims at argmin sum_i q_i f_i.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

from ..algorithms.fedavg import FedAvg
from ..algorithms.fednova import FedNova
from ..algorithms.focus import Focus
from ..engine.simulate import RecordedParticipation, RecordedWork, simulate
from ..errors import ConfigError
from ..participation import (
    BandedParticipation,
    BernoulliParticipation,
    CyclicParticipation,
    FullParticipation,
    MarkovParticipation,
    ReshuffledCyclicParticipation,
    SineParticipation,
    TraceParticipation,
    UniformParticipation,
    WeightedParticipation,
)
from ..participation.statistics import empirical_p, empirical_q
from ..problems.base import Problem

MONTE_CARLO_ROUNDS = 20_000

# The diagnostic's defaults (``focusfl bias`` and the report's bias section share them).
DEFAULT_BIAS_PROBLEM = "ridge:dim=10,samples=50,hetero=1"
# Default step sizes, as fractions of 1/L (FedAvg) and 1/(N L) (FOCUS, whose y is a sum).
FEDAVG_STEP = 0.05
FOCUS_STEP = 0.5
# FedAvg's average starts after this many e-folds of its slowest mode (e^-10 = 4.5e-5 of the
# start is left along it), and the run is twice as long (at least MIN_ROUNDS) unless told otherwise.
WARMUP_EFOLDS = 10
MIN_ROUNDS = 3000


class ParticipationWeights(NamedTuple):
    p: np.ndarray  # [N] P(i in S)
    q: np.ndarray  # [N] E[1{i in S} / |S|]
    p_empty: float  # P(S empty)
    method: str  # how they were obtained


# -- q_i ----------------------------------------------------------------------------------------
def independent_coin_weights(p: np.ndarray) -> tuple[np.ndarray, float]:
    """(q, P(empty)) when client i joins independently with probability p_i.

    q_i = p_i E[1 / (1 + K_i)], K_i = number of OTHER active clients, and
    E[1/(1+K)] = int_0^1 E[t^K] dt = int_0^1 prod_{j != i} (1 - p_j + p_j t) dt: a polynomial of
    degree N-1, integrated exactly by Gauss-Legendre with N//2 + 2 nodes.
    """
    p = np.asarray(p, dtype=np.float64)
    nodes, weights = np.polynomial.legendre.leggauss(p.size // 2 + 2)
    t = 0.5 * (nodes + 1.0)  # on (0, 1): every factor 1 - p_j + p_j t >= t > 0
    factors = 1.0 - p[None, :] + p[None, :] * t[:, None]  # [nodes, N]
    log_all = np.log(factors).sum(axis=1)
    others = np.exp(log_all[:, None] - np.log(factors))  # prod over j != i
    q = p * ((0.5 * weights) @ others)
    return q, float(np.prod(1.0 - p))


def _coins(p: np.ndarray, method: str) -> ParticipationWeights:
    q, p_empty = independent_coin_weights(p)
    return ParticipationWeights(np.asarray(p, dtype=np.float64), q, p_empty, method)


def monte_carlo_weights(process, rounds: int = MONTE_CARLO_ROUNDS) -> ParticipationWeights:
    mask = process.mask(rounds)
    return ParticipationWeights(
        empirical_p(mask), empirical_q(mask), float(np.mean(~mask.any(axis=1))), f"monte carlo ({rounds} rounds)"
    )


def participation_weights(process, mc_rounds: int = MONTE_CARLO_ROUNDS) -> ParticipationWeights:
    """p, q and P(empty) of a process: closed form where one exists, Monte Carlo otherwise."""
    n = process.num_clients
    if isinstance(process, FullParticipation):
        return ParticipationWeights(np.ones(n), np.full(n, 1.0 / n), 0.0, "closed form")
    if isinstance(process, UniformParticipation):
        return ParticipationWeights(np.full(n, process.m / n), np.full(n, 1.0 / n), 0.0, "closed form")
    if isinstance(process, BernoulliParticipation):
        w = _coins(process.p, "closed form")
        if not process.redraw:
            return w
        nonempty = 1.0 - w.p_empty  # conditioning on S non-empty rescales both
        return ParticipationWeights(w.p / nonempty, w.q / nonempty, 0.0, "closed form")
    if isinstance(process, (BandedParticipation, MarkovParticipation)):
        # Markov chains start stationary and are independent across clients, so every round's
        # set has the bernoulli(p) law: q is the same as bernoulli's.
        return _coins(process.p, "closed form")
    if isinstance(process, SineParticipation):
        per_phase = [_coins(row, "") for row in process.rates(np.arange(process.period))]
        return ParticipationWeights(
            np.mean([w.p for w in per_phase], axis=0), np.mean([w.q for w in per_phase], axis=0),
            float(np.mean([w.p_empty for w in per_phase])), "closed form (mean over one period)",
        )
    if isinstance(process, CyclicParticipation):
        sizes = np.bincount(process.labels, minlength=process.groups)
        q = 1.0 / (process.groups * sizes[process.labels])
        return ParticipationWeights(np.full(n, 1.0 / process.groups), q, 0.0, "closed form")
    if isinstance(process, ReshuffledCyclicParticipation):
        return ParticipationWeights(np.full(n, 1.0 / process.groups), np.full(n, 1.0 / n), 0.0, "closed form")
    if isinstance(process, WeightedParticipation):
        if process.m in (1, n):
            p = process.q.copy() if process.m == 1 else np.ones(n)
            return ParticipationWeights(p, p / process.m, 0.0, "closed form")
        p = process.nominal_p()  # Monte Carlo inside the process; |S| = m always, so q = p / m
        return ParticipationWeights(p, p / process.m, 0.0, "q = p/m, p by monte carlo")
    if isinstance(process, TraceParticipation):
        return monte_carlo_weights(process, process.recorded_rounds)._replace(method="exact over the trace")
    return monte_carlo_weights(process, mc_rounds)


class ExpectedMatrices(NamedTuple):
    R: np.ndarray
    A: np.ndarray
    C: np.ndarray
    W: np.ndarray  # doubly stochastic W(S) with the text's weight 1/|S|
    W_fedavg: np.ndarray  # FedAvg's mixing matrix of eq. (8)


def expected_matrices(weights: ParticipationWeights) -> ExpectedMatrices:
    """E over S of R(S), A(S), C(S), W(S) and W_mix(S), in closed form from p, q and P(empty)."""
    p, q, p0 = weights.p, weights.q, weights.p_empty
    n = p.size
    r = np.eye(n + 1)
    r[1:, 0] = p
    r[1:, 1:] = np.diag(1.0 - p)
    a = np.eye(n + 1)
    a[0] = np.concatenate([[p0], q])
    w = np.zeros((n + 1, n + 1))
    w[0] = w[:, 0] = np.concatenate([[p0], q])
    w[1:, 1:] = np.diag(1.0 - q)
    mix = np.tile(np.concatenate([[p0], q]), (n + 1, 1))
    return ExpectedMatrices(r, a, r.T.copy(), w, mix)


# -- quadratic problems -------------------------------------------------------------------------
class Quadratic(NamedTuple):
    """grad f_i(x) = H_i x - b_i for every client."""

    hessians: torch.Tensor  # [N, d, d]
    linear: torch.Tensor  # [N, d]

    def gradients(self, x: torch.Tensor) -> torch.Tensor:
        """grad f_i(x) for all clients at one point x [d]: [N, d]."""
        return self.hessians @ x - self.linear


def client_quadratics(problem: Problem) -> Quadratic:
    """Read H_i and b_i off the gradient oracle (d + 1 points per client) and check at a random
    point that the gradients are affine; ConfigError for non-quadratic or minibatch problems."""
    if getattr(problem, "batch", None):
        raise ConfigError("bias needs exact gradients: use a problem with batch=0")
    n, d = problem.num_clients, problem.dim
    dtype, device = problem.dtype, problem.device
    points = torch.cat([torch.zeros(1, d, dtype=dtype, device=device), torch.eye(d, dtype=dtype, device=device)])
    clients = torch.arange(n, device=device).repeat_interleave(d + 1)
    grads = problem.client_gradients(points.repeat(n, 1), clients, seed=0, round=0, step=0).reshape(n, d + 1, d)
    linear = -grads[:, 0]
    hessians = (grads[:, 1:] + linear[:, None, :]).transpose(1, 2)  # column j = H e_j
    hessians = 0.5 * (hessians + hessians.transpose(1, 2))
    quad = Quadratic(hessians, linear)
    probe = torch.randn(d, generator=torch.Generator().manual_seed(1), dtype=dtype).to(device)
    actual = problem.client_gradients(probe.expand(n, d), torch.arange(n, device=device), seed=0, round=0, step=0)
    expected = quad.gradients(probe)
    if not torch.allclose(actual, expected, rtol=1e-8, atol=1e-8 * float(expected.abs().max() + 1)):
        raise ConfigError(f"problem {problem.describe()['name']!r} is not quadratic: bias needs ridge-like problems")
    return quad


def weighted_target(quad: Quadratic, q) -> torch.Tensor:
    """argmin sum_i q_i f_i, the point FedAvg (tau = 1, small step) is pulled to."""
    qt = torch.as_tensor(np.asarray(q), dtype=quad.hessians.dtype, device=quad.hessians.device)
    lhs = torch.einsum("i,ide->de", qt, quad.hessians)
    return torch.linalg.solve(lhs, qt @ quad.linear)


def sampling_bias(quad: Quadratic, q, x: torch.Tensor) -> float:
    """delta_q^2(x) = || sum_i (q_i - 1/N) grad f_i(x) ||^2 (eq. 37 at the point x)."""
    n = quad.linear.shape[0]
    qt = torch.as_tensor(np.asarray(q), dtype=x.dtype, device=x.device)
    return float(torch.linalg.vector_norm((qt - 1.0 / n) @ quad.gradients(x)) ** 2)


def heterogeneity(quad: Quadratic, x: torch.Tensor) -> float:
    """sigma_G^2(x) = max_i || grad f_i(x) - grad F(x) ||^2 (Assumption 5 at the point x)."""
    grads = quad.gradients(x)
    return float((torch.linalg.vector_norm(grads - grads.mean(0), dim=1) ** 2).max())


def smoothness(quad: Quadratic) -> float:
    """L = max_i lambda_max(H_i)."""
    return float(torch.linalg.eigvalsh(quad.hessians).max())


# -- warm-up of FedAvg's average ----------------------------------------------------------------
class SlowestMode(NamedTuple):
    eigenvalue: float  # lambda_min(sum_i q_i H_i)
    rounds_per_efold: float  # T = 1 / (tau * eta * lambda_min)


def slowest_mode(quad: Quadratic, q, lr: float, local_steps: int = 1) -> SlowestMode:
    """The slowest mode of FedAvg's expected iteration.

    With tau = 1 and a memoryless process, E[x_{r+1}] = E[x_r] - eta sum_i q_i grad f_i(E[x_r])
    exactly (empty rounds weigh 0), so E[x_r] - x_q = (I - eta H_q)^r (x_0 - x_q) with
    H_q = sum_i q_i H_i, and the error along H_q's smallest eigenvector shrinks by e every
    T = 1/(eta lambda_min) rounds. With tau > 1 local steps, tau eta replaces eta (an estimate)."""
    hq = _weighted_hessian(quad, q)
    smallest = float(torch.linalg.eigvalsh(hq)[0])
    return SlowestMode(smallest, math.inf if smallest <= 0 else 1.0 / (local_steps * lr * smallest))


def warmup_in_average(
    quad: Quadratic, q, x0: torch.Tensor, lr: float, start: int, stop: int, local_steps: int = 1
) -> float:
    """|| mean_{r=start..stop} E[x_r] - x_q ||: what is left of the start x_0 in FedAvg's iterate
    averaged over rounds start..stop (inclusive), from the expected iteration of
    :func:`slowest_mode` (exact for tau = 1 and memoryless processes; an estimate otherwise)."""
    hq = _weighted_hessian(quad, q)
    eigenvalues, vectors = torch.linalg.eigh(hq)
    factor = (1.0 - local_steps * lr * eigenvalues).clamp(min=0.0)  # per-round contraction
    rounds = torch.arange(start, stop + 1, dtype=hq.dtype, device=hq.device)
    mean_powers = (factor[None, :] ** rounds[:, None]).mean(0)  # [d]
    offset = vectors.T @ (x0 - weighted_target(quad, q))
    return float(torch.linalg.vector_norm(vectors @ (mean_powers * offset)))


def _weighted_hessian(quad: Quadratic, q) -> torch.Tensor:
    qt = torch.as_tensor(np.asarray(q), dtype=quad.hessians.dtype, device=quad.hessians.device)
    return torch.einsum("i,ide->de", qt, quad.hessians)


# -- limit points -------------------------------------------------------------------------------
# -- unequal work -------------------------------------------------------------------------------
def local_gains(quad: Quadratic, lr: float, local_steps: int) -> torch.Tensor:
    """P_i(t) = eta sum_{s<t} (I - eta H_i)^s for t = 1..tau: [N, tau, d, d] (z_i = x - P_i(t) grad f_i(x))."""
    n, d = quad.linear.shape
    eye = torch.eye(d, dtype=quad.hessians.dtype, device=quad.hessians.device).expand(n, d, d)
    contraction = eye - lr * quad.hessians
    power, total, gains = eye.clone(), torch.zeros_like(quad.hessians), []
    for _ in range(local_steps):
        total = total + lr * power
        gains.append(total)
        power = power @ contraction
    return torch.stack(gains, dim=1)


def expected_gains(quad: Quadratic, lr: float, law: np.ndarray) -> torch.Tensor:
    """G_i = E[P_i(tau_i)] = sum_t P(tau_i = t) P_i(t), [N, d, d]; ``law`` [N, tau] from focusfl.work.step_law."""
    law_t = torch.as_tensor(np.asarray(law), dtype=quad.hessians.dtype, device=quad.hessians.device)
    return torch.einsum("it,itde->ide", law_t, local_gains(quad, lr, law_t.shape[1]))


def expected_round_fixed_point(quad: Quadratic, gains: torch.Tensor) -> torch.Tensor:
    """The x with sum_i K_i (H_i x - b_i) = 0: the fixed point of the expected round map
    E[x+] = x - sum_i K_i grad f_i(x) of an algorithm whose expected per-client gain is K_i [N, d, d]."""
    lhs = (gains @ quad.hessians).sum(0)
    rhs = (gains @ quad.linear[:, :, None]).sum(0)[:, 0]
    return torch.linalg.solve(lhs, rhs)


def fedavg_work_limit(quad: Quadratic, q, lr: float, law: np.ndarray) -> torch.Tensor:
    """x_w: the fixed point of FedAvg's expected round map, sum_i q_i G_i (H_i x - b_i) = 0 (module
    docstring); ``q`` its expected averaging weights, ``law`` [N, tau] the step-count law."""
    qt = torch.as_tensor(np.asarray(q), dtype=quad.hessians.dtype, device=quad.hessians.device)
    return expected_round_fixed_point(quad, qt[:, None, None] * expected_gains(quad, lr, law))


def fednova_work_limit(quad: Quadratic, lr: float, mask: np.ndarray, steps) -> torch.Tensor:
    """FedNova's (weighting "active") expected-round fixed point, estimated over the rounds of
    ``mask`` [R, N] and ``steps`` [R, N]: its gain is K_i = E[tau_eff w_i 1{i in S} P_i(tau_i) / tau_i]
    with w_i = 1/|S| and tau_eff = mean_{j in S} tau_j, which couples every client's count, so the
    expectation is the average over the sampled rounds (Monte Carlo; exact for deterministic ones)."""
    dtype, device = quad.hessians.dtype, quad.hessians.device
    active = torch.as_tensor(np.asarray(mask), dtype=dtype, device=device)
    counts = torch.as_tensor(np.asarray(steps), device=device).to(torch.int64).clamp(min=1)
    weights = active / active.sum(1, keepdim=True).clamp(min=1.0)
    tau_eff = (weights * counts.to(dtype)).sum(1, keepdim=True)
    coefficient = weights * tau_eff / counts.to(dtype)  # 0 for absent clients
    tau = int(counts.max())
    by_count = torch.stack([(coefficient * (counts == t)).mean(0) for t in range(1, tau + 1)], dim=1)
    return expected_round_fixed_point(quad, torch.einsum("it,itde->ide", by_count, local_gains(quad, lr, tau)))


def step_weighted_target(quad: Quadratic, q, mean_steps) -> torch.Tensor:
    """argmin sum_i q_i E[tau_i] f_i: FedAvg's limit under unequal work as eta -> 0."""
    return weighted_target(quad, np.asarray(q) * np.asarray(mean_steps))


class LimitPoints(NamedTuple):
    fedavg_average: torch.Tensor  # FedAvg's server model averaged over rounds average_from..R
    fedavg_last: torch.Tensor
    focus_last: torch.Tensor
    fednova_average: torch.Tensor | None = None  # FedNova's, when asked (limit_points(fednova_lr=...))
    fedavg_error: float = math.nan  # standard error of fedavg_average (batch means)
    fednova_error: float = math.nan


# Batches of the averaged window whose means estimate the average's standard error.
BATCHES = 10


def batch_standard_error(models: torch.Tensor, batches: int = BATCHES) -> float:
    """|| standard error || of the mean of ``models`` [T, d], from the spread of ``batches``
    consecutive batch means (they are nearly independent when a batch is long against the
    iterate's correlation time; shorter batches understate it); nan for fewer rows than batches."""
    if models.shape[0] < batches:
        return math.nan
    usable = models[: models.shape[0] // batches * batches]
    means = usable.reshape(batches, -1, models.shape[1]).mean(1)
    return float(torch.linalg.vector_norm(means.std(0)) / math.sqrt(batches))


def server_trajectory(
    algorithm, problem: Problem, mask: np.ndarray, seed: int = 0, steps=None, engine: str = "vectorized"
) -> torch.Tensor:
    """Server models x_0..x_R [R+1, d] of the per-client algorithm on the recorded active sets
    ``mask`` [R, N] (the round loop of every run, engine/loop.py, without evaluation rows);
    ``steps`` [R, N]: per-client step counts (a work process's table), None: tau."""
    algorithm = algorithm.prepare(problem, None, seed=seed)
    models = [algorithm.model(algorithm.init(problem.initial_point(), problem.num_clients))]
    work = None if steps is None else RecordedWork(steps, algorithm.local_steps)
    simulate(algorithm, problem, RecordedParticipation(mask), len(mask), seed=seed, engine=engine, eval_every=None,
             work=work, keep_rows=False, on_round=lambda result: models.append(algorithm.model(result.state)))
    return torch.stack(models)


def limit_points(
    problem: Problem, process, *, rounds: int, fedavg_lr: float, focus_lr: float,
    local_steps: int = 1, seed: int = 0, average_from: int | None = None, work=None,
    fednova_lr: float | None = None,
) -> LimitPoints:
    """FedAvg and FOCUS (and FedNova with ``fednova_lr``) run for ``rounds`` rounds on the same
    participation sequence and step counts (``work``: a work process, None: tau); FedAvg's and
    FedNova's iterates are averaged over rounds ``average_from``..``rounds`` (default: the second half)."""
    start = rounds // 2 if average_from is None else average_from
    if not 0 <= start <= rounds:
        raise ConfigError(f"the average must start within 0..{rounds}, got {start}")
    mask = process.mask(rounds)
    steps = None if work is None or work.fixed else work.active_table(mask)
    fedavg = server_trajectory(FedAvg(lr=fedavg_lr, local_steps=local_steps), problem, mask, seed, steps)
    focus = server_trajectory(Focus(lr=focus_lr, local_steps=local_steps), problem, mask, seed, steps)
    fednova, fednova_error = None, math.nan
    if fednova_lr is not None:
        trajectory = server_trajectory(FedNova(lr=fednova_lr, local_steps=local_steps), problem, mask, seed, steps)
        fednova, fednova_error = trajectory[start:].mean(0), batch_standard_error(trajectory[start:])
    return LimitPoints(fedavg[start:].mean(0), fedavg[-1], focus[-1], fednova,
                       batch_standard_error(fedavg[start:]), fednova_error)

"""The law of a work process's step counts: P(tau_{i,r} = t) for t = 1..tau, per client.

Used by the bias diagnostic (focusfl.matrix.bias), where FedAvg's expected round depends on
each client's count distribution. Closed forms for the registered processes (the Markov chains
start from their stationary law, so every round has it); a Monte Carlo estimate over the
process's own table otherwise.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from .base import WorkProcess, fraction_to_steps
from .processes import FixedWork, MarkovWork, RatesWork, UniformWork

MONTE_CARLO_ROUNDS = 20_000


class StepLaw(NamedTuple):
    probabilities: np.ndarray  # [N, tau]: column t-1 holds P(tau_i = t)
    method: str  # "closed form" or how it was estimated

    def mean(self) -> np.ndarray:
        """E[tau_i] per client, [N]."""
        return self.probabilities @ np.arange(1, self.probabilities.shape[1] + 1, dtype=np.float64)


def _point_masses(counts: np.ndarray, tau: int) -> np.ndarray:
    law = np.zeros((counts.size, tau))
    law[np.arange(counts.size), counts - 1] = 1.0
    return law


def step_law(work: WorkProcess, mc_rounds: int = MONTE_CARLO_ROUNDS) -> StepLaw:
    """P(tau_i = t) of every client: closed form where one exists, Monte Carlo otherwise."""
    n, tau = work.num_clients, work.local_steps
    if isinstance(work, FixedWork):
        return StepLaw(_point_masses(np.full(n, tau), tau), "closed form")
    if isinstance(work, UniformWork):
        return StepLaw(np.full((n, tau), 1.0 / tau), "closed form")
    if isinstance(work, RatesWork):
        return StepLaw(_point_masses(work.table(1)[0].numpy(), tau), "closed form")
    if isinstance(work, MarkovWork):
        # Stationary chains: slow with probability p in every round.
        law = (1.0 - work.p) * _point_masses(np.full(n, tau), tau)
        slow = int(fraction_to_steps(torch.tensor(work.slow), tau))
        law += work.p * _point_masses(np.full(n, slow), tau)
        return StepLaw(law, "closed form")
    table = work.table(mc_rounds).numpy()
    law = np.stack([(table == t).mean(axis=0) for t in range(1, tau + 1)], axis=1)
    return StepLaw(law, f"monte carlo ({mc_rounds} rounds)")

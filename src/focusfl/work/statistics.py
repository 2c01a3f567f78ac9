"""Statistics of a work process's step counts tau_{i,r}.

- The law P(tau_{i,r} = t) for t = 1..tau, per client (:func:`step_law`), used by the bias
  diagnostic (focusfl.matrix.bias), where FedAvg's expected round depends on each client's count
  distribution. Closed forms for the registered processes (the Markov chains start from their
  stationary law, so every round has it); a Monte Carlo estimate over the process's own table
  otherwise.
- The summary of ``focusfl work`` (:func:`summarize_work`), from the table T [R, N] of counts
  (every client, rounds 0..R-1, as WorkProcess.table gives it; a count is what client i would do
  if active in round r):
      mean_i  = (1/R) sum_r tau_{i,r}          min_i, max_i over r
      short_i = (1/R) #{r : tau_{i,r} < tau}   (the fraction of its rounds cut short)
  and their means over the clients.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from ..errors import ConfigError
from .base import WorkProcess, fraction_to_steps
from .processes import FixedWork, MarkovWork, RatesWork, UniformWork
from .trace import TraceWork

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
    if isinstance(work, TraceWork):  # the recorded rows themselves: a trace has no rounds beyond them
        return StepLaw(work.law(), "the trace's recorded rows")
    table = work.table(mc_rounds).numpy()
    law = np.stack([(table == t).mean(axis=0) for t in range(1, tau + 1)], axis=1)
    return StepLaw(law, f"monte carlo ({mc_rounds} rounds)")


@dataclass(frozen=True)
class WorkStats:
    """Per-client step statistics (lists of N numbers) and their means over the clients.

    Counted over the client-rounds that have a count: every one for a drawn process; for a
    trace, the rows it records (a client it never names has mean and short NaN, min and max 0,
    and is left out of the means over clients)."""

    local_steps: int
    rounds: int
    mean: list[float]
    min: list[int]
    max: list[int]
    short: list[float]
    counted: list[int]  # client-rounds counted per client

    def _named(self) -> list[int]:
        return [i for i, n in enumerate(self.counted) if n > 0]

    @property
    def mean_steps(self) -> float:
        """Mean count over the counted client-rounds of the clients with any."""
        named = self._named()
        return sum(self.mean[i] for i in named) / len(named) if named else math.nan

    @property
    def mean_short(self) -> float:
        """Fraction of client-rounds cut short (the mean of short_i over the clients with any)."""
        named = self._named()
        return sum(self.short[i] for i in named) / len(named) if named else math.nan

    @property
    def mean_min(self) -> float:
        named = self._named()
        return sum(self.min[i] for i in named) / len(named) if named else math.nan

    @property
    def mean_max(self) -> float:
        named = self._named()
        return sum(self.max[i] for i in named) / len(named) if named else math.nan


def summarize_work(table: torch.Tensor, local_steps: int) -> WorkStats:
    """WorkStats of the counts ``table`` (int64 [R, N], each in 1..local_steps, or 0 where a
    trace has no row: not counted)."""
    if table.dim() != 2 or table.shape[0] == 0 or table.shape[1] == 0:
        raise ConfigError(f"work statistics need a non-empty [rounds, clients] table, got shape {tuple(table.shape)}")
    counted = table > 0
    numbers = counted.sum(0)
    divisor = numbers.clamp(min=1).to(torch.float64)
    none = numbers == 0
    nan = torch.full_like(divisor, math.nan)
    big = torch.iinfo(torch.int64).max
    lowest = torch.where(counted, table, torch.full_like(table, big)).min(0).values
    return WorkStats(
        local_steps=local_steps,
        rounds=table.shape[0],
        mean=torch.where(none, nan, table.to(torch.float64).sum(0) / divisor).tolist(),
        min=torch.where(none, torch.zeros_like(lowest), lowest).tolist(),
        max=table.max(0).values.tolist(),
        short=torch.where(none, nan, (counted & (table < local_steps)).to(torch.float64).sum(0) / divisor).tolist(),
        counted=numbers.tolist(),
    )

"""Statistics of a work process's step counts (``focusfl work``): how much each client does.

From the table T [R, N] of counts tau_{i,r} (every client, rounds 0..R-1, as WorkProcess.table
gives it; a count is what client i would do if active in round r):
    mean_i  = (1/R) sum_r tau_{i,r}          min_i, max_i over r
    short_i = (1/R) #{r : tau_{i,r} < tau}   (the fraction of its rounds cut short)
and their means over the clients.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import ConfigError


@dataclass(frozen=True)
class WorkStats:
    """Per-client step statistics (lists of N numbers) and their means over the clients."""

    local_steps: int
    rounds: int
    mean: list[float]
    min: list[int]
    max: list[int]
    short: list[float]

    @property
    def mean_steps(self) -> float:
        """Mean count over clients and rounds."""
        return sum(self.mean) / len(self.mean)

    @property
    def mean_short(self) -> float:
        """Fraction of client-rounds cut short (the mean of short_i over the clients)."""
        return sum(self.short) / len(self.short)


def summarize_work(table: torch.Tensor, local_steps: int) -> WorkStats:
    """WorkStats of the counts ``table`` (int64 [R, N], each in 1..local_steps)."""
    if table.dim() != 2 or table.shape[0] == 0 or table.shape[1] == 0:
        raise ConfigError(f"work statistics need a non-empty [rounds, clients] table, got shape {tuple(table.shape)}")
    counts = table.to(torch.float64)
    return WorkStats(
        local_steps=local_steps,
        rounds=table.shape[0],
        mean=counts.mean(0).tolist(),
        min=table.min(0).values.tolist(),
        max=table.max(0).values.tolist(),
        short=(table < local_steps).to(torch.float64).mean(0).tolist(),
    )

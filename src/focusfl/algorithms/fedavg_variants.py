"""FedAvg's weightings under their own names (FOCUS paper section 3; ALGORITHMS.md section 2).

``fedavg_all`` divides the summed updates by N instead of |S_r|; ``fedavg_known_p`` divides
each client's update by N p_i with the participation rates p_i known in advance (taken from
the participation process's nominal rates unless given), which makes the expected update
unbiased. Both are FedAvg (algorithms/fedavg.py) with another default ``weighting``; they are
registered as aliases of ``fedavg`` so that figures of "every algorithm" skip them.
"""
from __future__ import annotations

from dataclasses import dataclass

from .fedavg import FedAvg


@dataclass(frozen=True)
class FedAvgAll(FedAvg):
    name = "fedavg_all"
    summary = "FedAvg dividing by N instead of |S_r| (weighting=all)"
    alias_of = "fedavg"

    weighting: str = "all"


@dataclass(frozen=True)
class FedAvgKnownP(FedAvg):
    name = "fedavg_known_p"
    summary = "FedAvg weighting client i by 1/(N p_i) with known rates p_i (weighting=known_p)"
    alias_of = "fedavg"

    weighting: str = "known_p"

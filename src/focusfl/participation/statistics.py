"""Statistics of a participation mask: empirical p_i and q_i, and the delay metrics.

- p_i = fraction of rounds with i in S_r: the participation rate, what FOCUS needs positive.
- q_i = mean over rounds of 1{i in S_r} / |S_r| (empty rounds contribute 0): the averaging weight
  FedAvg gives client i, hence the objective sum_i q_i f_i FedAvg is biased toward. sum_i q_i is
  the fraction of non-empty rounds.
- delays (ALGORITHMS.md section 3): l_i(r) = last t <= r with i in S_t (-1 if never), and
  tau(r) = max_i (r - l_i(r)): the age of the stalest client contribution a tracking method
  (FOCUS, FedSUM, MIFA) still holds at round r.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ConfigError

# Rounds processed per block in delays(): bounds the [block, N] int64 temporaries.
_DELAY_BLOCK = 4096


def as_mask(mask: Any) -> np.ndarray:
    """A 2-D bool array ``[rounds, clients]`` (0/1 ints accepted); ConfigError otherwise."""
    arr = np.asarray(mask)
    if arr.ndim != 2:
        raise ConfigError(f"participation mask must be 2-D [rounds, clients], got shape {arr.shape}")
    if arr.dtype != bool:
        if not np.isin(arr, (0, 1)).all():
            raise ConfigError("participation mask must contain only 0/1 or booleans")
        arr = arr.astype(bool)
    return arr


def empirical_p(mask: Any) -> np.ndarray:
    """Fraction of rounds each client took part in, float64 ``[N]`` (zeros for zero rounds)."""
    m = as_mask(mask)
    return m.mean(axis=0) if m.shape[0] else np.zeros(m.shape[1])


def empirical_q(mask: Any) -> np.ndarray:
    """Mean over rounds of 1{i in S_r} / |S_r|, empty rounds contributing 0, float64 ``[N]``."""
    m = as_mask(mask)
    if m.shape[0] == 0:
        return np.zeros(m.shape[1])
    sizes = m.sum(axis=1)
    weight = np.divide(1.0, sizes, out=np.zeros(sizes.shape), where=sizes > 0)
    return (weight @ m) / m.shape[0]


def last_seen(mask: Any) -> np.ndarray:
    """l_i(r) = last round t <= r with i in S_t, -1 if never; int64 ``[rounds, N]``."""
    m = as_mask(mask)
    stamped = np.where(m, np.arange(m.shape[0], dtype=np.int64)[:, None], np.int64(-1))
    return np.maximum.accumulate(stamped, axis=0)


def delays(mask: Any) -> np.ndarray:
    """tau(r) = max_i (r - l_i(r)), int64 ``[rounds]``; a client never seen by round r counts r + 1.

    Computed in blocks of rounds, carrying l(r) across blocks, so memory stays O(block * N).
    """
    m = as_mask(mask)
    rounds, n = m.shape
    tau = np.zeros(rounds, dtype=np.int64)
    if n == 0:
        return tau
    carry = np.full(n, -1, dtype=np.int64)
    for start in range(0, rounds, _DELAY_BLOCK):
        block = m[start : start + _DELAY_BLOCK]
        r = np.arange(start, start + block.shape[0], dtype=np.int64)
        stamped = np.where(block, r[:, None], carry[None, :])
        last = np.maximum.accumulate(stamped, axis=0)
        tau[start : start + block.shape[0]] = r - last.min(axis=1)
        carry = last[-1]
    return tau


@dataclass
class ParticipationStats:
    """What every process reports (ALGORITHMS.md section 5): rates, weights, delays, set sizes."""

    p: np.ndarray  # empirical participation rate per client [N]
    q: np.ndarray  # empirical averaging weight per client [N]
    tau: np.ndarray  # delay per round [R]
    tau_max: int  # max over rounds of tau (0 for zero rounds)
    tau_avg: float  # mean over rounds of tau (0.0 for zero rounds)
    empty_rounds: int  # rounds with S_r empty
    mean_active: float  # mean |S_r| (0.0 for zero rounds)

    def to_dict(self, per_round: bool = False) -> dict[str, Any]:
        """JSON-serialisable summary; the per-round tau list only with ``per_round`` (it can be long)."""
        out: dict[str, Any] = {
            "rounds": int(self.tau.size),
            "clients": int(self.p.size),
            "tau_max": self.tau_max,
            "tau_avg": self.tau_avg,
            "empty_rounds": self.empty_rounds,
            "mean_active": self.mean_active,
            "p": self.p.tolist(),
            "q": self.q.tolist(),
        }
        if per_round:
            out["tau"] = self.tau.tolist()
        return out


def summarize(mask: Any) -> ParticipationStats:
    """All statistics of a mask ``[rounds, clients]`` (what ``focusfl participation`` prints)."""
    m = as_mask(mask)
    tau = delays(m)
    sizes = m.sum(axis=1)
    return ParticipationStats(
        p=empirical_p(m),
        q=empirical_q(m),
        tau=tau,
        tau_max=int(tau.max()) if tau.size else 0,
        tau_avg=float(tau.mean()) if tau.size else 0.0,
        empty_rounds=int(np.sum(sizes == 0)),
        mean_active=float(sizes.mean()) if sizes.size else 0.0,
    )

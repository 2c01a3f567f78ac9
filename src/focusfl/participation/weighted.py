"""Weighted sampling: m clients without replacement, with probabilities proportional to q_i.

FOCUS's "case 3". Sampling is sequential (like ``Generator.choice(replace=False, p=q)``) and is
drawn with the equivalent exponential-key form: client i gets key E_i / q_i with E_i ~ Exp(1), and
the m smallest keys win (Efraimidis-Spirakis). That form is vectorised, which is what makes the
Monte Carlo estimate of the marginals cheap.
"""
from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from ..errors import ConfigError
from .base import MemorylessProcess, check_int, param_rng, per_client, round_rng, to_list
from .full import default_m

# Monte Carlo size and chunk for nominal_p: the standard error is at most 0.5/sqrt(20000) = 0.0035.
NOMINAL_DRAWS = 20_000
_MC_CHUNK = 2_000
# The range of every q_i. q is a relative weight (its scale does not matter), drawn from through
# the keys E_i / q_i and normalised by its sum: within [1e-100, 1e100] the keys (E_i <= ~40) and
# the sum of up to 10^200 clients stay ordinary floats; beyond it they overflow or lose their
# digits (q=1e308 on 4 clients sums to inf, q=1e-310 makes every key inf).
Q_RANGE = (1e-100, 1e100)
# Sub-streams of the parameter stream (see base.param_rng).
_Q_SUBSTREAM = 1
_MC_SUBSTREAM = 2


def smallest_keys(keys: np.ndarray, m: int) -> np.ndarray:
    """Indices of the m smallest entries of each row of ``keys`` (unordered)."""
    if m == keys.shape[-1]:
        return np.broadcast_to(np.arange(m), keys.shape).copy()
    return np.argpartition(keys, m - 1, axis=-1)[..., :m]


class WeightedParticipation(MemorylessProcess):
    """m of N without replacement, P proportional to q_i; default q_i proportional to U(0,1) + 0.01.

    The marginal P(i in S) is not q_i * m in general (without replacement flattens it), so
    :meth:`nominal_p` is exact where a closed form exists (m = 1, m = N, equal q) and otherwise a
    cached Monte Carlo estimate with a fixed seed.
    """

    name: ClassVar[str] = "weighted"
    STREAM: ClassVar[int] = 5
    DEFAULTS: ClassVar[dict[str, Any]] = {"m": None, "q": None}

    def __init__(self, num_clients: int, seed: int = 0, m: int | None = None, q: Any = None) -> None:
        super().__init__(num_clients, seed)
        where = f"participation {self.name}"
        self.m = default_m(self.num_clients) if m is None else check_int(where, "m", m, 1, self.num_clients)
        if q is None:
            q = param_rng(self.seed, _Q_SUBSTREAM).uniform(0.0, 1.0, size=self.num_clients) + 0.01
        q = per_client(where, "q", q, self.num_clients)
        if np.any(q <= 0):
            i = int(np.flatnonzero(q <= 0)[0])
            raise ConfigError(f"{where}: q[{i}]={q[i]:g} must be > 0 (a client with q = 0 is never sampled)")
        outside = np.flatnonzero((q < Q_RANGE[0]) | (q > Q_RANGE[1]))
        if outside.size:
            i = int(outside[0])
            raise ConfigError(f"{where}: q[{i}]={q[i]:g} is outside [{Q_RANGE[0]:g}, {Q_RANGE[1]:g}] "
                              f"(a relative weight: scale q into that range)")
        # Kept as given: draws use these exact values (the scale of q does not matter), so
        # describe() -> make_participation rebuilds bit-identical masks. ``q`` is the normalised view.
        self.q_raw = q
        self.q = q / q.sum()
        self._nominal: np.ndarray | None = None

    def _draw_round(self, r: int) -> np.ndarray:
        keys = round_rng(self.seed, self.STREAM, r).exponential(size=self.num_clients) / self.q_raw
        row = np.zeros(self.num_clients, dtype=bool)
        row[smallest_keys(keys, self.m)] = True
        return row

    def nominal_p(self) -> np.ndarray:
        if self._nominal is None:
            self._nominal = self._compute_nominal()
        return self._nominal.copy()

    def _compute_nominal(self) -> np.ndarray:
        n, m = self.num_clients, self.m
        if m == n:
            return np.ones(n)
        if m == 1:
            return self.q.copy()
        if np.allclose(self.q, self.q[0], rtol=0, atol=1e-15):
            return np.full(n, m / n)
        rng = param_rng(self.seed, _MC_SUBSTREAM)
        counts = np.zeros(n, dtype=np.int64)
        for start in range(0, NOMINAL_DRAWS, _MC_CHUNK):
            size = min(_MC_CHUNK, NOMINAL_DRAWS - start)
            keys = rng.exponential(size=(size, n)) / self.q_raw
            counts += np.bincount(smallest_keys(keys, m).ravel(), minlength=n)
        return counts / NOMINAL_DRAWS

    def _params(self) -> dict[str, Any]:
        return {"m": self.m, "q": to_list(self.q_raw)}

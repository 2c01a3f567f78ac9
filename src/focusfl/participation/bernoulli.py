"""Independent per-client coins: bernoulli (constant p_i), sine (p_i(r) periodic), banded (p by index band).

All three flip one coin per client per round, ``u_i < p_i(r)`` with ``u`` drawn from round r's own
stream, so the set sizes |S_r| vary and rounds may be empty; that is FOCUS's "case 2" and the
FedSUM/FedAWE time-varying and banded settings.
"""
from __future__ import annotations

import abc
import math
from typing import Any, ClassVar

import numpy as np

from ..errors import ConfigError
from ..limits import check_allocation
from .base import (
    MemorylessProcess,
    check_int,
    check_probabilities,
    check_rate,
    check_real,
    resolve_rates,
    round_rng,
    to_list,
)

# Cap on redraws of one round: with every p_i > 0 an empty round has probability < 1, so this is
# reached only when the p_i are so small that replaying "until non-empty" is not what was meant.
MAX_REDRAWS = 10_000


class IndependentCoins(MemorylessProcess):
    """Client i joins round r with probability p_i(r), independently of everything else."""

    @abc.abstractmethod
    def rates(self, rounds: np.ndarray) -> np.ndarray:
        """p_i(r) for the given rounds, float64 ``[len(rounds), N]`` (or broadcastable) in [0, 1]."""

    def _uniforms(self, r: int, attempt: int = 0) -> np.ndarray:
        """The N uniforms of round r (attempt > 0: a redraw, on its own sub-stream)."""
        extra = (attempt,) if attempt else ()
        return round_rng(self.seed, self.STREAM, r, *extra).random(self.num_clients)

    def _rows(self, start: int, stop: int) -> np.ndarray:
        # One generator per round (the expensive part), then a single vectorised comparison.
        u = np.empty((stop - start, self.num_clients))
        for k, r in enumerate(range(start, stop)):
            u[k] = self._uniforms(r)
        return u < self.rates(np.arange(start, stop))

    def _draw_round(self, r: int) -> np.ndarray:
        return self._rows(r, r + 1)[0]


# Sub-stream of a round's sparse draw (draw=sparse): never the dense draw's stream.
_SPARSE_STREAM = 1 << 20
DRAWS = ("dense", "sparse")


class BernoulliParticipation(IndependentCoins):
    """Constant p_i per client; the FOCUS reference preset when p is unset.

    With ``redraw`` the whole round is redrawn (attempt k uses the stream ``[seed, STREAM, r, k]``)
    while it comes out empty, i.e. S_r is conditioned on being non-empty; the marginals then become
    p_i / (1 - prod_j (1 - p_j)), which :meth:`nominal_p` reports.

    ``draw=sparse`` draws the same process another way, in time O(N max_i p_i) a round instead of
    N uniforms: the gaps between candidates are geometric with rate p_max = max_i p_i, and a
    candidate i stays with probability p_i / p_max (thinning), so client i is in S_r with
    probability p_i, independently of every other client and round. Its draws come from their
    own streams, so its sets differ from the dense draw's (``dense``, the default, keeps every
    recorded run's sets); with a small common p (cross-device: p = 10^-3 of 10^6 clients) a
    round costs about p N draws.
    """

    name: ClassVar[str] = "bernoulli"
    STREAM: ClassVar[int] = 2
    DEFAULTS: ClassVar[dict[str, Any]] = {"p": None, "redraw": False, "draw": "dense"}

    def __init__(self, num_clients: int, seed: int = 0, p: Any = None, redraw: bool = False,
                 draw: str = "dense") -> None:
        super().__init__(num_clients, seed)
        self.p = resolve_rates(f"participation {self.name}", self.seed, self.num_clients, p)
        if not isinstance(redraw, (bool, np.bool_)):
            raise ConfigError(f"participation {self.name}: redraw={redraw!r} is not a boolean")
        self.redraw = bool(redraw)
        if draw not in DRAWS:
            raise ConfigError(f"participation {self.name}: draw={draw!r} must be dense or sparse")
        self.draw = draw
        self.direct = draw == "sparse"
        self._p_max = float(self.p.max())

    def rates(self, rounds: np.ndarray) -> np.ndarray:
        return self.p[None, :]

    def _rows(self, start: int, stop: int) -> np.ndarray:
        if self.draw == "sparse":
            rows = np.zeros((stop - start, self.num_clients), dtype=bool)
            for k, chosen in enumerate(self._active_sets(start, stop)):
                rows[k, chosen] = True
            return rows
        rows = super()._rows(start, stop)
        if self.redraw:
            for k in np.flatnonzero(~rows.any(axis=1)):
                rows[k] = self._redraw(start + int(k))
        return rows

    def _redraw(self, r: int) -> np.ndarray:
        """Round r conditioned on being non-empty: attempts 1, 2, ... until one is."""
        for attempt in range(1, MAX_REDRAWS + 1):
            row = self._uniforms(r, attempt) < self.p
            if row.any():
                return row
        raise _still_empty(self.name, r)

    # -- draw=sparse ------------------------------------------------------------------------------
    def _active_sets(self, start: int, stop: int) -> list[np.ndarray]:
        sets = []
        for r in range(start, stop):
            chosen = self._sparse(r, 0)
            attempt = 0
            while self.redraw and not chosen.size:
                attempt += 1
                if attempt > MAX_REDRAWS:
                    raise _still_empty(self.name, r)
                chosen = self._sparse(r, attempt)
            sets.append(chosen)
        return sets

    def _sparse(self, r: int, attempt: int) -> np.ndarray:
        """Round r's set by geometric gaps at rate p_max, thinned to p_i (sorted int64)."""
        rng = round_rng(self.seed, self.STREAM, r, _SPARSE_STREAM + attempt)
        n, rate = self.num_clients, self._p_max
        if rate >= 1.0:
            candidates = np.arange(n, dtype=np.int64)
        else:
            expected = n * rate
            positions, last = [], -1
            while last < n - 1:  # usually one batch: the expected count and five standard deviations
                gaps = rng.geometric(rate, size=int(expected + 5 * math.sqrt(expected) + 16))
                batch = last + np.cumsum(gaps)
                positions.append(batch)
                last = int(batch[-1])
            candidates = np.concatenate(positions)
            candidates = candidates[candidates < n]
        keep = rng.random(candidates.size) * rate < self.p[candidates]
        return candidates[keep].astype(np.int64)

    def nominal_p(self) -> np.ndarray:
        if not self.redraw:
            return self.p.copy()
        # P(non-empty) = 1 - prod(1 - p_j), in log space so that it stays accurate when tiny.
        with np.errstate(divide="ignore"):
            p_nonempty = -math.expm1(float(np.sum(np.log1p(-self.p))))
        return self.p / p_nonempty

    def _params(self) -> dict[str, Any]:
        if self.draw == "dense":  # as every run before draw existed recorded it
            return {"p": to_list(self.p), "redraw": self.redraw}
        # One rate for everyone is recorded as one number: config.json stays small at N = 10^6.
        same = bool(np.all(self.p == self.p[0]))
        return {"p": float(self.p[0]) if same else to_list(self.p), "redraw": self.redraw, "draw": self.draw}


def _still_empty(name: str, r: int) -> ConfigError:
    return ConfigError(f"participation {name}: round {r} still empty after {MAX_REDRAWS} redraws; p is too small")


class SineParticipation(IndependentCoins):
    """Time-varying rates p_i(r) = clip(p_i (a sin(2 pi r / period) + 1 - a), 0, 1) (FedSUM P3, FedAWE).

    Every client's rate rises and falls together, so whole stretches of rounds are sparse: a
    stress test for methods that assume stationary participation.
    """

    name: ClassVar[str] = "sine"
    STREAM: ClassVar[int] = 3
    DEFAULTS: ClassVar[dict[str, Any]] = {"p": None, "a": 0.3, "period": 20}

    def __init__(
        self, num_clients: int, seed: int = 0, p: Any = None, a: float = 0.3, period: int = 20
    ) -> None:
        super().__init__(num_clients, seed)
        where = f"participation {self.name}"
        self.p = resolve_rates(where, self.seed, self.num_clients, p)
        self.a = check_real(where, "a", a)
        if not 0.0 <= self.a <= 1.0:
            raise ConfigError(f"{where}: a={self.a:g} must be in [0, 1]")
        self.period = check_int(where, "period", period, 1)
        # a table of one period, and nominal_p's rates over one period for every client
        check_allocation(8 * self.period * (self.num_clients + 2),
                         f"{where}: period={self.period:,} x {self.num_clients:,} clients", error=ConfigError)
        phase = np.arange(self.period)
        self._factor = self.a * np.sin(2.0 * np.pi * phase / self.period) + 1.0 - self.a

    def rates(self, rounds: np.ndarray) -> np.ndarray:
        # One table per period, indexed by phase: a round's rate never depends on which block of
        # rounds it was computed with (prefix consistency down to the last bit).
        factor = self._factor[np.asarray(rounds) % self.period]
        return np.clip(self.p[None, :] * factor[:, None], 0.0, 1.0)

    def nominal_p(self) -> np.ndarray:
        """Mean of p_i(r) over one period (p_i(r) is periodic in r with exactly that period)."""
        return self.rates(np.arange(self.period)).mean(axis=0)

    def cycle(self) -> int:
        return self.period

    def _params(self) -> dict[str, Any]:
        return {"p": to_list(self.p), "a": self.a, "period": self.period}


class BandedParticipation(IndependentCoins):
    """Clients in index bands of ``width``; band b has p = max(top - step*b, floor) (FedSUM H.8).

    Deterministic heterogeneity tied to the client index: with data partitions that are also
    ordered by index, rate and data become correlated, the setting where FedAvg's bias shows most.
    """

    name: ClassVar[str] = "banded"
    STREAM: ClassVar[int] = 4
    DEFAULTS: ClassVar[dict[str, Any]] = {"width": 11, "top": 0.5, "step": 0.05, "floor": 0.01}

    def __init__(
        self,
        num_clients: int,
        seed: int = 0,
        width: int = 11,
        top: float = 0.5,
        step: float = 0.05,
        floor: float = 0.01,
    ) -> None:
        super().__init__(num_clients, seed)
        where = f"participation {self.name}"
        self.width = check_int(where, "width", width, 1)
        # top and floor are rates themselves: a top below the floor (top=-1e300) would leave
        # every band at the floor and the spec saying something else than the process draws.
        self.top = check_rate(where, "top", top)
        self.step = check_real(where, "step", step)
        self.floor = check_rate(where, "floor", floor)
        if self.step < 0:
            raise ConfigError(f"{where}: step={self.step:g} must be >= 0")
        if self.floor > self.top:
            raise ConfigError(f"{where}: floor={self.floor:g} is above top={self.top:g} (every band would "
                              f"have the floor)")
        band = np.arange(self.num_clients) // self.width
        self.p = check_probabilities(where, "p", np.maximum(self.top - self.step * band, self.floor))

    def rates(self, rounds: np.ndarray) -> np.ndarray:
        return self.p[None, :]

    def nominal_p(self) -> np.ndarray:
        return self.p.copy()

    def _params(self) -> dict[str, Any]:
        return {"width": self.width, "top": self.top, "step": self.step, "floor": self.floor}

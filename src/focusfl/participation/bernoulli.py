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
from .base import (
    MemorylessProcess,
    check_int,
    check_probabilities,
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


class BernoulliParticipation(IndependentCoins):
    """Constant p_i per client; the FOCUS reference preset when p is unset.

    With ``redraw`` the whole round is redrawn (attempt k uses the stream ``[seed, STREAM, r, k]``)
    while it comes out empty, i.e. S_r is conditioned on being non-empty; the marginals then become
    p_i / (1 - prod_j (1 - p_j)), which :meth:`nominal_p` reports.
    """

    name: ClassVar[str] = "bernoulli"
    STREAM: ClassVar[int] = 2
    DEFAULTS: ClassVar[dict[str, Any]] = {"p": None, "redraw": False}

    def __init__(self, num_clients: int, seed: int = 0, p: Any = None, redraw: bool = False) -> None:
        super().__init__(num_clients, seed)
        self.p = resolve_rates(f"participation {self.name}", self.seed, self.num_clients, p)
        if not isinstance(redraw, (bool, np.bool_)):
            raise ConfigError(f"participation {self.name}: redraw={redraw!r} is not a boolean")
        self.redraw = bool(redraw)

    def rates(self, rounds: np.ndarray) -> np.ndarray:
        return self.p[None, :]

    def _rows(self, start: int, stop: int) -> np.ndarray:
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
        raise ConfigError(
            f"participation {self.name}: round {r} still empty after {MAX_REDRAWS} redraws; p is too small"
        )

    def nominal_p(self) -> np.ndarray:
        if not self.redraw:
            return self.p.copy()
        # P(non-empty) = 1 - prod(1 - p_j), in log space so that it stays accurate when tiny.
        with np.errstate(divide="ignore"):
            p_nonempty = -math.expm1(float(np.sum(np.log1p(-self.p))))
        return self.p / p_nonempty

    def _params(self) -> dict[str, Any]:
        return {"p": to_list(self.p), "redraw": self.redraw}


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
        self.top = check_real(where, "top", top)
        self.step = check_real(where, "step", step)
        self.floor = check_real(where, "floor", floor)
        if self.step < 0:
            raise ConfigError(f"{where}: step={self.step:g} must be >= 0")
        band = np.arange(self.num_clients) // self.width
        self.p = check_probabilities(where, "p", np.maximum(self.top - self.step * band, self.floor))

    def rates(self, rounds: np.ndarray) -> np.ndarray:
        return self.p[None, :]

    def nominal_p(self) -> np.ndarray:
        return self.p.copy()

    def _params(self) -> dict[str, Any]:
        return {"width": self.width, "top": self.top, "step": self.step, "floor": self.floor}

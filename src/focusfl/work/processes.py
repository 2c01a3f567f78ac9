"""Work processes: fixed (everyone does tau), uniform (tau_i,r uniform on 1..tau), rates (each
client a fixed fraction of tau: slow devices), markov (a device stays slow for a while)."""
from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch

from .. import rng
from ..errors import ConfigError
from ..participation.base import check_real, param_rng, per_client, to_list
from .base import WorkProcess, fraction_to_steps

# Streams of the hash (distinct from every minibatch draw, whose first key is the run's seed
# alone): work draws are keyed (seed, WORK_STREAM + k, round, client).
WORK_STREAM = 91_000
# Sub-stream of the participation parameter stream used for default per-client rates.
RATES_PARAM = 91


class FixedWork(WorkProcess):
    """Every active client does all tau steps (the classical setting; today's runs)."""

    name: ClassVar[str] = "fixed"
    fixed: ClassVar[bool] = True

    def _counts(self, round_: int) -> torch.Tensor:
        return torch.full((self.num_clients,), self.local_steps, dtype=torch.int64)


class UniformWork(WorkProcess):
    """tau_{i,r} uniform on 1..tau, independent over clients and rounds."""

    name: ClassVar[str] = "uniform"
    STREAM: ClassVar[int] = WORK_STREAM + 1

    def _counts(self, round_: int) -> torch.Tensor:
        u = rng.uniform(self.seed, self.STREAM, round_, torch.arange(self.num_clients))
        return (1 + torch.floor(u * self.local_steps).to(torch.int64)).clamp(1, self.local_steps)


class RatesWork(WorkProcess):
    """Client i always does round(r_i tau) steps (at least 1): devices of different speeds.

    ``r``: one fraction in (0, 1] for all clients or one per client (``r=0.25;1;1;...``);
    default: r_i ~ U(0.1, 1) drawn from the seed's parameter stream.
    """

    name: ClassVar[str] = "rates"
    DEFAULTS: ClassVar[dict[str, Any]] = {"r": None}

    def __init__(self, num_clients: int, local_steps: int, seed: int = 0, r: Any = None) -> None:
        super().__init__(num_clients, local_steps, seed)
        where = f"work {self.name}"
        if r is None:
            self.r = param_rng(self.seed, RATES_PARAM).uniform(0.1, 1.0, size=self.num_clients)
        else:
            self.r = _fractions(where, "r", per_client(where, "r", r, self.num_clients))
        self._steps = fraction_to_steps(torch.from_numpy(self.r), self.local_steps)

    def _counts(self, round_: int) -> torch.Tensor:
        return self._steps.clone()

    def _params(self) -> dict[str, Any]:
        return {"r": to_list(self.r)}


class MarkovWork(WorkProcess):
    """Each device is fast (tau steps) or slow (round(slow * tau) steps, at least 1), and stays so.

    A two-state chain per client, started from its stationary law: P(slow) = p in the long run
    and the lag-one autocorrelation of the slow indicator is rho, i.e. the stay probabilities
    are P(slow -> slow) = p + rho (1 - p) and P(fast -> fast) = 1 - p (1 - rho) (the same
    parametrization as the markov participation process). States are computed forward from
    round 0 (each round's uniforms keyed by (seed, stream, round, client)); the last state is
    cached, so a run that goes round by round pays one step per round.
    """

    name: ClassVar[str] = "markov"
    STREAM: ClassVar[int] = WORK_STREAM + 2
    DEFAULTS: ClassVar[dict[str, Any]] = {"p": 0.3, "rho": 0.8, "slow": 0.25}

    def __init__(self, num_clients: int, local_steps: int, seed: int = 0,
                 p: float = 0.3, rho: float = 0.8, slow: float = 0.25) -> None:
        super().__init__(num_clients, local_steps, seed)
        where = f"work {self.name}"
        self.p = check_real(where, "p", p)
        self.rho = check_real(where, "rho", rho)
        self.slow = check_real(where, "slow", slow)
        if not 0.0 <= self.p <= 1.0:
            raise ConfigError(f"{where}: p={self.p:g} must be in [0, 1]")
        if not 0.0 <= self.rho < 1.0:
            raise ConfigError(f"{where}: rho={self.rho:g} must be in [0, 1)")
        _fractions(where, "slow", np.array([self.slow]))
        self.stay_slow = self.p + self.rho * (1.0 - self.p)
        self.become_slow = self.p * (1.0 - self.rho)
        self._slow_steps = int(fraction_to_steps(torch.tensor(self.slow), self.local_steps))
        self._next, self._state = 0, None  # cache: state of round _next - 1

    def slow_state(self, round_: int) -> torch.Tensor:
        """Bool ``[N]``: which devices are slow in round ``round_``."""
        if self._state is None or round_ < self._next - 1:
            self._next, self._state = 0, None
        if self._state is not None and round_ == self._next - 1:
            return self._state.clone()
        clients = torch.arange(self.num_clients)
        state = self._state
        for r in range(self._next, round_ + 1):
            u = rng.uniform(self.seed, self.STREAM, r, clients)
            threshold = (torch.full_like(u, self.p) if state is None
                         else torch.where(state, torch.tensor(self.stay_slow, dtype=u.dtype),
                                          torch.tensor(self.become_slow, dtype=u.dtype)))
            state = u < threshold
        self._next, self._state = round_ + 1, state
        return state.clone()

    def _counts(self, round_: int) -> torch.Tensor:
        slow = self.slow_state(round_)
        return torch.where(slow, self._slow_steps, self.local_steps).to(torch.int64)

    def _params(self) -> dict[str, Any]:
        return {"p": self.p, "rho": self.rho, "slow": self.slow}


def _fractions(where: str, key: str, values: np.ndarray) -> np.ndarray:
    bad = np.flatnonzero(~((values > 0) & (values <= 1)))
    if bad.size:
        i = int(bad[0])
        raise ConfigError(f"{where}: {key}[{i}]={values[i]:g} is outside (0, 1]")
    return values

"""Markov participation: each client is a two-state (absent/present) chain with memory.

The FOCUS paper's stated limitation is that its analysis assumes independence across rounds;
this process breaks that while keeping each client's long-run rate p_i. Client i moves with
P(1 -> 1) = p_i + rho_i (1 - p_i) and P(0 -> 1) = p_i (1 - rho_i): the stationary law is
Bernoulli(p_i) and the lag-one autocorrelation of the indicator is exactly rho_i (the second
eigenvalue of the transition matrix), so rho_i = 0 is the bernoulli process and rho_i -> 1 gives
long runs of presence and absence (long delays).
"""
from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from ..errors import ConfigError
from .base import ParticipationProcess, param_rng, per_client, rate_preset, resolve_rates, round_rng, to_list


class MarkovParticipation(ParticipationProcess):
    """Heterogeneous two-state chains, started from their stationary law.

    Round r's uniforms come from round r's own stream, but the state depends on round r - 1, so
    rows are computed forward from round 0 (the base class continues from the last row computed).
    Defaults: p_i from the FOCUS preset (the same p_i as bernoulli with the same seed), rho_i ~
    U(0.5, 0.9), drawn after the preset from the parameter stream.
    """

    name: ClassVar[str] = "markov"
    sequential: ClassVar[bool] = True
    STREAM: ClassVar[int] = 6
    DEFAULTS: ClassVar[dict[str, Any]] = {"p": None, "rho": None}

    def __init__(self, num_clients: int, seed: int = 0, p: Any = None, rho: Any = None) -> None:
        super().__init__(num_clients, seed)
        where = f"participation {self.name}"
        rng = param_rng(self.seed)
        preset = rate_preset(rng, self.num_clients)  # always drawn, so rho does not depend on p being given
        default_rho = rng.uniform(0.5, 0.9, size=self.num_clients)
        self.p = preset if p is None else resolve_rates(where, self.seed, self.num_clients, p)
        self.rho = default_rho if rho is None else per_client(where, "rho", rho, self.num_clients)
        bad = np.flatnonzero(~((self.rho >= 0) & (self.rho < 1)))
        if bad.size:
            i = int(bad[0])
            raise ConfigError(f"{where}: rho[{i}]={self.rho[i]:g} is outside [0, 1)")
        self.stay = self.p + self.rho * (1.0 - self.p)  # P(1 -> 1)
        self.join = self.p * (1.0 - self.rho)  # P(0 -> 1)

    def _rows(self, start: int, stop: int) -> np.ndarray:
        out = np.empty((stop - start, self.num_clients), dtype=bool)
        prev = self._last_row()
        for k, r in enumerate(range(start, stop)):
            u = round_rng(self.seed, self.STREAM, r).random(self.num_clients)
            threshold = self.p if prev is None else np.where(prev, self.stay, self.join)
            out[k] = prev = u < threshold
        return out

    def nominal_p(self) -> np.ndarray:
        return self.p.copy()

    def transition_matrix(self) -> np.ndarray:
        """Per-client 2x2 transition matrices ``[N, 2, 2]``, rows = from (absent, present)."""
        return np.stack(
            [np.stack([1.0 - self.join, self.join], -1), np.stack([1.0 - self.stay, self.stay], -1)], axis=1
        )

    def _params(self) -> dict[str, Any]:
        return {"p": to_list(self.p), "rho": to_list(self.rho)}

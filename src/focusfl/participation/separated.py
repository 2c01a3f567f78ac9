"""Participation with a minimum separation: a client that took part sits out the next R rounds.

The setting of Debiasing FedAvg (Sun et al., ICLR 2025): clients cannot take part in rounds too
close together (a phone that trained must recharge, a silo's quota renews), so a client's
participations are at least R + 1 rounds apart. Each round client i tosses its coin with rate
p_i (the base rates: the FOCUS preset when ``p`` is unset, the same p_i as ``bernoulli`` with
the same seed) and takes part when the coin is heads and it has not taken part in any of the
last R rounds (``gap`` = R >= 0; R = 0 is ``bernoulli``).

Client i's participations form a renewal process: after one it waits R rounds, then a geometric
number of rounds with success p_i, so the mean gap is R + 1/p_i and its long-run rate is

    P(i in S) = 1 / (R + 1/p_i) = p_i / (1 + R p_i)

(:meth:`nominal_p`). Every client starts free (no participation before round 0), so the first
R rounds are drawn at the base rates. A client seen at round t is unseen in t + 1 .. t + R, so
the delay (participation/statistics.py) tau(r - 1) >= R whenever a client seen before takes part
in round r; tau(r) itself may be below R (every client seen in the last R rounds).
"""
from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from .base import ParticipationProcess, check_int, resolve_rates, round_rng, to_list


class SeparatedParticipation(ParticipationProcess):
    """Independent coins at the base rates p_i, and R rounds out after each participation.

    Sequential (round r depends on rounds r - R .. r - 1): rows are computed forward from round
    0 with each client's rounds still to sit out. That count is not part of a checkpoint's
    stream (which holds the last row only), so :meth:`stream_state` is empty and a resumed run
    recomputes the rows from round 0 (N coins a round), the same rows either way.
    """

    name: ClassVar[str] = "separated"
    sequential: ClassVar[bool] = True
    STREAM: ClassVar[int] = 8
    DEFAULTS: ClassVar[dict[str, Any]] = {"gap": 1, "p": None}

    def __init__(self, num_clients: int, seed: int = 0, gap: Any = 1, p: Any = None) -> None:
        super().__init__(num_clients, seed)
        where = f"participation {self.name}"
        self.gap = check_int(where, "gap", gap, 0)
        self.p = resolve_rates(where, self.seed, self.num_clients, p)
        self._resting = np.zeros(self.num_clients, dtype=np.int64)  # rounds still to sit out, at round _next

    def _rows(self, start: int, stop: int) -> np.ndarray:
        if start == 0:
            self._resting[:] = 0
        out = np.empty((stop - start, self.num_clients), dtype=bool)
        for k, r in enumerate(range(start, stop)):
            heads = round_rng(self.seed, self.STREAM, r).random(self.num_clients) < self.p
            out[k] = active = heads & (self._resting == 0)
            self._resting = np.where(active, self.gap, np.maximum(self._resting - 1, 0))
        return out

    def stream_state(self) -> dict[str, Any]:
        """Empty: the rounds each client still sits out are not in a checkpoint's stream, so a
        resumed run recomputes its rows from round 0 (see the class docstring)."""
        return {}

    def nominal_p(self) -> np.ndarray:
        """The long-run rate p_i / (1 + R p_i) (a renewal process of mean gap R + 1/p_i)."""
        return self.p / (1.0 + self.gap * self.p)

    def _params(self) -> dict[str, Any]:
        return {"gap": self.gap, "p": to_list(self.p)}

"""Full participation and uniform sampling of m clients: the two homogeneous reference cases."""
from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from .base import MemorylessProcess, ParticipationProcess, check_int, round_rng


class FullParticipation(ParticipationProcess):
    """Every client in every round (S_r = all clients): the baseline where every method is unbiased."""

    name: ClassVar[str] = "full"
    DEFAULTS: ClassVar[dict[str, Any]] = {}
    direct: ClassVar[bool] = True

    def _rows(self, start: int, stop: int) -> np.ndarray:
        return np.ones((stop - start, self.num_clients), dtype=bool)

    def _active_sets(self, start: int, stop: int) -> list[np.ndarray]:
        everyone = np.arange(self.num_clients, dtype=np.int64)
        return [everyone] * (stop - start)

    def nominal_p(self) -> np.ndarray:
        return np.ones(self.num_clients)

    def _params(self) -> dict[str, Any]:
        return {}


def default_m(num_clients: int) -> int:
    """A quarter of the clients, at least one (FOCUS's 4 of 16)."""
    return max(1, num_clients // 4)


class UniformParticipation(MemorylessProcess):
    """m of N clients without replacement, uniformly: p_i = m/N and q_i = 1/N for every client."""

    name: ClassVar[str] = "uniform"
    STREAM: ClassVar[int] = 1
    DEFAULTS: ClassVar[dict[str, Any]] = {"m": None}
    # numpy's choice without replacement draws m of N by Floyd's algorithm (O(m)) once N > 10,000
    # and m <= N / 50; below that it shuffles a tail of N indices (still cheap at such N).
    direct: ClassVar[bool] = True

    def __init__(self, num_clients: int, seed: int = 0, m: int | None = None) -> None:
        super().__init__(num_clients, seed)
        where = f"participation {self.name}"
        self.m = default_m(self.num_clients) if m is None else check_int(where, "m", m, 1, self.num_clients)

    def _chosen(self, r: int) -> np.ndarray:
        return round_rng(self.seed, self.STREAM, r).choice(self.num_clients, size=self.m, replace=False)

    def _draw_round(self, r: int) -> np.ndarray:
        row = np.zeros(self.num_clients, dtype=bool)
        row[self._chosen(r)] = True
        return row

    def _active_sets(self, start: int, stop: int) -> list[np.ndarray]:
        return [np.sort(self._chosen(r)) for r in range(start, stop)]

    def nominal_p(self) -> np.ndarray:
        return np.full(self.num_clients, self.m / self.num_clients)

    def _params(self) -> dict[str, Any]:
        return {"m": self.m}

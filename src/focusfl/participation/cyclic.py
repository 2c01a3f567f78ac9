"""Cyclic participation (FedSUM cases 3 and 4): clients in E groups, one group per round.

Every client is seen exactly once per epoch of E rounds, so delays are bounded (tau(r) = E - 1
once every client has been seen for the fixed order) while the set is never a random sample:
the opposite extreme to independent coins.
"""
from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from ..errors import ConfigError
from .base import ParticipationProcess, check_int, round_rng


def group_labels(order: np.ndarray, groups: int) -> np.ndarray:
    """Group of each client when ``order`` is cut into ``groups`` contiguous near-equal pieces.

    Sizes follow ``np.array_split``: the first ``N mod E`` groups have one client more.
    """
    n = order.size
    sizes = np.full(groups, n // groups)
    sizes[: n % groups] += 1
    labels = np.empty(n, dtype=np.int64)
    labels[order] = np.repeat(np.arange(groups), sizes)
    return labels


def group_bounds(n: int, groups: int) -> np.ndarray:
    """Where each group of :func:`group_labels` starts in its order, and where the last ends."""
    sizes = np.full(groups, n // groups)
    sizes[: n % groups] += 1
    return np.concatenate([[0], np.cumsum(sizes)])


def _check_groups(where: str, groups: Any, n: int) -> int:
    if isinstance(groups, (int, np.integer)) and not isinstance(groups, bool) and groups > n:
        raise ConfigError(f"{where}: groups={groups} is more than the {n} clients (a group would be empty)")
    return check_int(where, "groups", groups, 1, n)


class _Groups(ParticipationProcess):
    """E groups of near-equal size, one group a round: each client once per epoch of E rounds."""

    DEFAULTS: ClassVar[dict[str, Any]] = {"groups": 4}
    direct: ClassVar[bool] = True

    def __init__(self, num_clients: int, seed: int = 0, groups: int = 4) -> None:
        super().__init__(num_clients, seed)
        self.groups = _check_groups(f"participation {self.name}", groups, self.num_clients)
        self.bounds = group_bounds(self.num_clients, self.groups)

    def nominal_p(self) -> np.ndarray:
        return np.full(self.num_clients, 1.0 / self.groups)

    def cycle(self) -> int:
        return self.groups  # every client once per epoch of E rounds

    def _params(self) -> dict[str, Any]:
        return {"groups": self.groups}


class CyclicParticipation(_Groups):
    """Clients 0..N-1 split into E contiguous groups; round r activates group r mod E."""

    name: ClassVar[str] = "cyclic"

    def __init__(self, num_clients: int, seed: int = 0, groups: int = 4) -> None:
        super().__init__(num_clients, seed, groups)
        self.labels = group_labels(np.arange(self.num_clients), self.groups)

    def _rows(self, start: int, stop: int) -> np.ndarray:
        return self.labels[None, :] == (np.arange(start, stop) % self.groups)[:, None]

    def _active_sets(self, start: int, stop: int) -> list[np.ndarray]:
        bounds = self.bounds
        return [np.arange(bounds[r % self.groups], bounds[r % self.groups + 1], dtype=np.int64)
                for r in range(start, stop)]


class ReshuffledCyclicParticipation(_Groups):
    """Like cyclic, but epoch e = r // E cuts a fresh random permutation (stream of epoch e) into groups.

    Still once per epoch per client, but the gap between two visits varies from 1 to 2E - 1 rounds.
    """

    name: ClassVar[str] = "reshuffled_cyclic"
    STREAM: ClassVar[int] = 7  # direct: one permutation per epoch, O(N / E) a round

    def __init__(self, num_clients: int, seed: int = 0, groups: int = 4) -> None:
        super().__init__(num_clients, seed, groups)
        self._order: tuple[int, np.ndarray] | None = None  # the last epoch's permutation

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The permutation that epoch ``epoch`` cuts into groups (the last one is kept)."""
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, round_rng(self.seed, self.STREAM, epoch).permutation(self.num_clients))
        return self._order[1]

    def epoch_labels(self, epoch: int) -> np.ndarray:
        """Group of each client in ``epoch``."""
        return group_labels(self.epoch_order(epoch), self.groups)

    def _active_sets(self, start: int, stop: int) -> list[np.ndarray]:
        sets = []
        for r in range(start, stop):
            group = r % self.groups
            members = self.epoch_order(r // self.groups)[self.bounds[group] : self.bounds[group + 1]]
            sets.append(np.sort(members).astype(np.int64))
        return sets

    def _rows(self, start: int, stop: int) -> np.ndarray:
        out = np.empty((stop - start, self.num_clients), dtype=bool)
        for epoch in range(start // self.groups, (stop - 1) // self.groups + 1):
            lo = max(start, epoch * self.groups)
            hi = min(stop, (epoch + 1) * self.groups)
            group = np.arange(lo, hi) % self.groups
            out[lo - start : hi - start] = self.epoch_labels(epoch)[None, :] == group[:, None]
        return out

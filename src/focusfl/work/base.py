"""The work-process protocol: how many local steps each active client takes in a round.

A participation process says WHO takes part in round r; a work process says HOW MUCH each of
them does: tau_{i,r} in 1..tau, where tau is the algorithm's ``local_steps``. A phone that runs
out of time, a straggler cut off by a deadline or a slower chip finishes fewer steps than asked.

Round r's counts are drawn with the counter-based hash of focusfl/rng.py keyed by
(seed, stream, r, client), so a client's count does not depend on which other clients are
active, on the engine, or on how many rounds were asked before (resume and replay by index).
"""
from __future__ import annotations

import abc
from typing import Any, ClassVar

import numpy as np
import torch

from ..device import host_values, mirrored_copy
from ..errors import ConfigError
from ..participation.base import check_int, check_num_clients, check_seed


class WorkProcess(abc.ABC):
    """Step counts tau_{i,r} of the active clients, each in ``1..local_steps``.

    Subclasses implement :meth:`_counts` (the counts of every client in round r, int64 ``[N]``)
    and :meth:`_params`.
    """

    name: ClassVar[str]
    DEFAULTS: ClassVar[dict[str, Any]] = {}
    # True when every client always does local_steps: engines then pass no step counts at all,
    # so the run is today's run byte for byte.
    fixed: ClassVar[bool] = False

    def __init__(self, num_clients: int, local_steps: int, seed: int = 0) -> None:
        self.num_clients = check_num_clients(num_clients)
        self.local_steps = check_int(f"work {self.name}", "local_steps", local_steps, 1)
        self.seed = check_seed(seed)

    def steps(self, round_: int, active: torch.Tensor) -> torch.Tensor:
        """int64 ``[n]`` step counts of the clients ``active`` in round ``round_`` (on active's
        device). Chosen on the host (:meth:`host_steps`): ``active`` a view of a mirrored copy
        (device.host_values) is not read back from its device."""
        host = host_values(active)
        if host is None:
            host = active.detach().cpu().numpy()
        return mirrored_copy(self.host_steps(round_, host), active.device)

    def host_steps(self, round_: int, active: np.ndarray) -> np.ndarray:
        """int64 counts of the clients ``active`` (host indices) in round ``round_``, on the host:
        what the round loop copies to the device a chunk of rounds at a time."""
        if isinstance(round_, bool) or not isinstance(round_, (int, np.integer)) or round_ < 0:
            raise ConfigError(f"round index must be a non-negative integer, got {round_!r}")
        counts = self._counts(int(round_))
        if counts.shape != (self.num_clients,) or counts.dtype != torch.int64:
            raise AssertionError(f"work {self.name}: _counts returned {counts.dtype} {tuple(counts.shape)}")
        chosen = counts.numpy()[np.asarray(active, dtype=np.int64)]
        self._check_steps(int(round_), active, chosen)
        return chosen

    def _check_steps(self, round_: int, active: np.ndarray, steps: np.ndarray) -> None:
        """Refuse counts this process cannot give (a trace without a client's row); default: none."""

    def table(self, rounds: int) -> torch.Tensor:
        """int64 ``[rounds, N]``: every client's count in rounds 0..rounds-1 (for summaries)."""
        return torch.stack([self._counts(r) for r in range(rounds)]) if rounds else torch.zeros(
            (0, self.num_clients), dtype=torch.int64)

    def active_table(self, mask: np.ndarray) -> torch.Tensor:
        """int64 ``[R, N]``: the counts of rounds 0..R-1 (``table``) for a run whose participation
        is ``mask`` [R, N]; a process that cannot give an active client its count (a trace
        without that row) refuses in one line, as :meth:`steps` does."""
        return self.table(len(mask))

    def describe(self) -> dict[str, Any]:
        """``{"name": ..., **resolved params}``; ``make_work`` rebuilds the process from it."""
        return {"name": self.name, **self._params()}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_clients={self.num_clients}, local_steps={self.local_steps}, seed={self.seed})"

    @abc.abstractmethod
    def _counts(self, round_: int) -> torch.Tensor:
        """int64 ``[N]`` counts of every client in round ``round_``, each in 1..local_steps."""

    def _params(self) -> dict[str, Any]:
        return {}


def fraction_to_steps(fraction: torch.Tensor, local_steps: int) -> torch.Tensor:
    """round(fraction * tau), at least 1 and at most tau (half rounds up), as int64."""
    steps = torch.floor(fraction.to(torch.float64) * local_steps + 0.5).to(torch.int64)
    return steps.clamp(1, local_steps)

"""Label-correlated participation: a client's rate depends on which classes it holds.

ALGORITHMS.md section 5, in the style of FedAU and FedAWE: every class c has a participation
rate phi_c, and client i, whose data has label distribution h_i (its label histogram divided by
its size), joins each round independently with probability

    p_i = clip(<h_i, phi>, low, high).

A client holding mostly class c thus shows up about as often as phi_c says. Under label skew
(Dirichlet partitions with small alpha) participation and data become correlated, the case in
which averaging only the participants biases the model toward the frequent clients' classes.

The process needs the partition, so it is built from the problem (``make_participation(...,
problem=...)``, which the runner does): the problem's ``label_histograms()`` gives h_i.
"""
from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from ..errors import ConfigError
from .base import check_real, param_rng, to_list
from .bernoulli import IndependentCoins

# Parameter sub-stream of the default phi (weighted uses 1 and 2).
_PHI_SUBSTREAM = 20
DEFAULT_PHI_RANGE = (0.05, 0.5)


class LabelParticipation(IndependentCoins):
    """Independent coins with p_i = clip(<h_i, phi>, low, high); phi per class.

    Default phi: one rate per class drawn from U(0.05, 0.5) with the seed, so clients of the
    rare classes take part about ten times less often than those of the frequent ones.
    """

    name: ClassVar[str] = "label"
    STREAM: ClassVar[int] = 20
    DEFAULTS: ClassVar[dict[str, Any]] = {"phi": None, "low": 0.02, "high": 1.0}
    NEEDS_PROBLEM: ClassVar[bool] = True

    def __init__(
        self,
        num_clients: int,
        seed: int = 0,
        phi: Any = None,
        low: float = 0.02,
        high: float = 1.0,
        histograms: Any = None,
    ) -> None:
        super().__init__(num_clients, seed)
        where = f"participation {self.name}"
        if histograms is None:
            raise ConfigError(f"{where}: needs the clients' label histograms (a neural-network problem)")
        counts = np.asarray(histograms, dtype=np.float64)
        if counts.ndim != 2 or counts.shape[0] != self.num_clients or np.any(counts < 0):
            raise ConfigError(f"{where}: histograms must be non-negative counts [N={self.num_clients}, classes]")
        sizes = counts.sum(axis=1, keepdims=True)
        if np.any(sizes <= 0):
            raise ConfigError(f"{where}: every client needs at least one labelled sample")
        self.distributions = counts / sizes
        classes = counts.shape[1]
        if phi is None:
            phi = param_rng(self.seed, _PHI_SUBSTREAM).uniform(*DEFAULT_PHI_RANGE, size=classes)
        self.phi = _per_class(where, phi, classes)
        self.low = check_real(where, "low", low)
        self.high = check_real(where, "high", high)
        if not 0.0 < self.low <= self.high <= 1.0:
            raise ConfigError(f"{where}: need 0 < low <= high <= 1, got low={self.low:g}, high={self.high:g}")
        self.p = np.clip(self.distributions @ self.phi, self.low, self.high)

    @classmethod
    def from_problem(cls, problem: Any, num_clients: int, seed: int = 0, **params: Any) -> "LabelParticipation":
        histograms = getattr(problem, "label_histograms", None)
        if histograms is None:
            raise ConfigError(
                "participation 'label' needs a problem whose clients hold labelled data "
                "(a neural-network problem, e.g. --problem nn:data=mnist)"
            )
        return cls(num_clients, seed, histograms=histograms(), **params)

    def rates(self, rounds: np.ndarray) -> np.ndarray:
        return self.p[None, :]

    def nominal_p(self) -> np.ndarray:
        return self.p.copy()

    def _params(self) -> dict[str, Any]:
        return {"phi": to_list(self.phi), "low": self.low, "high": self.high}


def _per_class(where: str, phi: Any, classes: int) -> np.ndarray:
    """phi as float64 [classes]: one number for every class, or exactly one per class, each in [0, 1]."""
    values = [check_real(where, "phi", v) for v in np.atleast_1d(np.asarray(phi, dtype=object)).ravel()]
    if len(values) not in (1, classes):
        raise ConfigError(f"{where}: phi has {len(values)} values, expected 1 or {classes} (one per class)")
    rates = np.broadcast_to(np.array(values, dtype=np.float64), (classes,)).copy()
    if np.any((rates < 0) | (rates > 1)):
        raise ConfigError(f"{where}: every phi must be in [0, 1]")
    return rates

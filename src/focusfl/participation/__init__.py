"""Client participation processes: which clients take part in each round.

Build one with :func:`make_participation` from a spec such as ``"bernoulli:p=0.2"`` or the dict that
:meth:`ParticipationProcess.describe` returns; summarise any mask with :func:`summarize`. See
docs/participation.md for every process, its keys and defaults.
"""
from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from ..spec import parse_spec, take_params
from .base import ParticipationProcess
from .bernoulli import BandedParticipation, BernoulliParticipation, SineParticipation
from .cyclic import CyclicParticipation, ReshuffledCyclicParticipation
from .full import FullParticipation, UniformParticipation
from .label import LabelParticipation
from .markov import MarkovParticipation
from .separated import SeparatedParticipation
from .plots import plot_raster  # matplotlib is imported when a raster is drawn
from .statistics import ParticipationStats, delays, empirical_p, empirical_q, summarize
from .trace import TraceParticipation, load_trace
from .weighted import WeightedParticipation

PARTICIPATION: dict[str, type[ParticipationProcess]] = {
    cls.name: cls
    for cls in (
        FullParticipation,
        UniformParticipation,
        BernoulliParticipation,
        WeightedParticipation,
        MarkovParticipation,
        CyclicParticipation,
        ReshuffledCyclicParticipation,
        SineParticipation,
        BandedParticipation,
        SeparatedParticipation,
        TraceParticipation,
        LabelParticipation,
    )
}


def available_participation() -> list[str]:
    """Registered process names, in registry order."""
    return list(PARTICIPATION)


def make_participation(
    spec: str | dict, num_clients: int, seed: int = 0, *, problem: Any = None
) -> ParticipationProcess:
    """Build a process from ``"name"``, ``"name:key=value,..."`` or a ``{"name": ..., **params}`` dict.

    Unknown names and keys, and invalid values, raise ConfigError (DataError for unreadable traces).
    Processes that depend on the clients' data (``label``) are built from ``problem``.
    """
    name, params = parse_spec(spec)
    cls = PARTICIPATION.get(name)
    if cls is None:
        raise ConfigError(f"unknown participation {name!r} (known: {', '.join(PARTICIPATION)})")
    params = take_params(f"participation {name}", params, cls.DEFAULTS)
    if getattr(cls, "NEEDS_PROBLEM", False):
        return cls.from_problem(problem, num_clients, seed, **params)
    return cls(num_clients, seed, **params)


__all__ = [
    "PARTICIPATION",
    "ParticipationProcess",
    "ParticipationStats",
    "available_participation",
    "delays",
    "empirical_p",
    "empirical_q",
    "load_trace",
    "make_participation",
    "plot_raster",
    "summarize",
    *(cls.__name__ for cls in PARTICIPATION.values()),
]

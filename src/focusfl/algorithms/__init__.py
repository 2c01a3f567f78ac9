"""The algorithm registry: one file per algorithm, each registered here by its name."""
from __future__ import annotations

import dataclasses
from typing import Any

from ..errors import ConfigError
from ..spec import parse_spec
from .amplified_scaffold import AmplifiedScaffold
from .base import Algorithm, Communication, RoundContext, State, StateSize, check_state_size
from .debiasing_fedavg import DebiasingFedAvg
from .fedau import FedAU
from .fedavg import FedAvg
from .fedavg_variants import FedAvgAll, FedAvgKnownP
from .fednova import FedNova
from .fedpbc import FedPBC
from .fedawe import FedAWE
from .fedsum import FedSum
from .fedsum_b import FedSumB
from .fedstale import FedStale
from .fedsum_cr import FedSumCR
from .fedvarp import FedVarp
from .focus import Focus, SGFocus
from .mifa import Mifa
from .proxskip import ProxSkip
from .pushsum import PushSum
from .pushsum_tracking import PushSumTracking
from .scaffold import Scaffold

ALGORITHMS: dict[str, type[Algorithm]] = {
    cls.name: cls
    for cls in (
        Focus,
        SGFocus,
        FedAvg,
        FedAvgAll,
        FedAvgKnownP,
        FedNova,
        FedSumB,
        FedSum,
        FedSumCR,
        Scaffold,
        AmplifiedScaffold,
        Mifa,
        FedVarp,
        FedStale,
        FedAU,
        FedAWE,
        FedPBC,
        DebiasingFedAvg,
        ProxSkip,
        PushSum,
        PushSumTracking,
    )
}


def available_algorithms() -> list[str]:
    return list(ALGORITHMS)


def algorithm_keys(name: str) -> tuple[str, ...]:
    """The keys an algorithm accepts (its hyperparameters, lr and local_steps included): its
    dataclass fields, never the class-level facts (name, summary, in_paper_figure, ...)."""
    return tuple(f.name for f in dataclasses.fields(ALGORITHMS[name]))


def make_algorithm(spec: str | dict, **overrides: Any) -> Algorithm:
    """Build an algorithm from ``"fedavg:weighting=all"`` (or a describe() dict) plus keyword
    overrides such as ``lr`` and ``local_steps`` from the command line."""
    name, params = parse_spec(spec)
    if name not in ALGORITHMS:
        raise ConfigError(f"unknown algorithm {name!r} (known: {', '.join(ALGORITHMS)})")
    cls = ALGORITHMS[name]
    fields = {f.name: f for f in dataclasses.fields(cls)}
    params = {**params, **{k: v for k, v in overrides.items() if v is not None}}
    unknown = sorted(set(params) - set(algorithm_keys(name)))
    if unknown:
        raise ConfigError(f"algorithm {name!r}: unknown key {unknown[0]!r} (known: {', '.join(algorithm_keys(name))})")
    for key, value in params.items():
        if isinstance(value, list):
            params[key] = tuple(value)
        default = fields[key].default
        if isinstance(default, bool) and value in (0, 1):
            params[key] = bool(value)
        elif isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
            params[key] = float(value)
    try:
        return cls(**params)
    except TypeError as exc:  # wrong value types reach here
        raise ConfigError(f"algorithm {name!r}: {exc}") from None


def algorithm_state_size(spec: str | dict, local_steps: int | None = None):
    """The state size function (``Algorithm.state_size(N, d) -> StateSize``) of the algorithm a
    run of ``spec`` makes, for a problem to check the model and that state before it builds the
    model (None for a spec that does not build: the run refuses it later, in its own words)."""
    try:
        return make_algorithm(spec, local_steps=local_steps).state_size
    except ConfigError:
        return None


__all__ = [
    "Algorithm",
    "ALGORITHMS",
    "Communication",
    "RoundContext",
    "State",
    "StateSize",
    "algorithm_keys",
    "algorithm_state_size",
    "check_state_size",
    "available_algorithms",
    "make_algorithm",
]

"""The algorithm registry: one file per algorithm, each registered here by its name."""
from __future__ import annotations

import dataclasses
import typing
from typing import Any

from ..errors import ConfigError
from ..spec import parse_spec
from .amplified_fedavg import AmplifiedFedAvg
from .amplified_scaffold import AmplifiedScaffold
from .base import Algorithm, Communication, RoundContext, State, StateSize, check_state_size
from .debiasing_fedavg import DebiasingFedAvg
from .fedau import FedAU
from .fedavg import FedAvg
from .fedavg_variants import FedAvgAll, FedAvgKnownP
from .fedavgm import FedAvgM
from .feddyn import FedDyn
from .fedlaavg import FedLaAvg
from .fednova import FedNova
from .fedopt import FedAdagrad, FedAdam, FedYogi
from .fedprox import FedProx
from .fedpbc import FedPBC
from .fedawe import FedAWE
from .fedsum import FedSum
from .fedsum_b import FedSumB
from .fedstale import FedStale
from .fedsum_cr import FedSumCR
from .fedvarp import FedVarp
from .focus import Focus, SGFocus
from .importing import SHA256, algorithm_record, is_algorithm_import, load_algorithm_class, user_code_error
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
        FedProx,
        FedAvgM,
        FedAdam,
        FedYogi,
        FedAdagrad,
        FedDyn,
        AmplifiedFedAvg,
        FedLaAvg,
    )
}


def algorithm_class(name: str, sha256: str | None = None) -> type[Algorithm]:
    """The class a SPEC's name stands for: a registered name, or ``file.py:Class`` /
    ``package.module:Class`` imported with the process's permission (algorithms/importing.py)."""
    if is_algorithm_import(name):
        return load_algorithm_class(name, sha256=sha256)
    if name not in ALGORITHMS:
        raise ConfigError(f"unknown algorithm {name!r} (known: {', '.join(ALGORITHMS)}; or your own: "
                          "path/to/file.py:Class)")
    return ALGORITHMS[name]


def available_algorithms() -> list[str]:
    return list(ALGORITHMS)


def algorithm_keys(algorithm: str | type[Algorithm]) -> tuple[str, ...]:
    """The keys an algorithm (a SPEC's name, or its class) accepts, its hyperparameters, lr and
    local_steps included: its dataclass fields, never the class-level facts (name, summary,
    in_paper_figure, ...)."""
    cls = algorithm if isinstance(algorithm, type) else algorithm_class(algorithm)
    return tuple(f.name for f in dataclasses.fields(cls))


def make_algorithm(spec: str | dict, **overrides: Any) -> Algorithm:
    """Build an algorithm from ``"fedavg:weighting=all"`` (or a describe() dict) plus keyword
    overrides such as ``lr`` and ``local_steps`` from the command line."""
    name, params = parse_spec(spec)
    cls = algorithm_class(name, params.pop(SHA256, None) if is_algorithm_import(name) else None)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    params = {**params, **{k: v for k, v in overrides.items() if v is not None}}
    keys = algorithm_keys(cls)
    unknown = sorted(set(params) - set(keys))
    if unknown:
        raise ConfigError(f"algorithm {name!r}: unknown key {unknown[0]!r} (known: {', '.join(keys)})")
    kinds = _field_kinds(cls)
    for key, value in params.items():
        if isinstance(value, list):
            params[key] = tuple(value)
        default = fields[key].default
        if isinstance(default, bool) and value in (0, 1):
            params[key] = bool(value)
        elif isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
            params[key] = float(value)
        _check_kind(name, key, kinds.get(key), params[key])
    try:
        return cls(**params)
    except Exception as exc:  # wrong value types reach here, and whatever a user's validate() raises
        error = user_code_error(exc)
        if error is not None:
            raise error from None
        if isinstance(exc, TypeError):
            raise ConfigError(f"algorithm {name!r}: {exc}") from None
        raise


def _field_kinds(cls: type[Algorithm]) -> dict[str, type]:
    """The hyperparameters annotated plainly ``float``, ``int`` or ``bool``, by name: a SPEC's
    value is checked against them before the class (a user's, whose validate() may compare it
    straight away) sees it."""
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # an annotation that does not resolve (a user's class): the defaults' types
        hints = {f.name: type(f.default) for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
    return {key: kind for key, kind in hints.items() if kind in (float, int, bool)}


def _check_kind(name: str, key: str, kind: type | None, value: Any) -> None:
    """ConfigError when ``value`` is not of the field's annotated ``kind``: a number for a float
    or an int (validate() checks its range), true or false for a bool."""
    if kind is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"algorithm {name!r}: {key} must be true or false, got {value!r}")
    elif kind in (float, int) and (isinstance(value, bool) or not isinstance(value, (int, float))):
        what = "a number" if kind is float else "an integer"
        raise ConfigError(f"algorithm {name!r}: {key} must be {what}, got {value!r}")


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
    "algorithm_class",
    "algorithm_keys",
    "algorithm_record",
    "algorithm_state_size",
    "check_state_size",
    "available_algorithms",
    "make_algorithm",
]

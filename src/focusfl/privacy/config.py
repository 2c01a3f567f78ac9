"""The ``--dp`` record: clip norm C, noise multiplier sigma, mode, and the accounting's delta and
target epsilon (docs/privacy.md).

``--dp clip=C,noise=SIGMA,mode=central|local[,delta=D][,target_epsilon=E]``; ``none`` (the
default) runs without differential privacy. The record is pure data, checked once, and is the
same object in config.json (a table of its keys) and on a command line (this string).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import ConfigError
from ..spec import parse_spec

MODES = ("central", "local")
NONE = "none"  # no differential privacy: the record's default, left out of a run's key
KEYS = ("clip", "noise", "mode", "delta", "target_epsilon")


@dataclass(frozen=True)
class DPConfig:
    """Client-level DP. ``clip``: C, the norm each vector a client sends is clipped to;
    ``noise``: sigma, the Gaussian noise's standard deviation in units of C (sigma * C on the
    round's sum in central mode, on each client's message in local mode); ``delta``: the
    accounting's delta (None: no epsilon is computed); ``target_epsilon``: a run stops before a
    round would take a client's epsilon beyond it (needs delta)."""

    clip: float
    noise: float
    mode: str = "central"
    delta: float | None = None
    target_epsilon: float | None = None

    def __post_init__(self) -> None:
        if not _finite_number(self.clip) or self.clip <= 0:
            raise ConfigError(f"--dp: clip must be a positive number, got {self.clip!r}")
        if not _finite_number(self.noise) or self.noise < 0:
            raise ConfigError(f"--dp: noise must be a number >= 0, got {self.noise!r}")
        if self.mode not in MODES:
            raise ConfigError(f"--dp: mode must be central or local, got {self.mode!r}")
        if self.delta is not None and not (_finite_number(self.delta) and 0 < self.delta < 1):
            raise ConfigError(f"--dp: delta must be a number in (0, 1), got {self.delta!r}")
        if self.target_epsilon is not None:
            if not _finite_number(self.target_epsilon) or self.target_epsilon <= 0:
                raise ConfigError(f"--dp: target_epsilon must be a positive number, got {self.target_epsilon!r}")
            if self.delta is None:
                raise ConfigError("--dp: target_epsilon needs delta (an epsilon is only defined with its delta)")
            if self.noise == 0:
                raise ConfigError("--dp: target_epsilon needs noise > 0 (without noise epsilon is infinite)")

    @property
    def accounted(self) -> bool:
        """Whether the run computes epsilon (delta given and some noise)."""
        return self.delta is not None and self.noise > 0

    def describe(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


def _finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def parse_dp(spec: str | dict | None) -> DPConfig | None:
    """The record of ``--dp`` (a ``key=value,...`` string or config.json's table); None for
    ``none``. A one-line ConfigError names the first thing wrong."""
    if spec is None or spec == NONE or spec == {"name": NONE}:
        return None
    if isinstance(spec, dict):
        params = {k: v for k, v in spec.items() if k != "name"}
    elif isinstance(spec, str):
        params = _pairs(spec)
    else:
        raise ConfigError(f"--dp must be 'none' or clip=C,noise=SIGMA,mode=central|local, got {spec!r}")
    unknown = sorted(set(params) - set(KEYS))
    if unknown:
        raise ConfigError(f"--dp: unknown key {unknown[0]!r} (known: {', '.join(KEYS)})")
    missing = [k for k in ("clip", "noise") if k not in params]
    if missing:
        raise ConfigError(f"--dp: {missing[0]} is required (e.g. --dp clip=1,noise=1,mode=central)")
    return DPConfig(**params)


def _pairs(text: str) -> dict[str, Any]:
    """The ``key=value,...`` of a --dp string, parsed as a SPEC's parameters are."""
    try:
        return parse_spec(f"dp:{text}")[1]
    except ConfigError as exc:
        raise ConfigError(f"--dp: {exc}") from None

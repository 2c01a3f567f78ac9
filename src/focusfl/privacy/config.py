"""The ``--dp`` record: clip norm C, noise multiplier sigma, mode, and the accounting's delta and
target epsilon (docs/privacy.md).

``--dp clip=C,noise=SIGMA,mode=central|local[,delta=D][,target_epsilon=E][,secret_schedule=true]
[,public_rates=true][,nonce=K]``; ``none`` (the default) runs without differential privacy. The record is pure data, checked once, and is the
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
KEYS = ("clip", "noise", "mode", "delta", "target_epsilon", "secret_schedule", "public_rates", "nonce")
# A nonce is a non-negative integer below 2**63 (the noise's key mixes it as two 32-bit words).
NONCE_LIMIT = 2**63
# Beyond this sigma the accountant's sigma^2 overflows a double (about 1.3e154) and epsilon is 0
# to double precision long before: a larger noise is refused rather than half computed.
MAX_NOISE = 1e100


@dataclass(frozen=True)
class DPConfig:
    """Client-level DP. ``clip``: C, the norm each vector a client sends is clipped to;
    ``noise``: sigma, the Gaussian noise's standard deviation in units of C (sigma * C on the
    round's sum in central mode, on each client's message in local mode); ``delta``: the
    accounting's delta (None: no epsilon is computed); ``target_epsilon``: a run stops before a
    round would take a client's epsilon beyond it (needs delta); ``secret_schedule``: the user
    declares the participation schedule secret, which allows the amplified bounds of the processes
    they hold for (docs/privacy.md, "Threat model"); ``public_rates``: the user declares public
    the rates of a process that reads the clients' data (``label``), which --dp otherwise refuses; ``nonce``: the noise's key beside the seed (None: the run's own,
    derived from its run key, privacy.dp_nonce), given where two runs of one configuration must draw
    independent noise."""

    clip: float
    noise: float
    mode: str = "central"
    delta: float | None = None
    target_epsilon: float | None = None
    secret_schedule: bool = False
    public_rates: bool = False
    nonce: int | None = None

    def __post_init__(self) -> None:
        if not _finite_number(self.clip) or self.clip <= 0:
            raise ConfigError(f"--dp: clip must be a positive number, got {self.clip!r}")
        if not _finite_number(self.noise) or self.noise < 0:
            raise ConfigError(f"--dp: noise must be a number >= 0, got {self.noise!r}")
        if self.noise > MAX_NOISE:
            raise ConfigError(f"--dp: noise={self.noise:g} is beyond {MAX_NOISE:g}, where the accountant overflows "
                              "(epsilon is 0 to double precision far below it)")
        if not math.isfinite(self.noise * self.clip):
            raise ConfigError(f"--dp: the noise's standard deviation noise x clip = {self.noise:g} x {self.clip:g} "
                              "is not a finite number")
        for key in ("secret_schedule", "public_rates"):
            if not isinstance(getattr(self, key), bool):
                raise ConfigError(f"--dp: {key} must be true or false, got {getattr(self, key)!r}")
        if self.nonce is not None and (isinstance(self.nonce, bool) or not isinstance(self.nonce, int)
                                       or not 0 <= self.nonce < NONCE_LIMIT):
            raise ConfigError(f"--dp: nonce must be an integer in [0, 2**63), got {self.nonce!r}")
        if self.mode not in MODES:
            raise ConfigError(f"--dp: mode must be central or local, got {self.mode!r}")
        if self.delta is not None and not (_finite_number(self.delta) and 0 < self.delta < 1):
            raise ConfigError(f"--dp: delta must be a number in (0, 1), got {self.delta!r}")
        if self.delta is not None and self.noise == 0:
            raise ConfigError("--dp: delta with noise=0: without noise epsilon is infinite; give noise > 0, or "
                              "leave delta out to run clipping alone (no epsilon)")
        if self.secret_schedule and self.mode != "central":
            raise ConfigError("--dp: secret_schedule needs mode=central (in local mode the server sees who sent, "
                              "so the schedule is not secret from it)")
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
        """config.json's table: the keys given, the two declarations only when made (a record
        without them is the one it always was)."""
        return {k: v for k, v in asdict(self).items() if v is not None and v is not False}


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
    missing = [k for k in ("clip", "noise", "mode") if k not in params]
    if missing:
        raise ConfigError(f"--dp: {missing[0]} is required (e.g. --dp clip=1,noise=1,mode=central)")
    return DPConfig(**params)


def _pairs(text: str) -> dict[str, Any]:
    """The ``key=value,...`` of a --dp string, parsed as a SPEC's parameters are."""
    try:
        return parse_spec(f"dp:{text}")[1]
    except ConfigError as exc:
        raise ConfigError(f"--dp: {exc}") from None

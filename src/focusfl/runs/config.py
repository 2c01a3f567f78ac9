"""The run configuration: a run's fields, their defaults and validation, and config.json's keys."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from ..engine.simulate import ENGINES, SCHEDULES
from ..errors import ConfigError
from ..threads import DEFAULT_THREADS

DTYPES = {"float32": torch.float32, "float64": torch.float64}


@dataclass
class RunConfig:
    """Everything a run needs; ``resolved()`` is what config.json stores for a rerun."""

    algorithm: str | dict
    problem: str | dict = "ridge"
    participation: str | dict = "full"
    rounds: int = 100
    local_steps: int | None = None
    lr: float | str | None = None  # a number, "auto" (from the problem's smoothness), None (algorithm default)
    seed: int = 0
    dtype: str = "float64"
    device: str = "cpu"
    engine: str = "vectorized"
    eval_every: int = 1
    schedule: str = "constant"
    # torch intra-op threads while the run computes: part of the record because the thread count
    # changes float results at the rounding level (reductions split differently); a fixed
    # default, never the machine's core count, so the same command gives the same bytes anywhere.
    threads: int = DEFAULT_THREADS
    extra: dict[str, Any] = field(default_factory=dict)


# Keys of config.json: what a run needs, and what focusfl records beside it.
_REQUIRED = ("algorithm", "problem", "participation", "rounds", "seed", "dtype", "device", "engine", "eval_every")
# "tensorboard" is an output option (where `run --tensorboard` logs), never part of a run's identity.
_RECORDED = ("focusfl_version", "schedule", "threads", "status", "diverged_at_round", "interrupted_after_round",
             "rounds_done", "lr_auto", "tensorboard")


def check_config(config: RunConfig) -> None:
    """Type and range of every field, with a one-line ConfigError naming the field."""
    def spec_like(key: str) -> None:
        value = getattr(config, key)
        if not isinstance(value, (str, dict)) or not value:
            raise ConfigError(f"{key} must be a SPEC string or an object with a 'name', got {value!r}")

    def integer(key: str, lo: int) -> None:
        value = getattr(config, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < lo:
            raise ConfigError(f"{key} must be an integer >= {lo}, got {value!r}")

    for key in ("algorithm", "problem", "participation"):
        spec_like(key)
    integer("rounds", 1)
    integer("seed", 0)
    integer("eval_every", 1)
    integer("threads", 1)
    if config.local_steps is not None:
        integer("local_steps", 1)
    lr = config.lr
    if lr is not None and lr != "auto" and (
        isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 < lr < math.inf
    ):
        raise ConfigError(f"lr must be a positive number or 'auto', got {lr!r}")
    if config.dtype not in DTYPES:
        raise ConfigError(f"dtype must be float32 or float64, got {config.dtype!r}")
    if not isinstance(config.device, str):
        raise ConfigError(f"device must be a string such as 'cpu' or 'cuda', got {config.device!r}")
    if config.engine not in ENGINES:
        raise ConfigError(f"engine must be one of {', '.join(ENGINES)}, got {config.engine!r}")
    if config.schedule not in SCHEDULES:
        raise ConfigError(f"schedule must be one of {', '.join(SCHEDULES)}, got {config.schedule!r}")


def config_from_json(data: Any, where: str = "config file") -> RunConfig:
    """A RunConfig from config.json's content, every key known and type-checked."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a JSON object, got {type(data).__name__}")
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise ConfigError(f"{where} lacks {missing[0]!r}")
    unknown = sorted(set(data) - set(_REQUIRED) - set(_RECORDED))
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}")
    optional = {k: data[k] for k in ("schedule", "threads") if k in data}
    config = RunConfig(**{k: data[k] for k in _REQUIRED}, **optional)
    try:
        check_config(config)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return config

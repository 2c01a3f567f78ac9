"""Local steps a device finishes before a round's deadline, from its speeds.

FedScale's device capacity file (``client_device_capacity``) gives each device a computation
speed c (milliseconds per sample, the inference latency) and a communication speed w (kbit/s).
FedScale prices a round of s local steps of B samples (fedscale/cloud/internal/client_metadata.py,
``ClientMetadata.get_completion_time``) as

    computation   = 3 B s c / 1000   seconds (a backward pass costs about two forward passes)
    communication = (M_up + M_down) / w seconds (the model's update size M kbit, both ways)

so under a round deadline D a device finishes

    s_i = floor((D - 2 M / w_i) / (3 B c_i / 1000))

local steps, at most tau (the algorithm's ``local_steps``; a device with c_i = 0 does tau). A
device with s_i < 1 cannot report before the deadline (FedScale counts it a straggler): 0 here,
and the importer drops it. ``focusfl participation import fedscale ... --capacity FILE`` writes
the counts as a work trace (work/trace.py) beside the participation trace, so the two replay a
real population together.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, DataError
from .parsing import ImportedTrace, ImportOptions, checked_seconds, read_plain_pickle

# FedScale's augmentation_factor: a training step costs three inferences (forward + backward).
AUGMENTATION = 3.0


def deadline_steps(computation_ms: np.ndarray, bandwidth_kbps: np.ndarray, deadline: float, batch_size: int,
                   model_kbits: float, local_steps: int) -> np.ndarray:
    """int64 [N]: the local steps each device finishes before ``deadline`` seconds (see the module
    docstring), in 0..local_steps (0: not even one)."""
    check_round_prices(deadline, batch_size, model_kbits, local_steps)
    computation = np.asarray(computation_ms, dtype=np.float64)
    communication = 2.0 * model_kbits / np.asarray(bandwidth_kbps, dtype=np.float64)
    step_seconds = AUGMENTATION * batch_size * computation / 1000.0
    room = deadline - communication
    with np.errstate(divide="ignore", invalid="ignore"):
        steps = np.where(step_seconds > 0, np.floor(room / np.where(step_seconds > 0, step_seconds, 1.0)),
                         np.where(room >= 0, local_steps, 0))
    return np.clip(np.where(room >= 0, steps, 0), 0, local_steps).astype(np.int64)


def check_round_prices(deadline: float, batch_size: int, model_kbits: float, local_steps: int) -> None:
    """One-line ConfigErrors for a round's deadline, samples per step, model size and tau."""
    for name, value, low in (("--deadline", deadline, None), ("--model-kbits", model_kbits, 0.0)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"{name} must be a finite number, got {value!r}")
        if (low is None and value <= 0) or (low is not None and value < low):
            raise ConfigError(f"{name} must be {'positive' if low is None else '>= 0'}, got {value!r}")
    for name, value in (("--batch-size", batch_size), ("--local-steps", local_steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")


def with_capacity(trace: ImportedTrace, clients: list[tuple[int, Any]], capacity: CapacityOptions,
                  options: ImportOptions) -> ImportedTrace:
    """The trace with each column's local steps per round from FedScale's device capacity file
    (capacity.py); devices that cannot finish one step before the deadline never report
    (FedScale drops such stragglers), so their columns are emptied and they are named."""
    speeds = read_capacity(capacity.path)
    # FedScale looks a client's speed up by key, (c % len) under its own assignment
    # (aggregator.py client_register_handler), with {1.0, 1.0} for a key it lacks.
    lookup = [c % len(speeds) if options.assign == "fedscale" else key for c, key in clients]
    missing = [str(key) for key in lookup if key not in speeds]
    computation = np.array([speeds.get(key, FEDSCALE_DEFAULT_SPEED)[0] for key in lookup], dtype=np.float64)
    bandwidth = np.array([speeds.get(key, FEDSCALE_DEFAULT_SPEED)[1] for key in lookup], dtype=np.float64)
    steps = deadline_steps(computation, bandwidth, capacity.deadline, capacity.batch_size, capacity.model_kbits,
                           capacity.local_steps)
    slow = steps < 1
    mask = trace.mask.copy()
    mask[:, slow] = False
    source = (f"{trace.source}; local steps from {capacity.path.name!r}: {capacity.deadline:g} s deadline, "
              f"{capacity.batch_size} samples a step, {capacity.model_kbits:g} kbit model, at most {capacity.local_steps}")
    if missing:
        source += f", FedScale's default speed for {len(missing)} device(s) not in it"
    return replace(trace, mask=mask, steps=steps, source=source,
                   too_slow=[name for name, s in zip(trace.names, slow) if s])


@dataclass(frozen=True)
class CapacityOptions:
    """FedScale's device capacity file and the round it prices (capacity.py)."""

    path: Path
    deadline: float
    batch_size: int
    model_kbits: float
    local_steps: int
# FedScale's speed for a client its capacity file lacks (aggregator.py client_register_handler).
FEDSCALE_DEFAULT_SPEED = (1.0, 1.0)


def read_capacity(path: Path) -> dict[Any, tuple[float, float]]:
    """FedScale's ``client_device_capacity``: a pickle of ``{client_id: {"computation": ms per
    sample, "communication": kbit/s}}``, read by the plain unpickler (never runs code), each
    speed checked: computation >= 0, communication > 0, both finite."""
    what = f"FedScale device capacity {path.name!r}"
    if not path.is_file():
        raise DataError(f"{what}: file {str(path)!r} not found")
    data = read_plain_pickle(path, what)
    if not isinstance(data, dict) or not data:
        raise DataError(f"{what} must hold a non-empty dict of clients (client id -> its speeds), "
                        f"got {type(data).__name__}")
    return {key: _capacity(what, key, entry) for key, entry in data.items()}


def _capacity(what: str, key: Any, entry: Any) -> tuple[float, float]:
    where = f"{what}: client {key!r}"
    if not isinstance(entry, dict) or "computation" not in entry or "communication" not in entry:
        raise DataError(f"{where} must be a dict with computation and communication")
    computation = checked_seconds(where, "computation", entry["computation"], "milliseconds per sample")
    bandwidth = checked_seconds(where, "communication", entry["communication"], "kbit/s")
    if bandwidth <= 0:
        raise DataError(f"{where}: communication must be positive (kbit/s), got {entry['communication']!r}")
    return computation, bandwidth

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

import numpy as np

from ..errors import ConfigError

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

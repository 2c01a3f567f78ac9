"""The evaluation row of a round, and whether the run diverged there: one implementation for
the simulator (engine/simulate.py) and the Flower strategy (flower/strategy.py), so that a
federation and a simulation agree on what a row holds and on when a run stops."""
from __future__ import annotations

import math

import torch

from .divergence import BlowUpDetector


def evaluation_row(
    x: torch.Tensor, problem, blow_up: BlowUpDetector, *, done: int, active: int, comm: tuple[float, float],
    extra: dict | None = None,
) -> dict:
    """The row of the server model ``x`` after ``done`` rounds, ``active`` of whose clients took
    part in the last one, ``comm`` = (floats sent down, up) so far: the problem's metrics, then
    ``extra`` (an engine's own counters). A non-finite model or metric, or a blow-up that
    ``blow_up`` sees in this row, sets ``row["diverged"] = True``: the run stops there."""
    row = {"round": done, "active": active, "comm_down": float(comm[0]), "comm_up": float(comm[1])}
    finite = bool(torch.isfinite(x).all())
    if finite:
        row.update(problem.metrics(x))
        finite = all(math.isfinite(v) for v in row.values())
    else:
        row.update({"loss": math.inf, "grad_norm": math.inf})
    if extra:
        row.update(extra)
    if finite and blow_up.update(row):
        finite = False
    if not finite:
        row["diverged"] = True
    return row


def diverged(row: dict) -> bool:
    """Whether :func:`evaluation_row` stopped the run at this row."""
    return bool(row.get("diverged", False))

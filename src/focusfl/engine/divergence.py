"""Blow-up detection: a run whose loss has left its starting value far behind, for good.

A non-finite model stops a run at once. A model can also stay finite while training has
plainly failed: SG-FOCUS on 45 handwritten digits per client at twice its stable step went from
a test loss of 2.3 to 2,500 (accuracy 0.09) and nothing flagged it. The rule, applied by
:func:`~focusfl.engine.simulate` at every evaluation:

    a run has BLOWN UP when its tracked loss has been above FACTOR x its value at the first
    evaluation (round 0) at PATIENCE or more consecutive evaluations spanning MIN_ROUNDS or
    more rounds (from the first of them to the last).

The tracked loss is the first of ``loss`` (convex problems: the full objective F), ``train_loss``,
``test_loss`` (neural networks) that the rows carry. FACTOR = 10, PATIENCE = 3, MIN_ROUNDS = 20:
spikes are forgiven (FedAWE on the paper's ridge under arbitrary participation jumps to 358x its
starting loss for three rounds and then settles at 1e-2), a rise that lasts is not (evaluated
every 25 rounds, three evaluations span 50 rounds). No run of the exactness table or of the
ridge reproductions at a converging step size trips it. A blown-up run is treated like a
non-finite one: the run stops, ``RunResult.diverged_at`` is the round, and its last row has
``diverged = True``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

FACTOR = 10.0
PATIENCE = 3
MIN_ROUNDS = 20
TRACKED = ("loss", "train_loss", "test_loss")


def tracked_loss(row: dict) -> str | None:
    """The key of the loss the rule watches in this row (None when the row has none)."""
    return next((key for key in TRACKED if key in row), None)


def blew_up(
    losses: Sequence[float], rounds: Sequence[int] | None = None, *,
    factor: float = FACTOR, patience: int = PATIENCE, min_rounds: int = MIN_ROUNDS,
) -> bool:
    """True when the latest evaluations have all been above ``factor`` x ``losses[0]`` for at
    least ``patience`` evaluations spanning at least ``min_rounds`` rounds.

    ``losses`` are the tracked loss at every evaluation so far, the first at the run's start;
    ``rounds`` their rounds (default 0, 1, 2, ...). A non-positive or non-finite start gives no
    reference (never a blow-up by this rule; a non-finite model is caught by the simulator)."""
    rounds = list(range(len(losses))) if rounds is None else list(rounds)
    if not losses or len(rounds) != len(losses):
        return False
    start = float(losses[0])
    if not (math.isfinite(start) and start > 0):
        return False
    streak = 0
    for value in reversed(losses[1:]):
        if not float(value) > factor * start:
            break
        streak += 1
    if streak < max(1, patience):
        return False
    return rounds[-1] - rounds[-streak] >= min_rounds


@dataclass
class BlowUpDetector:
    """Feeds :func:`blew_up` one evaluated row at a time (what ``simulate`` keeps per run)."""

    factor: float = FACTOR
    patience: int = PATIENCE
    min_rounds: int = MIN_ROUNDS

    def __post_init__(self) -> None:
        self.losses: list[float] = []
        self.rounds: list[int] = []
        self.key: str | None = None

    def update(self, row: dict) -> bool:
        """Record the row's tracked loss; True when the run has blown up."""
        if self.key is None:
            self.key = tracked_loss(row)
        if self.key is None or self.key not in row:
            return False
        self.losses.append(float(row[self.key]))
        self.rounds.append(int(row.get("round", len(self.rounds))))
        return blew_up(
            self.losses, self.rounds, factor=self.factor, patience=self.patience, min_rounds=self.min_rounds
        )

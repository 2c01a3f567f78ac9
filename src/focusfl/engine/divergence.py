"""Blow-up detection: a run whose loss has left its starting value far behind, for good.

A non-finite model stops a run at once. A model can also stay finite while training has
plainly failed: SG-FOCUS on 45 handwritten digits per client at twice its stable step went from
a test loss of 2.3 to 2,500 (accuracy 0.09) and nothing flagged it. The rule, applied by
:func:`~focusfl.engine.simulate` at every evaluation:

    a run has BLOWN UP when its tracked loss has been above FACTOR x its value at the first
    evaluation (round 0) at PATIENCE or more consecutive evaluations spanning MIN_ROUNDS or
    more rounds (from the first of them to the last).

The tracked loss is the first of ``loss`` (convex problems: the full objective F), ``train_loss``,
``test_loss``, ``val_loss`` (neural networks) that the first row carries
(:func:`~focusfl.metrics.watched_loss`). FACTOR = 10, PATIENCE = 3, MIN_ROUNDS = 20:
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

from ..metrics import watched_loss

FACTOR = 10.0
PATIENCE = 3
MIN_ROUNDS = 20


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
    """:func:`blew_up` fed one evaluated row at a time, in O(1) memory.

    The rule only looks at the trailing run of evaluations above FACTOR x the start, so the
    detector keeps the start, the length of that run and its first round; :meth:`state` and
    :meth:`restore` carry them through a checkpoint, so a resumed run flags the same round.
    """

    factor: float = FACTOR
    patience: int = PATIENCE
    min_rounds: int = MIN_ROUNDS

    def __post_init__(self) -> None:
        self.key: str | None = None
        self.start: float | None = None  # the tracked loss at the first evaluation
        self.streak = 0  # evaluations in a row above factor x start
        self.streak_from = 0  # round of the first of them

    def update(self, row: dict) -> bool:
        """Record the row's tracked loss; True when the run has blown up."""
        if self.key is None:
            self.key = watched_loss(row)
        if self.key is None or self.key not in row:
            return False
        value, round_ = float(row[self.key]), int(row.get("round", 0))
        if self.start is None:
            self.start = value
            return False
        if not (math.isfinite(self.start) and self.start > 0):
            return False  # no reference; a non-finite model is caught by the simulator
        if not value > self.factor * self.start:
            self.streak = 0
            return False
        if self.streak == 0:
            self.streak_from = round_
        self.streak += 1
        return self.streak >= max(1, self.patience) and round_ - self.streak_from >= self.min_rounds

    def reason(self, row: dict) -> str:
        """Which rule stopped a run whose last row is ``row``, in words for its one-line message."""
        value = row.get(self.key) if self.key else None
        if isinstance(value, (int, float)) and math.isfinite(value) and self.start is not None:
            return (f"blow-up rule: {self.key} {value:.3g}, above {self.factor:g}x its start {self.start:.3g} at "
                    f"{self.streak} evaluations since round {self.streak_from}")
        return "non-finite model"

    def state(self) -> dict:
        return {"key": self.key, "start": self.start, "streak": self.streak, "streak_from": self.streak_from}

    def restore(self, state: dict) -> "BlowUpDetector":
        key, start = state.get("key"), state.get("start")
        streak, streak_from = state.get("streak", 0), state.get("streak_from", 0)
        if not (key is None or isinstance(key, str)) or not (start is None or isinstance(start, float)) \
                or not isinstance(streak, int) or not isinstance(streak_from, int):
            raise ValueError(f"not a blow-up detector state: {state!r}")
        self.key, self.start, self.streak, self.streak_from = key, start, streak, streak_from
        return self

"""``focusfl audit``: the accountant checked by an attack on the mechanism (docs/privacy.md, "Audit").

Canary clients, each in the federation with probability 1/2 (the other clients unchanged), take
part in a private training whose messages go through the run's mechanism and accountant
(:class:`~focusfl.privacy.RunPrivacy`: clipping, the keyed noise, the per-client epsilon). The
training is FedAvg's server step at step 1 on a linear loss, whose gradient does not depend on
the model: canary j sends C e_j (a direction no other client touches), the other clients C e_K.
That is the worst case the accountant must cover, so the attack is tight: the released model's
coordinate j is C k_j + noise when canary j is in, noise when it is out.

The attack guesses "in" where the coordinate is above a threshold. The canaries' coordinates are
independent trials (independent noise, no other client in them), so the attack's true- and
false-positive rates bound epsilon from below (Jagielski et al. 2020, Nasr et al. 2021): with
Clopper-Pearson bounds at ``confidence`` (each side), epsilon >= ln((TPR_lo - delta) / FPR_hi).
The threshold is chosen on the even canaries and the rates are counted on the odd ones, so the
choice does not bias the bound. The verdict is a stated criterion: the audited lower bound never
exceeds the accounted epsilon (of the canary that spent the most); a bound above it flags the
accountant (an epsilon too small for the mechanism), as a halved accountant is flagged in
tests/test_privacy.py.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

from ..errors import ConfigError
from ..rng import hash_bits
from . import RunPrivacy
from .config import DPConfig

AUDIT_STREAM = 0x41554400  # the canaries' coins, a stream of their own
CONFIDENCE = 0.95
CRITERION = "the audited epsilon (a lower bound at 95% confidence) never exceeds the accounted epsilon"


class Message(NamedTuple):
    """A client's message: one vector (what FedAvg sends)."""

    delta: torch.Tensor


class AuditResult(NamedTuple):
    accounted: float  # the largest accounted epsilon among the canaries in the federation
    audited: float  # the attack's lower bound on epsilon
    tpr: float
    fpr: float
    canaries: int
    included: int

    @property
    def holds(self) -> bool:
        """The criterion (CRITERION)."""
        return self.audited <= self.accounted


def check_audit(canaries: int, clients: int, rounds: int) -> None:
    """One-line ConfigErrors for the audit's sizes."""
    if isinstance(canaries, bool) or not isinstance(canaries, int) or canaries < 2:
        raise ConfigError(f"audit: --canaries must be an integer >= 2 (half choose the threshold, half count), "
                          f"got {canaries!r}")
    if isinstance(clients, bool) or not isinstance(clients, int) or clients < canaries:
        raise ConfigError(f"audit: --clients ({clients}) must be at least --canaries ({canaries}): the canaries "
                          "are clients of the federation")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ConfigError(f"audit: --rounds must be a positive integer, got {rounds!r}")


def run_audit(dp: DPConfig, *, canaries: int, clients: int, rounds: int, seed: int = 0, runs: int = 1) -> AuditResult:
    """The audit of ``dp``'s mechanism and accountant (module docstring), pooled over ``runs``
    independent runs (seeds seed, seed+1, ...): more trials, a tighter bound."""
    check_audit(canaries, clients, rounds)
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
        raise ConfigError(f"audit: --runs must be a positive integer, got {runs!r}")
    if dp.mode != "central" or not dp.accounted or dp.secret_schedule:
        raise ConfigError("audit: --dp needs mode=central, noise > 0 and delta (the audit checks the central "
                          "mechanism's accounted epsilon under a public schedule)")
    pooled = [_one_run(dp, canaries, clients, rounds, seed + k) for k in range(runs)]
    accounted = max(p[0] for p in pooled)
    scores = np.concatenate([p[1] for p in pooled])
    member = np.concatenate([p[2] for p in pooled])
    threshold = _best_threshold(scores[0::2], member[0::2], dp.delta)
    audited, tpr, fpr = _lower_bound(scores[1::2], member[1::2], threshold, dp.delta)
    return AuditResult(accounted, audited, tpr, fpr, canaries * runs, int(member.sum()))


def _one_run(dp: DPConfig, canaries: int, clients: int, rounds: int, seed: int):
    """One private training: (the largest accounted epsilon of the canaries in, the canaries'
    coordinates of the released model, which canaries were in)."""
    coins = hash_bits(seed, AUDIT_STREAM, torch.arange(canaries, dtype=torch.int64), 0, 0) & 1
    included = coins.to(torch.bool)
    # the federation: the canaries that are in, then the other clients (every client every round)
    active = torch.cat([included.nonzero().flatten(), torch.arange(canaries, clients, dtype=torch.int64)])
    privacy = RunPrivacy(dp, seed=seed, num_clients=clients, vectors=1, participation=None, end_round=rounds)
    directions = torch.where(active < canaries, active, torch.full_like(active, canaries))
    rows = torch.zeros(active.numel(), canaries + 1, dtype=torch.float64)
    rows[torch.arange(active.numel()), directions] = dp.clip
    model = torch.zeros(canaries + 1, dtype=torch.float64)
    for r in range(rounds):
        model += privacy.messages(Message(rows), r, active).delta.sum(dim=0)
    eps = privacy.epsilons()
    accounted = float(eps[:canaries][included.numpy()].max()) if bool(included.any()) else 0.0
    return accounted, model[:canaries].numpy(), included.numpy()


def _rates(scores: np.ndarray, member: np.ndarray, threshold: float) -> tuple[int, int, int, int]:
    guess = scores > threshold
    return int((guess & member).sum()), int(member.sum()), int((guess & ~member).sum()), int((~member).sum())


def _bound(tp: int, pos: int, fp: int, neg: int, delta: float) -> float:
    """ln((TPR_lo - delta) / FPR_hi), Clopper-Pearson at CONFIDENCE each side; 0 when nothing shows."""
    from scipy.stats import beta

    if pos == 0 or neg == 0 or tp == 0:
        return 0.0
    alpha = 1 - CONFIDENCE
    tpr_lo = float(beta.ppf(alpha, tp, pos - tp + 1))
    fpr_hi = 1.0 if fp == neg else float(beta.ppf(1 - alpha, fp + 1, neg - fp))
    if tpr_lo <= delta or fpr_hi <= 0:
        return 0.0
    return max(0.0, math.log((tpr_lo - delta) / fpr_hi))


def _best_threshold(scores: np.ndarray, member: np.ndarray, delta: float) -> float:
    """The threshold (among the scores) with the largest bound on these canaries."""
    ranks = np.unique(np.geomspace(1, max(1, scores.size // 2), 200).astype(np.int64))
    candidates = np.sort(scores)[::-1][ranks]  # the top 1, 2, ... scores: the rare false positives matter
    bounds = [_bound(*_rates(scores, member, t), delta) for t in candidates]
    return float(candidates[int(np.argmax(bounds))])


def _lower_bound(scores: np.ndarray, member: np.ndarray, threshold: float, delta: float) -> tuple[float, float, float]:
    tp, pos, fp, neg = _rates(scores, member, threshold)
    return _bound(tp, pos, fp, neg, delta), tp / max(pos, 1), fp / max(neg, 1)

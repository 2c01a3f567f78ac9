"""``focusfl audit``: the accountant checked by an attack on the mechanism (docs/privacy.md, "Audit").

Canary clients, each in the federation with probability 1/2 (the other clients unchanged), take
part in a private training whose messages go through the run's mechanism and accountant
(:class:`~focusfl.privacy.RunPrivacy`: clipping, the keyed noise, the per-client epsilon) under
the run's participation process (the process ``focusfl run`` would build, with the run's seed):
a canary takes part in the rounds the process schedules for its slot. The training is FedAvg's
server step at step 1 on a linear loss, whose gradient does not depend on the model: canary j
sends C e_j (a direction no other client touches), the other clients C e_K. That is the worst
case the accountant must cover. A canary that is out leaves its slot to a client that sends 0
(add-or-remove, the relation of every bound but one), or, where the bound rests on replace-one
(``uniform`` under a secret schedule), to a client that sends -C e_j: the two neighbours 2C apart.

What the attacker sees is what the mode releases: in central mode the final model (canary j's
coordinate: C k_j + noise when in, noise when out, k_j the rounds its slot joined); in local
mode each message as it leaves the client (what local mode protects from a reader without the
seed), its coordinate j summed over the rounds the slot joined. Under a public schedule the
attacker knows the schedule (which rounds each canary joined: metrics.csv, config.json's seed),
plays the game on the canaries that joined and scores each by its likelihood ratio; under a
secret schedule it does not, and scores the coordinate alone.

Two forms turn scores into a lower bound on epsilon:

- ``trials`` (the default): canaries of independent runs are independent trials; the attack
  guesses "in" above a threshold, chosen on the even canaries, and the odd ones' true- and
  false-positive rates bound epsilon with Clopper-Pearson at ``CONFIDENCE`` each side (Jagielski
  et al. 2020, Nasr et al. 2021): epsilon >= ln((TPR_lo - delta) / FPR_hi).
- ``one-run`` (Steinke, Nasr and Jagielski 2023, "Privacy auditing with one training run"): all
  canaries in ONE run; the attack guesses "in" on the k highest scores and "out" on the k lowest,
  abstaining elsewhere. Under (epsilon, delta)-DP the correct guesses W among r are dominated
  by Binomial(r, e^eps / (1 + e^eps)) up to their delta term: P[W >= v] <= f(v) + 2 m delta
  max_{1<=i<=v} (f(v - i) - f(v)) / i, f(v) = P[Binomial >= v], m the canaries. The bound is the
  largest epsilon that this p-value rejects at 1 - CONFIDENCE, Bonferroni-split over the k tried.

The verdict is a stated criterion: the audited lower bound never exceeds the accounted epsilon
(the largest of the canaries'); a bound above it flags the accountant (an epsilon too small for
the mechanism), as tests/test_privacy.py shows for a halved accountant on every row of the
report's table (reproduce/privacy_study.py).
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
import torch

from ..errors import ConfigError
from ..limits import check_allocation
from ..participation import PARTICIPATION, make_participation
from ..rng import hash_bits
from ..spec import parse_spec
from . import RunPrivacy, check_participation, reads_data
from .config import DPConfig

AUDIT_STREAM = 0x41554400  # the canaries' coins, a stream of their own
CONFIDENCE = 0.95
CRITERION = "the audited epsilon (a lower bound at 95% confidence) never exceeds the accounted epsilon"
FORMS = ("trials", "one-run")
# Defaults: the trials form pools many runs of few canaries (a run's noise grows as clients x
# canaries: 25 canaries over 1,200 runs took 2 s where 100 over 300 took 9 s, in process on 2
# loaded cores, for the same 30,000 trials); the one-run form needs its trials in one run.
DEFAULT_CANARIES = {"trials": 25, "one-run": 1000}
DEFAULT_RUNS = 1200
# A threshold whose few false positives on the choosing half look lucky does not carry to the
# counting half: at 30,000 trials, asking for 20 raised the bound in two of six seeds measured
# (bernoulli p = 0.5 and full, sigma = 1) and lowered it in none.
SELECTION_FALSE_POSITIVES = 20


class Message(NamedTuple):
    """A client's message: one vector (what FedAvg sends)."""

    delta: torch.Tensor


class AuditResult(NamedTuple):
    accounted: float  # the largest accounted epsilon among the canaries
    audited: float  # the attack's lower bound on epsilon
    canaries: int  # tested, over every run (under a public schedule, those whose slot joined)
    included: int  # of them, the canaries in the federation
    form: str
    schedule: str  # "public" (the attacker knows it) or "secret"
    tpr: float = 0.0  # trials: the rates the bound was computed from
    fpr: float = 0.0
    guesses: int = 0  # one-run: the guesses the bound was computed from, and the correct ones
    correct: int = 0

    @property
    def holds(self) -> bool:
        """The criterion (CRITERION)."""
        return self.audited <= self.accounted

    def evidence(self) -> str:
        """The attack's numbers behind the bound, in words."""
        tested = f"{self.canaries} canaries tested, {self.included} in"
        if self.form == "one-run":
            return f"{self.correct} of {self.guesses} guesses correct over {tested}"
        return f"TPR {self.tpr:.4g}, FPR {self.fpr:.4g} over {tested}"


class Observed(NamedTuple):
    """One private training as the attacker meets it: the score of each canary it tests, whether
    it was in, and the largest accounted epsilon among the canaries."""

    scores: np.ndarray
    member: np.ndarray
    accounted: float


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


def check_audit_memory(canaries: int, clients: int, runs: int) -> None:
    """A one-line ConfigError, before anything is drawn, where the audit would not fit in memory:
    a round holds a few [clients, canaries + 1] float64 tables (the rows, their noise, the
    messages), and the pooled runs keep each canary's score and coin."""
    check_allocation(3 * clients * (canaries + 1) * 8, f"audit: a round of {clients:,} clients x "
                     f"{canaries + 1:,} coordinates", error=ConfigError)
    check_allocation(2 * runs * canaries * 17, f"audit: {runs:,} runs x {canaries:,} canaries", error=ConfigError)


def check_setting(dp: DPConfig, participation: Any, clients: int, seed: int) -> Any:
    """The process built as the run would build it (a one-line ConfigError where the audit cannot
    take it under ``dp``)."""
    if not dp.accounted:
        raise ConfigError("audit: --dp needs noise > 0 and delta (the audit checks an accounted epsilon)")
    name = parse_spec(participation)[0]
    if reads_data(PARTICIPATION.get(name)):
        raise ConfigError(f"audit: participation {name} sets each client's rate from its data; the audit's clients "
                          "have none")
    process = make_participation(participation, clients, seed=seed)
    check_participation(dp, process)
    return process


def run_audit(dp: DPConfig, *, canaries: int | None = None, clients: int | None = None, rounds: int = 1,
              seed: int = 0, runs: int | None = None, participation: Any = "full", form: str = "trials") -> AuditResult:
    """The audit of ``dp``'s mechanism and accountant under ``participation`` (module docstring):
    ``trials`` pooled over ``runs`` independent runs (seeds seed, seed+1, ...), or ``one-run`` on
    the canaries of the run of ``seed``; None: the form's defaults (DEFAULT_CANARIES, DEFAULT_RUNS,
    the canaries and one other client)."""
    if form not in FORMS:
        raise ConfigError(f"audit: --form must be one of {', '.join(FORMS)}, got {form!r}")
    canaries = DEFAULT_CANARIES[form] if canaries is None else canaries
    clients = canaries + 1 if clients is None and isinstance(canaries, int) else clients
    check_audit(canaries, clients, rounds)
    if form == "one-run" and runs not in (None, 1):
        raise ConfigError(f"audit: --form one-run audits one training run; --runs {runs} is the trials form's")
    runs = (DEFAULT_RUNS if form == "trials" else 1) if runs is None else runs
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
        raise ConfigError(f"audit: --runs must be a positive integer, got {runs!r}")
    check_setting(dp, participation, clients, seed)
    check_audit_memory(canaries, clients, runs)
    observed = [observe(dp, participation, canaries, clients, rounds, seed + k) for k in range(runs)]
    accounted = max(o.accounted for o in observed)
    scores = np.concatenate([o.scores for o in observed])
    member = np.concatenate([o.member for o in observed])
    schedule = "secret" if dp.secret_schedule else "public"
    common = dict(accounted=accounted, canaries=int(member.size), included=int(member.sum()), schedule=schedule)
    if form == "one-run":
        audited, guesses, correct = one_run_bound(scores, member, dp.delta)
        return AuditResult(audited=audited, form=form, guesses=guesses, correct=correct, **common)
    threshold = _best_threshold(scores[0::2], member[0::2], dp.delta)
    audited, tpr, fpr = _lower_bound(scores[1::2], member[1::2], threshold, dp.delta)
    return AuditResult(audited=audited, form=form, tpr=tpr, fpr=fpr, **common)


def observe(dp: DPConfig, participation: Any, canaries: int, clients: int, rounds: int, seed: int) -> Observed:
    """One private training under the run's process (built with ``seed``) and the attacker's
    scores (module docstring). The rounds' rows are whole tensors: no per-client Python loop."""
    coins = hash_bits(seed, AUDIT_STREAM, torch.arange(canaries, dtype=torch.int64), 0, 0) & 1
    member = coins.to(torch.bool)
    process = make_participation(participation, clients, seed=seed)
    privacy = RunPrivacy(dp, seed=seed, num_clients=clients, vectors=1, participation=process, end_round=rounds)
    # the out canaries' slots: 0 (add-or-remove), or -C e_j where the bound is replace-one
    out_value = -dp.clip if privacy.amp.kind == "uniform" else 0.0
    slot_value = torch.where(member, dp.clip, out_value).to(torch.float64)
    model = torch.zeros(canaries + 1, dtype=torch.float64)  # central: the released model
    received = torch.zeros(canaries, dtype=torch.float64)  # local: coordinate j of canary j's messages, summed
    noised_rounds = 0
    for round_, active_set in enumerate(process.active_sets(0, rounds)):
        active = torch.as_tensor(active_set, dtype=torch.int64)
        if privacy.exhausted(round_, active) is not None:
            break  # a target_epsilon stops the training where it stops a run
        is_canary = active < canaries
        directions = torch.where(is_canary, active, torch.full_like(active, canaries))
        values = torch.full((active.numel(),), dp.clip, dtype=torch.float64)
        values[is_canary] = slot_value[active[is_canary]]
        rows = torch.zeros(active.numel(), canaries + 1, dtype=torch.float64)
        rows[torch.arange(active.numel()), directions] = values
        sent = privacy.messages(Message(rows), round_, active).delta
        noised_rounds += int(active.numel() > 0)
        model += sent.sum(dim=0)
        received.index_add_(0, active[is_canary], sent[is_canary.nonzero().flatten(), active[is_canary]])
    joined = privacy.counts[:canaries].to(torch.float64)
    observed = (received if dp.mode == "local" else model[:canaries]).numpy()
    accounted = float(privacy.epsilons()[:canaries].max())
    if dp.secret_schedule:
        return Observed(observed, member.numpy(), accounted)
    # The schedule is public and independent of the coins: the game is played on the canaries
    # whose slot joined (the others' output does not depend on them; their epsilon is 0).
    tested = joined.numpy() > 0
    scores = _likelihood_ratio(dp, observed, joined.numpy(), noised_rounds)
    return Observed(scores[tested], member.numpy()[tested], accounted)


def _likelihood_ratio(dp: DPConfig, observed: np.ndarray, joined: np.ndarray, noised_rounds: int) -> np.ndarray:
    """The log likelihood ratio of "in" against "out" for each canary, by an attacker who knows
    the schedule: the observation is N(C k_j, v_j) in, N(0, v_j) out, with v_j = (sigma C)^2
    times the rounds noised into it (central: every round with a participant, on the model;
    local: the k_j messages of the canary's slot). 0 for a canary whose slot never joined (not
    tested)."""
    signal = dp.clip * joined
    rounds_noised = joined if dp.mode == "local" else np.full_like(joined, float(noised_rounds))
    variance = (dp.noise * dp.clip) ** 2 * rounds_noised
    ratio = (signal * observed - signal**2 / 2) / np.where(variance > 0, variance, 1.0)
    return np.where(joined > 0, ratio, 0.0)


# -- the trials form -----------------------------------------------------------------------------
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
    """The threshold (among the scores) with the largest bound on these canaries, among those
    with at least SELECTION_FALSE_POSITIVES false positives where any has."""
    if scores.size == 0:
        return math.inf  # nothing to choose on: no guess
    ranks = np.unique(np.geomspace(1, max(1, scores.size // 2), 200).astype(np.int64))
    ranks = np.minimum(ranks, scores.size - 1)
    candidates = np.sort(scores)[::-1][ranks]  # the top 1, 2, ... scores: the rare false positives matter
    rates = [_rates(scores, member, t) for t in candidates]
    steady = [r[2] >= SELECTION_FALSE_POSITIVES for r in rates]
    bounds = [_bound(*r, delta) if ok or not any(steady) else 0.0 for r, ok in zip(rates, steady)]
    return float(candidates[int(np.argmax(bounds))])


def _lower_bound(scores: np.ndarray, member: np.ndarray, threshold: float, delta: float) -> tuple[float, float, float]:
    tp, pos, fp, neg = _rates(scores, member, threshold)
    return _bound(tp, pos, fp, neg, delta), tp / max(pos, 1), fp / max(neg, 1)


# -- the one-run form ----------------------------------------------------------------------------
def one_run_p_value(canaries: int, guesses: int, correct: int, epsilon: float, delta: float) -> float:
    """P[W >= correct] under (epsilon, delta)-DP, their bound: f(v) + 2 m delta max_i (f(v-i) - f(v)) / i,
    f(v) = P[Binomial(r, e^eps / (1 + e^eps)) >= v] (module docstring)."""
    from scipy.stats import binom

    accuracy = 1.0 / (1.0 + math.exp(-epsilon))  # randomized response's at epsilon
    tail = float(binom.sf(correct - 1, guesses, accuracy))
    if correct == 0:
        return min(1.0, tail)
    below = binom.pmf(np.arange(correct - 1, -1, -1), guesses, accuracy)  # P[W = v-1], P[W = v-2], ...
    slope = float(np.max(np.cumsum(below) / np.arange(1, correct + 1)))
    return min(1.0, tail + 2 * canaries * delta * slope)


def one_run_epsilon(canaries: int, guesses: int, correct: int, delta: float, level: float) -> float:
    """The largest epsilon whose p-value for ``correct`` of ``guesses`` is below ``level`` (0 if
    none is): bisection, the p-value increasing in epsilon."""
    if guesses == 0 or one_run_p_value(canaries, guesses, correct, 0.0, delta) >= level:
        return 0.0
    lo, hi = 0.0, 1.0
    while one_run_p_value(canaries, guesses, correct, hi, delta) < level:
        lo, hi = hi, 2 * hi
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if one_run_p_value(canaries, guesses, correct, mid, delta) < level else (lo, mid)
    return lo


def one_run_bound(scores: np.ndarray, member: np.ndarray, delta: float) -> tuple[float, int, int]:
    """(epsilon, guesses, correct): the best bound over the guess counts k (k "in" on the top
    scores, k "out" on the bottom), each at (1 - CONFIDENCE) / (the counts tried) (Bonferroni)."""
    m = scores.size
    if m < 2:
        return 0.0, 0, 0  # no canary to guess out beside one guessed in
    counts = np.unique(np.maximum(1, m // 2 ** np.arange(1, int(math.log2(m)) + 1)))
    order = np.argsort(scores, kind="stable")
    level = (1 - CONFIDENCE) / counts.size
    best = (0.0, 0, 0)
    for k in counts:
        k = int(k)
        correct = int(member[order[m - k:]].sum() + (~member[order[:k]]).sum())
        epsilon = one_run_epsilon(m, 2 * k, correct, delta, level)
        if epsilon > best[0] or best[1] == 0:
            best = (epsilon, 2 * k, correct)
    return best

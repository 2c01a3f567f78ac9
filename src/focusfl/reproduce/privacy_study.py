"""The privacy study of the report (issue 43, docs/privacy.md): FOCUS, SG-FOCUS, SCAFFOLD, FedAvg
and FedAU under Bernoulli and Markov participation at equal per-client epsilon.

For each participation process, seed and budget epsilon, the noise multiplier sigma is the one
that spends exactly the budget on the client that spends the most (bisection over the accountant
of focusfl.privacy on the run's own participation, under the public-schedule bound the runs
report: the client that joins most often decides it), so every algorithm is compared at the same
worst-case client epsilon. Each algorithm clips at the median norm of its own messages in a short
pilot without noise (a study's shortcut: a private deployment would choose C without looking).
Central mode runs the algorithms it covers (FedAU's server weighs each message, so it runs only
in local mode); local mode runs all five. The runs are plain runs of the runner (RunConfig with
``dp``); the verdict is computed by a registered criterion over the final errors over seeds.

The MNIST half (issue 43 item 3) runs the same design on the report's digits (``--data``, an
.npz; skipped with a note without it): multinomial logistic regression (``logreg``, 7,850
parameters) on a Dirichlet partition, every algorithm on minibatches of 32 at a fixed step per
algorithm (chosen on a pilot without DP), judged on the final test accuracy. FOCUS is SG-FOCUS
there: on a minibatch oracle they are one computation, and FOCUS's full client gradients cost
ten times as much a run.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..algorithms import make_algorithm
from ..engine import simulate
from ..privacy import central_covers, message_vectors
from ..privacy.accounting import Accountant, amplification, noise_multiplier
from ..privacy.audit import CRITERION as AUDIT_CRITERION
from ..privacy.audit import DEFAULT_CANARIES, DEFAULT_RUNS, run_audit
from ..privacy.config import DPConfig, parse_dp
from ..privacy.mechanism import vector_fields
from ..runs.config import RunConfig
from ..runs.driver import build
from ..words import counted
from ..sweeps.sweep import compute_configs
from .verdicts import Claim, Criterion, Section, ahead, all_of

ALGORITHMS = ("focus", "sg_focus", "scaffold", "fedavg", "fedau")
EXACT = ("focus", "sg_focus", "scaffold")  # the methods that converge exactly without DP
PROCESSES = ("bernoulli", "markov")
CLAIM_BUDGET = 8.0  # the epsilon of the claim


@dataclass(frozen=True)
class PrivacySizes:
    """One study's problem and sizes: ``problem`` a SPEC (string or table); ``batch``: SG-FOCUS's
    minibatch on it (None: the problem's own); ``metric``: the row key judged at the end (lower
    is better unless ``higher_is_better``); ``steps``: each algorithm's step (None: the run's
    default, the problem's auto step)."""

    # 64 clients: with 16, central noise on the sum swamped every method at these budgets
    problem: Any = "ridge:clients=64,dim=10,hetero=1,samples=20"
    batch: int | None = 10  # SG-FOCUS's minibatch on the same problem (FOCUS with stochastic gradients)
    rounds: int = 100
    budgets: tuple = (2.0, 8.0)
    seeds: int = 3
    modes: tuple = ("central", "local")
    delta: float = 1e-5
    pilot_rounds: int = 20
    quick: bool = False
    algorithms: tuple = ALGORITHMS
    exact: tuple = EXACT
    metric: str = "rel_error"
    higher_is_better: bool = False
    steps: Any = None  # {algorithm: lr} or None
    local_steps: int | None = None  # None: each algorithm's default
    claim_budgets: tuple = (CLAIM_BUDGET,)  # the budgets the claim is judged at (one claim per mode and budget)


FULL_PRIVACY = PrivacySizes()
QUICK_PRIVACY = PrivacySizes(problem="ridge:clients=16,dim=10,hetero=1", rounds=40, budgets=(8.0,), modes=("local",),
                             pilot_rounds=5, quick=True)

# The MNIST half: logreg on minibatches of 32 for every algorithm (FOCUS on minibatches is
# SG-FOCUS); each step the one of {0.003, 0.01, 0.03, 0.1, 0.3} (and 0.001 for SG-FOCUS) with the
# best final test accuracy in a 100-round pilot without DP on mnist10k.npz (20 clients, Markov,
# seed 0): a study's shortcut, as the pilot clip is.
MNIST_ALGORITHMS = ("sg_focus", "scaffold", "fedavg", "fedau")
MNIST_STEPS = {"sg_focus": 0.003, "scaffold": 0.03, "fedavg": 0.03, "fedau": 0.03}


def mnist_problem(data: str, clients: int) -> dict:
    """The MNIST half's problem on the digits ``data`` (an .npz of images and labels)."""
    return {"name": "nn", "data": str(Path(data).expanduser()), "model": "logreg", "clients": clients,
            "partition": "dirichlet", "alpha": 0.3, "batch": 32, "test_fraction": 0.2}


# Budgets of the MNIST half: the claim's 8, and two far weaker ones that show where the methods
# part. With 20 clients and 7,850 parameters, 8 (and 2) leave every method at chance: the noise
# multiplier is about 5 there, and about 0.3 at 1,024. The claim is judged at 8 and at 64.
MNIST_BUDGETS = (8.0, 64.0, 1024.0)


def mnist_sizes(data: str, quick: bool) -> PrivacySizes:
    """The MNIST half's sizes: 20 clients, 100 rounds, 3 seeds, MNIST_BUDGETS, both modes
    (quick: 6 clients, 6 rounds, 1 seed, local mode at 8)."""
    mnist = dict(batch=None, algorithms=MNIST_ALGORITHMS, exact=("sg_focus", "scaffold"), metric="test_accuracy",
                 higher_is_better=True, steps=MNIST_STEPS, local_steps=5)
    if quick:
        return PrivacySizes(problem=mnist_problem(data, 6), rounds=6, budgets=(8.0,), seeds=1, modes=("local",),
                            pilot_rounds=3, quick=True, **mnist)
    return PrivacySizes(problem=mnist_problem(data, 20), budgets=MNIST_BUDGETS, claim_budgets=MNIST_BUDGETS[:2],
                        **mnist)


class _NormRecorder:
    """A run's privacy hook that changes nothing and keeps each vector's norm (the pilot's)."""

    def __init__(self) -> None:
        self.norms: list[torch.Tensor] = []

    def exhausted(self, round_: int, active: torch.Tensor) -> None:
        return None

    def messages(self, message: Any, round_: int, active: torch.Tensor) -> Any:
        if message is not None:
            self.norms += [message[k].flatten(1).norm(dim=1) for k in vector_fields(message)]
        return message

    def columns(self) -> dict:
        return {}


def _problem_of(algorithm: str, sizes: PrivacySizes) -> Any:
    if algorithm != "sg_focus" or sizes.batch is None:
        return sizes.problem
    if isinstance(sizes.problem, dict):
        return {**sizes.problem, "batch": sizes.batch}
    return f"{sizes.problem},batch={sizes.batch}"


def _config(algorithm: str, participation: str, seed: int, rounds: int, sizes: PrivacySizes, **more: Any) -> RunConfig:
    """The RunConfig of one of the study's runs (its step and local steps where the sizes fix them)."""
    fixed = {}
    if sizes.steps is not None:
        fixed["lr"] = sizes.steps[algorithm]
    if sizes.local_steps is not None:
        fixed["local_steps"] = sizes.local_steps
    return RunConfig(algorithm=algorithm, problem=_problem_of(algorithm, sizes), participation=participation,
                     rounds=rounds, seed=seed, **fixed, **more)


def pilot_clip(algorithm: str, participation: str, seed: int, sizes: PrivacySizes) -> float:
    """The median norm of ``algorithm``'s message vectors over a pilot without DP."""
    built = build(_config(algorithm, participation, seed, sizes.pilot_rounds, sizes))
    recorder = _NormRecorder()
    simulate(built.algorithm, built.problem, built.participation, sizes.pilot_rounds, seed=seed, eval_every=None,
             privacy=recorder)
    norms = torch.cat(recorder.norms) if recorder.norms else torch.zeros(0)
    return float(norms.median()) if norms.numel() else 1.0  # 1: no client joined the pilot


def calibrated_sigma(counts: np.ndarray, rounds: int, budget: float, delta: float, vectors: int, amp) -> float:
    """The noise multiplier sigma whose largest per-client epsilon (``counts`` rounds joined,
    ``rounds`` run, amplification ``amp``) is ``budget``: bisection on log sigma to 0.5%."""
    def largest(sigma: float) -> float:
        accountant = Accountant(noise_multiplier(sigma, vectors), delta, amp, counts.size)
        return float(accountant.epsilons(counts, rounds).max())

    lo, hi = 0.05, 1000.0
    while hi / lo > 1.005:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if largest(mid) > budget else (lo, mid)
    return hi  # the side that stays within the budget


def study_rows(sizes: PrivacySizes, batch_runs: int | str = "auto") -> list[dict]:
    """One row per (mode, process, budget, algorithm, seed): the final value of ``sizes.metric``
    (ridge: the relative error; MNIST: the test accuracy), sigma, C and the largest per-client
    epsilon the run reported; budget inf: the run without DP. The runs are computed together, in
    batches of ``batch_runs`` (sweep.compute_configs: each the run alone's result)."""
    planned = []  # (the row's settings, the run's config)
    made = {a: make_algorithm(a) for a in sizes.algorithms}  # what each sends, and whether central DP covers it
    for participation in PROCESSES:
        for seed in range(sizes.seeds):
            clips = {a: pilot_clip(a, participation, seed, sizes) for a in sizes.algorithms}
            planned += [_planned_run(a, participation, seed, math.inf, "none", None, None, sizes)
                        for a in sizes.algorithms]
            built = build(_config(sizes.algorithms[0], participation, seed, sizes.rounds, sizes))
            counts = built.participation.rows(0, sizes.rounds).sum(axis=0)
            sigmas: dict[tuple, float] = {}  # (mode, budget, vectors): the algorithms that send as many share it
            for mode in sizes.modes:
                # the study's runs declare no secret schedule: sigma is calibrated on the bound they report
                amp = amplification(built.participation, DPConfig(clip=1.0, noise=1.0, mode=mode))
                for budget in sizes.budgets:
                    for algorithm in sizes.algorithms:
                        if mode == "central" and not central_covers(made[algorithm]):
                            continue
                        key = (mode, budget, message_vectors(made[algorithm]))
                        if key not in sigmas:
                            sigmas[key] = calibrated_sigma(counts, sizes.rounds, budget, sizes.delta, key[2], amp)
                        planned.append(_planned_run(algorithm, participation, seed, budget, mode, sigmas[key],
                                                    clips[algorithm], sizes))
    results = compute_configs([config for _, config in planned], batch_runs)
    return [{**row, "final": result.last_row[sizes.metric], "epsilon_max": result.last_row.get("epsilon_max", math.inf)}
            for (row, _), result in zip(planned, results)]


def _planned_run(algorithm: str, participation: str, seed: int, budget: float, mode: str, sigma: float | None,
                 clip: float | None, sizes: PrivacySizes) -> tuple[dict, RunConfig]:
    """A study run: its row's settings and its config (evaluated at its start and its end)."""
    dp = "none" if sigma is None else f"clip={clip:.6g},noise={sigma:.6g},mode={mode},delta={sizes.delta:g}"
    row = {"mode": mode, "participation": participation, "budget": budget, "algorithm": algorithm, "seed": seed,
           "sigma": sigma, "clip": clip}
    return row, _config(algorithm, participation, seed, sizes.rounds, sizes, eval_every=sizes.rounds, dp=dp)


def finals(rows: list[dict], mode: str, participation: str, budget: float, algorithm: str) -> list[float]:
    """The final errors over seeds of one cell (nan for a diverged run: never ahead)."""
    return [r["final"] if math.isfinite(r["final"]) else math.nan for r in rows
            if r["mode"] == mode and r["participation"] == participation and r["budget"] == budget
            and r["algorithm"] == algorithm]


def best_exact(rows: list[dict], mode: str, participation: str, budget: float,
               sizes: PrivacySizes = FULL_PRIVACY) -> tuple[str, list[float]]:
    """The exact method with the best mean final value in a cell (the lowest error, the highest
    accuracy), and its values over seeds."""
    cells = {a: finals(rows, mode, participation, budget, a) for a in sizes.exact}
    cells = {a: v for a, v in cells.items() if v}
    sign = -1.0 if sizes.higher_is_better else 1.0
    name = min(cells, key=lambda a: sign * np.mean(cells[a]) if all(map(math.isfinite, cells[a])) else math.inf)
    return name, cells[name]


def _exact_ahead(values) -> "bool | None":
    return all_of([ahead(values[f"fedavg_{p}"], values[f"exact_{p}"]) for p in PROCESSES])


EXACT_UNDER_DP = Criterion(
    "privacy-exact-ahead",
    "under each process, the best exact method's final error lies below FedAvg's over every seed "
    f"(spreads separate) at epsilon = {CLAIM_BUDGET:g}",
    tuple(f"{side}_{p}" for p in PROCESSES for side in ("exact", "fedavg")),
    _exact_ahead,
    reasons={"not reproduced": "DP noise erases (or reverses) the exact methods' advantage at this budget",
             "inconclusive": "the spreads over seeds overlap"},
)


def _exact_more_accurate(values) -> "bool | None":
    return all_of([ahead(values[f"exact_{p}"], values[f"fedavg_{p}"]) for p in PROCESSES])


EXACT_UNDER_DP_ACCURACY = Criterion(
    "privacy-exact-ahead-accuracy",
    "under each process, the best exact method's final test accuracy lies above FedAvg's over every seed "
    "(spreads separate) at the claim's epsilon",
    tuple(f"{side}_{p}" for p in PROCESSES for side in ("exact", "fedavg")),
    _exact_more_accurate,
    reasons={"not reproduced": "FedAvg is the more accurate under DP at this budget",
             "inconclusive": "the spreads over seeds overlap"},
)


def _audit_within(values) -> "bool | None":
    if not (math.isfinite(values["accounted"]) and math.isfinite(values["audited"])):
        return None
    return values["audited"] <= values["accounted"]


AUDIT_WITHIN = Criterion(
    "privacy-audit-within-accounted",
    AUDIT_CRITERION,
    ("accounted", "audited"),
    _audit_within,
    reasons={"not reproduced": "the attack proves more epsilon than the accountant reports: the accountant is wrong"},
)
# The audit's setting (focusfl audit's): central or local DP at sigma = 1, one round, 25 canaries
# a run (each in a direction no other client touches) and one other client, uniform's m half of
# the 26: the attack reaches over half the accounted epsilon on every row (tests/test_privacy.py
# halves the accountant and sees the criterion flag each).
AUDIT_DP = "clip=1,noise=1,delta=1e-2"
AUDIT_PROCESSES = ("full", "bernoulli:p=0.5", "uniform:m=13", "banded")
# (process, mode, secret schedule): both modes under the public schedule, and central mode under
# the secret schedule the sampling processes can keep
AUDIT_SETTINGS = tuple((p, mode, False) for p in AUDIT_PROCESSES for mode in ("central", "local")) + tuple(
    (p, "central", True) for p in AUDIT_PROCESSES[1:])
AUDIT_CANARIES = DEFAULT_CANARIES["trials"]  # focusfl audit's defaults (privacy/audit.py says why)


def audit_dp(mode: str, secret: bool) -> str:
    """The --dp of an audit row."""
    return f"{AUDIT_DP},mode={mode}" + (",secret_schedule=true" if secret else "")


def audit_runs(quick: bool) -> int:
    return 100 if quick else DEFAULT_RUNS


def audit_rows(quick: bool) -> list[tuple[str, str, bool, Any]]:
    """(process, mode, secret, focusfl audit's result) for every AUDIT_SETTINGS row."""
    runs = audit_runs(quick)
    return [(process, mode, secret, run_audit(parse_dp(audit_dp(mode, secret)), canaries=AUDIT_CANARIES,
                                              clients=AUDIT_CANARIES + 1, rounds=1, runs=runs,
                                              participation=process))
            for process, mode, secret in AUDIT_SETTINGS]


def audit_claims(rows: list[tuple[str, str, bool, Any]], quick: bool) -> list[Claim]:
    """One claim per audit row: the criterion over its accounted and audited epsilon."""
    claims = []
    for process, mode, secret, result in rows:
        command = (f"focusfl audit --dp {audit_dp(mode, secret)} --participation {process} "
                   f"--canaries {AUDIT_CANARIES} --runs {audit_runs(quick)}")
        values = {"accounted": result.accounted, "audited": result.audited}
        claims.append(Claim(SOURCE_PRIVACY, f"audit, {process}, {mode} DP, {result.schedule} schedule",
                            "the accounted epsilon is an upper bound the attack cannot beat", command,
                            f"accounted epsilon {result.accounted:.4g}, audited lower bound {result.audited:.4g}",
                            AUDIT_WITHIN.judge(values, quick=quick)))
    return claims


def audit_table(rows: list[tuple[str, str, bool, Any]], claims: list[Claim]) -> list[str]:
    """Markdown: per process, mode and schedule, the accounted and audited epsilon and the verdict
    of the row's claim."""
    lines = ["| participation | mode | schedule | accounted ε | audited ε (lower bound) | verdict |",
             "|---|---|---|---|---|---|"]
    for (process, mode, _, result), claim in zip(rows, claims):
        lines.append(f"| {process} | {mode} | {result.schedule} | {result.accounted:.3g} | {result.audited:.3g} | "
                     f"{claim.verdict.outcome} |")
    return lines


def claim_values(rows: list[dict], mode: str, budget: float = CLAIM_BUDGET, sizes: PrivacySizes = FULL_PRIVACY) -> dict:
    """The criterion's numbers for ``mode``: per process, the best exact method's and FedAvg's
    final values (errors, or accuracies)."""
    values = {}
    for participation in PROCESSES:
        values[f"exact_{participation}"] = best_exact(rows, mode, participation, budget, sizes)[1]
        values[f"fedavg_{participation}"] = finals(rows, mode, participation, budget, "fedavg")
    return values


def table(rows: list[dict], algorithms: tuple = ALGORITHMS) -> list[str]:
    """Markdown: mean final value (and the range over seeds) per algorithm and cell."""
    cells = sorted({(r["mode"], r["participation"], r["budget"]) for r in rows},
                   key=lambda c: (c[0] != "none", c[0], c[1], -c[2]))
    head = "| mode | participation | epsilon | " + " | ".join(algorithms) + " |"
    lines = [head, "|" + "---|" * (3 + len(algorithms))]
    for mode, participation, budget in cells:
        shown = []
        for algorithm in algorithms:
            values = finals(rows, mode, participation, budget, algorithm)
            shown.append("—" if not values else f"{np.mean(values):.3g} [{min(values):.2g}, {max(values):.2g}]")
        lines.append(f"| {mode} | {participation} | {'∞' if math.isinf(budget) else f'{budget:g}'} | "
                     + " | ".join(shown) + " |")
    return lines


SOURCE_PRIVACY = "focusfl (privacy under arbitrary participation)"


def privacy_section(quick: bool, data: str | None = None, batch_runs: int | str = "auto") -> Section:
    """The report's section: the tables of final values against epsilon and the claims per mode,
    on ridge and (with ``data``, an .npz of digits) on MNIST; the runs in batches of ``batch_runs``."""
    sizes = QUICK_PRIVACY if quick else FULL_PRIVACY
    rows = study_rows(sizes, batch_runs)
    ran = (f"{sizes.problem}, {sizes.rounds} rounds, {counted(sizes.seeds, 'seed')}, delta = {sizes.delta:g}; sigma calibrated "
           "so the most-spending client ends at the budget; C = median pilot norm per algorithm")
    audits = audit_rows(quick)
    audited = audit_claims(audits, quick)
    claims = _claims(rows, sizes, ran, "", "error") + audited
    text = [
        "Client-level DP (docs/privacy.md) around every algorithm's messages: each vector a client sends clipped to "
        "C, Gaussian noise sigma C on the round's sum (central) or on each message (local). At each budget sigma is "
        "the one that spends exactly epsilon on the most-spending client of the run's own participation (the "
        "public-schedule bound the runs report: composition over the rounds each client joined), so the algorithms "
        "are compared at equal worst-case client epsilon. FedAU's server weighs each message, which central noise "
        "on the sum does not cover: it runs in local mode only. Ridge: final relative error, mean [min, max] over "
        "seeds (epsilon ∞: without DP):",
        "\n".join(table(rows)),
        "The accountant checked by `focusfl audit`'s attack (docs/privacy.md, \"Audit\"): canaries each in the "
        f"federation with probability 1/2, {AUDIT_CANARIES} a run over {audit_runs(quick)} runs, one round at "
        f"{AUDIT_DP}; per participation process, mode and schedule the largest accounted epsilon of the canaries "
        f"beside the attack's lower bound, and the verdict of the criterion ({AUDIT_CRITERION}):",
        "\n".join(audit_table(audits, audited)),
    ]
    if data is None:
        text.append("The MNIST half of the study was skipped: it needs `--data PATH.npz` (digits: `images` [M,28,28], "
                    "`labels` [M]).")
    else:
        started = time.perf_counter()
        mnist = mnist_sizes(data, quick)
        mnist_rows = study_rows(mnist, batch_runs)
        nn_seconds = time.perf_counter() - started
        ran = (f"MNIST ({Path(data).name}), logreg, {mnist.problem['clients']} clients (Dirichlet α = "
               f"{mnist.problem['alpha']:g}), minibatches of 32, {mnist.local_steps} local steps, {mnist.rounds} rounds, "
               f"{counted(mnist.seeds, 'seed')}, delta = {mnist.delta:g}; sigma calibrated as for ridge; C = median pilot norm")
        claims += _claims(mnist_rows, mnist, ran, ", MNIST", "test accuracy")
        text += [
            f"MNIST ({Path(data).name}): multinomial logistic regression, every algorithm on minibatches of 32 at a "
            "fixed step (" + ", ".join(f"{a} {mnist.steps[a]:g}" for a in mnist.algorithms) + "); FOCUS on "
            "minibatches is SG-FOCUS. Final test accuracy, mean [min, max] over seeds (epsilon ∞: without DP):",
            "\n".join(table(mnist_rows, mnist.algorithms)),
        ]
    return Section("Privacy: exact methods against FedAvg at equal client epsilon", claims, text,
                   nn_seconds=0.0 if data is None else nn_seconds)


def _claims(rows: list[dict], sizes: PrivacySizes, ran: str, where: str, measure: str) -> list[Claim]:
    """One claim per mode and claim budget of ``sizes``: the exact methods keep their advantage."""
    criterion = EXACT_UNDER_DP_ACCURACY if sizes.higher_is_better else EXACT_UNDER_DP
    claims = []
    for mode in sizes.modes:
        for budget in sizes.claim_budgets:
            values = claim_values(rows, mode, budget, sizes=sizes)
            number = "; ".join(f"{p}: best exact {np.mean(values[f'exact_{p}']):.3g} vs FedAvg "
                               f"{np.mean(values[f'fedavg_{p}']):.3g} ({measure})" for p in PROCESSES)
            at = "" if sizes.claim_budgets == (CLAIM_BUDGET,) else f", epsilon = {budget:g}"
            claims.append(Claim(SOURCE_PRIVACY, f"{mode} DP{where}{at}", "the exact methods keep their advantage "
                                f"over FedAvg under {mode} DP at epsilon = {budget:g}", ran, number,
                                criterion.judge(values, quick=sizes.quick)))
    return claims

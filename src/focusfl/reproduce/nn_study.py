"""The neural-network question of the report: SG-FOCUS against FedAvg, FedAU and SCAFFOLD on MNIST,
at tuned steps, across non-iid levels and horizons, over seeds; whether focusfl's SG-FOCUS is the
authors' update; and what drives the gap.

The study (``reproduce report --data DIGITS.npz``, or alone as ``focusfl reproduce nn-study``):

1. **The comparison.** For each Dirichlet α of ``StudySizes.alphas`` (32 clients, Bernoulli
   participation with the FOCUS rate preset, the MNIST CNN of the FedSUM paper, τ = 5, batch 32,
   20% of the digits held out for test), every algorithm's step is chosen on the clients'
   validation share by the search rule of ``focusfl tune`` (from the mnist-demo preset's step
   × 1/9..3, extended past an end until interior or bounded by a diverged step), then run for
   ``rounds`` rounds on ``seeds`` seeds; test accuracy is read at every horizon. These are the
   runs of the mnist-demo preset's machinery (reproduce_nn: tune_steps, run_final), one store
   folder per α, so a rerun skips finished runs.
2. **The authors' loop.** :mod:`focusfl.reproduce.authors_loop` runs SG-FOCUS as the authors'
   FedASL client/server classes do (a re-creation written by us) beside focusfl's, float64,
   full-batch gradients, a small CNN: their largest gap.
3. **What drives the gap** at the paper's α (Figure 9's 0.05): SG-FOCUS and FedAvg re-tuned and
   rerun with one suspected cause removed at a time, at the horizon ``gap_rounds``:
   minibatch noise in the tracker (full-batch gradients: every client's whole share at every
   step), stale tracked gradients of rarely-seen clients (full participation: every client every
   round; and uniform participation with the Bernoulli preset's mean count, where no client is
   rarer than the others), and the step size (SG-FOCUS's chosen step and its neighbours, its
   effective step per round N·η against FedAvg's τ·η). One seed of SG-FOCUS per condition also
   records its tracking error ‖y − N ∇F(x)‖ / ‖N ∇F(x)‖ (y tracks Σ_i ∇f_i) and the clients'
   mean staleness.

Every finding is judged by a criterion (focusfl/reproduce/verdicts.py) over the measured
numbers, with ≥ 3 seeds and separated spreads for any "different".
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import ConfigError
from ..io.atomic import open_atomic, write_csv, write_text
from ..io.folders import open_store
from ..participation import make_participation
from ..problems import make_problem
from ..runs.config import RunConfig
from ..runs.driver import build, execute
from ..words import counted
from .authors_loop import compare, comparison_config
from .preset import Preset
from .reproduce_nn import (
    AUTHORS_MARKOV_MATRIX,
    PresetOptions,
    Setup,
    authors_markov_rate,
    run_preset_runs,
    scenario_tag,
)
from .verdicts import (
    ANOTHER_AXIS,
    FOCUS,
    NOT_REPRODUCED,
    REPRODUCED,
    Claim,
    Criterion,
    Section,
    ahead,
    all_of,
    claims_rows,
    claims_table,
    finite,
    show,
)

FIGURES = Path("images") / "reproductions"
TITLE = "SG-FOCUS against FedAvg, FedAU and SCAFFOLD on real digits (MNIST), and the FOCUS paper's CIFAR-10 figure"

MODEL = "fedsum-mnist-cnn"
LOCAL_STEPS = 5
# Where each search starts: the mnist-demo preset's steps (reproduce_nn.MNIST_DEMO), x 1/9..3.
START_STEPS = {"sg_focus": 0.005, "fedavg": 0.05, "fedau": 0.05, "scaffold": 0.02}
GAP_ALGORITHMS = ("sg_focus", "fedavg")
CONVERGED_POINTS = 0.01  # a horizon is long enough when no mean accuracy moved more than this since the one before
# Runs shorter than this cannot tell training dynamics from the start's noise: a finding about the
# gap needs its runs (and step searches) at least this long.
MIN_STUDY_ROUNDS = 100


@dataclass(frozen=True)
class StudySizes:
    """The study's sizes; QUICK_STUDY shrinks them for tests (its verdicts are inconclusive)."""

    clients: int = 32
    alphas: tuple[float, ...] = (0.05, 1.0)
    paper_alpha: float = 0.05  # Figure 9's alpha: the claim is judged there
    rounds: int = 2000
    eval_every: int = 50
    horizons: tuple[int, ...] = (100, 300, 1000, 2000)
    seeds: int = 3
    tune_rounds: int = 200
    tune_eval_every: int = 20
    tune_seeds: int = 2
    gap_tune_seeds: int = 1  # the gap study's conditions start from the comparison's tuned steps
    gap_rounds: int = 300  # the horizon of the gap study (one of ``horizons``)
    gap_tune_rounds: int = 100
    gap_tune_eval_every: int = 10
    diagnostic_every: int = 10
    loop_clients: int = 6
    loop_rounds: int = 8
    quick: bool = False


FULL_STUDY = StudySizes()
QUICK_STUDY = StudySizes(clients=8, alphas=(0.3, 3.0), paper_alpha=0.3, rounds=4, eval_every=2, horizons=(2, 4),
                         seeds=3, tune_rounds=2, tune_eval_every=1, tune_seeds=1, gap_tune_seeds=1, gap_rounds=4,
                         gap_tune_rounds=2,
                         gap_tune_eval_every=1, diagnostic_every=2, loop_clients=3, loop_rounds=3, quick=True)


def problem_of(data: str, sizes: StudySizes, alpha: float, batch: int = 32) -> dict:
    return {"name": "nn", "data": str(Path(data).expanduser()), "model": MODEL, "clients": sizes.clients,
            "partition": "dirichlet", "alpha": alpha, "batch": batch, "test_fraction": 0.2}


def full_batch(data: str, sizes: StudySizes, alpha: float) -> int:
    """The largest client's share of the training digits: a batch this large gives every client
    all of its samples at every step (the partition does not depend on the batch)."""
    problem = make_problem(problem_of(data, sizes, alpha))
    return int(problem.sizes.max())


def mean_count(clients: int) -> int:
    """The Bernoulli preset's expected number of participants per round, rounded."""
    return max(1, round(float(make_participation("bernoulli", clients, seed=0).nominal_p().sum())))


def condition_setup(data: str, sizes: StudySizes, alpha: float, *, label: str, participation: str = "bernoulli",
                    batch: int = 32, steps: dict[str, float] | None = None, rounds: int | None = None,
                    gap: bool = False) -> tuple[Setup, dict]:
    """A reproduce_nn Setup of one condition of the study, and its problem on ``data``."""
    algorithms = GAP_ALGORITHMS if gap else tuple(START_STEPS)
    rounds = rounds or sizes.rounds
    problem = problem_of(data, sizes, alpha, batch)
    setup = Setup(
        title=f"nn study: {label}, Dirichlet α={alpha:g}",
        problem=problem, scenarios={label: participation},
        algorithms={name: {"lr": (steps or START_STEPS)[name], "local_steps": LOCAL_STEPS} for name in algorithms},
        rounds=rounds, eval_every=min(sizes.eval_every, rounds),
        tune_rounds=sizes.gap_tune_rounds if gap else sizes.tune_rounds,
        tune_eval_every=sizes.gap_tune_eval_every if gap else sizes.tune_eval_every,
        factors=(1 / 3, 1.0, 3.0) if steps else (1 / 9, 1 / 3, 1.0, 3.0))
    return setup, problem


def run_condition(setup: Setup, problem: dict, sizes: StudySizes, folder: Path, workers: int,
                  tune_seeds: int) -> dict:
    """Tune (``tune_seeds`` seeds per step), run and tabulate one condition (reproduce_nn's
    machinery, a store folder): its summary and steps rows and its runs (algorithm -> one row list
    per seed)."""
    run = RunConfig(rounds=setup.rounds, eval_every=setup.eval_every, dtype="float32", device="cpu", seed=0)
    args = PresetOptions(out=str(folder), run=run, seeds=sizes.seeds, tune_seeds=tune_seeds, steps="tuned",
                         workers=workers)
    summary, steps, panels = run_preset_runs(setup, problem, list(setup.algorithms), args, folder)
    return {"summary": summary, "steps": {row["algorithm"]: row for row in steps},
            "runs": next(iter(panels.values())), "folder": folder,
            "figure": folder / f"figure_{scenario_tag(next(iter(setup.scenarios.values())))}.png"}


def accuracy_at(seeds: list[list[dict]], horizon: int) -> list[float]:
    """Each seed's test accuracy at round ``horizon`` (nan where the run diverged before it)."""
    out = []
    for rows in seeds:
        found = [r for r in rows if int(r["round"]) == horizon and math.isfinite(r.get("test_accuracy", math.nan))
                 and str(r.get("diverged", "")).lower() not in ("true", "1")]
        out.append(found[0]["test_accuracy"] if found else math.nan)
    return out


def _mean(values: list[float]) -> float:
    return math.fsum(values) / len(values) if values and all(map(math.isfinite, values)) else math.nan


# -- the tracker's diagnostics --------------------------------------------------------------------
def diagnose(problem: dict, participation: str, lr: float, rounds: int, every: int) -> dict:
    """SG-FOCUS (seed 0) at step ``lr``: every ``every`` rounds, the tracking error
    ‖y − N ∇F(x)‖ / ‖N ∇F(x)‖ (∇F: the exact gradient of the training objective, dropout off) and
    the clients' mean staleness (rounds since each last trained); their means over the second half."""
    config = RunConfig(algorithm="sg_focus", problem=problem, participation=participation, rounds=rounds,
                       local_steps=LOCAL_STEPS, lr=lr, dtype="float32", seed=0, eval_every=rounds)
    built = build(config)
    n = built.problem.num_clients
    mask = built.participation.mask(rounds)
    last = np.full(n, -1)
    errors, staleness = [], []

    def record(result) -> None:
        r = result.rounds_done
        last[mask[r - 1]] = r - 1
        if r % every or r <= rounds // 2:
            return
        state = result.state.server
        full = built.problem.gradient(state.x) * n
        errors.append(float((state.y - full).norm() / full.norm()))
        seen = last >= 0
        staleness.append(float(np.mean(r - 1 - last[seen])) if seen.any() else math.nan)

    result = execute(built, keep_rows=False, on_round=record)
    return {"tracking_error": _mean(errors), "staleness": _mean(staleness),
            "diverged": result.diverged_at is not None}


# -- criteria ---------------------------------------------------------------------------------------
def _converged(v) -> bool:
    return v["largest_late_change"] < CONVERGED_POINTS


FIGURE9_MNIST = Criterion(
    "figure9-sg-focus-best-mnist", "at the paper's α, each at its tuned step: SG-FOCUS's final test accuracy above "
    "FedAvg's, FedAU's and SCAFFOLD's on every seed (spreads over ≥ 3 seeds separated), once every method has "
    f"converged (no mean accuracy moved by {CONVERGED_POINTS:g} or more since the previous horizon)",
    ("sg_focus", "fedavg", "fedau", "scaffold", "largest_late_change"),
    lambda v: None if not _converged(v) else all_of([ahead(v["sg_focus"], v[b]) for b in ("fedavg", "fedau", "scaffold")]),
    reasons={NOT_REPRODUCED: "on MNIST the averaging methods end ahead of SG-FOCUS; the gap study below says what "
                             "drives it"})

AUTHORS_LOOP = Criterion(
    "sg-focus-is-the-authors-loop", "focusfl's SG-FOCUS and the re-creation of the authors' FedASL client/server "
    "loop give server models within 1e-10 of each other (relative to how far the model moved), every round, float64, "
    "full-batch gradients", ("max_relative_gap",), lambda v: v["max_relative_gap"] < 1e-10,
    reasons={REPRODUCED: "the update rule is theirs: a gap between SG-FOCUS and the averaging methods is not a "
                         "difference of implementation"})

MARKOV_PANEL = Criterion(
    "figure9-markov-panel", "the authors' \"markov\" participation has memory: the two rows of its transition matrix "
    "differ (lag-one autocorrelation P(1→1) − P(0→1) ≠ 0)", ("autocorrelation",),
    lambda v: v["autocorrelation"] != 0,
    reasons={NOT_REPRODUCED: "both rows are (0.8, 0.2): each client joins each round i.i.d. with p = 0.2 whatever "
                             "its state, so that panel measured i.i.d. Bernoulli(0.2) participation; `reproduce "
                             "focus-cifar10 --participation-form authors` runs it as they did"})


def gap_of(fedavg: list[float], sg_focus: list[float]) -> list[float]:
    """Per seed: FedAvg's test accuracy minus SG-FOCUS's (the gap; positive: FedAvg ahead)."""
    return [a - b for a, b in zip(fedavg, sg_focus)]


def _halves(v) -> bool | None:
    """The condition's gap at most half the as-run gap on every seed (and the as-run gap separated above 0)."""
    base, gap = v["gap_as_run"], v["gap_without"]
    if v["rounds"] < MIN_STUDY_ROUNDS or ahead(base, [0.0] * len(base)) is not True or not all(map(finite, gap)) \
            or len(gap) < len(base):
        return None
    half = _mean(base) / 2
    if all(g <= half for g in gap):
        return True
    if all(g > half for g in gap):
        return False
    return None


def driver(name: str, cause: str, condition: str) -> Criterion:
    return Criterion(
        f"gap-driver-{name}", f"the gap is driven by {cause}: with {condition} the gap (FedAvg − SG-FOCUS test "
        "accuracy, each re-tuned) is at most half the as-run gap's mean on every seed, the as-run gap being "
        f"separated above 0 over ≥ 3 seeds, in runs of ≥ {MIN_STUDY_ROUNDS} rounds",
        ("gap_as_run", "gap_without", "rounds"), _halves)


NOISE_DRIVER = driver("minibatch-noise", "minibatch noise in the tracker", "full-batch gradients")
STALENESS_DRIVER = driver("staleness", "staleness (no client current every round)", "full participation")
RARE_DRIVER = driver("rare-clients", "rarely-seen clients", "uniform participation at the same mean count")

STEP_DRIVER = Criterion(
    "gap-driver-step", "the gap is driven by the step size: SG-FOCUS's tuned step is bounded by stability (a larger "
    "step diverged, or sits next to one that did) and its effective step per round on the mean gradient, N·η, is "
    f"below FedAvg's τ·η (step searches of ≥ {MIN_STUDY_ROUNDS} rounds decide stability)",
    ("sg_focus_bounded", "sg_focus_effective_step", "fedavg_effective_step", "rounds"),
    lambda v: None if v["rounds"] < MIN_STUDY_ROUNDS else (
        bool(v["sg_focus_bounded"]) and v["sg_focus_effective_step"] < v["fedavg_effective_step"]))

NON_IID_DRIVER = Criterion(
    "gap-driver-non-iid", "the gap is driven by non-iid data: the gap at the smallest α above the gap at the largest "
    f"α on every seed (spreads separated), in runs of ≥ {MIN_STUDY_ROUNDS} rounds",
    ("gap_smallest_alpha", "gap_largest_alpha", "rounds"),
    lambda v: None if v["rounds"] < MIN_STUDY_ROUNDS else ahead(v["gap_smallest_alpha"], v["gap_largest_alpha"]))

HORIZON_DRIVER = Criterion(
    "gap-driver-horizon", "the gap is driven by a short horizon: at the last horizon the gap is at most half its value "
    "at the first, on every seed, the first being separated above 0", ("gap_as_run", "gap_without", "rounds"), _halves)

FINDING_LABELS = {REPRODUCED: "supported", NOT_REPRODUCED: "not supported", ANOTHER_AXIS: "supported on another axis"}


# -- the study --------------------------------------------------------------------------------------
def check_study_folder(folder: str | Path) -> None:
    """ConfigError now, before anything runs, unless ``folder`` can hold the study's runs: absent,
    empty, or an nn-study folder focusfl wrote (opening it as the store does)."""
    with open_store(folder, kind="nn-study"):
        pass


def run_study(data: str, sizes: StudySizes, folder: Path, workers: int = 1, publish=None) -> dict:
    """Every run of the study into the store ``folder`` (finished runs of an earlier call are
    skipped); the numbers the section reports. ``publish(path, study)``, when given, writes more
    files into the folder before it is marked complete and returns their names."""
    def compared(alpha: float) -> dict:
        setup, problem = condition_setup(data, sizes, alpha, label="bernoulli (FOCUS preset p_i)")
        return run_condition(setup, problem, sizes, store.path / f"alpha-{alpha:g}", workers, sizes.tune_seeds)

    with open_store(folder, kind="nn-study") as store:
        # The paper's alpha first: the gap study starts from its steps (and a study cut short has it).
        comparison = {sizes.paper_alpha: compared(sizes.paper_alpha)}
        tuned = {name: row["lr"] for name, row in comparison[sizes.paper_alpha]["steps"].items()}
        m = mean_count(sizes.clients)
        batch = full_batch(data, sizes, sizes.paper_alpha)
        conditions = {
            "full-batch gradients": dict(batch=batch),
            "full participation": dict(participation="full"),
            f"uniform participation, {m} of {sizes.clients}": dict(participation=f"uniform:m={m}"),
        }
        gaps = {}
        for label, change in conditions.items():
            setup, problem = condition_setup(data, sizes, sizes.paper_alpha, label=label, steps=tuned,
                                             rounds=sizes.gap_rounds, gap=True, **change)
            gaps[label] = run_condition(setup, problem, sizes, store.path / f"gap-{scenario_tag(label)}", workers,
                                        sizes.gap_tune_seeds)
        diagnostics = {"as run": diagnose(problem_of(data, sizes, sizes.paper_alpha), "bernoulli", tuned["sg_focus"],
                                          sizes.gap_rounds, sizes.diagnostic_every)}
        for label in ("full-batch gradients", "full participation"):
            change = conditions[label]
            diagnostics[label] = diagnose(problem_of(data, sizes, sizes.paper_alpha, change.get("batch", 32)),
                                          change.get("participation", "bernoulli"),
                                          gaps[label]["steps"]["sg_focus"]["lr"], sizes.gap_rounds,
                                          sizes.diagnostic_every)
        loop = compare(comparison_config(data, clients=sizes.loop_clients, rounds=sizes.loop_rounds))
        for alpha in sizes.alphas:
            if alpha not in comparison:
                comparison[alpha] = compared(alpha)
        comparison = {alpha: comparison[alpha] for alpha in sizes.alphas}
        study = {"comparison": comparison, "gaps": gaps, "diagnostics": diagnostics, "loop": loop, "mean_count": m,
                 "full_batch": batch}
        files = publish(store.path, study) if publish is not None else []
        store.mark(files, folders=[p.name for p in store.path.iterdir() if p.is_dir() and not p.name.startswith(".")])
    return study


def nn_section(data: str | None, sizes: StudySizes, images: Path, folder: Path, workers: int = 1) -> Section:
    """The report's section: the study run (or reused) in ``folder``, its claims judged, its
    tables, its figures copied into ``images``."""
    if not data:
        section = study_section(None, sizes, None, images)
        section.text.append("The neural-network study was skipped: it needs `--data PATH.npz` (digits: `images` "
                            "[M,28,28], `labels` [M]).")
        return section
    started = time.perf_counter()
    section = study_section(data, sizes, run_study(data, sizes, folder, workers), images)
    section.nn_seconds = time.perf_counter() - started
    return section


def _spread(values: list[float]) -> str:
    if not values or not all(map(math.isfinite, values)):
        return "diverged" if values else "—"
    return f"{_mean(values):.3f} ({min(values):.3f} - {max(values):.3f})"


def study_section(data: str | None, sizes: StudySizes, study: dict | None, images: Path) -> Section:
    """The claims judged on the study's numbers (only the one read from the authors' code without a
    study), its tables, and its figures copied into ``images``."""
    section = Section(TITLE)
    markov_rate = authors_markov_rate()
    autocorrelation = AUTHORS_MARKOV_MATRIX[1][1] - AUTHORS_MARKOV_MATRIX[0][1]
    section.claims.append(Claim(
        FOCUS, "Appendix G, Figure 9 (right panel)", "SG-FOCUS beats the baselines under Markov participation",
        "the authors' main.py (BichengYing/FedASL), read: their \"markov\" transition matrix",
        f"rows (from absent, from present) = {AUTHORS_MARKOV_MATRIX}; P(present next) = {markov_rate:g} from either "
        f"state; lag-one autocorrelation {autocorrelation:g}",
        MARKOV_PANEL.judge({"autocorrelation": autocorrelation}, quick=sizes.quick)))
    if study is None:
        return section
    paper, comparison = sizes.paper_alpha, study["comparison"]
    runs = comparison[paper]["runs"]
    final = {name: accuracy_at(runs[name], sizes.rounds) for name in START_STEPS}
    change = max(abs(_mean(accuracy_at(runs[name], sizes.horizons[-1]))
                     - _mean(accuracy_at(runs[name], sizes.horizons[-2]))) if len(sizes.horizons) > 1 else math.inf
                 for name in START_STEPS)
    change = change if math.isfinite(change) else math.inf
    steps = comparison[paper]["steps"]
    section.claims.append(Claim(
        FOCUS, "Appendix G, Figure 9", "SG-FOCUS reaches the best test accuracy (on CIFAR-10, α = 0.05: above "
        "FedAvg, FedAU, MIFA and SCAFFOLD)",
        f"on MNIST ({Path(data).name}), {sizes.clients} clients, α = {paper:g}, Bernoulli preset, "
        f"{sizes.rounds} rounds, each at its step tuned on the clients' validation share, seeds 0-{sizes.seeds - 1} "
        "(CIFAR-10's 10,000 rounds: `reproduce focus-cifar10`)",
        "; ".join(f"{name} {_spread(final[name])} (η = {steps[name]['lr']:g})" for name in START_STEPS)
        + f"; largest move of a mean since round {sizes.horizons[-2] if len(sizes.horizons) > 1 else 0}: "
          f"{show(change)}",
        FIGURE9_MNIST.judge({**final, "largest_late_change": change}, quick=sizes.quick)))
    loop = study["loop"]
    section.claims.append(Claim(
        FOCUS, "Algorithm 2 and the authors' code", "SG-FOCUS as the authors run it (FedASLClient/FedASLServer)",
        f"a re-creation of their client/server loop beside focusfl's SG-FOCUS: {loop.model}, {loop.parameters:,} "
        f"parameters, {loop.clients} clients, {loop.rounds} rounds, float64, full-batch gradients, the same masks",
        f"largest ‖x_focusfl − x_authors‖ / ‖x_authors − x_0‖ = {loop.max_relative_gap:.1e} over "
        f"{loop.participants} client rounds",
        AUTHORS_LOOP.judge({"max_relative_gap": loop.max_relative_gap}, quick=sizes.quick)))
    section.text += _comparison_text(data, sizes, study, images)
    section.text += _gap_text(sizes, study)
    return section


def _comparison_text(data: str, sizes: StudySizes, study: dict, images: Path) -> list[str]:
    comparison = study["comparison"]
    text = [
        f"**The comparison.** {Path(data).name}: 20% of the digits held out for test, the rest split among "
        f"{sizes.clients} clients by Dirichlet α; Bernoulli participation with the FOCUS rate preset (about "
        f"{study['mean_count']} clients per round); `{MODEL}`, τ = {LOCAL_STEPS}, batch 32, float32. Each "
        "algorithm's step was chosen on a 10% validation share of every client's data ("
        f"{sizes.tune_rounds} rounds, {counted(sizes.tune_seeds, 'seed')}) by the search rule of `focusfl tune`, starting from "
        "the mnist-demo preset's step × 1/9, 1/3, 1, 3; the final runs train on all of the clients' data, seeds "
        f"0-{sizes.seeds - 1}. Test accuracy, mean (min - max) over the seeds, at each horizon:",
    ]
    header = "| α | method | step (reason) | " + " | ".join(f"round {h}" for h in sizes.horizons) + " |"
    lines = [header, "|---" * (3 + len(sizes.horizons)) + "|"]
    for alpha, result in comparison.items():
        for name in START_STEPS:
            row = result["steps"][name]
            cells = [_spread(accuracy_at(result["runs"][name], h)) for h in sizes.horizons]
            lines.append(f"| {alpha:g} | {name} | {row['lr']:g} ({row['reason']}"
                         + (", CAPPED" if row["capped"] else "") + ") | " + " | ".join(cells) + " |")
    text.append("\n".join(lines))
    for alpha, result in comparison.items():
        name = f"nn_study_alpha_{alpha:g}.png"
        if result["figure"].is_file():
            images.mkdir(parents=True, exist_ok=True)
            with open_atomic(images / name, "wb") as handle:
                handle.write(result["figure"].read_bytes())
            text += [f"![α = {alpha:g}]({FIGURES}/{name})",
                     f"*α = {alpha:g}*: test accuracy (left) and test/train loss (right), mean and min-max band "
                     f"over the seeds; the runs, steps.csv and summary.csv are in `nn-study/alpha-{alpha:g}/`."]
    return text


def _gap_text(sizes: StudySizes, study: dict) -> list[str]:
    paper, gaps = sizes.paper_alpha, study["gaps"]
    base = study["comparison"][paper]
    h = sizes.gap_rounds
    as_run = gap_of(accuracy_at(base["runs"]["fedavg"], h), accuracy_at(base["runs"]["sg_focus"], h))
    rows = [("as run (Bernoulli preset, batch 32)", base, as_run)]
    for label, result in gaps.items():
        rows.append((label, result, gap_of(accuracy_at(result["runs"]["fedavg"], h),
                                           accuracy_at(result["runs"]["sg_focus"], h))))
    text = [f"**What drives the gap** (α = {paper:g}, round {h}; every condition re-tuned for both methods by the same "
            f"rule, from the as-run steps × 1/3, 1, 3, {sizes.gap_tune_rounds} rounds, {counted(sizes.gap_tune_seeds, 'seed')}; "
            "final runs on seeds 0-" + f"{sizes.seeds - 1}; full batch = "
            f"{study['full_batch']} samples, the largest client's share):"]
    lines = ["| condition | SG-FOCUS η | FedAvg η | SG-FOCUS accuracy | FedAvg accuracy | gap (FedAvg − SG-FOCUS) |",
             "|---|---|---|---|---|---|"]
    for label, result, gap in rows:
        lines.append(f"| {label} | {result['steps']['sg_focus']['lr']:g} | {result['steps']['fedavg']['lr']:g} | "
                     f"{_spread(accuracy_at(result['runs']['sg_focus'], h))} | "
                     f"{_spread(accuracy_at(result['runs']['fedavg'], h))} | {_spread(gap)} |")
    text.append("\n".join(lines))
    diagnostics = study["diagnostics"]
    text.append("SG-FOCUS's tracker (seed 0, second half of the run): tracking error ‖y − N ∇F(x)‖ / ‖N ∇F(x)‖ and "
                "the clients' mean staleness (rounds since each last trained): "
                + "; ".join(f"{label}: {show(d['tracking_error'])}, staleness {show(d['staleness'])}"
                            + (" (diverged)" if d["diverged"] else "") for label, d in diagnostics.items()) + ".")
    by_label = dict((label, gap) for label, _, gap in rows)
    labels = list(gaps)
    sg, fa = base["steps"]["sg_focus"], base["steps"]["fedavg"]
    alphas = sorted(study["comparison"])
    gap_at = lambda alpha, horizon: gap_of(  # noqa: E731
        accuracy_at(study["comparison"][alpha]["runs"]["fedavg"], horizon),
        accuracy_at(study["comparison"][alpha]["runs"]["sg_focus"], horizon))
    findings = [
        ("minibatch noise in the tracker", NOISE_DRIVER.judge(
            {"gap_as_run": as_run, "gap_without": by_label[labels[0]], "rounds": h}, quick=sizes.quick)),
        ("staleness of the tracked gradients", STALENESS_DRIVER.judge(
            {"gap_as_run": as_run, "gap_without": by_label[labels[1]], "rounds": h}, quick=sizes.quick)),
        ("rarely-seen clients", RARE_DRIVER.judge(
            {"gap_as_run": as_run, "gap_without": by_label[labels[2]], "rounds": h}, quick=sizes.quick)),
        ("the step size", STEP_DRIVER.judge(
            {"sg_focus_bounded": sg["reason"].startswith(("bounded", "one step below")),
             "sg_focus_effective_step": sizes.clients * sg["lr"], "fedavg_effective_step": LOCAL_STEPS * fa["lr"],
             "rounds": sizes.tune_rounds}, quick=sizes.quick)),
        ("non-iid data", NON_IID_DRIVER.judge(
            {"gap_smallest_alpha": gap_at(alphas[0], sizes.rounds), "gap_largest_alpha": gap_at(alphas[-1], sizes.rounds),
             "rounds": sizes.rounds}, quick=sizes.quick)),
        ("a short horizon", HORIZON_DRIVER.judge(
            {"gap_as_run": gap_at(paper, sizes.horizons[0]), "gap_without": gap_at(paper, sizes.horizons[-1]),
             "rounds": sizes.horizons[0]}, quick=sizes.quick)),
    ]
    lines = ["| suspected driver | verdict |", "|---|---|"]
    for cause, verdict in findings:
        shown = FINDING_LABELS.get(verdict.outcome, verdict.outcome)
        lines.append(f"| {cause} | {verdict.markdown().replace(f'**{verdict.outcome}**', f'**{shown}**', 1)} |")
    text += ["Each suspected driver is judged by a criterion over these numbers (supported / not supported / "
             "inconclusive):", "\n".join(lines)]
    return text


# -- focusfl reproduce nn-study -------------------------------------------------------------------
def add_arguments(parser) -> None:
    parser.add_argument("--data", required=True, help="an .npz of digits: images [M,28,28], labels [M]")
    parser.add_argument("--out", default="runs/nn-study",
                        help="output folder (default runs/nn-study); the same command again skips finished runs")
    parser.add_argument("--quick", action="store_true", help="toy sizes (a smoke test; its verdicts are inconclusive)")
    parser.add_argument("--workers", type=int, default=1,
                        help="runs at a time, one thread each (the numbers do not depend on it)")


@dataclass(frozen=True)
class StudyOptions:
    """``focusfl reproduce nn-study``'s options."""

    out: str = "runs/nn-study"
    data: str | None = None
    quick: bool = False
    workers: int = 1


def section_markdown(section: Section, sizes: StudySizes) -> str:
    lines = [f"# {section.title}" + (" (quick: toy sizes, not findings)" if sizes.quick else ""), ""]
    if sizes.quick:
        lines += ["**A quick run** (`--quick`): toy sizes to test the command; its verdicts are inconclusive.", ""]
    lines += ["Written by `focusfl reproduce nn-study` (`focusfl/reproduce/nn_study.py`); `focusfl reproduce "
              "report --data ...` has it as one of its sections.", "", *claims_table([section]), ""]
    for paragraph in section.text:
        lines += [paragraph, ""]
    return "\n".join(lines).rstrip() + "\n"


def run(args: StudyOptions) -> int:
    if args.workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {args.workers}")
    if not args.data or not Path(args.data).expanduser().is_file():
        raise ConfigError(f"--data {args.data!r} is not a file")
    torch.set_num_threads(1)  # many small runs: threads only add synchronisation
    sizes = QUICK_STUDY if args.quick else FULL_STUDY
    if sizes.quick:
        print("quick study: toy sizes to test the command; its numbers are not findings", flush=True)
    made: dict = {}

    def publish(path: Path, study: dict) -> list[str]:
        section = study_section(args.data, sizes, study, path / FIGURES)
        write_text(path / "report.md", section_markdown(section, sizes))
        write_csv(path / "summary.csv", claims_rows([section]))
        made["section"] = section
        return ["report.md", "summary.csv"]

    run_study(args.data, sizes, Path(args.out), args.workers, publish=publish)
    for claim in made["section"].claims:
        print(f"{claim.claim}: {claim.verdict.outcome}")
    print(f"\nwrote {Path(args.out) / 'report.md'}{' (a QUICK run: toy sizes)' if sizes.quick else ''}, summary.csv, "
          f"{FIGURES}/*.png and the runs' folders")
    return 0


PRESETS = (
    Preset("nn-study", "SG-FOCUS against FedAvg, FedAU and SCAFFOLD on digits at tuned steps, over non-iid levels, "
           "horizons and seeds, and what drives the gap (--data PATH.npz)", add_arguments, StudyOptions, run),
)

"""Studies behind the reproduction report (``focusfl reproduce report``): each a pure function of
its sizes that returns rows of numbers, so the report prints them and the tests recompute them
at smaller sizes.

- :func:`low_participation`: rounds to 1e-8 against the smallest p_i (the FOCUS reviewers'
  question, seed 003), at tuned step sizes.
- :func:`long_absences`: the same under Markov participation with growing persistence rho.
- :func:`proxskip_adaptations`: ProxSkip's three adaptations to partial participation under
  every participation process.
- :func:`pushsum_against_focus`: the push-sum variants the authors proposed (seed 003) and FOCUS.
- :func:`scaffold_fixed_point`: SCAFFOLD started at (x*, c_i = grad f_i(x*)) under partial
  participation, with c = mean c_i and with c off that mean.
- :func:`scaffold_against_focus`: tuned SCAFFOLD and FOCUS per round and per float.
- :func:`reductions`: the FedSUM family's equivalences, as maximum differences of server models.
- :func:`exactness_under_work`: which algorithms stay exact when clients take fewer local steps
  than asked (work processes), with full and arbitrary participation, and FedAvg's measured
  limit against the step-weighted limit the matrix framework predicts.

Every run is a ``RunConfig`` built by the runner; tuning follows ``focusfl tune`` (reaching the
target first wins, else the lowest final error). A study searches all of its cells' steps
together (:func:`tuned_steps`), so that every round of the searches computes its trials in
batches of runs (``batch_runs``, runs/batch.py: each trial's row the one it has alone). SCAFFOLD's
fixed point, the reductions and FedAvg's predicted limit start from states of their own or
iterate the matrix framework: they are computed one at a time.
"""
from __future__ import annotations

import math
from typing import Callable, Hashable, Mapping, Sequence

import torch

from ..algorithms import ALGORITHMS, make_algorithm
from ..algorithms.base import State
from ..algorithms.fedavg import FedAvg
from ..algorithms.scaffold import ScaffoldClients, ScaffoldServer
from ..engine import Resume, simulate
from ..matrix import bias
from ..matrix.bias import server_trajectory
from ..metrics import first_below  # noqa: F401 (a study's rows are read with it)
from ..participation import make_participation, summarize
from ..problems import make_problem
from ..work import make_work, step_law
from ..sweeps.tune import StepChoice, Trial, TuneSetup, lr_grid, pick_best, run_trials, search_steps, trial_evaluator
from ..sweeps.tune import setup as tune_setup

# The exactness table's problem: small enough for hundreds of runs in seconds.
SMALL_RIDGE = "ridge:dim=10,clients=8,samples=20"
TARGET = 1e-8
GRID = lr_grid(3e-4, 3e-2, 5)  # brackets every tuned step of the exactness table on SMALL_RIDGE
OTHER_RATES = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)  # clients 1..7; client 0 gets the smallest rate


def _rates(p_min: float) -> str:
    return ";".join(f"{p:g}" for p in (p_min, *OTHER_RATES))


def tuned_steps(cells: Mapping[Hashable, tuple], grids: Sequence[float] | Mapping[Hashable, Sequence[float]], *,
                batch_runs: int | str = "auto", rows: bool = False,
                reduce: Callable[[list[dict]], dict] | None = None) -> dict[Hashable, StepChoice]:
    """The step of every cell (key -> (algorithm, setup), tune.trial_evaluator's cells) by the
    search rule of ``focusfl tune`` (the convex ranking), all searched together so that their
    trials run in batches of runs (``batch_runs``): each cell's grid (``grids``, one for all or
    one per key) is extended past an end until its best step is interior or bounded by a
    diverged step."""
    per_key = {key: grids[key] if isinstance(grids, Mapping) else grids for key in cells}
    evaluate = trial_evaluator(cells, rows=rows, batch_runs=batch_runs, reduce=reduce)
    return search_steps(evaluate, per_key, pick=pick_best)


def outcome_row(choice: StepChoice | dict) -> dict:
    """rounds to the target, or the plateau (final) / divergence when it never gets there; with
    the step search's reason (and whether it hit its cap)."""
    best = choice.trial if isinstance(choice, StepChoice) else choice
    first = best["first_round_below_target"]
    row = {
        "lr": best["lr"],
        "rounds_to_target": first,
        "final": best["final"],
        "diverged": best["diverged_at"] is not None,
    }
    if isinstance(choice, StepChoice):
        row.update(lr_reason=choice.reason, lr_capped=choice.capped)
    return row


def format_outcome(row: dict) -> str:
    if row["rounds_to_target"] is not None:
        return f"{row['rounds_to_target']} (η={row['lr']:.3g})"
    if row["diverged"] or not math.isfinite(row["final"]):
        return "diverges"
    return f"never: {row['final']:.1e} (η={row['lr']:.3g})"


# -- (a) low-probability clients ------------------------------------------------------------------
LOW_P = (0.3, 0.1, 0.03, 0.01)
LOW_P_ALGORITHMS = ("focus", "scaffold", "fedau", "fedvarp", "mifa")


def low_participation(
    p_mins: Sequence[float] = LOW_P, algorithms: Sequence[str] = LOW_P_ALGORITHMS, *,
    rounds: int = 3000, problem: str = SMALL_RIDGE, local_steps: int = 2, grid: Sequence[float] = GRID,
    eval_every: int = 10, batch_runs: int | str = "auto",
) -> list[dict]:
    """Bernoulli participation, client 0 at rate p_min and the others at 0.3..0.9; per algorithm
    and p_min, the tuned step size and the rounds to rel_error 1e-8 (or the final error)."""
    cells = {}
    for p_min in p_mins:
        setup = tune_setup(problem=problem, participation=f"bernoulli:p={_rates(p_min)}", rounds=rounds,
                          local_steps=local_steps, target=TARGET, eval_every=eval_every)
        cells.update({(p_min, algorithm): (algorithm, setup) for algorithm in algorithms})
    choices = tuned_steps(cells, grid, batch_runs=batch_runs)
    return [{"p_min": p_min, "algorithm": algorithm, **outcome_row(choices[(p_min, algorithm)])}
            for p_min, algorithm in cells]


# -- (b) long absences ----------------------------------------------------------------------------
RHOS = (0.0, 0.5, 0.9, 0.97, 0.99)
ABSENCE_ALGORITHMS = ("focus", "scaffold", "fedau", "mifa")
MARKOV_RATES = "0.2;0.3;0.4;0.5;0.6;0.7;0.8;0.9"


def mean_absence(rho: float, p: float = min(float(v) for v in MARKOV_RATES.split(";"))) -> float:
    """Mean length of an absence of a Markov client with stationary rate p and persistence rho:
    1 / P(absent -> present) = 1 / (p (1 - rho)) rounds (the rarest client's, by default)."""
    return 1.0 / (p * (1.0 - rho))


def long_absences(
    rhos: Sequence[float] = RHOS, algorithms: Sequence[str] = ABSENCE_ALGORITHMS, *,
    rounds: int = 3000, problem: str = SMALL_RIDGE, local_steps: int = 2, grid: Sequence[float] = GRID,
    eval_every: int = 10, absences: float = 0.0, batch_runs: int | str = "auto",
) -> list[dict]:
    """Markov participation with stationary rates 0.2..0.9 and persistence rho (the lag-one
    autocorrelation of presence: the rarest client's absences last :func:`mean_absence` rounds on
    average). Each rho runs ``rounds`` rounds, or long enough for ``absences`` mean absences of
    the rarest client if that is longer (a run short against the absences cannot tell slow from
    never). Adds the measured delay metrics of each rho, its rounds and its mean absence."""
    cells, measured = {}, {}
    for rho in rhos:
        horizon = max(rounds, math.ceil(absences * mean_absence(rho) / eval_every) * eval_every)
        spec = f"markov:p={MARKOV_RATES},rho={rho:g}"
        stats = summarize(make_participation(spec, 8, seed=0).mask(horizon))
        measured[rho] = {"tau_max": stats.tau_max, "tau_avg": stats.tau_avg, "rounds": horizon,
                         "mean_absence": mean_absence(rho)}
        setup = tune_setup(problem=problem, participation=spec, rounds=horizon, local_steps=local_steps,
                          target=TARGET, eval_every=eval_every)
        cells.update({(rho, algorithm): (algorithm, setup) for algorithm in algorithms})
    choices = tuned_steps(cells, grid, batch_runs=batch_runs)
    return [{"rho": rho, **measured[rho], "algorithm": algorithm, **outcome_row(choices[(rho, algorithm)])}
            for rho, algorithm in cells]


# -- ProxSkip under partial participation ---------------------------------------------------------
PROCESSES = {
    "full": "full",
    "uniform (2 of 8)": "uniform:m=2",
    "weighted (2 of 8)": "weighted:m=2",
    "bernoulli (0.2..0.9)": f"bernoulli:p={MARKOV_RATES}",
    "markov (0.2..0.9, rho 0.5)": f"markov:p={MARKOV_RATES},rho=0.5",
    "cyclic (4 groups)": "cyclic:groups=4",
}
PROXSKIP_VARIANTS = ("proxskip", "proxskip:partial=plain", "proxskip:partial=deferred")


def proxskip_adaptations(
    variants: Sequence[str] = PROXSKIP_VARIANTS, processes: dict[str, str] = PROCESSES, *,
    rounds: int = 1000, problem: str = SMALL_RIDGE, local_steps: int = 2, grid: Sequence[float] = GRID,
    eval_every: int = 10, batch_runs: int | str = "auto",
) -> list[dict]:
    cells = {}
    for label, spec in processes.items():
        setup = tune_setup(problem=problem, participation=spec, rounds=rounds, local_steps=local_steps,
                          target=TARGET, eval_every=eval_every)
        cells.update({(label, variant): (variant, setup) for variant in variants})
    choices = tuned_steps(cells, grid, batch_runs=batch_runs)
    return [{"process": label, "algorithm": variant, **outcome_row(choices[(label, variant)])}
            for label, variant in cells]


# -- push-sum (seed 003) ----------------------------------------------------------------------------
PUSHSUM_PROBLEM = "ridge:dim=10,samples=50,hetero=1"
PUSHSUM_PROCESSES = {"uniform (4 of 16)": "uniform:m=4", "bernoulli (FOCUS preset)": "bernoulli"}


def pushsum_against_focus(
    processes: dict[str, str] = PUSHSUM_PROCESSES, *, rounds: int = 3000, problem: str = PUSHSUM_PROBLEM,
    grid: Sequence[float] = lr_grid(1e-5, 1e-3, 5), eval_every: int = 20, batch_runs: int | str = "auto",
) -> list[dict]:
    """tau = 1 (the framework page's setting): FOCUS, push-sum and push-sum with tracking."""
    cells = {}
    for label, spec in processes.items():
        setup = tune_setup(problem=problem, participation=spec, rounds=rounds, local_steps=1, target=TARGET,
                          eval_every=eval_every)
        cells.update({(label, algorithm): (algorithm, setup) for algorithm in ("focus", "pushsum_tracking", "pushsum")})
    choices = tuned_steps(cells, grid, batch_runs=batch_runs)
    return [{"process": label, "algorithm": algorithm, **outcome_row(choices[(label, algorithm)])}
            for label, algorithm in cells]


# -- SCAFFOLD ---------------------------------------------------------------------------------------
def scaffold_fixed_point(
    problem_spec: str = SMALL_RIDGE, participation: str = "bernoulli:p=0.1;0.2;0.3;0.4;0.5;0.6;0.7;0.9",
    *, lr: float = 0.01, local_steps: int = 2, rounds: int = 200, offset: float = 0.0,
) -> float:
    """max_r ||x_r - x*|| / ||x*|| of SCAFFOLD started at x* with c_i = grad f_i(x*) and
    c = mean_i c_i + ``offset`` (a constant vector of that size) under partial participation.

    With offset 0 this is a fixed point for every active set: the corrected local gradient
    grad f_i(x*) - c_i + c = 0, so z = x*, and c_i^new = c_i. With an offset every local step moves
    by -eta * offset, and c - mean c_i never changes (the server adds (1/N) sum Delta c_i), so the
    bias stays."""
    problem = make_problem(problem_spec)
    algorithm = make_algorithm("scaffold", lr=lr, local_steps=local_steps)
    x_star = problem.x_star
    n = problem.num_clients
    grads = problem.client_gradients(x_star.expand(n, -1), torch.arange(n), seed=0, round=0, step=0)
    c = grads.mean(0) + offset
    state = State(ScaffoldServer(x=x_star.clone(), c=c), ScaffoldClients(c=grads.clone()))
    gaps = [0.0]
    simulate(algorithm, problem, make_participation(participation, n, seed=0), rounds, resume=Resume(state, 0),
             eval_every=None, keep_rows=False,
             on_round=lambda result: gaps.append(float((result.state.server.x - x_star).norm() / x_star.norm())))
    return max(gaps)


ARBITRARY = "weighted:m=4"
PAPER_RIDGE = "ridge:clients=16,samples=100,dim=100,reg=0.01"


def scaffold_against_focus(
    *, problem: str = PAPER_RIDGE, participation: str = ARBITRARY, local_steps: int = 5, rounds: int = 500,
    grid: Sequence[float] = lr_grid(5e-5, 5e-3, 7), eval_every: int = 5, seeds: int = 3,
    batch_runs: int | str = "auto",
) -> list[dict]:
    """Tuned FOCUS and SCAFFOLD on the paper's ridge under arbitrary participation: rounds and
    vectors communicated (down + up) to 1e-8. The step is tuned on seed 0, then run on seeds
    0..``seeds``-1 (the participation's draws): per-seed rounds and vectors ("never": math.inf)."""
    algorithms = ("focus", "scaffold")
    setup = tune_setup(problem=problem, participation=participation, rounds=rounds, local_steps=local_steps,
                      target=TARGET, eval_every=eval_every)
    choices = tuned_steps({algorithm: (algorithm, setup) for algorithm in algorithms}, grid, batch_runs=batch_runs)
    per_seed = over_seeds({algorithm: (algorithm, choices[algorithm].lr, setup) for algorithm in algorithms}, seeds,
                          batch_runs=batch_runs)
    rows = []
    for algorithm in algorithms:
        best = outcome_row(choices[algorithm])
        reached = [math.inf if t["first_round_below_target"] is None else t["first_round_below_target"]
                   for t in per_seed[algorithm]]
        comm = make_algorithm(algorithm).communication()
        vectors = comm.down + comm.up
        rows.append({"algorithm": algorithm, **best, "vectors_per_participant": vectors,
                     "rounds_per_seed": reached,
                     # weighted:m=4: exactly 4 participants per round
                     "vectors_per_seed": [r * 4 * vectors for r in reached],
                     "vectors_to_target": None if best["rounds_to_target"] is None
                     else best["rounds_to_target"] * 4 * vectors})
    return rows


def over_seeds(chosen: Mapping[Hashable, Trial], seeds: int, *, batch_runs: int | str = "auto"
               ) -> dict[Hashable, list[dict]]:
    """Each chosen trial (key -> (algorithm, lr, setup)) run on the setup's seeds 0..``seeds``-1
    (its participation's and work's draws), all in batches of runs: the trials' rows per key."""
    wanted = [(key, Trial(algorithm, lr, TuneSetup(setup.run.replace(seed=seed), setup.target)))
              for key, (algorithm, lr, setup) in chosen.items() for seed in range(seeds)]
    rows: dict[Hashable, list[dict]] = {key: [] for key in chosen}
    for (key, _), row in zip(wanted, run_trials([trial for _, trial in wanted], batch_runs=batch_runs)):
        rows[key].append(row)
    return rows


# -- FedSUM reductions ------------------------------------------------------------------------------
def reductions(problem_spec: str = "ridge:dim=8,clients=6,samples=20,hetero=1", rounds: int = 60) -> dict[str, float]:
    """Max over rounds of ||x_a - x_b|| / ||x*|| for each equivalence of ALGORITHMS.md 3.4."""
    problem = make_problem(problem_spec)
    n = problem.num_clients
    full = make_participation("full", n).mask(rounds)
    partial = make_participation("bernoulli:p=0.2;0.3;0.5;0.6;0.8;0.9", n, seed=0).mask(rounds)
    scale = float(problem.x_star.norm())

    def gap(a, b, mask) -> float:
        ta = server_trajectory(make_algorithm(a[0], **a[1]), problem, mask)
        tb = server_trajectory(make_algorithm(b[0], **b[1]), problem, mask)
        return float((ta - tb).norm(dim=1).max()) / scale

    eta = 1e-3
    return {
        "full: FedSUM = SCAFFOLD (option II)": gap(("fedsum", dict(lr=eta, local_steps=3)),
                                                  ("scaffold", dict(lr=eta, local_steps=3)), full),
        "full: FedSUM-CR = FedSUM": gap(("fedsum_cr", dict(lr=eta, local_steps=3)),
                                       ("fedsum", dict(lr=eta, local_steps=3)), full),
        "bernoulli: FedSUM-B (K=1, γ=N) = FOCUS (τ=1)": gap(
            ("fedsum_b", dict(lr=eta, local_steps=1, server_lr=float(n))), ("focus", dict(lr=eta, local_steps=1)), partial),
        "bernoulli: FedSUM (K=1) = FedSUM-B (K=1)": gap(("fedsum", dict(lr=eta, local_steps=1)),
                                                        ("fedsum_b", dict(lr=eta, local_steps=1)), partial),
        "full: ProxSkip (p = 1/τ) = SCAFFOLD": gap(("proxskip", dict(lr=eta, local_steps=3)),
                                                   ("scaffold", dict(lr=eta, local_steps=3)), full),
        "full: MIFA = FedVARP = FedAvg": max(
            gap(("mifa", dict(lr=eta, local_steps=3)), ("fedavg", dict(lr=eta, local_steps=3)), full),
            gap(("fedvarp", dict(lr=eta, local_steps=3)), ("fedavg", dict(lr=eta, local_steps=3)), full)),
    }


# -- arbitrary work ---------------------------------------------------------------------------------
WORK_PROBLEMS = {"ridge": SMALL_RIDGE, "logistic": "logistic:dim=5,clients=8,samples=20,reg=0.1"}
# Logistic regression is flatter than ridge (L of order 1 against 100): its own grid.
WORK_GRIDS = {"ridge": GRID, "logistic": lr_grid(1e-2, 3.0, 5)}
WORK_PROCESSES = {
    "fixed": "fixed",
    "uniform": "uniform",
    "rates (slow clients)": "rates:r=0.25;0.25;0.5;0.5;1;1;1;1",
    "markov (slow spells)": "markov:p=0.3,rho=0.8,slow=0.25",
}
WORK_PARTICIPATION = {"full": "full", "arbitrary": "bernoulli:p=0.2;0.3;0.4;0.5;0.6;0.7;0.8;0.9"}
WORK_LOCAL_STEPS = 4


# The study's algorithms: one of each way of treating a short client (docs/algorithms.md has
# every algorithm's): gradient tracking (FOCUS), control variates divided by the client's own
# count (SCAFFOLD, FedSUM), plain averaging (FedAvg), stored updates (MIFA) and normalized
# averaging (FedNova). All 16 would cost four times as long for the same verdicts (every
# algorithm's short-client behaviour is tested in tests/test_work.py).
WORK_ALGORITHMS = ("focus", "scaffold", "fedsum", "fedavg", "mifa", "fednova")


def partial_work_algorithms() -> tuple[str, ...]:
    """The study's algorithms that this build registers and that honour per-client step counts."""
    return tuple(name for name in WORK_ALGORITHMS if name in ALGORITHMS and ALGORITHMS[name].partial_work)


def with_curve(row: dict) -> dict:
    """A trial's row computed with its rows (``rows=True``), the rows replaced by the run's
    (round, rel_error) curve under ``curve``."""
    kept = dict(row)
    return {**kept, "curve": [(r["round"], float(r["rel_error"])) for r in kept.pop("rows")]}


def work_verdict(row: dict) -> str:
    """"exact" (rel. error below 1e-8 at the end), "plateau at E" or "diverged"."""
    if row["diverged"] or not math.isfinite(row["final"]):
        return "diverged"
    if row["final"] < TARGET:
        return "exact"
    return f"plateau at {row['final']:.1e}"


def fedavg_prediction(problem_spec: str, participation: str, work: str, lr: float, *, rounds: int,
                      local_steps: int = WORK_LOCAL_STEPS, seed: int = 0) -> dict:
    """FedAvg's predicted limit x_w (the fixed point of its expected round, matrix/bias.py) and its
    measured limit: the server model averaged over the second half of a ``rounds``-round run
    (longer than the tuning runs: the average's noise shrinks like 1/sqrt(rounds)).
    Distances relative to ||x*|| ("predicted", "measured") and ||x_bar - x_w|| / ||x_w - x*||
    ("mismatch", with the batch-means standard error of the average on the same scale)."""
    problem = make_problem(problem_spec)
    n = problem.num_clients
    process = make_participation(participation, n, seed=seed)
    process_work = make_work(work, n, local_steps, seed=seed)
    quad = bias.client_quadratics(problem)
    predicted = bias.fedavg_work_limit(quad, bias.participation_weights(process).q, lr,
                                       step_law(process_work).probabilities)
    steps = None if process_work.fixed else process_work.table(rounds)
    trajectory = bias.server_trajectory(FedAvg(lr=lr, local_steps=local_steps), problem, process.mask(rounds),
                                        seed, steps)
    window = trajectory[rounds // 2:]
    measured = window.mean(0)
    x_star = problem.x_star
    scale, gap = float(x_star.norm()), float((predicted - x_star).norm())
    return {"predicted": gap / scale, "measured": float((measured - x_star).norm()) / scale,
            "mismatch": float((measured - predicted).norm()) / gap,
            "standard_error": bias.batch_standard_error(window) / gap}


def exactness_under_work(
    problems: dict[str, str] = WORK_PROBLEMS, works: dict[str, str] = WORK_PROCESSES,
    participations: dict[str, str] = WORK_PARTICIPATION, algorithms: Sequence[str] | None = None, *,
    rounds: int = 1000, local_steps: int = WORK_LOCAL_STEPS, grids: dict[str, Sequence[float]] = WORK_GRIDS,
    eval_every: int = 10, predict_rounds: int | None = None, batch_runs: int | str = "auto",
) -> list[dict]:
    """Every (problem, work, participation, algorithm) at its tuned step (the rule of ``focusfl
    tune`` on the problem's grid): the outcome, its verdict and the best run's curve; FedAvg's rows
    on quadratic problems add its predicted and measured limit (:func:`fedavg_prediction`, over
    ``predict_rounds`` rounds, default 5 x ``rounds``; 0: not measured)."""
    predict_rounds = 5 * rounds if predict_rounds is None else predict_rounds
    algorithms = partial_work_algorithms() if algorithms is None else tuple(algorithms)
    cells, grid_of, specs = {}, {}, {}
    for problem_label, problem in problems.items():
        for work_label, work in works.items():
            for part_label, participation in participations.items():
                setup = tune_setup(problem=problem, participation=participation, rounds=rounds,
                                  local_steps=local_steps, target=TARGET, eval_every=eval_every, work=work)
                for algorithm in algorithms:
                    key = (problem_label, work_label, part_label, algorithm)
                    cells[key], grid_of[key] = (algorithm, setup), grids[problem_label]
                    specs[key] = (problem, participation, work)
    choices = tuned_steps(cells, grid_of, batch_runs=batch_runs, rows=True,
                          reduce=lambda trials: with_curve(trials[0]))
    rows = []
    for key, (algorithm, _) in cells.items():
        problem_label, work_label, part_label, _ = key
        problem, participation, work = specs[key]
        choice = choices[key]
        row = {"problem": problem_label, "work": work_label, "participation": part_label,
               "algorithm": algorithm, **outcome_row(choice), "curve": choice.trial["curve"]}
        row["verdict"] = work_verdict(row)
        if predict_rounds and algorithm == "fedavg" and problem.startswith("ridge") and row["verdict"] != "diverged":
            row["prediction"] = fedavg_prediction(problem, participation, work, choice.lr,
                                                  rounds=predict_rounds, local_steps=local_steps)
        rows.append(row)
    return rows


def as_table(rows: Sequence[dict], row_key: str, column_key: str, cell=format_outcome) -> tuple[list, list, dict]:
    """(row labels, column labels, {(row, column): text}) of a long table."""
    row_labels = list(dict.fromkeys(r[row_key] for r in rows))
    column_labels = list(dict.fromkeys(r[column_key] for r in rows))
    return row_labels, column_labels, {(r[row_key], r[column_key]): cell(r) for r in rows}


__all__ = [name for name in dir() if not name.startswith("_") and name not in ("annotations", "math", "np", "torch")]

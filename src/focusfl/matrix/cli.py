"""Command-line handlers of ``focusfl bias`` and ``focusfl matrices`` (wired in focusfl.cli).

They read options and print or write files, so they live above the core: ``focusfl.matrix``
computes and draws, and this module saves through ``focusfl.io``."""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import __version__
from ..argtypes import positive_float, positive_int
from ..errors import ConfigError, DivergenceError
from ..io.atomic import write_json
from ..io.folders import output_folder
from . import bias
from .bias import DEFAULT_BIAS_PROBLEM, FEDAVG_STEP, FOCUS_STEP, MIN_ROUNDS, WARMUP_EFOLDS
from .pictures import figure1_panels, render_all, render_work, work_panels
from .stochastic import active_nodes
from ..participation import make_participation
from ..problems import make_problem
from ..work import make_work, step_law


# -- bias ---------------------------------------------------------------------------------------
def add_bias_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--problem", default=DEFAULT_BIAS_PROBLEM,
                   help=f"quadratic problem SPEC (default {DEFAULT_BIAS_PROBLEM})")
    p.add_argument("--participation", default="bernoulli", help="participation SPEC (default bernoulli)")
    p.add_argument("--rounds", type=positive_int, default=None,
                   help=f"rounds of FedAvg and FOCUS (default: twice --average-from, at least {MIN_ROUNDS})")
    p.add_argument("--average-from", type=int, default=None,
                   help=f"first round of FedAvg's averaged iterate (default: {WARMUP_EFOLDS} e-folds of its slowest "
                   "mode, capped at half the rounds when --rounds is given)")
    p.add_argument("--fedavg-lr", type=positive_float, default=None,
                   help=f"FedAvg step size (default {FEDAVG_STEP}/L, L = max_i lambda_max of f_i's Hessian)")
    p.add_argument("--focus-lr", type=positive_float, default=None,
                   help=f"FOCUS step size (default {FOCUS_STEP}/(N L))")
    p.add_argument("--local-steps", type=positive_int, default=1, help="local steps tau of both (default 1)")
    p.add_argument("--work", default="fixed",
                   help="work SPEC: each active client's local steps per round in 1..tau (default fixed: all tau), "
                   "e.g. uniform or 'rates:r=0.25;1;...'; adds FedAvg's predicted limit under unequal work and FedNova's "
                   "(docs/work.md)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mc-rounds", type=positive_int, default=20_000,
                   help="rounds of the Monte Carlo estimate of q where no closed form exists")


@dataclass(frozen=True)
class BiasOptions:
    """``focusfl bias``'s options (None: the default the help says)."""

    problem: str = DEFAULT_BIAS_PROBLEM
    participation: str = "bernoulli"
    rounds: int | None = None
    average_from: int | None = None
    fedavg_lr: float | None = None
    focus_lr: float | None = None
    local_steps: int = 1
    work: str = "fixed"
    seed: int = 0
    mc_rounds: int = 20_000


def run_bias(args: BiasOptions) -> int:
    if args.seed < 0:
        raise ConfigError(f"seed must be >= 0, got {args.seed}")
    problem = make_problem(args.problem)
    process = make_participation(args.participation, problem.num_clients, seed=args.seed)
    work = make_work(args.work, problem.num_clients, args.local_steps, seed=args.seed)
    work = None if work.fixed else work
    quad = bias.client_quadratics(problem)
    n = problem.num_clients
    weights = bias.participation_weights(process, args.mc_rounds)
    if weights.q.min() <= 0:
        raise ConfigError("some client never takes part (q_i = 0): the weighted target is undefined")
    lipschitz = bias.smoothness(quad)
    fedavg_lr = args.fedavg_lr or FEDAVG_STEP / lipschitz
    focus_lr = args.focus_lr or FOCUS_STEP / (n * lipschitz)
    x_star = problem.x_star
    target = bias.weighted_target(quad, weights.q)

    print(f"problem {args.problem} ({n} clients, d = {problem.dim}); participation {args.participation}, seed {args.seed}")
    print(f"p, q by {weights.method}; P(S empty) = {weights.p_empty:.4g}, sum q = {weights.q.sum():.4g}")
    law = None if work is None else step_law(work, args.mc_rounds)
    mean_steps = np.full(n, float(args.local_steps)) if law is None else law.mean()
    extra = "" if law is None else f" {'E[tau_i]':>9}"
    print(f"{'client':>6} {'p':>9} {'q':>9} {'q - 1/N':>10}{extra}")
    for i in range(n):
        extra = "" if law is None else f" {mean_steps[i]:>9.3f}"
        print(f"{i:>6} {weights.p[i]:>9.4f} {weights.q[i]:>9.4f} {weights.q[i] - 1.0 / n:>+10.4f}{extra}")
    print("E[W_k] of FedAvg (eq. 45): every row = (P(S empty), q_1, ..., q_N)")
    print(f"delta_q^2 at x* = {bias.sampling_bias(quad, weights.q, x_star):.6g}   "
          f"sigma_G^2 at x* = {bias.heterogeneity(quad, x_star):.6g}")
    scale = float(np.linalg.norm(x_star.cpu().numpy()))
    gap = _distance(target, x_star)
    print(f"||x*|| = {scale:.6g}; weighted target argmin sum q_i f_i: ||x_q - x*|| = {gap:.6g}")

    # Under unequal work the expected round moves along sum_i q_i E[tau_i] H_i (small-step estimate).
    pace, pace_steps = (weights.q, args.local_steps) if law is None else (weights.q * mean_steps, 1)
    mode = bias.slowest_mode(quad, pace, fedavg_lr, pace_steps)
    rounds, start = averaging_window(mode.rounds_per_efold, args.rounds, args.average_from)
    limits = bias.limit_points(
        problem, process, rounds=rounds, fedavg_lr=fedavg_lr, focus_lr=focus_lr,
        local_steps=args.local_steps, seed=args.seed, average_from=start, work=work,
        fednova_lr=None if work is None else fedavg_lr,
    )
    print(f"L = {lipschitz:.6g}; {rounds} rounds, tau = {args.local_steps}; "
          f"FedAvg lr = {fedavg_lr:.4g}, FOCUS lr = {focus_lr:.4g}")
    print(f"FedAvg's slowest mode: lambda_min(sum q_i H_i) = {mode.eigenvalue:.6g}, "
          f"one e-fold every {mode.rounds_per_efold:.0f} rounds")
    warmup = bias.warmup_in_average(quad, pace, problem.initial_point(), fedavg_lr, start, rounds, pace_steps)
    tiny = 1e-9 * max(scale, 1.0)  # a gap below this is rounding: no ratio to it
    share = f" = {100 * warmup / gap:.2g}% of ||x_q - x*||" if gap > tiny else ""
    exact = "" if args.local_steps == 1 else " (estimate: tau > 1)"
    print(f"warm-up left in the average over rounds {start}..{rounds} "
          f"(||mean E[x_r] - x_q||{exact}): {warmup:.3g}{share}")
    fedavg = _distance(limits.fedavg_average, x_star)
    ratio = f" = {fedavg / gap:.4f} x ||x_q - x*||" if gap > tiny else ""
    print(f"FedAvg (mean over rounds {start}..{rounds}): ||x - x*|| = {fedavg:.6g}{ratio}, "
          f"||x - x_q|| = {_distance(limits.fedavg_average, target):.6g}")
    print(f"FedAvg (last round):                  ||x - x*|| = {_distance(limits.fedavg_last, x_star):.6g}")
    print(f"FOCUS  (last round):                  ||x - x*|| = {_distance(limits.focus_last, x_star):.6g}, "
          f"||x - x_q|| = {_distance(limits.focus_last, target):.6g}")
    _refuse_diverged({"FedAvg": (limits.fedavg_last, fedavg_lr, "--fedavg-lr"),
                      "FOCUS": (limits.focus_last, focus_lr, "--focus-lr")})
    if work is not None:
        print_work_limits(args, quad, x_star, weights, law, limits, process, work, fedavg_lr, (start, rounds))
    return 0


def print_work_limits(args, quad, x_star, weights, law, limits, process, work, lr, window) -> None:
    """FedAvg's and FedNova's predicted limits under unequal work against the measured ones
    (docs/work.md); ``window`` = (first, last) round of the averaged iterates."""
    start, rounds = window
    predicted = bias.fedavg_work_limit(quad, weights.q, lr, law.probabilities)
    small_step = bias.step_weighted_target(quad, weights.q, law.mean())
    gap = _distance(predicted, x_star)
    print(f"work {args.work}: step counts by {law.method}; mean E[tau_i] = {law.mean().mean():.4g} of tau = {args.local_steps}")
    print(f"FedAvg predicted (fixed point of the expected round, this lr): ||x_w - x*|| = {gap:.6g}; as lr -> 0, "
          f"argmin sum q_i E[tau_i] f_i: ||x_t - x*|| = {_distance(small_step, x_star):.6g}, ||x_w - x_t|| = "
          f"{_distance(predicted, small_step):.6g}")
    print(f"FedAvg measured (mean over rounds {start}..{rounds}): ||x - x*|| = {_distance(limits.fedavg_average, x_star):.6g}, "
          f"||x - x_w|| = {_distance(limits.fedavg_average, predicted):.6g}{_relative(limits.fedavg_average, predicted, gap)}"
          f" (standard error of the mean about {limits.fedavg_error:.2g}); last round ||x - x_w|| = "
          f"{_distance(limits.fedavg_last, predicted):.3g}")
    mask = process.mask(args.mc_rounds)
    steps = work.active_table(mask)
    nova = bias.fednova_work_limit(quad, lr, mask, steps)
    nova_gap = _distance(nova, x_star)
    target = bias.weighted_target(quad, weights.q)
    print(f"FedNova predicted (expected round, monte carlo over {args.mc_rounds} rounds): ||x_n - x*|| = {nova_gap:.6g}; "
          f"as lr -> 0 with counts alike across clients, argmin sum q_i f_i: ||x_q - x*|| = {_distance(target, x_star):.6g}")
    print(f"FedNova measured (mean over rounds {start}..{rounds}): ||x - x*|| = {_distance(limits.fednova_average, x_star):.6g}, "
          f"||x - x_n|| = {_distance(limits.fednova_average, nova):.6g}{_relative(limits.fednova_average, nova, nova_gap)}"
          f" (standard error of the mean about {limits.fednova_error:.2g})")
    _refuse_diverged({"FedNova": (limits.fednova_average, lr, "--fedavg-lr")})


def _relative(measured, predicted, gap: float) -> str:
    """" = k x ||x_pred - x*||" when that distance is not rounding noise."""
    return f" = {_distance(measured, predicted) / gap:.3g} x ||x_pred - x*||" if gap > 1e-9 else ""


def _refuse_diverged(models: dict) -> None:
    """A non-finite limit point is a diverged run: exit 1 saying which and what to change."""
    for name, (model, lr, flag) in models.items():
        if not np.isfinite(np.asarray(model.cpu() if hasattr(model, "cpu") else model, dtype=float)).all():
            raise DivergenceError(f"{name} diverged (non-finite model) at step size {lr:.4g}; choose a smaller {flag}")


def averaging_window(efold: float, rounds: int | None, average_from: int | None) -> tuple[int, int]:
    """(rounds, first averaged round): by default the average starts after WARMUP_EFOLDS e-folds
    of the slowest mode and covers as many rounds again (at least MIN_ROUNDS in all)."""
    if average_from is not None and average_from < 0:
        raise ConfigError(f"--average-from must be >= 0, got {average_from}")
    auto = math.ceil(WARMUP_EFOLDS * efold) if math.isfinite(efold) else MIN_ROUNDS // 2
    if rounds is None:
        start = auto if average_from is None else average_from
        rounds = max(2 * start, MIN_ROUNDS)
    else:
        start = min(auto, rounds // 2) if average_from is None else average_from
    if start > rounds:
        raise ConfigError(f"--average-from {start} is after the last round {rounds}")
    return rounds, start


def _distance(a, b) -> float:
    return float((a - b).norm())


# -- matrices -----------------------------------------------------------------------------------
def add_matrices_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--clients", type=positive_int, default=4, help="number of clients N (default 4)")
    p.add_argument("--active", default="1,3", help="active clients S as node labels 1..N, comma separated (default 1,3)")
    p.add_argument("--steps", default=None,
                   help="local step counts of the active clients, comma separated (e.g. 3,1; tau = the largest): also "
                   "draws one FedAvg round whose clients stop early (figure4_short_clients, docs/work.md)")
    p.add_argument("--out", default="runs/matrices", help="output folder (default runs/matrices)")


def parse_active(text: str) -> list[int]:
    """``"1,3"`` -> [1, 3]; an empty string is the empty set."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    try:
        return [int(item) for item in items]
    except ValueError:
        raise ConfigError(f"--active must be comma-separated client numbers like 1,3, got {text!r}") from None


def parse_steps(text: str) -> list[int]:
    """``"3,1"`` -> [3, 1]."""
    try:
        return [int(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise ConfigError(f"--steps must be comma-separated step counts like 3,1, got {text!r}") from None


@dataclass(frozen=True)
class MatricesOptions:
    """``focusfl matrices``' options."""

    clients: int = 4
    active: str = "1,3"  # node labels 1..N, comma separated
    steps: str | None = None  # the active clients' local step counts, comma separated
    out: str = "runs/matrices"


def run_matrices(args: MatricesOptions) -> int:
    nodes = active_nodes(parse_active(args.active), args.clients)
    steps = None if args.steps is None else parse_steps(args.steps)
    if steps is not None:
        work_panels(nodes, args.clients, steps)  # checks the counts before anything is written
    with output_folder(args.out) as folder:
        written = render_all(folder, nodes, args.clients)
        matrices = {p.name: p.matrix.tolist() for p in figure1_panels(nodes, args.clients)}
        if steps is not None:
            written += render_work(folder, nodes, args.clients, steps)
            matrices["D_k per stretch"] = [p.matrix.tolist() for p in work_panels(nodes, args.clients, steps)[1:-1]]
        write_json(folder / "matrices.json", matrices)
        write_json(folder / "config.json", {
            "focusfl_version": __version__, "command": "matrices", "clients": args.clients, "active": nodes,
            **({} if steps is None else {"steps": steps}),
        })
    for path in written:
        print(f"wrote {Path(args.out) / path.name}")
    print(f"wrote {Path(args.out) / 'matrices.json'}, config.json")
    return 0

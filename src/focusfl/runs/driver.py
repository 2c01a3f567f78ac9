"""One experiment run: a configuration built into objects, and executed."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..algorithms import algorithm_state_vectors, make_algorithm
from ..engine import Resume, RunResult, simulate
from ..errors import ConfigError
from ..metrics import progress_metrics
from ..participation import make_participation
from ..problems import make_problem
from ..spec import parse_spec
from ..threads import fixed_threads
from ..work import make_work
from .config import DTYPES, RunConfig, check_config, record

@dataclass
class BuiltRun:
    config: RunConfig
    algorithm: Any
    problem: Any
    participation: Any
    work: Any = None  # a focusfl.work process; None: fixed (every client does local_steps)


def resolve_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device 'cuda' asked for, but torch sees no CUDA device")
    try:
        return torch.device(name)
    except RuntimeError:
        raise ConfigError(f"unknown device {name!r} (use cpu or cuda)") from None


def build(config: RunConfig, *, allow_model_import: bool = False) -> BuiltRun:
    """Validate and construct everything before anything runs or is written.

    ``allow_model_import``: see make_problem; the caller's permission, never part of the config.
    """
    check_config(config)
    device = resolve_device(config.device)
    problem = make_problem(
        config.problem, dtype=DTYPES[config.dtype], device=str(device), allow_model_import=allow_model_import,
        state_vectors=algorithm_state_vectors(config.algorithm, config.local_steps),
    )
    algorithm = make_run_algorithm(config, problem)
    # The problem is passed along for processes that depend on the clients' data (label).
    participation = make_participation(
        config.participation, problem.num_clients, seed=config.seed, problem=problem
    )
    work = make_work(config.work, problem.num_clients, algorithm.local_steps, seed=config.seed)
    return BuiltRun(config, algorithm, problem, participation, work)


def make_run_algorithm(config: RunConfig, problem) -> Any:
    """The algorithm with its step size: ``lr="auto"`` derives it from the problem's smoothness
    constant (:meth:`Algorithm.auto_lr`) unless the algorithm SPEC gives ``lr`` itself."""
    algorithm = _with_step(config, problem)
    _check_fits(algorithm, problem.dtype)
    return algorithm


def _check_fits(algorithm, dtype: torch.dtype) -> None:
    """A step beyond the float type's range cannot even be applied (torch refuses the scalar with a
    RuntimeError mid-run); a huge step that fits is allowed: the run diverges and says so."""
    largest = torch.finfo(dtype).max
    for field_ in dataclasses.fields(algorithm):
        value = getattr(algorithm, field_.name)
        if isinstance(value, float) and abs(value) > largest:
            name = str(dtype).removeprefix("torch.")
            raise ConfigError(f"{algorithm.name}: {field_.name}={value:g} is beyond {name}'s range "
                              f"(largest {largest:.3g}); give a smaller value")


def _with_step(config: RunConfig, problem) -> Any:
    if config.lr != "auto":
        return make_algorithm(config.algorithm, lr=config.lr, local_steps=config.local_steps)
    algorithm = make_algorithm(config.algorithm, local_steps=config.local_steps)
    if "lr" in parse_spec(config.algorithm)[1]:
        return algorithm
    smoothness = problem.smoothness()
    if smoothness is None or not math.isfinite(smoothness) or smoothness <= 0:
        raise ConfigError(
            f"--lr auto needs a problem whose smoothness constant is known (ridge, logistic); "
            f"give a step size for {problem.name!r} with --lr (e.g. find one with `focusfl tune`)"
        )
    return dataclasses.replace(algorithm, lr=algorithm.auto_lr(smoothness, problem.num_clients))


def resolved_config(built: BuiltRun) -> dict[str, Any]:
    """config.json: resolved defaults of every part, the seed and the version."""
    return record(built.config, algorithm=built.algorithm.describe(), problem=built.problem.describe(),
                  participation=built.participation.describe(),
                  work=None if built.work is None else built.work.describe())


def execute(
    built: BuiltRun, *, progress: bool = False, on_row: Callable[[dict], None] | None = None,
    resume: Resume | None = None, keep_rows: bool = True, on_round: Callable[[RunResult], None] | None = None,
) -> RunResult:
    """Run ``built``, continuing from ``resume`` when given, to ``config.rounds`` rounds in all;
    ``keep_rows`` and ``on_round`` are simulate's (streaming rows, checkpoints)."""
    cfg = built.config
    start_round = 0 if resume is None else resume.start_round
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=cfg.rounds, initial=start_round, desc=built.algorithm.name,
                   unit="round", disable=None, leave=False)

    def show(row: dict) -> None:
        if on_row is not None:
            on_row(row)
        if bar is not None:
            bar.set_postfix(progress_metrics(row), refresh=False)

    try:
        with fixed_threads(cfg.threads):
            return simulate(
                built.algorithm,
                built.problem,
                built.participation,
                cfg.rounds - start_round,
                seed=cfg.seed,
                engine=cfg.engine,
                eval_every=cfg.eval_every,
                resume=resume,
                on_row=show,
                progress=bar,
                schedule=cfg.schedule,
                keep_rows=keep_rows,
                on_round=on_round,
                work=built.work,
            )
    finally:
        if bar is not None:
            bar.close()

"""One experiment run: a resolved configuration, built objects, and its output folder."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .. import __version__
from ..algorithms import make_algorithm
from ..engine import RunResult, simulate
from ..engine.simulate import ENGINES, SCHEDULES
from ..errors import ConfigError
from ..participation import make_participation
from ..problems import make_problem
from ..spec import parse_spec
from ..threads import DEFAULT_THREADS, fixed_threads

DTYPES = {"float32": torch.float32, "float64": torch.float64}


@dataclass
class RunConfig:
    """Everything a run needs; ``resolved()`` is what config.json stores for a rerun."""

    algorithm: str | dict
    problem: str | dict = "ridge"
    participation: str | dict = "full"
    rounds: int = 100
    local_steps: int | None = None
    lr: float | str | None = None  # a number, "auto" (from the problem's smoothness), None (algorithm default)
    seed: int = 0
    dtype: str = "float64"
    device: str = "cpu"
    engine: str = "vectorized"
    eval_every: int = 1
    schedule: str = "constant"
    # torch intra-op threads while the run computes: part of the record because the thread count
    # changes float results at the rounding level (reductions split differently); a fixed
    # default, never the machine's core count, so the same command gives the same bytes anywhere.
    threads: int = DEFAULT_THREADS
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class BuiltRun:
    config: RunConfig
    algorithm: Any
    problem: Any
    participation: Any


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
        config.problem, dtype=DTYPES[config.dtype], device=str(device), allow_model_import=allow_model_import
    )
    algorithm = make_run_algorithm(config, problem)
    # The problem is passed along for processes that depend on the clients' data (label).
    participation = make_participation(
        config.participation, problem.num_clients, seed=config.seed, problem=problem
    )
    return BuiltRun(config, algorithm, problem, participation)


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


# Keys of config.json: what a run needs, and what focusfl records beside it.
_REQUIRED = ("algorithm", "problem", "participation", "rounds", "seed", "dtype", "device", "engine", "eval_every")
# "tensorboard" is an output option (where `run --tensorboard` logs), never part of a run's identity.
_RECORDED = ("focusfl_version", "schedule", "threads", "status", "diverged_at_round", "interrupted_after_round",
             "rounds_done", "lr_auto", "tensorboard")


def check_config(config: RunConfig) -> None:
    """Type and range of every field, with a one-line ConfigError naming the field."""
    def spec_like(key: str) -> None:
        value = getattr(config, key)
        if not isinstance(value, (str, dict)) or not value:
            raise ConfigError(f"{key} must be a SPEC string or an object with a 'name', got {value!r}")

    def integer(key: str, lo: int) -> None:
        value = getattr(config, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < lo:
            raise ConfigError(f"{key} must be an integer >= {lo}, got {value!r}")

    for key in ("algorithm", "problem", "participation"):
        spec_like(key)
    integer("rounds", 1)
    integer("seed", 0)
    integer("eval_every", 1)
    integer("threads", 1)
    if config.local_steps is not None:
        integer("local_steps", 1)
    lr = config.lr
    if lr is not None and lr != "auto" and (
        isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 < lr < math.inf
    ):
        raise ConfigError(f"lr must be a positive number or 'auto', got {lr!r}")
    if config.dtype not in DTYPES:
        raise ConfigError(f"dtype must be float32 or float64, got {config.dtype!r}")
    if not isinstance(config.device, str):
        raise ConfigError(f"device must be a string such as 'cpu' or 'cuda', got {config.device!r}")
    if config.engine not in ENGINES:
        raise ConfigError(f"engine must be one of {', '.join(ENGINES)}, got {config.engine!r}")
    if config.schedule not in SCHEDULES:
        raise ConfigError(f"schedule must be one of {', '.join(SCHEDULES)}, got {config.schedule!r}")


def resolved_config(built: BuiltRun) -> dict[str, Any]:
    """config.json: resolved defaults of every part, the seed and the version."""
    cfg = built.config
    return {
        "focusfl_version": __version__,
        "algorithm": built.algorithm.describe(),
        "problem": built.problem.describe(),
        "participation": built.participation.describe(),
        "rounds": cfg.rounds,
        "seed": cfg.seed,
        "dtype": cfg.dtype,
        "device": cfg.device,
        "engine": cfg.engine,
        "eval_every": cfg.eval_every,
        "schedule": cfg.schedule,
        "threads": cfg.threads,
    }


def config_from_json(data: Any, where: str = "config file") -> RunConfig:
    """A RunConfig from config.json's content, every key known and type-checked."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a JSON object, got {type(data).__name__}")
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise ConfigError(f"{where} lacks {missing[0]!r}")
    unknown = sorted(set(data) - set(_REQUIRED) - set(_RECORDED))
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}")
    optional = {k: data[k] for k in ("schedule", "threads") if k in data}
    config = RunConfig(**{k: data[k] for k in _REQUIRED}, **optional)
    try:
        check_config(config)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return config


def execute(
    built: BuiltRun, *, progress: bool = False, on_row: Callable[[dict], None] | None = None, **resume: Any
) -> RunResult:
    """Run ``built``; ``resume`` passes simulate's resume and streaming keywords through
    (state, start_round, comm_before, evaluate_start, eval_origin, keep_rows, on_round)."""
    cfg = built.config
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=cfg.rounds, initial=resume.get("start_round", 0), desc=built.algorithm.name,
                   unit="round", disable=None, leave=False)

    def show(row: dict) -> None:
        if on_row is not None:
            on_row(row)
        if bar is None:
            return
        if "test_accuracy" in row:  # neural networks: accuracy and losses
            shown = ("test_accuracy", "test_loss", "train_loss")
            bar.set_postfix({k: f"{row[k]:.4g}" for k in shown if k in row}, refresh=False)
        else:
            key = "rel_error" if "rel_error" in row else "loss"
            bar.set_postfix({key: f"{row[key]:.3e}"}, refresh=False)

    try:
        with fixed_threads(cfg.threads):
            return simulate(
                built.algorithm,
                built.problem,
                built.participation,
                cfg.rounds - resume.get("start_round", 0),
                seed=cfg.seed,
                engine=cfg.engine,
                eval_every=cfg.eval_every,
                on_row=show,
                progress=bar,
                schedule=cfg.schedule,
                **resume,
            )
    finally:
        if bar is not None:
            bar.close()



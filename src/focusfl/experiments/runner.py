"""One experiment run: a resolved configuration, built objects, and its output folder."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from .. import __version__
from ..algorithms import make_algorithm
from ..engine import RunResult, simulate
from ..errors import ConfigError
from ..participation import make_participation
from ..problems import make_problem
from .outputs import output_folder, write_csv, write_json
from .plots import plot_curve

DTYPES = {"float32": torch.float32, "float64": torch.float64}


@dataclass
class RunConfig:
    """Everything a run needs; ``resolved()`` is what config.json stores for a rerun."""

    algorithm: str | dict
    problem: str | dict = "ridge"
    participation: str | dict = "full"
    rounds: int = 100
    local_steps: int | None = None
    lr: float | None = None
    seed: int = 0
    dtype: str = "float64"
    device: str = "cpu"
    engine: str = "vectorized"
    eval_every: int = 1
    schedule: str = "constant"
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
    if config.dtype not in DTYPES:
        raise ConfigError(f"dtype must be float32 or float64, got {config.dtype!r}")
    if config.rounds < 1:
        raise ConfigError(f"rounds must be >= 1, got {config.rounds}")
    if config.eval_every < 1:
        raise ConfigError(f"eval_every must be >= 1, got {config.eval_every}")
    device = resolve_device(config.device)
    problem = make_problem(
        config.problem, dtype=DTYPES[config.dtype], device=str(device), allow_model_import=allow_model_import
    )
    algorithm = make_algorithm(config.algorithm, lr=config.lr, local_steps=config.local_steps)
    # The problem is passed along for processes that depend on the clients' data (label).
    participation = make_participation(
        config.participation, problem.num_clients, seed=config.seed, problem=problem
    )
    return BuiltRun(config, algorithm, problem, participation)


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
    }


def config_from_json(data: dict[str, Any]) -> RunConfig:
    keys = ("algorithm", "problem", "participation", "rounds", "seed", "dtype", "device", "engine", "eval_every")
    missing = [k for k in keys if k not in data]
    if missing:
        raise ConfigError(f"config file lacks {missing[0]!r}")
    optional = {k: data[k] for k in ("schedule",) if k in data}
    return RunConfig(**{k: data[k] for k in keys}, **optional)


def execute(built: BuiltRun, *, progress: bool = False, on_row: Callable[[dict], None] | None = None) -> RunResult:
    cfg = built.config
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=cfg.rounds, desc=built.algorithm.name, unit="round", disable=None, leave=False)

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
        return simulate(
            built.algorithm,
            built.problem,
            built.participation,
            cfg.rounds,
            seed=cfg.seed,
            engine=cfg.engine,
            eval_every=cfg.eval_every,
            on_row=show,
            progress=bar,
            schedule=cfg.schedule,
        )
    finally:
        if bar is not None:
            bar.close()


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a run whose evaluated rounds were kept; the message says where."""


def run_to_folder(
    config: RunConfig, out: str | Path, *, progress: bool = False, allow_model_import: bool = False
) -> RunResult:
    """Build, run and write metrics.csv, config.json and curve.png into ``out``.

    An interrupted run (Ctrl-C) keeps what it computed, as a diverged run does: the folder gets
    the rows evaluated so far and config.json records ``interrupted_after_round``; then
    :class:`Interrupted` is raised. Interrupted before its first evaluation, it leaves nothing.
    """
    built = build(config, allow_model_import=allow_model_import)
    rows: list[dict] = []
    interrupted = False
    with output_folder(out) as scratch:
        try:
            result = execute(built, progress=progress, on_row=rows.append)
        except KeyboardInterrupt:
            if not rows:
                raise
            interrupted = True
            result = RunResult(rows=rows, rounds_done=rows[-1]["round"])
        _write_run(built, result, scratch, interrupted)
    if interrupted:
        raise Interrupted(f"interrupted; rounds 0..{result.rounds_done} are in {out}")
    return result


def _write_run(built: BuiltRun, result: RunResult, scratch: Path, interrupted: bool) -> None:
    write_csv(scratch / "metrics.csv", result.rows)
    info = resolved_config(built)
    if result.diverged_at is not None:
        info["diverged_at_round"] = result.diverged_at
    if interrupted:
        info["interrupted_after_round"] = result.rounds_done
    write_json(scratch / "config.json", info)
    title = f"{built.algorithm.name} on {built.problem.name}, {built.participation.name} participation"
    if "test_accuracy" in result.rows[0]:  # neural networks: accuracy and losses
        from ..data.plots import plot_training_curves

        plot_training_curves({built.algorithm.name: result.rows}, scratch / "curve.png", title=title)
    else:
        plot_curve(result.rows, scratch / "curve.png", title)
    if hasattr(built.problem, "label_histograms"):  # clients hold labelled data: show the split
        from ..data.plots import plot_label_histograms

        plot_label_histograms(built.problem.label_histograms(), scratch / "partition.png")

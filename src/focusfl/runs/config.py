"""The run configuration, declared once: every field of a run with its default, type, validation,
command-line option and help text, its config.json key and whether it is part of the run key.

``focusfl run``, ``sweep``, ``tune``, the nn presets and ``federation`` take their options from
these fields (:func:`add_run_options`), and every one of them fills the defaults that depend on
the problem from :func:`defaults_for`: a new option is written here, once.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Sequence

import torch

from ..argtypes import non_negative_int, positive_float, positive_int
from ..engine.simulate import ENGINES, SCHEDULES
from ..errors import ConfigError
from ..threads import DEFAULT_THREADS

DTYPES = {"float32": torch.float32, "float64": torch.float64}
# Neural networks evaluate every 50 rounds: one pass over a 10,000-image test set costs about as
# much as 1.4 CIFAR-10 training rounds, so evaluating every round would double a run's time.
NN_EVAL_EVERY = 50


def lr_value(text: str) -> float | str:
    """``--lr``: a positive number or ``auto``."""
    return "auto" if text == "auto" else positive_float(text)


@dataclass(frozen=True)
class Option:
    """How a field appears on a command line and in config.json.

    ``record``: "required" (config.json must have it), "optional" (recorded, may be missing in
    an older file) or None (folded into another key: lr and local_steps live in the algorithm's
    resolved SPEC). ``in_key``: part of the run's identity (the sweep's folder hash)."""

    help: str
    type: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    record: str | None = "required"
    in_key: bool = True
    # The default when the problem decides it (see defaults_for), said in the help text.
    problem_default: str | None = None
    # A field added after runs were recorded: its resolved value that is left out of the run key,
    # so that the runs recorded before it existed (which meant that value) keep their key.
    key_neutral: Any = None


def _option(default: Any = None, *, required: bool = False, **option: Any):
    metadata = {"option": Option(**option)}
    if required:
        return field(metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass
class RunConfig:
    """Everything a run needs; config.json records it resolved (:func:`record`)."""

    algorithm: str | dict = _option(
        required=True, help="algorithm NAME or NAME:key=value,... (see `focusfl algorithms`)")
    problem: str | dict = _option(
        "ridge", help="problem SPEC, e.g. ridge:dim=50,clients=16 or nn:data=mnist,alpha=0.1 "
        "(neural networks: docs/neural-networks.md)")
    participation: str | dict = _option(
        "full", help="participation SPEC, e.g. bernoulli, weighted:m=4, or one p per client as "
        "'bernoulli:p=0.2;0.9;...' (quoted: a shell ends the command at ;) (docs/participation.md)")
    work: str | dict = _option(
        "fixed", record="optional", key_neutral="fixed",
        help="work SPEC: each active client's number of local steps per round, in 1..tau: fixed (all tau), "
        "uniform (uniform on 1..tau), 'rates:r=0.25;1;...' (a fraction of tau per client; quoted: a shell ends the "
        "command at ;), markov:p=0.3,rho=0.8,slow=0.25 (devices stay slow), trace:path=PATH (recorded counts, "
        "a CSV round,client,steps such as a federation's work.csv); algorithms without per-client step "
        "counts refuse all but fixed")
    rounds: int = _option(100, type=positive_int, help="rounds to run in all")
    local_steps: int | None = _option(
        None, type=positive_int, record=None, in_key=False,
        help="local steps tau per round (default: the algorithm's, 1)")
    # A number, "auto" (from the problem's smoothness, unless the algorithm SPEC gives lr), or
    # None (the algorithm's own default: config.json's resolved algorithm carries its lr).
    lr: float | str | None = _option(
        "auto", type=lr_value, record=None, in_key=False,
        help="(local) step size eta, or 'auto': a stable step from the problem's smoothness constant L, "
        "1/(tau L) or 1/(N L) for FOCUS's summed tracking; neural networks need a number")
    seed: int = _option(0, type=non_negative_int, help="seed of data, participation and minibatches")
    dtype: str = _option(
        "float64", choices=tuple(DTYPES), help="floating-point type of models and data",
        problem_default="float32 for neural networks, float64 otherwise")
    device: str = _option("cpu", help="cpu or cuda")
    engine: str = _option("vectorized", choices=tuple(ENGINES), help="the engine that computes the rounds")
    eval_every: int = _option(
        1, type=positive_int, metavar="E", help="evaluate every E rounds",
        problem_default=f"1; neural networks {NN_EVAL_EVERY}: one pass over a 10,000-image test set costs "
        "about as much as 1.4 CIFAR-10 training rounds")
    schedule: str = _option(
        "constant", choices=tuple(SCHEDULES), record="optional",
        help="step-size schedule: constant, or sqrt = eta/sqrt(r/10+1)")
    # torch intra-op threads while the run computes: part of the record because the thread count
    # changes float results at the rounding level (reductions split differently); a fixed
    # default, never the machine's core count, so the same command gives the same bytes anywhere.
    threads: int = _option(
        DEFAULT_THREADS, type=positive_int, record="optional", in_key=False,
        help="torch intra-op threads for the run (recorded in config.json): the thread count changes float "
        "results at the rounding level, so it is part of the run, never taken from the machine; more threads "
        "can speed up large neural networks on a quiet machine")
    extra: dict[str, Any] = field(default_factory=dict)


def options() -> dict[str, Option]:
    """Every field that is an option, in declaration order."""
    return {f.name: f.metadata["option"] for f in fields(RunConfig) if "option" in f.metadata}


def field_defaults() -> dict[str, Any]:
    """The fields' own defaults (no problem-dependent ones: see defaults_for)."""
    return {f.name: f.default for f in fields(RunConfig) if "option" in f.metadata and f.name != "algorithm"}


def defaults_for(problem: str | dict) -> dict[str, Any]:
    """Every field's default for runs of ``problem``: neural networks compute in float32 (the
    problem's default dtype) and evaluate every NN_EVAL_EVERY rounds. The one place these
    problem-dependent defaults are decided: run, sweep, tune, the presets and federation use it."""
    from ..problems import default_dtype
    from ..spec import parse_spec

    name = problem.get("name") if isinstance(problem, dict) else parse_spec(problem)[0]
    return {**field_defaults(), "problem": problem, "dtype": default_dtype(problem),
            "eval_every": NN_EVAL_EVERY if name == "nn" else 1}


# Keys of config.json: what a run needs, and what focusfl records beside it.
_REQUIRED = tuple(name for name, opt in options().items() if opt.record == "required")
# "tensorboard" is an output option (where `run --tensorboard` logs), never part of a run's identity;
# "inputs" and "inputs_changed" are the digests of what the run read (runs/inputs.py).
_RECORDED = ("focusfl_version", *(name for name, opt in options().items() if opt.record == "optional"), "status",
             "diverged_at_round", "interrupted_after_round", "rounds_done", "lr_auto", "tensorboard",
             "inputs", "inputs_changed")
_KEYED = tuple(name for name, opt in options().items() if opt.in_key)
_KEY_NEUTRAL = {name: opt.key_neutral for name, opt in options().items() if opt.key_neutral is not None}


def record(config: RunConfig, *, algorithm: dict, problem: dict, participation: dict,
           work: dict | None = None) -> dict[str, Any]:
    """config.json's run keys: the fields it records, the parts given resolved (describe())."""
    from .. import __version__

    parts = {"algorithm": algorithm, "problem": problem, "participation": participation}
    if work is not None:
        parts["work"] = work
    recorded = {name: parts.get(name, getattr(config, name))
                for name, opt in options().items() if opt.record is not None}
    return {"focusfl_version": __version__, **recorded}


def _key_neutral(name: str, value: Any) -> bool:
    """Whether ``value`` of field ``name`` is its key-neutral SPEC ("fixed" and {"name": "fixed"} alike)."""
    from ..spec import parse_spec

    if name not in _KEY_NEUTRAL:
        return False
    try:
        return parse_spec(value) == parse_spec(_KEY_NEUTRAL[name])
    except ConfigError:
        return False


def run_key(resolved: dict) -> str:
    """A run's identity: the SHA-256 of its resolved configuration's keyed fields (version,
    status, threads and outputs left out: a new focusfl version does not rerun a finished sweep)."""
    kept = {k: resolved[k] for k in _KEYED if k in resolved and not _key_neutral(k, resolved[k])}
    canonical = json.dumps(kept, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


# -- command-line options ------------------------------------------------------------------------
def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_run_options(parser: argparse.ArgumentParser, names: Sequence[str], *, defaults: dict | None = None,
                    helps: dict | None = None, deferred: bool = False) -> None:
    """One option per field in ``names``, its type, choices and help from the field.

    ``defaults``: a command's own defaults (tune's trials run 300 rounds, a preset its own
    rounds and eval_every) over the fields' and the problem's;
    ``helps``: a command's own wording of a field's help. A field whose default depends on the
    problem (dtype, eval_every) gets None, filled from :func:`defaults_for`. ``deferred``: every
    default None, so that a flag given beside --config or --resume can be told apart from one left
    at its default (the help still says the default)."""
    table = options()
    own = field_defaults() | (defaults or {})
    for name in names:
        opt = table[name]
        by_problem = opt.problem_default and name not in (defaults or {})
        default = None if by_problem or deferred else own.get(name)
        text = (helps or {}).get(name, opt.help)
        if by_problem:
            text += f" (default {opt.problem_default})"
        elif deferred and own.get(name) is not None:
            text += f" (default {own[name]})"
        kwargs: dict[str, Any] = {"default": default, "help": text}
        if opt.type is not None:
            kwargs["type"] = opt.type
        if opt.choices is not None:
            kwargs["choices"] = list(opt.choices)
        if opt.metavar is not None:
            kwargs["metavar"] = opt.metavar
        action = parser.add_argument(flag(name), **kwargs)
        action.run_field = name  # read by tests/test_config_options.py: one option per field


def given_options(values: Any, names: Sequence[str]) -> dict[str, Any]:
    """The fields among ``names`` that a command line set (deferred options: not None)."""
    return {name: getattr(values, name) for name in names if getattr(values, name, None) is not None}


# -- validation and config.json ------------------------------------------------------------------
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

    for key in ("algorithm", "problem", "participation", "work"):
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


def config_from_json(data: Any, where: str = "config file") -> RunConfig:
    """A RunConfig from config.json's content, every key known and type-checked. Its lr and
    local_steps are None: the resolved algorithm carries them."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a JSON object, got {type(data).__name__}")
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise ConfigError(f"{where} lacks {missing[0]!r}")
    unknown = sorted(set(data) - set(_REQUIRED) - set(_RECORDED))
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}")
    optional = {name: data[name] for name, opt in options().items() if opt.record == "optional" and name in data}
    config = RunConfig(**{k: data[k] for k in _REQUIRED}, **optional, lr=None)
    try:
        check_config(config)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return config

"""The run record, declared once: every field of a run with its default and validation, its
config.json key and whether it is part of the run's identity (the run key).

A :class:`RunConfig` is frozen, pure data: ``replace`` makes a changed copy, ``to_dict`` /
``from_dict`` are its JSON round trip, and :func:`run_key` hashes a run's resolved record. The
commands that run something take "a RunConfig plus their own knobs" (tune's target, a
federation's timeout, a preset's seeds), never a second copy of its fields. How the fields
appear on a command line (option names, help texts, the problem-dependent defaults the help
says) is the command line's business: runs/cli.py.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from .. import __version__
from ..engine.simulate import ENGINES, SCHEDULES
from ..errors import ConfigError
from ..limits import parse_size
from ..privacy.config import NONE, parse_dp
from ..problems import default_dtype
from ..spec import parse_spec
from ..threads import DEFAULT_THREADS, MAX_CLIENT_WORKERS

DTYPES = {"float32": torch.float32, "float64": torch.float64}
NUMERICS = ("native", "portable")  # the numerical environments a run can ask for (device.numerics)
DEFAULT_STATE_MEMORY = "2GiB"
# Neural networks evaluate every 50 rounds: one pass over a 10,000-image test set costs about as
# much as 1.4 CIFAR-10 training rounds, so evaluating every round would double a run's time.
NN_EVAL_EVERY = 50


def _field(default: Any, *, record: str | None = "required", key: bool = True, key_neutral: Any = None,
           identity: bool = True):
    """A field of the record. ``record``: "required" (config.json must have it), "optional"
    (recorded, may be missing in an older file) or None (folded into another key: lr and
    local_steps live in the algorithm's resolved SPEC). ``key``: part of the run's identity.
    ``key_neutral``: a value left out of the run key (a field added after runs were recorded,
    so that the runs recorded before it, which meant that value, keep their key).
    ``identity`` False: a field that never changes a result (where the state table lives),
    left out of the configuration key too."""
    return field(default=default, metadata={"record": record, "key": key, "key_neutral": key_neutral,
                                            "identity": identity})


@dataclass(frozen=True)
class RunConfig:
    """Everything a run needs; config.json records it resolved (:func:`record`).

    ``dtype`` and ``eval_every`` None: the problem's (:func:`defaults_for`: float32 and every
    50 rounds for neural networks), filled in by :meth:`with_problem_defaults` when the run is
    built. ``lr``: a number, "auto" (a stable step from the problem's smoothness, unless the
    algorithm SPEC gives lr) or None (the algorithm's own: a resolved algorithm carries its lr).
    ``threads``: torch intra-op threads while the run computes; the thread count changes float
    results at the rounding level (reductions split differently), so it is part of the run and
    of its key (1, the default, is left out of the key: runs recorded before threads existed
    computed with one)."""

    algorithm: str | dict = _field("focus")
    problem: str | dict = _field("ridge")
    participation: str | dict = _field("full")
    work: str | dict = _field("fixed", record="optional", key_neutral="fixed")
    rounds: int = _field(100)
    local_steps: int | None = _field(None, record=None, key=False)
    lr: float | str | None = _field("auto", record=None, key=False)
    seed: int = _field(0)
    dtype: str | None = _field("float64")
    device: str = _field("cpu")
    engine: str = _field("vectorized")
    eval_every: int | None = _field(1)
    schedule: str = _field("constant", record="optional")
    threads: int = _field(DEFAULT_THREADS, record="optional", key_neutral=DEFAULT_THREADS)
    # Where the clients' state table lives (runs/store.py): in memory up to this size, beyond it
    # memory-mapped in the run folder. Results are the same bytes either way: not in the run key.
    state_memory: int | str = _field(DEFAULT_STATE_MEMORY, record="optional", key=False, identity=False)
    # Worker threads computing the vectorized engine's chunks of clients side by side on a CPU
    # (focusfl/threads.py): each chunk is computed as it is alone, so the bytes are the same with
    # any number; recorded for the record's sake, never part of a key.
    client_workers: int = _field(1, record="optional", key=False, identity=False)
    # Deterministic kernels (device.py), on every device; false opts out for speed on a GPU
    # (its runs can differ in bits from one process to the next). True, the default, is left out
    # of the key: runs recorded before the field computed on a CPU, where the kernels were those.
    deterministic: bool = _field(True, record="optional", key_neutral=True)
    # Client-level differential privacy (focusfl.privacy): "none", or clip=C,noise=SIGMA,mode=...
    # as a string or config.json's table; "none" is left out of the key (runs before DP existed).
    dp: str | dict = _field(NONE, record="optional", key_neutral=NONE)
    # The numerical environment the run computes in (device.py, docs/runs.md "On any machine"):
    # "native", the CPU's own fastest kernels (bytes hold where the kernel fingerprint is the
    # same), or "portable", the kernels every x86-64 CPU has (the same bytes on any of them, at a
    # cost). "native" is left out of the key: every run recorded before the field computed so.
    numerics: str = _field("native", record="optional", key_neutral="native")

    def __post_init__(self) -> None:
        check_config(self)

    def replace(self, **changes: Any) -> "RunConfig":
        """A copy with ``changes`` (validated like any record)."""
        return dataclasses.replace(self, **changes)

    def with_problem_defaults(self) -> "RunConfig":
        """dtype and eval_every filled in from the problem where they are None."""
        if self.dtype is not None and self.eval_every is not None:
            return self
        defaults = defaults_for(self.problem)
        return self.replace(dtype=self.dtype or defaults["dtype"], eval_every=self.eval_every or defaults["eval_every"])

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON object (the record itself, unresolved: SPECs as given)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Any, where: str = "run config") -> "RunConfig":
        """A RunConfig from :meth:`to_dict`'s object: every key known, every value checked."""
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: expected a JSON object, got {type(data).__name__}")
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        if unknown:
            raise ConfigError(f"{where}: unknown key {unknown[0]!r}")
        try:
            return cls(**data)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None


class WithRun:
    """Mixin of a record that is a RunConfig (its ``run`` field) plus knobs of its own (a
    federation's timeout, tune's target): the run's fields read through (``setup.rounds``)."""

    run: RunConfig

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "run":
            raise AttributeError(name)
        return getattr(self.run, name)


def field_defaults() -> dict[str, Any]:
    """The fields' own defaults, the algorithm's aside (no problem-dependent ones: see defaults_for)."""
    return {f.name: f.default for f in fields(RunConfig) if f.name != "algorithm"}


def defaults_for(problem: str | dict) -> dict[str, Any]:
    """Every field's default for runs of ``problem``: neural networks compute in float32 (the
    problem's default dtype) and evaluate every NN_EVAL_EVERY rounds. The one place these
    problem-dependent defaults are decided: run, sweep, tune, the presets and federation use it."""
    name = problem.get("name") if isinstance(problem, dict) else parse_spec(problem)[0]
    return {**field_defaults(), "problem": problem, "dtype": default_dtype(problem),
            "eval_every": NN_EVAL_EVERY if name == "nn" else 1}


# Keys of config.json: what a run needs, and what focusfl records beside it.
def _meta(name: str) -> dict:
    return next(f.metadata for f in fields(RunConfig) if f.name == name)


_FIELDS = tuple(f.name for f in fields(RunConfig))
_REQUIRED = tuple(name for name in _FIELDS if _meta(name)["record"] == "required")
# config.json's record of the run as it was asked for (RunConfig.to_dict(): SPECs as given, lr
# "auto" or a number): what tells a run's configuration apart from its seed (configuration_key).
ASKED = "asked"
# "batch_runs": how many runs a sweep stepped together with this one (runs/batch.py): recorded,
# never part of its identity (a batched run computes its rows as the run alone does).
BATCH_RUNS = "batch_runs"
# "dp_nonce": the nonce a DP run's noise is keyed by beside its seed (privacy.dp_nonce: the --dp
# nonce, else derived from the run key), recorded, never part of the key it derives from.
DP_NONCE = "dp_nonce"
# "tensorboard" is an output option (where `run --tensorboard` logs), never part of a run's identity;
# "inputs" and "inputs_changed" are the digests of what the run read (runs/inputs.py).
_RECORDED = ("focusfl_version", *(name for name in _FIELDS if _meta(name)["record"] == "optional"), "status",
             "diverged_at_round", "interrupted_after_round", "stopped", "rounds_done", "lr_auto", "tensorboard", ASKED,
             "inputs", "inputs_changed", BATCH_RUNS, "epsilon_bound",
             DP_NONCE)
_KEYED = tuple(name for name in _FIELDS if _meta(name)["key"])
_KEY_NEUTRAL = {name: _meta(name)["key_neutral"] for name in _FIELDS if _meta(name)["key_neutral"] is not None}
_NO_IDENTITY = tuple(name for name in _FIELDS if not _meta(name)["identity"])


def record(config: RunConfig, *, algorithm: dict, problem: dict, participation: dict,
           work: dict | None = None) -> dict[str, Any]:
    """config.json's run keys: the fields it records, the parts given resolved (describe())."""
    parts = {"algorithm": algorithm, "problem": problem, "participation": participation}
    if work is not None:
        parts["work"] = work
    recorded = {name: parts.get(name, getattr(config, name)) for name in _FIELDS if _meta(name)["record"] is not None}
    recorded["dp"] = resolved_dp(config.dp)
    return {"focusfl_version": __version__, **recorded, ASKED: asked(config)}


SPECS = ("algorithm", "problem", "participation", "work")


def resolved_dp(spec: str | dict) -> str | dict:
    """The ``dp`` record as config.json keeps it: "none", or its table of keys (one form
    whatever order the command line gave them in)."""
    dp = parse_dp(spec)
    return NONE if dp is None else dp.describe()


def asked(config: RunConfig) -> dict[str, Any]:
    """The record as it was asked for, in one form whichever way it was written (a SPEC string
    or a table, 'fedavg' or {"name": "fedavg"}): config.json's ASKED."""
    fields_ = config.to_dict()
    for name in SPECS:
        spec_name, params = parse_spec(fields_[name])
        fields_[name] = {"name": spec_name, **params}
    return fields_


def _key_neutral(name: str, value: Any) -> bool:
    """Whether ``value`` of field ``name`` is its key-neutral value ("fixed" and {"name": "fixed"} alike)."""
    if name not in _KEY_NEUTRAL:
        return False
    neutral = _KEY_NEUTRAL[name]
    if not isinstance(neutral, str):
        return value == neutral
    try:
        return parse_spec(value) == parse_spec(neutral)
    except ConfigError:
        return False


def run_key(resolved: dict) -> str:
    """A run's identity: the SHA-256 of its resolved configuration's keyed fields (version,
    status and outputs left out: a new focusfl version does not rerun a finished sweep)."""
    kept = {k: resolved[k] for k in _KEYED if k in resolved and not _key_neutral(k, resolved[k])}
    canonical = json.dumps(kept, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def horizon_free_key(resolved: dict) -> str:
    """The run key with its horizon (``rounds``) left out: one for a run and for its extension
    (``--resume DIR --rounds R`` runs the same run further), the key a DP run's nonce derives from
    (privacy.dp_nonce)."""
    return run_key({k: v for k, v in resolved.items() if k != "rounds"})


def as_requested(info: dict, expected: dict | None) -> dict:
    """A run's record with the problem parameters asked to be chosen at run time (``"auto"`` or
    ``"measure"``: an nn problem's client_chunk and layout are chosen when the run starts, and
    config.json records the choice) put back as ``expected`` asked for them, and the algorithm's
    hyperparameters derived from the run (None until Algorithm.prepare: a period, rates, a seed;
    config.json records their values) put back to None, so that its key is the one asked for (the
    same command gives the same key on any machine, under any timer, as before they were recorded)."""
    if not expected:
        return info
    out = info
    if isinstance(expected.get("problem"), dict) and isinstance(info.get("problem"), dict):
        asked = expected["problem"]
        autos = {k for k, v in asked.items() if v in ("auto", "measure")}
        if autos:
            out = {**out, "problem": {k: (asked[k] if k in autos else v) for k, v in info["problem"].items()}}
    if isinstance(expected.get("algorithm"), dict) and isinstance(info.get("algorithm"), dict):
        derived = {k for k, v in expected["algorithm"].items() if v is None}
        if derived:
            out = {**out, "algorithm": {k: (None if k in derived else v) for k, v in info["algorithm"].items()}}
    return out


def configuration_key(resolved: dict) -> str:
    """The identity of a run's configuration: what it was asked to run (its ASKED record), the
    seed aside. Runs that differ only in their seed share it, also where the seed drew some of
    their parameters (the participation rate preset, the data); runs that differ in anything
    asked (a problem parameter, per-client rates) do not. Aggregation and plots draw one curve
    with a band per configuration. A record written before ASKED existed: its keyed fields."""
    asked = resolved.get(ASKED)
    source = asked if isinstance(asked, dict) else {k: resolved[k] for k in _KEYED if k in resolved}
    kept = {k: v for k, v in source.items() if k != "seed" and k not in _NO_IDENTITY and not _key_neutral(k, v)}
    canonical = json.dumps(kept, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


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
    integer("threads", 1)
    integer("client_workers", 1)
    if config.client_workers > MAX_CLIENT_WORKERS:
        raise ConfigError(f"client_workers must be at most {MAX_CLIENT_WORKERS} (threads, one per core at most "
                          f"pays), got {config.client_workers}")
    if config.eval_every is not None:
        integer("eval_every", 1)
    if config.local_steps is not None:
        integer("local_steps", 1)
    lr = config.lr
    if lr is not None and lr != "auto" and (
        isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 < lr < math.inf
    ):
        raise ConfigError(f"lr must be a positive number or 'auto', got {lr!r}")
    if config.dtype is not None and config.dtype not in DTYPES:
        raise ConfigError(f"dtype must be float32 or float64, got {config.dtype!r}")
    if not isinstance(config.deterministic, bool):
        raise ConfigError(f"deterministic must be true or false, got {config.deterministic!r}")
    if config.numerics not in NUMERICS:
        raise ConfigError(f"numerics must be one of {', '.join(NUMERICS)}, got {config.numerics!r}")
    if not isinstance(config.device, str):
        raise ConfigError(f"device must be a string such as 'cpu' or 'cuda', got {config.device!r}")
    if config.engine not in ENGINES:
        raise ConfigError(f"engine must be one of {', '.join(ENGINES)}, got {config.engine!r}")
    if config.schedule not in SCHEDULES:
        raise ConfigError(f"schedule must be one of {', '.join(SCHEDULES)}, got {config.schedule!r}")
    state_budget(config)
    parse_dp(config.dp)


def state_budget(config: RunConfig) -> int:
    """``state_memory`` in bytes (ConfigError, one line, when it is not a size)."""
    try:
        return parse_size(config.state_memory, "state_memory")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


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
    optional = {name: data[name] for name in _FIELDS if _meta(name)["record"] == "optional" and name in data}
    if data.get("dtype") is None or data.get("eval_every") is None:  # a recorded run is resolved
        key = "dtype" if data.get("dtype") is None else "eval_every"
        raise ConfigError(f"{where}: {key} must be recorded, got null")
    try:
        return RunConfig(**{k: data[k] for k in _REQUIRED}, **optional, lr=None)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None

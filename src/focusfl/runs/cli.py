"""The run record on a command line: one option per RunConfig field (runs/config.py), with its
type, choices and help, generated for every command that takes run fields (``run``, ``sweep``,
``tune``, the presets, ``federation``), and the parsed values made back into records.

This is the command line's side of the record (a ``cli`` module: tests/test_layers.py puts it
with the commands); the record itself knows nothing of argparse.
"""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, fields
from typing import Any, Callable, Sequence

from ..algorithms.importing import ALLOW_FLAG, DEBUG_FLAG, allow_flag_help
from ..argtypes import non_negative_int, positive_float, positive_int, true_or_false
from ..engine.simulate import ENGINES, SCHEDULES
from .config import DTYPES, NN_EVAL_EVERY, NUMERICS, RunConfig, defaults_for, field_defaults


def lr_value(text: str) -> float | str:
    """``--lr``: a positive number or ``auto``."""
    return "auto" if text == "auto" else positive_float(text)


@dataclass(frozen=True)
class Option:
    """How a field appears on a command line. ``problem_default``: the default when the problem
    decides it (see runs.config.defaults_for), said in the help text."""

    help: str
    type: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    problem_default: str | None = None


_OPTIONS = {
    "algorithm": Option("algorithm NAME or NAME:key=value,... (see `focusfl algorithms`), or your own class "
                        "path/to/file.py:Class[:key=value,...] or package.module:Class[:...] with "
                        "--allow-algorithm-import (docs/your-algorithm.md)"),
    "problem": Option("problem SPEC, e.g. ridge:dim=50,clients=16 or nn:data=mnist,alpha=0.1 "
                      "(neural networks: docs/neural-networks.md)"),
    "participation": Option("participation SPEC, e.g. bernoulli, weighted:m=4, or one p per client as "
                            "'bernoulli:p=0.2;0.9;...' (quoted: a shell ends the command at ;) (docs/participation.md)"),
    "work": Option(
        "work SPEC: each active client's number of local steps per round, in 1..tau: fixed (all tau), "
        "uniform (uniform on 1..tau), 'rates:r=0.25;1;...' (a fraction of tau per client; quoted: a shell ends the "
        "command at ;), markov:p=0.3,rho=0.8,slow=0.25 (devices stay slow), trace:path=PATH (recorded counts, "
        "a CSV round,client,steps such as a federation's work.csv); algorithms without per-client step "
        "counts refuse all but fixed"),
    "rounds": Option("rounds to run in all", type=positive_int),
    "local_steps": Option("local steps tau per round (default: the algorithm's, 1)", type=positive_int),
    "lr": Option("(local) step size eta, or 'auto': a stable step from the problem's smoothness constant L, "
                 "1/(tau L) or 1/(N L) for FOCUS's summed tracking; neural networks need a number", type=lr_value),
    "seed": Option("seed of data, participation and minibatches", type=non_negative_int),
    "dtype": Option("floating-point type of models and data", choices=tuple(DTYPES),
                    problem_default="float32 for neural networks, float64 otherwise"),
    "device": Option("cpu or cuda"),
    "engine": Option("the engine that computes the rounds", choices=tuple(ENGINES)),
    "eval_every": Option("evaluate every E rounds", type=positive_int, metavar="E",
                         problem_default=f"1; neural networks {NN_EVAL_EVERY}: one pass over a 10,000-image test set "
                         "costs about as much as 1.4 CIFAR-10 training rounds"),
    "schedule": Option("step-size schedule: constant, or sqrt = eta/sqrt(r/10+1)", choices=tuple(SCHEDULES)),
    "threads": Option("torch intra-op threads for the run (recorded in config.json and part of the run's key): the "
                      "thread count changes float results at the rounding level, so it is part of the run, never "
                      "taken from the machine; more threads can speed up large neural networks on a quiet machine",
                      type=positive_int),
    "client_workers": Option("threads that compute the active clients' chunks (the problem's client_chunk) side by "
                             "side on a CPU, each with --threads intra-op threads; the results are the same bytes "
                             "with any number (recorded in config.json, not part of the run's key); 2 on a 2-core "
                             "machine ran the CIFAR CNN 1.65x faster than 1 (docs/performance.md)",
                             type=positive_int, metavar="N"),
    "state_memory": Option("the most memory the clients' state table (FOCUS's last gradients, SCAFFOLD's control "
                           "variates: N rows) may take, e.g. 512MB or 4GiB; a larger table is memory-mapped in the "
                           "run folder (clients.bin) and only the active clients' rows are read and written each "
                           "round; same results either way (0: always on disk)", metavar="SIZE"),
    "deterministic": Option("true: deterministic kernels on every device (the same command, the same bytes, also on "
                            "a GPU); false: torch's faster defaults on a GPU, whose runs can differ in bits from one "
                            "process to the next (recorded in config.json and part of the run's key)",
                            type=true_or_false, metavar="true|false"),
    "numerics": Option("the numerical environment: native (the CPU's own fastest kernels; the same bytes on CPUs "
                       "with the same kernel fingerprint) or portable (the kernels every x86-64 CPU has: the same "
                       "bytes on any of them, slower; the command starts itself again with the portable "
                       "environment's variables) (recorded in config.json; docs/runs.md)",
                       choices=NUMERICS),
    "dp": Option("client-level differential privacy: none, or clip=C,noise=SIGMA,mode=central|local"
                 "[,delta=D][,target_epsilon=E][,secret_schedule=true][,public_rates=true][,nonce=K]: each "
                 "vector a client sends clipped to norm C, Gaussian noise of SIGMA*C on the round's sum (central) or on each "
                 "message (local); with delta, metrics.csv gains epsilon_max and epsilon_median (the bound that "
                 "holds with a public schedule, unless secret_schedule=true); target_epsilon stops the run before "
                 "a client would exceed it; nonce=K keys the noise beside the seed (default: from the run's key, "
                 "so runs that differ in any setting draw independent noise) (docs/privacy.md)", metavar="DP"),
}
assert set(_OPTIONS) == {f.name for f in fields(RunConfig)}, "every run field is an option"


def add_algorithm_import_option(parser: argparse.ArgumentParser, what: str = "--algorithm", *,
                                recorded: bool = False, debug: bool = True) -> None:
    """``--allow-algorithm-import``: the command line's permission to import (and so RUN) the Python
    code an algorithm SPEC names; cli.main grants it for the whole command (algorithms/importing.py).
    ``recorded``: the command takes --config and --resume, and the permission covers their code too.
    ``debug``: also ``--debug``, for a command that runs the algorithm in this process (cli.main
    prints the traceback of an error raised in the user's code)."""
    parser.add_argument(ALLOW_FLAG, action="store_true", help=allow_flag_help(what, recorded=recorded))
    if debug:
        parser.add_argument(DEBUG_FLAG, action="store_true",
                            help="when your own algorithm's code raises, also print its full traceback (a sweep's "
                            "runs: where each run's error is said) (docs/your-algorithm.md)")


def options() -> dict[str, Option]:
    """Every field's option, in the record's field order."""
    return {f.name: _OPTIONS[f.name] for f in fields(RunConfig)}


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


def run_config_of(values: argparse.Namespace, names: Sequence[str], **fixed: Any) -> RunConfig:
    """The RunConfig a command line describes: its run options ``names`` and ``fixed`` fields
    the command sets itself. Options left None take the problem's defaults (defaults_for) when
    the command line names the problem; else dtype and eval_every stay None, which the builder
    fills from the problem the command runs (a preset's)."""
    given = {**given_options(values, names), **fixed}
    problem = given.get("problem")
    base = defaults_for(problem) if problem is not None else {**field_defaults(), "dtype": None, "eval_every": None}
    return RunConfig(**{**base, **given})


def record_of(kind: type, values: argparse.Namespace, names: Sequence[str] = (), **fixed: Any) -> Any:
    """The record ``kind`` (a dataclass) of a parsed command line: each field from the option of
    its name; a field ``run`` is the RunConfig of the run options ``names`` (see run_config_of)."""
    taken = {}
    for item in dataclasses.fields(kind):
        if item.name == "run":
            taken["run"] = run_config_of(values, names, **fixed)
        elif hasattr(values, item.name):
            taken[item.name] = getattr(values, item.name)
    return kind(**taken)

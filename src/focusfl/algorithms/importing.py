"""An algorithm of the user's own, from their code: ``path/to/file.py:Class`` or
``package.module:Class`` wherever a command takes an algorithm SPEC (its parameters after a
second colon: ``prox.py:MyProx:mu=0.1``; docs/your-algorithm.md).

The class is any concrete :class:`~focusfl.algorithms.base.Algorithm` subclass, the same one
``simulate(MyProx(...), ...)`` runs from Python. Importing it runs the user's code, so it needs
the process's permission (:func:`algorithm_imports`): the command line gives it with
``--allow-algorithm-import`` (cli.main), a sweep's worker from its task, a federation's ServerApp
from its run config and a node from its node config. A file's word alone (an experiment file,
a config.json) never imports anything.

A run records the class by its import target and the SHA-256 of its source file
(:func:`algorithm_record`: ``{"name": "prox.py:MyProx", "sha256": ..., **hyperparameters}``):
the digest is part of the run's identity, and a record whose digest differs from the file's
now is refused when it is built (runs/inputs.py compares it first for a resume or a replay,
where ``--accept-changed-inputs`` goes on with the new code). A sweep plans its runs (their keys,
their folders) with the digest of the code it imported then; its workers build each run within
:func:`planned_code`, so a file edited in between stops the run (:class:`ChangedCode`) instead of
running other code under the planned key.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import inspect
import sys
import traceback
from pathlib import Path
from typing import Any, Iterator, Mapping, NamedTuple

from ..errors import ConfigError, FocusflError
from ..io.digest import file_digest
from ..spec import parse_spec
from .base import Algorithm

ALLOW_FLAG = "--allow-algorithm-import"
DEBUG_FLAG = "--debug"  # the traceback of an error raised in the user's code (cli.main)


def allow_flag_help(what: str = "--algorithm", *, recorded: bool = False) -> str:
    """The help text of ALLOW_FLAG on a command whose algorithms ``what`` names; ``recorded``: the
    command also takes --config and --resume, whose config.json may name code (``focusfl run``)."""
    also = "; also the code a --config or --resume names" if recorded else ""
    return (f"let {what} name your own algorithm class (path/to/file.py:Class or package.module:Class) and import "
            f"it: this RUNS that Python code{also} (docs/your-algorithm.md)")

SHA256 = "sha256"  # the record's key for the digest of the class's source file

# Whether an error of the user's code also prints its traceback (--debug, cli.main), where it is
# turned into its one line (user_code_error): in this process, whichever command caught it.
_tracebacks = False

# The process's permission to import algorithm code. One flag for every place a SPEC is
# resolved (run, sweep, tune, the presets, the report, a federation), set at the edge that
# holds the user's word for it and nowhere else.
_permitted = False


class ChangedCode(ConfigError):
    """The source file of a user's algorithm is not the one a run was recorded or planned with."""


# The digests a sweep planned its runs with, by import target (planned_code); empty: none pinned.
_planned: dict[str, str] = {}


class Imported(NamedTuple):
    """Where an imported class came from: its target as given, its source file and that file's SHA-256."""

    target: str
    path: str
    sha256: str


_SOURCES: dict[type, Imported] = {}  # class -> where it was imported from
_FILE_MODULES: dict[tuple[str, str], Any] = {}  # (source file, SHA-256) -> its module, imported once


@contextlib.contextmanager
def algorithm_imports(allowed: bool) -> Iterator[None]:
    """Within the block, algorithm SPECs may (``allowed``) or may not import code."""
    global _permitted
    before, _permitted = _permitted, bool(allowed)
    try:
        yield
    finally:
        _permitted = before


@contextlib.contextmanager
def user_tracebacks(shown: bool) -> Iterator[None]:
    """Within the block, :func:`user_code_error` prints the traceback of each error it says (--debug)."""
    global _tracebacks
    before, _tracebacks = _tracebacks, bool(shown)
    try:
        yield
    finally:
        _tracebacks = before


@contextlib.contextmanager
def planned_code(digests: Mapping[str, str]) -> Iterator[None]:
    """Within the block, an import target of ``digests`` (:func:`recorded_code`) whose source file's
    SHA-256 differs from its digest there is refused (ChangedCode): a sweep's worker builds the
    code its runs were planned and keyed with, or none."""
    global _planned
    before, _planned = _planned, dict(digests)
    try:
        yield
    finally:
        _planned = before


def recorded_code(record: Any) -> dict[str, str]:
    """``{import target: SHA-256}`` of an algorithm record (algorithm_record) of a user's class;
    {} for a registered algorithm or a SPEC without a digest."""
    try:
        name, params = parse_spec(record)
    except ConfigError:
        return {}
    if not is_algorithm_import(name) or not isinstance(params.get(SHA256), str):
        return {}
    return {name: params[SHA256]}


def tracebacks_shown() -> bool:
    """Whether errors of the user's code print their tracebacks here (what a sweep passes on)."""
    return _tracebacks


def imports_permitted() -> bool:
    """Whether this process may import algorithm code now (what a sweep passes on to its workers)."""
    return _permitted


def is_algorithm_import(name: object) -> bool:
    """Whether an algorithm SPEC's name is code to import (spec.is_import_target), not a registered name."""
    return isinstance(name, str) and ":" in name


def refuse_unpermitted(spec: Any) -> None:
    """ConfigError when the algorithm SPEC ``spec`` names code to import and this process may not:
    a run says so before it builds anything else (a problem's data may take long to load)."""
    try:
        name, _ = parse_spec(spec)
    except ConfigError:
        return  # not a SPEC: make_algorithm says so in its words
    if is_algorithm_import(name) and not _permitted:
        raise ConfigError(f"algorithm {name!r} would import and run Python code; pass {ALLOW_FLAG} to allow it")


def load_algorithm_class(target: str, *, sha256: Any = None) -> type[Algorithm]:
    """The Algorithm subclass ``target`` names, imported only with the process's permission.
    ``sha256``: the digest a record carries; a source file that differs is refused, as is one
    that differs from the digest its runs were planned with (planned_code)."""
    refuse_unpermitted(target)
    where, _, attribute = target.rpartition(":")
    module, path = _import(target, where)
    cls = getattr(module, attribute, None)
    _check_class(target, cls)
    digest = file_digest(path)
    if sha256 is not None and str(sha256) != digest:
        raise ChangedCode(f"algorithm code {path} has changed since it was recorded (SHA-256 {digest[:12]}..., "
                          f"recorded {str(sha256)[:12]}...)")
    planned = _planned.get(target)
    if planned is not None and planned != digest:
        raise ChangedCode(f"algorithm code {path} has changed since its runs were planned (SHA-256 {digest[:12]}..., "
                          f"planned {planned[:12]}...); run the command again to run the new code")
    _SOURCES[cls] = Imported(target, str(path), digest)
    return cls


def _is_file(where: str) -> bool:
    return where.endswith(".py") or "/" in where or "\\" in where


def _import(target: str, where: str) -> tuple[Any, Path]:
    """The module ``where`` names (a .py file or a module path) and its source file."""
    try:
        if _is_file(where):
            path = Path(where).expanduser().resolve()
            if not path.is_file():
                raise ConfigError(f"algorithm {target!r}: file {where!r} not found")
            return _file_module(path), path
        module = importlib.import_module(where)
    except FocusflError:
        raise
    except (Exception, SystemExit) as exc:  # the user's code may raise anything while it imports
        text = str(exc).splitlines()[0] if str(exc) else ""
        raise ConfigError(f"cannot import algorithm {target!r}: {type(exc).__name__}: {text}") from None
    source = getattr(module, "__file__", None)
    if not source or not Path(source).is_file():
        raise ConfigError(f"algorithm {target!r}: module {where!r} has no source file to record")
    return module, Path(source)


def _file_module(path: Path) -> Any:
    """The module of a .py file, executed once per content (its digest names it in sys.modules,
    where dataclasses look their module up)."""
    digest = file_digest(path)
    key = (str(path), digest)
    if key in _FILE_MODULES:
        return _FILE_MODULES[key]
    name = f"_focusfl_algorithm_{digest[:16]}_{''.join(c if c.isalnum() else '_' for c in path.stem)}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"cannot import {str(path)!r} as Python code")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    _FILE_MODULES[key] = module
    return module


def _check_class(target: str, cls: Any) -> None:
    if cls is None:
        raise ConfigError(f"algorithm {target!r}: the module has no {target.rpartition(':')[2]!r}")
    if not (inspect.isclass(cls) and issubclass(cls, Algorithm)):
        raise ConfigError(f"algorithm {target!r} is not a subclass of focusfl.algorithms.Algorithm")
    if inspect.isabstract(cls):
        missing = ", ".join(sorted(cls.__abstractmethods__))
        raise ConfigError(f"algorithm {target!r} does not define {missing}")
    if not dataclasses.is_dataclass(cls) or not isinstance(getattr(cls, "name", None), str):
        raise ConfigError(f"algorithm {target!r} must be a @dataclass(frozen=True) with a class attribute name")


class UserCodeError(ConfigError):
    """An exception raised by the code of a user's algorithm class, said in one line with the place
    in their file it came from (``place``: ``my_prox.py:12 in client_round: ZeroDivisionError: ...``);
    ``original``: that exception, whose traceback ``--debug`` prints."""

    def __init__(self, target: str, place: str, original: BaseException) -> None:
        super().__init__(f"your algorithm {target}: {place}")
        self.place = place
        self.original = original


def user_code_error(exc: BaseException) -> UserCodeError | None:
    """``exc`` as a :class:`UserCodeError` when it was raised in (or through) the source file of an
    imported algorithm class: ``your algorithm my_prox.py:MyProx: my_prox.py:12 in client_round:
    ZeroDivisionError: division by zero`` (the method focusfl called, and the innermost line of that
    file); None for any other exception, and for focusfl's own errors, which say what they mean.
    Within :func:`user_tracebacks`, the traceback of ``exc`` goes to stderr first."""
    if isinstance(exc, (FocusflError, KeyboardInterrupt, SystemExit)):
        return None
    sources: dict[str, Imported] = {}
    for imported in _SOURCES.values():
        sources[imported.path] = sources[str(Path(imported.path).resolve())] = imported
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename in sources:
            frames.append(tb)
        tb = tb.tb_next
    if not frames:
        return None
    first, last = frames[0], frames[-1]
    imported = sources[last.tb_frame.f_code.co_filename]
    method, function = first.tb_frame.f_code.co_name, last.tb_frame.f_code.co_name
    called = "" if function == method else f" (called from {method})"
    text = str(exc).splitlines()[0] if str(exc) else ""
    if _tracebacks:
        traceback.print_exception(exc)
    place = f"{Path(imported.path).name}:{last.tb_lineno} in {function}{called}: {type(exc).__name__}"
    return UserCodeError(imported.target, f"{place}: {text}" if text else place, exc)


def algorithm_source(algorithm: Algorithm) -> Imported | None:
    """Where the class of ``algorithm`` was imported from (None: registered, or made in Python)."""
    return _SOURCES.get(type(algorithm))


def algorithm_record(algorithm: Algorithm) -> dict[str, Any]:
    """What a run records of its algorithm: ``describe()``, and for an imported class its import
    target as the name and its source's SHA-256 (a SPEC that rebuilds the same object)."""
    described = algorithm.describe()
    source = algorithm_source(algorithm)
    if source is None:
        return described
    return {**described, "name": source.target, SHA256: source.sha256}


def without_digest(spec: str | dict) -> str | dict:
    """An algorithm SPEC without the digest its record carries: a resume or a replay compares
    the code with config.json's inputs (runs/inputs.py), where a change can be accepted."""
    try:
        name, params = parse_spec(spec)
    except ConfigError:
        return spec
    if not is_algorithm_import(name) or SHA256 not in params:
        return spec
    return {"name": name, **{k: v for k, v in params.items() if k != SHA256}}

"""What a ``focusfl reproduce`` preset is, and the result cache its runs share.

A preset module (``reproduce_ridge``, ``reproduce_nn``...) defines ``PRESETS``, a tuple of
:class:`Preset`; :mod:`.reproduce` lists those modules. A preset module imports this one and never
the list, so the modules do not import each other in a circle.
"""
from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..engine import RunResult


@dataclass(frozen=True)
class Preset:
    """A ``focusfl reproduce`` preset. ``options``: the record its command line becomes (a frozen
    dataclass; a field named ``run`` is a RunConfig made of the run options ``run_fields``, with
    ``run_defaults`` over the fields' own); ``add_arguments(parser)`` declares the preset's own
    options (each named as a field of ``options``); ``run(record)`` does the work and returns the
    exit status. The command line (reproduce/cli.py) turns the parsed options into the record:
    the preset never sees argparse's values."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    options: type
    run: Callable[[Any], int]
    run_fields: tuple[str, ...] = ()
    run_defaults: dict[str, Any] = field(default_factory=dict)


def cached_run(cache, key: dict[str, Any], run: Callable[[], Any]):
    """``run()`` (a RunResult) once per ``key``: (result, seconds the computation took).

    With a ``ResultCache`` the rows, how the run ended and its duration are stored, so a rerun of
    an interrupted preset rebuilds the result instead of running it again; without one
    (``cache=None``) it simply runs.
    """
    def timed() -> list[dict]:
        start = time.perf_counter()
        result = run()
        seconds = time.perf_counter() - start
        ending = {"rounds_done": result.rounds_done, "diverged_at": result.diverged_at, "seconds": seconds}
        return [ending, *result.rows]

    ending, *rows = timed() if cache is None else cache.get_or_compute(key, timed)
    return RunResult(rows=rows, rounds_done=ending["rounds_done"], diverged_at=ending["diverged_at"]), ending["seconds"]

"""What a ``focusfl reproduce`` preset is, and the result cache its runs share.

A preset module (``reproduce_ridge``, ``reproduce_nn``...) defines ``PRESETS``, a tuple of
:class:`Preset`; :mod:`.reproduce` lists those modules. A preset module imports this one and never
the list, so the modules do not import each other in a circle.
"""
from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Preset:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def cached_run(cache, key: dict[str, Any], run: Callable[[], Any]):
    """``run()`` (a RunResult) once per ``key``: (result, seconds the computation took).

    With a ``ResultCache`` the rows, how the run ended and its duration are stored, so a rerun of
    an interrupted preset rebuilds the result instead of running it again; without one
    (``cache=None``) it simply runs.
    """
    from ..engine import RunResult

    def timed() -> list[dict]:
        start = time.perf_counter()
        result = run()
        seconds = time.perf_counter() - start
        ending = {"rounds_done": result.rounds_done, "diverged_at": result.diverged_at, "seconds": seconds}
        return [ending, *result.rows]

    ending, *rows = timed() if cache is None else cache.get_or_compute(key, timed)
    return RunResult(rows=rows, rounds_done=ending["rounds_done"], diverged_at=ending["diverged_at"]), ending["seconds"]

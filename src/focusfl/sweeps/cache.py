"""Finished units of a long command (a tuning trial, a preset's run), kept across a crash.

A study computes many runs into an output's partial folder (``io.folders``); each finished
one is stored in ``PARTIAL/.cache`` so that a rerun after a crash or Ctrl-C skips it. The
cache is deleted when the folder is published.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Callable

from .. import __version__
from ..io.atomic import write_text
from ..io.folders import CACHE


class ResultCache:
    """Rows of finished runs, kept in ``work/.cache/<sha256>.json`` until the folder is published.

    The key is the resolved configuration of one run (plus focusfl's version); rows are lists of
    dicts of floats, ints, strings, booleans and None. Floats are stored by ``repr``, which
    round-trips bit for bit, and inf/nan as JSON's Infinity/NaN extension. Computed rows are
    returned as read back from their JSON, so a rerun that reuses them writes the same bytes.
    """

    def __init__(self, work: str | Path):
        self.folder = Path(work) / CACHE
        self.reused = 0
        self.computed = 0

    @staticmethod
    def digest(key: dict) -> str:
        canonical = json.dumps({"focusfl_version": __version__, "run": key}, sort_keys=True,
                               separators=(",", ":"), ensure_ascii=False, default=_plain)
        return hashlib.sha256(canonical.encode()).hexdigest()

    def has(self, key: dict) -> bool:
        """Whether rows of ``key`` are stored (a caller may compute the others together first)."""
        return (self.folder / f"{self.digest(key)}.json").is_file()

    def get_or_compute(self, key: dict, compute: Callable[[], list[dict]]) -> list[dict]:
        path = self.folder / f"{self.digest(key)}.json"
        try:
            rows = json.loads(path.read_text())["rows"]
        except (OSError, ValueError, KeyError, TypeError):
            pass  # not there yet (or unreadable): compute it
        else:
            self.reused += 1
            return rows
        text = json.dumps({"key": key, "rows": compute()}, default=_plain)
        self.folder.mkdir(exist_ok=True)
        write_text(path, text, durable=True)
        self.computed += 1
        return json.loads(text)["rows"]


def _plain(value: Any) -> Any:
    """numpy scalars (and anything else with .item()) as Python numbers."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"cannot store {type(value).__name__} in a result cache")

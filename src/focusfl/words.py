"""Words a count goes with, spelled for the count: ``counted(1, "claim")`` is "1 claim"."""
from __future__ import annotations


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """``count`` and ``noun``, plural (``plural``, else ``noun + "s"``) unless the count is one."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"

"""argparse value types shared by the command-line modules."""
from __future__ import annotations

import argparse


def _integer_at_least(text: str, lowest: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < lowest:
        raise argparse.ArgumentTypeError(f"must be >= {lowest}, got {value}")
    return value


def positive_int(text: str) -> int:
    return _integer_at_least(text, 1)


def non_negative_int(text: str) -> int:
    return _integer_at_least(text, 0)


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def batch_runs_value(text: str) -> int | str:
    """``--batch-runs``: ``auto`` or a count >= 1 (runs/batch.py)."""
    return "auto" if text == "auto" else positive_int(text)


# --batch-runs: what it does, then where it is recorded (run folders' config.json, where a command
# writes them; the report's convex runs have none).
BATCH_RUNS_WHAT = ("runs stepped together in one batch (same problem and algorithm; their clients' work stacked "
                   "in one client round): auto (as many as fit a fixed memory budget, at most 32), a count, or 1 "
                   "(one run at a time)")
BATCH_RUNS_SAME = "the results are the same bytes whatever the batch (docs/performance.md)"
BATCH_RUNS_HELP = f"{BATCH_RUNS_WHAT}; recorded in each run's config.json; {BATCH_RUNS_SAME}"


def true_or_false(text: str) -> bool:
    """``true`` or ``false`` (any case), as config.json writes the value."""
    lowered = text.strip().lower()
    if lowered not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"must be true or false, got {text!r}")
    return lowered == "true"

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


def true_or_false(text: str) -> bool:
    """``true`` or ``false`` (any case), as config.json writes the value."""
    lowered = text.strip().lower()
    if lowered not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"must be true or false, got {text!r}")
    return lowered == "true"

"""Reproduction presets: ``focusfl reproduce NAME``. Each preset registers itself here."""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Preset:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


PRESETS: dict[str, Preset] = {}


def register(preset: Preset) -> Preset:
    PRESETS[preset.name] = preset
    return preset


def load_presets() -> dict[str, Preset]:
    """Import the preset modules (each calls register)."""
    from . import reproduce_delays  # noqa: F401
    from . import reproduce_ridge  # noqa: F401
    from . import reproduce_nn  # noqa: F401
    from . import reproduce_report  # noqa: F401

    return PRESETS

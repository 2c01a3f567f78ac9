"""The command line of ``focusfl reproduce PRESET``: a preset's options, and the parsed options
made into the preset's options record. A ``cli`` module (tests/test_layers.py puts it with the
commands): nothing in reproduce/ imports it, and nothing here computes.
"""
from __future__ import annotations

import argparse

from ..runs.cli import add_run_options, record_of
from .preset import Preset
from .registry import load_presets


def add_preset_arguments(parser: argparse.ArgumentParser, preset: Preset) -> None:
    """A preset's options: its run fields (generated from the run record) and its own."""
    if preset.run_fields:
        add_run_options(parser, preset.run_fields, defaults=preset.run_defaults,
                        helps={"rounds": "rounds per run", "seed": "the first seed"})
    preset.add_arguments(parser)


def preset_command(preset: Preset):
    """The handler of ``focusfl reproduce NAME``: the parsed options as the preset's record."""
    def run(args: argparse.Namespace) -> int:
        return preset.run(record_of(preset.options, args, preset.run_fields))

    return run


def presets() -> dict[str, Preset]:
    return load_presets()

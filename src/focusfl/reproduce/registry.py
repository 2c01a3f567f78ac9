"""Reproduction presets: ``focusfl reproduce NAME``, listed in one place.

Each preset module defines ``PRESETS`` (see :mod:`.preset`); this module imports them when the
command line is built, and they never import it back.
"""
from __future__ import annotations

from . import nn_study, reproduce_delays, reproduce_nn, reproduce_report, reproduce_ridge
from .preset import Preset


def load_presets() -> dict[str, Preset]:
    """Every preset by name, in the order ``focusfl reproduce --help`` lists them."""
    modules = (reproduce_delays, reproduce_ridge, reproduce_nn, nn_study, reproduce_report)
    return {preset.name: preset for module in modules for preset in module.PRESETS}

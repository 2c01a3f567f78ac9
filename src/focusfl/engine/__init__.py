"""Engines: the vectorized simulator and the per-client reference loop."""
from .simulate import ENGINES, RunResult, simulate

__all__ = ["ENGINES", "RunResult", "simulate"]

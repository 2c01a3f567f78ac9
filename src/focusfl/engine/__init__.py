"""Engines: the vectorized simulator and the per-client reference loop."""
from .simulate import ENGINES, Resume, RunResult, simulate

__all__ = ["ENGINES", "Resume", "RunResult", "simulate"]

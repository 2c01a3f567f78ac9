"""Engines: the vectorized simulator and the per-client reference loop, and the round loop they share."""
from .loop import Resume, RunResult, TrainLoss, run_rounds
from .simulate import ENGINES, simulate

__all__ = ["ENGINES", "Resume", "RunResult", "TrainLoss", "run_rounds", "simulate"]

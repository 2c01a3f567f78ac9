"""Problems: convex benchmarks with known optima, and (see nn/) neural networks."""
from __future__ import annotations


import torch

from ..errors import ConfigError
from ..spec import parse_spec, take_params
from .base import Problem, relative_error
from .linear import Logistic, Ridge
from .hf import HuggingFaceNetwork
from .nn import NeuralNetwork
from .ondemand import OnDemandLogistic, OnDemandRidge

PROBLEMS: dict[str, type] = {"ridge": Ridge, "logistic": Logistic, "nn": NeuralNetwork,
                             OnDemandRidge.name: OnDemandRidge, OnDemandLogistic.name: OnDemandLogistic}


def default_dtype(spec: str | dict) -> str:
    """The dtype a problem runs in unless told otherwise: float32 for neural networks, else float64."""
    name, _ = parse_spec(spec)
    return getattr(PROBLEMS.get(name), "default_dtype", "float64")


def available_problems() -> list[str]:
    return sorted(PROBLEMS)


def make_problem(
    spec: str | dict,
    *,
    dtype: torch.dtype | None = None,
    device: str = "cpu",
    allow_model_import: bool = False,
    state_size=None,
) -> Problem:
    """Build a problem from ``"ridge:dim=50,clients=16"`` or its describe() dict.

    ``dtype`` None: the problem's own default (float32 for neural networks, where float64 is
    about 3x slower and buys nothing; float64 for the convex problems, whose exact optima the
    tests and figures compare with to 1e-15).
    ``allow_model_import``: let an ``nn`` spec name ``model=package.module:factory``, which
    imports and runs that code; leave it False for specs that come from files.
    ``state_size``: the state size of the algorithm that will run (its ``state_size(N, d)``;
    algorithms.algorithm_state_size): a neural network checks that its model and that state fit
    in memory before it builds the model.
    """
    name, params = parse_spec(spec)
    if name not in PROBLEMS:
        raise ConfigError(f"unknown problem {name!r} (known: {', '.join(available_problems())})")
    cls = PROBLEMS[name]
    if cls is NeuralNetwork and str(params.get("data", "")).startswith("hf:"):
        cls = HuggingFaceNetwork  # the same problem on a Hugging Face dataset (problems/hf.py)
    if dtype is None:
        dtype = getattr(torch, getattr(cls, "default_dtype", "float64"))
    params = take_params(f"problem {name!r}", params, cls.defaults)
    if issubclass(cls, NeuralNetwork):
        return cls(dtype=dtype, device=device, allow_model_import=allow_model_import, state_size=state_size,
                   **params)
    return cls(dtype=dtype, device=device, **params)


__all__ = ["Problem", "PROBLEMS", "make_problem", "available_problems", "default_dtype", "relative_error"]

"""FedProx: FedAvg whose clients minimize a proximal local objective.

Paper: Li, Sahu, Zaheer, Sanjabi, Talwalkar and Smith, "Federated Optimization in
Heterogeneous Networks" (MLSys 2020), Algorithm 2, with local SGD as the inexact local solver
(the authors' code, litian96/FedProx, takes gradient steps on the proximal objective).

Round r, every active client i in S_r pulls x_r and takes tau gradient steps on
    h_i(z) = f_i(z) + (mu / 2) ||z - x_r||^2:
    z = x_r;  for t = 1..tau:  z = z - eta * (grad f_i(z) + mu * (z - x_r))
and pushes z_i - x_r (1 vector each way). The server is FedAvg's (fedavg.py):
    x_{r+1} = x_r + gamma * sum_{i in S_r} w_i (z_i - x_r)
with FedAvg's weightings (``weighting``; "active": w_i = 1/|S_r|, the paper's averaging of
uniformly sampled devices). An empty round leaves x unchanged. mu = 0 is FedAvg exactly. The
proximal term shortens the local trip (each step contracts z towards x_r by eta * mu), which
bounds client drift; it does not remove FedAvg's participation bias (argmin sum_i q_i f_i).

A short client (tau_i < tau steps, RoundContext.steps) takes its tau_i proximal steps and pushes
its update, which is the paper's "gamma-inexact" solution of a device that did less work: the
paper allows exactly this (variable local work is its systems heterogeneity).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..errors import ConfigError
from .base import RoundContext, broadcast, live_mask, max_steps
from .fedavg import FedAvg, ModelDelta


def proximal_sgd(x: torch.Tensor, n: int, oracle, lr: float, mu: float, steps: int,
                 counts: torch.Tensor | None = None) -> torch.Tensor:
    """tau gradient steps on f_i(z) + mu/2 ||z - x||^2 from x for n clients at once: z [n, d].
    ``counts``: client k stops after counts[k] steps (a batched loop of max(counts) steps)."""
    z = broadcast(x, n)
    for step in range(steps if counts is None else max_steps(counts)):
        stepped = z - lr * (oracle(z, step) + mu * (z - x))
        z = stepped if counts is None else torch.where(live_mask(counts, step, z), stepped, z)
    return z


@dataclass(frozen=True)
class FedProx(FedAvg):
    """FedProx with local SGD on the proximal objective; ``mu`` >= 0 (0: FedAvg)."""

    name = "fedprox"
    summary = "FedAvg with a proximal term mu/2 ||z - x_r||^2 in every local objective (Li et al. 2020)"
    in_paper_figure = False  # a baseline of the registry, not of the FOCUS paper's Figure 4

    mu: float = 0.01

    def validate(self) -> None:
        super().validate()
        if not (isinstance(self.mu, (int, float)) and not isinstance(self.mu, bool) and math.isfinite(self.mu)
                and self.mu >= 0):
            raise ConfigError(f"fedprox: mu must be a number >= 0, got {self.mu!r}")

    def client_round(self, server, clients, oracle, ctx: RoundContext):
        z = proximal_sgd(server.x, ctx.active.numel(), oracle, self.lr * ctx.lr_scale, self.mu, self.local_steps,
                         ctx.steps)
        return clients, ModelDelta(delta=z - server.x)

    def auto_lr(self, smoothness: float, num_clients: int) -> float:
        """1/(tau (L + mu)): the proximal objective is (L + mu)-smooth."""
        return 1.0 / (self.local_steps * (smoothness + self.mu))

"""FedAvgM: FedAvg with server momentum.

Paper: Hsu, Qi and Brown, "Measuring the Effects of Non-Identical Data Distribution for
Federated Visual Classification" (2019), section 3 ("FedAvgM"); the same server optimizer is
the SGD-with-momentum case of Reddi et al.'s FedOpt (ICLR 2021).

Every active client pulls x_r, takes tau local SGD steps and pushes z_i - x_r (1 vector each
way). The server keeps x and the momentum buffer v (v = 0 at first):
    Delta_r = (1/|S_r|) sum_{i in S_r} (z_i - x_r)        (minus the paper's pseudo-gradient)
    v_{r+1} = beta * v_r + Delta_r
    x_{r+1} = x_r + gamma * v_{r+1}
With beta = 0 and gamma = 1 this is FedAvg. In the long run a constant Delta moves x by
gamma / (1 - beta) times Delta per round: the default gamma = 1 - beta = 0.1 keeps FedAvg's
effective step (the paper reasons in the effective step eta / (1 - beta); gamma makes that
rescaling explicit). Convention: an empty round changes nothing, v included (no
pseudo-gradient arrived; Hsu et al. sample a fixed number of clients and never meet one).

A short client (tau_i < tau steps, RoundContext.steps) takes its tau_i steps and pushes its
update, averaged as any other (FedAvg's treatment, fedavg.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from ..errors import ConfigError
from .base import Algorithm, Communication, RoundContext, State, StateSize
from .fedavg import ModelDelta, local_sgd, no_client_state


class MomentumServer(NamedTuple):
    x: torch.Tensor  # [d] server model
    v: torch.Tensor  # [d] momentum buffer (sum of past Delta_r, decayed by beta)


def mean_update(message: ModelDelta) -> torch.Tensor:
    """Delta_r: the active clients' mean model update (the server optimizers' input)."""
    return message.delta.mean(0)


def local_updates(algorithm: Algorithm, server, clients, oracle, ctx: RoundContext):
    """The FedOpt family's client round: tau local SGD steps from x_r, push z_i - x_r."""
    z = local_sgd(server.x, ctx.active.numel(), oracle, algorithm.lr * ctx.lr_scale, algorithm.local_steps, ctx.steps)
    return clients, ModelDelta(delta=z - server.x)


@dataclass(frozen=True)
class FedAvgM(Algorithm):
    """FedAvg with server momentum ``beta`` and server step ``server_lr`` (gamma)."""

    name = "fedavgm"
    summary = "FedAvg with server momentum beta (Hsu et al. 2019); 1 down, 1 up"
    partial_work = True
    in_paper_figure = False  # a baseline of the registry, not of the FOCUS paper's Figure 4

    server_lr: float = 0.1
    beta: float = 0.9

    def validate(self) -> None:
        self._check_positive("server_lr", self.server_lr)
        if not (isinstance(self.beta, (int, float)) and not isinstance(self.beta, bool) and 0 <= self.beta < 1):
            raise ConfigError(f"fedavgm: beta must be a number in [0, 1), got {self.beta!r}")

    def state_size(self, num_clients: int, dim: int) -> StateSize:
        return StateSize(floats=2 * dim)  # x and v; clients keep nothing

    def init(self, x0: torch.Tensor, num_clients: int) -> State:
        return State(MomentumServer(x=x0.clone(), v=torch.zeros_like(x0)), no_client_state(x0, num_clients))

    def client_round(self, server, clients, oracle, ctx: RoundContext):
        return local_updates(self, server, clients, oracle, ctx)

    def server_round(self, server: MomentumServer, message: ModelDelta, ctx: RoundContext) -> MomentumServer:
        if ctx.active.numel() == 0:
            return server
        v = self.beta * server.v + mean_update(message)
        return MomentumServer(x=server.x + self.server_lr * v, v=v)

    def communication(self) -> Communication:
        return Communication(down=1, up=1, server_memory=2, client_memory=0)

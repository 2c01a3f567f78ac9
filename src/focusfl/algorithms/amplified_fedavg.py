"""Generalized FedAvg with amplified updates (Wang and Ji).

Paper: Wang and Ji, "A Unified Analysis of Federated Learning with Arbitrary Client
Participation" (NeurIPS 2022), Algorithm 1. Every P rounds the server multiplies the move of the
last P rounds by eta_g >= 1; in between it is FedAvg (fedavg.py).

Server keeps x and the anchor x_a (x at the start of the current period). Round r, every
active client pulls x_r, takes tau local SGD steps with step gamma (``lr``) and pushes
z_i - x_r (1 vector each way):
    x_{r+1} = x_r + sum_{i in S_r} w_i (z_i - x_r)          (an empty round keeps x)
    at a period's end ((r + 1) mod P = 0):  x_{r+1} = x_a + eta_g (x_{r+1} - x_a);  x_a = x_{r+1}
The weights w_i are FedAvg's (``weighting``; "active": w_i = 1/|S_r|). Convention: the paper
writes the weights as the participation's omega_i^r with a P-round sum of 1/N per client under
"regularized" participation; 1/|S_r| is that sum for cyclic participation with equal groups
(P = the number of groups), the case the paper's experiments amplify. With eta_g = 1 (or P = 1
and eta_g = 1) this is FedAvg round by round.

Why it helps under periodic participation: over one period every client takes part equally
often, so the period's move is an unbiased step on F; the fixed point of the period map is the
same for any eta_g, and its distance to x* shrinks with gamma. Amplifying lets gamma be eta_g
times smaller at the same speed, hence a smaller error.

``amplification`` = eta_g, ``period`` = P (None: the participation process's cycle, as
amplified_scaffold.py resolves it). A short client (tau_i < tau steps, RoundContext.steps)
takes its tau_i steps and pushes its update (FedAvg's treatment).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

import torch

from .amplified_scaffold import check_period, participation_period
from .base import Communication, RoundContext, State, StateSize
from .fedavg import FedAvg, ModelDelta, no_client_state


class AnchoredServer(NamedTuple):
    x: torch.Tensor  # [d] server model
    anchor: torch.Tensor  # [d] x at the start of the current period (x_a)


@dataclass(frozen=True)
class AmplifiedFedAvg(FedAvg):
    """Generalized FedAvg; ``amplification`` is eta_g, ``period`` is P."""

    name = "amplified_fedavg"
    summary = "FedAvg whose move over every period of P rounds is amplified by eta_g (Wang and Ji 2022); 1 down, 1 up"
    in_paper_figure = False  # not in the FOCUS paper's Figure 4

    amplification: float = 1.5
    period: int | None = None  # P; None: the participation's cycle (1 without one)

    def validate(self) -> None:
        super().validate()
        self._check_positive("amplification", self.amplification)
        check_period(self.name, self.period)

    def prepare(self, problem, participation, *, seed: int | None = None) -> "AmplifiedFedAvg":
        prepared = super().prepare(problem, participation, seed=seed)
        if prepared.period is not None:
            return prepared
        return dataclasses.replace(prepared, period=participation_period(participation))

    def state_size(self, num_clients: int, dim: int) -> StateSize:
        return StateSize(floats=2 * dim)  # x and the anchor; clients keep nothing

    def init(self, x0: torch.Tensor, num_clients: int) -> State:
        return State(AnchoredServer(x=x0.clone(), anchor=x0.clone()), no_client_state(x0, num_clients))

    def server_round(self, server: AnchoredServer, message: ModelDelta, ctx: RoundContext) -> AnchoredServer:
        x = server.x
        if ctx.active.numel():
            weights = self._weights(ctx, message.delta)
            x = x + self.server_lr * (weights[:, None] * message.delta).sum(0)
        if (ctx.round + 1) % (self.period or 1):  # prepare() resolves None; unprepared: P = 1
            return AnchoredServer(x=x, anchor=server.anchor)
        if self.amplification != 1.0:  # eta_g = 1 keeps x bit for bit (x_a + (x - x_a) would round)
            x = server.anchor + self.amplification * (x - server.anchor)
        return AnchoredServer(x=x, anchor=x)

    def communication(self) -> Communication:
        return Communication(down=1, up=1, server_memory=2, client_memory=0)

    def auto_lr(self, smoothness: float, num_clients: int) -> float:
        """1/(eta_g tau L): the paper scales gamma down as eta_g goes up."""
        return 1.0 / (self.amplification * self.local_steps * smoothness)

"""Debiasing FedAvg: FedAvg reweighted by online estimates of the participation frequencies.

Paper: Sun, Zhang, Xu, Joshi, Sharma and Wei, "Debiasing Federated Learning with Correlated
Client Participation" (ICLR 2025). Participation there is an R-th-order Markov chain (a client
must wait at least R rounds before it takes part again: minimum separation), whose stationary
marginal pi_i is unknown and non-uniform; FedAvg then converges to argmin sum_i pi_i f_i. The
debiasing algorithm estimates pi_i online and reweights each participating client's update by
1/pi_i, and provably reaches the minimizer of F whatever R.

Round r, every active client pulls x_r, runs tau local SGD steps and pushes Delta_i = z_i - x_r
(1 vector each way). The server, which sees who takes part, counts n_i(r), client i's
participations in rounds 0..r, and steps
    p_i(r) = n_i(r) / (r + 1)
    x_{r+1} = x_r + gamma * sum_{i in S_r} Delta_i / (N p_i(r))
An empty round leaves x unchanged (its round still counts in r + 1).
[RECON] The paper's exact estimator could not be recovered from the sources we could read: it
"estimates pi_i online" and "reweights local updates by 1/pi_i". The empirical frequency above,
counting the current round (so an active client's estimate is never 0), is our reading (with m
clients a round, p_i = m pi_i for the sampling distribution pi normalized to sum to 1, so the
weights are 1/(N m pi_i): the update is an unbiased estimate of the mean update of all N).
Under participation with known stationary rates p_i it tends to FedAvg with weighting=known_p;
under full participation every p_i(r) = 1 and it is FedAvg with w_i = 1/N = 1/|S_r|.

A short client (tau_i < tau steps, RoundContext.steps) takes its tau_i local SGD steps and
pushes Delta_i, weighted as any other update (FedAvg's treatment; the paper has no step counts):
the estimate counts participations, not steps.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from .base import Algorithm, Communication, RoundContext, State, StateSize, step_size
from .fedau import active_mask
from .fedavg import ModelDelta, local_sgd, no_client_state


class DebiasServer(NamedTuple):
    x: torch.Tensor  # [d] server model
    taken_part: torch.Tensor  # [N] n_i: rounds client i took part in so far


@dataclass(frozen=True)
class DebiasingFedAvg(Algorithm):
    """Debiasing FedAvg; ``server_lr`` is gamma."""

    name = "debiasing_fedavg"
    summary = "FedAvg reweighted by 1/(N p_i), p_i the client's participation frequency so far (correlated participation)"
    partial_work = True
    # Not in the FOCUS paper's Figure 4 (reproduce ridge); the report's suite section compares it.
    in_paper_figure = False

    server_lr: float = 1.0

    def validate(self) -> None:
        self._check_positive("server_lr", self.server_lr)

    def state_size(self, num_clients: int, dim: int) -> StateSize:
        return StateSize(floats=dim + num_clients)  # x, each n_i

    def init(self, x0: torch.Tensor, num_clients: int) -> State:
        return State(DebiasServer(x=x0.clone(), taken_part=x0.new_zeros(num_clients)), no_client_state(x0, num_clients))

    def client_round(self, server: DebiasServer, clients, oracle, ctx: RoundContext):
        z = local_sgd(server.x, ctx.active.numel(), oracle, step_size(self, ctx), self.local_steps, ctx.steps)
        return clients, ModelDelta(delta=z - server.x)

    def server_round(self, server: DebiasServer, message: ModelDelta, ctx: RoundContext) -> DebiasServer:
        taken_part = server.taken_part + active_mask(ctx, server.x).to(server.taken_part.dtype)
        if ctx.active.numel() == 0:
            return DebiasServer(server.x, taken_part)
        frequency = taken_part.index_select(0, ctx.active) / (ctx.round + 1)  # p_i(r), > 0 for the active
        weights = 1.0 / (ctx.num_clients * frequency)
        step = (weights[:, None] * message.delta).sum(0)
        return DebiasServer(server.x + self.server_lr * step, taken_part)

    def communication(self) -> Communication:
        return Communication(down=1, up=1, server_memory=1, client_memory=0)

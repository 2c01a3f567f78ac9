"""FedNova: normalized averaging for clients that do different numbers of local steps.

Paper: Wang, Liu, Liang, Joshi and Poor, "Tackling the Objective Inconsistency Problem in
Heterogeneous Federated Optimization" (NeurIPS 2020), eq. (6)-(7), with vanilla local SGD as
the local solver (a_i = [1, ..., 1], so ||a_i||_1 = tau_i).

Round r, every active client i in S_r pulls x_r, takes its own tau_i steps
z = z - eta * grad f_i(z) (tau_i from RoundContext.steps; tau = local_steps when None) and
pushes its normalized update and its count:
    d_i = (x_r - z_i) / tau_i                          (the average local gradient times eta)
Server, with weights w_i over the active clients:
    tau_eff = sum_{i in S_r} w_i tau_i / sum_{i in S_r} w_i
    x_{r+1} = x_r - tau_eff * gamma * sum_{i in S_r} w_i d_i
An empty round leaves x unchanged.

Weights under partial participation: w_i are FedAvg's weightings (``weighting``, fedavg.py):
"active" w_i = 1/|S_r| by default (then sum w_i = 1 and these are the paper's equations with
p_i = 1/|S_r|), or 1/N, or 1/(N p_i) with known rates. The paper states p_i as the clients'
data fractions (summing to 1) under full participation; under partial participation the
clients' counts outside S_r are unknown, so tau_eff is the w-weighted MEAN count of the active
clients (the ratio above), an estimate of sum_i p_i tau_i that does not shrink with |S_r|/N.
This keeps FedNova exactly FedAvg with the same weighting when every tau_i is equal
(tau_eff d_i = tau (x - z_i)/tau), so the two differ only by the normalization. FedNova thus
removes the bias from unequal WORK (FedAvg drifts to sum_i q_i tau_i f_i) but not the one from
unequal PARTICIPATION, which the weighting decides.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from .base import Communication, RoundContext, State, step_size
from .fedavg import FedAvg, ModelServer, local_sgd, no_client_state


class NormalizedUpdate(NamedTuple):
    d: torch.Tensor  # [n, d] (x_r - z_i) / tau_i
    tau: torch.Tensor  # [n] tau_i (in the model's dtype)


@dataclass(frozen=True)
class FedNova(FedAvg):
    """FedNova with local SGD; ``server_lr`` is gamma, ``weighting`` picks p_i (see above)."""

    name = "fednova"
    summary = "normalized averaging: removes FedAvg's bias from unequal local steps (Wang et al. 2020)"
    partial_work = True
    in_paper_figure = False  # FedAvg's line exactly: the paper's clients all do tau steps

    def init(self, x0, num_clients):
        return State(ModelServer(x=x0.clone()), no_client_state(x0, num_clients))

    def client_round(self, server, clients, oracle, ctx: RoundContext):
        n = ctx.active.numel()
        z = local_sgd(server.x, n, oracle, step_size(self, ctx), self.local_steps, ctx.steps)
        if ctx.steps is None:
            tau = server.x.new_full((n,), float(self.local_steps))
        else:
            tau = ctx.steps.to(server.x.dtype)
        d = (server.x - z) / tau.view(-1, *([1] * (z.dim() - 1)))
        return clients, NormalizedUpdate(d=d, tau=tau)

    def server_round(self, server, message: NormalizedUpdate, ctx: RoundContext):
        if ctx.active.numel() == 0:
            return server
        weights = self._weights(ctx, message.d)
        tau_eff = (weights * message.tau).sum() / weights.sum()
        step = (weights[:, None] * message.d).sum(0)
        return ModelServer(x=server.x - self.server_lr * tau_eff * step)

    def communication(self) -> Communication:
        # tau_i travels with d_i: one scalar, not counted as a vector.
        return Communication(down=1, up=1, server_memory=1, client_memory=0)

"""FedVARP: variance reduction of partial participation with a server table (SAGA style).

Paper: Jhunjhunwala, Sharma, Nagarkatti and Joshi, "FedVARP: Tackling the Variance Due to
Partial Client Participation in Federated Learning" (UAI 2022), Algorithm 1; as written in
ALGORITHMS.md section 4.

The server keeps y [N, d], each client's latest model update (0 at first), and its mean ybar.
Round r, active clients pull x_r, run tau local SGD steps and push Delta_i = z_i - x_r
(1 vector each way). Server:
    v = ybar + (1/|S_r|) sum_{S_r} (Delta_i - y_i)
    x_{r+1} = x_r + gamma * v;   then y_i = Delta_i for i in S_r
An empty round changes nothing (the correction term is undefined without participants; the
FedAU authors' FedVARP does the same). ybar is recomputed from the table, so it cannot drift.
Under full participation v = mean Delta_i: FedVARP is FedAvg with the same gamma.

A short client (tau_i < tau steps, RoundContext.steps) takes its tau_i local SGD steps and
pushes Delta_i = z_i - x_r, which enters v and overwrites y_i as any other update (the paper
has no step counts; this is FedAvg's treatment). The table then keeps a short update until
the client returns, so the SAGA correction reuses it: FedVARP removes the variance of
participation, not the bias of unequal work.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from .base import Algorithm, Communication, RoundContext, State, StateSize, step_size
from .fedavg import ModelDelta, local_sgd, no_client_state


class VarpServer(NamedTuple):
    x: torch.Tensor  # [d] server model
    table: torch.Tensor  # [N, d] y_i: each client's latest Delta_i


@dataclass(frozen=True)
class FedVarp(Algorithm):
    name = "fedvarp"
    summary = "SAGA-style correction of FedAvg with a server table of latest updates (N d memory)"
    partial_work = True

    server_lr: float = 1.0

    def validate(self) -> None:
        self._check_positive("server_lr", self.server_lr)

    def state_size(self, num_clients: int, dim: int) -> StateSize:
        return StateSize(floats=dim + num_clients * dim)  # x and the server's table of N updates

    def init(self, x0: torch.Tensor, num_clients: int) -> State:
        table = torch.zeros_like(x0).expand(num_clients, *x0.shape).clone()
        return State(VarpServer(x=x0.clone(), table=table), no_client_state(x0, num_clients))

    def client_round(self, server: VarpServer, clients, oracle, ctx: RoundContext):
        z = local_sgd(server.x, ctx.active.numel(), oracle, step_size(self, ctx), self.local_steps, ctx.steps)
        return clients, ModelDelta(delta=z - server.x)

    def server_round(self, server: VarpServer, message: ModelDelta, ctx: RoundContext) -> VarpServer:
        n = ctx.active.numel()
        if n == 0:
            return server
        stored = server.table.index_select(0, ctx.active)
        direction = server.table.mean(0) + (message.delta - stored).sum(0) / n
        table = server.table.index_copy(0, ctx.active, message.delta)
        return VarpServer(x=server.x + self.server_lr * direction, table=table)

    def communication(self) -> Communication:
        return Communication(down=1, up=1, server_memory=1, client_memory=0, server_memory_per_client=1)

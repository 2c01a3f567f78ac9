"""MIFA: memory-augmented impatient federated averaging.

Paper: Gu, Huang, Zhang and Liu, "Fast Federated Learning in the Presence of Arbitrary Device
Unavailability" (NeurIPS 2021), Algorithm 1 ("MIFA"), the variant that does not wait for
unavailable devices; as written in ALGORITHMS.md section 4.

The server keeps a table G [N, d], one row per client, starting at 0. Round r, every active
client pulls x_r, runs tau local SGD steps z_i and pushes G_i = (x_r - z_i) / eta
(1 vector each way); the server overwrites those rows and steps along the mean of the WHOLE
table, stale rows included:
    x_{r+1} = x_r - gamma * eta * (1/N) sum_{i=1..N} G_i       (also when S_r is empty)
``server_lr`` = gamma makes the paper's global step eta_g = gamma * eta (gamma = 1: the paper).
Server memory is O(N d), the cost FOCUS and FedSUM avoid. Under full participation MIFA is
FedAvg with the same gamma. With tau > 1 the table stores drifted local updates, so the fixed
point is not the minimizer of F.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from .base import Algorithm, Communication, RoundContext, State
from .fedavg import local_sgd, no_client_state


class MifaServer(NamedTuple):
    x: torch.Tensor  # [d] server model
    table: torch.Tensor  # [N, d] each client's latest G_i (0 before its first participation)


class MifaMessage(NamedTuple):
    update: torch.Tensor  # [n, d] G_i = (x_r - z_i) / eta


@dataclass(frozen=True)
class Mifa(Algorithm):
    name = "mifa"
    summary = "server table of every client's latest update (N d memory); steps on its mean"

    server_lr: float = 1.0

    def validate(self) -> None:
        self._check_positive("server_lr", self.server_lr)

    def init(self, x0: torch.Tensor, num_clients: int) -> State:
        table = torch.zeros_like(x0).expand(num_clients, *x0.shape).clone()
        return State(MifaServer(x=x0.clone(), table=table), no_client_state(x0, num_clients))

    def client_round(self, server: MifaServer, clients, oracle, ctx: RoundContext):
        lr = self.lr * ctx.lr_scale
        z = local_sgd(server.x, ctx.active.numel(), oracle, lr, self.local_steps)
        return clients, MifaMessage(update=(server.x - z) / lr)

    def server_round(self, server: MifaServer, message: MifaMessage, ctx: RoundContext) -> MifaServer:
        table = server.table.index_copy(0, ctx.active, message.update)
        step = self.server_lr * self.lr * ctx.lr_scale
        return MifaServer(x=server.x - step * table.mean(0), table=table)

    def communication(self) -> Communication:
        return Communication(down=1, up=1, server_memory=1, client_memory=0, server_memory_per_client=1)

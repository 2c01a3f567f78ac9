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

``notebook=true`` reproduces the MIFA of the FOCUS authors' ridge notebook (BichengYing/FedASL,
figures/focus.ipynb), which is not the paper's rule: there the client pushes
(its OWN previous local model - z_i) / eta, the previous local model being the z_i it ended its
last participation with (x_0 before any), instead of (x_r - z_i) / eta. Under full
participation the two coincide round by round (the server moves by m(x_r) - m(x_{r-1}), m the
mean local model, which telescopes to FedAvg). Under partial participation a row holds the
DIFFERENCE of two local models, a move to be made once, and the server applies it again in
every round until the client returns: the error grows (the "MIFA diverges" of the paper's
Figure 4, which the paper could not explain). The client keeps that vector (1 vector of client memory).

A short client (tau_i < tau steps, RoundContext.steps) takes its tau_i local SGD steps and
pushes G_i = (x_r - z_i) / eta (the notebook variant: (z_prev_i - z_i) / eta), divided by eta
and NOT by tau_i: G_i stays a sum of tau_i gradients, the update FedAvg would average, so a
short row in the table weighs less, as in FedAvg (the paper's analysis has every device do
the same number of steps; normalizing would make MIFA a table version of FedNova instead).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from ..errors import ConfigError
from .base import Algorithm, Communication, RoundContext, State, StateSize, step_size
from .fedavg import local_sgd, no_client_state


class MifaServer(NamedTuple):
    x: torch.Tensor  # [d] server model
    table: torch.Tensor  # [N, d] each client's latest G_i (0 before its first participation)


class MifaClients(NamedTuple):
    z_prev: torch.Tensor  # [N, d] the local model of the last participation (notebook variant)


class MifaMessage(NamedTuple):
    update: torch.Tensor  # [n, d] G_i = (x_r - z_i) / eta


@dataclass(frozen=True)
class Mifa(Algorithm):
    name = "mifa"
    summary = "server table of every client's latest update (N d memory); steps on its mean"
    partial_work = True

    server_lr: float = 1.0
    notebook: bool = False  # the FOCUS authors' notebook variant (module docstring)

    def validate(self) -> None:
        self._check_positive("server_lr", self.server_lr)
        if not isinstance(self.notebook, bool):
            raise ConfigError(f"mifa: notebook must be true or false, got {self.notebook!r}")

    def state_size(self, num_clients: int, dim: int) -> StateSize:
        tables = 2 if self.notebook else 1  # the server's table of N updates (and each z_prev_i)
        return StateSize(floats=dim + tables * num_clients * dim)

    def init(self, x0: torch.Tensor, num_clients: int) -> State:
        table = torch.zeros_like(x0).expand(num_clients, *x0.shape).clone()
        if self.notebook:
            clients = MifaClients(z_prev=x0.expand(num_clients, *x0.shape).clone())
        else:
            clients = no_client_state(x0, num_clients)
        return State(MifaServer(x=x0.clone(), table=table), clients)

    def client_round(self, server: MifaServer, clients, oracle, ctx: RoundContext):
        lr = step_size(self, ctx)
        z = local_sgd(server.x, ctx.active.numel(), oracle, lr, self.local_steps, ctx.steps)
        if self.notebook:
            return MifaClients(z_prev=z), MifaMessage(update=(clients.z_prev - z) / lr)
        return clients, MifaMessage(update=(server.x - z) / lr)

    def server_round(self, server: MifaServer, message: MifaMessage, ctx: RoundContext) -> MifaServer:
        table = server.table.index_copy(0, ctx.active, message.update)
        step = self.server_lr * self.lr * ctx.lr_scale
        return MifaServer(x=server.x - step * table.mean(0), table=table)

    def communication(self) -> Communication:
        return Communication(
            down=1, up=1, server_memory=1, client_memory=1 if self.notebook else 0, server_memory_per_client=1
        )

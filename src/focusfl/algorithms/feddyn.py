"""FedDyn: federated learning with dynamic regularization.

Paper: Acar, Zhao, Matas, Mattina, Whatmough and Saligrama, "Federated Learning Based on
Dynamic Regularization" (ICLR 2021), Algorithm 1, built for partial participation; the local
problem solved inexactly by tau gradient steps, as the authors' code (alpemreacar/FedDyn) does
with its local epochs.

Client i keeps g_i, its estimate of grad f_i at the optimum (the paper's grad L_k(theta_k^t), 0
at first); the server keeps x (theta^t, the model clients receive) and h (0 at first). Round r,
every active client pulls x_r and takes tau gradient steps on its dynamically regularized
objective f_i(z) - <g_i, z> + (alpha / 2) ||z - x_r||^2:
    z = x_r;  for t = 1..tau:  z = z - eta * (grad f_i(z) - g_i + alpha * (z - x_r))
    g_i = g_i - alpha * (z - x_r);  push Delta_i = z - x_r        (1 vector each way)
Server:
    h_{r+1} = h_r - alpha * sum_{i in S_r} Delta_i
    x_{r+1} = x_r + (1/|S_r|) sum_{i in S_r} Delta_i - h_{r+1} / (alpha N)
Convention: the paper's h is (1/N) sum_i g_i; here h holds the SUM sum_i g_i (the tracking
invariant below, as FOCUS's y), so the server divides by alpha N where the paper divides h by
alpha; and the paper's x is the mean of the active clients' models minus h / alpha, which is
x_r + mean_i Delta_i - h / alpha written with the updates the clients push. An empty round
changes nothing (the paper always samples clients).

Tracking property: after every round h = sum_{i=1..N} g_i. Fixed point: at x = x*, g_i =
grad f_i(x*) the regularized gradient at z = x* is 0 for every client, so z = x*, g_i and h do
not move and x stays x*, whoever takes part and for any tau: FedDyn is exact under partial
participation, where FedAvg is not (the paper's claim; the report checks it on ridge).

A short client (tau_i < tau steps, RoundContext.steps) takes its tau_i steps and updates g_i from
its own z: nothing else changes, and the fixed point and the tracking property stay.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from .base import Algorithm, Communication, RoundContext, State, StateSize, Tracking, broadcast, live_mask, max_steps


class DynServer(NamedTuple):
    x: torch.Tensor  # [d] server model theta
    h: torch.Tensor  # [d] sum of the clients' g_i


class DynClients(NamedTuple):
    g: torch.Tensor  # [N, d] each client's gradient estimate g_i


class DynMessage(NamedTuple):
    delta: torch.Tensor  # [n, d] z_i - x_r


@dataclass(frozen=True)
class FedDyn(Algorithm):
    """FedDyn; ``alpha`` is the dynamic regularization weight."""

    name = "feddyn"
    summary = "dynamic regularization: each client's linear term tracks its gradient at the optimum (Acar et al. 2021)"
    tracking = Tracking(server="h", clients="g")  # the tracking property above
    partial_work = True
    in_paper_figure = False  # a baseline of the registry, not of the FOCUS paper's Figure 4

    alpha: float = 0.1

    def validate(self) -> None:
        self._check_positive("alpha", self.alpha)

    def state_size(self, num_clients: int, dim: int) -> StateSize:
        return StateSize(floats=2 * dim + num_clients * dim)  # x, h; each g_i

    def init(self, x0: torch.Tensor, num_clients: int) -> State:
        zeros = torch.zeros_like(x0)
        clients = DynClients(g=zeros.expand(num_clients, *x0.shape).clone())
        return State(DynServer(x=x0.clone(), h=zeros), clients)

    def client_round(self, server: DynServer, clients: DynClients, oracle, ctx: RoundContext):
        lr, alpha, counts = self.lr * ctx.lr_scale, self.alpha, ctx.steps
        z = broadcast(server.x, ctx.active.numel())
        for step in range(self.local_steps if counts is None else max_steps(counts)):
            stepped = z - lr * (oracle(z, step) - clients.g + alpha * (z - server.x))
            z = stepped if counts is None else torch.where(live_mask(counts, step, z), stepped, z)
        delta = z - server.x
        return DynClients(g=clients.g - alpha * delta), DynMessage(delta=delta)

    def server_round(self, server: DynServer, message: DynMessage, ctx: RoundContext) -> DynServer:
        n = ctx.active.numel()
        if n == 0:
            return server
        h = server.h - self.alpha * message.delta.sum(0)
        x = server.x + message.delta.sum(0) / n - h / (self.alpha * ctx.num_clients)
        return DynServer(x=x, h=h)

    def communication(self) -> Communication:
        return Communication(down=1, up=1, server_memory=2, client_memory=1)

    def auto_lr(self, smoothness: float, num_clients: int) -> float:
        """1/(tau (L + alpha)): the regularized local objective is (L + alpha)-smooth."""
        return 1.0 / (self.local_steps * (smoothness + self.alpha))

"""FedLaAvg: federated latest averaging for intermittent client availability.

Paper: Yan, Niu, Ding, Zheng, Wu, Chen, Tang and Jiang, "Distributed Non-Convex Optimization
with Sublinear Speedup under Intermittent Client Availability" (2020; arXiv 2002.07399),
Algorithm 1, as the authors' code runs it (mikudehuane/FedLaAvg, ``-alg lastavg``) [REF].

The server steps every round along the average of the LATEST gradient of every client, the
absent ones included, so each client weighs 1/N whatever its availability. Client i keeps G_i,
its latest accumulated gradient (0 before it first takes part); the server keeps x and the sum
s = sum_i G_i. Round r, every active client pulls x_r, takes tau local SGD steps with step eta
and pushes the change of its latest gradient (1 vector each way):
    G_i_new = (x_r - z_i) / eta          (the sum of the tau gradients it computed)
    push G_i_new - G_i;  G_i = G_i_new
Server:  s = s + sum_{i in S_r} (G_i_new - G_i)
         x_{r+1} = x_r - gamma * eta * s / N                (every round, also an empty one)
Conventions: the paper's server picks K of the available clients, the least recently picked
first; here the participation process gives S_r (a trace, Markov or cyclic process plays
availability, with every available client taking part). The authors' server keeps the
average s / N; here s is the sum (the tracking invariant below). ``server_lr`` = gamma scales
the server step (gamma = 1: the paper). The authors' warm-up rounds without a server step are
left out.

Tracking property: after every round s = sum_{i=1..N} G_i. The iterates are MIFA's (mifa.py,
same gamma) with the N x d table kept by the clients instead of the server; with tau = 1 they
are FOCUS's (tau = 1) with FOCUS's step eta / N. With tau = 1 the fixed point is x*: unbiased
under any availability in which every client keeps coming back (the report checks it); with
tau > 1 the latest updates carry client drift, as MIFA's.

A short client (tau_i < tau steps, RoundContext.steps) takes its tau_i steps; its G_i is then
the sum of tau_i gradients (MIFA's treatment), so a short row weighs less, as in FedAvg.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from .base import Algorithm, Communication, RoundContext, State, StateSize, Tracking
from .fedavg import local_sgd


class LatestServer(NamedTuple):
    x: torch.Tensor  # [d] server model
    s: torch.Tensor  # [d] sum of every client's latest G_i


class LatestClients(NamedTuple):
    g: torch.Tensor  # [N, d] each client's latest G_i


class LatestMessage(NamedTuple):
    change: torch.Tensor  # [n, d] G_i_new - G_i


@dataclass(frozen=True)
class FedLaAvg(Algorithm):
    """FedLaAvg; ``server_lr`` is gamma (1: the paper)."""

    name = "fedlaavg"
    summary = "server steps on the mean of every client's latest gradient, absent ones included (Yan et al. 2020)"
    tracking = Tracking(server="s", clients="g")  # the tracking property above
    partial_work = True
    in_paper_figure = False  # a baseline of the registry, not of the FOCUS paper's Figure 4

    server_lr: float = 1.0

    def validate(self) -> None:
        self._check_positive("server_lr", self.server_lr)

    def state_size(self, num_clients: int, dim: int) -> StateSize:
        return StateSize(floats=2 * dim + num_clients * dim)  # x, s; each G_i

    def init(self, x0: torch.Tensor, num_clients: int) -> State:
        zeros = torch.zeros_like(x0)
        clients = LatestClients(g=zeros.expand(num_clients, *x0.shape).clone())
        return State(LatestServer(x=x0.clone(), s=zeros), clients)

    def client_round(self, server: LatestServer, clients: LatestClients, oracle, ctx: RoundContext):
        lr = self.lr * ctx.lr_scale
        z = local_sgd(server.x, ctx.active.numel(), oracle, lr, self.local_steps, ctx.steps)
        latest = (server.x - z) / lr
        return LatestClients(g=latest), LatestMessage(change=latest - clients.g)

    def server_round(self, server: LatestServer, message: LatestMessage, ctx: RoundContext) -> LatestServer:
        s = server.s + message.change.sum(0)
        step = self.server_lr * self.lr * ctx.lr_scale / ctx.num_clients
        return LatestServer(x=server.x - step * s, s=s)

    def communication(self) -> Communication:
        return Communication(down=1, up=1, server_memory=2, client_memory=1)

"""SCAFFOLD, option II, with a global step size.

Paper: Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated Learning"
(ICML 2020), Algorithm 1 with the control-variate update of option II (their eq. (4)); as
written in ALGORITHMS.md section 4.

Server keeps x and c, client i keeps c_i (all start at 0). Round r, every active client
receives (x_r, c) (2 vectors down) and runs
    z = x_r;  for t = 1..tau:  z = z - eta * (grad f_i(z) - c_i + c)
    c_i_new = c_i - c + (x_r - z) / (tau * eta)        (option II: = mean local gradient)
    push (z - x_r, c_i_new - c_i) (2 vectors up);  c_i = c_i_new
Server:  x_{r+1} = x_r + gamma * (1/|S_r|) sum_{S_r} (z_i - x_r)
         c       = c + (1/N) sum_{S_r} (c_i_new - c_i)       (so c = mean_j c_j always)
An empty round changes nothing. Under full participation SCAFFOLD is FedSUM (and FedSUM-CR)
with the same (eta, gamma, tau).

A short client (tau_i < tau steps, RoundContext.steps) takes its tau_i corrected steps and
divides by its own count in option II, c_i_new = c_i - c + (x_r - z) / (tau_i * eta), so that
c_i_new stays its mean local gradient; the server is unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from .base import (Algorithm, Communication, RoundContext, State, StateSize, broadcast, descend, descend_, live_mask,
                   max_steps, step_size)


class ScaffoldServer(NamedTuple):
    x: torch.Tensor  # [d] server model
    c: torch.Tensor  # [d] server control variate (mean of the client ones)


class ScaffoldClients(NamedTuple):
    c: torch.Tensor  # [N, d] client control variates c_i


class ScaffoldMessage(NamedTuple):
    delta_x: torch.Tensor  # [n, d] z_i - x_r
    delta_c: torch.Tensor  # [n, d] c_i_new - c_i


@dataclass(frozen=True)
class Scaffold(Algorithm):
    """SCAFFOLD option II; ``server_lr`` is the global step gamma (1 = plain averaging)."""

    name = "scaffold"
    exact_at_full = True  # drift-corrected: exact under full participation (focusfl check)
    summary = "control variates c, c_i correct client drift (option II, global step); 2 down, 2 up"
    partial_work = True

    server_lr: float = 1.0

    def validate(self) -> None:
        self._check_positive("server_lr", self.server_lr)

    def state_size(self, num_clients: int, dim: int) -> StateSize:
        return StateSize(floats=2 * dim + num_clients * dim)  # x, c; each c_i

    def init(self, x0: torch.Tensor, num_clients: int) -> State:
        zeros = torch.zeros_like(x0)
        clients = ScaffoldClients(c=zeros.expand(num_clients, *x0.shape).clone())
        return State(ScaffoldServer(x=x0.clone(), c=zeros), clients)

    def client_round(self, server: ScaffoldServer, clients: ScaffoldClients, oracle, ctx: RoundContext):
        lr = step_size(self, ctx)
        correction = server.c - clients.c  # [n, d]: c - c_i
        z = broadcast(server.x, ctx.active.numel())
        if ctx.steps is not None:
            counts = ctx.steps
            for step in range(max_steps(counts)):
                stepped = descend_(descend(z, oracle(z, step), lr), correction, lr)
                z = torch.where(live_mask(counts, step, z), stepped, z)
            tau = counts.to(z.dtype).view(-1, *([1] * (z.dim() - 1)))
            c_new = clients.c - server.c + (server.x - z) / (tau * lr)
            message = ScaffoldMessage(delta_x=z - server.x, delta_c=c_new - clients.c)
            return ScaffoldClients(c=c_new), message
        for step in range(self.local_steps):
            grad = oracle(z, step)
            # In place once z is this round's own tensor (the oracle's gradient is not written).
            z = descend(z, grad, lr) if step == 0 else descend_(z, grad, lr)
            descend_(z, correction, lr)
        c_new = clients.c - server.c + (server.x - z) / step_size(self, ctx, lambda lr: self.local_steps * lr)
        message = ScaffoldMessage(delta_x=z - server.x, delta_c=c_new - clients.c)
        return ScaffoldClients(c=c_new), message

    def server_round(self, server: ScaffoldServer, message: ScaffoldMessage, ctx: RoundContext):
        n = ctx.active.numel()
        if n == 0:
            return server
        x = server.x + self.server_lr * message.delta_x.sum(0) / n
        c = server.c + message.delta_c.sum(0) / ctx.num_clients
        return ScaffoldServer(x=x, c=c)

    def communication(self) -> Communication:
        return Communication(down=2, up=2, server_memory=2, client_memory=1)

"""Push-sum FL with gradient tracking (experimental): Push-DIGing over the participation matrices.

Plain push-sum (``pushsum``) is not exact with a constant step. Push-pull adds gradient
tracking to gradient descent over graphs; the same fix for push-sum is Push-DIGing (Nedic,
Olshevsky & Shi, 2017). Matrix form (focusfl.matrix.engines.pushsum_tracking_matrix), with the
column-stochastic pull/push matrices of ``pushsum`` and D switching on the server at the pull:
    u_{k+1} = C_k (u_k - eta D_k y_k),  w_{k+1} = C_k w_k,  x_{k+1} = u_{k+1} / w_{k+1}
    y_{k+1} = C_k y_k + g_{k+1} - g_k,  g = stored gradients (refreshed on the rows that step
                                          next), y_0 = g_0 = 0
so 1^T y_k = 1^T g_k: the network's total y is the sum of every client's latest gradient.
Per client (what each side stores and sends):
    server stores (u_0, w_0, y_0); client i stores (u_i, w_i, y_i, g_prev_i).
    pull:  the server steps u_0 <- u_0 - eta y_0 (every round, also when S_r is empty), then
           sends (pull / N) * (u_0, w_0, y_0) to each active client (2 vectors + 1 scalar)
           and keeps 1 - pull * |S_r| / N of it; the client adds it to its own.
    local: for t = 0..tau-1:  g = grad f_i(u_i / w_i); y_i += g - g_prev_i; g_prev_i = g;
                              u_i -= eta y_i
    push:  the client sends push * (u_i, w_i, y_i) (2 vectors + 1 scalar), keeps the rest.
    server model: u_0 / w_0.
Memory: server 2 vectors, client 3 (u, y, g_prev); tau gradients per round (the gradient at the
point after the last step is deferred to the next participation, as FOCUS does).

Measured behaviour (exact with a constant step, no proof). ``focusfl run --algorithm
pushsum_tracking --problem ridge:dim=10,samples=50,hetero=1 --participation P --rounds 4000 --lr
LR`` (16 clients, tau = 1), last-round rel_error for LR = 2.5e-4 / 1.25e-4:
    full 3.6e-15 / 6.6e-15,  uniform 3.3e-15 / 1.9e-14,  bernoulli 3.4e-15 / 1.4e-14;
with tau = 5, lr = 5e-5 under bernoulli: 2.1e-8 after 3000 rounds, falling ~13x every 500
rounds (linear). tests/test_pushsum.py asserts rel_error < 1e-10 after 2000 rounds at
lr = 2.5e-4 under full, uniform and bernoulli participation.

A short client (tau_i < tau steps, RoundContext.steps) runs the local loop for its tau_i steps
only (no paper; the natural choice, as FOCUS): y_i still changes by g - g_prev_i at each step it
takes, so the network's total y stays the sum of every client's latest gradient whatever the
step counts, and the mixing is unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from .base import Communication, RoundContext, State, StateSize, Step, live_mask, max_steps, step_size
from .pushsum import PullPushShares, pull_share, server_keep


class TrackingServer(NamedTuple):
    u: torch.Tensor  # [d] model mass
    w: torch.Tensor  # [] weight
    y: torch.Tensor  # [d] gradient-tracking mass


class TrackingClients(NamedTuple):
    u: torch.Tensor  # [N, d]
    w: torch.Tensor  # [N]
    y: torch.Tensor  # [N, d]
    g_prev: torch.Tensor  # [N, d] last computed gradient (0 before any)


class TrackingMessage(NamedTuple):
    u: torch.Tensor  # [n, d]
    w: torch.Tensor  # [n]
    y: torch.Tensor  # [n, d]


@dataclass(frozen=True)
class PushSumTracking(PullPushShares):
    """Push-sum with gradient tracking (experimental); ``pull``/``push`` as in ``pushsum``."""

    name = "pushsum_tracking"
    summary = "[experimental] push-sum + gradient tracking (Push-DIGing form); exact in our measurements"
    partial_work = True

    def state_size(self, num_clients: int, dim: int) -> StateSize:
        return StateSize(floats=2 * dim + 1 + num_clients * (3 * dim + 1))  # (u, w, y); each (u, w, y, g_prev)

    def init(self, x0: torch.Tensor, num_clients: int) -> State:
        zeros = torch.zeros_like(x0)
        stack = x0.expand(num_clients, *x0.shape)
        server = TrackingServer(u=x0.clone(), w=x0.new_ones(()), y=zeros)
        clients = TrackingClients(
            u=stack.clone(), w=x0.new_ones(num_clients), y=torch.zeros_like(stack), g_prev=torch.zeros_like(stack)
        )
        return State(server, clients)

    def _stepped_server_mass(self, server: TrackingServer, lr: Step) -> torch.Tensor:
        """u_0 after the server's step at the pull (what it shares out and keeps)."""
        return server.u - lr * server.y

    def client_round(self, server: TrackingServer, clients: TrackingClients, oracle, ctx: RoundContext):
        lr = step_size(self, ctx)
        share = pull_share(self.pull, ctx)
        u = clients.u + share * self._stepped_server_mass(server, lr)
        w = clients.w + share * server.w
        y = clients.y + share * server.y
        g_prev = clients.g_prev
        if ctx.steps is None:
            for step in range(self.local_steps):
                grad = oracle(u / w[:, None], step)
                y = y + grad - g_prev
                g_prev = grad
                u = u - lr * y
        else:  # client k stops after ctx.steps[k] steps: one batched loop, finished rows kept
            for step in range(max_steps(ctx.steps)):
                grad = oracle(u / w[:, None], step)
                live = live_mask(ctx.steps, step, grad)
                y = torch.where(live, y + grad - g_prev, y)
                g_prev = torch.where(live, grad, g_prev)
                u = torch.where(live, u - lr * y, u)
        keep = 1.0 - self.push
        kept = TrackingClients(u=keep * u, w=keep * w, y=keep * y, g_prev=g_prev)
        return kept, TrackingMessage(u=self.push * u, w=self.push * w, y=self.push * y)

    def server_round(self, server: TrackingServer, message: TrackingMessage, ctx: RoundContext):
        keep = server_keep(self.pull, ctx)
        u = self._stepped_server_mass(server, self.lr * ctx.lr_scale)
        return TrackingServer(
            u=keep * u + message.u.sum(0), w=keep * server.w + message.w.sum(0), y=keep * server.y + message.y.sum(0)
        )

    def model(self, state: State) -> torch.Tensor:
        return state.server.u / state.server.w

    def communication(self) -> Communication:
        return Communication(down=2, up=2, server_memory=2, client_memory=3)

"""FedSUM-B: the basic member of the FedSUM family (no local updates).

Paper: "FedSUM family" (seed 004), section 3.1, Algorithm 1, and its "Stochastic Uplink-Merge"
technique. The paper's formulas were lost in extraction; the update below is OUR
RECONSTRUCTION (ALGORITHMS.md section 3.1), built from the prose and fixed by the equivalences
of section 3.4:

Client i keeps c_i, its aggregated gradient from its latest participation (0 before any).
Round r, every active client i (all at once, as [n, d] stacks):
    c_i_new = (1/K) sum_{k=1..K} grad f_i(x_r; batch k)   (K minibatches at the SAME point)
    push Delta_i = c_i_new - c_i;  c_i = c_i_new            (1 vector down: x_r; 1 up)
Server:  v_{r+1} = v_r + sum_{i in S_r} Delta_i   (so v = sum_{j=1..N} c_j, O(d) memory)
         x_{r+1} = x_r - gamma_B * v_{r+1} / N    (also when S_r is empty)

Step size: gamma_B = server_lr * lr * K, i.e. the server moves as far as FedSUM's K local
steps of size lr would (FedSUM's step is gamma * eta * K). With this parametrisation FedSUM-B
(K = 1) and FedSUM (K = 1) with the same (lr, server_lr) are the same algorithm, and FedSUM-B
(K = 1, lr = eta, server_lr = N) is FOCUS (tau = 1, eta): ALGORITHMS.md section 3.4.

A short client (K_i < K minibatches, RoundContext.steps) averages the K_i gradients it
computed, c_i_new = (1/K_i) sum_{k=1..K_i} grad f_i(x_r; batch k), and pushes c_i_new - c_i.
The paper has no step counts; dividing by its own count keeps c_i an unbiased estimate of
grad f_i(x_r) (only noisier), whereas dividing by K would shrink a short client's gradient.
The server is unchanged (its step gamma_B uses the nominal K), and v = sum_j c_j still holds.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from .base import (Algorithm, Communication, RoundContext, State, StateSize, Tracking, broadcast, live_mask, max_steps,
                   per_row)


class SumServer(NamedTuple):
    x: torch.Tensor  # [d] server model x_r
    v: torch.Tensor  # [d] sum over ALL clients of their latest aggregated gradient c_j


class SumClients(NamedTuple):
    c: torch.Tensor  # [N, d] aggregated gradient of each client's latest participation


class SumMessage(NamedTuple):
    delta: torch.Tensor  # [n, d] c_i_new - c_i (the Stochastic Uplink-Merge message)


def merge_uplink(server_v: torch.Tensor, message: SumMessage) -> torch.Tensor:
    """v_{r+1} = v_r + sum of the active clients' Delta_i (keeps v = sum_j c_j)."""
    return server_v + message.delta.sum(0)


@dataclass(frozen=True)
class FedSumB(Algorithm):
    """FedSUM-B (reconstruction): K minibatch gradients at x_r, uplink merge, step
    gamma_B = server_lr * lr * K on v / N. ``local_steps`` is K."""

    name = "fedsum_b"
    exact_at_full = True  # drift-corrected: exact under full participation (focusfl check)
    summary = "FedSUM-B [reconstructed]: K minibatch gradients at x_r, sum-tracking server, no local updates"
    tracking = Tracking(server="v", clients="c")  # v = sum_j c_j (merge_uplink); FedSUM, FedSUM-CR inherit it
    partial_work = True

    server_lr: float = 1.0

    def validate(self) -> None:
        self._check_positive("server_lr", self.server_lr)

    def state_size(self, num_clients: int, dim: int) -> StateSize:
        return StateSize(floats=2 * dim + num_clients * dim)  # x, v; each c_i

    def init(self, x0: torch.Tensor, num_clients: int) -> State:
        zeros = torch.zeros_like(x0)
        clients = SumClients(c=zeros.expand(num_clients, *x0.shape).clone())
        return State(SumServer(x=x0.clone(), v=zeros), clients)

    def client_round(self, server: SumServer, clients: SumClients, oracle, ctx: RoundContext):
        z = broadcast(server.x, ctx.active.numel())
        total = torch.zeros_like(z)
        if ctx.steps is None:
            # Distinct step indices: K independent minibatches at the same point.
            for k in range(self.local_steps):
                total = total + oracle(z, k)
            c_new = total / self.local_steps
        else:  # client j stops after K_j minibatches and averages those (module docstring)
            for k in range(max_steps(ctx.steps)):
                total = torch.where(live_mask(ctx.steps, k, total), total + oracle(z, k), total)
            c_new = total / per_row(ctx.steps, total)
        return SumClients(c=c_new), SumMessage(delta=c_new - clients.c)

    def server_step(self, ctx: RoundContext) -> float:
        """gamma_B = server_lr * lr_r * K (see the module docstring)."""
        return self.server_lr * self.lr * ctx.lr_scale * self.local_steps

    def server_round(self, server: SumServer, message: SumMessage, ctx: RoundContext) -> SumServer:
        v = merge_uplink(server.v, message)
        return SumServer(x=server.x - self.server_step(ctx) * v / ctx.num_clients, v=v)

    def communication(self) -> Communication:
        return Communication(down=1, up=1, server_memory=2, client_memory=1)

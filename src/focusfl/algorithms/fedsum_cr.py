"""FedSUM-CR: the communication-reduced member of the FedSUM family.

Paper: "FedSUM family" (seed 004), section 3.3, Algorithm 3 and its equation (11). The
formulas were lost in extraction; the update below is OUR RECONSTRUCTION (ALGORITHMS.md
section 3.3).

FedSUM sends v_r down so that clients can correct their local steps. FedSUM-CR sends x_r only
(1 down, 1 up) and lets each client rebuild the correction from the model difference: client
i keeps xt_i (the last model it received, initially x_0) and s_i (the round of its last
selection, initially 0). Selected in round r:
    chat_i = (xt_i - x_r) / (gamma * eta * K * (r - s_i))   if r > s_i, else 0
then FedSUM's local loop with v_r/N replaced by chat_i; then xt_i = x_r, s_i = r.
The server is FedSUM's. Because x_{t+1} = x_t - gamma*eta*K*v_{t+1}/N in EVERY round (empty
ones too), chat_i is exactly the mean of v_t/N over t = s_i+1..r: the average aggregated
gradient of the rounds the client missed. Under full participation it is v_r/N, and FedSUM-CR
is FedSUM.

With a step-size schedule the identity is approximate: the client divides by the current
step gamma*eta_r*K, not by the steps actually taken in the rounds it missed.

A short client (K_i < K steps, RoundContext.steps) does as in FedSUM: K_i corrected steps,
c_i_new = acc / K_i. chat_i still divides by the nominal gamma*eta*K, which is exactly the
server's step in every round whatever the clients did, so chat_i stays the mean of v_t/N over
the missed rounds under any work.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from .base import Communication, RoundContext, State, StateSize
from .fedsum import FedSum, corrected_local_steps
from .fedsum_b import SumMessage, SumServer


class SumCRClients(NamedTuple):
    c: torch.Tensor  # [N, d] aggregated gradient of the latest participation
    x_last: torch.Tensor  # [N, d] xt_i: the last model the client received (x_0 at first)
    last_round: torch.Tensor  # [N] int64 s_i: round of the last selection (0 at first)


@dataclass(frozen=True)
class FedSumCR(FedSum):
    """FedSUM-CR (reconstruction): FedSUM's correction rebuilt from the received models."""

    name = "fedsum_cr"
    exact_at_full = True  # drift-corrected: exact under full participation (focusfl check)
    summary = "FedSUM-CR [reconstructed]: FedSUM with the correction rebuilt from model differences; 1 down"

    def state_size(self, num_clients: int, dim: int) -> StateSize:
        return StateSize(floats=2 * dim + 2 * num_clients * dim, integers=num_clients)  # x, v; c_i, x_last_i, s_i

    def init(self, x0: torch.Tensor, num_clients: int) -> State:
        state = super().init(x0, num_clients)
        clients = SumCRClients(
            c=state.clients.c,
            x_last=x0.expand(num_clients, *x0.shape).clone(),
            last_round=torch.zeros(num_clients, dtype=torch.int64, device=x0.device),
        )
        return State(state.server, clients)

    def estimated_direction(self, server: SumServer, clients: SumCRClients, ctx: RoundContext) -> torch.Tensor:
        """chat_i [n, d]: mean of v_t/N over the rounds since the client's last selection."""
        gap = (ctx.round - clients.last_round).to(server.x.dtype)  # [n]
        moved = clients.x_last - server.x
        # gap = 0 only in round 0 (s_i starts at 0): then nothing has been aggregated yet.
        scale = self.server_step(ctx) * gap.clamp(min=1.0)
        return torch.where(gap[:, None] > 0, moved / scale[:, None], torch.zeros_like(moved))

    def client_round(self, server: SumServer, clients: SumCRClients, oracle, ctx: RoundContext):
        correction = self.estimated_direction(server, clients, ctx) - clients.c
        c_new = corrected_local_steps(server.x, correction, oracle, self.lr * ctx.lr_scale, self.local_steps, ctx.steps)
        n = ctx.active.numel()
        rows = SumCRClients(
            c=c_new,
            x_last=server.x.expand(n, *server.x.shape).clone(),
            last_round=torch.full_like(clients.last_round, ctx.round),
        )
        return rows, SumMessage(delta=c_new - clients.c)

    def communication(self) -> Communication:
        return Communication(down=1, up=1, server_memory=2, client_memory=2)

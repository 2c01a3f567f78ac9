"""FedAWE: adaptive innovation echoing and implicit gossiping.

Paper: Xiang et al., "Efficient Federated Learning against Heterogeneous
and Non-stationary Client Unavailability" (NeurIPS 2024), Algorithm 1; as written in
ALGORITHMS.md section 4.

Client i keeps x_i, the last model it received (x_0 at first), and t_i, the last round it was
active (-1 at first). Round t, every active client:
    z = x_i;  tau local SGD steps on z;  G_i = x_i - z
    sends x_i - gamma * (t - t_i) * G_i      (echoes its update once per round it missed)
    t_i = t
Server:  x_{t+1} = mean over S_t of what was sent      (an empty round keeps x)
Only the active clients receive x_{t+1}, at the end of the round (client_finish): absent
clients keep their stale copy and start from it when they return. Communication is one vector
each way per participating client. Under full participation x_i = x_t and t - t_i = 1, so
FedAWE is FedAvg with server step gamma.

A short client (tau_i < tau steps, RoundContext.steps) takes its tau_i local SGD steps from
x_i, so G_i = x_i - z is the sum of tau_i steps, and echoes it as any other update (the paper
has no step counts; this is FedAvg's treatment of an update). The echo factor t - t_i counts
missed ROUNDS, not missed steps, so a short client's innovation is not scaled up.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from .base import Algorithm, Communication, RoundContext, State, StateSize, live_mask, max_steps, step_size
from .fedavg import ModelServer


class FedAWEClients(NamedTuple):
    x: torch.Tensor  # [N, d] last model received (start of the next local training)
    last_round: torch.Tensor  # [N] int64 t_i: last round the client was active (-1 = never)


class FedAWEMessage(NamedTuple):
    echoed: torch.Tensor  # [n, d] x_i - gamma * (t - t_i) * G_i


@dataclass(frozen=True)
class FedAWE(Algorithm):
    name = "fedawe"
    summary = "clients echo their update once per missed round; stale clients restart from their copy"
    partial_work = True

    server_lr: float = 1.0

    def validate(self) -> None:
        self._check_positive("server_lr", self.server_lr)

    def state_size(self, num_clients: int, dim: int) -> StateSize:
        return StateSize(floats=dim + num_clients * dim, integers=num_clients)  # x; each x_i, t_i

    def init(self, x0: torch.Tensor, num_clients: int) -> State:
        clients = FedAWEClients(
            x=x0.expand(num_clients, *x0.shape).clone(),
            last_round=torch.full((num_clients,), -1, dtype=torch.int64, device=x0.device),
        )
        return State(ModelServer(x=x0.clone()), clients)

    def auto_lr(self, smoothness: float, num_clients: int) -> float:
        """1/(8 tau L): the echo extrapolates a returning client's model by the rounds it missed,
        so long absences amplify the step; measured on ridge, 1/(tau L) diverges under Bernoulli,
        Markov and weighted participation and 1/(8 tau L) stays bounded under all of them."""
        return 1.0 / (8 * self.local_steps * smoothness)

    def client_round(self, server: ModelServer, clients: FedAWEClients, oracle, ctx: RoundContext):
        lr = step_size(self, ctx)
        z = clients.x
        if ctx.steps is None:
            for step in range(self.local_steps):
                z = z - lr * oracle(z, step)
        else:  # client k stops after ctx.steps[k] steps: one batched loop, finished rows kept
            for step in range(max_steps(ctx.steps)):
                z = torch.where(live_mask(ctx.steps, step, z), z - lr * oracle(z, step), z)
        innovation = clients.x - z  # G_i
        missed = (ctx.round - clients.last_round).to(z.dtype)  # t - t_i >= 1
        echoed = clients.x - self.server_lr * missed[:, None] * innovation
        rows = FedAWEClients(x=clients.x, last_round=torch.full_like(clients.last_round, ctx.round))
        return rows, FedAWEMessage(echoed=echoed)

    def server_round(self, server: ModelServer, message: FedAWEMessage, ctx: RoundContext) -> ModelServer:
        n = ctx.active.numel()
        if n == 0:
            return server
        return ModelServer(x=message.echoed.sum(0) / n)

    def client_finish(self, server: ModelServer, clients: FedAWEClients, ctx: RoundContext) -> FedAWEClients:
        # The round's participants receive the new global model; the others stay stale.
        n = ctx.active.numel()
        return FedAWEClients(x=server.x.expand(n, *server.x.shape).clone(), last_round=clients.last_round)

    def communication(self) -> Communication:
        return Communication(down=1, up=1, server_memory=1, client_memory=1)

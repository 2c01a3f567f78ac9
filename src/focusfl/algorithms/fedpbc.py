"""FedPBC: federated postponed broadcast.

Paper: Xiang, Ioannidis, Yeh, Joe-Wong and Su, "Towards Bias Correction of FedAvg over
Nonuniform and Time-Varying Communications" (IEEE CDC 2023, arXiv 2306.00280), and the authors'
code (mingxiang12/FedPBC: static_pbc.py, varying_pbc.py) [REF]. The link between the server and
client i works in round t with an unknown, non-uniform, time-varying probability p_i^t; FedAvg is
then biased, and FedPBC converges to a stationary point of F.

Every client i keeps its local model x_i (x_0 at first) and trains in EVERY round, whether its
link works or not (only communication fails): tau local SGD steps from x_i give z_i, and
    x_i = x_i + gamma (z_i - x_i)
The server averages the local models of the clients whose link works, x_{t+1} = mean_{S_t} x_i
(an empty round keeps x), and broadcasts it at the END of the round, to those clients only
(client_finish): x_i = x_{t+1} for i in S_t. Postponing the broadcast lets the clients that
meet at the server average their models (implicit gossiping), which corrects the bias. 1 vector
each way per participating client; 1 vector of client memory.

How it runs here: the engines compute for the round's participants only, so a client computes
the rounds it trained without a link when it next takes part, before the round's own training:
t - t_i - 1 catch-up rounds (t_i: the last round it took part in, -1 at first), each tau steps
and the gamma move, then the round's. Nothing reaches a client between its participations, so
the catch-up computes the iterates of the authors' loop exactly with full gradients (minibatches
are keyed, as every draw, by the round they are computed in, with the step index b * 2^16 + j
for step j of the round b rounds back; with a step-size schedule the catch-up takes this round's
step). The computation is the algorithm's own: every client does tau steps in every round.
The vectorized engine runs as many blocks as the longest catch-up of the round, masking the
clients that have none left; each masked step tells the oracle which rows take it
(problems/base.py masked_gradients), so on neural networks train_loss counts the minibatch
losses of the steps every client really took, catch-up included, and every engine computes the
same rows. The model is the same in every engine.

``server_lr`` = gamma: the authors' code moves a local model by (1 + lr_global) times its local
progress (w += (w - w_prev) * lr_global, default lr_global = 1); gamma = 1, the default, is the
paper's x_i = z_i. The model evaluated is the server's x_{t+1}, what the clients that meet the
server receive (the authors' code evaluates the mean of all N local models, which needs the
absent clients' local training). Under full participation FedPBC is FedAvg with the same gamma.

A short client (tau_i < tau steps, RoundContext.steps) takes tau_i steps in this round and in
each catch-up round (a work process draws counts only for the rounds a client takes part in;
its count now stands for its speed while it was away).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from ..problems.base import masked_gradients
from .base import Algorithm, Communication, RoundContext, State, StateSize, live_mask, max_steps, step_size
from .fedavg import ModelServer


# Step index of step j of the round b rounds back: b * CATCH_UP_STRIDE + j (this round: j, as in
# every algorithm). Independent of tau, so a client asked for tau_i steps draws what the same
# client run with local_steps = tau_i draws; the index is hashed as 32 bits, so the draws of a
# catch-up longer than 65,535 rounds repeat earlier ones.
CATCH_UP_STRIDE = 1 << 16


class PBCClients(NamedTuple):
    x: torch.Tensor  # [N, d] local model x_i
    last_round: torch.Tensor  # [N] int64 t_i: the last round the client took part in (-1 = never)


class PBCMessage(NamedTuple):
    model: torch.Tensor  # [n, d] x_i after this round's training


@dataclass(frozen=True)
class FedPBC(Algorithm):
    """FedPBC; ``server_lr`` is gamma, the factor on each round's local progress."""

    name = "fedpbc"
    summary = "every client trains every round on its own model; the server averages who is linked and broadcasts late"
    partial_work = True
    # Not in the FOCUS paper's Figure 4 (reproduce ridge); the report's suite section compares it.
    in_paper_figure = False

    server_lr: float = 1.0

    def validate(self) -> None:
        self._check_positive("server_lr", self.server_lr)

    def state_size(self, num_clients: int, dim: int) -> StateSize:
        return StateSize(floats=dim + num_clients * dim, integers=num_clients)  # x, each x_i, each t_i

    def init(self, x0: torch.Tensor, num_clients: int) -> State:
        clients = PBCClients(x=x0.expand(num_clients, *x0.shape).clone(),
                             last_round=torch.full((num_clients,), -1, dtype=torch.int64, device=x0.device))
        return State(ModelServer(x=x0.clone()), clients)

    def client_round(self, server: ModelServer, clients: PBCClients, oracle, ctx: RoundContext):
        counts = ctx.steps if ctx.steps is not None else torch.full_like(clients.last_round, self.local_steps)
        rounds = ctx.round - clients.last_round  # catch-up rounds + this one, >= 1
        lr = step_size(self, ctx)
        x = clients.x
        # Blocks are aligned at the END: block b is the round b rounds before this one (b = 0: this
        # round), so every client's block b draws the same step indices whoever it is batched with.
        for block in reversed(range(max_steps(rounds))):
            start, training = x, live_mask(rounds, block, x)  # clients that trained b rounds ago
            for step in range(max_steps(counts)):
                live = live_mask(counts, step, x) & training
                x = torch.where(live, x - lr * masked_gradients(oracle, x, block * CATCH_UP_STRIDE + step, live), x)
            if self.server_lr != 1.0:  # gamma = 1 keeps z bit for bit (x + (z - x) would round)
                x = start + self.server_lr * (x - start)  # rows that did not train stay: x = start
        rows = PBCClients(x=x, last_round=torch.full_like(clients.last_round, ctx.round))
        return rows, PBCMessage(model=x)

    def server_round(self, server: ModelServer, message: PBCMessage, ctx: RoundContext) -> ModelServer:
        n = ctx.active.numel()
        return ModelServer(x=message.model.sum(0) / n) if n else server

    def client_finish(self, server: ModelServer, clients: PBCClients, ctx: RoundContext) -> PBCClients:
        # The postponed broadcast: the round's participants receive the new model, the others
        # keep training their own.
        n = ctx.active.numel()
        return PBCClients(x=server.x.expand(n, *server.x.shape).clone(), last_round=clients.last_round)

    def communication(self) -> Communication:
        return Communication(down=1, up=1, server_memory=1, client_memory=1)

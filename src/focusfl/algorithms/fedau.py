"""FedAU: FedAvg with online estimates of each client's participation interval.

Paper: Wang and Ji, "A Lightweight Method for Tackling Unknown Participation Statistics in
Federated Averaging" (ICLR 2024), Algorithms 1 and 2 (cutoff-interval weight estimation), and
the authors' code (IBM/fedau, ``weighting_method='adaptive'``); ALGORITHMS.md section 4.

Active clients pull x_r, run tau local SGD steps and push Delta_i = z_i - x_r (1 vector each
way). Server:
    x_{r+1} = x_r + gamma * (1/N) sum_{i in S_r} omega_i * Delta_i
omega_i is the mean length of client i's participation intervals completed BEFORE this round
(1 before any): an estimate of 1/p_i that needs no knowledge of p_i. An interval ends when
the client takes part (length = rounds since its previous participation) or when it has been
absent for ``cutoff`` rounds in a row (length = cutoff, and counting restarts), which bounds
the weights of clients that vanish. The server sees who came, so it keeps this bookkeeping
itself, three numbers per client. Under full participation every interval is 1, omega = 1 and
FedAU is FedAvg with the same gamma. An empty round leaves x unchanged.

A short client (tau_i < tau steps, RoundContext.steps) takes its tau_i local SGD steps and
pushes Delta_i = z_i - x_r, which the server weights by omega_i as any other update: the
paper has no step counts, and FedAU only reweights FedAvg's updates for participation, so it
treats work as FedAvg does (and inherits FedAvg's drift towards the step-weighted objective).
omega_i counts participations only; how much a client did does not change its interval.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from ..errors import ConfigError
from .base import Algorithm, Communication, RoundContext, State, StateSize, step_size
from .fedavg import ModelDelta, local_sgd, no_client_state


class FedAUServer(NamedTuple):
    x: torch.Tensor  # [d] server model
    interval_sum: torch.Tensor  # [N] total length of the completed intervals
    interval_count: torch.Tensor  # [N] number of completed intervals
    absent_for: torch.Tensor  # [N] rounds since the last completed interval ended


def active_mask(ctx: RoundContext, like: torch.Tensor) -> torch.Tensor:
    """Bool [N]: which clients took part in this round."""
    mask = torch.zeros(ctx.num_clients, dtype=torch.bool, device=like.device)
    return mask.index_fill(0, ctx.active, True)


def interval_weights(server) -> torch.Tensor:
    """omega [N]: mean completed participation interval, 1 for clients with none yet (an estimate
    of 1/p_i; ``server`` has the fields interval_sum and interval_count)."""
    count = server.interval_count
    return torch.where(count > 0, server.interval_sum / count.clamp(min=1), torch.ones_like(count))


def count_intervals(server, ctx: RoundContext, cutoff: int | None):
    """Close the intervals that end this round: at a participation, or at the cutoff (None: no
    cutoff). Returns the new (interval_sum, interval_count, absent_for)."""
    present = active_mask(ctx, server.x)
    waited = server.absent_for + 1
    # Present: an interval of length (rounds absent + 1) ends. Absent: the run grows, and
    # ends as an interval of length cutoff when it reaches it.
    at_cutoff = ~present & (waited >= cutoff) if cutoff is not None else torch.zeros_like(present)
    ends = present | at_cutoff
    zeros = torch.zeros_like(waited)
    interval_sum = server.interval_sum + torch.where(ends, waited, zeros)
    interval_count = server.interval_count + ends.to(waited.dtype)
    absent_for = torch.where(ends, zeros, waited)
    return interval_sum, interval_count, absent_for


@dataclass(frozen=True)
class FedAU(Algorithm):
    name = "fedau"
    summary = "FedAvg reweighted by online estimates of 1/p_i (mean participation interval)"
    partial_work = True

    server_lr: float = 1.0
    cutoff: int = 50  # K in the paper: longest interval counted

    def validate(self) -> None:
        self._check_positive("server_lr", self.server_lr)
        if not isinstance(self.cutoff, int) or isinstance(self.cutoff, bool) or self.cutoff < 1:
            raise ConfigError(f"fedau: cutoff must be an integer >= 1, got {self.cutoff!r}")

    def state_size(self, num_clients: int, dim: int) -> StateSize:
        return StateSize(floats=dim + 3 * num_clients)  # x, and three counters per client

    def init(self, x0: torch.Tensor, num_clients: int) -> State:
        server = FedAUServer(x=x0.clone(), interval_sum=x0.new_zeros(num_clients),
                             interval_count=x0.new_zeros(num_clients), absent_for=x0.new_zeros(num_clients))
        return State(server, no_client_state(x0, num_clients))

    def client_round(self, server: FedAUServer, clients, oracle, ctx: RoundContext):
        z = local_sgd(server.x, ctx.active.numel(), oracle, step_size(self, ctx), self.local_steps, ctx.steps)
        return clients, ModelDelta(delta=z - server.x)

    def weights(self, server: FedAUServer) -> torch.Tensor:
        """omega [N]: mean completed interval, 1 for clients with none yet."""
        return interval_weights(server)

    def server_round(self, server: FedAUServer, message: ModelDelta, ctx: RoundContext) -> FedAUServer:
        omega = self.weights(server).index_select(0, ctx.active)
        step = (omega[:, None] * message.delta).sum(0) / ctx.num_clients
        x = server.x + self.server_lr * step
        return FedAUServer(x, *count_intervals(server, ctx, self.cutoff))

    def communication(self) -> Communication:
        return Communication(down=1, up=1, server_memory=1, client_memory=0)

"""FedStale: a convex combination of fresh and stale client updates.

Paper: Rodio and Neglia, "FedStale: leveraging stale client updates in federated learning"
(arXiv 2405.04171, 2024), and the authors' code (arodio/FedStale: aggregator.py with
history_tracker.py and the HistorySGD optimizer, whose ``history_coefficient`` is beta) [REF].

The server keeps y [N, d], each client's latest update Delta_i = z_i - x_r (0 at first), as
FedVARP does. Round r, every active client pulls x_r, runs tau local SGD steps and pushes
Delta_i (1 vector each way). Server:
    v = beta * (1/N) sum_{i=1..N} y_i + sum_{i in S_r} w_i (Delta_i - beta * y_i)
    x_{r+1} = x_r + gamma * v;   then y_i = Delta_i for i in S_r
An empty round changes nothing (the authors' aggregator skips it). The weights w_i stand for
the paper's alpha_i / p_i with alpha_i = 1/N (``weighting``):
    "estimated" (default): w_i = omega_i / N, omega_i the mean length of client i's completed
        participation intervals (FedAU's estimate of 1/p_i, focusfl's fedau.py), as the authors'
        code runs with --unknown_participation_probs (its estimator has no cutoff: ``cutoff``
        unset); it needs no knowledge of the process
    "known_p": w_i = 1/(N p_i), p_i given (``p``) or the process's nominal rates (the paper's
        analysis)
    "active":  w_i = 1/|S_r| (the two agree when m of N clients are drawn uniformly)
    "all":     w_i = 1/N
beta = 0 uses fresh updates only: FedAvg with the same weights; beta = 1 treats fresh and stale
updates alike: with "active" weights it is FedVARP (v = ybar + (1/|S_r|) sum (Delta_i - y_i)), and
with "all" weights it is MIFA's stored-update form (v = the mean of the refreshed table; MIFA
also steps in an empty round, FedStale does not). The paper recommends beta between the two,
larger when data are more heterogeneous and participation less so; the authors' code defaults
to beta = 1 and the paper fixes no default, so ``beta`` = 0.5 here is our choice.

A short client (tau_i < tau steps, RoundContext.steps) takes its tau_i local SGD steps and
pushes Delta_i = z_i - x_r, which enters v and overwrites y_i as any other update (FedVARP's
treatment; the paper has no step counts).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

import torch

from ..errors import ConfigError
from .base import Algorithm, Communication, RoundContext, State, StateSize, step_size
from .fedau import count_intervals, interval_weights
from .fedavg import ModelDelta, checked_rates, known_rates, local_sgd, no_client_state

WEIGHTINGS = ("estimated", "known_p", "active", "all")


class StaleServer(NamedTuple):
    x: torch.Tensor  # [d] server model
    table: torch.Tensor  # [N, d] y_i: each client's latest Delta_i
    interval_sum: torch.Tensor  # [N] FedAU's bookkeeping behind the "estimated" weights
    interval_count: torch.Tensor  # [N]
    absent_for: torch.Tensor  # [N]


@dataclass(frozen=True)
class FedStale(Algorithm):
    """FedStale; ``beta`` weighs the stale updates (0: FedAvg, 1: FedVARP), ``server_lr`` is gamma."""

    name = "fedstale"
    summary = "beta-mix of fresh and stale (table) updates: FedAvg at 0, FedVARP at 1 (N d memory)"
    partial_work = True
    # Not in the FOCUS paper's Figure 4 (reproduce ridge); the report's suite section compares it.
    in_paper_figure = False

    server_lr: float = 1.0
    beta: float = 0.5
    weighting: str = "estimated"
    p: tuple[float, ...] | None = None  # weighting=known_p: the rates (default: the process's nominal ones)
    cutoff: int | None = None  # weighting=estimated: longest interval counted (None: none, as the authors')

    def validate(self) -> None:
        self._check_positive("server_lr", self.server_lr)
        if not (isinstance(self.beta, (int, float)) and not isinstance(self.beta, bool) and 0 <= self.beta <= 1):
            raise ConfigError(f"fedstale: beta must be a number in [0, 1], got {self.beta!r}")
        if self.weighting not in WEIGHTINGS:
            raise ConfigError(f"fedstale: weighting must be one of {', '.join(WEIGHTINGS)}, got {self.weighting!r}")
        if self.p is not None:
            object.__setattr__(self, "p", checked_rates("fedstale", self.p))
        if self.cutoff is not None and (not isinstance(self.cutoff, int) or isinstance(self.cutoff, bool)
                                        or self.cutoff < 1):
            raise ConfigError(f"fedstale: cutoff must be an integer >= 1, got {self.cutoff!r}")

    def prepare(self, problem, participation, *, seed: int | None = None) -> "FedStale":
        if self.weighting != "known_p":
            return self
        return dataclasses.replace(self, p=known_rates("fedstale", self.p, problem, participation))

    def state_size(self, num_clients: int, dim: int) -> StateSize:
        return StateSize(floats=dim + num_clients * dim + 3 * num_clients)  # x, each y_i, three counters per client

    def init(self, x0: torch.Tensor, num_clients: int) -> State:
        table = torch.zeros_like(x0).expand(num_clients, *x0.shape).clone()
        server = StaleServer(x=x0.clone(), table=table, interval_sum=x0.new_zeros(num_clients),
                             interval_count=x0.new_zeros(num_clients), absent_for=x0.new_zeros(num_clients))
        return State(server, no_client_state(x0, num_clients))

    def client_round(self, server: StaleServer, clients, oracle, ctx: RoundContext):
        z = local_sgd(server.x, ctx.active.numel(), oracle, step_size(self, ctx), self.local_steps, ctx.steps)
        return clients, ModelDelta(delta=z - server.x)

    def weights(self, server: StaleServer, ctx: RoundContext) -> torch.Tensor:
        """w_i [n] of the active clients."""
        n, like = ctx.active.numel(), server.x
        if self.weighting == "active":
            return like.new_full((n,), 1.0 / n)
        if self.weighting == "all":
            return like.new_full((n,), 1.0 / ctx.num_clients)
        if self.weighting == "known_p":
            return 1.0 / (ctx.num_clients * like.new_tensor(self.p).index_select(0, ctx.active))
        return interval_weights(server).index_select(0, ctx.active) / ctx.num_clients

    def server_round(self, server: StaleServer, message: ModelDelta, ctx: RoundContext) -> StaleServer:
        intervals = count_intervals(server, ctx, self.cutoff)
        if ctx.active.numel() == 0:
            return server._replace(**dict(zip(("interval_sum", "interval_count", "absent_for"), intervals)))
        stored = server.table.index_select(0, ctx.active)
        fresh = message.delta - self.beta * stored
        direction = self.beta * server.table.mean(0) + (self.weights(server, ctx)[:, None] * fresh).sum(0)
        table = server.table.index_copy(0, ctx.active, message.delta)
        return StaleServer(server.x + self.server_lr * direction, table, *intervals)

    def communication(self) -> Communication:
        return Communication(down=1, up=1, server_memory=1, client_memory=0, server_memory_per_client=1)

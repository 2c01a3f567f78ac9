"""Amplified SCAFFOLD: SCAFFOLD whose model update and control variates move once per period.

Paper: Crawshaw and Liu, "Federated Learning under Periodic Client Participation and
Heterogeneous Data: A New Communication-Efficient Algorithm and Analysis" (NeurIPS 2024), and
the authors' code (MingruiLiu-ML-Lab/FL-under-Periodic-Participation: synthetic/train.py and
image_classification/main.py with ``-correction period``) [REF]. Participation there is
periodic: over a window of P rounds every client has the same chance to take part (cyclic
availability with P the cycle is the main case).

Server keeps x, c, the anchor x_a (x at the start of the current period) and pending (the
change of c the period has gathered so far); client i keeps c_i, and acc_i / k_i: the sum and
the count of the raw gradients it computed in the current period. Round r (period p = r // P),
every active client receives (x_r, c) (2 vectors down):
    if its acc_i is from an earlier period and k_i > 0:  c_i = acc_i / k_i;  acc_i = 0, k_i = 0
    before = acc_i / k_i if k_i > 0 else c_i
    z = x_r;  for t = 1..tau:  g = grad f_i(z);  acc_i += g;  k_i += 1;  z = z - eta (g - c_i + c)
    push (z - x_r, acc_i / k_i - before) (2 vectors up)
Server:  x_{r+1} = x_r + (1/|S_r|) sum_{S_r} (z_i - x_r)       (an empty round keeps x)
         pending += sum_{S_r} (acc_i / k_i - before)
         at a period's end ((r + 1) mod P = 0):  x_{r+1} = x_a + gamma (x_{r+1} - x_a);  x_a = x_{r+1}
                                                 c = c + pending / N;  pending = 0
In the authors' code every client that took part in the period sets c_i to the mean of the
gradients it computed in the period at the period's end, and c to the mean of the c_i. Here a
client does that at its next participation instead (its c_i is used by nobody before), and the
server learns the change through ``pending``, which every participation brings up to date: the
same iterates, with no message to an absent client and O(d) server memory. So c = mean_i c_i
(each c_i as of the last period end) holds after every period end.

``amplification`` = gamma >= 1 in the paper (the code's -lr-global; 1.5 in the authors'
experiments, the default here), ``period`` = P (None: the participation process's cycle, E
for cyclic and reshuffled cyclic with E groups and the period of sine; 1 for processes without
one, and for participation nobody drew: Flower's "available"). With P = 1 and gamma = 1 this is
SCAFFOLD (option II, global step 1) round by round: c_i refreshed every round is the mean local
gradient option II computes. The authors' code scales the local step as eta = lr / gamma;
``lr`` here is eta itself.

A short client (tau_i < tau steps, RoundContext.steps) takes its tau_i corrected steps; acc_i
and k_i count the gradients it really computed, so c_i stays its mean local gradient over the
period (as SCAFFOLD's option II divides by its own tau_i).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

import torch

from ..errors import ConfigError
from .base import (Algorithm, Communication, RoundContext, State, StateSize, broadcast, live_mask, max_steps, per_row,
                   step_size)


class AmplifiedServer(NamedTuple):
    x: torch.Tensor  # [d] server model
    c: torch.Tensor  # [d] mean of the client control variates as of the last period end
    anchor: torch.Tensor  # [d] x at the start of the current period (x_a)
    pending: torch.Tensor  # [d] sum of the changes of the c_i gathered in the current period


class AmplifiedClients(NamedTuple):
    c: torch.Tensor  # [N, d] c_i in force
    acc: torch.Tensor  # [N, d] sum of the raw gradients of the current period
    count: torch.Tensor  # [N] k_i: gradients in acc
    period: torch.Tensor  # [N] int64: the period acc belongs to (-1: none yet)


class AmplifiedMessage(NamedTuple):
    delta_x: torch.Tensor  # [n, d] z_i - x_r
    delta_c: torch.Tensor  # [n, d] change of the client's estimate of its next c_i


@dataclass(frozen=True)
class AmplifiedScaffold(Algorithm):
    """Amplified SCAFFOLD; ``amplification`` is gamma, ``period`` is P."""

    name = "amplified_scaffold"
    exact_at_full = True  # drift-corrected: exact under full participation (focusfl check)
    summary = "SCAFFOLD with control variates refreshed and the model step amplified once per period P; 2 down, 2 up"
    partial_work = True
    # Not in the FOCUS paper's Figure 4 (reproduce ridge); the report's suite section compares it.
    in_paper_figure = False

    amplification: float = 1.5
    period: int | None = None  # P; None: the participation's cycle (1 without one)

    def validate(self) -> None:
        self._check_positive("amplification", self.amplification)
        check_period(self.name, self.period)

    def prepare(self, problem, participation, *, seed: int | None = None) -> "AmplifiedScaffold":
        if self.period is not None:
            return self
        return dataclasses.replace(self, period=participation_period(participation))

    def state_size(self, num_clients: int, dim: int) -> StateSize:
        # x, c, anchor, pending; each c_i and acc_i, each k_i; each client's period (int64)
        return StateSize(floats=4 * dim + 2 * num_clients * dim + num_clients, integers=num_clients)

    def init(self, x0: torch.Tensor, num_clients: int) -> State:
        zeros = torch.zeros_like(x0)
        table = zeros.expand(num_clients, *x0.shape).clone()
        clients = AmplifiedClients(c=table, acc=table.clone(), count=x0.new_zeros(num_clients),
                                   period=torch.full((num_clients,), -1, dtype=torch.int64, device=x0.device))
        return State(AmplifiedServer(x=x0.clone(), c=zeros, anchor=x0.clone(), pending=zeros.clone()), clients)

    def auto_lr(self, smoothness: float, num_clients: int) -> float:
        """1/(gamma tau L): the authors' code takes the local step lr / gamma, so that the period's
        amplified move stays a stable one."""
        return 1.0 / (self.amplification * self.local_steps * smoothness)

    def client_round(self, server: AmplifiedServer, clients: AmplifiedClients, oracle, ctx: RoundContext):
        period = ctx.round // self._period()
        c_i, acc, count = _roll_over(clients, period)
        before = torch.where(_rows(count > 0, acc), acc / per_row(count.clamp(min=1), acc), c_i)
        counts = ctx.steps if ctx.steps is not None else torch.full_like(clients.period, self.local_steps)
        lr = step_size(self, ctx)
        correction = server.c - c_i  # [n, d]: c - c_i
        z = broadcast(server.x, ctx.active.numel())
        for step in range(max_steps(counts)):
            grad = oracle(z, step)
            live = live_mask(counts, step, z)
            acc = torch.where(live, acc + grad, acc)
            z = torch.where(live, z - lr * (grad + correction), z)
        count = count + counts.to(count.dtype)
        after = acc / per_row(count, acc)
        rows = AmplifiedClients(c=c_i, acc=acc, count=count, period=torch.full_like(clients.period, period))
        return rows, AmplifiedMessage(delta_x=z - server.x, delta_c=after - before)

    def server_round(self, server: AmplifiedServer, message: AmplifiedMessage, ctx: RoundContext):
        n = ctx.active.numel()
        x = server.x + message.delta_x.sum(0) / n if n else server.x
        pending = server.pending + message.delta_c.sum(0)
        if (ctx.round + 1) % self._period():
            return AmplifiedServer(x=x, c=server.c, anchor=server.anchor, pending=pending)
        if self.amplification != 1.0:  # gamma = 1 keeps x bit for bit (x_a + (x - x_a) would round)
            x = server.anchor + self.amplification * (x - server.anchor)
        return AmplifiedServer(x=x, c=server.c + pending / ctx.num_clients, anchor=x, pending=torch.zeros_like(pending))

    def communication(self) -> Communication:
        return Communication(down=2, up=2, server_memory=4, client_memory=2)

    def _period(self) -> int:
        return self.period or 1  # prepare() resolves None; an unprepared object runs with P = 1


def participation_period(participation) -> int:
    """P when a SPEC leaves it unset: the participation process's cycle (E for cyclic and reshuffled
    cyclic with E groups, the period of sine), 1 for a process without one and for participation
    nobody drew (None: a federation of whoever answers)."""
    cycle = getattr(participation, "cycle", None)
    return (cycle() if cycle is not None else None) or 1


def check_period(name: str, period) -> None:
    """ConfigError unless ``period`` is None (the participation's cycle) or an integer >= 1."""
    if period is not None and (not isinstance(period, int) or isinstance(period, bool) or period < 1):
        raise ConfigError(f"{name}: period must be an integer >= 1, got {period!r}")


def _roll_over(clients: AmplifiedClients, period: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(c_i, acc_i, k_i) at the start of this round: gradients of an earlier period become c_i (the
    server folded them into c at that period's end) and the sums start again."""
    earlier = clients.period < period
    mean = clients.acc / per_row(clients.count.clamp(min=1), clients.acc)
    c_i = torch.where(_rows(earlier & (clients.count > 0), clients.acc), mean, clients.c)
    acc = torch.where(_rows(earlier, clients.acc), torch.zeros_like(clients.acc), clients.acc)
    count = torch.where(earlier, torch.zeros_like(clients.count), clients.count)
    return c_i, acc, count


def _rows(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A bool [n] as [n, 1, ...], broadcastable to ``like``."""
    return mask.view(-1, *([1] * (like.dim() - 1)))

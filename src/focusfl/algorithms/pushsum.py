"""Push-sum FL (experimental): column-stochastic mixing with scalar weights, no tracking.

Source: the FOCUS authors' answer to a reviewer (seed 003; ALGORITHMS.md section 2, last
paragraph), after gradient-push (Nedic & Olshevsky, 2016). Every node keeps a mass z (a vector)
and a weight w (a scalar); its model is x = z / w. Mass only moves along column-stochastic
matrices, so sum_i z_i changes only by the gradient steps and sum_i w_i = N + 1 forever.
Matrix form (focusfl.matrix.engines.pushsum_matrix), per round r:
    pull  (t = 0):       z <- C_pull(S_r) z, w <- C_pull(S_r) w
    steps (t = 1..tau):  z <- z - eta D(S_r) grad f(z / w)
    push  (closes tau):  z <- C_push(S_r) z, w <- C_push(S_r) w
Per client (what each side stores and sends):
    server stores (z_0, w_0); client i stores (z_i, w_i), w_i > 0 always.
    pull:  the server sends (pull / N) * (z_0, w_0) to each active client (1 vector + 1 scalar)
           and keeps 1 - pull * |S_r| / N of it; the client ADDS it to its own mass.
    local: tau steps  z_i <- z_i - eta grad f_i(z_i / w_i)  (a step of eta / w_i in x).
    push:  the client sends push * (z_i, w_i) (1 vector + 1 scalar) and keeps the rest.
    server model: z_0 / w_0.
The share sent to each client is pull / N, not pull / |S_r|: a client learns only whether it
takes part, not how many others do, and the share must not depend on that.

Measured behaviour (NOT exact with a constant step). ``focusfl run --algorithm pushsum --problem
ridge:dim=10,samples=50,hetero=1 --participation P --rounds 4000 --lr LR`` (16 clients, tau = 1,
L = 2013), last-round rel_error for LR = 2.5e-4 / 1.25e-4:
    full       0.0867 / 0.0483   (halves with the step: an O(eta) fixed-point error, as for
                                  decentralized gradient descent with a constant step)
    uniform    0.0995 / 0.0620
    bernoulli  0.143  / 0.127    (barely moves with the step: a client's gradient enters the
                                  network's mass each time it takes part, so the drift is roughly
                                  sum_i p_i grad f_i; the averaged iterate is closer to
                                  argmin sum_i p_i f_i than to x*)
The weights w_i do not encode participation rates (all clients reach the same w_i), so they do not
correct the bias. tests/test_pushsum.py asserts exactly this behaviour; ``pushsum_tracking``
adds gradient tracking and is exact.

A short client (tau_i < tau steps, RoundContext.steps) takes tau_i local steps on its mass and
then pulls and pushes as any other: the natural choice (there is no paper), and the mixing is
untouched, so sum_i w_i = N + 1 and the mass balance hold whatever each client did; only
D(S_r) in the matrix form becomes per-client (tau_i gradient steps on row i).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import torch

from ..errors import ConfigError
from .base import Algorithm, Communication, RoundContext, State, StateSize, live_mask, max_steps, step_size


class PushSumServer(NamedTuple):
    z: torch.Tensor  # [d] mass
    w: torch.Tensor  # [] weight


class PushSumClients(NamedTuple):
    z: torch.Tensor  # [N, d] mass
    w: torch.Tensor  # [N] weight


class PushSumMessage(NamedTuple):
    z: torch.Tensor  # [n, d] pushed share of the mass
    w: torch.Tensor  # [n] pushed share of the weight


def check_fraction(name: str, field: str, value: float) -> None:
    """A share strictly between 0 and 1: w stays positive at every node (x = z / w)."""
    if not (isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 < value < 1.0):
        raise ConfigError(f"{name}: {field} must be in (0, 1), got {value!r}")


def pull_share(pull: float, ctx: RoundContext) -> float:
    """Fraction of the server's mass each active client receives."""
    return pull / ctx.num_clients


def server_keep(pull: float, ctx: RoundContext) -> float:
    """Fraction of its mass the server keeps after the pull of this round's active clients."""
    return 1.0 - pull * ctx.active.numel() / ctx.num_clients


@dataclass(frozen=True)
class PullPushShares(Algorithm):
    """Base of the push-sum algorithms. ``pull``: total share of the server's mass handed out
    when all clients are active; ``push``: share of its mass an active client returns."""

    experimental: ClassVar[bool] = True

    pull: float = 0.5
    push: float = 0.5

    def validate(self) -> None:
        check_fraction(self.name, "pull", self.pull)
        check_fraction(self.name, "push", self.push)


@dataclass(frozen=True)
class PushSum(PullPushShares):
    """Push-sum FL (experimental), no tracking."""

    name = "pushsum"
    summary = "[experimental] push-sum over column-stochastic matrices; inexact with a constant step"
    partial_work = True

    def state_size(self, num_clients: int, dim: int) -> StateSize:
        return StateSize(floats=dim + 1 + num_clients * (dim + 1))  # (z, w) at the server and each client

    def init(self, x0: torch.Tensor, num_clients: int) -> State:
        ones = x0.new_ones(num_clients)
        server = PushSumServer(z=x0.clone(), w=x0.new_ones(()))
        return State(server, PushSumClients(z=x0.expand(num_clients, *x0.shape).clone(), w=ones))

    def client_round(self, server: PushSumServer, clients: PushSumClients, oracle, ctx: RoundContext):
        share = pull_share(self.pull, ctx)
        z = clients.z + share * server.z
        w = clients.w + share * server.w
        lr = step_size(self, ctx)
        if ctx.steps is None:
            for step in range(self.local_steps):
                z = z - lr * oracle(z / w[:, None], step)
        else:  # client k stops after ctx.steps[k] steps: one batched loop, finished rows kept
            for step in range(max_steps(ctx.steps)):
                z = torch.where(live_mask(ctx.steps, step, z), z - lr * oracle(z / w[:, None], step), z)
        kept = PushSumClients(z=(1.0 - self.push) * z, w=(1.0 - self.push) * w)
        return kept, PushSumMessage(z=self.push * z, w=self.push * w)

    def server_round(self, server: PushSumServer, message: PushSumMessage, ctx: RoundContext):
        keep = server_keep(self.pull, ctx)
        return PushSumServer(z=keep * server.z + message.z.sum(0), w=keep * server.w + message.w.sum(0))

    def model(self, state: State) -> torch.Tensor:
        return state.server.z / state.server.w

    def communication(self) -> Communication:
        # Scalars (w) are not counted: a vector is d floats.
        return Communication(down=1, up=1, server_memory=1, client_memory=1)

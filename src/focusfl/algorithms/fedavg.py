"""FedAvg with local SGD and a server step size (McMahan et al., 2017).

As written in ALGORITHMS.md section 2 (FOCUS paper, section 3): every active client pulls x_r
and takes tau steps z = z - eta * grad f_i(z); the server moves along the average update
    x_{r+1} = x_r + gamma * sum_{i in S_r} w_i (z_i - x_r)
with weights
    "active":  w_i = 1/|S_r|         (plain model averaging when gamma = 1)
    "all":     w_i = 1/N
    "known_p": w_i = 1/(N p_i)       (unbiased when the participation rates p_i are known)
An empty round leaves x unchanged. Under non-uniform participation the "active" weighting
drives x towards argmin sum_i q_i f_i with q_i = E[1{i in S}/|S|] instead of the minimizer of
F (FOCUS paper, Theorem 3), and local steps add client drift.

A short client (tau_i < tau steps, RoundContext.steps) does as published: it simply takes its
tau_i steps and sends z_i - x_r, which the server averages as any other update. Its update is
then about tau_i/tau as long, so FedAvg drifts towards the step-weighted objective
sum_i q_i tau_i f_i (Wang et al., 2020); FedNova (fednova.py) normalizes that away.
"""
from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass
from typing import NamedTuple

import torch

from ..errors import ConfigError
from .base import (Algorithm, Communication, RoundContext, State, StateSize, Step, broadcast, descend, descend_,
                   live_mask, max_steps, step_size)

WEIGHTINGS = ("active", "all", "known_p")


class ModelServer(NamedTuple):
    x: torch.Tensor  # [d]


class NoClientState(NamedTuple):
    """FedAvg clients keep nothing between rounds (an empty [N, 0] placeholder)."""

    empty: torch.Tensor


class ModelDelta(NamedTuple):
    delta: torch.Tensor  # [n, d] z_i - x_r


def local_sgd(
    x: torch.Tensor, n: int, oracle, lr: Step, steps: int, counts: torch.Tensor | None = None
) -> torch.Tensor:
    """tau plain local gradient steps from x for n clients at once: returns z [n, d].

    ``counts`` (int64 [n], each in 1..tau): client k stops after counts[k] steps; all clients
    run in one batched loop of max(counts) steps and a finished client's row is kept as is.
    """
    z = broadcast(x, n)
    if counts is not None:
        for step in range(max_steps(counts)):
            z = torch.where(live_mask(counts, step, z), descend(z, oracle(z, step), lr), z)
        return z
    for step in range(steps):
        # In place once z is this round's own tensor (one pass over [n, d] instead of three).
        z = descend(z, oracle(z, step), lr) if step == 0 else descend_(z, oracle(z, step), lr)
    return z


def no_client_state(x0: torch.Tensor, num_clients: int) -> NoClientState:
    return NoClientState(empty=x0.new_zeros((num_clients, 0)))


def checked_rates(name: str, p) -> tuple[float, ...]:
    """The participation rates of a SPEC's ``p`` as a tuple of floats in (0, 1]."""
    # A SPEC gives one number or a ';' list; anything else (a word, a flag) is one line, not a ValueError.
    rates = list(p) if isinstance(p, (list, tuple)) else [p]
    if not all(isinstance(v, numbers.Real) and not isinstance(v, bool) and 0 < v <= 1 for v in rates):
        raise ConfigError(f"{name}: p must be rates in (0, 1], one per client separated by ';', got {p!r}")
    return tuple(float(v) for v in rates)


def known_rates(name: str, p, problem, participation) -> tuple[float, ...]:
    """weighting=known_p's rates: ``p`` as given, else the participation process's nominal ones."""
    if p is None:
        nominal = participation.nominal_p() if participation is not None else None
        if nominal is None:
            raise ConfigError(f"{name}: weighting=known_p needs p, and the participation process has no nominal rates")
        p = tuple(float(v) for v in nominal)
    if len(p) != problem.num_clients:
        raise ConfigError(f"{name}: p has {len(p)} entries for {problem.num_clients} clients")
    return p


@dataclass(frozen=True)
class FedAvg(Algorithm):
    name = "fedavg"
    summary = "local SGD + model averaging; biased under non-uniform participation"
    partial_work = True

    server_lr: float = 1.0
    weighting: str = "active"
    # Participation rates for weighting="known_p"; filled from the participation process's
    # nominal rates by prepare() when not given.
    p: tuple[float, ...] | None = None

    def validate(self) -> None:
        self._check_positive("server_lr", self.server_lr)
        if self.weighting not in WEIGHTINGS:
            raise ConfigError(
                f"fedavg: weighting must be one of {', '.join(WEIGHTINGS)}, got {self.weighting!r}"
            )
        if self.p is not None:
            object.__setattr__(self, "p", checked_rates("fedavg", self.p))

    def prepare(self, problem, participation, *, seed: int | None = None) -> "FedAvg":
        if self.weighting != "known_p":
            return self
        # replace keeps the class: fedavg_known_p stays itself
        return dataclasses.replace(self, p=known_rates("fedavg", self.p, problem, participation))

    def state_size(self, num_clients: int, dim: int) -> StateSize:
        return StateSize(floats=dim)  # x; clients keep nothing

    def init(self, x0, num_clients):
        return State(ModelServer(x=x0.clone()), no_client_state(x0, num_clients))

    def client_round(self, server, clients, oracle, ctx):
        z = local_sgd(server.x, ctx.active.numel(), oracle, step_size(self, ctx), self.local_steps, ctx.steps)
        return clients, ModelDelta(delta=z - server.x)

    def _weights(self, ctx: RoundContext, like: torch.Tensor) -> torch.Tensor:
        n = ctx.active.numel()
        if self.weighting == "active":
            return like.new_full((n,), 1.0 / n)
        if self.weighting == "all":
            return like.new_full((n,), 1.0 / ctx.num_clients)
        p = like.new_tensor(self.p).index_select(0, ctx.active)
        return 1.0 / (ctx.num_clients * p)

    def server_round(self, server, message, ctx):
        if ctx.active.numel() == 0:
            return server
        weights = self._weights(ctx, message.delta)
        step = (weights[:, None] * message.delta).sum(0)
        return ModelServer(x=server.x + self.server_lr * step)

    def communication(self):
        return Communication(down=1, up=1, server_memory=1, client_memory=0)

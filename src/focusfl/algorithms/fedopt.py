"""FedAdam, FedYogi and FedAdagrad: FedAvg's clients with an adaptive server optimizer.

Paper: Reddi, Charles, Zaheer, Garrett, Rush, Konečný, Kumar and McMahan, "Adaptive Federated
Optimization" (ICLR 2021), Algorithm 2. One implementation; the three names differ only in the
second-moment rule (``rule``).

Every active client pulls x_r, takes tau local SGD steps and pushes z_i - x_r (1 vector each
way). The server keeps x, the first moment m (0 at first) and the second moment v (tau_a^2 at
first: the paper asks v_{-1} >= tau_a^2 and this is its smallest choice), all [d]:
    Delta_r = (1/|S_r|) sum_{i in S_r} (z_i - x_r)
    m_r = beta1 * m_{r-1} + (1 - beta1) * Delta_r
    FedAdagrad:  v_r = v_{r-1} + Delta_r^2
    FedYogi:     v_r = v_{r-1} - (1 - beta2) * Delta_r^2 * sign(v_{r-1} - Delta_r^2)
    FedAdam:     v_r = beta2 * v_{r-1} + (1 - beta2) * Delta_r^2
    x_{r+1} = x_r + eta_s * m_r / (sqrt(v_r) + tau_a)
(squares, roots and divisions elementwise). ``server_lr`` is eta_s, ``tau`` the adaptivity
tau_a (not the local steps). As in the paper there is no bias correction of m and v.
Convention: an empty round changes nothing (no Delta_r to take a moment of).

Near a fixed point Delta_r -> 0, so sqrt(v_r) -> 0 for FedAdam and FedYogi and the server step
tends to eta_s / tau_a times Delta_r (the normalization fades). Where that gain is too large,
Delta_r grows back and v with it, so the step stays bounded by about eta_s: the iterate hovers at a
distance of that order instead of diverging; a smaller eta_s settles (measured on the suite's
ridge, eta_s up to 0.3: FedAdam and FedYogi end on FedAvg's plateau). ``--schedule`` scales the
clients' steps only. FedAdagrad's v only grows, so its steps shrink.

A short client (tau_i < tau steps, RoundContext.steps) takes its tau_i local steps and pushes its
update, averaged as any other (FedAvg's treatment, fedavg.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from ..errors import ConfigError
from .base import Algorithm, Communication, RoundContext, State, StateSize
from .fedavg import ModelDelta, no_client_state
from .fedavgm import local_updates, mean_update


class AdaptiveServer(NamedTuple):
    x: torch.Tensor  # [d] server model
    m: torch.Tensor  # [d] first moment of Delta_r
    v: torch.Tensor  # [d] second moment (Adagrad: sum of squares)


def _second_moment(rule: str, v: torch.Tensor, square: torch.Tensor, beta2: float) -> torch.Tensor:
    if rule == "adagrad":
        return v + square
    if rule == "yogi":
        return v - (1 - beta2) * square * torch.sign(v - square)
    return beta2 * v + (1 - beta2) * square  # adam


def _check_unit(name: str, field: str, value) -> None:
    if not (isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1):
        raise ConfigError(f"{name}: {field} must be a number in [0, 1), got {value!r}")


@dataclass(frozen=True)
class FedAdagrad(Algorithm):
    """The adaptive server optimizer of Reddi et al.; subclasses name another second-moment rule."""

    name = "fedadagrad"
    summary = "FedAvg clients, Adagrad on the server (Reddi et al. 2021); 1 down, 1 up"
    partial_work = True
    in_paper_figure = False  # a baseline of the registry, not of the FOCUS paper's Figure 4
    rule = "adagrad"  # the second-moment rule; a plain class attribute (not a SPEC key)

    server_lr: float = 0.3  # Adagrad's steps shrink as v grows: a larger eta_s than Adam's
    beta1: float = 0.9
    tau: float = 1e-3  # the adaptivity tau_a (not the local steps)

    def validate(self) -> None:
        self._check_positive("server_lr", self.server_lr)
        self._check_positive("tau", self.tau)
        _check_unit(self.name, "beta1", self.beta1)
        _check_unit(self.name, "beta2", self._beta2())

    def _beta2(self) -> float:
        return getattr(self, "beta2", 0.0)  # Adagrad has none

    def state_size(self, num_clients: int, dim: int) -> StateSize:
        return StateSize(floats=3 * dim)  # x, m, v; clients keep nothing

    def init(self, x0: torch.Tensor, num_clients: int) -> State:
        server = AdaptiveServer(x=x0.clone(), m=torch.zeros_like(x0), v=torch.full_like(x0, self.tau ** 2))
        return State(server, no_client_state(x0, num_clients))

    def client_round(self, server, clients, oracle, ctx: RoundContext):
        return local_updates(self, server, clients, oracle, ctx)

    def server_round(self, server: AdaptiveServer, message: ModelDelta, ctx: RoundContext) -> AdaptiveServer:
        if ctx.active.numel() == 0:
            return server
        delta = mean_update(message)
        m = self.beta1 * server.m + (1 - self.beta1) * delta
        v = _second_moment(self.rule, server.v, delta * delta, self._beta2())
        x = server.x + self.server_lr * m / (v.sqrt() + self.tau)
        return AdaptiveServer(x=x, m=m, v=v)

    def communication(self) -> Communication:
        return Communication(down=1, up=1, server_memory=3, client_memory=0)


@dataclass(frozen=True)
class FedAdam(FedAdagrad):
    name = "fedadam"
    summary = "FedAvg clients, Adam on the server without bias correction (Reddi et al. 2021); 1 down, 1 up"
    rule = "adam"

    server_lr: float = 0.1
    beta2: float = 0.99


@dataclass(frozen=True)
class FedYogi(FedAdam):
    name = "fedyogi"
    summary = "FedAvg clients, Yogi on the server (Reddi et al. 2021); 1 down, 1 up"
    rule = "yogi"

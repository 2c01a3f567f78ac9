"""ProxSkip / Scaffnew, mapped onto communication rounds and partial participation.

Paper: Mishchenko, Malinovsky, Stich and Richtarik, "ProxSkip: Yes! Local Gradient Steps
Provably Lead to Communication Acceleration! Finally!" (ICML 2022), Algorithm 2 (Scaffnew,
ProxSkip applied to consensus); as written in ALGORITHMS.md section 4.

Scaffnew, every iteration, every client: xh_i = x_i - gamma * (g_i(x_i) - h_i); with
probability p (one coin shared by all) communicate: x_i = mean_j (xh_j - (gamma/p) h_j),
otherwise x_i = xh_i; then h_i += (p/gamma) (x_i - xh_i). h_i changes only when the coin says
communicate, so the iterations between two communications are plain corrected local steps.

Our round structure: ONE ROUND = ONE COMMUNICATION. Round r, every active client i
    z = x_i (its copy of the last average it took part in; x_0 at first)
    T_r times: z = z - gamma * (grad f_i(z) - h_i)          (xh_i = z at the end)
    push w_i = xh_i - (gamma/p) h_i                          (1 vector up)
Server:  x_{r+1} = mean over S_r of w_i                      (an empty round keeps x)
Active clients then receive x_{r+1} (1 vector down) and set h_i += (p/gamma)(x_{r+1} - xh_i),
x_i = x_{r+1}. Absent clients do nothing and keep (x_i, h_i), as for every baseline here.

- p = 1/local_steps. By default T_r = local_steps in every round (communication every 1/p
  iterations, as the FOCUS authors' notebook runs it). With ``random_steps`` T_r is the
  geometric number of iterations until Scaffnew's coin says communicate (mean 1/p), drawn
  from focusfl.rng keyed by (coin seed, round), so every engine and client sees the same T_r.
  The coin seed defaults to the run's seed.
- ``pull``: active clients start from the current server model instead of their own copy
  (2 vectors down: the pull and the new average).

Partial participation: Scaffnew's paper has none, so ``partial`` picks an adaptation (all three
are Scaffnew under full participation, where sum_j h_j = 0; docs/algorithms.md measures each):
- ``shifted`` (default): the upload is Scaffnew's xh_i - (gamma/p) h_i and the server averages it
  over S_r. (x*, h_i = grad f_i(x*)) is NOT a fixed point: the average is
  x* - (gamma/p) mean_{S_r} grad f_i(x*), off x* whenever the active clients' gradients at x*
  do not cancel. It plateaus.
- ``plain``: the upload is xh_i and the server averages it over S_r; h_i updates as above. Then
  sum_{S_r} (x_{r+1} - xh_i) = 0, so sum_j h_j = 0 is kept in every round, and
  (x*, grad f_i(x*)) is a fixed point for every active set. Measured exact under uniform,
  weighted, Bernoulli and Markov participation; it plateaus under cyclic participation.
- ``deferred``: the FOCUS authors' ridge notebook (BichengYing/FedASL, figures/focus.ipynb).
  An active client first applies the control update of its PREVIOUS participation against the
  server model it pulls NOW, h_i += (p/gamma)(x_r - xh_i) (xh_i: where its last local steps
  ended, x_0 at first), then takes T_r steps from x_r and uploads xh_i; the server averages over
  S_r (1 vector each way; ``pull`` is implied). The h update uses a model the client did not average into, so
  sum_j h_j drifts from 0 whenever the server moved while a client was away; (x*, grad f_i(x*))
  is still a fixed point, but the measured runs leave it (the "ProxSkip diverges" of the FOCUS
  paper's Figure 4 under partial participation).
The FOCUS paper's Figure 4 draws this algorithm against communication counted twice per round
(two vectors, as SCAFFOLD), although one vector goes each way.

A short client (tau_i < tau iterations, RoundContext.steps) takes its tau_i corrected steps
and uploads from where it stopped (xh_i = z after tau_i steps); the upload, the server and the
control update h_i += (p/gamma)(x_{r+1} - xh_i) are unchanged, p = 1/tau included: Scaffnew's
dual update does not depend on how many iterations preceded the communication (under its
coin the count is random anyway), so a short client is a client whose coin came up early.
With ``random_steps`` the coin already draws every round's count T_r (possibly above tau), so a
work process other than fixed is refused there (check_work) rather than combined with it.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import NamedTuple

import torch

from ..errors import ConfigError
from ..rng import uniform
from .base import Algorithm, Communication, RoundContext, State, StateSize, live_mask, max_steps, step_size
from .fedavg import ModelServer

# Third coordinate of the coin's hash: keeps the coin apart from every other keyed draw.
_COIN_STREAM = 0x50534B50


class ProxClients(NamedTuple):
    x: torch.Tensor  # [N, d] x_i: the last average received (xh_i between round and finish)
    h: torch.Tensor  # [N, d] control variates h_i (sum over clients 0 under full participation)


class ProxMessage(NamedTuple):
    upload: torch.Tensor  # [n, d] xh_i - (gamma/p) h_i (partial="shifted"), else xh_i


PARTIAL = ("shifted", "plain", "deferred")


@dataclass(frozen=True)
class ProxSkip(Algorithm):
    """Scaffnew: ``lr`` is gamma, p = 1/``local_steps``."""

    name = "proxskip"
    exact_at_full = True  # drift-corrected: exact under full participation (focusfl check)
    summary = "ProxSkip/Scaffnew: control variates h_i, one communication per round (p = 1/tau)"
    partial_work = True

    random_steps: bool = False
    pull: bool = False
    coin_seed: int | None = None
    partial: str = "shifted"  # adaptation to partial participation (module docstring)

    def validate(self) -> None:
        if self.partial not in PARTIAL:
            raise ConfigError(f"proxskip: partial must be one of {', '.join(PARTIAL)}, got {self.partial!r}")
        for field in ("random_steps", "pull"):
            if not isinstance(getattr(self, field), bool):
                raise ConfigError(f"proxskip: {field} must be true or false, got {getattr(self, field)!r}")
        seed = self.coin_seed
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ConfigError(f"proxskip: coin_seed must be a non-negative integer, got {seed!r}")

    @property
    def p(self) -> float:
        """Communication probability of Scaffnew's coin."""
        return 1.0 / self.local_steps

    def prepare(self, problem, participation, *, seed: int | None = None) -> "ProxSkip":
        """The coin's seed, unless the SPEC gives one, is the run's ``seed`` (else the
        participation process's, which the run's seed made): every engine and every node of a
        federation then draws the same T_r. Neither given is an error, never a silent 0."""
        if self.coin_seed is not None:
            return self
        if seed is None:
            seed = getattr(participation, "seed", None)
        if seed is None:
            raise ConfigError("proxskip: its coin needs the run's seed (prepare(..., seed=S)) or a coin_seed")
        return dataclasses.replace(self, coin_seed=int(seed))

    def steps_this_round(self, round_: int) -> int:
        """T_r: local iterations until the coin says communicate (inclusive)."""
        if not self.random_steps or self.local_steps == 1:
            return self.local_steps
        u = float(uniform(self.coin_seed or 0, round_, _COIN_STREAM))
        # Inverse CDF of the geometric law on {1, 2, ...} with success probability p.
        return 1 + int(math.floor(math.log1p(-u) / math.log1p(-self.p)))

    def round_steps(self, ctx: RoundContext) -> int:
        return self.steps_this_round(ctx.round) if ctx.steps is None else super().round_steps(ctx)

    def check_work(self, ctx: RoundContext) -> None:
        """Refuse step counts with ``random_steps``: the coin draws the local steps already."""
        if ctx.steps is not None and self.random_steps:
            raise ConfigError("proxskip: random_steps draws the local steps already; use a fixed work process with it")
        super().check_work(ctx)

    def state_size(self, num_clients: int, dim: int) -> StateSize:
        return StateSize(floats=dim + 2 * num_clients * dim)  # x; each x_i, h_i

    def init(self, x0: torch.Tensor, num_clients: int) -> State:
        clients = ProxClients(
            x=x0.expand(num_clients, *x0.shape).clone(),
            h=torch.zeros_like(x0).expand(num_clients, *x0.shape).clone(),
        )
        return State(ModelServer(x=x0.clone()), clients)

    def client_round(self, server: ModelServer, clients: ProxClients, oracle, ctx: RoundContext):
        lr = step_size(self, ctx)
        h = clients.h
        if self.partial == "deferred":  # last participation's control update, against x_r
            h = h + step_size(self, ctx, lambda lr: self.p / lr) * (server.x - clients.x)
        z = server.x.expand_as(clients.x) if self.pull or self.partial == "deferred" else clients.x
        if ctx.steps is None:
            for step in range(self.steps_this_round(ctx.round)):
                z = z - lr * (oracle(z, step) - h)
        else:  # client k stops after ctx.steps[k] iterations: one batched loop, finished rows kept
            for step in range(max_steps(ctx.steps)):
                z = torch.where(live_mask(ctx.steps, step, z), z - lr * (oracle(z, step) - h), z)
        upload = z - step_size(self, ctx, lambda lr: lr / self.p) * h if self.partial == "shifted" else z
        # Rows hold xh_i until client_finish, which needs it for the h update.
        return ProxClients(x=z, h=h), ProxMessage(upload=upload)

    def server_round(self, server: ModelServer, message: ProxMessage, ctx: RoundContext) -> ModelServer:
        n = ctx.active.numel()
        if n == 0:
            return server
        return ModelServer(x=message.upload.sum(0) / n)

    def client_finish(self, server: ModelServer, clients: ProxClients, ctx: RoundContext) -> ProxClients:
        if self.partial == "deferred":  # keeps xh_i; the control update waits for the next pull
            return clients
        lr = self.lr * ctx.lr_scale
        average = server.x.expand_as(clients.x)
        h = clients.h + (self.p / lr) * (average - clients.x)
        return ProxClients(x=average.clone(), h=h)

    def communication(self) -> Communication:
        down = 2 if self.pull and self.partial != "deferred" else 1
        return Communication(down=down, up=1, server_memory=1, client_memory=2)

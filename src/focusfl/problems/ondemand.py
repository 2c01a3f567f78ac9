"""Cross-device convex problems whose clients are made on demand, with a planted exact optimum.

``ondemand_logistic`` and ``ondemand_ridge`` hold no client data: client i's samples are made from
(seed, i) when a round (or an evaluation) needs them, so setting one up costs the same at N = 10
and N = 10^6 and a round costs what its active clients cost.

Client i's m samples. A pool P of ``pool`` rows ~ N(0, I/d) is drawn once from the seed (the only
data kept: pool x d floats). Sample k of client i is

    a_ik = s_ik ((P[j_ik] + P[j'_ik]) / sqrt(2) + hetero * P[u_i])

with the pool rows j_ik, j'_ik, u_i and the scale s_ik ~ U(0.5, 1) hashed from (seed, i, k)
(focusfl.rng), so every engine, chunk and evaluation sees the same sample. ||a_ik|| is about 1.

The objective and its optimum. A planted x* ~ N(0, 4 I) is drawn from the seed, and every client
gets a zero-sum offset delta_i = hetero/4 (P[v_i] - P[v_{i+1 mod N}]) (the sum over all N clients
telescopes to exactly 0):

- ``ondemand_ridge``: f_i(x) = (1/m) ||A_i (x - x*)||^2 + reg ||x - x*||^2 - delta_i^T (x - x*);
- ``ondemand_logistic``: labels b_ik = sign(a_ik^T w_i + noise * eps_ik) of a client teacher
  w_i = x* + 2 hetero xi_i (xi_i, eps_ik ~ N(0, 1) from the pool), and
  f_i(x) = (1/m) sum_k log(1 + exp(-b_ik a_ik^T x)) + reg ||x||^2 - t_i^T x with the tilt
  t_i = grad l_i(x*) + 2 reg x* + delta_i (l_i the logistic term, computed on the client's samples
  whenever the client is made).

Both give grad f_i(x*) = -delta_i, so grad F(x*) = -(1/N) sum_i delta_i = 0: x* is the exact
minimizer of F = (1/N) sum_i f_i (F is strongly convex for reg > 0), known for any N in O(d),
which is how ``rel_error`` is exact at N = 10^6. The clients differ (hetero): each one's own
minimizer is x* moved by its offset and curvature.

Evaluation. ``rel_error`` = ||x - x*|| / ||x*|| (exact). ``loss`` and ``grad_norm`` are those of
the average over the first ``eval_clients`` clients (all of them when N is no larger; default
1,000): clients are exchangeable by construction, so that is an unbiased sample of F, and an
evaluation costs the same at any N above it. (ridge: F(x*) = 0, so its loss over all clients is
F(x) - F(x*).)

Step sizes. Every a_ik has norm at most (sqrt(2) + hetero) R, R the largest pool row's norm, so
L = 2 (sqrt(2) + hetero)^2 R^2 + 2 reg bounds every client's (and every minibatch's) curvature for
ridge, a quarter of the first term for logistic: ``--lr auto`` uses these bounds, which need no
client data.
"""
from __future__ import annotations

import abc
import math
from typing import Any, ClassVar

import numpy as np
import torch

from ..errors import ConfigError
from ..limits import check_allocation
from ..rng import hash_bits, minibatch_indices, uniform
from .base import Problem, relative_error

# Salts (last hash coordinate) of the per-client draws.
_ROW_A, _ROW_B, _SCALE, _SHIFT, _OFFSET, _TEACHER, _NOISE = range(0x51, 0x58)
# Features made at once per oracle (elements): the vectorized engine takes the clients in chunks
# whose samples fit in a core's L2 cache (2 MiB in float64), so that making and using them stays
# in cache (on a 2-core Xeon: 1000 clients of 32 x 200 made in 75 ms in such chunks, 340 ms at once).
_CHUNK_ELEMENTS = 1 << 18


def _pool_rows(seed: int, count: int, dim: int) -> np.ndarray:
    return np.random.default_rng(np.random.SeedSequence([seed, 71])).standard_normal((count, dim)) / math.sqrt(dim)


class OnDemandProblem(Problem, abc.ABC):
    """Shared machinery: the pool, clients made from (seed, client), planted optimum, metrics."""

    name: ClassVar[str]
    negative_loss: ClassVar[str] = (
        "loss is F(x) over the evaluation clients; its linear term -t_i^T x (which plants x* as the exact "
        "optimum) makes it negative at times: it is not a distance to the optimum (rel_error is; "
        "docs/cli.md, problems)")
    defaults: ClassVar[dict[str, Any]] = {
        "clients": 10_000,
        "samples": 32,
        "dim": 100,
        "reg": 0.01,
        "hetero": 0.5,
        "batch": 0,
        "pool": 16_384,
        "eval_clients": 1_000,
        "seed": 0,
    }

    def __init__(self, *, dtype=torch.float64, device="cpu", **params: Any) -> None:
        p = {**self.defaults, **params}
        self._validate(p)
        self.params = p
        self.num_clients, self.samples, self.dim = int(p["clients"]), int(p["samples"]), int(p["dim"])
        self.reg, self.hetero, self.seed = float(p["reg"]), float(p["hetero"]), int(p["seed"])
        self.batch = int(p["batch"]) or None
        self.eval_count = min(self.num_clients, int(p["eval_clients"]))
        self.dtype, self.device = dtype, torch.device(device)
        itemsize = torch.empty((), dtype=dtype).element_size()
        check_allocation(int(p["pool"]) * self.dim * (8 + itemsize),
                         f"{self.name}: a pool of {int(p['pool']):,} rows x {self.dim:,} features", error=ConfigError)
        pool = _pool_rows(self.seed, int(p["pool"]), self.dim)
        self._pool_norm = float(np.sqrt(np.square(pool).sum(1)).max())
        self.pool = torch.as_tensor(pool, dtype=dtype, device=self.device)
        planted = np.random.default_rng(np.random.SeedSequence([self.seed, 72])).standard_normal(self.dim) * 2.0
        self._x_star = torch.as_tensor(planted, dtype=dtype, device=self.device)

    def _validate(self, p: dict[str, Any]) -> None:
        where = f"problem {self.name!r}"
        for key in ("clients", "samples", "dim", "pool", "eval_clients"):
            value = p[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{where}: {key} must be an integer >= 1, got {value!r}")
        if p["clients"] >= 2**31:
            raise ConfigError(f"{where}: clients must be below 2**31, got {p['clients']}")
        for key in ("reg", "hetero") + tuple(k for k in ("noise",) if k in p):
            value = p[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
                raise ConfigError(f"{where}: {key} must be a number >= 0, got {value!r}")
        if not p["reg"] > 0:
            raise ConfigError(f"{where}: reg must be > 0 (it makes the planted optimum the only one)")
        batch = p["batch"]
        if isinstance(batch, bool) or not isinstance(batch, int) or not 0 <= batch <= p["samples"]:
            raise ConfigError(f"{where}: batch must be in 0..samples={p['samples']} (0 = full batch), got {batch!r}")
        if not isinstance(p["seed"], int) or isinstance(p["seed"], bool) or p["seed"] < 0:
            raise ConfigError(f"{where}: seed must be an integer >= 0, got {p['seed']!r}")

    # -- clients made on demand ------------------------------------------------------------------
    def _pick(self, *coords: Any) -> torch.Tensor:
        """Pool rows hashed from (seed, client, ...)."""
        return hash_bits(self.seed, *coords, device=self.device) % self.pool.shape[0]

    def features(self, clients: torch.Tensor) -> torch.Tensor:
        """The clients' samples a_ik, [n, m, d]."""
        c = clients[:, None]
        k = torch.arange(self.samples, device=self.device)[None, :]
        rows = self.pool[self._pick(c, k, _ROW_A)]  # this round's own tensor: updated in place
        rows += self.pool[self._pick(c, k, _ROW_B)]
        scale = 0.5 + 0.5 * uniform(self.seed, c, k, _SCALE, device=self.device, dtype=self.dtype)
        if self.hetero:
            shift = self.pool[self._pick(clients, _SHIFT)] * (self.hetero * math.sqrt(2.0))
            rows += shift[:, None, :]
        return rows.mul_((scale * (1.0 / math.sqrt(2.0)))[:, :, None])

    def offsets(self, clients: torch.Tensor) -> torch.Tensor:
        """delta_i = hetero/4 (P[v_i] - P[v_{i+1 mod N}]), [n, d]: zero in sum over all clients."""
        following = (clients + 1) % self.num_clients
        own = self.pool[self._pick(clients, _OFFSET)]
        return (0.25 * self.hetero) * (own - self.pool[self._pick(following, _OFFSET)])

    @property
    def x_star(self) -> torch.Tensor:
        return self._x_star

    @property
    def client_chunk(self) -> int | None:
        return max(1, _CHUNK_ELEMENTS // (self.samples * self.dim))

    def _bound(self) -> float:
        """The largest squared norm any sample can have."""
        return ((math.sqrt(2.0) + self.hetero) * self._pool_norm) ** 2

    # -- gradients -------------------------------------------------------------------------------
    @abc.abstractmethod
    def _made(self, clients: torch.Tensor) -> dict[str, torch.Tensor]:
        """What the clients' gradients need, made once per oracle (features, labels, tilts)."""

    @abc.abstractmethod
    def _gradients(self, z: torch.Tensor, made: dict[str, torch.Tensor], picks: torch.Tensor | None) -> torch.Tensor:
        """grad f_i at z [n, d] (``picks``: minibatch sample indices [n, b], or None: all samples)."""

    @abc.abstractmethod
    def _losses(self, x: torch.Tensor, made: dict[str, torch.Tensor]) -> torch.Tensor:
        """f_i(x) for the made clients, [n]."""

    def oracle(self, clients: torch.Tensor, *, seed: int, round: int, steps: int | None = None):
        made = self._made(clients)
        sizes = torch.full((clients.numel(),), self.samples, device=self.device)

        def gradients(z: torch.Tensor, step: int) -> torch.Tensor:
            picks = None if self.batch is None else minibatch_indices(seed, round, clients, step, self.batch, sizes)
            return self._gradients(z, made, picks)

        return gradients

    def client_gradients(self, x, clients, *, seed, round, step):
        return self.oracle(clients, seed=seed, round=round)(x, step)

    # -- evaluation over the evaluation clients ----------------------------------------------------
    def _evaluation_chunks(self):
        step = self.client_chunk
        for lo in range(0, self.eval_count, step):
            yield torch.arange(lo, min(self.eval_count, lo + step), device=self.device)

    def _evaluate(self, x: torch.Tensor, *, loss: bool = True, gradient: bool = True):
        """(F_E(x), grad F_E(x)) over the evaluation clients, their samples made once for both."""
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        grads = torch.zeros(self.dim, dtype=torch.float64, device=self.device)
        for clients in self._evaluation_chunks():
            made = self._made(clients)
            if loss:
                total += self._losses(x, made).to(torch.float64).sum()
            if gradient:
                grads += self._gradients(x.expand(clients.numel(), -1), made, None).to(torch.float64).sum(0)
        return (total / self.eval_count).to(self.dtype), (grads / self.eval_count).to(self.dtype)

    def loss(self, x: torch.Tensor) -> torch.Tensor:
        return self._evaluate(x, gradient=False)[0]

    def gradient(self, x: torch.Tensor) -> torch.Tensor:
        return self._evaluate(x, loss=False)[1]

    def metrics(self, x: torch.Tensor) -> dict[str, float]:
        value, grad = self._evaluate(x)
        return {"loss": float(value), "grad_norm": float(torch.linalg.vector_norm(grad)),
                "rel_error": relative_error(x, self._x_star)}

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, **self.params}


def _subset(tensor: torch.Tensor, picks: torch.Tensor | None) -> torch.Tensor:
    """Rows ``picks`` [n, b] of each client's samples ([n, m, ...]); all of them for None."""
    if picks is None:
        return tensor
    if tensor.dim() == 2:
        return torch.gather(tensor, 1, picks)
    return torch.gather(tensor, 1, picks[:, :, None].expand(-1, -1, tensor.shape[2]))


class OnDemandRidge(OnDemandProblem):
    """f_i(x) = (1/m) ||A_i (x - x*)||^2 + reg ||x - x*||^2 - delta_i^T (x - x*) (module docstring)."""

    name = "ondemand_ridge"

    def _made(self, clients):
        return {"features": self.features(clients), "offsets": self.offsets(clients)}

    def _gradients(self, z, made, picks):
        features = _subset(made["features"], picks)
        moved = z - self._x_star
        residual = torch.bmm(features, moved.unsqueeze(-1))  # [n, b, 1]
        data = torch.bmm(residual.transpose(1, 2), features).squeeze(1) * (2.0 / features.shape[1])
        return data + (2.0 * self.reg) * moved - made["offsets"]

    def _losses(self, x, made):
        moved = x - self._x_star
        residual = made["features"] @ moved  # [n, m]
        return residual.square().mean(1) + self.reg * (moved @ moved) - made["offsets"] @ moved

    def smoothness(self) -> float:
        return 2.0 * self._bound() + 2.0 * self.reg


class OnDemandLogistic(OnDemandProblem):
    """Tilted logistic regression with labels from client teachers (module docstring)."""

    name = "ondemand_logistic"
    defaults = {**OnDemandProblem.defaults, "noise": 0.5}

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.noise = float(self.params["noise"])

    def labels(self, clients: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """b_ik = sign(a_ik^T w_i + noise eps_ik) in {-1, 1}, [n, m]."""
        scale = math.sqrt(self.dim)
        teacher = self._x_star + (2.0 * self.hetero * scale) * self.pool[self._pick(clients, _TEACHER)]
        clean = torch.bmm(features, teacher.unsqueeze(-1)).squeeze(-1)
        if self.noise:
            k = torch.arange(self.samples, device=self.device)[None, :]
            cells = hash_bits(self.seed, clients[:, None], k, _NOISE, device=self.device) % self.pool.numel()
            clean = clean + (self.noise * scale) * self.pool.reshape(-1)[cells]
        return torch.where(clean >= 0, 1.0, -1.0).to(self.dtype)

    def _data_gradients(self, z, features, labels):
        """Mean over the given samples of the logistic term's gradient, [n, d]."""
        margins = labels * torch.bmm(features, z.unsqueeze(-1)).squeeze(-1)
        weights = -labels * torch.sigmoid(-margins)
        return torch.bmm(weights.unsqueeze(1), features).squeeze(1) / features.shape[1]

    def _made(self, clients):
        features = self.features(clients)
        labels = self.labels(clients, features)
        at_optimum = self._data_gradients(self._x_star.expand(clients.numel(), -1), features, labels)
        tilt = at_optimum + (2.0 * self.reg) * self._x_star + self.offsets(clients)
        return {"features": features, "labels": labels, "tilt": tilt}

    def _gradients(self, z, made, picks):
        data = self._data_gradients(z, _subset(made["features"], picks), _subset(made["labels"], picks))
        return data + (2.0 * self.reg) * z - made["tilt"]

    def _losses(self, x, made):
        margins = made["labels"] * (made["features"] @ x)
        return torch.nn.functional.softplus(-margins).mean(1) + self.reg * (x @ x) - made["tilt"] @ x

    def smoothness(self) -> float:
        return 0.25 * self._bound() + 2.0 * self.reg

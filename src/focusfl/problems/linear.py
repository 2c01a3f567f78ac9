"""Convex problems on per-client linear models: ridge and logistic regression.

Both share the data layout (every client holds ``samples`` rows of dimension ``dim``), the
parameter names (``clients``, ``samples``, ``dim``, ``reg``, ``noise``, ``hetero``, ``batch``,
``seed``) and the minibatch machinery; they differ in the per-sample loss.
"""
from __future__ import annotations

import abc
import math
from typing import Any, ClassVar

import numpy as np
import torch

from ..errors import ConfigError
from ..limits import check_allocation
from ..rng import minibatch_indices
from .base import Problem, RunsOracle, relative_error


def _rows_times(features: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """[n, b, d] x [n, d] -> [n, b]: each client's samples against its own point (bmm is
    several times faster than the equivalent einsum on CPU)."""
    return torch.bmm(features, x.unsqueeze(-1)).squeeze(-1)


def _weighted_rows(features: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """[n, b, d] x [n, b] -> [n, d]: sum_k weights[:, k] * features[:, k, :]."""
    return torch.bmm(weights.unsqueeze(1), features).squeeze(1)


def client_rows(table: torch.Tensor, clients: torch.Tensor, every_client: bool) -> torch.Tensor:
    """The rows of ``clients`` of an [N, ...] table; ``every_client``: the caller knows they are
    every client in order (a run's full round), so the table itself serves, not a copy of it."""
    return table if every_client else table.index_select(0, clients)


# Per-chunk data budget of the vectorized engine on CPU (measured best on a 2-core Xeon with
# 2 MiB of L2 per core: smaller chunks pay more per-op overhead, larger ones miss the cache).
CACHE_BUDGET_BYTES = 1 << 21


def _generator(seed: int, stream: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, stream]))


def synthetic_linear_data(
    clients: int, samples: int, dim: int, noise: float, hetero: float, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Features ``[N, m, d]``, noiseless targets ``[N, m]`` and noise ``[N, m]``.

    As in the FOCUS authors' ridge notebook, each row is a standard Gaussian scaled by a
    factor drawn from U(0.5, 1), and all clients share one ground-truth model x_o.
    ``hetero`` > 0 makes the clients differ: client i's ground truth is x_o + hetero * xi_i
    and its features are shifted by hetero * mu_i (both standard Gaussian per client), so
    both its optimum and its curvature move away from the others'.
    """
    gen = _generator(seed, 1)
    scale = gen.uniform(0.5, 1.0, size=(clients, samples, 1))
    features = scale * gen.standard_normal((clients, samples, dim))
    x_o = gen.standard_normal(dim)
    model_shift = gen.standard_normal((clients, dim))
    feature_shift = gen.standard_normal((clients, 1, dim))
    features = features + hetero * feature_shift
    models = x_o[None, :] + hetero * model_shift
    clean = np.einsum("imd,id->im", features, models)
    return features, clean, noise * gen.standard_normal((clients, samples))


class LinearModelProblem(Problem, abc.ABC):
    """Shared machinery: validation, minibatches, metrics over a stack of client datasets."""

    name: ClassVar[str]
    defaults: ClassVar[dict[str, Any]] = {
        "clients": 16,
        "samples": 100,
        "dim": 100,
        "reg": 0.01,
        "noise": 0.1,
        "hetero": 0.0,
        "batch": 0,
        "seed": 0,
    }

    def __init__(self, *, dtype=torch.float64, device="cpu", **params: Any):
        p = {**self.defaults, **params}
        self._validate(p)
        self.params = p
        self.num_clients = int(p["clients"])
        self.samples = int(p["samples"])
        self.dim = int(p["dim"])
        self.reg = float(p["reg"])
        self.batch = int(p["batch"]) or None
        self.dtype = dtype
        self.device = torch.device(device)
        check_allocation(self._memory_bytes(), self._memory_subject(), error=ConfigError)
        try:
            features, targets = self._make_data(p)
        except MemoryError:  # the check above leaves room only for what it counted
            raise ConfigError(f"{self._memory_subject()}: out of memory while generating the data") from None
        self.features = torch.as_tensor(features, dtype=dtype, device=self.device)
        self.targets = torch.as_tensor(targets, dtype=dtype, device=self.device)
        self.sizes = torch.full((self.num_clients,), self.samples, device=self.device)
        self._x_star = self._solve()
        if not bool(torch.isfinite(self._x_star).all()):  # data beyond the dtype's range (hetero=1e300)
            raise ConfigError(f"{self._memory_subject()}: its minimizer is not finite in {str(dtype)[6:]} "
                              f"(reg={p['reg']:g}, noise={p['noise']:g}, hetero={p['hetero']:g}: too large)")

    def _validate(self, p: dict[str, Any]) -> None:
        where = f"problem {self.name!r}"
        for key in ("clients", "samples", "dim"):
            if p[key] < 1:
                raise ConfigError(f"{where}: {key} must be >= 1, got {p[key]}")
        for key in ("reg", "noise", "hetero"):
            if not math.isfinite(p[key]) or p[key] < 0:  # nan < 0 is False: said apart
                raise ConfigError(f"{where}: {key} must be >= 0 (a finite number), got {p[key]}")
        if not 0 <= p["batch"] <= p["samples"]:
            raise ConfigError(
                f"{where}: batch must be in 0..samples={p['samples']} (0 = full batch), got {p['batch']}"
            )

    def _memory_bytes(self) -> int:
        """Peak bytes of building the data: the float64 features twice while they are generated
        (the scaled and the shifted copy), their copy in the problem's dtype, and a few
        per-sample vectors (scales, targets, noise)."""
        cells = self.num_clients * self.samples * self.dim
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return cells * (2 * 8 + itemsize) + 5 * 8 * self.num_clients * self.samples

    def _memory_subject(self) -> str:
        return (
            f"{self.name} problem: {self.num_clients:,} clients x {self.samples:,} samples"
            f" x {self.dim:,} features"
        )

    @abc.abstractmethod
    def _make_data(self, p: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        """Features [N, m, d] and targets [N, m] as numpy arrays."""

    @abc.abstractmethod
    def _solve(self) -> torch.Tensor:
        """The exact minimizer of F."""

    @property
    def x_star(self) -> torch.Tensor:
        return self._x_star

    def _client_bytes(self) -> int:
        """Bytes of one client's data that every local step reads."""
        return self.samples * self.dim * self.features.element_size()

    @property
    def client_chunk(self) -> int | None:
        if self.device.type != "cpu":
            return None  # accelerators want the largest batch
        return max(1, CACHE_BUDGET_BYTES // self._client_bytes())

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, **self.params}

    # -- gradients ---------------------------------------------------------------------------
    @abc.abstractmethod
    def _sample_weights(self, products: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Each sample's weight in the data term's gradient, from its product a^T x with the
        point: the gradient over samples is sum_k weight_k a_k (scaled by the caller)."""

    @abc.abstractmethod
    def _data_loss(self, products: torch.Tensor) -> torch.Tensor:
        """The data term of F from every sample's product a^T x ([N, m])."""

    def _sample_gradients(self, x: torch.Tensor, features: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean over the given samples of the data term's gradient: x [n, d] (each client's own
        point), features [n, b, d], targets [n, b] -> [n, d]. Scaled by the caller."""
        weights = self._sample_weights(_rows_times(features, x), targets)
        return _weighted_rows(features, weights) / features.shape[1]

    @abc.abstractmethod
    def _full_data_scale(self) -> float:
        """Factor turning the mean sample gradient into the client's data-term gradient."""

    def client_gradients(self, x, clients, *, seed, round, step):
        return self.oracle(clients, seed=seed, round=round)(x, step)

    def oracle(self, clients: torch.Tensor, *, seed: int, round: int, steps: int | None = None):
        return self._oracle(clients, seed=seed, round=round, every_client=False)

    def _oracle(self, clients: torch.Tensor, *, seed: int, round: int, every_client: bool):
        """:meth:`oracle`; ``every_client``: ``clients`` are known to be every client in order."""
        features = client_rows(self.features, clients, every_client)
        targets = client_rows(self.targets, clients, every_client)
        sizes = client_rows(self.sizes, clients, every_client)
        scale = self._full_data_scale()

        def gradients(z: torch.Tensor, step: int) -> torch.Tensor:
            if self.batch is None:
                data_grad = self._sample_gradients(z, features, targets)
            else:
                picks = minibatch_indices(seed, round, clients, step, self.batch, sizes)
                batch_features = torch.gather(
                    features, 1, picks[:, :, None].expand(-1, -1, self.dim)
                )
                batch_targets = torch.gather(targets, 1, picks)
                data_grad = self._sample_gradients(z, batch_features, batch_targets)
            return scale * data_grad + 2.0 * self.reg * z

        return gradients

    def runs_oracle(self, segments, *, round: int, steps: int | None = None):
        if self.batch is not None:
            return super().runs_oracle(segments, round=round, steps=steps)
        sizes = [int(part.numel()) for part, _ in segments]
        if all(size == self.num_clients for size in sizes):
            # Every run asks every client (a run's active set is sorted and distinct, so N of them
            # are all, in order): each run's rows against the data as it is, one product a run,
            # instead of a stacked copy of R runs' data (or Hessians) every round; each as alone.
            return RunsOracle([self._oracle(part, seed=0, round=round, every_client=True) for part, _ in segments],
                              sizes)
        # Exact gradients do not depend on the seed: one oracle serves every run's rows, each row
        # computed by the same batched product as alone (a client's rows do not interact).
        clients = torch.cat([part for part, _ in segments])
        return RunsOracle([self.oracle(clients, seed=0, round=round, steps=steps)], sizes)

    def smoothness(self) -> float:
        """L: max_i of the largest Hessian eigenvalue of what client i steps on (computed once,
        in float64). With full batches that is f_i: its data term's curvature is
        ``_curvature_scale() * sigma_max(A_i)^2``. With minibatches of b of its m rows the client
        steps on the unbiased estimate (m/b) sum_{k in B}, whose Hessian is larger: for every
        minibatch B, lambda_max(A_B^T A_B) <= min(sigma_max(A_i)^2, the sum of the b largest
        ||a_k||^2), so ``_curvature_scale() * (m/b) * that`` bounds them all (a minibatch of 10 of
        100 rows is up to 10x as curved as f_i: full-batch steps made SG-FOCUS diverge)."""
        if getattr(self, "_smoothness", None) is None:
            features = self.features.to(torch.float64)
            if self.batch is None or self.batch >= self.samples:
                top = torch.linalg.svdvals(features)[:, 0].max()
                self._smoothness = self._curvature_scale() * float(top) ** 2 + 2.0 * self.reg
            else:
                squared = torch.linalg.svdvals(features)[:, 0].square()
                largest_rows = features.square().sum(-1).topk(self.batch, dim=1).values.sum(1)
                worst = torch.minimum(squared, largest_rows).max()
                self._smoothness = self._curvature_scale() * (self.samples / self.batch) * float(worst) \
                    + 2.0 * self.reg
        return self._smoothness

    @abc.abstractmethod
    def _curvature_scale(self) -> float:
        """Largest Hessian eigenvalue of the data term per unit of sigma_max(A_i)^2."""

    # F and its gradient at one point: every sample's product with x as ONE matrix-vector product
    # over all N*m samples (a row computed both from it: the batched one-column product the clients'
    # own points need cost about 4x as much here), then the gradient's weighted sums per client.
    def _products(self, x: torch.Tensor) -> torch.Tensor:
        return self.features @ x

    def _gradient_from(self, x: torch.Tensor, products: torch.Tensor) -> torch.Tensor:
        weights = self._sample_weights(products, self.targets)
        data_grad = _weighted_rows(self.features, weights) / self.samples
        return self._full_data_scale() * data_grad.mean(0) + 2.0 * self.reg * x

    def loss(self, x: torch.Tensor) -> torch.Tensor:
        return self._data_loss(self._products(x)) + self.reg * (x @ x)

    def gradient(self, x: torch.Tensor) -> torch.Tensor:
        return self._gradient_from(x, self._products(x))

    def metrics(self, x: torch.Tensor) -> dict[str, float]:
        products = self._products(x)  # shared by the loss and the gradient: a row's main cost
        row = {"loss": float(self._data_loss(products) + self.reg * (x @ x)),
               "grad_norm": float(torch.linalg.vector_norm(self._gradient_from(x, products))),
               "rel_error": relative_error(x, self.x_star)}
        return row


class Ridge(LinearModelProblem):
    """Ridge regression of the FOCUS paper, section 5 (Figure 4).

    f_i(x) = sum_k (a_ik^T x - b_ik)^2 + reg * ||x||^2,  F(x) = (1/N) sum_i f_i(x).
    Defaults: 16 clients, 100 samples each, d = 100, reg = 0.01. The exact minimizer solves
    (sum_i A_i^T A_i + N reg I) x = sum_i A_i^T b_i.
    Stochastic gradients (batch = b > 0): (m / b) sum_{k in B} 2 a_k (a_k^T x - b_k) + 2 reg x,
    an unbiased estimate of grad f_i.
    """

    name = "ridge"

    def _make_data(self, p):
        features, clean, noise = synthetic_linear_data(
            p["clients"], p["samples"], p["dim"], p["noise"], p["hetero"], p["seed"]
        )
        return features, clean + noise

    def _solve(self) -> torch.Tensor:
        a = self.features.reshape(-1, self.dim)
        b = self.targets.reshape(-1)
        lhs = a.T @ a + self.num_clients * self.reg * torch.eye(
            self.dim, dtype=self.dtype, device=self.device
        )
        return torch.linalg.solve(lhs, a.T @ b)

    def _full_data_scale(self) -> float:
        return 2.0 * self.samples

    def _curvature_scale(self) -> float:
        return 2.0  # Hessian 2 A_i^T A_i + 2 reg I

    def _oracle(self, clients: torch.Tensor, *, seed: int, round: int, every_client: bool):
        if self.batch is not None:
            return super()._oracle(clients, seed=seed, round=round, every_client=every_client)
        # Exact gradients in Hessian form, (2 A_i^T A_i + 2 reg I) z - 2 A_i^T b_i: one fused
        # batched product per local step (A_i is samples x dim, the Hessian dim x dim).
        hessians, minus_linears = self._quadratic_form()
        client_hessians = client_rows(hessians, clients, every_client)
        minus_linear = client_rows(minus_linears, clients, every_client).unsqueeze(1)

        def gradients(z: torch.Tensor, step: int) -> torch.Tensor:
            # z^T H rather than H z (equal: H is symmetric): the row-vector form of the batched
            # product runs about twice as fast on CPU.
            return torch.baddbmm(minus_linear, z.unsqueeze(1), client_hessians).squeeze(1)

        return gradients

    def _client_bytes(self) -> int:
        if self.batch is not None:
            return super()._client_bytes()
        return self.dim * self.dim * self.features.element_size()  # the Hessian

    def _memory_bytes(self) -> int:
        if self.batch is not None:
            return super()._memory_bytes()
        # Exact gradients keep every client's d x d Hessian (built on first use, counted now).
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return super()._memory_bytes() + self.num_clients * self.dim * self.dim * itemsize

    def _memory_subject(self) -> str:
        if self.batch is not None or self.dim <= self.samples:  # the features dominate
            return super()._memory_subject()
        return f"{super()._memory_subject()} (and {self.num_clients:,} Hessians of {self.dim:,} x {self.dim:,})"

    def _quadratic_form(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-client Hessians 2 A_i^T A_i + 2 reg I [N, d, d] and -2 A_i^T b_i [N, d], built on
        first use."""
        if getattr(self, "_hessians", None) is None:
            eye = torch.eye(self.dim, dtype=self.dtype, device=self.device)
            self._hessians = 2.0 * torch.bmm(self.features.transpose(1, 2), self.features) + 2.0 * self.reg * eye
            self._minus_linear = -2.0 * _weighted_rows(self.features, self.targets)
        return self._hessians, self._minus_linear

    def _sample_weights(self, products, targets):
        return products - targets  # the residual

    def _data_loss(self, products):
        residual = products - self.targets
        return (residual**2).sum() / self.num_clients


class Logistic(LinearModelProblem):
    """l2-regularized logistic regression with labels +-1 and heterogeneous clients.

    f_i(x) = (1/m) sum_k log(1 + exp(-b_ik a_ik^T x)) + reg * ||x||^2,  F = (1/N) sum_i f_i.
    Labels are sign(a^T x_o,i + noise * eps) with the same features and ground-truth models as
    ridge (``hetero`` moves each client's model and features). The exact minimizer comes from
    Newton's method, run until the gradient norm is below 1e-12.
    """

    name = "logistic"
    defaults = {**LinearModelProblem.defaults, "dim": 20, "noise": 0.5, "hetero": 0.5}

    def _make_data(self, p):
        features, clean, noise = synthetic_linear_data(
            p["clients"], p["samples"], p["dim"], p["noise"], p["hetero"], p["seed"]
        )
        labels = np.where(clean + noise >= 0, 1.0, -1.0)
        return features, labels

    def _full_data_scale(self) -> float:
        return 1.0

    def _curvature_scale(self) -> float:
        return 1.0 / (4.0 * self.samples)  # sigmoid' <= 1/4, averaged over m samples

    def _sample_weights(self, products, targets):
        return -targets * torch.sigmoid(-(targets * products))

    def _data_loss(self, products):
        return torch.nn.functional.softplus(-(self.targets * products)).mean()

    def _solve(self) -> torch.Tensor:
        # Newton's method in float64 whatever the problem's dtype: float32 cannot reach a
        # gradient norm of 1e-12, and x* must be exact to that for the relative error to mean
        # anything. The minimizer is then cast to the problem's dtype.
        a = self.features.to(torch.float64).reshape(-1, self.dim)
        b = self.targets.to(torch.float64).reshape(-1)
        eye = torch.eye(self.dim, dtype=torch.float64, device=self.device)
        x = torch.zeros(self.dim, dtype=torch.float64, device=self.device)
        for _ in range(100):
            margins = b * (a @ x)
            # gradient of F = mean over all samples (clients hold equal counts) + 2 reg x
            grad = a.T @ (-b * torch.sigmoid(-margins)) / a.shape[0] + 2.0 * self.reg * x
            if float(torch.linalg.vector_norm(grad)) < 1e-12:
                break
            s = torch.sigmoid(margins)
            hessian = a.T @ ((s * (1 - s) / a.shape[0])[:, None] * a) + 2.0 * self.reg * eye
            x = x - torch.linalg.solve(hessian, grad)
        else:
            raise ConfigError("logistic: Newton's method did not reach a gradient norm of 1e-12")
        return x.to(self.dtype)

"""SG-FOCUS as the FOCUS authors run it, re-created from reading their code, against focusfl's.

The authors' PyTorch code (github.com/BichengYing/FedASL, ``FedASL/client.py`` and
``FedASL/server.py``: ``FedASLClient``, ``FedASLServer``) keeps one ``nn.Module`` per client and
one for the server and loops over the round's clients in Python. Their structure, as we read it
(this module is written from that reading, not copied):

- a client keeps ``grad_prev``, the gradient of its last local step (0 before it ever trained);
- ``local_update(lr, tau)``: y = 0; for k = 0..tau-1: if k > 0, x <- x - lr * y; g = the
  gradient of the client's loss at x on its next batch; y <- y + g - grad_prev; grad_prev <- g;
- ``push_step()`` returns y;
- the server: skip a round with no participant; every participant pulls the server model,
  runs ``local_update`` and the server adds its y to its own running sum Y; then
  x <- x - lr * Y.

:func:`compare` runs that loop and focusfl's SG-FOCUS (through the one builder, runs/driver.py)
side by side on the same problem, initial model, clients' data and participation masks, in
float64 with full-batch gradients (the batch at least every client's size: the authors' data
loader then yields all of a client's samples at every step, in an order the mean loss ignores),
and returns the largest relative gap between their server models over the rounds. A per-client
Python loop is the point here: it is the authors' structure, not a hot path.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..problems import make_problem
from ..problems.models import make_model
from ..runs.config import RunConfig
from ..runs.driver import build, execute


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _set_flat(model: nn.Module, flat: torch.Tensor) -> None:
    with torch.no_grad():
        start = 0
        for p in model.parameters():
            p.copy_(flat[start:start + p.numel()].view_as(p))
            start += p.numel()


class AuthorsClient:
    """One client of the authors' loop: its own model copy, its data and its last gradient."""

    def __init__(self, model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor) -> None:
        self.model, self.inputs, self.labels = model, inputs, labels
        self.grad_prev: torch.Tensor | float = 0.0

    def pull(self, server: nn.Module) -> None:
        _set_flat(self.model, _flat(server))

    def gradient(self) -> torch.Tensor:
        self.model.zero_grad(set_to_none=True)
        F.cross_entropy(self.model(self.inputs), self.labels).backward()
        return torch.cat([p.grad.reshape(-1) for p in self.model.parameters()])

    def local_update(self, lr: float, local_steps: int) -> torch.Tensor:
        y: torch.Tensor | float = 0.0
        for k in range(local_steps):
            if k > 0:
                _set_flat(self.model, _flat(self.model) - lr * y)
            grad = self.gradient()
            y = y + grad - self.grad_prev
            self.grad_prev = grad
        return y


class AuthorsServer:
    """The authors' server: a running sum of the pushed y, one step on it per non-empty round."""

    def __init__(self, model: nn.Module, clients: list[AuthorsClient]) -> None:
        self.model, self.clients = model, clients
        self.y: torch.Tensor | float = 0.0

    def train_one_step(self, lr: float, local_steps: int, active: list[int]) -> None:
        if not active:
            return
        for i in active:
            client = self.clients[i]
            client.pull(self.model)
            self.y = self.y + client.local_update(lr, local_steps)
        _set_flat(self.model, _flat(self.model) - lr * self.y)


@dataclass(frozen=True)
class LoopComparison:
    """The largest ||x_focusfl - x_authors|| over the rounds relative to how far the authors' model
    moved from its start (||x_authors - x_0||: a gap on that scale is a different trajectory, not
    rounding), and what was run."""

    max_relative_gap: float
    rounds: int
    clients: int
    participants: int  # client rounds in all
    parameters: int
    model: str


def comparison_config(data: str, *, clients: int = 6, rounds: int = 12, local_steps: int = 3, lr: float = 0.002,
                      model: str = "focus-cnn", alpha: float = 0.5, seed: int = 0,
                      participation: str | None = None) -> RunConfig:
    """focusfl's side: SG-FOCUS skipping empty rounds as the authors' server does, float64, a
    batch larger than any client (full-batch gradients), the digits in ``data``; participation:
    Bernoulli with rates 0.3, 0.5, 0.7, 0.9, 0.4, 0.6, ... unless given."""
    if participation is None:
        rates = (0.3, 0.5, 0.7, 0.9, 0.4, 0.6)
        participation = "bernoulli:p=" + ";".join(f"{rates[i % len(rates)]:g}" for i in range(clients))
    problem = {"name": "nn", "data": data, "model": model, "clients": clients, "partition": "dirichlet",
               "alpha": alpha, "min_size": 10, "batch": 32, "test_fraction": 0.2}
    # The largest client's share (the partition does not depend on the batch): a batch that large
    # is every client's whole share at every step, and no larger than memory checks allow.
    problem["batch"] = max(32, int(make_problem(problem, dtype=torch.float64).sizes.max()))
    return RunConfig(algorithm={"name": "sg_focus", "skip_empty": True}, problem=problem, participation=participation,
                     rounds=rounds, local_steps=local_steps, lr=lr, dtype="float64", seed=seed, eval_every=rounds)


def authors_side(problem, x0: torch.Tensor, model: str) -> AuthorsServer:
    """The authors' objects on focusfl's problem: one model per client and the server's, all
    starting at ``x0``; each client's full (standardised) training data."""
    def fresh() -> nn.Module:
        module = make_model(model, problem.input_shape, problem.num_classes).to(problem.dtype)
        _set_flat(module, x0)
        return module

    clients = []
    for i in range(problem.num_clients):
        client = torch.tensor([i], device=problem.client_order.device)
        ids = problem.sample_ids(client, torch.arange(int(problem.sizes[i]), device=client.device)[None, :])[0]
        clients.append(AuthorsClient(fresh(), problem.inputs(problem.train_images[ids]), problem.train_labels[ids]))
    return AuthorsServer(fresh(), clients)


def compare(config: RunConfig) -> LoopComparison:
    """Run ``config`` (from :func:`comparison_config`) in focusfl and in the authors' loop."""
    built = build(config)
    problem, algorithm = built.problem, built.algorithm
    model = config.problem["model"]
    masks = built.participation.mask(config.rounds)
    ours: list[torch.Tensor] = []
    execute(built, keep_rows=False, on_round=lambda result: ours.append(result.state.server.x.clone()))
    x0 = problem.initial_point()
    server = authors_side(problem, x0, model)
    gaps = []
    for r in range(config.rounds):
        server.train_one_step(algorithm.lr, algorithm.local_steps, [int(i) for i in masks[r].nonzero()[0]])
        theirs = _flat(server.model)
        moved = float((theirs - x0).norm())
        gaps.append(float((ours[r] - theirs).norm()) / moved if moved > 0 else 0.0)
    return LoopComparison(max(gaps), config.rounds, problem.num_clients, int(masks.sum()), problem.dim, model)

"""SG-FOCUS training throughput on CNNs: vectorized engine vs a plain-PyTorch loop vs centralized SGD.

Three ways to process the same samples, timed side by side in one run (samples per second,
counting every sample of every local step):

- vectorized: focusfl's vectorized engine runs SG-FOCUS rounds; all active clients' local steps
  are batched tensor work (for these nn.Sequential CNNs the grouped-weights path of
  focusfl.problems.client_batched).
- reference: SG-FOCUS written as one would in plain PyTorch: one nn.Module (with nn.Dropout),
  clients in turn, each loading the server model, taking tau steps of forward/backward, and
  the server aggregating the pushed vectors.
- centralized: minibatch SGD on the same model with the same number of samples per step
  (all active clients' minibatches as one batch), in the default NCHW memory layout and in
  channels-last (often faster for convolutions on CPU); the faster of the two is the practical
  limit that vec/central compares with.

Models: the MNIST CNN of the FedSUM paper (1x28x28) and the FOCUS paper's CIFAR-10 CNN
(3x32x32); synthetic uint8 images (timing only). Settings: 32 clients with 7 active and 100
clients with 10 active per round (uniform sampling keeps the work per round fixed), batch 128,
tau = 3. Every figure is the best of --repeats timed passes (the least disturbed by other
processes), with the three methods interleaved in each pass.

    python benchmarks/nn_throughput.py                  # CPU (and CUDA too when present)
    python benchmarks/nn_throughput.py --threads 2      # more intra-op threads
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from focusfl.algorithms import make_algorithm
from focusfl.data import Dataset, ImageData
from focusfl.engine.simulate import active_sets
from focusfl.engine.vectorized import vectorized_round
from focusfl.participation import make_participation
from focusfl.problems.models import KeyedDropout, make_model
from focusfl.problems.nn import NeuralNetwork

MODELS = {"mnist-cnn": ("fedsum-mnist-cnn", (1, 28, 28)), "cifar10-cnn": ("focus-cnn", (3, 32, 32))}
SETTINGS = [(32, 7), (100, 10)]  # (clients, active per round)
LR = 1e-3


def synthetic_problem(model: str, shape, clients: int, per_client: int, batch: int, device: str) -> NeuralNetwork:
    rng = np.random.default_rng(0)
    total = clients * per_client
    train = ImageData(rng.integers(0, 256, (total, *shape), dtype=np.uint8), rng.integers(0, 10, total))
    test = ImageData(train.images[:64], train.labels[:64])
    return NeuralNetwork(dataset=Dataset("synthetic", train, test, 10), clients=clients, partition="iid",
                         batch=batch, model=model, dtype=torch.float32, device=device)


def plain_model(name: str, shape, device: str) -> nn.Module:
    """The zoo model with ordinary nn.Dropout, as a plain-PyTorch user would have it."""
    model = make_model(name, shape, 10)
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if isinstance(child, KeyedDropout):
                setattr(parent, child_name, nn.Dropout(child.p))
    return model.to(device).train()


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


class Vectorized:
    def __init__(self, problem, actives, tau):
        self.problem, self.actives = problem, actives
        self.algorithm = make_algorithm("sg_focus", lr=LR, local_steps=tau)
        self.state = self.algorithm.init(problem.initial_point(), problem.num_clients)

    def run(self) -> None:
        for r, active in enumerate(self.actives):
            self.state = vectorized_round(self.algorithm, self.state, self.problem, active, r, 0, donate=r > 0)
        float(self.state.server.x.sum())


class PlainLoop:
    """SG-FOCUS, one client after another, on one nn.Module (plain PyTorch)."""

    def __init__(self, problem, actives, tau, name, shape):
        self.problem, self.actives, self.tau = problem, actives, tau
        self.model = plain_model(name, shape, str(problem.device))
        self.params = list(self.model.parameters())
        x0 = torch.nn.utils.parameters_to_vector(self.params).detach()
        self.x, self.y = x0.clone(), torch.zeros_like(x0)
        self.g_prev = torch.zeros(problem.num_clients, x0.numel(), device=x0.device)
        self.generator = torch.Generator(device=problem.device).manual_seed(0)

    def client(self, client: int) -> torch.Tensor:
        p = self.problem
        torch.nn.utils.vector_to_parameters(self.x, self.params)
        u = torch.zeros_like(self.x)
        for _ in range(self.tau):
            picks = torch.randint(int(p.sizes[client]), (p.batch,), device=p.device, generator=self.generator)
            ids = p.sample_ids(torch.tensor([client]), picks[None, :])[0]
            self.model.zero_grad(set_to_none=True)
            F.cross_entropy(self.model(p.inputs(p.train_images[ids])), p.train_labels[ids]).backward()
            grad = torch.cat([q.grad.reshape(-1) for q in self.params])
            u = u + grad - self.g_prev[client]
            self.g_prev[client] = grad
            with torch.no_grad():
                for q, step in zip(self.params, torch.split(u, [q.numel() for q in self.params])):
                    q -= LR * step.view_as(q)
        return u

    def run(self) -> None:
        for active in self.actives:
            pushed = [self.client(c) for c in active.tolist()]
            self.y = self.y + torch.stack(pushed).sum(0) if pushed else self.y
            self.x = self.x - LR * self.y
        float(self.x.sum())


class Centralized:
    """Minibatch SGD on one model, each step on as many samples as a round's clients use."""

    def __init__(self, problem, actives, tau, name, shape, channels_last=False):
        self.problem, self.actives, self.tau = problem, actives, tau
        self.model = plain_model(name, shape, str(problem.device))
        self.layout = torch.channels_last if channels_last else torch.contiguous_format
        self.model = self.model.to(memory_format=self.layout)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=LR)
        self.generator = torch.Generator(device=problem.device).manual_seed(0)

    def run(self) -> None:
        p = self.problem
        for active in self.actives:
            samples = active.numel() * p.batch
            for _ in range(self.tau):
                ids = torch.randint(len(p.train_labels), (samples,), device=p.device, generator=self.generator)
                self.optimizer.zero_grad(set_to_none=True)
                inputs = p.inputs(p.train_images[ids]).contiguous(memory_format=self.layout)
                F.cross_entropy(self.model(inputs), p.train_labels[ids]).backward()
                self.optimizer.step()
        float(next(self.model.parameters()).detach().sum())


def measure(runners: dict, repeats: int, device: str) -> dict[str, float]:
    """Best seconds per pass of each runner, the runners interleaved within every repeat."""
    for runner in runners.values():
        runner.run()  # warm-up: allocations, dropout tables, oneDNN kernels
    best = {name: float("inf") for name in runners}
    for _ in range(repeats):
        for name, runner in runners.items():
            sync(device)
            start = time.perf_counter()
            runner.run()
            sync(device)
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def bench_device(device: str, args) -> None:
    print(f"\n{device}: torch threads={torch.get_num_threads()}, batch={args.batch}, tau={args.tau}, "
          f"{args.rounds} rounds per pass, best of {args.repeats}")
    print(f"{'model':<12} {'N':>4} {'active':>6} {'vectorized':>11} {'reference':>10} {'central NCHW':>13} "
          f"{'central CL':>11} {'vec/ref':>8} {'vec/central':>12}")
    for label, (name, shape) in MODELS.items():
        for clients, active in SETTINGS:
            problem = synthetic_problem(name, shape, clients, args.per_client, args.batch, device)
            mask = make_participation(f"uniform:m={active}", clients, seed=0).mask(args.rounds)
            actives = active_sets(mask, problem.device)
            runners = {
                "vectorized": Vectorized(problem, actives, args.tau),
                "reference": PlainLoop(problem, actives, args.tau, name, shape),
                "centralized": Centralized(problem, actives, args.tau, name, shape),
                "centralized_cl": Centralized(problem, actives, args.tau, name, shape, channels_last=True),
            }
            seconds = measure(runners, args.repeats, device)
            samples = int(mask.sum()) * args.tau * args.batch
            rate = {k: samples / v for k, v in seconds.items()}
            limit = max(rate["centralized"], rate["centralized_cl"])
            print(f"{label:<12} {clients:>4} {active:>6} {rate['vectorized']:>11.0f} {rate['reference']:>10.0f} "
                  f"{rate['centralized']:>13.0f} {rate['centralized_cl']:>11.0f} "
                  f"{rate['vectorized'] / rate['reference']:>8.2f} {rate['vectorized'] / limit:>12.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds per timed pass")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--tau", type=int, default=3)
    parser.add_argument("--per-client", type=int, default=256, help="synthetic samples per client")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (default 1: on a small shared machine spinning "
                             "OpenMP threads slow every method down)")
    parser.add_argument("--devices", nargs="+", default=None, help="default: cpu, and cuda when available")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    devices = args.devices or (["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
    print("samples per second (all clients' local-step samples); ratios measured in this run")
    for device in devices:
        bench_device(device, args)


if __name__ == "__main__":
    main()

"""What client-level DP (--dp, focusfl.privacy) costs per round: the same runs with and without it.

Two workloads on the vectorized engine, one process, the cells interleaved and each the best of
``--repeats`` passes (a shared machine is noisy):

- ridge, N = 1024 clients, d = 100, Bernoulli participation (the FOCUS rate preset), FOCUS;
  DP central with delta (clip, keyed noise on every active client's message, the participation
  counts each round, epsilon at each evaluation every 50 rounds);
- the FOCUS paper's CIFAR-10 round (benchmarks/paper_cifar.py's setting on synthetic images:
  SG-FOCUS, N = 32, tau = 3, batch 128, the 541,094-parameter CNN, crop+flip), the same DP.

    python benchmarks/dp_overhead.py [--ridge-rounds 200] [--cifar-rounds 3] [--repeats 2] [--threads 1]
"""
from __future__ import annotations

import argparse
import time

import torch

from focusfl.algorithms import make_algorithm
from focusfl.engine import simulate
from focusfl.participation import make_participation
from focusfl.privacy import run_privacy
from focusfl.problems import make_problem

DP = "clip=1,noise=1,mode=central,delta=1e-5"


def seconds(algorithm, problem, participation, rounds: int, eval_every: int, dp: str | None) -> float:
    privacy = None if dp is None else run_privacy(dp, algorithm, problem, participation, seed=0, end_round=rounds)
    started = time.perf_counter()
    simulate(algorithm, problem, participation, rounds, eval_every=eval_every, privacy=privacy)
    return time.perf_counter() - started


def ridge(rounds: int):
    problem = make_problem("ridge:clients=1024,dim=100,samples=20", dtype=torch.float64)
    return make_algorithm("focus", lr=1e-5), problem, make_participation("bernoulli", 1024, seed=0), rounds, 50


def cifar(rounds: int, train: int):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from paper_cifar import ALPHA, BATCH, CLIENTS, LR, TAU, synthetic_cifar

    from focusfl.problems.nn import NeuralNetwork

    problem = NeuralNetwork(dataset=synthetic_cifar(train, 1000), model="focus-cnn", clients=CLIENTS, alpha=ALPHA,
                            batch=BATCH, augment="crop-flip")
    algorithm = make_algorithm("sg_focus", lr=LR, local_steps=TAU)
    return algorithm, problem, make_participation("bernoulli", CLIENTS, seed=0), rounds, rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ridge-rounds", type=int, default=200)
    parser.add_argument("--cifar-rounds", type=int, default=3)
    parser.add_argument("--cifar-train", type=int, default=10_000, help="synthetic training images")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    workloads = {"ridge N=1024, FOCUS": ridge(args.ridge_rounds),
                 "CIFAR-10 paper round, SG-FOCUS": cifar(args.cifar_rounds, args.cifar_train)}
    print(f"torch {torch.__version__}, {args.threads} thread(s); --dp {DP}; best of {args.repeats}, interleaved")
    for name, (algorithm, problem, participation, rounds, eval_every) in workloads.items():
        seconds(algorithm, problem, participation, 1, eval_every, DP)  # warm-up (and the accountant's first curve)
        best = {label: float("inf") for label in ("without", "with")}
        for _ in range(args.repeats):
            for label, dp in (("without", None), ("with", DP)):
                best[label] = min(best[label], seconds(algorithm, problem, participation, rounds, eval_every, dp))
        without, with_dp = (1000 * best[k] / rounds for k in ("without", "with"))
        print(f"{name}: {without:.2f} ms/round without DP, {with_dp:.2f} with "
              f"(+{with_dp - without:.2f} ms, {100 * (with_dp / without - 1):+.1f}%) over {rounds} rounds")


if __name__ == "__main__":
    main()

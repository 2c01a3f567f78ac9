"""Batches of runs on the paper's CIFAR workload: focus-cifar10's final runs one at a time and as
one batch of runs, on one device, side by side in one process (issue 41's GPU measurement).

Workload: the preset's final runs (`focusfl reproduce focus-cifar10`: SG-FOCUS, FedAvg, FedAU,
SCAFFOLD and MIFA at eta = 2e-3, tau = 3, under Bernoulli and Markov participation with the FOCUS
presets, over --seeds seeds; 5 x 2 x 3 = 30 runs by default), each --rounds rounds, evaluated every
50 rounds as the preset does, on paper_cifar.py's synthetic CIFAR-shaped data (32 clients,
Dirichlet alpha = 0.05, batch 128, the paper's CNN, crop and flip). The runs go once one at a time
(engine.simulate) and once as one batch (engine.batched.run_batch: the runs of one algorithm run
one client round on their stacked active rows); the rows of both are compared for equality (the
same bytes with any number of batched runs).

    PYTHONPATH=src python benchmarks/batched_nn.py --device cuda            # about a minute on an H100
    PYTHONPATH=src python benchmarks/batched_nn.py --device cpu --small     # tiny: that it runs

The last line, for scripts: ``gpu_speedup=X identical=yes|no device=NAME`` (X: run-rounds per
second batched over one at a time).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from focusfl.algorithms import make_algorithm  # noqa: E402
from focusfl.device import apply_policy, device_policy  # noqa: E402
from focusfl.engine.batched import BatchMember, run_batch  # noqa: E402
from focusfl.engine.simulate import simulate  # noqa: E402
from focusfl.reproduce.reproduce_nn import FOCUS_CIFAR10  # noqa: E402
from focusfl.participation import make_participation  # noqa: E402
from focusfl.problems.nn import NeuralNetwork  # noqa: E402
from paper_cifar import synthetic_cifar  # noqa: E402


def cifar_problem(device: torch.device, small: bool) -> NeuralNetwork:
    """The preset's problem on synthetic data (tiny with ``small``)."""
    spec = FOCUS_CIFAR10.problem
    train, test, clients = (400, 100, 4) if small else (50_000, 10_000, spec["clients"])
    return NeuralNetwork(dataset=synthetic_cifar(train, test), model=spec["model"], clients=clients,
                         alpha=spec["alpha"], batch=32 if small else spec["batch"], augment=spec["augment"],
                         device=device)


def final_runs(problem: NeuralNetwork, rounds: int, seeds: int, eval_every: int) -> list[BatchMember]:
    """The preset's final runs: every algorithm x participation scenario x seed."""
    return [BatchMember(make_algorithm(name, **params), make_participation(spec, problem.num_clients, seed=seed),
                        rounds, seed=seed, eval_every=eval_every)
            for name, params in FOCUS_CIFAR10.algorithms.items()
            for spec in FOCUS_CIFAR10.scenarios.values()
            for seed in range(seeds)]


def seconds(fn, device: torch.device) -> tuple[float, object]:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    value = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start, value


def measure(device_name: str, rounds: int, seeds: int, small: bool) -> tuple[float, bool]:
    """(batched throughput over one at a time, whether every run's rows were equal both ways)."""
    device = torch.device(device_name)
    apply_policy(device_policy(device, True))  # deterministic kernels: what a run uses by default
    problem = cifar_problem(device, small)
    eval_every = FOCUS_CIFAR10.eval_every if rounds > FOCUS_CIFAR10.eval_every else max(1, rounds // 2)
    members = final_runs(problem, rounds, seeds, eval_every)
    # Warm-up: kernels chosen and memory allocated for both forms before either is timed.
    warm = final_runs(problem, 1, 1, 1)
    run_batch(problem, warm)
    simulate(warm[0].algorithm, problem, warm[0].participation, 1, seed=0, eval_every=1)
    alone_s, alone = seconds(lambda: [simulate(m.algorithm, problem, m.participation, rounds, seed=m.seed,
                                               eval_every=m.eval_every).rows for m in members], device)
    batched_s, batched = seconds(lambda: [result.rows for result in run_batch(problem, members)], device)
    return alone_s / batched_s, alone == batched


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--rounds", type=int, default=None, help="rounds a run (default 60; 2 with --small)")
    parser.add_argument("--seeds", type=int, default=None, help="seeds a scenario (default 3; 1 with --small)")
    parser.add_argument("--small", action="store_true", help="tiny sizes: that it runs (a CPU test)")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"batched_nn: torch {torch.__version__} sees no CUDA device; run with --device cpu --small")
        print("gpu_speedup=n/a identical=no device=none")
        return 1
    torch.set_num_threads(1)
    rounds = args.rounds or (2 if args.small else 60)
    seeds = args.seeds or (1 if args.small else 3)
    name = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "cpu"
    speedup, same = measure(args.device, rounds, seeds, args.small)
    runs = len(FOCUS_CIFAR10.algorithms) * len(FOCUS_CIFAR10.scenarios) * seeds
    print(f"{runs} focus-cifar10 runs x {rounds} rounds on {name}: one batch {speedup:.2f}x the throughput of one at "
          f"a time; rows {'identical' if same else 'DIFFERENT'}")
    print(f"gpu_speedup={speedup:.2f} identical={'yes' if same else 'no'} device={name.replace(' ', '_')}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

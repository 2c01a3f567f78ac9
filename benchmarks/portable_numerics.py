"""What the portable numerical environment (focusfl.device.PORTABLE_ENVIRONMENT: ATen's scalar
kernels, MKL_CBWR=COMPATIBLE, oneDNN capped at SSE4.1) costs per round against the CPU's own
kernels (native), side by side in one run.

The environment must be in force before torch loads, so each cell is a fresh process started
in it; the cells alternate (native, portable, native, ...) and each is the best of ``--repeats``
(a shared machine is noisy). One thread in every process, as a run computes by default.

- ridge, N = 1024 clients, d = 100, Bernoulli participation, FOCUS, float64;
- the FOCUS paper's CIFAR-10 round (benchmarks/paper_cifar.py's setting on synthetic images:
  SG-FOCUS, N = 32, tau = 3, batch 128, the 541,094-parameter CNN, crop+flip), float32.

    python benchmarks/portable_numerics.py [--ridge-rounds 200] [--cifar-rounds 1] [--repeats 2]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
_WORKER = """
import json, sys, time
sys.path.insert(0, {here!r})
import torch
torch.set_num_threads(1)
from focusfl.algorithms import make_algorithm
from focusfl.device import numerics
from focusfl.engine import simulate
from focusfl.participation import make_participation
from focusfl.problems import make_problem

def ridge(rounds):
    problem = make_problem("ridge:clients=1024,dim=100,samples=20", dtype=torch.float64)
    return make_algorithm("focus", lr=1e-5), problem, make_participation("bernoulli", 1024, seed=0), rounds

def cifar(rounds):
    from paper_cifar import ALPHA, BATCH, CLIENTS, LR, TAU, synthetic_cifar
    from focusfl.problems.nn import NeuralNetwork
    problem = NeuralNetwork(dataset=synthetic_cifar(CLIENTS * BATCH * 2, 256), model="focus-cnn", clients=CLIENTS,
                            alpha=ALPHA, batch=BATCH, augment="crop-flip")
    return make_algorithm("sg_focus", lr=LR, local_steps=TAU), problem, make_participation("bernoulli", CLIENTS, seed=0), rounds

algorithm, problem, participation, rounds = {workload}({rounds})
simulate(algorithm, problem, participation, 1, eval_every=1)  # warm-up: kernels chosen, caches filled
started = time.perf_counter()
simulate(algorithm, problem, participation, rounds, eval_every=rounds)
print(json.dumps({{"seconds": (time.perf_counter() - started) / rounds, "mode": numerics()["mode"]}}))
"""


def per_round(workload: str, rounds: int, portable: bool) -> float:
    from focusfl.device import PORTABLE_ENVIRONMENT, portable_environment

    bare = {k: v for k, v in os.environ.items() if k not in PORTABLE_ENVIRONMENT}
    environ = portable_environment(bare) if portable else bare
    code = _WORKER.format(here=str(HERE), workload=workload, rounds=rounds)
    done = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True, check=True)
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["mode"] == ("portable" if portable else "native"), result
    return result["seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ridge-rounds", type=int, default=200)
    parser.add_argument("--cifar-rounds", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    print(f"{'workload':<8} {'native s/round':>15} {'portable s/round':>17} {'portable/native':>16}")
    for workload, rounds in (("ridge", args.ridge_rounds), ("cifar", args.cifar_rounds)):
        best = {False: float("inf"), True: float("inf")}
        for _ in range(args.repeats):
            for portable in (False, True):
                best[portable] = min(best[portable], per_round(workload, rounds, portable))
        print(f"{workload:<8} {best[False]:>15.4f} {best[True]:>17.4f} {best[True] / best[False]:>15.2f}x")


if __name__ == "__main__":
    main()

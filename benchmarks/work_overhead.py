"""What per-client step counts cost: the masked local loop against today's loop.

Ridge, 32 clients, d = 500, full participation, tau = 4, one torch thread. For FedAvg and FOCUS,
milliseconds per round with no work process (today's loop), ``rates:r=1`` (every client does
tau steps, but through the masked loop: the price of the masks alone) and ``uniform`` (clients
stop at their own tau_i: max(tau_i) batched steps). Side by side in one process, the cells
interleaved and each the best of ``--repeats`` (one slow pass on a shared machine moved a cell
by 2x).

    python benchmarks/work_overhead.py [--rounds 200] [--repeats 3]
"""
from __future__ import annotations

import argparse
import time

import torch

from focusfl.algorithms import make_algorithm
from focusfl.engine import simulate
from focusfl.participation import make_participation
from focusfl.problems import make_problem
from focusfl.work import make_work

WORK = {"none": None, "rates:r=1": "rates:r=1", "uniform": "uniform"}


def ms_per_round(name: str, work: str | None, rounds: int) -> float:
    problem = make_problem("ridge:clients=32,dim=500,samples=50", dtype=torch.float64)
    participation = make_participation("full", problem.num_clients)
    algorithm = make_algorithm(name, lr=1e-5, local_steps=4)
    process = None if work is None else make_work(work, problem.num_clients, 4, seed=0)
    simulate(algorithm, problem, participation, 5, eval_every=5, work=process)  # warm-up
    started = time.perf_counter()
    simulate(algorithm, problem, participation, rounds, eval_every=rounds, work=process)
    return 1000 * (time.perf_counter() - started) / rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"ridge 32 clients, d=500, tau=4, full participation; ms per round over {args.rounds} rounds")
    print(f"{'algorithm':<10}" + "".join(f"{label:>12}" for label in WORK))
    cells = {(name, label): [] for name in ("fedavg", "focus") for label in WORK}
    for _ in range(args.repeats):
        for name, label in cells:
            cells[name, label].append(ms_per_round(name, WORK[label], args.rounds))
    for name in ("fedavg", "focus"):
        print(f"{name:<10}" + "".join(f"{min(cells[name, label]):>12.2f}" for label in WORK))


if __name__ == "__main__":
    main()

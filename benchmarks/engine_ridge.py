"""FOCUS rounds per second: vectorized engine vs per-client reference loop.

Both engines run the same algorithm (FOCUS, tau = 5, eta = 2e-4) on the paper's ridge problem
(d = 100, 100 samples per client) with the same participation process and seeds, for
N in {16, 256, 1024}; the ratio is measured side by side in one run. Metric evaluation is
left out of the timed loop (it is the same for both engines).

The "floor" column times the least work any engine must do per round in this formulation:
gather the active clients' d x d Hessians (in the vectorized engine's cache-sized chunks) and
multiply each by a vector tau times, with no algorithm around it. ``max ratio`` = reference /
floor bounds what the vectorized engine can reach on this machine: on a CPU these rounds are
bound by memory traffic (80 KB per client in float64), which batching cannot remove.

    python benchmarks/engine_ridge.py                 # CPU, float64
    python benchmarks/engine_ridge.py --device cuda   # on a GPU
"""
from __future__ import annotations

import argparse
import time

import torch

from focusfl.algorithms import make_algorithm
from focusfl.engine.reference import reference_round
from focusfl.engine.simulate import active_sets
from focusfl.engine.vectorized import client_chunks, vectorized_round
from focusfl.participation import make_participation
from focusfl.problems import make_problem


def rounds_per_second(step_round, algorithm, problem, actives, repeats: int) -> float:
    """Best of ``repeats`` passes over the rounds (the least disturbed by other processes)."""
    best = float("inf")
    for _ in range(repeats):
        state = algorithm.init(problem.initial_point(), problem.num_clients)
        if problem.device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for r, active in enumerate(actives):
            state = step_round(algorithm, state, problem, active, r, 0, donate=r > 0)
        float(state.server.x.sum())  # wait for the device
        best = min(best, time.perf_counter() - start)
    return len(actives) / best


def floor_rounds_per_second(problem, actives, local_steps: int, repeats: int) -> float:
    """Rounds per second of the bare kernel: gather each chunk's Hessians, tau mat-vecs."""
    hessians, minus_linears = problem._quadratic_form()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for active in actives:
            for part in client_chunks(active, problem.client_chunk):
                chunk_hessians = hessians.index_select(0, part)
                z = minus_linears.index_select(0, part).unsqueeze(1)
                for _ in range(local_steps):
                    z = torch.bmm(z, chunk_hessians)
        if problem.device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return len(actives) / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[16, 256, 1024])
    parser.add_argument("--participation", default="bernoulli", help="participation SPEC (default: FOCUS reference preset)")
    parser.add_argument("--rounds", type=int, default=40, help="rounds timed for the vectorized engine")
    parser.add_argument("--reference-rounds", type=int, default=8, help="rounds timed for the reference loop")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float64")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads for both engines (default 1: on a small shared "
                             "machine, spinning OpenMP threads slow these small batched ops down)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    dtype = getattr(torch, args.dtype)
    algorithm = make_algorithm("focus", lr=2e-4, local_steps=5)
    print(f"FOCUS, ridge d=100, 100 samples/client, tau=5, {args.participation} participation, "
          f"{args.device} {args.dtype}, torch threads={torch.get_num_threads()}")
    print(f"{'N':>6} {'mean active':>12} {'vectorized r/s':>15} {'reference r/s':>14} {'ratio':>7} "
          f"{'floor r/s':>10} {'max ratio':>10}")
    for n in args.clients:
        problem = make_problem(f"ridge:clients={n}", dtype=dtype, device=args.device)
        process = make_participation(args.participation, n, seed=0)
        mask = process.mask(max(args.rounds, args.reference_rounds))
        actives = active_sets(mask, problem.device)
        fast = rounds_per_second(vectorized_round, algorithm, problem, actives[: args.rounds], args.repeats)
        slow = rounds_per_second(reference_round, algorithm, problem, actives[: args.reference_rounds], args.repeats)
        floor = floor_rounds_per_second(problem, actives[: args.rounds], 5, args.repeats)
        print(f"{n:>6} {mask.sum(1).mean():>12.1f} {fast:>15.1f} {slow:>14.2f} {fast / slow:>7.1f} "
              f"{floor:>10.1f} {floor / slow:>10.1f}")


if __name__ == "__main__":
    main()

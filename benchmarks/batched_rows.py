"""What bounds batched runs on a CPU: the engine alone (no files), with and without evaluation rows.

Workload: a tune's batch, 9 step sizes of each of FedAvg, SCAFFOLD and MIFA on the default ridge
(16 clients, 100 samples, d = 100, float64, full participation, one thread), run one at a time
(``simulate``) and as one batch (``engine.batched.run_batch``), twice each in alternation; the
rows of both are compared for equality. Then one evaluation row alone against the metrics of R
runs computed by one matrix-matrix product, which rounds differently from the row alone (see
docs/performance.md, "Batches of runs").

    PYTHONPATH=src python benchmarks/batched_rows.py [--rounds 100]

The last line, for scripts: ``rows_speedup=X no_rows_speedup=Y row_us=Z gemm_row_us=W bound=B identical=yes|no``
(B: the most any batch of runs, each the same bytes as alone, could gain: a run's round alone over
the arithmetic each run still does for itself in a batch, its row and its clients' products).
"""
from __future__ import annotations

import argparse
import time

import torch

from focusfl.algorithms import make_algorithm
from focusfl.engine.batched import BatchMember, run_batch
from focusfl.engine.simulate import simulate
from focusfl.participation import make_participation
from focusfl.problems.linear import Ridge

ALGORITHMS = ("fedavg", "scaffold", "mifa")
STEPS = [1e-5 * 10 ** (k / 2) for k in range(9)]
GEMM_RUNS = 32


def engine_ratio(problem, rounds: int, eval_every: int | None) -> tuple[float, bool, float]:
    """One run at a time over a batch (seconds' ratio), whether their rows are equal, and the
    microseconds of one run's round alone."""
    participation = make_participation("full", problem.num_clients)
    alone = batched = 0.0
    same = True
    for _ in range(2):
        for name in ALGORITHMS:
            algorithms = [make_algorithm(name, lr=lr) for lr in STEPS]
            started = time.perf_counter()
            rows = [simulate(a, problem, participation, rounds, eval_every=eval_every).rows for a in algorithms]
            alone += time.perf_counter() - started
            started = time.perf_counter()
            results = run_batch(problem, [BatchMember(a, participation, rounds, eval_every=eval_every) for a in algorithms])
            batched += time.perf_counter() - started
            same = same and rows == [result.rows for result in results]
    run_rounds = 2 * len(ALGORITHMS) * len(STEPS) * rounds
    return alone / batched, same, alone / run_rounds * 1e6


def own_products_us(problem) -> float:
    """Microseconds of the products a run's round computes for itself in a batch as alone: its
    clients' exact gradients, every client's Hessian against the run's own point (one local step:
    the workload's algorithms take one). Runs share the Hessians but not the product: R points at
    once would be a matrix-matrix product, which rounds differently from the run alone."""
    clients = torch.arange(problem.num_clients)
    gradients = problem.oracle(clients, seed=0, round=0)
    points = torch.randn(problem.num_clients, problem.dim, dtype=problem.dtype, generator=torch.Generator().manual_seed(1))
    return per_call_us(lambda: gradients(points, 0), 500)


def per_call_us(call, repeats: int) -> float:
    call()
    started = time.perf_counter()
    for _ in range(repeats):
        call()
    return (time.perf_counter() - started) / repeats * 1e6


def row_costs(problem) -> tuple[float, float]:
    """(microseconds of one evaluation row's metrics, of one run's share of GEMM_RUNS runs'
    loss and gradient computed by one matrix-matrix product each)."""
    features, targets, reg = problem.features, problem.targets, problem.reg
    models = torch.randn(GEMM_RUNS, problem.dim, dtype=problem.dtype, generator=torch.Generator().manual_seed(0))

    def many() -> None:
        residual = features @ models.T - targets.unsqueeze(-1)
        (residual ** 2).sum((0, 1)) / problem.num_clients + reg * (models * models).sum(1)
        torch.bmm(residual.transpose(1, 2), features).mean(0)

    return per_call_us(lambda: problem.metrics(models[0]), 500), per_call_us(many, 100) / GEMM_RUNS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100)
    args = parser.parse_args()
    torch.set_num_threads(1)
    problem = Ridge()
    with_rows, same_rows, alone_us = engine_ratio(problem, args.rounds, 1)
    without_rows, same_plain, _ = engine_ratio(problem, args.rounds, None)
    row, gemm_row = row_costs(problem)
    # What no batch of runs that are each byte for byte the run alone can beat: each run still
    # computes its own row and its own clients' products; the rest (Python, dispatch, the server
    # round, the commit) a batch could share, all of it at best.
    bound = alone_us / (row + own_products_us(problem))
    print(f"{len(STEPS)} steps x {', '.join(ALGORITHMS)}, {args.rounds} rounds: batched {with_rows:.2f}x one at a time "
          f"with a row every round, {without_rows:.2f}x without rows")
    print(f"one evaluation row {row:.0f} us; {GEMM_RUNS} runs' rows by one matrix product {gemm_row:.0f} us a run "
          f"({row / gemm_row:.1f}x, rounding differently)")
    print(f"a run's round with its row alone {alone_us:.0f} us, of which its own row and products {alone_us / bound:.0f} us: "
          f"no batch of byte-identical runs beats {bound:.2f}x")
    print(f"rows_speedup={with_rows:.2f} no_rows_speedup={without_rows:.2f} row_us={row:.0f} gemm_row_us={gemm_row:.0f} "
          f"bound={bound:.2f} identical={'yes' if same_rows and same_plain else 'no'}")


if __name__ == "__main__":
    main()

"""Do the stateful methods' invariants hold in float32, and does their rounding drive divergence?

SCAFFOLD's server keeps c = (1/N) sum_i c_i by adding the clients' increments; FOCUS's keeps
y = sum_i g_prev_i the same way. In exact arithmetic both hold forever; in floating point the
server's running sum and the sum of the clients' current values drift apart by rounding. This
measures, on the mnist-demo setting (32 clients, Dirichlet 0.1, the Bernoulli preset, tau = 5,
batch 32, 20% of the digits held out as test set), every ``--every`` rounds:

- the relative gap ||c - mean_i c_i|| / ||mean_i c_i|| (SCAFFOLD) and ||y - sum_i g_prev_i|| /
  ||sum_i g_prev_i|| (SG-FOCUS), the right-hand side summed in float64;
- the test accuracy;

in float32, in float64, and in float32 with the invariant restored exactly after every round
(the server's sum recomputed from the clients' values: what float64 running sums, or any more
precise summation, could at best give). If float32 diverges and "restored" does not, rounding of
the running sum is the cause; if both diverge alike, it is not.

    python benchmarks/float32_invariants.py --data ../shared/data/mnist10k.npz
    python benchmarks/float32_invariants.py --data tests/fixtures/mnist1500.npz --rounds 60
"""
from __future__ import annotations

import argparse
import math

import torch

from focusfl.algorithms import make_algorithm
from focusfl.algorithms.base import State
from focusfl.engine import simulate
from focusfl.participation import make_participation
from focusfl.problems import make_problem
from focusfl.threads import fixed_threads

STEPS = {"scaffold": 0.02, "sg_focus": 0.005}  # the mnist-demo preset's fixed steps


def exact_sum(table: torch.Tensor) -> torch.Tensor:
    return table.to(torch.float64).sum(0)


def gap(algorithm: str, state: State) -> float:
    server, clients = state.server, state.clients
    if algorithm == "scaffold":
        exact = exact_sum(clients.c) / clients.c.shape[0]
        kept = server.c
    else:
        exact = exact_sum(clients.g_prev)
        kept = server.y
    scale = float(exact.norm())
    return float((kept.to(torch.float64) - exact).norm()) / scale if scale > 0 else 0.0


def restored(algorithm: str, state: State) -> State:
    """The state with the server's running sum replaced by the clients' exact sum."""
    server, clients = state.server, state.clients
    if algorithm == "scaffold":
        value = (exact_sum(clients.c) / clients.c.shape[0]).to(server.c.dtype)
        return State(server._replace(c=value), clients)
    return State(server._replace(y=exact_sum(clients.g_prev).to(server.y.dtype)), clients)


def run(algorithm: str, dtype: torch.dtype, restore: bool, args) -> list[tuple[int, float, float]]:
    problem = make_problem({"name": "nn", "data": args.data, "model": "fedsum-mnist-cnn", "clients": 32,
                            "partition": "dirichlet", "alpha": 0.1, "batch": 32, "test_fraction": 0.2},
                           dtype=dtype)
    method = make_algorithm(algorithm, lr=args.lr or STEPS[algorithm], local_steps=5)
    participation = make_participation("bernoulli", problem.num_clients, seed=0, problem=problem)
    gaps: dict[int, float] = {}

    def on_round(result) -> None:
        if result.rounds_done % args.every == 0:
            gaps[result.rounds_done] = gap(algorithm, result.state)
        if restore:
            result.state = restored(algorithm, result.state)

    result = simulate(method, problem, participation, args.rounds, seed=0, eval_every=args.every, on_round=on_round)
    return [(int(row["round"]), gaps.get(int(row["round"]), math.nan), row.get("test_accuracy", math.nan))
            for row in result.rows] + ([] if result.diverged_at is None else [(result.diverged_at, math.nan, math.nan)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="an .npz of MNIST digits (images [M,28,28], labels [M])")
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--algorithms", default="scaffold,sg_focus")
    parser.add_argument("--lr", type=float, default=None, help="default: the mnist-demo preset's fixed step")
    args = parser.parse_args()
    with fixed_threads(1):
        for algorithm in args.algorithms.split(","):
            for label, dtype, restore in (("float32", torch.float32, False), ("float64", torch.float64, False),
                                          ("float32 restored", torch.float32, True)):
                rows = run(algorithm, dtype, restore, args)
                cells = "  ".join(f"r{r}: gap {g:.1e} acc {a:.3f}" if math.isfinite(a) else f"r{r}: diverged"
                                  for r, g, a in rows)
                print(f"{algorithm:<9} {label:<17} {cells}", flush=True)


if __name__ == "__main__":
    main()

"""``--lr auto`` with minibatches over long runs: every algorithm, minibatch ridge and logistic
regression, Markov participation (rho = 0.8), tau = 2, 10,000 rounds.

The automatic step comes from the smoothness of the minibatch objective the clients step on
(problems/linear.py ``smoothness``). For every run this prints the step, the loss at the start,
its largest value after the start, its final value, and whether the run diverged.

    python benchmarks/lr_auto_long.py                       # 10,000 rounds (several minutes)
    python benchmarks/lr_auto_long.py --rounds 2000         # quicker
"""
from __future__ import annotations

import argparse
import time

from focusfl.algorithms import ALGORITHMS
from focusfl.runs.config import RunConfig
from focusfl.runs.driver import build, execute
from focusfl.threads import fixed_threads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10_000)
    parser.add_argument("--problems", nargs="+", default=["ridge:batch=10", "logistic:batch=10"],
                        help="problem SPECs (default: the issue's, 16 clients of 100 rows, minibatches of 10)")
    args = parser.parse_args()
    problems = args.problems
    print(f"{'problem':<18} {'algorithm':<12} {'auto lr':>10} {'start':>10} {'max after':>10} {'final':>10}  status")
    with fixed_threads(1):
        for problem in problems:
            for name, cls in ALGORITHMS.items():
                if cls.alias_of is not None and name != "sg_focus":  # SG-FOCUS steps differently from FOCUS
                    continue
                started = time.perf_counter()
                built = build(RunConfig(algorithm=name, problem=problem, participation="markov:rho=0.8",
                                        rounds=args.rounds, local_steps=2, lr="auto", eval_every=args.rounds // 20))
                result = execute(built)
                losses = [row["loss"] for row in result.rows]
                status = "ok" if result.diverged_at is None else f"DIVERGED at round {result.diverged_at}"
                print(f"{problem:<18} {name:<12} {built.algorithm.lr:>10.3g} {losses[0]:>10.4g} {max(losses[1:]):>10.4g} "
                      f"{losses[-1]:>10.4g}  {status} ({time.perf_counter() - started:.0f} s)", flush=True)


if __name__ == "__main__":
    main()

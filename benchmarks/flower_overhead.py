"""Per-round cost of Flower's simulation runtime against focusfl's vectorized engine.

The same workload both ways: FOCUS, logistic regression with 32 clients, 1 local step, full
participation. Flower: ``flwr.simulation.run_simulation`` with 32 virtual SuperNodes (Ray, one
ClientApp call per client and round, through AlgorithmStrategy); focusfl: ``simulate`` with the
vectorized engine (all 32 clients as one batched computation). Start-up (Ray, imports) is
excluded from Flower's figure: it is timed from its first to its last round.

    python benchmarks/flower_overhead.py [--rounds 10] [--clients 32]
"""
from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--cpus", type=int, default=2, help="CPUs Ray may use")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    from flwr.simulation import run_simulation

    from focusfl.algorithms import make_algorithm
    from focusfl.engine import simulate
    from focusfl.flower.client_app import make_client_app
    from focusfl.flower.server_app import FederationConfig, make_server_app
    from focusfl.participation import make_participation
    from focusfl.problems import make_problem

    spec = f"logistic:clients={args.clients}"
    problem = make_problem(spec)
    algorithm = make_algorithm("focus", local_steps=1)
    lr = algorithm.auto_lr(problem.smoothness(), problem.num_clients)

    started = time.perf_counter()
    simulate(make_algorithm("focus", lr=lr, local_steps=1), problem, make_participation("full", args.clients),
             rounds=args.rounds, eval_every=args.rounds)
    focusfl_round = (time.perf_counter() - started) / args.rounds

    stamps: list[float] = []
    config = FederationConfig(algorithm="focus", problem=spec, participation="full", rounds=args.rounds, lr=lr,
                              local_steps=1, eval_every=args.rounds, timeout=600.0, audit=False)
    sink: dict = {}
    server_app = make_server_app(config, sink, log=lambda text: None)
    # Time rounds inside the ServerApp: wrap the strategy's per-round hook.
    from focusfl.flower import strategy as strategy_module

    original = strategy_module.AlgorithmStrategy._server_step

    def timed(self, entry):
        original(self, entry)
        stamps.append(time.perf_counter())

    strategy_module.AlgorithmStrategy._server_step = timed
    try:
        run_simulation(server_app, make_client_app(), num_supernodes=args.clients,
                       backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                       "init_args": {"num_cpus": args.cpus, "object_store_memory": 200 * 2**20}})
    finally:
        strategy_module.AlgorithmStrategy._server_step = original
    if len(stamps) < 2:
        raise SystemExit("the Flower simulation did not complete its rounds")
    flower_round = (stamps[-1] - stamps[0]) / (len(stamps) - 1)
    print(f"workload: FOCUS, {spec}, 1 local step, full participation, {args.rounds} rounds")
    print(f"flower simulation ({args.clients} virtual SuperNodes): {flower_round * 1e3:9.1f} ms/round")
    print(f"focusfl vectorized engine:                   {focusfl_round * 1e3:9.3f} ms/round")
    print(f"ratio: focusfl is {flower_round / focusfl_round:,.0f}x faster per round")


if __name__ == "__main__":
    main()

"""Seconds per round of a real Flower deployment on loopback, cold (Flower's defaults) and warm.

``focusfl federation local`` on FOCUS, ridge (3 clients, dim 5), full participation: a
SuperLink and 3 SuperNodes as processes. cold: ``flower-supernode`` as Flower ships it (a
``flwr-clientapp`` process per message; polls of 3 s, 0.5 s and 1 s; the ServerApp pulls
replies every 3 s). warm (the default of ``federation local``): focusfl.flower.warm runs the
ClientApp calls in the SuperNode's process, wakes its loops on events (message stored, reply
pushed) and polls from 0.02 s doubling to 0.2 s, and the ServerApp pulls replies (and their
objects) from 0.005 s doubling to 0.1 s. Seconds per round: the ServerApp's own "done: R rounds
in S s" over R (the handshake and the audit are included); start-up and shutdown: the rest of
the wall time, in three parts: processes started and nodes joined (LocalFederation's start),
the run submitted and its ServerApp started plus, after the last round, the log stream closed
(``flwr run`` less the rounds), and every process stopped. Both runs must give the same model, bit for bit.

The breakdown prints what a cold message costs: starting a Python process that imports
flwr's ClientApp runtime and focusfl's ClientApp (torch), measured here, and Flower's fixed
poll sleeps (read from its source), against which a ridge ClientApp call (milliseconds) is nothing.

    python benchmarks/flower_latency.py [--rounds 10] [--nodes 3] [--only warm|cold]
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def federation(warm: bool, rounds: int, nodes: int, folder: Path) -> tuple[float, tuple[float, float, float], bytes]:
    """Seconds per round; (processes up and nodes joined, the run's own start and end, shutdown);
    the model's bytes."""
    from focusfl.flower.local import LocalFederation
    from focusfl.flower.server_app import FederationConfig

    config = FederationConfig(algorithm="focus", problem=f"ridge:clients={nodes},dim=5", participation="full",
                              rounds=rounds, out=str(folder / "run"))
    started = time.perf_counter()
    with LocalFederation(folder / "fed", nodes=nodes, warm=warm) as fed:
        up = time.perf_counter()
        result = fed.run(config, timeout=1800)
        ran = time.perf_counter()
    down = time.perf_counter() - ran
    found = re.search(r"done: (\d+) rounds in ([0-9.]+) s", result.stdout)
    if result.returncode != 0 or not found:
        raise SystemExit(f"the federation failed:\n{result.stdout[-2000:]}")
    rounds_s = float(found.group(2))
    parts = (up - started, ran - up - rounds_s, down)
    return rounds_s / int(found.group(1)), parts, (folder / "run" / "model.pt").read_bytes()


def cold_start(repeat: int = 3) -> float:
    """Seconds to start a Python that imports what a flwr-clientapp process imports."""
    code = "import flwr.supernode.runtime.run_clientapp, focusfl.flower.client_app"
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--only", choices=["warm", "cold"])
    args = parser.parse_args()
    print(f"workload: FOCUS, ridge:clients={args.nodes},dim=5, full participation, {args.rounds} rounds, "
          f"{args.nodes} SuperNodes on loopback")
    print(f"breakdown, cold message: process start + imports (flwr runtime, torch, focusfl) {cold_start():.2f} s;")
    print("  Flower's poll sleeps: SuperNode idle 3 s, reply 0.5 s, SuperExec 1 s, ServerApp pull 3 s;")
    print("  a ClientApp pulling objects the SuperNode does not hold yet: 1 s, then 2 s, ... (warm: 0.02 s doubling)")
    models = {}
    for mode in ["cold", "warm"]:
        if args.only and mode != args.only:
            continue
        with tempfile.TemporaryDirectory() as folder:
            per_round, (up, run, down), models[mode] = federation(mode == "warm", args.rounds, args.nodes,
                                                                  Path(folder))
        print(f"{mode}: {per_round:6.2f} s/round; start-up and shutdown {up + run + down:.1f} s: processes up and "
              f"nodes joined {up:.1f} s, the run submitted, its ServerApp started and its log stream closed "
              f"{run:.1f} s, shutdown {down:.1f} s")
    if len(models) == 2:
        print(f"same model, bit for bit: {models['cold'] == models['warm']}")


if __name__ == "__main__":
    main()

"""Sweeps on a Ray cluster: what a second node adds, and what packing runs on a GPU adds.

    python benchmarks/ray_sweep.py                   # 2 simulated nodes of 1 CPU each vs 1 node of 1 CPU
    python benchmarks/ray_sweep.py --rounds 1000     # shorter runs (the executor's own cost weighs more)
    python benchmarks/ray_sweep.py --packing --device cuda   # --gpus-per-task 0.25 vs one run at a time
    python benchmarks/ray_sweep.py --packing --device cpu --small   # the same, rehearsed on a CPU

Nodes: one ``ray.cluster_utils.Cluster`` in this machine (a head that only schedules, then one
worker node of 1 CPU; a second one is added after the first sweep); the same sweep (24 runs of
ridge, one run per task, ``--threads 1``) runs on 1 node, then on 2, each into a fresh folder, in
one invocation; the throughput ratio is printed with the load average, and results.csv and
summary.csv are compared byte for byte. On a shared machine other processes take CPU from the
nodes: quote the load, and measure again on a quiet machine.

Packing (benchmarks/gpu_check.py runs it): runs of the MNIST CNN (the 1,500 digits committed with
the tests) one at a time in this process, then on a local Ray at ``--gpus-per-task 0.25`` (four
runs share the GPU; on a CPU a GPU is declared to Ray and the runs compute on the CPU); the
criterion is identical results.csv and summary.csv, the figure the throughput ratio. Each GPU task
starts a fresh worker process (Ray's default for GPU tasks, so that a worker never keeps a GPU it
no longer holds), which a short run pays for.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from focusfl.sweeps.executors import ray_runtime_env  # noqa: E402
from focusfl.sweeps.sweep import make_experiment, run_sweep  # noqa: E402

MNIST = ROOT / "tests" / "fixtures" / "mnist1500.npz"
TABLES = ("results.csv", "summary.csv")


def _same_tables(a: Path, b: Path) -> bool:
    return all((a / name).read_bytes() == (b / name).read_bytes() for name in TABLES)


def _timed_sweep(experiment, out: Path, **options) -> float:
    start = time.perf_counter()
    report = run_sweep(experiment, out, threads=1, batch_runs=1, **options)
    seconds = time.perf_counter() - start
    if report.failed or report.ran != report.total:
        raise SystemExit(f"ray_sweep: a sweep failed: {report.failed[:1]}")
    return seconds


def nodes(rounds: int) -> float:
    """Seconds of the sweep on 1 node of 1 CPU over seconds on 2 such nodes (same cluster)."""
    import ray
    from ray.cluster_utils import Cluster

    experiment = make_experiment(algorithms=["focus", "fedavg", "scaffold"],
                                 problems=["ridge:clients=16,dim=40,samples=40"],
                                 participation=["bernoulli", "markov:rho=0.8"], lr=[0.001, 0.002], seeds=2,
                                 rounds=rounds, local_steps=5, eval_every=50)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False, runtime_env=ray_runtime_env())
        with tempfile.TemporaryDirectory(prefix="ray_sweep-") as tmp:
            times = {}
            for count in (1, 2):
                if count == 2:
                    cluster.add_node(num_cpus=1)
                    cluster.wait_for_nodes()
                load = os.getloadavg()[0]
                times[count] = _timed_sweep(experiment, Path(tmp) / f"nodes{count}", executor="ray")
                print(f"{count} node(s) of 1 CPU: {times[count]:6.1f} s for 24 runs of {rounds} rounds "
                      f"(load average {load:.2f} before, {os.getloadavg()[0]:.2f} after)", flush=True)
            same = _same_tables(Path(tmp) / "nodes1", Path(tmp) / "nodes2")
        ratio = times[1] / times[2]
        print(f"2 nodes / 1 node: {ratio:.2f}x the throughput; results.csv and summary.csv "
              f"{'identical' if same else 'DIFFERENT'}; {len(os.sched_getaffinity(0))} cores on this machine")
        return ratio
    finally:
        ray.shutdown()
        cluster.shutdown()


def packing(device: str, small: bool) -> tuple[float, bool, int]:
    """(throughput at --gpus-per-task 0.25 over one run at a time, tables identical, runs)."""
    import ray

    seeds, rounds = (4, 4) if small else (8, 300)
    problem = f"nn:data={MNIST},test_fraction=0.2,clients=8,alpha=0.5,batch=16,augment=crop-flip"
    experiment = make_experiment(algorithms=[{"name": "sg_focus", "local_steps": 3}], problems=[problem],
                                 participation=["bernoulli"], lr=0.01, seeds=seeds, rounds=rounds,
                                 eval_every=2 if small else 50, device=device)
    with tempfile.TemporaryDirectory(prefix="ray_packing-") as tmp:
        alone = _timed_sweep(experiment, Path(tmp) / "alone")
        # On a CPU the GPU is declared only (the runs compute on the CPU): the scheduling rehearsed.
        declared = {"num_gpus": 1} if device == "cpu" else {}
        ray.init(num_cpus=max(4, os.cpu_count() or 1), include_dashboard=False, log_to_driver=False,
                 runtime_env=ray_runtime_env(), **declared)
        try:
            packed = _timed_sweep(experiment, Path(tmp) / "packed", executor="ray", gpus_per_task=0.25,
                                  cpus_per_task=1)
        finally:
            ray.shutdown()
        same = _same_tables(Path(tmp) / "alone", Path(tmp) / "packed")
    return alone / packed, same, seeds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3000, help="rounds per run of the nodes sweep (default 3000)")
    parser.add_argument("--packing", action="store_true", help="the GPU packing figure instead of the nodes one")
    parser.add_argument("--device", default="cuda", help="with --packing: cuda (default) or cpu")
    parser.add_argument("--small", action="store_true", help="with --packing: tiny sizes")
    args = parser.parse_args()
    if not args.packing:
        nodes(args.rounds)
        return
    ratio, same, runs = packing(args.device, args.small)
    print(f"{runs} runs at --gpus-per-task 0.25 on {args.device}: {ratio:.2f}x the throughput of one at a time; "
          f"tables {'identical' if same else 'DIFFERENT'}")


if __name__ == "__main__":
    main()

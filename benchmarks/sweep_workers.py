"""``focusfl sweep --workers 2`` against ``--workers 1``: wall clock and identical results.

The acceptance sweep of the issue: 3 algorithms (FOCUS, FedAvg, SCAFFOLD) x 2 participation
processes (bernoulli, markov:rho=0.8) x 3 step sizes x 5 seeds = 90 runs of ridge regression,
about a minute sequentially on one core. Each configuration is run as a user runs it
(``python -m focusfl.cli sweep``, start-up included) into a fresh folder, side by side in one
invocation; the ratio is printed, and results.csv, summary.csv and every run's metrics.csv and
model.pt are compared byte for byte. The load average before and after each sweep is printed:
on a shared machine a busy neighbour shows there.

    python benchmarks/sweep_workers.py              # workers 1, workers 2, workers 1 with 2 threads
    python benchmarks/sweep_workers.py --rounds 600 # a shorter sweep (start-up and figures weigh more)
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EXPERIMENT = """
name = "sweep-workers benchmark"
algorithms = ["focus", "fedavg", "scaffold"]
problems = ["ridge:clients=16,dim=40,samples=40"]
participation = ["bernoulli", "markov:rho=0.8"]
lr = [0.001, 0.002, 0.004]
seeds = 5
rounds = {rounds}
local_steps = 5
eval_every = 5
targets = [1e-4, 1e-8]
"""


def sweep(experiment: Path, out: Path, workers: int, threads: int | None) -> float:
    argv = [sys.executable, "-m", "focusfl.cli", "sweep", str(experiment), "--out", str(out),
            "--workers", str(workers)]
    if threads is not None:
        argv += ["--threads", str(threads)]
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"sweep failed: {proc.stderr.strip()}")
    return seconds


def files_of(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and (p.suffix == ".pt" or p.name in ("metrics.csv", "results.csv", "summary.csv"))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4000, help="rounds per run (default 4000: about a minute with one worker)")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory() as tmp:
        experiment = Path(tmp) / "experiment.toml"
        experiment.write_text(EXPERIMENT.format(rounds=args.rounds))
        cases = [("workers 1", 1, None), ("workers 2", 2, None), ("workers 1, 2 threads", 1, 2)]
        print(f"90 runs of {args.rounds} rounds; {cores} cores; one torch thread per worker unless said")
        times, outputs = {}, {}
        for name, workers, threads in cases:
            out = Path(tmp) / name.replace(" ", "").replace(",", "-")
            load = os.getloadavg()[0]
            times[name] = sweep(experiment, out, workers, threads)
            outputs[name] = files_of(out)
            print(f"{name:<28} {times[name]:7.1f} s   (load average {load:.2f} before, {os.getloadavg()[0]:.2f} after)")
        base = "workers 1"
        for name in times:
            if name != base:
                same = outputs[name] == outputs[base]
                print(f"{base} / {name}: {times[base] / times[name]:.2f}x; "
                      f"files {'identical' if same else 'DIFFERENT'} ({len(outputs[name])} compared)")


if __name__ == "__main__":
    main()

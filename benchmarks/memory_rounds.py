"""Peak memory of `focusfl run` against the number of rounds: it must not grow with them.

Each run is a fresh `python -m focusfl.cli run` process that reports its own peak resident set
size (ru_maxrss) when it ends; the table prints each peak and its ratio to the shortest run's.
The issue's target: 10^7 rounds within 1.5x the peak of 10^3 rounds.

    python benchmarks/memory_rounds.py                       # 10^3, 10^5, 10^7 rounds (~20 min)
    python benchmarks/memory_rounds.py --rounds 1000 100000  # quicker
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = """
import resource, sys
from focusfl.cli import main
code = main(sys.argv[1:])
print("PEAK_KIB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, flush=True)
sys.exit(code)
"""


def peak_rss(rounds: int, args: argparse.Namespace, folder: Path) -> tuple[float, float]:
    """(peak RSS in MiB, seconds) of one run of ``rounds`` rounds."""
    command = [
        sys.executable, "-c", CHILD, "run", "--algorithm", args.algorithm, "--problem", args.problem,
        "--participation", args.participation, "--rounds", str(rounds),
        "--eval-every", str(args.eval_every), "--out", str(folder / f"r{rounds}"),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"run of {rounds} rounds failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    kib = next(int(line.split()[1]) for line in proc.stdout.splitlines() if line.startswith("PEAK_KIB"))
    return kib / 1024, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, nargs="+", default=[1_000, 100_000, 10_000_000])
    parser.add_argument("--algorithm", default="focus")
    parser.add_argument("--problem", default="ridge:clients=16,dim=2,samples=2")
    parser.add_argument("--participation", default="markov")
    parser.add_argument("--eval-every", type=int, default=1000,
                        help="evaluation cadence; metrics.csv gets rounds/E rows (default 1000)")
    args = parser.parse_args()
    print(f"focusfl run --algorithm {args.algorithm} --problem {args.problem} "
          f"--participation {args.participation} --eval-every {args.eval_every}")
    print(f"{'rounds':>12} {'peak RSS MiB':>13} {'vs first':>9} {'seconds':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        first = None
        for rounds in args.rounds:
            mib, seconds = peak_rss(rounds, args, Path(tmp))
            first = first or mib
            print(f"{rounds:>12} {mib:>13.1f} {mib / first:>9.3f} {seconds:>9.1f}", flush=True)


if __name__ == "__main__":
    main()

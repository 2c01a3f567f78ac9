"""Batched runs against one run at a time: ``focusfl tune --algorithm all --problem ridge`` (162
trials) with ``--batch-runs 1`` and ``--batch-runs auto``, on this machine, in one invocation; the
two output folders compared byte for byte (each run's config.json without its ``batch_runs``).

    PYTHONPATH=src python benchmarks/sweep_batched.py [--out DIR]

Each tune runs in its own process (end to end: the command as a user types it, start-up and
writing included); the trials phase (first trial's start to last trial's end) is timed inside it.
``report_convex_speedup`` times the one convex section of ``focusfl reproduce report`` that
computes in batches: its ridge section's runs (``run_figure4`` of both settings at the report's
500 rounds), batched against one at a time, rows compared for equality; the report's
other convex sections (exactness, bias, studies, work) still run one run at a time. No GPU is
timed here (n/a). The last line is for scripts:

    tune_speedup=X tune_end_to_end=Y report_convex_speedup=Z gpu_speedup=W|n/a identical=yes|no
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TUNE = ["tune", "--algorithm", "all", "--problem", "ridge"]
PHASE = "trials_seconds="


def child(argv: list[str]) -> None:
    """Run ``focusfl ARGV`` here, timing the executor's runs (the trials phase)."""
    from focusfl import cli
    from focusfl.experiments import executors

    spans: list[float] = []
    run = executors.LocalExecutor.run

    def timed(self, tasks):
        started = time.perf_counter()
        try:
            yield from run(self, tasks)
        finally:
            spans.append(time.perf_counter() - started)

    executors.LocalExecutor.run = timed
    with open(os.devnull, "w") as quiet:
        stdout, sys.stdout = sys.stdout, quiet
        try:
            code = cli.main(argv)
        finally:
            sys.stdout = stdout
    print(f"{PHASE}{sum(spans):.6f}")
    sys.exit(code)


def timed_tune(out: Path, batch: str) -> tuple[float, float]:
    """(end-to-end seconds, trials-phase seconds) of one tune into ``out``."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, __file__, "--child", *TUNE, "--out", str(out), "--batch-runs", batch],
                          capture_output=True, text=True, check=True)
    total = time.perf_counter() - started
    phase = next(line for line in done.stdout.splitlines() if line.startswith(PHASE))
    return total, float(phase[len(PHASE):])


def report_ridge(batch: str) -> tuple[float, object]:
    """(seconds, results) of the report's ridge-section runs, computed with ``batch_runs``."""
    import torch

    from focusfl.experiments.reproduce_report import FULL
    from focusfl.experiments.reproduce_ridge import run_figure4

    torch.set_num_threads(1)  # as the report computes
    batch_runs = "auto" if batch == "auto" else int(batch)
    started = time.perf_counter()
    results = [run_figure4(FULL.ridge_rounds, setting=setting, batch_runs=batch_runs) for setting in ("paper", "notebook")]
    return time.perf_counter() - started, results


def identical(first: Path, second: Path) -> bool:
    """Whether two output folders hold the same files with the same bytes (a run's config.json
    compared without its batch size; focusfl's own markers and locks left out)."""
    def files(root: Path) -> dict[str, bytes]:
        found = {}
        for path in sorted(root.rglob("*")):
            if not path.is_file() or any(part.startswith(".") for part in path.relative_to(root).parts):
                continue
            data = path.read_bytes()
            if path.name == "config.json" and "runs" in path.relative_to(root).parts:
                record = json.loads(data)
                record.pop("batch_runs", None)
                data = json.dumps(record, sort_keys=True).encode()
            found[str(path.relative_to(root))] = data
        return found

    return files(first) == files(second)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="folder for the two tunes (default: a temporary one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="focusfl-batched-") as tmp:
        root = Path(args.out or tmp)
        alone_total, alone_phase = timed_tune(root / "one-at-a-time", "1")
        batched_total, batched_phase = timed_tune(root / "batched", "auto")
        same = identical(root / "one-at-a-time", root / "batched")
        print(f"tune --algorithm all --problem ridge: one run at a time {alone_total:.1f} s (trials {alone_phase:.1f} s), "
              f"batched {batched_total:.1f} s (trials {batched_phase:.1f} s); files identical: {same}")
    ridge_alone, rows_alone = report_ridge("1")
    ridge_batched, rows_batched = report_ridge("auto")
    same_rows = rows_alone == rows_batched
    print(f"report, ridge section's runs: one run at a time {ridge_alone:.1f} s, batched {ridge_batched:.1f} s; "
          f"rows identical: {same_rows}")
    print(f"tune_speedup={alone_phase / batched_phase:.2f} tune_end_to_end={alone_total / batched_total:.2f} "
          f"report_convex_speedup={ridge_alone / ridge_batched:.2f} gpu_speedup=n/a "
          f"identical={'yes' if same and same_rows else 'no'}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2:])
    else:
        main()

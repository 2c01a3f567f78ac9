"""Batched runs against one run at a time: ``focusfl tune --algorithm all --problem ridge`` (162
trials) with ``--batch-runs 1`` and ``--batch-runs auto``, on this machine, in one invocation; the
two output folders compared byte for byte (each run's config.json without its ``batch_runs``).

    PYTHONPATH=src python benchmarks/sweep_batched.py [--out DIR] [--only tune|report]

Each tune runs in its own process (end to end: the command as a user types it, start-up and
writing included); the trials phase (first trial's start to last trial's end) is timed inside it.
``report_convex_speedup`` times the convex sections of ``focusfl reproduce report`` that compute
runs (the ridge figure, the exactness table with SCAFFOLD against FOCUS, the studies, the work,
suite and baselines sections: every step search's trials and every run at a chosen step), each
mode in a process of its own, at :func:`report_sizes` (between the quick report's sizes and the
full ones: about a minute or two one run at a time on a 2-core machine), with ``--batch-runs 1``
against ``auto``; the figures are not drawn (they are not computation and cost both the same),
and the sections' report.md text and summary rows are compared for equality. ``--only report``
times that part alone. Where torch sees a CUDA device, ``gpu_speedup`` is
benchmarks/batched_nn.py's (focus-cifar10's final runs, 5 algorithms x 2 processes x 3 seeds,
``--gpu-rounds`` rounds each, default 1,000 as the issue asks: one batch against one at a time,
their rows compared); elsewhere n/a. ``--only gpu`` times that part alone. The last line is for
scripts:

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
    from focusfl.sweeps import executors

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


REPORT = "report_seconds="
CPU = "report_cpu_seconds="
DIGEST = "report_digest="


def report_sizes():
    """The report's sizes for the benchmark: the quick report's, with the full report's ridge
    rounds, the exactness table, three seeds of SCAFFOLD against FOCUS and both work problems, and
    studies 2 to 3 times as long (the suite and baselines sections run at their quick sizes)."""
    import dataclasses

    from focusfl.reproduce.reproduce_report import FULL, QUICK

    return dataclasses.replace(QUICK, ridge_rounds=FULL.ridge_rounds, exactness=True, versus_seeds=3,
                               study_rounds=600, prox_rounds=400, push_rounds=600, work_rounds=200,
                               work_problems=FULL.work_problems)


def report_child(batch: str) -> None:
    """Compute the report's convex sections here with ``--batch-runs BATCH``: print their seconds
    and a digest of their report.md text and summary rows."""
    import dataclasses
    import hashlib

    import torch

    from focusfl.reproduce import reproduce_report as report
    from focusfl.reproduce import suite_study
    from focusfl.reproduce.verdicts import claims_rows

    torch.set_num_threads(1)  # as the report computes
    nothing = lambda *args, **kwargs: None  # noqa: E731
    report.plot_figures = report._plot_rounds = report._plot_work_curves = suite_study.plot_curves = nothing
    sizes = dataclasses.replace(report_sizes(), batch_runs="auto" if batch == "auto" else int(batch))
    with tempfile.TemporaryDirectory(prefix="focusfl-report-") as tmp:
        images = Path(tmp) / "images" / "reproductions"
        images.mkdir(parents=True)
        started, cpu = time.perf_counter(), time.process_time()
        sections = [report.ridge_section(sizes, images), report.exactness_section(sizes),
                    report.studies_section(sizes, images), report.work_section(sizes, images),
                    report.suite_section(sizes, images), report.baselines_section(sizes)]
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    digest = hashlib.sha256(report.build_report(sections, 0.0, None, quick=sizes.quick).encode()
                            + repr(claims_rows(sections)).encode()).hexdigest()
    print(f"{REPORT}{seconds:.6f}")
    print(f"{CPU}{cpu:.6f}")
    print(f"{DIGEST}{digest}")


def report_convex(batch: str) -> tuple[float, float, str]:
    """(seconds, CPU seconds, digest) of the report's convex sections computed with ``--batch-runs
    BATCH``, in a process of its own (each mode pays its own imports and first calls). The CPU
    time is printed beside the wall-clock time: on a machine shared with other work it moves
    less with the load."""
    done = subprocess.run([sys.executable, __file__, "--report-child", batch], capture_output=True, text=True,
                          check=True)
    lines = done.stdout.splitlines()
    value = lambda key: next(line for line in lines if line.startswith(key))[len(key):]  # noqa: E731
    return float(value(REPORT)), float(value(CPU)), value(DIGEST)


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
    parser.add_argument("--only", choices=("tune", "report", "gpu"), help="time one part only (the others: n/a)")
    parser.add_argument("--gpu-rounds", type=int, default=1000, help="rounds of each focus-cifar10 run on a GPU")
    args = parser.parse_args()
    tune_speedup = end_to_end = report_speedup = gpu_speedup = "n/a"
    same = True
    if args.only in (None, "gpu") and gpu_available():
        # First, in a process of its own: CUDA started here would stay for the CPU parts' children.
        gpu_speedup, same_gpu = timed_gpu(args.gpu_rounds)
        same = same and same_gpu
    if args.only in (None, "tune"):
        with tempfile.TemporaryDirectory(prefix="focusfl-batched-") as tmp:
            root = Path(args.out or tmp)
            alone_total, alone_phase = timed_tune(root / "one-at-a-time", "1")
            batched_total, batched_phase = timed_tune(root / "batched", "auto")
            same = identical(root / "one-at-a-time", root / "batched")
            print(f"tune --algorithm all --problem ridge: one run at a time {alone_total:.1f} s (trials "
                  f"{alone_phase:.1f} s), batched {batched_total:.1f} s (trials {batched_phase:.1f} s); files "
                  f"identical: {same}")
        tune_speedup, end_to_end = f"{alone_phase / batched_phase:.2f}", f"{alone_total / batched_total:.2f}"
    if args.only in (None, "report"):
        report_alone, cpu_alone, digest_alone = report_convex("1")
        report_batched, cpu_batched, digest_batched = report_convex("auto")
        same_report = digest_alone == digest_batched
        same = same and same_report
        print(f"report, convex sections: one run at a time {report_alone:.1f} s (CPU {cpu_alone:.1f} s), batched "
              f"{report_batched:.1f} s (CPU {cpu_batched:.1f} s); report text and summary rows identical: {same_report}")
        report_speedup = f"{report_alone / report_batched:.2f}"
    print(f"tune_speedup={tune_speedup} tune_end_to_end={end_to_end} report_convex_speedup={report_speedup} "
          f"gpu_speedup={gpu_speedup} identical={'yes' if same else 'no'}")


def gpu_available() -> bool:
    """Whether torch sees a CUDA device (asked in a child: this process stays without CUDA)."""
    proc = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                          capture_output=True, text=True)
    return proc.stdout.strip() == "True"


def timed_gpu(rounds: int) -> tuple[str, bool]:
    """benchmarks/batched_nn.py on the GPU: its gpu_speedup and whether the rows were identical."""
    script = Path(__file__).resolve().parent / "batched_nn.py"
    proc = subprocess.run([sys.executable, str(script), "--device", "cuda", "--rounds", str(rounds)],
                          capture_output=True, text=True)
    print(proc.stdout.strip())
    lines = proc.stdout.strip().splitlines()
    if not lines or not lines[-1].startswith("gpu_speedup="):
        print(f"batched_nn.py failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
        return "failed", False
    last = dict(item.split("=", 1) for item in lines[-1].split())
    return last["gpu_speedup"], last["identical"] == "yes"


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2:])
    elif len(sys.argv) > 1 and sys.argv[1] == "--report-child":
        report_child(sys.argv[2])
    else:
        main()

"""benchmarks/gpu_check.py, the one command a lent GPU runs, kept from rotting: every check at
its small size on the CPU, its table and its last line as docs/performance.md and the issue say."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from cli_harness import cli_env

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"


@pytest.mark.slow
@pytest.mark.xdist_group("ray")  # its Ray sweep check starts a local Ray: one Ray at a time (test_sweep.py)
def test_gpu_check_passes_on_a_cpu_at_its_small_size():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--small"], env=cli_env(),
                          capture_output=True, text=True, timeout=900)
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    try:
        import ray  # noqa: F401
        checks = 8  # the Ray sweep packed on a declared GPU too
    except ImportError:
        checks = 7
    assert re.fullmatch(rf"gpu_check: {checks} passed, 0 failed on cpu \(\d+ cores\)", lines[-1]), lines[-1]
    assert "| check | result | detail |" in lines and "| same bytes twice | pass |" in proc.stdout
    assert "| batched runs = runs alone | pass | 10 runs (5 algorithms x 2 processes x 1 seeds)" in proc.stdout
    assert any(line.startswith("| deterministic s/round | ") for line in lines)
    if checks == 8:
        assert "| ray sweep packed = runs alone | pass | 4 runs at --gpus-per-task 0.25: results.csv and summary.csv " \
               "identical;" in proc.stdout


def test_gpu_check_without_cuda_says_so_and_fails():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--device", "cuda"], env=cli_env(), capture_output=True,
                          text=True, timeout=300)
    if "sees no CUDA device" not in proc.stdout:
        pytest.skip("torch sees a CUDA device here: the GPU run is gpu_check's own")
    assert proc.returncode == 1 and proc.stdout.strip().splitlines()[-1] == "gpu_check: 0 passed, 1 failed on cuda"

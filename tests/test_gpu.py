"""focusfl on a GPU (issue 44): marked ``gpu``, run where torch sees a CUDA device, skipped with
the reason elsewhere. The checks are benchmarks/gpu_check.py's (one definition: the command a
lent GPU runs and these tests assert the same things), at gpu_check's small sizes.

    PYTHONPATH=src python -m pytest -m gpu -n0 tests/test_gpu.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import gpu_check  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="no CUDA device: torch sees none (these run on a GPU machine: pytest -m gpu)"),
]
SIZES = gpu_check.Sizes(small=True)


def _passes(result: tuple[bool, str]) -> None:
    ok, detail = result
    assert ok, detail


def test_the_cuda_policy_is_applied():
    _passes(gpu_check.check_policy("cuda", SIZES))


def test_engines_are_equal_in_float64_on_cuda():
    _passes(gpu_check.check_engines("cuda", SIZES))


def test_the_same_command_twice_gives_the_same_bytes_and_a_resume_too(tmp_path):
    _passes(gpu_check.check_same_bytes("cuda", SIZES, tmp_path))
    _passes(gpu_check.check_resume("cuda", SIZES, tmp_path))


def test_cpu_and_cuda_agree_to_rounding():
    _passes(gpu_check.check_cross_device("cuda", SIZES))


def test_a_preset_runs_end_to_end_on_cuda(tmp_path):
    _passes(gpu_check.check_preset("cuda", SIZES, tmp_path))

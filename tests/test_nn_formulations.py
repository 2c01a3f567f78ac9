"""Every formulation of the nn problem computes the bytes it did before NeuralNetwork was split
into data, formulation and evaluation (tests/nn_formulation_cases.py recorded them with the
one-class problem): chunks of 1, 2 and all clients, channels-last and NCHW, crop-flip, dropout,
the reference loop, the vmap path, a validation share, float32 and float64.

The recorded bytes are those of one platform (torch version, CPU instruction set, one thread):
float32 kernels of another CPU round differently, which is no regression of focusfl's code, so
there the test is skipped and says why."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nn_formulation_cases as cases  # noqa: E402

RECORDED = json.loads((Path(__file__).resolve().parent / "fixtures" / "nn_formulation_hashes.json").read_text())


@pytest.fixture(scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    if cases.platform() != RECORDED["platform"]:
        torch.set_num_threads(threads)
        pytest.skip(f"hashes recorded on {RECORDED['platform']}, this is {cases.platform()}")
    yield
    torch.set_num_threads(threads)


def test_every_recorded_case_is_run():
    assert set(RECORDED["hashes"]) == set(cases.CASES)


@pytest.mark.parametrize("name", sorted(cases.CASES))
def test_formulation_keeps_its_bytes(name, one_thread):
    assert cases.run_hash(name) == RECORDED["hashes"][name]


@pytest.mark.parametrize("name", [name for name in sorted(cases.CASES) if name.startswith("float32-chunk")])
def test_deterministic_kernels_keep_the_cpu_bytes(name, one_thread):
    """A run computes under its device policy (deterministic kernels by default, focusfl/device.py):
    on a CPU the kernels focusfl uses were deterministic already, so the bytes are the same."""
    from focusfl.device import device_policy, policy_applied

    with policy_applied(device_policy("cpu")):
        assert torch.are_deterministic_algorithms_enabled()
        assert cases.run_hash(name) == RECORDED["hashes"][name]

"""Every formulation of the nn problem computes the bytes it did before NeuralNetwork was split
into data, formulation and evaluation (tests/nn_formulation_cases.py recorded them with the
one-class problem): chunks of 1, 2 and all clients, channels-last and NCHW, crop-flip, dropout,
the reference loop, the vmap path, a validation share, float32 and float64.

The recorded bytes are native-mode bytes of one machine, keyed by its kernel fingerprint
(focusfl.device.kernel_fingerprint: CPU vendor, model and instruction sets, torch build, MKL and
oneDNN versions, numerical environment, one thread): another CPU, or the same one under
MKL_CBWR=AVX2 or ATEN_CPU_CAPABILITY=avx2, picks other kernels that round differently, which is no
regression of focusfl's code, so there the record tests skip and say why. What holds on every
x86-64 CPU is checked here too: in the portable numerical environment (focusfl.device
PORTABLE_ENVIRONMENT) the same nn and convex runs compute the same bytes under every emulated CPU."""
from __future__ import annotations

import json
import os
import platform
import subprocess
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
    here = cases.platform()
    if here != RECORDED["platform"]:
        torch.set_num_threads(threads)
        differ = {key: here.get(key) for key in sorted(set(here) | set(RECORDED["platform"]))
                  if here.get(key) != RECORDED["platform"].get(key)}
        pytest.skip(f"native-mode hashes recorded with other kernels; this machine differs in {differ} "
                    "(the portable-mode test covers every CPU)")
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


# Emulated CPUs: what a CPU of another generation changes (ATen's vector width, MKL's code path,
# oneDNN's instruction set); each alone changes native bytes (docs/runs.md, "On any machine").
EMULATED = {"this CPU": {}, "AVX2 ATen and MKL": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"},
            "AVX2 oneDNN": {"ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
            "no vector ATen, MKL AVX-512": {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "AVX512"}}
PORTABLE_CASES = ("float32-chunk2-channels_last-crop-flip", "float32-vmap-crop-flip", "float64-reference-crop-flip")
_CHILD = f"""
import json, sys
sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
import torch
torch.set_num_threads(1)
import nn_formulation_cases as cases
from focusfl.device import numerics
print(json.dumps({{"numerics": numerics()["mode"], "convex": cases.convex_hash(),
                  **{{name: cases.run_hash(name) for name in {PORTABLE_CASES!r}}}}}))
"""


def _hashes(environ: dict[str, str]) -> dict[str, str]:
    src = str(Path(__file__).resolve().parents[1] / "src")
    environ = {**environ, "PYTHONPATH": os.pathsep.join([src, environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", _CHILD], env=environ, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                    reason="the portable environment pins x86-64 kernels; this is another architecture")
def test_portable_bytes_do_not_depend_on_the_cpu():
    """The same nn runs (float32 grouped convolutions with crop-flip, the vmap path, the float64
    reference loop) and a convex run, each in a fresh process started in an emulated CPU's
    environment made portable: one set of bytes, where native mode gives another per CPU."""
    from focusfl.device import PORTABLE_ENVIRONMENT, portable_environment

    bare = {k: v for k, v in os.environ.items() if k not in PORTABLE_ENVIRONMENT and k != "MKL_ENABLE_INSTRUCTIONS"}
    portable = {name: _hashes(portable_environment({**bare, **emulated})) for name, emulated in EMULATED.items()}
    assert all(h["numerics"] == "portable" for h in portable.values())
    assert len({json.dumps(h, sort_keys=True) for h in portable.values()}) == 1, portable
    # Native mode is what the pins are for: there the emulated CPUs' bytes differ.
    native = [_hashes({**bare, **EMULATED[name]}) for name in ("this CPU", "AVX2 ATen and MKL")]
    assert native[0]["numerics"] == "native" and native[0] != native[1]

"""A device is a policy, decided once: everything the device type changes in how focusfl
computes, chosen here from the type and applied before CUDA starts.

- **Deterministic kernels** (``deterministic``, config.json's key of that name, True unless a
  run opts out): ``torch.use_deterministic_algorithms(True)``, cuDNN deterministic without
  benchmarking, and on CUDA ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` set in the environment before
  cuBLAS makes its first handle (cuBLAS reads it once). Measured on one H200 (issue 44): without
  them the same SG-FOCUS command wrote different metrics.csv twice; with them, identical files.
  Opting out (``deterministic=false``) leaves torch's defaults and is part of the run key.
- **Convolution layout** for ``layout=auto``: channels-last on a CPU (oneDNN's fastest), NCHW on
  an accelerator.
- **Clients per grouped call** for ``client_chunk=auto``: the activation budget (elements of
  the forward pass kept for the backward pass) one call may hold.
- **Evaluation batch** for ``eval_batch=auto``.
- **Host copies of index tensors** (:func:`mirrored_copy`, :func:`host_values`): what the host
  copied to the device it can read back without waiting for the device (issue 44: no per-round
  host-device synchronisation).

Every rule is a function of the device type, so each one is unit-testable on a CPU by naming
the type (``device_policy("cuda")``) without CUDA.
"""
from __future__ import annotations

import os
import platform
import re
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import torch

from .errors import ConfigError, NumericsError

# cuBLAS's two deterministic workspace settings (CUDA's reproducibility notes); focusfl sets the
# larger, faster one where the environment names neither.
CUBLAS_WORKSPACE = ":4096:8"
DETERMINISTIC_CUBLAS = (":4096:8", ":16:8")

# Evaluation batch for eval_batch=auto: on a 2-core Xeon the CIFAR-10 CNN evaluated 10,000
# images 2.6x faster at 256 in channels-last than at 1000 in NCHW (a batch's activations stay
# in cache); accelerators want large batches.
EVAL_BATCH_CPU = 256
EVAL_BATCH_ACCELERATOR = 2048
# client_chunk=auto: the largest power-of-two chunk whose forward activations (elements, summed
# over the model's leaf modules, times batch and clients) stay within this budget. On a 2-core
# Xeon, timed per client with one thread (2026-11-24): the MNIST CNN at batch 32 (0.73M elements
# a client) ran fastest at chunks of 4-8 (3.1 ms against 4.9 at one client), the CIFAR-10 CNN at
# batch 128 (5.8M) at 1-2, the MLP and logistic regression (< 0.1M) with every client at once;
# a budget of 2**23 elements picks 8, 1 and all of them. Accelerators want large calls; their
# budget (2**28 elements, 1 GiB in float32 before the backward pass) bounds memory instead.
CHUNK_BUDGET_CPU = 1 << 23
CHUNK_BUDGET_ACCELERATOR = 1 << 28


@dataclass(frozen=True)
class DevicePolicy:
    """What a device type decides (see the module's docstring)."""

    device_type: str
    deterministic: bool
    layout: str  # convolutions' memory layout for layout=auto: channels_last or nchw
    chunk_budget: int  # activation elements one grouped call may keep, for client_chunk=auto
    eval_batch: int  # samples per evaluation forward pass, for eval_batch=auto

    @property
    def cublas_workspace(self) -> str | None:
        """The CUBLAS_WORKSPACE_CONFIG this policy needs (None: any)."""
        return CUBLAS_WORKSPACE if self.deterministic and self.device_type == "cuda" else None

    def torch_settings(self) -> dict[str, bool]:
        """The process-wide torch switches the policy sets (read back by :func:`torch_settings`)."""
        return {"deterministic_algorithms": self.deterministic, "cudnn_deterministic": self.deterministic,
                "cudnn_benchmark": False}


def device_policy(device: str | torch.device, deterministic: bool = True) -> DevicePolicy:
    """The policy of ``device``'s type (``"cpu"``, ``"cuda"``, ``torch.device("cuda:1")``, ...)."""
    kind = torch.device(device).type
    cpu = kind == "cpu"
    return DevicePolicy(
        device_type=kind, deterministic=bool(deterministic), layout="channels_last" if cpu else "nchw",
        chunk_budget=CHUNK_BUDGET_CPU if cpu else CHUNK_BUDGET_ACCELERATOR,
        eval_batch=EVAL_BATCH_CPU if cpu else EVAL_BATCH_ACCELERATOR,
    )


def torch_settings() -> dict[str, bool]:
    """The process's current switches, in :meth:`DevicePolicy.torch_settings`' terms."""
    return {"deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
            "cudnn_benchmark": bool(torch.backends.cudnn.benchmark)}


def _set(settings: dict[str, bool]) -> None:
    torch.use_deterministic_algorithms(settings["deterministic_algorithms"])
    torch.backends.cudnn.deterministic = settings["cudnn_deterministic"]
    torch.backends.cudnn.benchmark = settings["cudnn_benchmark"]


def apply_policy(policy: DevicePolicy) -> None:
    """Set the policy's switches in this process; on CUDA with deterministic kernels, first the
    cuBLAS workspace in the environment, which must happen before CUDA starts (ConfigError, one
    line, if CUDA started already without it)."""
    needed = policy.cublas_workspace
    if needed is not None and os.environ.get("CUBLAS_WORKSPACE_CONFIG") not in DETERMINISTIC_CUBLAS:
        if torch.cuda.is_initialized():
            raise ConfigError(
                "deterministic CUDA kernels need CUBLAS_WORKSPACE_CONFIG=:4096:8 before CUDA starts, and CUDA "
                "started already in this process; set it in the environment (or run with deterministic=false)")
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = needed
    _set(policy.torch_settings())


@contextmanager
def policy_applied(policy: DevicePolicy) -> Iterator[DevicePolicy]:
    """The policy's switches while the block runs, the process's previous ones after (a sweep's
    runs in one process may differ; the cuBLAS workspace stays set, it makes nothing slower)."""
    before = torch_settings()
    apply_policy(policy)
    try:
        yield policy
    finally:
        _set(before)


# -- host copies of index tensors ----------------------------------------------------------------
# Reading a CUDA tensor on the host (int(t), t.item(), t.tolist()) waits for every kernel queued
# before it: once a round, that stops the host while the GPU drains, and the next round's kernels
# start late. The round loop copies the active clients to the device a chunk of rounds at a time
# (engine/loop.py round_actives) from host arrays; keeping those arrays lets whoever holds a view
# of the copy (a round's set, a chunk of it, one client) read its values on the host, where they
# were all along. An array is kept exactly as long as its copy lives: a view holds its base
# tensor, and the entry goes when the base does (then its memory may become another tensor's).
_mirrors: dict[int, tuple[weakref.ref, np.ndarray]] = {}


def mirrored_copy(values: np.ndarray, device: torch.device | str) -> torch.Tensor:
    """``values`` (1-D) as a tensor on ``device``, the host array kept for :func:`host_values`
    while the tensor or a view of it lives. The tensor is an index set, read-only by contract:
    the host keeps the values it copied."""
    values = np.ascontiguousarray(values)
    return mirrored(torch.as_tensor(values, device=device), values)


def mirrored(tensor: torch.Tensor, values: np.ndarray) -> torch.Tensor:
    """``tensor`` (1-D, its own storage, holding ``values``) registered for :func:`host_values`:
    a tensor made on the device from mirrored parts (a concatenation) keeps its host copy too."""
    if tensor.dim() == 1 and tensor.numel():
        address = tensor.untyped_storage().data_ptr()
        kept = weakref.ref(tensor)
        _mirrors[address] = (kept, np.ascontiguousarray(values))
        weakref.finalize(tensor, _forget, address, kept)
    return tensor


def _forget(address: int, kept: weakref.ref) -> None:
    if _mirrors.get(address, (None,))[0] is kept:
        del _mirrors[address]


def host_values(tensor: torch.Tensor) -> np.ndarray | None:
    """The values of ``tensor`` read on the host without the device: ``tensor`` a 1-D view of a
    live :func:`mirrored_copy` (a slice, a split). None for any other tensor (read it on its device)."""
    if tensor.dim() != 1:
        return None
    kept = _mirrors.get(tensor.untyped_storage().data_ptr())
    copy = kept[0]() if kept is not None else None
    if copy is None:
        return None
    values = kept[1]
    start, stride, count = tensor.storage_offset(), tensor.stride(0), tensor.numel()
    if copy.device != tensor.device or copy.dtype != tensor.dtype or stride < 1:
        return None
    if start + stride * (count - 1) >= len(values):
        return None
    return values[start:start + stride * count:stride] if count else values[:0]


# -- the numerical environment -------------------------------------------------------------------
# Which kernels a CPU computes with is chosen by the libraries when they load, from the CPU and
# from these variables (read once, before torch is imported: ATen's at its import, MKL's and
# oneDNN's at their first call): ATen's vectorised kernels (ATEN_CPU_CAPABILITY), MKL's
# conditional numerical reproducibility and instruction cap (MKL_CBWR, MKL_ENABLE_INSTRUCTIONS),
# oneDNN's instruction cap (ONEDNN_MAX_CPU_ISA, formerly DNNL_MAX_CPU_ISA). Measured on an AMD
# EPYC with AVX-512 (issue 49): each of ATEN_CPU_CAPABILITY=avx2, MKL_CBWR=AVX2 and
# ONEDNN_MAX_CPU_ISA=AVX2 changes the bytes of the nn formulations' runs, so a CPU of another
# generation computes other bytes unless the environment pins the kernels to the ones every x86-64
# CPU has: PORTABLE_ENVIRONMENT (docs/runs.md, "On any machine").
NUMERICS_VARIABLES = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA",
                      "DNNL_MAX_CPU_ISA")
PORTABLE_ENVIRONMENT = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "SSE41"}
# The CPU's instruction-set extensions that change which kernels the libraries pick.
_KERNEL_FLAGS = ("sse4_1", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
                 "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "amx_fp16")


def portable_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """``environ`` (default: this process's) with the portable kernels' variables set: the
    environment to start a process in whose bytes do not depend on which x86-64 CPU runs it."""
    return {**(os.environ if environ is None else environ), **PORTABLE_ENVIRONMENT}


def numerics() -> dict[str, str]:
    """The numerical environment this process computes in: the kernel-choosing variables as set
    (those unset are left out), ATen's capability in force, and ``mode``: "portable" where every
    PORTABLE_ENVIRONMENT variable is in force, else "native" (the CPU's own fastest kernels)."""
    variables = {name: os.environ[name] for name in NUMERICS_VARIABLES if name in os.environ}
    capability = torch.backends.cpu.get_cpu_capability()
    portable = capability == "DEFAULT" and all(
        variables.get(name, "").upper() == value.upper() for name, value in PORTABLE_ENVIRONMENT.items()
        if name != "ATEN_CPU_CAPABILITY")
    return {"mode": "portable" if portable else "native", "aten_capability": capability, **variables}


def require_numerics(wanted: str) -> None:
    """NumericsError (one line) unless this process computes in the numerical environment
    ``wanted`` ("native" or "portable", a run's ``numerics``): the variables that choose the
    kernels are read when torch loads, so a process cannot change its environment afterwards."""
    mode = numerics()["mode"]
    if mode == wanted:
        return
    variables = " ".join(f"{name}={value}" for name, value in PORTABLE_ENVIRONMENT.items())
    if wanted == "portable":
        raise NumericsError(f"the run asks for numerics=portable and this process computes with its CPU's native "
                            f"kernels: set {variables} before torch is imported (the focusfl command does it "
                            f"itself)", wanted)
    raise NumericsError(f"the run asks for numerics=native and this process computes in the portable environment "
                        f"({variables}): run with numerics=portable, or without those variables", wanted)


def _cpu() -> tuple[str, str, list[str]]:
    """The CPU's vendor, model and instruction-set flags (Linux's /proc/cpuinfo; elsewhere
    platform's processor name and no flags)."""
    vendor, model, flags = platform.machine(), platform.processor(), []
    try:
        text = open("/proc/cpuinfo", encoding="utf-8", errors="replace").read(1 << 20)
    except OSError:
        return vendor, model, flags
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "vendor_id":
            vendor = value
        elif key == "model name":
            model = value
        elif key == "flags":
            flags = value.split()
            break
    return vendor, model, flags


def kernel_fingerprint() -> dict[str, Any]:
    """What decides the kernels a CPU run computes with, besides focusfl's code: the CPU (vendor,
    model, the instruction sets the libraries choose by), torch's build, MKL's and oneDNN's
    versions, the numerical environment (:func:`numerics`) and the thread count. Two processes
    with equal fingerprints compute the same bytes in native mode; a byte record made in native
    mode holds where the fingerprint is its own (tests key their records by it)."""
    vendor, model, flags = _cpu()
    config = torch.__config__.show()
    mkl = re.search(r"Math Kernel Library Version ([^\s-]+)", config)
    onednn = re.search(r"MKL-DNN v([\d.]+)", config)
    return {"cpu_vendor": vendor, "cpu_model": model, "cpu_flags": [f for f in _KERNEL_FLAGS if f in flags],
            "torch": torch.__version__, "torch_commit": torch.version.git_version,
            "mkl": mkl.group(1) if mkl else None, "onednn": onednn.group(1) if onednn else None,
            "numerics": numerics(), "threads": torch.get_num_threads()}

"""The nn problem's formulations, run a few rounds each and hashed (state, client state, rows).

tests/test_nn_formulations.py asserts the hashes in tests/fixtures/nn_formulation_hashes.json,
recorded with the one-class NeuralNetwork before it was split into data, formulation and
evaluation (so the split, and every later change to those parts, keeps the bytes). Run as a
script to print the current hashes: ``PYTHONPATH=src python tests/nn_formulation_cases.py``.
"""
from __future__ import annotations

import hashlib
import json
import sys

import numpy as np
import torch

from focusfl.algorithms import make_algorithm
from focusfl.data import Dataset, ImageData
from focusfl.engine import simulate
from focusfl.participation import make_participation
from focusfl.problems.nn import NeuralNetwork


def _dataset() -> Dataset:
    """Random 3x16x16 images with a class-specific bright row (crop-flip needs 3 channels)."""
    rng = np.random.default_rng(5)

    def split(count):
        labels = rng.integers(0, 10, count)
        images = rng.integers(0, 160, (count, 3, 16, 16))
        images[np.arange(count), :, labels % 16, :] += 90
        return ImageData(images.astype(np.uint8), labels)

    return Dataset("toy3", split(320), split(64), 10)


# name -> (problem parameters, engine, algorithm)
_BASE = {"clients": 8, "batch": 16, "alpha": 0.5, "model": "fedsum-mnist-cnn"}  # dropout 0.2 twice
CASES: dict[str, tuple[dict, str, str]] = {}
for _dtype in ("float32", "float64"):
    for _chunk in (1, 2, 0):
        for _layout in ("channels_last", "nchw"):
            for _augment in ("none", "crop-flip"):
                CASES[f"{_dtype}-chunk{_chunk}-{_layout}-{_augment}"] = (
                    {**_BASE, "client_chunk": _chunk, "layout": _layout, "augment": _augment, "dtype": _dtype},
                    "vectorized", "sg_focus")
    CASES[f"{_dtype}-reference-crop-flip"] = ({**_BASE, "augment": "crop-flip", "dtype": _dtype}, "reference",
                                              "sg_focus")
    CASES[f"{_dtype}-vmap-crop-flip"] = ({**_BASE, "augment": "crop-flip", "client_batching": "vmap",
                                          "dtype": _dtype}, "vectorized", "fedavg")
    CASES[f"{_dtype}-auto-validation"] = ({**_BASE, "validation": 0.2, "dtype": _dtype}, "vectorized", "focus")
CASES["float32-mlp-auto"] = ({**_BASE, "model": "mlp", "dtype": "float32"}, "vectorized", "sg_focus")
CASES["float32-focus-cnn-auto"] = ({**_BASE, "model": "focus-cnn", "augment": "crop-flip", "batch": 8,
                                    "dtype": "float32"}, "vectorized", "sg_focus")


def run_hash(name: str) -> str:
    params, engine, algorithm = CASES[name]
    params = dict(params)
    dtype = getattr(torch, params.pop("dtype"))
    problem = NeuralNetwork(dataset=_dataset(), dtype=dtype, **params)
    participation = make_participation("bernoulli:p=0.5", problem.num_clients, seed=1)
    result = simulate(make_algorithm(algorithm, lr=0.05, local_steps=2), problem, participation, 3, seed=7,
                      engine=engine)
    digest = hashlib.sha256()
    for tensor in (*result.state.server, *result.state.clients):
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    digest.update(json.dumps(result.rows, sort_keys=True, default=repr).encode())
    digest.update(json.dumps(problem.describe(), sort_keys=True, default=str).encode())
    return digest.hexdigest()[:24]


def convex_hash() -> str:
    """A convex run's bytes (float64 ridge, partial participation, FOCUS): the state and rows."""
    from focusfl.problems import make_problem

    problem = make_problem("ridge:clients=12,samples=20,dim=9")
    participation = make_participation("bernoulli:p=0.5", problem.num_clients, seed=1)
    result = simulate(make_algorithm("focus", lr=0.05, local_steps=3), problem, participation, 20, seed=7)
    digest = hashlib.sha256()
    for tensor in (*result.state.server, *result.state.clients):
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    digest.update(json.dumps(result.rows, sort_keys=True, default=repr).encode())
    return digest.hexdigest()[:24]


def platform() -> dict:
    """What the recorded bytes depend on besides the code: the kernel fingerprint (CPU, torch
    build, MKL and oneDNN versions, numerical environment, threads; focusfl.device)."""
    from focusfl.device import kernel_fingerprint

    return kernel_fingerprint()


if __name__ == "__main__":
    torch.set_num_threads(1)
    out = {"platform": platform(), "hashes": {name: run_hash(name) for name in CASES}}
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    print()

"""Counter-based randomness keyed by (seed, round, client, step).

Every engine (vectorized, per-client reference loop, later Flower) must see the same
minibatches, so draws cannot come from a stateful generator whose order depends on how
clients are batched. Instead each draw is a hash of its coordinates: the same
(seed, round, client, step, j) always gives the same number, whichever engine asks.

The hash works on int64 tensors holding 32-bit values, so it vectorizes over any batch of
clients and runs on CPU or GPU alike.
"""
from __future__ import annotations

import numpy as np
import torch

_MASK32 = 0xFFFFFFFF
# Odd multipliers of the "lowbias32" integer hash (Wellons, hash-prospector).
_MUL1 = 0x7FEB352D
_MUL2 = 0x846CA68B
# Distinct offsets so that the coordinates (seed, round, ...) do not commute.
_SALTS = (0x9E3779B9, 0x85EBCA6B, 0xC2B2AE35, 0x27D4EB2F, 0x165667B1)
# The same constants as NumPy uint64 scalars (for _mix_numpy: no mixed-type promotion).
_U_MASK32, _U_MUL1, _U_MUL2 = np.uint64(_MASK32), np.uint64(_MUL1), np.uint64(_MUL2)
_U15, _U16 = np.uint64(15), np.uint64(16)


def _mul32(x: torch.Tensor, const: int) -> torch.Tensor:
    """(x * const) mod 2**32 for x in [0, 2**32), without int64 overflow."""
    low = (x & 0xFFFF) * const
    high = ((x >> 16) * const) & 0xFFFF
    return (low + (high << 16)) & _MASK32


def _mix(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = _mul32(x, _MUL1)
    x = x ^ (x >> 15)
    x = _mul32(x, _MUL2)
    return x ^ (x >> 16)


def _mix_int(x: int) -> int:
    """:func:`_mix` of one Python int in [0, 2**32): the same bits, without a tensor op."""
    x ^= x >> 16
    x = (x * _MUL1) & _MASK32
    x ^= x >> 15
    x = (x * _MUL2) & _MASK32
    return x ^ (x >> 16)


def _mix_numpy(x: np.ndarray) -> np.ndarray:
    """:func:`_mix` on uint64 arrays of 32-bit values: a product of two values below 2**32 fits
    in 64 bits, so the multiplications need no splitting (5 array ops where tensors take 17)."""
    x = x ^ (x >> _U16)
    x = (x * _U_MUL1) & _U_MASK32
    x = x ^ (x >> _U15)
    x = (x * _U_MUL2) & _U_MASK32
    return x ^ (x >> _U16)


def _on_numpy(coords: tuple, device) -> bool:
    """Whether the hash can run in NumPy: every tensor a CPU tensor (and the result wanted on the
    CPU) and no torch.func transform (vmap, grad) active, whose batched tensors NumPy cannot read."""
    if device is not None and torch.device(device).type != "cpu":
        return False
    tensors = [c for c in coords if isinstance(c, torch.Tensor)]
    if any(t.device.type != "cpu" for t in tensors):
        return False
    # A torch without this (private) query is taken as inside a transform: the tensor path, always right.
    transforms_active = getattr(torch._C, "_are_functorch_transforms_active", lambda: True)
    return not (tensors and transforms_active())


def hash_bits(*coords: torch.Tensor | int, device: torch.device | str | None = None) -> torch.Tensor:
    """A 32-bit hash (int64 tensor) of broadcast coordinates, e.g. (seed, round, client, step, j).

    The same bits on every path (tests/test_rng.py checks them against the tensor-only hash):
    Python int coordinates (seed, round, step, ...) are mixed as Python ints, and on a CPU the
    tensors are mixed in NumPy. A draw of one client step otherwise spent most of its time in
    some hundred tensor ops on a handful of numbers (the CIFAR-10 benchmark's rounds: 4%)."""
    assert coords, "hash_bits needs at least one coordinate"
    numpy = _on_numpy(coords, device)
    state = None
    for position, coord in enumerate(coords):
        salt = _SALTS[position % len(_SALTS)]
        if isinstance(coord, int):
            value = _mix_int((coord & _MASK32) ^ salt)
        elif numpy:
            array = torch.as_tensor(coord, dtype=torch.int64).numpy()
            value = _mix_numpy((array & _MASK32).astype(np.uint64) ^ np.uint64(salt))
        else:
            value = _mix((torch.as_tensor(coord, dtype=torch.int64, device=device) & _MASK32) ^ salt)
        if state is None:
            state = value
        elif isinstance(state, int) and isinstance(value, int):
            state = _mix_int(state ^ value)
        elif numpy:
            state = _mix_numpy(np.bitwise_xor(state, value, dtype=np.uint64))
        else:
            state = _mix(state ^ value)
    if isinstance(state, int):
        return torch.tensor(state, dtype=torch.int64, device=device)
    if numpy:
        return torch.from_numpy(np.asarray(state).astype(np.int64))
    return state


def uniform(*coords: torch.Tensor | int, device=None, dtype=torch.float64) -> torch.Tensor:
    """Uniform numbers in [0, 1) keyed by the coordinates (32 bits of resolution)."""
    return hash_bits(*coords, device=device).to(dtype) / float(2**32)


def minibatch_indices(
    seed: int,
    round_: int,
    clients: torch.Tensor,
    step: int,
    batch: int,
    sizes: torch.Tensor,
) -> torch.Tensor:
    """Per-client minibatches drawn without replacement: ``[n, batch]`` sample indices.

    ``sizes[k]`` is how many samples client ``clients[k]`` holds; each row holds distinct
    indices in ``[0, sizes[k])``. Every sample gets a hashed key and the ``batch`` smallest
    keys win, so one client's draw does not depend on which other clients are in the batch.
    ``batch`` must not exceed ``sizes.min()``.
    """
    device = clients.device
    if clients.numel() == 0:  # a round with no participant draws nothing
        return torch.empty((0, batch), dtype=torch.int64, device=device)
    max_size = int(sizes.max())
    positions = torch.arange(max_size, device=device)
    keys = uniform(
        seed, round_, clients[:, None], step, positions[None, :], device=device
    )
    # Positions past a client's own size can never be chosen.
    keys = torch.where(positions[None, :] < sizes[:, None], keys, torch.full_like(keys, 2.0))
    return torch.topk(keys, batch, dim=1, largest=False, sorted=True).indices

"""Counter-based randomness keyed by (seed, round, client, step).

Every engine (vectorized, per-client reference loop, later Flower) must see the same
minibatches, so draws cannot come from a stateful generator whose order depends on how
clients are batched. Instead each draw is a hash of its coordinates: the same
(seed, round, client, step, j) always gives the same number, whichever engine asks.

The hash works on int64 tensors holding 32-bit values, so it vectorizes over any batch of
clients and runs on CPU or GPU alike.
"""
from __future__ import annotations

import torch

_MASK32 = 0xFFFFFFFF
# Odd multipliers of the "lowbias32" integer hash (Wellons, hash-prospector).
_MUL1 = 0x7FEB352D
_MUL2 = 0x846CA68B
# Distinct offsets so that the coordinates (seed, round, ...) do not commute.
_SALTS = (0x9E3779B9, 0x85EBCA6B, 0xC2B2AE35, 0x27D4EB2F, 0x165667B1)


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


def hash_bits(*coords: torch.Tensor | int, device: torch.device | str | None = None) -> torch.Tensor:
    """A 32-bit hash (int64 tensor) of broadcast coordinates, e.g. (seed, round, client, step, j)."""
    state = None
    for position, coord in enumerate(coords):
        value = torch.as_tensor(coord, dtype=torch.int64, device=device) & _MASK32
        salt = _SALTS[position % len(_SALTS)]
        state = _mix(value ^ salt) if state is None else _mix(state ^ _mix(value ^ salt))
    assert state is not None, "hash_bits needs at least one coordinate"
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

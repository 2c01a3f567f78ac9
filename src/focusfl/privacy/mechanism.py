"""The Gaussian mechanism on a round's stacked client messages: every vector a client sends
clipped to norm C, then Gaussian noise, keyed by (seed, nonce, round, client, field, coordinate)
(the nonce: the run's, privacy.dp_nonce; a run recorded before the nonce resumes keyed by the
seed alone, noise_key).

A message is the NamedTuple an algorithm's ``client_round`` returns: its fields of shape
[n, ...] with more than one dimension are vectors (FOCUS's u; SCAFFOLD's delta_x and delta_c),
each clipped on its own; fields of shape [n] are per-client scalars (push-sum's weight w,
FedNova's tau) that carry no data and pass as they are. The algorithm never sees the difference:
privacy wraps its messages (docs/privacy.md lists what is clipped for each algorithm and why).

The noise is N(0, (sigma C)^2) per coordinate of each client's vector in ``local`` mode; in
``central`` mode each of the n rows gets N(0, (sigma C)^2 / n), so the SUM of the round's
messages, which is what the server aggregates, carries N(0, (sigma C)^2). Keyed draws (rng.py)
make the noise a pure function of its coordinates: the vectorized and the reference engine,
any chunking, a federation's nodes and a resumed run add the same bits.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from ..rng import hash_bits
from .config import DPConfig

# Coordinate 3 of the noise's keys (a minibatch draw puts its step index there): far above any
# step count, so the noise never reuses a minibatch's bits.
NOISE_STREAM = 0x44500000


def vector_fields(message: Any) -> tuple[int, ...]:
    """Indices of the message's fields that are per-client vectors ([n, ...] with ndim > 1)."""
    return tuple(k for k, value in enumerate(message) if isinstance(value, torch.Tensor) and value.dim() > 1)


def clip_rows(rows: torch.Tensor, clip: float) -> torch.Tensor:
    """Each row scaled to norm at most ``clip`` (rows already within it are left bit for bit)."""
    norms = rows.flatten(1).norm(dim=1)
    scale = clip / torch.clamp(norms, min=clip)
    return rows * scale.view(-1, *([1] * (rows.dim() - 1)))


def noise_key(seed: int, nonce: int | None) -> tuple[int, ...]:
    """The words a run's noise is keyed by before (round, client, field, coordinate): its seed and
    its nonce as two 32-bit words. ``nonce`` None: the seed alone, the key of the DP runs recorded
    before the nonce (config.json with a dp and no dp_nonce), the same in every run of one seed;
    it is kept only so that such a run resumes with the noise its first rounds drew
    (runs.driver.BuiltRun.legacy_key); nothing new draws it."""
    return (seed,) if nonce is None else (seed, nonce, nonce >> 32)


def keyed_gaussian(seed: int, round_: int, clients: torch.Tensor, field: int, dim: int,
                   nonce: int | None = 0) -> torch.Tensor:
    """Standard normal numbers, float64 [n, dim], one row per client, keyed by (seed, nonce, round,
    client, field, coordinate) (the nonce: the run's, privacy.dp_nonce; None: noise_key's legacy
    key): Box-Muller on pairs of 32-bit uniforms, both of its normals used (one hash per number;
    the tail is cut at about 6.7 standard deviations, docs/privacy.md)."""
    half = (dim + 1) // 2
    positions = torch.arange(2 * half, dtype=torch.int64, device=clients.device)
    bits = hash_bits(*noise_key(seed, nonce), round_, clients[:, None], NOISE_STREAM + field, positions[None, :],
                     device=clients.device)
    uniforms = (bits.to(torch.float64) + 0.5) / float(2**32)
    radius = torch.sqrt(-2.0 * torch.log(uniforms[:, :half]))
    angle = (2.0 * math.pi) * uniforms[:, half:]
    return torch.cat([radius * torch.cos(angle), radius * torch.sin(angle)], dim=1)[:, :dim]


def noise_std(dp: DPConfig, participants: int) -> float:
    """The standard deviation added to each client's row: sigma C (local), sigma C / sqrt(n)
    (central: the n rows' sum carries sigma C)."""
    if dp.mode == "local":
        return dp.noise * dp.clip
    return dp.noise * dp.clip / math.sqrt(participants)


def privatize(dp: DPConfig, message: Any, active: torch.Tensor, round_: int, seed: int, *,
              legacy_key: bool = False) -> Any:
    """The message with every vector field clipped and noised (the rows of clients ``active``),
    the noise keyed by ``seed`` and the record's nonce (0 where none is set: a mechanism used
    outside a run; every run sets its own, privacy.run_privacy); ``legacy_key``: by the seed
    alone (noise_key), a run recorded before the nonce and resumed."""
    nonce = None if legacy_key else 0 if dp.nonce is None else dp.nonce
    n = active.numel()
    if n == 0:
        return message
    std = noise_std(dp, n)
    fields = list(message)
    for k in vector_fields(message):
        rows = clip_rows(fields[k], dp.clip)
        if std > 0:
            noise = keyed_gaussian(seed, round_, active, k, rows[0].numel(), nonce).mul_(std)
            rows = rows + noise.view_as(rows).to(rows.dtype)
        fields[k] = rows
    return type(message)(*fields)

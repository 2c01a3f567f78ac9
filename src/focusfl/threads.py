"""The torch thread count a computation runs with: part of its result, so never the machine's.

Reductions (matrix products, convolutions' weight gradients, sums) are split between intra-op
threads, and the split changes float results at the rounding level. A run therefore computes
with the thread count its configuration records (``RunConfig.threads``, default 1), and a
Flower node or server with one thread, as the reference replay of a federation does.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

DEFAULT_THREADS = 1


@contextmanager
def fixed_threads(threads: int = DEFAULT_THREADS) -> Iterator[None]:
    """torch's intra-op thread count set to ``threads`` inside the block, restored after it."""
    before = torch.get_num_threads()
    if before != threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)

"""The torch thread count a computation runs with: part of its result, so never the machine's.

Reductions (matrix products, convolutions' weight gradients, sums) are split between intra-op
threads, and the split changes float results at the rounding level. A run therefore computes
with the thread count its configuration records (``RunConfig.threads``, default 1), and a
Flower node or server with one thread, as the reference replay of a federation does.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
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


# -- clients side by side ---------------------------------------------------------------------
# The vectorized engine computes the active clients in fixed chunks (problem.client_chunk,
# recorded in config.json). With client_workers > 1, several chunks are computed at once, each
# by one worker thread with the run's intra-op thread count: a chunk is computed exactly as it
# would be alone, the chunks' results are joined in chunk order, so the bytes are those of one
# worker whatever their number. Measured on 2 quiet cores (docs/performance.md): the CIFAR CNN's
# round in 0.168 s with 2 workers of 1 thread against 0.278 s with 1, and 0.200 s with 1 worker
# of 2 intra-op threads (at batch 32 the operations are too small for two threads to split).
_POOL: ContextVar[ThreadPoolExecutor | None] = ContextVar("focusfl_client_workers", default=None)


@contextmanager
def client_workers(workers: int = 1, threads: int = DEFAULT_THREADS) -> Iterator[None]:
    """Inside the block, the vectorized engine's chunks of clients are computed by ``workers``
    threads of ``threads`` intra-op threads each (1: in the calling thread, as before). Only the
    thread that enters the block uses them; the pool is shut down on leaving."""
    if workers <= 1:
        yield
        return
    pool = ThreadPoolExecutor(workers, thread_name_prefix="focusfl-clients",
                              initializer=torch.set_num_threads, initargs=(threads,))
    token = _POOL.set(pool)
    try:
        yield
    finally:
        _POOL.reset(token)
        pool.shutdown(wait=True, cancel_futures=True)


def chunk_workers() -> ThreadPoolExecutor | None:
    """The pool of :func:`client_workers` this thread computes in, or None."""
    return _POOL.get()

"""The torch thread count a computation runs with: part of its result, so never the machine's.

Reductions (matrix products, convolutions' weight gradients, sums) are split between intra-op
threads, and the split changes float results at the rounding level. A run therefore computes
with the thread count its configuration records (``RunConfig.threads``, default 1), and a
Flower node or server with one thread, as the reference replay of a federation does.
"""
from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
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
MAX_CLIENT_WORKERS = 1024  # more threads than any machine's cores: a typo, refused in one line (runs/config.py)
_POOL: ContextVar["ChunkPool | None"] = ContextVar("focusfl_client_workers", default=None)


class ChunkPool:
    """``workers`` daemon threads of ``threads`` intra-op threads each, computing a round's
    chunks. Daemon threads, not concurrent.futures': a user's client round that never returns
    must not keep the process from exiting once a signal has stopped the run (Python joins an
    executor's threads at exit)."""

    def __init__(self, workers: int, threads: int) -> None:
        self.tasks: queue.SimpleQueue = queue.SimpleQueue()
        self.workers, self.intra = workers, threads
        self.threads: list[threading.Thread] = []  # started as a round's chunks need them, up to workers

    def _grow(self, wanted: int) -> None:
        while len(self.threads) < min(wanted, self.workers):
            thread = threading.Thread(target=self._serve, args=(self.intra,), name=f"focusfl-clients-{len(self.threads)}",
                                      daemon=True)
            thread.start()
            self.threads.append(thread)

    def _serve(self, threads: int) -> None:
        torch.set_num_threads(threads)  # a new thread's OpenMP team is the process default's size
        while (task := self.tasks.get()) is not None:
            future, function, args = task
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(function(*args))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller, which raises it
                future.set_exception(exc)

    def map(self, function, *iterables) -> list:
        """``[function(*args) for args in zip(*iterables)]``, computed by the workers, in order."""
        calls = list(zip(*iterables))
        self._grow(len(calls))
        futures = []
        for args in calls:
            future: Future = Future()
            self.tasks.put((future, function, args))
            futures.append(future)
        try:
            return [future.result() for future in futures]
        except BaseException:  # a chunk's error, or a signal's stop: the chunks not started are dropped
            for future in futures:
                future.cancel()
            raise

    def close(self, wait: bool) -> None:
        for _ in self.threads:
            self.tasks.put(None)
        if wait:
            for thread in self.threads:
                thread.join()


@contextmanager
def client_workers(workers: int = 1, threads: int = DEFAULT_THREADS) -> Iterator[None]:
    """Inside the block, the vectorized engine's chunks of clients are computed by ``workers``
    threads of ``threads`` intra-op threads each (1: in the calling thread, as before). Only the
    thread that enters the block uses them. Left with an error (a signal's stop included), the
    block does not wait for a chunk still computing."""
    if workers <= 1:
        yield
        return
    pool = ChunkPool(workers, threads)
    token = _POOL.set(pool)
    failed = True
    try:
        yield
        failed = False
    finally:
        _POOL.reset(token)
        pool.close(wait=not failed)


def chunk_workers() -> "ChunkPool | None":
    """The pool of :func:`client_workers` this thread computes in, or None."""
    return _POOL.get()

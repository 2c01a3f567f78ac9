"""Signal handlers set for the length of a block, the previous ones restored on leaving: the one
definition behind a run's stop-at-the-end-of-the-round, the ServerApp's StopRounds and
``federation local``'s handling of SIGTERM/SIGHUP and of its start-up."""
from __future__ import annotations

import contextlib
import signal
import sys
import threading
from typing import Any, Iterable, Iterator


@contextlib.contextmanager
def handled(signals: Iterable[int], handler: Any, *, keep_ignored: bool = False) -> Iterator[None]:
    """``handler`` (a function or signal.SIG_IGN) for each of ``signals`` inside the block.

    Only the main thread can set handlers: elsewhere the block runs with the handlers as they
    are. ``keep_ignored``: a signal ignored when focusfl started (SIGHUP under nohup, a background
    job's SIGINT) stays ignored, as whoever started it asked.

    The handlers are set and restored with the signals held back, and restored whatever a
    handler raises meanwhile: a sweep sends its workers SIGTERM every half second, and one that
    landed between two restores (a run's handler raising its second-signal stop) left the run's
    handler behind, to raise again at the worker's exit, in the middle of torch's atexit hook
    (CI printed that traceback under the sweep's one-line error)."""
    signals = list(signals)
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, Any] = {}
    with _held(signals):
        for sig in signals:
            if not (keep_ignored and signal.getsignal(sig) is signal.SIG_IGN):
                previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        _restore(previous)


def _restore(previous: dict[int, Any]) -> None:
    """Every handler in ``previous`` back in place. A handler that ran in between (for a signal
    that arrived before they were held back) and raised does not stop the others being restored:
    they are all set again, and its exception is raised afterwards, unless the block is already
    ending with one of its own (the block's reason is the one to report)."""
    raised: BaseException | None = None
    with _held(list(previous)):
        for _ in range(len(previous) + 2):  # each signal's handler runs at most once while held back
            try:
                for sig, old in previous.items():
                    if old is not None:  # None: set outside Python, cannot be restored from here
                        signal.signal(sig, old)
                break
            except BaseException as exc:  # noqa: BLE001 - a handler's exception, raised below
                raised = raised or exc
    if raised is not None and sys.exc_info()[1] is None:
        raise raised


@contextlib.contextmanager
def _held(signals: list[int]) -> Iterator[None]:
    """``signals`` blocked inside the block; one that arrives meanwhile is delivered on leaving
    (to the handler then in place)."""
    if not signals or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)

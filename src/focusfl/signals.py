"""Signal handlers set for the length of a block, the previous ones restored on leaving: the one
definition behind a run's stop-at-the-end-of-the-round, the ServerApp's StopRounds and
``federation local``'s handling of SIGTERM/SIGHUP and of its start-up."""
from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Iterable, Iterator


@contextlib.contextmanager
def handled(signals: Iterable[int], handler: Any, *, keep_ignored: bool = False) -> Iterator[None]:
    """``handler`` (a function or signal.SIG_IGN) for each of ``signals`` inside the block.

    Only the main thread can set handlers: elsewhere the block runs with the handlers as they
    are. ``keep_ignored``: a signal ignored when focusfl started (SIGHUP under nohup, a background
    job's SIGINT) stays ignored, as whoever started it asked."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, handler) for sig in signals
                if not (keep_ignored and signal.getsignal(sig) is signal.SIG_IGN)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            if old is not None:  # None: set outside Python, cannot be restored from here
                signal.signal(sig, old)

"""focusfl.signals.handled: handlers set for a block and restored on leaving, even when a
handler raises in the middle of the restore (a sweep's SIGTERM sent every half second to its
workers left a run's handler behind, which raised again at the worker's exit)."""
import signal

import pytest

import focusfl.signals as signals_module
from focusfl.signals import handled

SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)


class Raised(Exception):
    pass


def _raise(signum, frame):
    raise Raised(signum)


def _current():
    return [signal.getsignal(sig) for sig in SIGNALS]


def test_handlers_are_restored_on_leaving_the_block():
    before = _current()
    with handled(SIGNALS, _raise):
        assert _current() == [_raise, _raise]
    assert _current() == before


def test_a_handler_raising_between_two_restores_leaves_none_behind(monkeypatch):
    """The first restore is interrupted (as a signal's handler raising at that moment would
    interrupt it): every handler is still restored, and the handler's exception is raised."""
    before = _current()
    real = signal.signal
    interrupted = []

    def interrupting(sig, handler):
        if handler is not _raise and not interrupted:
            interrupted.append(sig)
            real(sig, handler)
            raise Raised(sig)  # after the first restore, before the second
        return real(sig, handler)

    with pytest.raises(Raised):
        with handled(SIGNALS, _raise):
            monkeypatch.setattr(signals_module.signal, "signal", interrupting)
    monkeypatch.undo()
    assert interrupted and _current() == before


def test_the_blocks_own_exception_is_the_one_reported(monkeypatch):
    """A block ending with its own error (a full disk) reports it, not a signal's stop that
    landed while the handlers were being restored; the handlers are restored all the same."""
    before = _current()
    real = signal.signal
    interrupted = []

    def interrupting(sig, handler):
        result = real(sig, handler)
        if handler is not _raise and not interrupted:
            interrupted.append(sig)
            raise Raised(sig)
        return result

    with pytest.raises(OSError, match="disk full"):
        with handled(SIGNALS, _raise):
            monkeypatch.setattr(signals_module.signal, "signal", interrupting)
            raise OSError("disk full")
    monkeypatch.undo()
    assert interrupted and _current() == before


def test_a_signal_arriving_while_the_handlers_are_set_waits_for_them():
    """Held back while the handlers are set, delivered once they are: it reaches the block's handler."""
    seen = []
    with handled(SIGNALS, lambda signum, frame: seen.append(signum)):
        signal.raise_signal(signal.SIGUSR1)
    assert seen == [signal.SIGUSR1]

"""Domain exceptions: each carries a one-line reason that the CLI prints without a traceback."""


class FocusflError(Exception):
    """Base class of every error focusfl raises on purpose."""


class ConfigError(FocusflError, ValueError):
    """A name, key or value given by the user is not valid."""


class NumericsError(ConfigError):
    """A run asks for a numerical environment (``numerics``) that is not the one this process
    computes in; ``wanted`` names the one it asks for. The CLI starts itself again in it
    (cli.main); a library caller sets the variables before importing torch (docs/runs.md)."""

    def __init__(self, message: str, wanted: str) -> None:
        super().__init__(message)
        self.wanted = wanted


class DataError(FocusflError):
    """Input data (a trace, a dataset file) is missing or unreadable."""


class DivergenceError(FocusflError):
    """A run produced NaN or Inf."""


class DiskFullError(FocusflError):
    """A write failed because the disk (or the user's quota) is full; what was written before
    stays, whole, for the next run to resume from. ``reason``: "no space left on device" or
    "disk quota exceeded"."""

    def __init__(self, message: str, reason: str = "no space left on device") -> None:
        super().__init__(message)
        self.reason = reason

    def __reduce__(self):  # a worker process sends it back to the sweep (pickled)
        return type(self), (str(self), self.reason)


class FederationError(FocusflError):
    """A federation cannot go on as asked (too few nodes connected in time)."""

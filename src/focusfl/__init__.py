"""focusfl: federated optimization under arbitrary client participation."""

__version__ = "0.1.0"

"""focusfl on Flower (flwr): every registry algorithm as one generic strategy, exact under faults.

Modules: ``codec`` (records on the wire and their checks), ``node`` (a node's pending and
committed state: the commit protocol), ``client_app`` (the ClientApp), ``strategy``
(``AlgorithmStrategy``), ``server_app`` (the ServerApp and its outputs), ``local`` (a real
SuperLink and SuperNodes on loopback), ``testing`` (an in-process Grid with fault injection).
Importing this package needs Flower: ``pip install "focusfl[flower]"``.
"""
from __future__ import annotations

try:
    import flwr  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    from ..errors import ConfigError

    raise ConfigError('focusfl.flower needs Flower: pip install ".[flower]" in a clone of focusfl '
                      '(or "focusfl[flower]" from a package index)') from exc

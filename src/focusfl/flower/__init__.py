"""focusfl on Flower (flwr): every registry algorithm as one generic strategy, exact under faults.

Modules: ``codec`` (records on the wire and their checks), ``node`` (a node's pending and
committed state: the commit protocol), ``client_app`` (the ClientApp), ``strategy``
(``AlgorithmStrategy``), ``server_app`` (the ServerApp and its outputs), ``local`` (a real
SuperLink and SuperNodes on loopback), ``testing`` (an in-process Grid with fault injection).
Importing this package needs Flower: ``pip install "focusfl[flower]"``.
"""
from __future__ import annotations

import importlib.util

# Found, not imported: the command line builds its federation options from this package on
# every command, and importing flwr takes 0.2 s; its modules import it where they use it.
if importlib.util.find_spec("flwr") is None:  # pragma: no cover - depends on the environment
    from ..errors import ConfigError

    raise ConfigError('focusfl.flower needs Flower: pip install ".[flower]" in a clone of focusfl '
                      '(or "focusfl[flower]" from a package index)')

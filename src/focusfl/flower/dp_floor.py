"""A node's floor on local DP: the least noise its owner accepts (docs/privacy.md, "In a federation").

Under ``--dp ...,mode=local`` a node clips and noises its own message with the clip and sigma the
server sends in the run record (client_app.py). A node given ``dp-min-noise=SIGMA`` in its node
config (``flower-supernode --node-config "partition-id=0 dp-min-noise=1.0"``; ``focusfl
federation local --dp-min-noise``) refuses a run record whose local noise multiplier is below
SIGMA, or that carries no local DP at all (``--dp none``, or central mode, where messages leave
the node bare): it answers every message with a ``malformed`` error, so the server refuses it at
the handshake (one line in its log and audit) and it never trains, let alone sends a message.
The floor is the owner's word, read from the node's own config; the server cannot lower it.
"""
from __future__ import annotations

import math
from typing import Any

from ..errors import ConfigError
from ..privacy.config import DPConfig
from .codec import Malformed
from .per_node import per_node

FLOOR_KEY = "dp-min-noise"  # the node config key


def noise_floor(value: Any, where: str) -> float:
    """``value`` as a floor on sigma (a finite number >= 0); a one-line ConfigError naming
    ``where`` (the option or node config key it came from) otherwise."""
    try:
        sigma = math.nan if isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        sigma = math.nan
    if not math.isfinite(sigma) or sigma < 0:
        raise ConfigError(f"{where}: {value!r} is not a noise multiplier (sigma) >= 0")
    return sigma


def node_floor(node_config: dict) -> float | None:
    """The node's ``dp-min-noise`` (None: no floor); Malformed for a value that is not one."""
    value = (node_config or {}).get(FLOOR_KEY)
    if value is None or value == "":
        return None
    try:
        return noise_floor(value, f"node config {FLOOR_KEY}")
    except ConfigError as exc:
        raise Malformed("malformed", str(exc)) from None


def check_floor(dp: DPConfig | None, floor: float | None) -> None:
    """Malformed when the run's local-DP record ``dp`` (None: the node would send its messages
    bare) gives less noise than the node's ``floor``; nothing without a floor."""
    if floor is None:
        return
    if dp is None:
        raise Malformed("malformed", f"this node's {FLOOR_KEY}={floor:g} accepts only local DP with sigma >= "
                                     f"{floor:g}, and the run has no local DP (--dp none or mode=central: its "
                                     "messages would leave the node bare)")
    if dp.noise < floor:
        raise Malformed("malformed", f"the run asks for local noise sigma={dp.noise:g}, below this node's "
                                     f"{FLOOR_KEY}={floor:g}")


def parse_floors(text: str, nodes: int) -> dict[int, float]:
    """``--dp-min-noise`` of ``federation local``: ``SIGMA`` (every node) or ``K=SIGMA,...``."""
    return per_node(text, nodes, "--dp-min-noise", "SIGMA", ("1.0", "1=1.0,2=0.5"),
                    lambda value: noise_floor(value.strip(), "--dp-min-noise"))

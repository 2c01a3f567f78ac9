"""Checks that a deployment's nodes can serve its problem."""
from __future__ import annotations

from ..errors import ConfigError
from .server_app import build_strategy


def check_nodes(config, nodes: int) -> None:
    """``federation local`` runs client k on node k: the problem needs exactly that many clients."""
    strategy, _ = build_strategy(config, log=lambda text: None)
    clients = strategy.problem.num_clients
    if nodes != clients:
        raise ConfigError(f"--nodes {nodes} but the problem has {clients} clients; "
                          f"give the problem clients={nodes} (node k runs client k)")

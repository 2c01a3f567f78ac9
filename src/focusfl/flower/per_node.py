"""``federation local``'s per-node options: ``VALUE`` for every node or ``NODE=VALUE,...`` for
some (node k runs client k), e.g. ``--deadline 0.5`` or ``--deadline 1=0.5,2=0``."""
from __future__ import annotations

from typing import Callable, TypeVar

from ..errors import ConfigError

T = TypeVar("T")


def per_node(text: str, nodes: int, option: str, unit: str, examples: tuple[str, str],
             value: Callable[[str], T]) -> dict[int, T]:
    """``{node: value(VALUE)}`` of ``text``; ``unit`` names VALUE in the errors and ``examples``
    are one VALUE and one NODE=VALUE list, e.g. ("0.5", "1=0.5,2=0")."""
    text = str(text).strip()
    if not text:
        raise ConfigError(f"{option}: give {unit} or NODE={unit},... (e.g. {examples[0]} or {examples[1]})")
    if "=" not in text:
        return {k: value(text) for k in range(nodes)}
    given: dict[int, T] = {}
    for item in text.split(","):
        node, eq, text_value = item.partition("=")
        node = node.strip().removeprefix("node")
        if not eq or not node.isdigit():
            raise ConfigError(f"{option}: expected NODE={unit}, got {item.strip()!r} (e.g. {examples[1]})")
        k = int(node)
        if k >= nodes:
            raise ConfigError(f"{option}: node {k} does not exist (nodes 0..{nodes - 1})")
        if k in given:
            raise ConfigError(f"{option}: node {k} is given twice")
        given[k] = value(text_value)
    return given

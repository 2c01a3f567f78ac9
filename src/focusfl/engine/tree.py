"""Row operations on NamedTuples of tensors (client state and messages).

Every field of a client-state NamedTuple has the client as its leading dimension, so
gathering the active clients or writing them back is one tensor op per field.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch


def gather_rows(tree: Any, index: torch.Tensor) -> Any:
    """Rows ``index`` of every field: the active clients' state, [n, ...] per field."""
    return type(tree)(*(field.index_select(0, index) for field in tree))


def scatter_rows(tree: Any, index: torch.Tensor, rows: Any) -> Any:
    """A copy of ``tree`` with rows ``index`` replaced by ``rows`` (out of place)."""
    return type(tree)(*(field.index_copy(0, index, new) for field, new in zip(tree, rows)))


def concat_rows(trees: Sequence[Any]) -> Any:
    """Stack per-client NamedTuples (each [1, ...]) into one [n, ...] NamedTuple."""
    first = trees[0]
    return type(first)(*(torch.cat(fields, 0) for fields in zip(*trees)))

"""Row operations on NamedTuples of tensors (client state and messages).

Every field of a client-state NamedTuple has the client as its leading dimension, so
gathering the active clients or writing them back is one tensor op per field.

A run's client table (``State.clients``) is either such a NamedTuple, in memory, or a
:class:`RowStore` that keeps the rows elsewhere (runs/store.py: a memory-mapped file in the
run folder) and reads and writes only the rows asked for; the engines see the same [n, ...]
NamedTuples either way, so where the table lives changes no result.
"""
from __future__ import annotations

import abc
from typing import Any, Sequence

import torch


class RowStore(abc.ABC):
    """A client table kept outside memory: N rows of a NamedTuple type, gathered and written
    back a few at a time. It belongs to its run, so rows are always written in place."""

    num_clients: int

    @abc.abstractmethod
    def gather(self, index: torch.Tensor) -> Any:
        """The rows ``index`` (sorted int64 [n]) as the NamedTuple of [n, ...] tensors."""

    @abc.abstractmethod
    def scatter(self, index: torch.Tensor, rows: Any) -> "RowStore":
        """Write ``rows`` ([n, ...] per field) at ``index``; returns the store itself."""


def gather_rows(tree: Any, index: torch.Tensor) -> Any:
    """Rows ``index`` of every field: the active clients' state, [n, ...] per field."""
    if isinstance(tree, RowStore):
        return tree.gather(index)
    return type(tree)(*(field.index_select(0, index) for field in tree))


def scatter_rows(tree: Any, index: torch.Tensor, rows: Any, *, in_place: bool = False) -> Any:
    """``tree`` with rows ``index`` replaced by ``rows``.

    Out of place by default: a new table per field, the old ``tree`` untouched. With
    ``in_place=True`` (the caller donates ``tree``: nothing else will read it) each field that
    owns its memory alone is updated in place, which saves copying all N rows every round (for
    a neural network that table is N x d floats); fields sharing memory with another field, or
    not contiguous, are still copied. A :class:`RowStore` writes its rows in place whatever
    ``in_place`` says: it is the run's own table, never a caller's.
    """
    if isinstance(tree, RowStore):
        return tree.scatter(index, rows)
    fields = list(tree)
    owners = [field.untyped_storage().data_ptr() for field in fields]
    updated = []
    for field, new, owner in zip(fields, rows, owners):
        if in_place and field.is_contiguous() and owners.count(owner) == 1:
            updated.append(field.index_copy_(0, index, new))
        else:
            updated.append(field.index_copy(0, index, new))
    return type(tree)(*updated)


def concat_rows(trees: Sequence[Any]) -> Any:
    """Stack per-client NamedTuples (each [1, ...]) into one [n, ...] NamedTuple."""
    first = trees[0]
    return type(first)(*(torch.cat(fields, 0) for fields in zip(*trees)))

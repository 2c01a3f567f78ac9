"""Availability matrices, clients x rounds (FedStale's): 0/1 or True/False, in a .csv (an optional
header of round labels, an optional first column of client names as pandas writes a DataFrame;
``#`` lines are comments) or an .npy file; every column is a round."""
from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

from ..errors import ConfigError, DataError
from ..limits import check_allocation, human_bytes
from ..participation.trace import CSV_BYTES_PER_BYTE, read_matrix
from ..participation.trace import MAX_CSV_BYTES as MAX_MATRIX_CSV_BYTES  # what is read; MAX_CSV_BYTES: what is written
from .parsing import ImportedTrace, ImportOptions, first_line


# A matrix CSV line costs its string and a row array (about 170 bytes) besides its text.
CSV_BYTES_PER_LINE = 192
# Cells a matrix may hold: 0/1 as numbers, and the booleans pandas writes and reads by default
# (FedStale's carbon-budget matrices hold True/False).
TRUE_WORDS = ("True", "true", "TRUE")
FALSE_WORDS = ("False", "false", "FALSE")
CELL_VALUES = {**{w: 1 for w in TRUE_WORDS}, **{w: 0 for w in FALSE_WORDS}, "1": 1, "0": 0, "1.0": 1, "0.0": 0}
INDEX_CHOICES = ("auto", "yes", "no")


@dataclass(frozen=True)
class LabelledMatrix:
    """A clients x rounds 0/1 matrix (uint8) with the clients' names and the rounds' labels ("" if none)."""

    data: np.ndarray
    names: list[str] | None
    round_labels: list[str]


def read_availability_matrix(path: Path, options: ImportOptions) -> ImportedTrace:
    """A clients x rounds 0/1 matrix (.csv or .npy) as a rounds x clients trace. A CSV may name its
    clients in a first column and its rounds in a header, as pandas writes a DataFrame
    (FedStale's availability matrices, read there with ``pd.read_csv(path, index_col=[0])``)."""
    kind = "availability matrix"
    if path.suffix.lower() == ".csv":
        matrix = read_labelled_matrix(path, options.index_column, kind)
    else:
        if options.index_column == "yes":
            raise ConfigError(f"--index-column yes applies to a .csv matrix; {path.name!r} is a bare array")
        matrix = LabelledMatrix(_checked_binary(read_matrix(path, kind), path, kind), None, [])
    clients, recorded = matrix.data.shape
    if options.rounds is not None and options.rounds > recorded:
        raise ConfigError(f"--rounds {options.rounds} is more than the {recorded} rounds (columns) of {path.name!r}; "
                          "a trace wraps around when replayed")
    keep = clients if options.clients is None else min(options.clients, clients)
    rounds = recorded if options.rounds is None else options.rounds  # FedStale: df.iloc[:, :n_rounds]
    mask = np.ascontiguousarray(matrix.data[:keep, :rounds].astype(bool).T)
    names = [str(k) for k in range(keep)] if matrix.names is None else matrix.names[:keep]
    source = f"availability matrix {path.name!r} (clients x rounds"
    if matrix.names is not None:
        source += ", clients named in its first column"
    labels = [label for label in matrix.round_labels[:rounds] if label]
    if labels:
        source += f", rounds {labels[0]} .. {labels[-1]}"
    return ImportedTrace(mask, names, source=source + ")", offered=clients)


def _checked_binary(data: np.ndarray, path: Path, kind: str) -> np.ndarray:
    if data.dtype != bool:
        bad = ~np.isin(data, (0, 1))
        if bad.any():
            client, column = (int(v) for v in np.argwhere(bad)[0])
            raise DataError(f"{kind}: {path.name!r} must contain only 0 and 1, found {data[client, column].item():g} "
                            f"for client {client} (row {client + 1}) in round {column}")
    return data.astype(np.uint8)


def read_labelled_matrix(path: Path, index_column: str, kind: str) -> LabelledMatrix:
    """The 0/1 matrix of a CSV (size-checked before it is read), its optional header of round
    labels and its optional first column of client names (see :func:`has_index_column`)."""
    size = path.stat().st_size
    if size > MAX_MATRIX_CSV_BYTES:
        raise DataError(f"{kind} {path.name!r} is {human_bytes(size)} of CSV, more than the "
                        f"{human_bytes(MAX_MATRIX_CSV_BYTES)} read as text; save it as a 0/1 .npy matrix instead")
    check_allocation(size * CSV_BYTES_PER_BYTE, f"{kind} {path.name!r} ({human_bytes(size)} of CSV)")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{kind}: cannot read {path.name!r} ({first_line(exc)})") from None
    lines = text.count("\n") + 1  # before the lines are split: many short lines cost more than their bytes
    check_allocation(size * CSV_BYTES_PER_BYTE + lines * CSV_BYTES_PER_LINE,
                     f"{kind} {path.name!r} ({human_bytes(size)} of CSV, {lines:,} lines)")
    rows = ((k, next(csv.reader([line]))) for k, line in enumerate(text.splitlines(), start=1)
            if line.strip() and not line.lstrip().startswith("#"))
    first = next(rows, None)
    if first is None:
        raise DataError(f"{kind}: {path.name!r} must be a non-empty 2-D matrix, got no data line")
    header = None if all(_is_cell(c) for c in first[1]) else first[1]
    data_rows = rows if header is not None else _chain(first, rows)
    first_row = next(data_rows, None)
    if first_row is None:
        raise DataError(f"{kind}: {path.name!r} must be a non-empty 2-D matrix, got a header and no data line")
    indexed = has_index_column(index_column, header, first_row[1])
    names: list[str] | None = [] if indexed else None
    values, widths = [], set()
    for number, cells in _chain(first_row, data_rows):
        if indexed:
            names.append(cells[0].strip())
            cells = cells[1:]
        values.append(_cell_row(cells, path, kind, number, len(values), indexed))
        widths.add(len(cells))
    if len(widths) > 1:
        raise DataError(f"{kind}: {path.name!r} has rows of different lengths {sorted(widths)}")
    width = widths.pop()
    if width == 0:
        raise DataError(f"{kind}: {path.name!r} must be a non-empty 2-D matrix, got rows with no rounds")
    if header is not None and len(header) != width + (1 if indexed else 0):
        raise DataError(f"{kind}: {path.name!r} has {len(header)} header cells for rows of {width + indexed} cells")
    labels = [c.strip() for c in header[1 if indexed else 0:]] if header is not None else []
    return LabelledMatrix(np.stack(values), names, labels)


def _chain(first, rest):
    yield first
    yield from rest


def _is_cell(text: str) -> bool:
    """Whether ``text`` reads as a matrix value (a number or a boolean word), not a label."""
    text = text.strip()
    if text in CELL_VALUES:
        return True
    try:
        float(text)
    except ValueError:
        return False
    return True


def has_index_column(choice: str, header: list[str] | None, first_row: list[str]) -> bool:
    """Whether the first column names the clients (pandas' index, FedStale's ``index_col=[0]``):
    ``yes``/``no`` as asked; ``auto``: when the first data row's first cell is not a value (a
    name), when the header's first cell is empty (the unnamed index pandas writes), or when the
    other header cells are all round labels of one kind (integers, numbers or datetimes) and the
    first is not (``client,0,1,2``): a first column of 0/1 under such a header is an index, not
    a round."""
    if choice != "auto":
        return choice == "yes"
    if not _is_cell(first_row[0]):
        return True
    if header is None or len(header) < 2:
        return False
    if not header[0].strip():
        return True
    kinds = {_label_kind(c) for c in header[1:]}
    return len(kinds) == 1 and kinds != {"text"} and _label_kind(header[0]) not in kinds


def _label_kind(text: str) -> str:
    text = text.strip()
    if re.fullmatch(r"[+-]?\d+", text):
        return "integer"
    try:
        float(text)
        return "number"
    except ValueError:
        pass
    try:
        datetime.fromisoformat(text)
        return "datetime"
    except ValueError:
        return "text"


def _cell_row(cells: list[str], path: Path, kind: str, number: int, client: int, indexed: bool) -> np.ndarray:
    """One client's row as uint8 0/1; DataError naming the line for anything else."""
    row = np.empty(len(cells), dtype=np.uint8)
    for k, cell in enumerate(cells):
        value = CELL_VALUES.get(cell.strip())
        if value is None:
            try:
                number_value = float(cell)
            except ValueError:
                raise DataError(f"{kind}: {path.name!r} data line {number}, column {k + 1 + indexed} is not numeric "
                                f"(0/1 or True/False): {cell.strip()[:30]!r}") from None
            if number_value not in (0.0, 1.0):
                raise DataError(f"{kind}: {path.name!r} must contain only 0 and 1, found {number_value:g} "
                                f"for client {client} (row {client + 1}) in round {k}")
            value = int(number_value)
        row[k] = value
    return row

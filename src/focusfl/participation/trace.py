"""Replay of a recorded availability matrix (rows = rounds, columns = clients, entries 0/1).

Formats: ``.npy`` (any 2-D numeric or bool array) or ``.csv`` (comma separated; lines starting
with ``#`` are comments, a first line that is not numeric is taken as a header and skipped;
blank lines are ignored). When more rounds are asked for than were recorded, the trace wraps
around: round r replays row ``r mod T``. ``focusfl participation import`` writes this format
from FedScale, FLASH and clients x rounds availability files (recordings/importing.py), with
a first comment line that marks the file as focusfl's (:data:`TAG`).

A trace is an untrusted file: an .npy header is read and checked (shape, dtype, the bytes the
file really holds, the memory available) before its array is allocated, a CSV's size is checked
before it is read, and every client must take part in at least one recorded round.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..errors import ConfigError, DataError
from ..limits import check_allocation, human_bytes, read_npy_data, read_npy_header
from .base import ParticipationProcess

# Parsing a CSV trace in Python costs about this many bytes of memory per byte of text (a float
# object and its list slot per two-character cell "0,", the text and its lines).
CSV_BYTES_PER_BYTE = 24
# Larger traces belong in an .npy file: parsing 64 MiB of CSV already takes tens of seconds.
MAX_CSV_BYTES = 64 << 20


# The first line of a trace focusfl wrote (a comment to the reader): what marks the file as focusfl's.
TAG = "# focusfl participation trace"
TRACE = "participation trace"


def load_trace(path: str | Path) -> np.ndarray:
    """Read a trace file into a bool matrix ``[T, N]``; DataError with a one-line reason if unusable."""
    path = Path(path)
    return _as_mask(path, read_matrix(path))


def read_matrix(path: Path, kind: str = TRACE) -> np.ndarray:
    """The non-empty 2-D matrix of numbers in the .csv or .npy file ``path`` (size-checked before
    it is read); errors name the file as a ``kind``."""
    if not path.is_file():
        raise DataError(f"{kind}: file {str(path)!r} not found")
    suffix = path.suffix.lower()
    if suffix == ".npy":
        data = _read_npy(path, kind)
    elif suffix == ".csv":
        data = _read_csv(path, kind)
    else:
        raise ConfigError(f"{kind}: {path.name!r} must end in .csv or .npy")
    _check_shape(path, data.shape, kind)
    return data


def is_focusfl_trace(path: Path) -> bool:
    """Whether ``path`` is a trace focusfl wrote: its first line is :data:`TAG`."""
    try:
        with open(path, "rb") as handle:
            return handle.read(len(TAG)) == TAG.encode()
    except OSError:
        return False


def _read_npy(path: Path, kind: str) -> np.ndarray:
    what = f"{kind} {path.name!r}"
    try:
        with open(path, "rb") as handle:
            header = read_npy_header(handle, path.stat().st_size, what)
            _check_shape(path, header.shape, kind)
            if header.dtype != bool and header.dtype.kind not in "iuf":
                raise DataError(f"{what} must hold numbers or bools (0 and 1), got dtype {header.dtype}")
            # The array, and the two bool matrices of the same shape that _as_mask makes.
            rounds, clients = header.shape
            check_allocation(header.nbytes + 2 * header.count, f"{what} of {rounds:,} rounds x {clients:,} clients")
            return read_npy_data(handle, header, what)
    except OSError as exc:
        raise DataError(f"{kind}: cannot read {path.name!r} ({_first_line(exc)})") from None


def _read_csv(path: Path, kind: str) -> np.ndarray:
    size = path.stat().st_size
    if size > MAX_CSV_BYTES:
        raise DataError(
            f"{kind} {path.name!r} is {human_bytes(size)} of CSV, more than the "
            f"{human_bytes(MAX_CSV_BYTES)} read as text; save it as a 0/1 .npy matrix instead"
        )
    check_allocation(size * CSV_BYTES_PER_BYTE, f"{kind} {path.name!r} ({human_bytes(size)} of CSV)")
    try:
        lines = [line.strip() for line in path.read_text().splitlines()]
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{kind}: cannot read {path.name!r} ({_first_line(exc)})") from None
    lines = [line for line in lines if line and not line.startswith("#")]
    if lines and not _is_numeric_row(lines[0]):
        lines = lines[1:]  # header
    rows = []
    for number, line in enumerate(lines, start=1):
        try:
            rows.append([float(cell) for cell in line.split(",")])
        except ValueError:
            where = f"{kind}: {path.name!r} data line {number}"
            raise DataError(f"{where} is not numeric: {line[:60]!r}") from None
    widths = {len(row) for row in rows}
    if len(widths) > 1:
        raise DataError(f"{kind}: {path.name!r} has rows of different lengths {sorted(widths)}")
    return np.array(rows, dtype=np.float64).reshape(len(rows), widths.pop() if widths else 0)


def _is_numeric_row(line: str) -> bool:
    try:
        [float(cell) for cell in line.split(",")]
    except ValueError:
        return False
    return True


def _check_shape(path: Path, shape: tuple[int, ...], kind: str = TRACE) -> None:
    if len(shape) != 2 or shape[0] == 0 or shape[1] == 0:
        raise DataError(f"{kind}: {path.name!r} must be a non-empty 2-D matrix, got shape {shape}")


def _as_mask(path: Path, data: np.ndarray) -> np.ndarray:
    if data.dtype == bool:
        return data.copy()
    if not np.issubdtype(data.dtype, np.number):
        raise DataError(f"participation trace: {path.name!r} must contain only 0 and 1")
    bad = ~np.isin(data, (0, 1))
    if bad.any():
        row, column = (int(v) for v in np.argwhere(bad)[0])
        raise DataError(
            f"participation trace: {path.name!r} must contain only 0 and 1, "
            f"found {data[row, column].item():g} at round {row}, client {column}"
        )
    return data.astype(bool)


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


class TraceParticipation(ParticipationProcess):
    """Replays a recorded 0/1 matrix; wraps around past its last row. The seed is ignored.

    A client that never takes part is refused (its p_i would be 0: a recording that leaves a
    client out is most likely the wrong file or the wrong number of clients) unless ``absent`` is
    true: a federation's realised trace, where a node was refused or never answered, records its
    clients as they were, and its config.json replays it so."""

    name: ClassVar[str] = "trace"
    DEFAULTS: ClassVar[dict[str, Any]] = {"path": None, "absent": False}

    def __init__(self, num_clients: int, seed: int = 0, path: str | Path | None = None, absent: bool = False) -> None:
        super().__init__(num_clients, seed)
        if not isinstance(absent, (bool, np.bool_)):
            raise ConfigError(f"participation trace: absent={absent!r} is not a boolean")
        self.absent = bool(absent)
        if path is None or (isinstance(path, str) and not path.strip()):
            raise ConfigError("participation trace: needs path=FILE (.csv or .npy)")
        if not isinstance(path, (str, Path)):
            raise ConfigError(f"participation trace: path={path!r} is not a file name")
        # Absolute, so that describe() rebuilds the same trace from another working directory.
        self.path = Path(path).expanduser().resolve()
        self.data = load_trace(self.path)
        if self.data.shape[1] != self.num_clients:
            raise DataError(
                f"participation trace: {self.path.name!r} has {self.data.shape[1]} columns,"
                f" expected {self.num_clients} (one per client)"
            )
        absent = np.flatnonzero(~self.data.any(axis=0))
        if absent.size and not self.absent:
            # Its p_i would be 0: no method can learn its data, and the bias weights divide by p_i.
            raise DataError(
                f"participation trace: client {int(absent[0])} never takes part in the "
                f"{self.recorded_rounds} recorded rounds of {self.path.name!r}"
                + (f" ({absent.size} clients never do)" if absent.size > 1 else "")
                + "; absent=true replays it as it is"
            )

    @property
    def recorded_rounds(self) -> int:
        """Number of rounds in the file (the wrap-around period)."""
        return int(self.data.shape[0])

    def _rows(self, start: int, stop: int) -> np.ndarray:
        return self.data[np.arange(start, stop) % self.recorded_rounds]

    def nominal_p(self) -> None:
        """Unknown: a recording has no model behind it (``empirical_p`` of the data is the estimate)."""
        return None

    def input_paths(self) -> dict[str, Path]:
        """The recorded file (a run records its digest: runs/inputs.py)."""
        return {"trace": self.path}

    def _params(self) -> dict[str, Any]:
        # absent recorded only when true: every trace run before it existed keeps its record and key
        return {"path": str(self.path), **({"absent": True} if self.absent else {})}

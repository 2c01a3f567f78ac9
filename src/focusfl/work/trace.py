"""Replay of recorded step counts: ``trace:path=PATH``, a CSV of ``round,client,steps`` rows.

The file a federation writes (``work.csv`` in its run folder: the steps each accepted client
really took, fewer than asked when a node's deadline cut its round short) has this form, so
``focusfl run --participation trace:path=RUN/trace.csv --work trace:path=RUN/work.csv``
replays the federation's rounds, and any recorded or hand-written schedule of step counts can
drive a simulation. The format::

    round,client,steps
    0,0,5
    0,1,2
    1,1,5

one row per active client per round, ``steps`` in 1..tau (tau: the algorithm's local_steps),
rows in any order, no (round, client) twice. A (round, client) that is not in the file is an
error when that client is active in that round (one line naming both): a replay that silently
gave it tau steps would hide a trace that does not belong to the run. Rounds do not wrap around.

A trace is an untrusted file: its size is checked before it is read (at most MAX_CSV_BYTES,
and the memory its parse needs), every row is checked (one line naming the line number), and
it is held sparsely (a round number of 10^9 allocates nothing). ``describe()`` records the
file's absolute path and its SHA-256; a process rebuilt from that record (config.json) refuses
a file whose bytes have changed since, so a replay is checkable.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from ..errors import ConfigError, DataError
from ..limits import check_allocation, human_bytes
from .base import WorkProcess

HEADER = ("round", "client", "steps")
# Parsing costs about this many bytes of memory per byte of text (three int objects and a list
# per row of ~8 characters, the text and its lines).
CSV_BYTES_PER_BYTE = 40
MAX_CSV_BYTES = 64 << 20  # 64 MiB: millions of client rounds; parsing more as text takes minutes


def trace_text(rows: list[tuple[int, int, int]]) -> str:
    """A trace file's text: the header and one ``round,client,steps`` line per row, in order."""
    return "\n".join([",".join(HEADER), *(f"{r},{c},{s}" for r, c, s in rows)]) + "\n"


def trace_record(path: str | Path, text: str) -> dict[str, Any]:
    """The describe() record of the trace ``text`` once it is stored at ``path`` (absolute)."""
    return {"name": TraceWork.name, "path": str(Path(path).expanduser().resolve()),
            "sha256": hashlib.sha256(text.encode()).hexdigest()}


def read_trace(path: Path) -> tuple[dict[int, dict[int, int]], str]:
    """``{round: {client: steps}}`` and the file's SHA-256; DataError with a one-line reason."""
    name = repr(path.name)
    if not path.is_file():
        raise DataError(f"work trace: file {str(path)!r} not found")
    size = path.stat().st_size
    if size > MAX_CSV_BYTES:
        raise DataError(f"work trace {name} is {human_bytes(size)}, more than the {human_bytes(MAX_CSV_BYTES)} "
                        "read as text")
    check_allocation(size * CSV_BYTES_PER_BYTE, f"work trace {name} ({human_bytes(size)} of CSV)")
    try:
        data = path.read_bytes()
        lines = data.decode().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"work trace: cannot read {name} ({str(exc).splitlines()[0] if str(exc) else exc})") from None
    first = next((k for k, line in enumerate(lines) if line.strip()), None)
    if first is None:
        raise DataError(f"work trace {name} is empty (expected the header {','.join(HEADER)})")
    if tuple(cell.strip().lower() for cell in lines[first].split(",")) != HEADER:
        raise DataError(f"work trace {name} line {first + 1}: expected the header {','.join(HEADER)}, "
                        f"got {lines[first].strip()[:60]!r}")
    table: dict[int, dict[int, int]] = {}
    for number, line in enumerate(lines[first + 1:], start=first + 2):
        if not line.strip():
            continue
        r, client, steps = _row(name, number, line)
        held = table.setdefault(r, {})
        if client in held:
            raise DataError(f"work trace {name} line {number}: round {r}, client {client} is given twice")
        held[client] = steps
    if not table:
        raise DataError(f"work trace {name} has a header but no rows")
    return table, hashlib.sha256(data).hexdigest()


def _row(name: str, number: int, line: str) -> tuple[int, int, int]:
    cells = [cell.strip() for cell in line.split(",")]
    where = f"work trace {name} line {number}"
    if len(cells) != 3:
        raise DataError(f"{where}: expected round,client,steps, got {line.strip()[:60]!r}")
    try:
        r, client, steps = (int(cell) for cell in cells)
    except ValueError:
        raise DataError(f"{where}: round, client and steps must be integers, got {line.strip()[:60]!r}") from None
    if r < 0 or client < 0:
        raise DataError(f"{where}: round and client must be >= 0, got {line.strip()[:60]!r}")
    if steps < 1:
        raise DataError(f"{where}: steps={steps} must be at least 1 (a client that took part did a step)")
    return r, client, steps


class TraceWork(WorkProcess):
    """The step counts of a recorded trace; the seed is ignored. See the module docstring."""

    name: ClassVar[str] = "trace"
    DEFAULTS: ClassVar[dict[str, Any]] = {"path": None, "sha256": None}

    def __init__(self, num_clients: int, local_steps: int, seed: int = 0, path: Any = None,
                 sha256: Any = None) -> None:
        super().__init__(num_clients, local_steps, seed)
        if path is None or isinstance(path, (bool, list)) or not str(path).strip():
            raise ConfigError("work trace: needs path=PATH (a CSV of round,client,steps)")
        # Absolute, so that describe() rebuilds the same trace from another working directory.
        self.path = Path(str(path)).expanduser().resolve()
        self.recorded, self.sha256 = read_trace(self.path)  # {round: {client: steps}}
        if sha256 is not None and str(sha256) != self.sha256:
            raise DataError(f"work trace {self.path.name!r} has changed since it was recorded "
                            f"(SHA-256 {self.sha256[:12]}..., recorded {str(sha256)[:12]}...)")
        self._check_range()

    def _check_range(self) -> None:
        for r, held in self.recorded.items():
            for client, steps in held.items():
                if client >= self.num_clients:
                    raise DataError(f"work trace {self.path.name!r}: round {r} names client {client}, "
                                    f"but the problem has {self.num_clients} clients")
                if steps > self.local_steps:
                    raise DataError(f"work trace {self.path.name!r}: round {r}, client {client} took {steps} "
                                    f"steps, more than local_steps={self.local_steps}")

    def _counts(self, round_: int) -> torch.Tensor:
        """Every client's count in round ``round_``; 0 for clients the trace does not name."""
        counts = np.zeros(self.num_clients, dtype=np.int64)
        for client, steps in self.recorded.get(round_, {}).items():
            counts[client] = steps
        return torch.from_numpy(counts)

    def _check_steps(self, round_: int, active: np.ndarray, steps: np.ndarray) -> None:
        missing = np.flatnonzero(steps == 0)
        if len(missing):
            raise self._missing(round_, int(active[missing[0]]))

    def _missing(self, round_: int, client: int) -> DataError:
        """The one line for an active client without a row: the rounds the file covers, and that
        it does not wrap (a participation trace beside it does) when the round lies beyond them."""
        last = max(self.recorded)  # a replay starts at round 0, whatever the file's first row
        where = f"work trace {self.path.name!r} has no row for round {round_}, client {client}"
        if round_ > last:
            return DataError(f"{where}: {self.path.name} covers rounds 0..{last} and, unlike a participation "
                             f"trace, does not wrap around; run at most {last + 1} rounds (or import more --rounds)")
        return DataError(f"{where} ({self.path.name} covers rounds 0..{last}; a trace names every active client "
                         "of every round it replays)")

    def active_table(self, mask: np.ndarray) -> torch.Tensor:
        """The trace's counts of rounds 0..R-1, 0 where it has no row; DataError at the first
        client that ``mask`` makes active without a row (rounds beyond the trace included)."""
        table = self.table(len(mask))
        missing = np.argwhere(np.asarray(mask, dtype=bool) & (table.numpy() == 0))
        if len(missing):
            round_, client = (int(v) for v in missing[0])
            raise self._missing(round_, client)
        return table

    def law(self) -> np.ndarray:
        """``[N, tau]``: the frequency of each count among a client's recorded rows; DataError
        for a client the trace never names (its law is unknown)."""
        counts = np.zeros((self.num_clients, self.local_steps))
        for held in self.recorded.values():
            for client, steps in held.items():
                counts[client, steps - 1] += 1
        rows = counts.sum(axis=1)
        if (rows == 0).any():
            raise DataError(f"work trace {self.path.name!r} has no row for client {int(np.argmin(rows))}: "
                            "its step-count law is unknown")
        return counts / rows[:, None]

    def _params(self) -> dict[str, Any]:
        return {"path": str(self.path), "sha256": self.sha256}

"""Where a run's client-state table lives: in memory while it fits the run's budget, otherwise in
a memory-mapped file of its run folder (``clients.bin``), of which a round reads and writes only
the active clients' rows.

The table is every algorithm's ``State.clients``: a NamedTuple of ``[N, ...]`` tensors (FOCUS's
last gradients, SCAFFOLD's control variates). A run whose table is larger than ``state_memory``
(runs/config.py; 2 GiB by default) keeps it in a :class:`MappedClients`, an engine RowStore
(engine/tree.py): the engines gather and scatter its rows as they do a tensor's, so the run
computes the same bytes wherever its table lives.

The file holds two slots per client (shadow paging). A client's row written for the first time
since the last checkpoint goes to the slot the checkpoint does not point at; later writes before
the next checkpoint overwrite that same slot. A checkpoint flushes the file (msync, fsync), then
saves the slot map (one byte per client: 0 = the initial row, never written; 1 or 2 = that
slot), and only then do later writes move to other slots again. So the rows a checkpoint points
at are never written after it is saved: a run killed at any moment (kill -9, power loss) resumes
from its last checkpoint's slot map and file to the same bytes, and no checkpoint ever copies
the table. The file is sparse: rows never written take no disk, and read as the initial row.

A mapped table's pages are the kernel's page cache: resident while recently used, written back
by the kernel, evicted under pressure. The store drops its mapping of them (MADV_DONTNEED) once
the rows it has touched exceed its memory budget, so the process's resident memory stays near
the budget whatever N is; disk bandwidth and the page cache then bound how fast rows come back.
"""
from __future__ import annotations

import errno
import mmap
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..algorithms.base import Algorithm, State, StateSize, check_state_size
from ..engine.tree import RowStore
from ..errors import ConfigError, DataError
from ..limits import check_allocation, human_bytes

TABLE = "clients.bin"  # the mapped client table in a run folder
_ALIGN = 4096  # each field's region starts on a page
FRESH, SLOT_A, SLOT_B = 0, 1, 2  # a client's entry in the slot map
_DROP_FLOOR = 64 << 20  # the mapping is dropped no more often than every 64 MiB of rows touched


def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    return torch.empty((), dtype=dtype).numpy().dtype


def _element_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


# -- the initial state without N rows --------------------------------------------------------------
def row_template(algorithm: Algorithm, x0: torch.Tensor) -> tuple[Any, Any | None]:
    """(template, server): the initial client row of ``algorithm`` (its NamedTuple of [1, ...]
    tensors) and its initial server state when that does not grow with N (else None: the server
    keeps per-client tables, MIFA's and FedVARP's, made by a full ``init``).

    Every client starts from the same row in every algorithm (checked: ``init`` for two clients
    gives that row twice), so a table of N clients is that row N times, and is never built."""
    one, two = algorithm.init(x0, 1), algorithm.init(x0, 2)
    for name, first, pair in zip(one.clients._fields, one.clients, two.clients):
        if pair.shape[0] != 2 or not (torch.equal(pair[0], first[0]) and torch.equal(pair[1], first[0])):
            raise ConfigError(f"{algorithm.name}: its clients' initial {name} rows differ from client to client; "
                              "its state cannot be kept in a mapped table")
    same = all(a.shape == b.shape and torch.equal(a, b) for a, b in zip(one.server, two.server))
    return one.clients, (one.server if same else None)


def row_bytes(template: Any) -> int:
    """Bytes of one client's row."""
    return sum(field[0].numel() * field.element_size() for field in template)


def table_bytes(algorithm: Algorithm, x0: torch.Tensor, num_clients: int) -> int:
    """Bytes of the client table of ``num_clients`` clients."""
    return row_bytes(row_template(algorithm, x0)[0]) * num_clients


def reference_state(algorithm: Algorithm, x0: torch.Tensor, num_clients: int) -> State:
    """A fresh state's shapes and dtypes, with the client table as views of its one initial row
    (no memory for N rows): what a checkpoint is checked against."""
    template, server = row_template(algorithm, x0)
    if server is None:
        return algorithm.init(x0, num_clients)
    clients = type(template)(*(field.expand(num_clients, *field.shape[1:]) for field in template))
    return State(server, clients)


def initial_state(algorithm: Algorithm, x0: torch.Tensor, num_clients: int, folder: Path | None,
                  budget: int) -> State:
    """The state a run starts from: ``algorithm.init`` in memory when its client table fits
    ``budget`` bytes or the run has no folder (a run in a library call), else the server state
    and a :class:`MappedClients` of ``folder``."""
    template, server = row_template(algorithm, x0)
    if folder is None or row_bytes(template) * num_clients <= budget:
        return algorithm.init(x0, num_clients)
    if server is None:  # per-client server tables stay in memory; the clients' table goes to disk
        server = algorithm.init(x0, num_clients).server
    return State(server, MappedClients.create(Path(folder) / TABLE, template, num_clients, budget))


def check_state_memory(algorithm: Algorithm, problem: Any, budget: int) -> None:
    """check_state_size of a run whose client table may be mapped: a table larger than ``budget``
    lives on disk (MappedClients.create checks the disk), so memory must hold the rest only."""
    try:
        clients = table_bytes(algorithm, problem.initial_point(), problem.num_clients)
    except ConfigError:  # rows that differ from client to client: such a table is never mapped
        clients = 0
    if clients <= budget:
        check_state_size(algorithm, problem)
        return
    n, d = problem.num_clients, problem.dim
    rest = algorithm.state_size(n, d).nbytes(torch.empty((), dtype=problem.dtype).element_size()) - clients
    check_allocation(max(0, rest), f"{algorithm.name}'s state for {n:,} clients x {d:,} parameters, but the "
                                   f"clients' table of {human_bytes(clients)} (mapped on disk)", error=ConfigError)


class StateInMemory:
    """``algorithm.state_size(N, d)`` as memory will hold it: without the clients' table when
    that table is larger than ``budget`` bytes, since such a table is mapped on disk
    (initial_state). What a neural network checks its model and the algorithm's state against
    before it builds the model (make_problem's ``state_size``), as check_state_memory checks the
    built run: one rule for both."""

    def __init__(self, algorithm: Algorithm, budget: int, dtype: torch.dtype) -> None:
        self.algorithm, self.budget, self.dtype = algorithm, budget, dtype

    @property
    def __self__(self) -> Algorithm:  # the algorithm, as for the bound ``state_size`` it stands for
        return self.algorithm

    def __call__(self, num_clients: int, dim: int) -> StateSize:
        full = self.algorithm.state_size(num_clients, dim)
        try:
            floats, integers = _row_elements(self.algorithm, dim, self.dtype)
        except ConfigError:  # rows that differ from client to client: never mapped
            return full
        table = StateSize(floats * num_clients, integers * num_clients)
        if table.nbytes(self.dtype.itemsize) <= self.budget:
            return full
        return StateSize(max(0, full.floats - table.floats), max(0, full.integers - table.integers))


def _row_elements(algorithm: Algorithm, dim: int, dtype: torch.dtype) -> tuple[int, int]:
    """(floats, integers) of one client's row for a model of ``dim`` parameters, from the rows of
    models of 1 and 2 parameters (a row's fields are a fixed number of d-vectors and counters),
    so that nothing of the model's size is allocated before the model is checked."""
    counts = []
    for size in (1, 2):
        template, _ = row_template(algorithm, torch.zeros(size, dtype=dtype))
        counts.append((sum(f[0].numel() for f in template if f.is_floating_point()),
                       sum(f[0].numel() for f in template if not f.is_floating_point())))
    (floats1, integers1), (floats2, integers2) = counts
    return floats1 + (floats2 - floats1) * (dim - 1), integers1 + (integers2 - integers1) * (dim - 1)


# -- the mapped table ------------------------------------------------------------------------------
def _layout(template: Any, num_clients: int) -> tuple[list[int], int]:
    """Each field's byte offset in the file (two slots per client), and the file's size."""
    offsets, size = [], 0
    for field in template:
        offsets.append(size)
        region = 2 * num_clients * field[0].numel() * field.element_size()
        size += -(-region // _ALIGN) * _ALIGN
    return offsets, size


def _disk_room(folder: Path) -> int:
    return shutil.disk_usage(folder).free


class MappedClients(RowStore):
    """N clients' rows of a NamedTuple type in a memory-mapped file, two slots each (see the
    module docstring). ``live``: each client's current slot; ``saved``: its slot at the last
    checkpoint, which no write touches."""

    def __init__(self, path: Path, template: Any, num_clients: int, slots: torch.Tensor, budget: int) -> None:
        self.path, self.num_clients, self.budget = Path(path), int(num_clients), int(budget)
        self.kind = type(template)
        self.device = template[0].device
        self.template = self.kind(*(field.detach().cpu().clone() for field in template))
        self.live = slots.to(torch.int8).clone()
        self.saved = self.live.clone()
        offsets, self.size = _layout(self.template, self.num_clients)
        self._file = open(self.path, "r+b")
        try:
            self._map = mmap.mmap(self._file.fileno(), self.size)
        except OSError as exc:  # no address space for it (a ulimit -v), or a file system without mmap
            self._file.close()
            raise ConfigError(f"cannot map the clients' state table {str(self.path)!r} "
                              f"({human_bytes(self.size)}): {exc.strerror or exc}") from None
        # Rows are read where the active clients are, never in order: without this the kernel maps
        # 64 KiB around every row it faults in (fault-around, readahead): measured at N = 10^6,
        # d = 100, 65 MB resident for the 1.6 MB of one round's 1,000 rows, 8 MB with it.
        self._map.madvise(mmap.MADV_RANDOM)
        self.fields = []
        for field, offset in zip(self.template, offsets):
            count = 2 * self.num_clients * field[0].numel()
            array = np.frombuffer(self._map, dtype=_numpy_dtype(field.dtype), count=count, offset=offset)
            self.fields.append(torch.from_numpy(array).view(2 * self.num_clients, *field.shape[1:]))
        self._touched = 0

    @classmethod
    def create(cls, path: Path, template: Any, num_clients: int, budget: int) -> "MappedClients":
        """A new sparse table file at ``path``: every client at the template row (slot map 0)."""
        path = Path(path)
        _, size = _layout(template, num_clients)
        room = _disk_room(path.parent)
        if size > room:
            raise ConfigError(f"the clients' state table ({human_bytes(size // 2)} for {num_clients:,} clients, "
                              f"up to {human_bytes(size)} on disk with its checkpoint slots) does not fit the "
                              f"{human_bytes(room)} free in {str(path.parent)!r}")
        with open(path, "wb") as handle:
            handle.truncate(size)  # sparse: no block is written until a row is
            handle.flush()
            os.fsync(handle.fileno())
        return cls(path, template, num_clients, torch.zeros(num_clients, dtype=torch.int8), budget)

    @classmethod
    def open(cls, path: Path, template: Any, num_clients: int, slots: torch.Tensor, budget: int) -> "MappedClients":
        """The table a checkpoint's slot map ``slots`` points into, checked before it is mapped."""
        path = Path(path)
        _, size = _layout(template, num_clients)
        try:
            found = path.stat().st_size
        except OSError as exc:
            raise DataError(f"the clients' state table {str(path)!r} is missing or unreadable "
                            f"({exc.strerror or exc}); the run cannot be resumed") from None
        if found != size:
            raise DataError(f"the clients' state table {str(path)!r} is {found:,} bytes, not the {size:,} of this "
                            "run's table; the run cannot be resumed")
        check_slots(slots, num_clients, str(path))
        return cls(path, template, num_clients, slots, budget)

    # -- rows ----------------------------------------------------------------------------------------
    def gather(self, index: torch.Tensor) -> Any:
        where = index.to("cpu", torch.int64)
        slot = self.live.index_select(0, where).to(torch.int64)
        physical = 2 * where + (slot - 1).clamp(min=0)
        fresh = slot == FRESH
        any_fresh = bool(fresh.any())
        out = []
        for table, template in zip(self.fields, self.template):
            rows = table.index_select(0, physical)
            if any_fresh:
                rows = torch.where(fresh.view(-1, *([1] * (rows.dim() - 1))), template, rows)
            out.append(rows.to(self.device))
        self._count(where.numel())
        return self.kind(*out)

    def scatter(self, index: torch.Tensor, rows: Any) -> "MappedClients":
        where = index.to("cpu", torch.int64)
        current, saved = self.live.index_select(0, where), self.saved.index_select(0, where)
        # A row the last checkpoint points at is never overwritten: its first write since then
        # goes to the other slot (the initial row has no slot: it takes slot A).
        other = torch.where(saved == SLOT_A, SLOT_B, SLOT_A).to(torch.int8)
        target = torch.where(current != saved, current, other)
        physical = 2 * where + target.to(torch.int64) - 1
        for table, new in zip(self.fields, rows):
            table.index_copy_(0, physical, new.to("cpu"))
        self.live.index_copy_(0, where, target)
        self._count(where.numel())
        return self

    def _count(self, rows: int) -> None:
        """Drop the mapping's resident pages once the rows touched exceed the memory budget (they
        stay in the page cache, written back by the kernel: nothing is lost or changed)."""
        self._touched += rows * row_bytes(self.template) * 2
        if self._touched >= max(self.budget, _DROP_FLOOR):
            self._map.madvise(mmap.MADV_DONTNEED)
            self._touched = 0

    # -- checkpoints ---------------------------------------------------------------------------------
    def flush(self) -> torch.Tensor:
        """Write every row to the file durably (msync, fsync) and return the slot map to save."""
        self._map.flush()
        os.fsync(self._file.fileno())
        return self.live.clone()

    def checkpointed(self, slots: torch.Tensor) -> None:
        """``slots`` (from :meth:`flush`) is now in a durable checkpoint: later writes keep off it."""
        self.saved = slots.to(torch.int8).clone()

    def reopened(self, path: Path) -> "MappedClients":
        """This table at its last checkpoint's slot map, in the copy of its file at ``path``
        (copy_table): a resumed run writes its own table, never the published one it read."""
        reopened = MappedClients.open(path, self.template, self.num_clients, self.saved, self.budget)
        self.close()
        return reopened

    def to_memory(self) -> Any:
        """The whole table as the NamedTuple of [N, ...] tensors (tests, small tables)."""
        return self.gather(torch.arange(self.num_clients))

    def close(self) -> None:
        """Unmap the file (the tensors that view it must not be used afterwards)."""
        self.fields = []
        try:
            self._map.close()
        except BufferError:  # a view of the rows is still alive somewhere: the mapping goes with it
            pass
        self._file.close()

    def __repr__(self) -> str:
        return f"MappedClients({self.kind.__name__}, {self.num_clients:,} clients, {str(self.path)!r})"


def check_slots(slots: Any, num_clients: int, where: str) -> torch.Tensor:
    """A slot map as a checkpoint must hold it: int8 [N] with values 0, 1, 2."""
    if not isinstance(slots, torch.Tensor) or slots.dtype != torch.int8 or tuple(slots.shape) != (num_clients,):
        raise DataError(f"{where}: its slot map is not one int8 per client of {num_clients:,}")
    if slots.numel() and (int(slots.min()) < FRESH or int(slots.max()) > SLOT_B):
        raise DataError(f"{where}: its slot map holds values other than 0, 1 and 2")
    return slots


def _next_data(fd: int, position: int, size: int) -> tuple[int, int]:
    """The next stretch of written bytes at or after ``position``: (start, end); (size, size)
    when none is left. Without SEEK_DATA (a filesystem that cannot say), everything is data."""
    if not hasattr(os, "SEEK_DATA"):
        return position, size
    try:
        start = os.lseek(fd, position, os.SEEK_DATA)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # only a hole is left
            return size, size
        return position, size
    return start, os.lseek(fd, start, os.SEEK_HOLE)


def table_disk_bytes(path: Path) -> int:
    """The bytes a copy of the table file takes on disk (its written rows; holes take none)."""
    info = os.stat(path)
    return min(info.st_size, getattr(info, "st_blocks", info.st_size // 512 + 1) * 512)


def copy_table(source: Path, target: Path) -> None:
    """Copy a table file, its holes kept as holes (only the rows ever written are read): how a
    resumed run gets its own table from a published folder's."""
    with open(source, "rb") as reader, open(target, "wb") as writer:
        size = os.fstat(reader.fileno()).st_size
        writer.truncate(size)
        position = 0
        while position < size:
            start, end = _next_data(reader.fileno(), position, size)
            if start >= size:
                break
            reader.seek(start)
            writer.seek(start)
            left = end - start
            while left > 0:
                chunk = reader.read(min(left, 1 << 24))
                if not chunk:
                    break
                writer.write(chunk)
                left -= len(chunk)
            position = end
        writer.flush()
        os.fsync(writer.fileno())

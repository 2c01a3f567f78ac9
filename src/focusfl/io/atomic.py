"""Atomic writes: a file is either its old version or its new one, whole, however a write ends.

Every file focusfl writes in place (tables, configs, markers, checkpoints, a node's state,
downloads, figures) goes through :func:`atomic_path`: the new content is written to a
temporary file beside the target, in the same folder and so on the same filesystem, and
renamed over the target only when it is complete; on an exception the temporary file is
removed. A durable write also fsyncs the file before the rename and the folder after it, so
that the rename survives a power loss, not only a crash of the process.

A write that the disk (or a quota) stops for lack of space leaves the old file as it was and
raises :class:`DiskFullError`, one line naming the folder (:func:`no_space` finds the cause
where a library wrapped it).
"""
from __future__ import annotations

import contextlib
import csv
import errno
import io
import json
import os
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Iterator

from ..errors import DiskFullError

TMP_SUFFIX = ".focusfl-tmp"
# A full disk, and a full quota.
NO_SPACE = {errno.ENOSPC, errno.EDQUOT}
# What a folder we may write but not read, or a filesystem that cannot sync a folder, answers;
# the rename is atomic all the same (only its durability across a power loss is not assured).
_CANNOT_SYNC_FOLDER = {errno.EACCES, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP}


def _call(name: str, operation: Callable[..., Any], *args: Any) -> Any:
    return operation(*args)


def no_space(exc: BaseException | None) -> OSError | None:
    """The "no space left on device" (or "quota exceeded") error in ``exc`` or the exceptions it
    was raised from: torch's zip writer, for one, reports a full disk as a RuntimeError
    ("unexpected pos") raised while handling the OSError."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in NO_SPACE:
            return exc
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    return None


def full_disk(exc: BaseException) -> str | None:
    """"no space left on device" or "disk quota exceeded" when ``exc`` is a write that a full
    disk stopped (a DiskFullError, or an OSError anywhere in its chain), else None."""
    if isinstance(exc, DiskFullError):
        return exc.reason
    cause = no_space(exc)
    if cause is None:
        return None
    return "disk quota exceeded" if cause.errno == errno.EDQUOT else "no space left on device"


def disk_full(where: str | Path, cause: BaseException, then: str = "then run the same command again") -> DiskFullError:
    """The one-line error of a write into ``where`` that a full disk (or quota) stopped."""
    reason = full_disk(cause) or "no space left on device"
    return DiskFullError(f"{reason}: cannot write to {where}; free some space on its disk, {then}", reason)


def _scratch(path: Path, unique: bool, suffix: str, private: bool) -> Path:
    """The temporary name for a write of ``path``: ``.NAME<suffix>`` for a writer that holds
    the folder (under a lock), else ``.NAME.<random><suffix>``, created at once and exclusively,
    for writers that may race for the same target (nodes, downloads, figures)."""
    if not unique:
        return path.with_name(f".{path.name}{suffix}")
    while True:
        scratch = path.with_name(f".{path.name}.{os.urandom(4).hex()}{suffix}")
        try:  # 0666 less the umask, as open() creates a file; 0600 for private state
            fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if private else 0o666)
        except FileExistsError:
            continue
        os.close(fd)
        return scratch


@contextlib.contextmanager
def atomic_path(path: str | Path, *, durable: bool = False, unique: bool = False, suffix: str = TMP_SUFFIX,
                private: bool = False, scratch: Path | None = None,
                step: Callable[..., Any] = _call) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; when the block ends it is renamed over ``path``.

    ``durable``: fsync the file before the rename and the folder after it. ``unique``: a name
    of its own (see :func:`_scratch`), ending in ``suffix``; ``private``: mode 0600 (a unique
    name only). ``scratch``: that temporary name instead (figures written together share
    theirs). ``step`` runs each filesystem step after the block, ``step(name, operation,
    *args)``, so that the output folders can let a test crash the process between any two of
    them. On an exception the temporary file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    try:
        scratch = _scratch(path, unique, suffix, private) if scratch is None else Path(scratch)
    except OSError as exc:
        if no_space(exc):
            raise disk_full(path.parent, exc) from None
        raise
    try:
        yield scratch
        if durable:
            step("fsync file", fsync_file, scratch)
        step("rename into place", os.replace, scratch, path)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(scratch)
        full = no_space(exc)
        if full is not None:  # the old file is still in place, whole
            raise disk_full(path.parent, full) from None
        raise
    if durable:
        try:
            step("fsync folder", fsync_folder, path.parent)
        except OSError as exc:
            if no_space(exc):
                raise disk_full(path.parent, exc) from None
            raise


@contextlib.contextmanager
def open_atomic(path: str | Path, mode: str = "w", *, durable: bool = False, unique: bool = False,
                suffix: str = TMP_SUFFIX, private: bool = False) -> Iterator[IO]:
    """A file opened for writing through :func:`atomic_path` (text with ``newline=""`` as for
    CSV, or binary with ``mode="wb"``): in place when the block ends, gone on an exception."""
    newline = None if "b" in mode else ""
    with atomic_path(path, durable=durable, unique=unique, suffix=suffix, private=private) as scratch:
        with open(scratch, mode, newline=newline) as handle:  # open(): the umask applies
            yield handle


def write_text(path: str | Path, text: str, *, durable: bool = False) -> None:
    with open_atomic(path, durable=durable) as handle:
        handle.write(text)


def write_json(path: str | Path, data: dict) -> None:
    write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def write_csv(path: str | Path, rows: Iterable[dict], columns: list[str] | None = None) -> None:
    rows = list(rows)
    if columns is None:
        columns = []
        for row in rows:
            columns.extend(k for k in row if k not in columns)
    buffer = io.StringIO(newline="")
    writer = csv.DictWriter(buffer, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: csv_cell(row.get(k)) for k in columns})
    write_text(path, buffer.getvalue())


def csv_cell(value: Any) -> Any:
    """A value as focusfl writes it into a CSV cell: None empty, a float in full precision."""
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(float(value))  # full precision: reruns must compare equal
    return value


def read_csv(path: str | Path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_folder(folder: Path) -> None:
    """Make the renames in ``folder`` durable, where the folder and its filesystem allow it."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        if exc.errno in _CANNOT_SYNC_FOLDER:
            return
        raise
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in _CANNOT_SYNC_FOLDER:
            raise
    finally:
        os.close(fd)

"""Sizes before allocation: how much memory focusfl may use, and checks of untrusted sizes.

Datasets, traces and configs come from files that anyone may have written. A size read from
such a file (an array header, an archive member, a compressed stream) or given on the command
line is checked here *before* the memory is allocated, so that a file claiming gigabytes ends in
one line naming the size and what needed it, not in a MemoryError traceback or the kernel's
out-of-memory killer.

- :func:`available_bytes`: the least of the memory the system can still give (MemAvailable,
  the cgroup's limit) and the address space left under RLIMIT_AS / RLIMIT_DATA.
- :func:`check_allocation`: refuses ``nbytes`` beyond that.
- :func:`inflate`: zlib decompression capped at a byte count (a zlib bomb stops at the cap).
- :func:`read_npy_header` / :func:`read_npy_data`: an .npy stream whose header is checked against
  the bytes actually stored and against the memory available before its array is allocated;
  object arrays (pickles) are refused.
"""
from __future__ import annotations

import math
import os
import re
import shutil
import zlib
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np
from numpy.lib import format as npy_format

from .errors import DataError, FocusflError

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB")


def human_bytes(nbytes: int | float) -> str:
    """``596 GiB``, ``3.9 GiB``, ``512 B``: two or three significant digits, binary units."""
    value = float(nbytes)
    unit = 0
    while value >= 1024 and unit < len(_UNITS) - 1:
        value /= 1024
        unit += 1
    if unit == 0:
        return f"{int(value)} B"
    text = f"{value:.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2g}"
    return f"{text} {_UNITS[unit]}"


# -- what the system gives ------------------------------------------------------------------------
def _meminfo_available() -> int | None:
    """MemAvailable of /proc/meminfo (Linux): free memory plus what the kernel can reclaim."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _sysconf_memory() -> int | None:
    """Off Linux: available pages where the system reports them, else all physical memory."""
    for name in ("SC_AVPHYS_PAGES", "SC_PHYS_PAGES"):
        try:
            pages, size = os.sysconf(name), os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, ValueError, OSError):
            continue
        if pages > 0 and size > 0:
            return pages * size
    return None


def _cgroup_room() -> int | None:
    """Memory left under a container's limit (cgroup v2 memory.max, or v1 limit_in_bytes)."""
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        try:
            with open(limit_file) as handle:
                limit = handle.read().strip()
            with open(usage_file) as handle:
                usage = int(handle.read().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit():
            return max(int(limit) - usage, 0)
    return None


def _status_kib(field: str) -> int | None:
    """A field of /proc/self/status in bytes (VmSize, VmData), None off Linux."""
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _rlimit_room() -> int | None:
    """Address space left under the soft RLIMIT_AS and RLIMIT_DATA (ulimit -v, -d), if set."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    rooms = []
    for limit_name, used_field in (("RLIMIT_AS", "VmSize"), ("RLIMIT_DATA", "VmData")):
        limit = getattr(resource, limit_name, None)
        if limit is None:
            continue
        soft, _ = resource.getrlimit(limit)
        if soft == resource.RLIM_INFINITY or soft < 0:
            continue
        used = _status_kib(used_field) or 0
        rooms.append(max(soft - used, 0))
    return min(rooms) if rooms else None


def available_bytes() -> int:
    """Bytes focusfl may still allocate: the least of the system's available memory, the
    room under a cgroup limit and the room under RLIMIT_AS / RLIMIT_DATA.

    Where the system says nothing (neither /proc nor sysconf), there is no memory-based limit
    and only the checks against file sizes apply.
    """
    system = _meminfo_available()
    if system is None:
        system = _sysconf_memory()
    known = [v for v in (system, _cgroup_room(), _rlimit_room()) if v is not None]
    return min(known) if known else 2**63 - 1


def check_allocation(nbytes: int, what: str, *, error: type[FocusflError] = DataError) -> None:
    """Refuse, in one line naming ``what`` and the size, to allocate more than is available.

    ``what`` reads as the subject of "would need", e.g. "ridge problem: 16 clients x
    100,000,000 samples x 50 features". Use ConfigError for sizes given as options, DataError
    (the default) for sizes read from files.
    """
    nbytes = int(nbytes)
    room = available_bytes()
    if nbytes > room:
        raise error(f"{what} would need {human_bytes(nbytes)}, more than the {human_bytes(room)} of memory available")


def disk_room(folder: str | os.PathLike) -> int:
    """Bytes one file written into ``folder`` may take: the filesystem's free space, and no more
    than the largest file the process may write (RLIMIT_FSIZE, ``ulimit -f``)."""
    rooms = [shutil.disk_usage(folder).free]
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
        if soft != resource.RLIM_INFINITY and soft >= 0:
            rooms.append(soft)
    except (ImportError, AttributeError, ValueError, OSError):
        pass
    return min(rooms)


def check_disk_space(nbytes: int, folder: str | os.PathLike, what: str, *,
                     error: type[FocusflError] = DataError) -> None:
    """Refuse, in one line, to write ``nbytes`` into one file in ``folder`` beyond its room
    (:func:`disk_room`): checked before the first byte is written."""
    room = disk_room(folder)
    if int(nbytes) > room:
        raise error(f"{what} would need {human_bytes(nbytes)} of disk in {str(folder)!r}, more than the "
                    f"{human_bytes(room)} it may still write")


_ALLOCATOR_FAILURES = ("can't allocate memory", "out of memory", "Failed to allocate", "not enough memory")


def allocation_failure(exc: BaseException) -> str | None:
    """What an allocator's error (torch's RuntimeError on CPU, OutOfMemoryError on a GPU) says in
    a few words, e.g. "tried to allocate 1.5 GiB"; None if ``exc`` is not one."""
    text = str(exc)
    if not isinstance(exc, (RuntimeError, MemoryError)) or not any(k in text for k in _ALLOCATOR_FAILURES):
        return None
    exact = re.search(r"allocate (\d+) bytes", text)
    if exact:
        return f"tried to allocate {human_bytes(int(exact.group(1)))}"
    sized = re.search(r"[Tt]ried to allocate ([\d.]+ [KMGT]?i?B)", text)
    if sized:
        return f"tried to allocate {sized.group(1)}"
    return text.strip().splitlines()[0].split(". ")[0][:120] if text.strip() else "the allocator failed"


# -- capped decompression -----------------------------------------------------------------------
def inflate(data: bytes, limit: int, what: str) -> bytes:
    """The zlib stream ``data`` decompressed, refusing output beyond ``limit`` bytes.

    A zlib bomb (a few kilobytes expanding to gigabytes) stops at the cap instead of filling
    memory: ``decompressobj().decompress(data, max_length)`` never returns more than asked.
    """
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(data, limit)
        # Output exactly at the cap with input left over: more would come, unless the rest is
        # only the stream's checksum.
        if inflater.unconsumed_tail and inflater.decompress(inflater.unconsumed_tail, 1):
            raise DataError(f"{what} decompresses to more than the {human_bytes(limit)} it declares")
    except zlib.error as exc:
        raise DataError(f"{what} is not a valid zlib stream ({exc})") from None
    return out


def read_into(handle: BinaryIO, array: np.ndarray, what: str) -> np.ndarray:
    """Fill the C-contiguous ``array`` with bytes from ``handle``; DataError if they run out.

    Reads no more than the array holds, so a stream that decompresses (a zip member, gzip)
    never yields more bytes than were checked and allocated.
    """
    view = memoryview(array.reshape(-1).view(np.uint8))
    filled = 0
    while filled < len(view):
        count = handle.readinto(view[filled:])
        if not count:
            raise DataError(f"{what} is truncated: {human_bytes(filled)} of {human_bytes(len(view))} present")
        filled += count
    return array


# -- .npy streams ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class NpyHeader:
    """What an .npy header declares; ``nbytes`` is exact (Python integers do not overflow)."""

    shape: tuple[int, ...]
    fortran_order: bool
    dtype: np.dtype
    nbytes: int

    @property
    def count(self) -> int:
        return math.prod(self.shape)


def read_npy_header(handle: BinaryIO, stored_bytes: int, what: str) -> NpyHeader:
    """Read and check the header of the .npy stream ``handle`` holding ``stored_bytes`` in all.

    Refused with one line: not an .npy stream, object (pickled) dtypes, and a shape whose
    data would need more bytes than the stream holds (a truncated file, or a crafted header
    claiming gigabytes). The stream is left at the first data byte.
    """
    try:
        version = npy_format.read_magic(handle)
        if version == (1, 0):
            shape, fortran_order, dtype = npy_format.read_array_header_1_0(handle)
        else:  # 2.0, and 3.0 which differs only in the header's text encoding
            shape, fortran_order, dtype = npy_format.read_array_header_2_0(handle)
    except (ValueError, OSError, EOFError, SyntaxError, TypeError) as exc:
        raise DataError(f"{what} is not a readable .npy array ({_first_line(exc)})") from None
    if dtype.hasobject:
        raise DataError(f"{what} holds Python objects (dtype {dtype}); only numeric arrays are read, never pickles")
    if dtype.subdtype is not None:
        raise DataError(f"{what} has a sub-array dtype {dtype}; only plain numeric arrays are read")
    if any(int(n) < 0 for n in shape):
        raise DataError(f"{what} has a negative dimension in its shape {shape}")
    shape = tuple(int(n) for n in shape)
    nbytes = math.prod(shape) * dtype.itemsize
    held = stored_bytes - handle.tell()
    if nbytes > held:
        raise DataError(
            f"{what}: its header claims shape {shape} of {dtype} ({human_bytes(nbytes)}), "
            f"but only {human_bytes(max(held, 0))} follow it"
        )
    return NpyHeader(shape, bool(fortran_order), dtype, nbytes)


def read_npy_data(handle: BinaryIO, header: NpyHeader, what: str) -> np.ndarray:
    """The array that ``header`` describes, after checking that memory allows it; native byte order."""
    check_allocation(header.nbytes, f"{what} (shape {header.shape}, {header.dtype})")
    flat = read_into(handle, np.empty(header.count, dtype=header.dtype), what)
    array = flat.reshape(header.shape, order="F" if header.fortran_order else "C")
    if not header.dtype.isnative:
        array = array.astype(header.dtype.newbyteorder("="))
    return array


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

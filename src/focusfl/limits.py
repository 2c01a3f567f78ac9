"""Memory focusfl may use, checked before large allocations (a one-line error instead of MemoryError)."""
from __future__ import annotations

import resource

from .errors import DataError


def available_bytes() -> int:
    """Free memory (MemAvailable) bounded by the address-space limit, if any."""
    free = None
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    free = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    limits = [v for v in (free, None if soft == resource.RLIM_INFINITY else soft) if v]
    return min(limits) if limits else 1 << 62


def check_allocation(nbytes: int, what: str) -> None:
    available = available_bytes()
    if nbytes > available:
        raise DataError(f"{what} needs {nbytes / 2**30:.3g} GiB, more than the {available / 2**30:.3g} GiB available")

"""The SHA-256 of a file's bytes: what config.json records of every file a run read
(runs/inputs.py) and of the user's own algorithm code (algorithms/importing.py)."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from ..errors import DataError

_CHUNK = 1 << 20

# A sweep or a tune runs many runs on the same data in one process: a file's digest is kept
# while its identity, size and modification time stay the same.
_DIGESTS: dict[tuple[str, int, int, int, int], str] = {}


def file_digest(path: Path) -> str:
    """The SHA-256 of a file's bytes, read in chunks (memory does not grow with the file)."""
    try:
        info = os.stat(path)
        key = (str(path), info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
        if key in _DIGESTS:
            return _DIGESTS[key]
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            while chunk := handle.read(_CHUNK):
                digest.update(chunk)
    except OSError as exc:
        raise DataError(f"cannot read {str(path)!r} to record its digest: {exc.strerror or exc}") from None
    if len(_DIGESTS) > 4096:
        _DIGESTS.clear()
    _DIGESTS[key] = digest.hexdigest()
    return _DIGESTS[key]

"""Figures at paths the user named (``focusfl plot --out``, ``participation --plot``), tagged
as focusfl's so that a later command may replace its own figure and never a user's file."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

from ..errors import ConfigError
from .atomic import TMP_SUFFIX, atomic_path

FIGURE_TAG = "focusfl"
_TAG_SCAN_BYTES = 1 << 16


def figure_metadata(path: str | Path) -> dict[str, str | None]:
    """Matplotlib savefig metadata that marks a PNG, PDF or SVG as written by focusfl (a PDF or SVG
    without the date matplotlib would add, so that the same figure is the same bytes)."""
    suffix = Path(path).suffix.lower()
    if suffix == ".svg":
        return {"Creator": FIGURE_TAG, "Date": None}
    return {"Creator": FIGURE_TAG, "CreationDate": None} if suffix == ".pdf" else {"Software": FIGURE_TAG}


def _tagged(path: Path) -> bool:
    """Whether a file is a figure focusfl wrote: its tag, uncompressed near the start (PNG tEXt,
    SVG metadata) or the end (PDF Info) of the file."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(_TAG_SCAN_BYTES)
            handle.seek(max(0, os.fstat(handle.fileno()).st_size - _TAG_SCAN_BYTES))
            tail = handle.read()
    except OSError:
        return False
    tag = FIGURE_TAG.encode()
    return (head.startswith(b"\x89PNG") and b"Software\x00" + tag in head) or (
        head.startswith(b"%PDF") and b"(" + tag + b")" in tail) or (
        head.startswith(b"<?xml") and b"<dc:title>" + tag + b"</dc:title>" in head)


def check_figure_targets(paths, option: str) -> None:
    """ConfigError (one line) if a path names a folder, or a file focusfl did not write, or lies
    where no file can be written (below a file, in a folder that is not writable)."""
    for path in map(Path, paths):
        if path.is_dir():
            raise ConfigError(f"{option} {str(path)!r} is a folder; give a file name")
        if (path.exists() or path.is_symlink()) and not _tagged(path):
            raise ConfigError(f"{option}: {str(path)!r} exists and focusfl did not write it; "
                              "choose another name (focusfl does not overwrite it)")
        ancestor = path.absolute().parent
        while not ancestor.exists() and ancestor != ancestor.parent:
            ancestor = ancestor.parent
        if not ancestor.is_dir():
            raise ConfigError(f"{option} {str(path)!r} cannot be written: {str(ancestor)!r} is a file, not a folder")
        if not os.access(ancestor, os.W_OK | os.X_OK):
            raise ConfigError(f"{option} {str(path)!r} cannot be written: {str(ancestor)!r} is not writable")



@contextlib.contextmanager
def figure_files(paths, option: str) -> Iterator[list[Path]]:
    """Temporary names for figures that replace ``paths`` atomically when the block succeeds
    (checked first with ``check_figure_targets``); nothing is left behind if it fails."""
    paths = [Path(p) for p in paths]
    check_figure_targets(paths, option)
    # One stem for all (a PNG and a PDF of one plot are written under one name), the extension
    # last (matplotlib picks the format from it).
    scratch = [p.with_name(f".{p.stem}.{os.getpid()}{TMP_SUFFIX}{p.suffix}") for p in paths]
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(atomic_path(p, scratch=tmp)) for p, tmp in zip(paths, scratch)]

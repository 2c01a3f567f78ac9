"""Writing results: CSV tables, JSON configs, and output folders that appear whole or not at all."""
from __future__ import annotations

import contextlib
import csv
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterable, Iterator

from ..errors import ConfigError


def write_csv(path: Path, rows: Iterable[dict], columns: list[str] | None = None) -> None:
    rows = list(rows)
    if columns is None:
        columns = []
        for row in rows:
            columns.extend(k for k in row if k not in columns)
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _fmt(row.get(k)) for k in columns})


def _fmt(value):
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)  # full precision: reruns must compare equal
    return value


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def write_json(path: Path, data: dict) -> None:
    with open(path, "w") as handle:
        json.dump(data, handle, indent=2, sort_keys=False)
        handle.write("\n")


def _is_replaceable(target: Path) -> bool:
    """An existing folder may be replaced only if it is empty or a previous focusfl output."""
    if not target.exists():
        return True
    if not target.is_dir():
        return False
    names = {p.name for p in target.iterdir()}
    return not names or "config.json" in names or "summary.csv" in names


@contextlib.contextmanager
def output_folder(target: str | Path) -> Iterator[Path]:
    """Yield a scratch folder that becomes ``target`` only if the block finishes.

    On an exception the scratch folder is deleted, so a failed or interrupted command never
    leaves a half-written output folder behind. A partial result that should survive (a
    diverged run) is written by finishing the block normally.
    """
    target = Path(target)
    if not _is_replaceable(target):
        raise ConfigError(f"output folder {str(target)!r} exists and is not a focusfl output folder")
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        yield scratch
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    if target.exists():
        shutil.rmtree(target)
    os.replace(scratch, target)


MARKER = ".focusfl-output.json"


class Output:
    """Minimal stand-in of the output-folder API (replaced by the locked, marked implementation)."""

    def __init__(self, target: Path) -> None:
        self.target = target
        self.work = target.parent / f".{target.name}.focusfl-partial"
        self.found_partial = self.work.is_dir()
        self.work.mkdir(parents=True, exist_ok=True)

    def publish(self) -> None:
        old = self.target.parent / f".{self.target.name}.focusfl-old"
        if self.target.exists():
            os.replace(self.target, old)
        os.replace(self.work, self.target)
        shutil.rmtree(old, ignore_errors=True)

    def discard(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)

    def close(self) -> None:
        pass

    def __enter__(self) -> "Output":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_output(target: str | Path, *, kind: str) -> Output:
    target = Path(target)
    if not _is_replaceable(target):
        raise ConfigError(f"output folder {str(target)!r} exists and is not a focusfl output folder")
    target.parent.mkdir(parents=True, exist_ok=True)
    return Output(target)

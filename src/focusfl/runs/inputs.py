"""What a run reads, recorded by digest: a resume or a replay goes on only with the same inputs.

config.json's ``inputs`` names every file or folder a run was built from, with its SHA-256::

    "inputs": {"problem data": {"path": "/data/mnist10k.npz", "sha256": "9f2c..."},
               "participation trace": {"path": "/runs/fed/trace.csv", "sha256": "41d0..."}}

The problem, the participation process and the work process say what they read
(``input_paths()``: an nn problem its dataset files, a Hugging Face one also its tokenizer and
model folders, a trace its file); an algorithm of the user's own (``--algorithm file.py:Class``)
its source file, as ``"algorithm code"``. The digest of a file is the SHA-256 of its bytes (what
``sha256sum`` prints); of a folder, or of several files, the SHA-256 of the lines
``SHA256  NAME`` of its regular files (relative names, sorted; hidden entries such as ``.git``
or ``.cache`` left out). A work trace's digest is the one its process computed when it read the
file (work/trace.py), not a second reading.

``focusfl run --resume DIR`` and ``focusfl run --config FILE`` compare the inputs they are about
to run on with the recorded ones and refuse, in one line naming the input, any that changed:
the same bytes as the uninterrupted run are promised only on the same data. Only the parts a
replay takes from the file are compared (a ``--problem`` given beside ``--config`` reads other
data on purpose). ``--accept-changed-inputs`` goes on anyway; config.json then records the new
digests under ``inputs`` and what changed under ``inputs_changed``.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path
from typing import Any, Iterable

from ..algorithms.importing import algorithm_source, recorded_code, without_digest
from ..errors import ConfigError
from ..io.digest import file_digest
from ..spec import parse_spec

INPUTS = "inputs"  # config.json: {label: {"path", "sha256"}}
CHANGED = "inputs_changed"  # config.json: the changes a run was told to accept
PARTS = ("problem", "participation", "work")
ALGORITHM_CODE = "algorithm code"  # the label of an imported algorithm's source file (algorithms/importing.py)
ACCEPT_FLAG = "--accept-changed-inputs"


def _folder_files(folder: Path) -> list[tuple[str, Path]]:
    """(relative name, path) of the regular files below ``folder``, hidden entries left out."""
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in files:
            if not name.startswith("."):
                path = Path(root) / name
                if path.is_file():
                    found.append((path.relative_to(folder).as_posix(), path))
    return sorted(found)


def _listing_digest(entries: Iterable[tuple[str, Path]]) -> str:
    lines = "".join(f"{file_digest(path)}  {name}\n" for name, path in entries)
    return hashlib.sha256(lines.encode()).hexdigest()


def path_digest(target: Path | tuple[Path, ...]) -> tuple[str, str]:
    """(where, SHA-256) of a file, a folder or several files (see the module docstring)."""
    if isinstance(target, tuple):
        where = Path(os.path.commonpath([str(p) for p in target])) if len(target) > 1 else target[0]
        return str(where), _listing_digest((p.name if len(target) == 1 else str(p.relative_to(where)), p)
                                           for p in sorted(target))
    if target.is_dir():
        return str(target), _listing_digest(_folder_files(target))
    return str(target), file_digest(target)


def input_digests(built: Any) -> dict[str, dict[str, str]]:
    """``{label: {"path", "sha256"}}`` of everything the built run read (config.json's ``inputs``)."""
    found: dict[str, dict[str, str]] = {}
    for part in PARTS:
        owner = getattr(built, part, None)
        paths = getattr(owner, "input_paths", None)
        for what, target in (paths() if callable(paths) else {}).items():
            where, sha = path_digest(target)
            found[f"{part} {what}"] = {"path": where, "sha256": sha}
    work = getattr(built, "work", None)
    if getattr(work, "name", None) == "trace":  # its own digest, computed as it read the file
        found["work trace"] = {"path": str(work.path), "sha256": work.sha256}
    source = algorithm_source(built.algorithm) if hasattr(built, "algorithm") else None
    if source is not None:  # the user's own algorithm: its digest, computed as it was imported
        found[ALGORITHM_CODE] = {"path": source.path, "sha256": source.sha256}
    return found


# -- what was recorded ---------------------------------------------------------------------------
def recorded_inputs(data: dict, where: str) -> dict[str, dict[str, str]]:
    """A config.json's ``inputs``, checked; a work trace pinned in its ``work`` SPEC (runs
    recorded before ``inputs`` existed) counts as recorded too."""
    recorded = data.get(INPUTS, {})
    if not isinstance(recorded, dict) or not all(
        isinstance(k, str) and isinstance(v, dict) and isinstance(v.get("sha256"), str)
        and isinstance(v.get("path", ""), str) for k, v in recorded.items()
    ):
        raise ConfigError(f"{where}: {INPUTS!r} must map each input to its path and sha256")
    pinned = _pinned_trace(data.get("work"))
    if pinned is not None and "work trace" not in recorded:
        recorded = {**recorded, "work trace": pinned}
    code = _pinned_code(data.get("algorithm"))
    if code is not None and ALGORITHM_CODE not in recorded:  # a federation's record: the digest in its SPEC
        recorded = {**recorded, ALGORITHM_CODE: code}
    return recorded


def _pinned_code(algorithm: Any) -> dict[str, str] | None:
    """The SHA-256 an imported algorithm's record carries (algorithms/importing.py), as an input."""
    for name, sha256 in recorded_code(algorithm).items():
        return {"path": name.rpartition(":")[0], "sha256": sha256}
    return None


def _pinned_trace(work: Any) -> dict[str, str] | None:
    try:
        name, params = parse_spec(work) if work is not None else (None, {})
    except ConfigError:
        return None
    if name != "trace" or not isinstance(params.get("sha256"), str):
        return None
    return {"path": str(params.get("path", "")), "sha256": params["sha256"]}


def recorded_changes(data: dict) -> list:
    """The changes a run accepted before (config.json's ``inputs_changed``), to keep."""
    changes = data.get(CHANGED, [])
    return list(changes) if isinstance(changes, list) else []


def unpinned(config: Any) -> Any:
    """``config`` without the SHA-256 a work trace SPEC or an imported algorithm carries: the
    inputs are compared here, once, with the recorded digests (and a change can be accepted),
    not refused while building."""
    config = dataclasses.replace(config, algorithm=without_digest(config.algorithm))
    try:
        name, params = parse_spec(config.work)
    except ConfigError:
        return config
    if name != "trace" or "sha256" not in params:
        return config
    params = {k: v for k, v in params.items() if k != "sha256"}
    return dataclasses.replace(config, work={"name": name, **params})


# -- the comparison ------------------------------------------------------------------------------
def changed_inputs(recorded: dict, current: dict, skip: Iterable[str] = ()) -> list[dict[str, str]]:
    """The inputs whose digest differs from the recorded one (parts in ``skip`` left out)."""
    skipped = set(skip)
    changes = []
    for label, now in current.items():
        was = recorded.get(label)
        if was is None or label.split(" ", 1)[0] in skipped or was["sha256"] == now["sha256"]:
            continue
        changes.append({"input": label, "path": now["path"], "recorded": was["sha256"], "sha256": now["sha256"]})
    return changes


def check_inputs(recorded: dict, current: dict, *, accept: bool, what: str,
                 skip: Iterable[str] = ()) -> list[dict[str, str]]:
    """The changed inputs, accepted (``accept``), or ConfigError naming the first one.

    ``what`` says what would go on on them, e.g. "the run in runs/a"."""
    changes = changed_inputs(recorded, current, skip)
    if changes and not accept:
        first = changes[0]
        more = f" (and {len(changes) - 1} more)" if len(changes) > 1 else ""
        raise ConfigError(
            f"{first['input']} {first['path']} has changed since {what} was recorded "
            f"(SHA-256 {first['sha256'][:12]}..., recorded {first['recorded'][:12]}...){more}; "
            f"it would not give the same results: give {ACCEPT_FLAG} to go on with the new inputs "
            "(config.json records it)"
        )
    return changes

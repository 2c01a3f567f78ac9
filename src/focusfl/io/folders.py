"""Output folders that focusfl marks as its own, one writer each, replaced whole.

A user's files are never lost, however a command ends:

- focusfl writes into ``PARENT/.NAME.focusfl-partial`` and replaces ``PARENT/NAME`` only when
  the command finishes: the partial folder is marked complete (its marker records a digest of
  the marker it replaces), then exchanged with ``NAME`` in one atomic step
  (``renameat2(RENAME_EXCHANGE)`` on Linux, ``renamex_np(RENAME_SWAP)`` on macOS), the old
  output moved on to ``.NAME.focusfl-old`` and deleted. ``PARENT/NAME`` holds a complete
  output, the old or the new one, at every instant a process can be killed.
- Fallback, where the platform or the filesystem cannot exchange two folders (another OS, some
  network and FUSE filesystems): two renames, old aside to ``.NAME.focusfl-old`` and the new one
  into place. Between those two renames, and only there, ``NAME`` is briefly absent; the old and
  the new output are both whole at all times.
- Killed in the middle, the next writer of that folder (any focusfl command that writes it)
  first finishes the replacement: a complete new output is never stranded in the hidden
  folder, and an old one set aside is deleted.
- A folder is replaced only if it carries focusfl's marker, ``.focusfl-output.json``, and holds
  nothing the marker does not list; it is deleted file by file, the listed ones only. The
  current folder, the home folder, their ancestors and ``/`` are never output folders.
- One writer per folder: a second one gets a one-line error at once (a non-blocking lock).
- Folders are made with ``mkdir``, so the user's umask applies.
- A partial folder may keep finished units of a long command in ``.cache`` (see
  ``experiments.cache``), so that a rerun after a crash or Ctrl-C skips what was done; it is
  deleted when the folder is published.
- A :class:`Store` is a folder filled over several commands (a sweep's ``DIR``): locked and
  marked the same way, but never swapped as a whole.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import socket
import stat
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from .. import __version__
from ..errors import ConfigError
from .atomic import TMP_SUFFIX, atomic_path, disk_full, fsync_file, fsync_folder, no_space

MARKER = ".focusfl-output.json"
PARTIAL_SUFFIX = ".focusfl-partial"
OLD_SUFFIX = ".focusfl-old"
LOCK_SUFFIX = ".focusfl-lock"
CACHE = ".cache"  # finished units of work in a partial folder; not published
# The earlier scheme: tempfile.mkdtemp(prefix=".NAME.") -> ".NAME." + 8 of these, mode 0700.
_MKDTEMP_NAME = re.compile(r"[a-z0-9_]{8}")
_LEGACY_SUFFIXES = (".csv", ".json", ".png", ".pdf")

# Called with a step's name after every filesystem step of a replacement, so that a test can
# kill the process between any two of them (see tests/test_outputs.py).
_after_step: Callable[[str], None] | None = None
# Marker key: the SHA-256 of the marker of the output a complete partial folder replaces ("" when
# there was none), so that a writer finishing a killed replacement knows which folder is newer.
REPLACES = "replaces"


def _step(name: str, operation: Callable[..., Any], *args: Any) -> Any:
    result = operation(*args)
    if _after_step is not None:
        _after_step(name)
    return result


# -- the marker ----------------------------------------------------------------------------------
def read_marker(folder: Path) -> dict | None:
    """The marker of ``folder`` if it is a valid one, else None."""
    try:
        data = json.loads((Path(folder) / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("state") not in ("partial", "complete"):
        return None
    listed = [*data.get("files", []), *data.get("folders", [])]
    if not isinstance(data.get("files"), list) or not all(_safe_relative(p) for p in listed):
        return None
    return data


def _safe_relative(path: Any) -> bool:
    return isinstance(path, str) and bool(path) and not os.path.isabs(path) and ".." not in Path(path).parts


def _write_marker(folder: Path, state: str, kind: str, files: list[str] = (), folders: list[str] = (),
                  replaces: str | None = None, experiment: dict | None = None) -> None:
    data = {
        "focusfl_version": __version__, "kind": kind, "state": state,
        "files": list(files), "folders": list(folders),
        "pid": os.getpid(), "host": socket.gethostname(), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **({"experiment": experiment} if experiment is not None else {}),
    }
    if replaces is not None:
        data[REPLACES] = replaces
    text = json.dumps(data, indent=2) + "\n"
    # A fixed temporary name: _unmarked_partial recognises a writer that died writing it.
    with atomic_path(folder / MARKER, durable=True, step=_step) as scratch:
        _step("write marker", scratch.write_text, text)


def _marker_digest(folder: Path) -> str:
    """The SHA-256 of ``folder``'s marker file ("" if it has none): which output a new one replaces."""
    try:
        return hashlib.sha256((folder / MARKER).read_bytes()).hexdigest()
    except OSError:
        return ""


def _contents(folder: Path) -> tuple[list[str], list[str]]:
    """(files, folders) below ``folder`` as sorted relative POSIX paths; links are not followed."""
    files, folders = [], []

    def walk(current: Path, prefix: str) -> None:
        for entry in os.scandir(current):
            rel = f"{prefix}{entry.name}"
            if entry.is_dir(follow_symlinks=False):
                folders.append(rel)
                walk(Path(entry.path), rel + "/")
            else:
                files.append(rel)

    walk(folder, "")
    return sorted(files), sorted(folders)


def _unlisted(folder: Path, marker: dict) -> str | None:
    """One entry of ``folder`` that its marker does not list (something a user added), or None."""
    files = set(marker["files"]) | {MARKER}
    allowed_folders = set(marker.get("folders", []))
    for listed in marker["files"]:
        allowed_folders.update(p.as_posix() for p in Path(listed).parents if p.parts)
    found_files, found_folders = _contents(folder)
    stray = [f for f in found_files if f not in files] + [d for d in found_folders if d not in allowed_folders]
    return min(stray) if stray else None


# -- atomic exchange of two folders --------------------------------------------------------------
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2  # linux/fs.h
_RENAME_SWAP = 2  # macOS sys/stdio.h, renamex_np
# renameat2's system call number where libc has no wrapper (glibc before 2.28, some musl builds).
_RENAMEAT2_SYSCALL = {"x86_64": 316, "aarch64": 276, "riscv64": 276, "i386": 353, "i686": 353,
                      "armv7l": 382, "ppc64le": 357, "s390x": 347}
# What a filesystem or kernel that cannot exchange answers: then the two-rename fallback runs.
_CANNOT_EXCHANGE = {errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV}
_exchange_call: Callable[[bytes, bytes], int] | None | bool = False  # False: not looked up yet


def _find_exchange() -> Callable[[bytes, bytes], int] | None:
    """The C call that swaps two paths atomically, or None on a platform without one."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    if sys.platform.startswith("linux"):
        if hasattr(libc, "renameat2"):
            call = libc.renameat2
            return lambda a, b: call(_AT_FDCWD, a, _AT_FDCWD, b, _RENAME_EXCHANGE)
        number = _RENAMEAT2_SYSCALL.get(os.uname().machine)
        if number is None or not hasattr(libc, "syscall"):
            return None
        syscall = libc.syscall
        return lambda a, b: syscall(number, _AT_FDCWD, a, _AT_FDCWD, b, _RENAME_EXCHANGE)
    if sys.platform == "darwin" and hasattr(libc, "renamex_np"):
        call = libc.renamex_np
        return lambda a, b: call(a, b, _RENAME_SWAP)
    return None


def exchange(first: Path, second: Path) -> bool:
    """Swap the two existing paths ``first`` and ``second`` in one atomic step; False (nothing
    done) where the platform or the filesystem cannot, so the caller falls back to renames."""
    global _exchange_call
    if _exchange_call is False:
        _exchange_call = _find_exchange()
    if _exchange_call is None:
        return False
    if _exchange_call(os.fsencode(first), os.fsencode(second)) == 0:
        return True
    code = ctypes.get_errno()
    if code in _CANNOT_EXCHANGE:
        return False
    raise OSError(code, os.strerror(code), str(first), None, str(second))


# -- where an output may go ----------------------------------------------------------------------
def _refuse(target: str | Path, reason: str) -> ConfigError:
    return ConfigError(f"output folder {str(target)!r} {reason}")


def _check_place(given: str | Path) -> Path:
    """The checks that need no look inside the target: where it is, what its parents are."""
    path = Path(given).expanduser().resolve()
    try:
        cwd = Path.cwd().resolve()
    except OSError:
        cwd = None
    try:
        home = Path.home().resolve()
    except (OSError, RuntimeError):  # no HOME and no password entry
        home = Path(path.anchor)
    if path == Path(path.anchor):
        raise _refuse(given, "is the root folder '/'; choose a folder of its own")
    if path == cwd:
        raise _refuse(given, "is the current folder; choose a new subfolder, e.g. runs/NAME")
    if cwd is not None and path in cwd.parents:
        raise _refuse(given, "is an ancestor of the current folder; choose a new subfolder, e.g. runs/NAME")
    if path == home:
        raise _refuse(given, "is the home folder; choose a new subfolder")
    if path in home.parents:
        raise _refuse(given, "is an ancestor of the home folder; choose a new subfolder")
    # One stat, not exists() then is_dir(): another writer may rename the folder away and back
    # between two looks (its atomic replacement), which is not "a file".
    try:
        is_folder = stat.S_ISDIR(os.stat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):  # absent, or below a file (said below)
        is_folder = None
    if is_folder is False:
        raise _refuse(given, "exists and is not a folder")
    ancestor = path.parent
    while not ancestor.exists():
        if ancestor.is_symlink():  # a dangling link on the way
            raise _refuse(given, f"cannot be created: {str(ancestor)!r} is a broken link")
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise _refuse(given, f"cannot be created: {str(ancestor)!r} is a file, not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise _refuse(given, f"cannot be written: {str(ancestor)!r} is not writable")
    if is_folder and not os.access(path, os.W_OK | os.X_OK) and path.exists():  # not merely replaced meanwhile
        raise _refuse(given, "is not writable")
    return path


def _check_contents(given: str | Path, path: Path) -> None:
    """An existing target must be empty, or focusfl's with nothing added by the user."""
    if not path.is_dir():
        return
    marker = read_marker(path)
    if marker is None:
        if next(os.scandir(path), None) is None:
            return
        raise _refuse(given, f"is not empty and has no {MARKER}, so it is not focusfl's to replace "
                             "(nor have outputs of earlier focusfl versions): remove it yourself or "
                             "choose another folder")
    stray = _unlisted(path, marker)
    if stray is not None:
        raise _refuse(given, f"holds {stray!r}, which focusfl did not write: "
                             "move it out or choose another folder")


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def check_target(target: str | Path) -> Path:
    """The resolved output folder, or ConfigError (one line: the path and why not)."""
    try:
        path = _check_place(target)
        for attempt in range(3):
            seen = _identity(path)
            try:
                _check_contents(target, path)
            except FileNotFoundError:
                pass  # replaced by a writer meanwhile; open_output looks again under the lock
            except ConfigError:
                # Another writer's atomic replacement between two looks (its marker read while
                # the folder was moved aside, its files listed once the new one was in) is not
                # a user's folder: a replaced folder is a new inode, so look again.
                if attempt < 2 and _identity(path) != seen:
                    continue
                raise
            break
    except OSError as exc:  # a folder on the way that we may not read
        raise _refuse(target, f"cannot be checked: {exc.strerror or exc}: {exc.filename!r}") from None
    return path


# -- one writer per folder -----------------------------------------------------------------------
class _Lock:
    """An exclusive flock on ``PARENT/.NAME.focusfl-lock``, unlinked when released.

    The file is unlinked by its holder, so a writer that opened it just before may lock an
    unlinked inode; it re-checks that the path still names what it locked, else retries.
    """

    def __init__(self, path: Path, given: str | Path):
        self.path = path
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _lock_holder(fd)
                os.close(fd)
                raise _refuse(given, "is being written by another focusfl process "
                                     f"(pid {holder}); wait for it or choose another folder") from None
            except BaseException:
                os.close(fd)
                raise
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd: int | None = fd

    def release(self) -> None:
        if self.fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        os.close(self.fd)
        self.fd = None


def _lock_holder(fd: int) -> str:
    """The pid the holder wrote into the lock file (it writes it just after locking)."""
    for _ in range(20):
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
        if text.isdigit():
            return text
        time.sleep(0.01)
    return "unknown"


# -- the output folder ---------------------------------------------------------------------------
class Output:
    """A locked output folder: results go into ``work``; ``publish`` puts them at ``target``."""

    def __init__(self, target: Path, kind: str, lock: _Lock, found_partial: bool):
        self.target = target
        self.kind = kind
        self.work = _sibling(target, PARTIAL_SUFFIX)
        self.found_partial = found_partial
        self._created = False
        self._lock = lock

    def publish(self) -> None:
        """Mark ``work`` complete and put it at ``target`` (see the module docstring: atomically
        where the platform can exchange two folders); the old output is then deleted."""
        self._require_lock()
        target, work = self.target, self.work
        try:
            if (work / CACHE).exists():
                _step("remove cache", shutil.rmtree, work / CACHE)
            files, folders = _contents(work)
            for leftover in [f for f in files if f.endswith(TMP_SUFFIX)]:
                _step("remove temporary file", os.unlink, work / leftover)
            files = [f for f in files if f != MARKER and not f.endswith(TMP_SUFFIX)]
            for rel in files:
                if (work / rel).is_file() and not (work / rel).is_symlink():
                    _step("fsync file", fsync_file, work / rel)
            for rel in sorted(folders, reverse=True):
                _step("fsync folder", fsync_folder, work / rel)
            # Last look under the lock: a file the user put into the old output during the run.
            _check_contents(target, target)
            _write_marker(work, "complete", self.kind, files, folders, replaces=_marker_digest(target))
            _swap_in(work, target)
        except OSError as exc:
            where = work if work.exists() else target
            if no_space(exc):
                raise disk_full(target, exc, f"the results are in {str(where)!r}") from None
            raise ConfigError(f"could not publish output folder {str(target)!r}: {exc.strerror or exc}; "
                              f"the results are in {str(where)!r}") from None

    def create(self) -> None:
        """Make the partial folder (clearing a dead writer's that is not continued), unless a
        partial folder to continue was found."""
        self._require_lock()
        if self.found_partial or self._created:
            return
        work = self.work
        if work.exists() or work.is_symlink():
            if work.is_dir() and not work.is_symlink():
                shutil.rmtree(work)
            else:
                os.unlink(work)
        _step("create partial folder", os.mkdir, work)
        _write_marker(work, "partial", self.kind)
        self._created = True

    def discard(self) -> None:
        """Delete ``work`` (it is ours: focusfl made it under this lock or a dead writer's)."""
        self._require_lock()
        if self.work.is_dir() and not self.work.is_symlink():
            shutil.rmtree(self.work)

    def close(self) -> None:
        """Release the lock; ``work`` stays unless it was published or discarded."""
        self._lock.release()

    def _require_lock(self) -> None:
        if self._lock.fd is None:
            raise RuntimeError("output folder used after close()")

    def __enter__(self) -> "Output":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def _sibling(target: Path, suffix: str) -> Path:
    return target.parent / f".{target.name}{suffix}"


def _delete_old(old: Path, target: Path) -> None:
    """Delete a replaced output: the files its marker lists, then its emptied folders."""
    if not _ours_or_empty(old):
        raise _refuse(target, f"cannot be replaced: {str(old)!r} is in the way and is not focusfl's; "
                              "remove it yourself")
    marker = read_marker(old)
    if marker is not None:
        for rel in marker["files"]:
            path = old / rel
            if path.is_symlink() or path.is_file():
                _step("delete old file", os.unlink, path)
        listed = set(marker.get("folders", []))
        for rel in marker["files"]:
            listed.update(p.as_posix() for p in Path(rel).parents if p.parts)
        for rel in sorted(listed, key=lambda p: (-len(Path(p).parts), p)):
            with contextlib.suppress(OSError):  # not empty: the check below names what is left
                _step("delete old folder", os.rmdir, old / rel)
        stray = _unlisted(old, {"files": [], "folders": []})
        if stray is not None:
            raise _refuse(target, f"was replaced, but its old version {str(old)!r} holds {stray!r}, which "
                                  "focusfl did not write: move it out and delete that folder")
        _step("delete old marker", os.unlink, old / MARKER)
    _step("delete old folder", os.rmdir, old)


def _ours_or_empty(folder: Path) -> bool:
    if folder.is_symlink() or not folder.is_dir():
        return False
    return read_marker(folder) is not None or next(os.scandir(folder), None) is None


def _swap_in(work: Path, target: Path) -> None:
    """Put the complete folder ``work`` at ``target`` and delete what was there (we hold the lock).

    Where the platform can, one atomic exchange: ``target`` never lacks a complete output; the
    old one, now at ``work``, moves aside to ``.NAME.focusfl-old`` and is deleted. Elsewhere two
    renames, ``target`` briefly absent between them (module docstring)."""
    old = _sibling(target, OLD_SUFFIX)
    if target.exists() or target.is_symlink():
        if old.exists() or old.is_symlink():  # an older one, set aside before: it goes first
            _delete_old(old, target)
        if _step("exchange new into place", exchange, work, target):
            _step("move old aside", os.rename, work, old)
        else:
            _step("move old aside", os.rename, target, old)
            _step("move new into place", os.rename, work, target)
    else:
        _step("move new into place", os.rename, work, target)
    _step("fsync parent", fsync_folder, target.parent)
    if old.exists() or old.is_symlink():
        _delete_old(old, target)


def _complete_marker(folder: Path) -> dict | None:
    """The marker of ``folder`` if it is a real folder marked complete, else None."""
    if folder.is_symlink() or not folder.is_dir():
        return None
    marker = read_marker(folder)
    return marker if marker is not None and marker.get("state") == "complete" else None


def waiting_output(target: Path) -> Path | None:
    """The complete new output that a replacement killed before it finished left in the partial
    folder of ``target`` (the next writer of ``target`` puts it in place), or None.

    A complete folder there is the new output unless ``target`` records (``replaces``) that it
    replaced that folder: then it is the old output, exchanged out, and is deleted instead."""
    work = _sibling(target, PARTIAL_SUFFIX)
    if _complete_marker(work) is None:
        return None
    current = read_marker(target) if target.is_dir() and not target.is_symlink() else None
    if current is not None and current.get(REPLACES) == _marker_digest(work):
        return None
    return work


def _recover(target: Path) -> None:
    """Finish the replacement of a writer that died in ``publish`` (we hold the lock): a complete
    new output waiting in the partial folder is put in place (:func:`waiting_output`), an old one
    exchanged out or set aside is deleted once ``target`` holds one, and put back only if there is
    no complete new one to take its place."""
    old, work = _sibling(target, OLD_SUFFIX), _sibling(target, PARTIAL_SUFFIX)
    present = target.exists() or target.is_symlink()
    if waiting_output(target) is not None:
        if present:
            _check_contents(target, target)
        if (old.exists() or old.is_symlink()) and not present and not _ours_or_empty(old):
            raise _refuse(target, f"is missing and {str(old)!r} is not focusfl's: remove it yourself")
        _swap_in(work, target)
        return
    if _complete_marker(work) is not None:  # the old output, exchanged out of target
        if old.exists() or old.is_symlink():
            _delete_old(old, target)
        _step("move old aside", os.rename, work, old)
    if not (old.exists() or old.is_symlink()):
        return
    if target.exists() or target.is_symlink():
        _delete_old(old, target)  # the new output is in place: finish deleting the old
    elif _ours_or_empty(old):
        _step("put old back", os.rename, old, target)
        _step("fsync parent", fsync_folder, target.parent)
    else:
        raise _refuse(target, f"is missing and {str(old)!r} is not focusfl's: remove it yourself")


def _remove_legacy_scratch(target: Path) -> None:
    """Delete scratch folders ``.NAME.xxxxxxxx`` of the earlier random-name scheme.

    They carry no pid; we hold the lock, so no writer of this version is using them. Only
    folders that look exactly like that scheme's are touched: ours, mode 0700, flat, and
    holding only the kinds of files focusfl writes (.csv, .json, .png, .pdf).
    """
    prefix = f".{target.name}."
    for entry in os.scandir(target.parent):
        rest = entry.name[len(prefix):] if entry.name.startswith(prefix) else ""
        if not _MKDTEMP_NAME.fullmatch(rest):
            continue
        with contextlib.suppress(FileNotFoundError):
            info = entry.stat(follow_symlinks=False)
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or stat.S_IMODE(info.st_mode) != 0o700:
                continue
            inside = list(os.scandir(entry.path))
            if not all(e.is_file(follow_symlinks=False) and e.name.endswith(_LEGACY_SUFFIXES) for e in inside):
                continue
            for e in inside:
                os.unlink(e.path)
            os.rmdir(entry.path)


def _unmarked_partial(work: Path) -> bool:
    """A partial folder whose writer died between making it and renaming its marker in."""
    if work.is_symlink() or not work.is_dir():
        return False
    return {e.name for e in os.scandir(work)} <= {f".{MARKER}{TMP_SUFFIX}"}


@contextlib.contextmanager
def _unlocked_on_failure(lock: "_Lock", given: str | Path) -> Iterator[None]:
    """Release ``lock`` if preparing the folder fails (an OSError as one line), keep it otherwise."""
    try:
        yield
    except OSError as exc:
        lock.release()
        raise _refuse(given, f"cannot be written: {exc.strerror or exc}") from None
    except BaseException:
        lock.release()
        raise


def open_output(target: str | Path, *, kind: str, keep_partial: bool = True, create: bool = True) -> Output:
    """Check and lock ``target`` and prepare its partial folder ``.NAME.focusfl-partial``.

    A partial folder left by a dead writer of the same ``kind`` is kept as it is
    (``found_partial``) unless ``keep_partial`` is False; one of another kind is cleared.
    ``create=False`` leaves the partial folder alone until :meth:`Output.create`: a command that
    may still refuse (a resume checking its checkpoint) then leaves nothing behind.
    """
    given = target
    path = check_target(given)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = _Lock(_sibling(path, LOCK_SUFFIX), given)
    except OSError as exc:
        raise _refuse(given, f"cannot be created: {exc.strerror or exc}") from None
    with _unlocked_on_failure(lock, given):
        _recover(path)
        _check_contents(given, path)  # again, now that no other writer can change it
        _remove_legacy_scratch(path)
        output = Output(path, kind, lock, _reusable_partial(given, path, kind, keep_partial))
        if create:
            output.create()
        return output


def finish_waiting(target: str | Path) -> None:
    """Put in place the complete output a writer killed inside ``publish`` left waiting in the
    partial folder of ``target`` (:func:`waiting_output`), under the lock, as the next writer of
    ``target`` would; nothing when none waits. For readers that skip a finished output instead of
    writing it again (a rerun sweep): they read ``target``, so it must be there."""
    path = check_target(target)
    if waiting_output(path) is None:
        return
    lock = _Lock(_sibling(path, LOCK_SUFFIX), target)
    with _unlocked_on_failure(lock, target):
        _recover(path)
    lock.release()


def _reusable_partial(given: str | Path, path: Path, kind: str, keep_partial: bool) -> bool:
    """Whether the partial folder of ``path`` is a dead writer's of ``kind`` to continue; a
    folder in its place that is not focusfl's is refused."""
    work = _sibling(path, PARTIAL_SUFFIX)
    if not (work.exists() or work.is_symlink()):
        return False
    marker = read_marker(work) if work.is_dir() and not work.is_symlink() else None
    if marker is None and not _unmarked_partial(work):
        raise _refuse(given, f"cannot be written: {str(work)!r} is in the way and is not "
                             "focusfl's: remove it yourself")
    return marker is not None and keep_partial and marker.get("kind") == kind


@contextlib.contextmanager
def output_folder(target: str | Path, *, kind: str = "output", keep_partial: bool = False) -> Iterator[Path]:
    """Yield the partial folder of ``target``; it becomes ``target`` if the block finishes.

    On an exception (Ctrl-C included) the partial folder is deleted, unless ``keep_partial``:
    then it stays, with what a ``ResultCache`` stored in it, for a rerun to pick up. A result
    that should be published although it is partial (a diverged run) is written by finishing
    the block normally. Without ``keep_partial`` a dead writer's partial folder is cleared first.
    """
    output = open_output(target, kind=kind, keep_partial=keep_partial)
    try:
        try:
            yield output.work
        except BaseException:
            if not keep_partial:
                output.discard()
            raise
        output.publish()
    finally:
        output.close()


def _check_experiment(given: str | Path, kind: str, held: Any, wanted: dict | None) -> None:
    """Refuse a store whose marker records another experiment than ``wanted`` (a store written
    by an older focusfl records none, and is taken as it is)."""
    if wanted is None or held is None or held == wanted:
        return
    if not isinstance(held, dict):
        raise _refuse(given, f"holds a focusfl {kind} of another experiment: choose another folder")
    key = next(k for k in sorted(set(held) | set(wanted)) if held.get(k) != wanted.get(k))
    raise _refuse(given, f"holds a focusfl {kind} of another experiment (its {key} is {_shown(held.get(key))}, "
                         f"this one's {_shown(wanted.get(key))}): choose another folder")


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


# -- folders updated in place (sweeps) -----------------------------------------------------------
class Store:
    """A folder that focusfl fills over several commands (a sweep's ``DIR``), held under a lock.

    Unlike an :class:`Output` it is never swapped as a whole: what it holds (run folders, each
    written atomically by its own ``open_output``) stays between commands, so that a rerun can
    skip the finished parts. Its marker says ``partial`` until ``mark`` lists what it holds.
    """

    def __init__(self, path: Path, kind: str, lock: _Lock, experiment: dict | None = None):
        self.path, self.kind, self._lock, self.experiment = path, kind, lock, experiment

    def mark(self, files: Iterable[str], folders: Iterable[str] = ()) -> None:
        """Mark the store complete, listing ``files`` (those that exist) and everything below ``folders``."""
        listed = [f for f in files if (self.path / f).is_file()]
        below_folders = []
        for folder in folders:
            if (self.path / folder).is_dir():
                inner_files, inner_folders = _contents(self.path / folder)
                listed += [f"{folder}/{f}" for f in inner_files if not f.endswith(LOCK_SUFFIX)]
                below_folders += [folder, *(f"{folder}/{d}" for d in inner_folders)]
        _write_marker(self.path, "complete", self.kind, sorted(set(listed)), below_folders, experiment=self.experiment)

    def close(self) -> None:
        self._lock.release()


@contextlib.contextmanager
def open_store(target: str | Path, *, kind: str, experiment: dict | None = None) -> Iterator[Store]:
    """Check, create if needed, and lock a folder that focusfl updates in place.

    An existing folder must be empty or a focusfl folder of the same ``kind``; anything else
    (a user's folder, a run's output) is refused in one line, before anything is written.
    ``experiment``: what the folder's contents are runs of (JSON data, kept in the marker); a
    folder that holds another experiment is refused too, so that two experiments never mix
    their runs and tables (``focusfl tune``'s default folder).
    """
    if experiment is not None:
        experiment = json.loads(json.dumps(experiment))  # as the marker will read it back
    given = target
    try:
        path = _check_place(target)
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = _Lock(_sibling(path, LOCK_SUFFIX), given)
    except OSError as exc:
        raise _refuse(given, f"cannot be created: {exc.strerror or exc}") from None
    with _unlocked_on_failure(lock, given):
        marker = read_marker(path) if path.is_dir() else None
        if marker is None and path.is_dir() and next(os.scandir(path), None) is not None:
            raise _refuse(given, f"is not empty and has no {MARKER}, so it is not focusfl's: "
                                 "choose another folder")
        if marker is not None and marker.get("kind") != kind:
            raise _refuse(given, f"holds a focusfl {marker.get('kind')!r} output, not a {kind}: "
                                 "choose another folder")
        if marker is not None:
            _check_experiment(given, kind, marker.get("experiment"), experiment)
        if marker is None:
            path.mkdir(exist_ok=True)
            _write_marker(path, "partial", kind, experiment=experiment)
        store = Store(path, kind, lock, experiment if experiment is not None else (marker or {}).get("experiment"))
    try:
        yield store
    finally:
        store.close()

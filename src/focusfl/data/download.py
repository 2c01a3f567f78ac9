"""Optional downloads of the standard datasets from their canonical sources, with checksums.

A file is streamed into a temporary file next to its destination while its MD5 is computed;
only a file whose checksum matches the published one is moved into place. A corrupted or
truncated transfer is deleted and reported, never used: a connection cut short (an incomplete
read, a reset, a timeout) is one line, and the partial file is removed. A transfer larger than
``MAX_DOWNLOAD_BYTES`` (announced or received) or than the free space of the folder is stopped
before it fills the disk. Files already present with the right checksum are not fetched again.
"""
from __future__ import annotations

import hashlib
import http.client
import os
import tarfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from ..errors import DataError
from ..io.atomic import open_atomic

_CHUNK = 1 << 20
TIMEOUT_S = 60
# The largest file focusfl fetches is SVHN's train_32x32.mat (182 MB); anything far larger is
# not the published file, and is stopped before it fills the disk.
MAX_DOWNLOAD_BYTES = 1 << 30


@dataclass(frozen=True)
class RemoteFile:
    """A file to fetch: where from, the name to store it under, and its published MD5."""

    url: str
    name: str
    md5: str


MNIST_BASE = "https://ossci-datasets.s3.amazonaws.com/mnist/"
FASHION_BASE = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
CIFAR_BASE = "https://www.cs.toronto.edu/~kriz/"
SVHN_BASE = "http://ufldl.stanford.edu/housenumbers/"

def _files(base: str, md5_by_name: dict[str, str]) -> tuple[RemoteFile, ...]:
    return tuple(RemoteFile(base + name, name, md5) for name, md5 in md5_by_name.items())


_IDX = (
    "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"
)

# Published MD5 checksums (the same that torchvision verifies).
SOURCES: dict[str, tuple[RemoteFile, ...]] = {
    "mnist": _files(MNIST_BASE, dict(zip(_IDX, (
        "f68b3c2dcbeaaa9fbdd348bbdeb94873", "d53e105ee54ea40749a09fcbcd1e9432",
        "9fb629c4189551a2d022fa330f9573f3", "ec29112dd5afa0611ce80d1b7f02629c",
    )))),
    "fashion-mnist": _files(FASHION_BASE, dict(zip(_IDX, (
        "8d4fb7e6c68d591d4c3dfef9ec88bf0d", "25c81989df183df01b3e8a0aad5dffbe",
        "bef4ecab320f06d8554ea6380940ec79", "bb300cfdad3c16e7a12a480ee83cd310",
    )))),
    "cifar10": _files(CIFAR_BASE, {"cifar-10-python.tar.gz": "c58f30108f718f92721af3b95e74349a"}),
    "cifar100": _files(CIFAR_BASE, {"cifar-100-python.tar.gz": "eb9058c3a382ffc7106e4002c42a8d85"}),
    "svhn": _files(SVHN_BASE, {
        "train_32x32.mat": "e26dedcc434d2e4c54c9b2d4a06d8373",
        "test_32x32.mat": "eb5a983be6a315427106f1b164d9cef3",
    }),
}


def md5sum(path: str | Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fetch(remote: RemoteFile, folder: str | Path, *, progress: bool = True) -> Path:
    """Download ``remote`` into ``folder`` and verify it; returns the verified file's path.

    Raises DataError when the transfer fails or the checksum differs; in both cases nothing is
    left behind (an older file with the wrong checksum is left untouched as well).
    """
    folder = Path(folder)
    target = folder / remote.name
    if target.is_file() and md5sum(target) == remote.md5:
        return target
    folder.mkdir(parents=True, exist_ok=True)
    # A name of its own (.NAME.<random>.part): two commands may fetch the same file at once.
    with open_atomic(target, "wb", unique=True, suffix=".part", private=True) as out:
        digest = _stream(remote, out, progress)
        if digest != remote.md5:
            raise DataError(
                f"download of {remote.url} is corrupted (md5 {digest}, expected {remote.md5}); it was discarded"
            )
    return target


def _stream(remote: RemoteFile, out, progress: bool) -> str:
    """Copy the response body into ``out``; returns its MD5."""
    digest = hashlib.md5(usedforsecurity=False)
    request = urllib.request.Request(remote.url, headers={"User-Agent": "focusfl"})
    received = 0
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            total = int(response.headers.get("Content-Length") or 0) or None
            limit = _room(out, remote, total)
            bar = _progress_bar(remote.name, total) if progress else None
            try:
                for chunk in iter(lambda: response.read(_CHUNK), b""):
                    received += len(chunk)
                    if received > limit:
                        raise DataError(f"cannot download {remote.url}: it sent more than {limit:,} bytes, "
                                        "far more than the published file; the partial file was removed")
                    digest.update(chunk)
                    out.write(chunk)
                    if bar is not None:
                        bar.update(len(chunk))
            finally:
                if bar is not None:
                    bar.close()
    except http.client.IncompleteRead as exc:
        raise DataError(
            f"cannot download {remote.url}: the connection closed after {received + len(exc.partial):,} bytes"
            f"{f' ({exc.expected:,} more expected)' if exc.expected else ''}; the partial file was removed"
        ) from None
    except urllib.error.URLError as exc:  # no connection, or an HTTP error status: nothing came
        raise DataError(f"cannot download {remote.url}: {_first_line(exc.reason)}") from None
    except (http.client.HTTPException, OSError, ValueError) as exc:  # a reset, a timeout mid-transfer
        raise DataError(
            f"cannot download {remote.url}: the transfer failed ({_first_line(exc)}); the partial file was removed"
        ) from None
    return digest.hexdigest()


def _room(out, remote: RemoteFile, announced: int | None) -> int:
    """The most bytes this transfer may write: MAX_DOWNLOAD_BYTES, less if the disk has less
    free space; DataError at once if the announced size does not fit."""
    try:
        stats = os.statvfs(os.path.dirname(out.name) or ".")
        free = stats.f_bavail * stats.f_frsize
    except (OSError, AttributeError, TypeError):
        free = MAX_DOWNLOAD_BYTES
    limit = min(MAX_DOWNLOAD_BYTES, free)
    if announced is not None and announced > limit:
        why = "more than the published file" if announced > MAX_DOWNLOAD_BYTES else f"only {free:,} bytes are free there"
        raise DataError(f"cannot download {remote.url}: it is {announced:,} bytes, {why}")
    return limit


def _first_line(reason: object) -> str:
    text = str(reason).strip()
    return text.splitlines()[0] if text else type(reason).__name__


def _progress_bar(name: str, total: int | None):
    return tqdm(total=total, desc=f"download {name}", unit="B", unit_scale=True, disable=None,
                leave=False)


def download_dataset(
    dataset: str, folder: str | Path, *, sources: dict | None = None, progress: bool = True
) -> list[Path]:
    """Fetch and verify every file of ``dataset`` into ``folder``; archives are unpacked there."""
    table = SOURCES if sources is None else sources
    if dataset not in table:
        raise DataError(f"no download source for {dataset!r} (downloadable: {', '.join(sorted(table))})")
    paths = [fetch(remote, folder, progress=progress) for remote in table[dataset]]
    for path in paths:
        if path.name.endswith((".tar.gz", ".tgz")):
            extract_tar(path, Path(folder))
    return paths


def extract_tar(archive: Path, folder: Path) -> None:
    """Unpack a tar archive into ``folder``, refusing members that would land outside it."""
    try:
        with tarfile.open(archive, "r:*") as tar:
            tar.extractall(folder, filter="data")
    except (tarfile.TarError, OSError) as exc:
        raise DataError(f"cannot unpack {archive}: {exc}") from None

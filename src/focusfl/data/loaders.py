"""Readers for the standard on-disk formats of image-classification datasets.

Every reader returns :class:`ImageData`: images as a numpy array ``[M, C, H, W]`` (uint8 for
the standard datasets, kept as stored for an .npz) and integer labels ``[M]`` (int64). Nothing
here downloads anything; see download.py. Formats:

- IDX (MNIST, Fashion-MNIST): big-endian header, raw or gzip-compressed.
- CIFAR-10 / CIFAR-100 "python version": pickled dicts, read with an unpickler that only
  rebuilds numpy arrays (a pickle can otherwise run arbitrary code).
- SVHN cropped digits: MATLAB level-5 .mat files (``X`` [32, 32, 3, M], ``y`` [M, 1] with
  label 10 for the digit 0), read by the small reader below so that SVHN needs no scipy.
- .npz: ``images`` and ``labels`` (optionally ``test_images``/``test_labels``).
"""
from __future__ import annotations

import gzip
import pickle
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import DataError


@dataclass(frozen=True)
class ImageData:
    """One split: ``images`` [M, C, H, W] and ``labels`` [M] (int64)."""

    images: np.ndarray
    labels: np.ndarray

    def __post_init__(self) -> None:
        if self.images.ndim != 4 or self.labels.ndim != 1 or len(self.images) != len(self.labels):
            raise DataError(
                f"images {self.images.shape} and labels {self.labels.shape} do not form a dataset "
                "(expected images [M, C, H, W] and labels [M])"
            )

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, index: np.ndarray) -> "ImageData":
        return ImageData(self.images[index], self.labels[index])


# -- IDX (MNIST, Fashion-MNIST) ---------------------------------------------------------------
_IDX_TYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str | Path) -> np.ndarray:
    """An IDX file (raw, or gzip when the name ends in .gz) as a numpy array."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as handle:
            raw = handle.read()
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"cannot read IDX file {path}: {exc}") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_TYPES:
        raise DataError(f"{path} is not an IDX file (bad magic number)")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path}: truncated IDX header")
    shape = struct.unpack(f">{ndim}I", raw[4:header])
    dtype = np.dtype(_IDX_TYPES[raw[2]])
    expected = int(np.prod(shape)) * dtype.itemsize
    if len(raw) - header != expected:
        raise DataError(f"{path}: IDX header says {expected} data bytes, file has {len(raw) - header}")
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="))


def idx_split(images_path: Path, labels_path: Path) -> ImageData:
    images = read_idx(images_path)
    labels = read_idx(labels_path)
    if images.ndim != 3:
        raise DataError(f"{images_path}: expected images [M, H, W], got shape {images.shape}")
    return ImageData(images[:, None, :, :], labels.astype(np.int64).ravel())


# -- CIFAR python batches ----------------------------------------------------------------------
class _ArrayUnpickler(pickle.Unpickler):
    """Rebuilds dicts, lists, strings and numpy arrays only; anything else is refused."""

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("_codecs", "encode"),
    }

    def find_class(self, module: str, name: str):
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def read_cifar_batch(path: str | Path, label_key: bytes) -> ImageData:
    """One CIFAR python batch: ``data`` [M, 3072] uint8 (R, G, B planes) and the labels."""
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            batch = _ArrayUnpickler(handle, encoding="bytes").load()
    except (OSError, pickle.UnpicklingError, EOFError, ValueError, TypeError) as exc:
        raise DataError(f"cannot read CIFAR batch {path}: {exc}") from None
    if not isinstance(batch, dict) or b"data" not in batch or label_key not in batch:
        raise DataError(f"{path} is not a CIFAR batch (needs keys 'data' and {label_key.decode()!r})")
    data = np.asarray(batch[b"data"], dtype=np.uint8)
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise DataError(f"{path}: CIFAR data must be [M, 3072], got {data.shape}")
    labels = np.asarray(batch[label_key], dtype=np.int64)
    return ImageData(data.reshape(-1, 3, 32, 32), labels)


def concat(splits: list[ImageData]) -> ImageData:
    return ImageData(
        np.concatenate([s.images for s in splits]), np.concatenate([s.labels for s in splits])
    )


# -- MATLAB level-5 .mat (SVHN) -----------------------------------------------------------------
_MI_TYPES = {1: "i1", 2: "u1", 3: "i2", 4: "u2", 5: "i4", 6: "u4", 7: "f4", 9: "f8", 12: "i8", 13: "u8"}
_MI_MATRIX, _MI_COMPRESSED = 14, 15
_NUMERIC_CLASSES = {6, 7, 8, 9, 10, 11, 12, 13, 14, 15}  # double, single, int8..uint64


def _elements(buffer: bytes, order: str):
    """Yield (type, payload) of the data elements in ``buffer`` (small-element form included)."""
    pos = 0
    while pos + 8 <= len(buffer):
        first, second = struct.unpack(order + "II", buffer[pos : pos + 8])
        if first >> 16:  # small data element: size in the upper half, payload in the tag
            kind, size = first & 0xFFFF, first >> 16
            yield kind, buffer[pos + 4 : pos + 4 + size]
            pos += 8
            continue
        kind, size = first, second
        payload = buffer[pos + 8 : pos + 8 + size]
        if len(payload) < size:
            raise DataError("truncated .mat data element")
        yield kind, payload
        pos += 8 + (size if kind == _MI_COMPRESSED else (size + 7) // 8 * 8)


def _matrix(payload: bytes, order: str) -> tuple[str, np.ndarray] | None:
    """(name, array) of a numeric miMATRIX element; None for other classes (cells, structs)."""
    parts = list(_elements(payload, order))
    if len(parts) < 4:
        return None
    flags = np.frombuffer(parts[0][1], dtype=order + "u4")
    mx_class = int(flags[0]) & 0xFF
    if mx_class not in _NUMERIC_CLASSES or (int(flags[0]) >> 11) & 1:  # bit 11: complex
        return None
    dims = tuple(int(v) for v in np.frombuffer(parts[1][1], dtype=order + "i4"))
    name = parts[2][1].decode("ascii", errors="replace")
    kind, data = parts[3]
    if kind not in _MI_TYPES:
        return None
    values = np.frombuffer(data, dtype=order + _MI_TYPES[kind])
    if values.size != int(np.prod(dims)):
        raise DataError(f".mat variable {name!r}: {values.size} values for dimensions {dims}")
    return name, values.reshape(dims, order="F")


def read_mat(path: str | Path) -> dict[str, np.ndarray]:
    """Numeric variables of a MATLAB level-5 .mat file (compressed or not) as numpy arrays."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc}") from None
    if len(raw) < 128 or raw[126:128] not in (b"IM", b"MI"):
        hint = " (MATLAB v7.3/HDF5 files are not supported)" if raw[:8] == b"\x89HDF\r\n\x1a\n" else ""
        raise DataError(f"{path} is not a MATLAB level-5 .mat file{hint}")
    order = "<" if raw[126:128] == b"IM" else ">"
    variables: dict[str, np.ndarray] = {}
    try:
        for kind, payload in _elements(raw[128:], order):
            if kind == _MI_COMPRESSED:
                inner = list(_elements(zlib.decompress(payload), order))
                kind, payload = inner[0] if inner else (0, b"")
            if kind == _MI_MATRIX:
                found = _matrix(payload, order)
                if found is not None:
                    variables[found[0]] = found[1]
    except (zlib.error, struct.error, ValueError) as exc:
        raise DataError(f"{path}: corrupt .mat file ({exc})") from None
    return variables


def svhn_split(path: Path) -> ImageData:
    """SVHN cropped digits: ``X`` [32, 32, 3, M] and ``y`` [M, 1] with 10 standing for 0."""
    variables = read_mat(path)
    if "X" not in variables or "y" not in variables:
        raise DataError(f"{path}: expected variables 'X' and 'y' (SVHN format)")
    images = np.ascontiguousarray(np.transpose(variables["X"], (3, 2, 0, 1))).astype(np.uint8)
    labels = variables["y"].astype(np.int64).ravel() % 10
    return ImageData(images, labels)


# -- .npz ------------------------------------------------------------------------------------------
def as_nchw(images: np.ndarray, source: str) -> np.ndarray:
    """Images given as [M, H, W], [M, H, W, C] or [M, C, H, W] in the NCHW layout."""
    if images.ndim == 3:
        return images[:, None, :, :]
    if images.ndim == 4:
        if images.shape[1] in (1, 3, 4) and images.shape[3] not in (1, 3, 4):
            return images
        if images.shape[3] in (1, 3, 4):
            return np.ascontiguousarray(np.transpose(images, (0, 3, 1, 2)))
    raise DataError(f"{source}: images must be [M, H, W], [M, H, W, C] or [M, C, H, W], got {images.shape}")


def _npz_split(archive, images_key: str, labels_key: str, source: str) -> ImageData:
    images = as_nchw(np.asarray(archive[images_key]), source)
    labels = np.asarray(archive[labels_key])
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise DataError(f"{source}: {labels_key!r} must be a 1-D integer array, got {labels.dtype} {labels.shape}")
    return ImageData(images, labels.astype(np.int64))


def read_npz(path: str | Path) -> tuple[ImageData, ImageData | None]:
    """(train, test or None) from an .npz holding ``images``, ``labels`` [, ``test_images``, ``test_labels``]."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as archive:
            keys = set(archive.files)
            if not {"images", "labels"} <= keys:
                raise DataError(f"{path}: an .npz dataset needs arrays 'images' and 'labels' (has {sorted(keys)})")
            train = _npz_split(archive, "images", "labels", str(path))
            test = None
            if {"test_images", "test_labels"} <= keys:
                test = _npz_split(archive, "test_images", "test_labels", str(path))
    except (OSError, ValueError, zlib.error) as exc:
        raise DataError(f"cannot read {path}: {exc}") from None
    return train, test


"""Readers for the standard on-disk formats of image-classification datasets.

Every reader returns :class:`ImageData`: images as a numpy array ``[M, C, H, W]`` (uint8 for
the standard datasets, kept as stored for an .npz) and integer labels ``[M]`` (int64). Nothing
here downloads anything; see download.py. Formats:

- IDX (MNIST, Fashion-MNIST): big-endian header, raw or gzip-compressed.
- CIFAR-10 / CIFAR-100 "python version": pickled dicts, read with an unpickler that only
  rebuilds numpy arrays (a pickle can otherwise run arbitrary code).
- SVHN cropped digits: MATLAB level-5 .mat files (``X`` [32, 32, 3, M], ``y`` [M, 1] with
  label 10 for the digit 0), read by the small reader below so that SVHN needs no scipy.
- .npz: ``images`` and ``labels`` (optionally ``test_images``/``test_labels``, and the class
  count as ``num_classes`` or ``classes``).

Every file is untrusted: sizes read from headers (IDX dimensions, .npy headers inside an .npz,
.mat element tags, a pickle's contents) are checked against the bytes really stored and against
the memory available (focusfl.limits) before anything is allocated, decompression stops at the
size the header declared, and bad data (non-finite pixels, negative labels) is refused in one
line when an :class:`ImageData` is built.
"""
from __future__ import annotations

import gzip
import math
import pickle
import pickletools
import struct
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import DataError
from ..limits import check_allocation, inflate, read_into, read_npy_data, read_npy_header


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
        check_pixels(self.images)
        check_labels(self.labels)

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, index: np.ndarray) -> "ImageData":
        return ImageData(self.images[index], self.labels[index])


def check_pixels(images: np.ndarray, chunk: int = 4096) -> None:
    """Images must be numbers, and finite: a NaN pixel would only show up later as a
    "diverged" run, far from its cause."""
    if images.dtype.kind not in "biuf":
        raise DataError(f"images must hold integer or real pixel values, got dtype {images.dtype}")
    if images.dtype.kind != "f":
        return
    bad = 0
    for start in range(0, len(images), chunk):  # a bool copy of one chunk at a time
        bad += int(np.count_nonzero(~np.isfinite(images[start : start + chunk])))
    if bad:
        raise DataError(f"{bad:,} non-finite pixel values (NaN or inf) in images")


def check_labels(labels: np.ndarray) -> None:
    """Labels must be integers >= 0 (their upper bound is the dataset's; see Dataset)."""
    if labels.dtype.kind not in "iu":
        raise DataError(f"labels must be integers, got dtype {labels.dtype}")
    if labels.size and labels.min() < 0:
        raise DataError(f"labels must be >= 0, found {int(labels.min())}")


# -- IDX (MNIST, Fashion-MNIST) ---------------------------------------------------------------
_IDX_TYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str | Path) -> np.ndarray:
    """An IDX file (raw, or gzip when the name ends in .gz) as a numpy array.

    The dimensions in the header are checked against the file's size (raw files) and against
    the memory available before the array is allocated; a gzip stream is read no further than
    the header's size (plus one byte, to tell that it holds more).
    """
    path = Path(path)
    compressed = path.suffix == ".gz"
    opener = gzip.open if compressed else open
    try:
        with opener(path, "rb") as handle:
            magic = handle.read(4)
            if len(magic) < 4 or magic[0] != 0 or magic[1] != 0 or magic[2] not in _IDX_TYPES:
                raise DataError(f"{path} is not an IDX file (bad magic number)")
            ndim = magic[3]
            dims = handle.read(4 * ndim)
            if len(dims) < 4 * ndim:
                raise DataError(f"{path}: truncated IDX header")
            shape = struct.unpack(f">{ndim}I", dims)
            dtype = np.dtype(_IDX_TYPES[magic[2]])
            expected = math.prod(shape) * dtype.itemsize  # Python integers: no overflow
            if not compressed:
                stored = path.stat().st_size - 4 - 4 * ndim
                if stored != expected:
                    raise DataError(f"{path}: IDX header (shape {shape}) says {expected:,} data bytes, file has {stored:,}")
            check_allocation(expected, f"IDX file {path} (shape {shape})")
            flat = read_into(handle, np.empty(math.prod(shape), dtype=dtype), f"IDX file {path}")
            if handle.read(1):
                raise DataError(f"{path}: IDX header (shape {shape}) says {expected:,} data bytes, file has more")
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"cannot read IDX file {path}: {_first_line(exc)}") from None
    return flat.reshape(shape).astype(dtype.newbyteorder("="), copy=False)


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


# A CIFAR-100 training pickle has about 500,000 opcodes; scanning 10 million takes seconds.
MAX_PICKLE_OPCODES = 10_000_000


def pickle_footprint(handle) -> int:
    """Bytes that unpickling the stream ``handle`` may take, from a scan of its opcodes.

    A pickle's memory is not bounded by its size: one-byte opcodes such as EMPTY_LIST build
    objects of dozens of bytes. Counted: every opcode as a 100-byte object, and every bytes or
    string argument three times (the string, its encoding, the array made from it).
    """
    total = opcodes = 0
    for _, argument, _ in pickletools.genops(handle):
        opcodes += 1
        if opcodes > MAX_PICKLE_OPCODES:
            raise DataError(f"the pickle has more than {MAX_PICKLE_OPCODES:,} opcodes, far more than a dataset batch")
        total += 100 + (3 * len(argument) if isinstance(argument, (bytes, str)) else 0)
    return total


def read_cifar_batch(path: str | Path, label_key: bytes) -> ImageData:
    """One CIFAR python batch: ``data`` [M, 3072] uint8 (R, G, B planes) and the labels."""
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            check_allocation(pickle_footprint(handle), "unpickling it")
            handle.seek(0)
            batch = _ArrayUnpickler(handle, encoding="bytes").load()
    except DataError as exc:
        raise DataError(f"cannot read CIFAR batch {path}: {exc}") from None
    except (OSError, pickle.UnpicklingError, EOFError, ValueError, TypeError, MemoryError) as exc:
        raise DataError(f"cannot read CIFAR batch {path}: {_first_line(exc)}") from None
    if not isinstance(batch, dict) or b"data" not in batch or label_key not in batch:
        raise DataError(f"{path} is not a CIFAR batch (needs keys 'data' and {label_key.decode()!r})")
    try:
        data = np.asarray(batch[b"data"], dtype=np.uint8)
        labels = np.asarray(batch[label_key], dtype=np.int64)
    except (ValueError, TypeError, OverflowError) as exc:
        raise DataError(f"{path}: CIFAR data and labels must be arrays of integers ({_first_line(exc)})") from None
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise DataError(f"{path}: CIFAR data must be [M, 3072], got {data.shape}")
    try:
        return ImageData(data.reshape(-1, 3, 32, 32), labels)
    except DataError as exc:
        raise DataError(f"{path}: {exc}") from None


def concat(splits: list[ImageData]) -> ImageData:
    return ImageData(
        np.concatenate([s.images for s in splits]), np.concatenate([s.labels for s in splits])
    )


# -- MATLAB level-5 .mat (SVHN) -----------------------------------------------------------------
_MI_TYPES = {1: "i1", 2: "u1", 3: "i2", 4: "u2", 5: "i4", 6: "u4", 7: "f4", 9: "f8", 12: "i8", 13: "u8"}
_MI_MATRIX, _MI_COMPRESSED = 14, 15
_NUMERIC_CLASSES = {6, 7, 8, 9, 10, 11, 12, 13, 14, 15}  # double, single, int8..uint64


def _elements(buffer: bytes | memoryview, order: str):
    """Yield (type, payload) of the data elements in ``buffer`` (small-element form included).

    Payloads are memoryviews into ``buffer``: a 200 MB SVHN file is not copied element by element.
    """
    buffer = memoryview(buffer)
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
    name = bytes(parts[2][1]).decode("ascii", errors="replace")
    kind, data = parts[3]
    if kind not in _MI_TYPES:
        return None
    values = np.frombuffer(data, dtype=order + _MI_TYPES[kind])
    if values.size != math.prod(dims):
        raise DataError(f".mat variable {name!r}: {values.size} values for dimensions {dims}")
    return name, values.reshape(dims, order="F")


def _inflate_element(compressed: memoryview, order: str, path: Path) -> tuple[int, memoryview]:
    """(type, payload) of the element inside an miCOMPRESSED one.

    The inner element's tag (its first 8 bytes) declares its size; that size is checked
    against the memory available and the stream is inflated no further (a zlib bomb stops there).
    """
    try:
        head = zlib.decompressobj().decompress(compressed, 8)
    except zlib.error as exc:
        raise DataError(f"{path}: corrupt compressed .mat element ({exc})") from None
    if len(head) < 8:
        return 0, memoryview(b"")
    first, size = struct.unpack(order + "II", head)
    if first >> 16:  # small data element
        return first & 0xFFFF, memoryview(head[4 : 4 + (first >> 16)])
    declared = 8 + (size + 7) // 8 * 8  # the element, padded to 8 bytes
    check_allocation(declared, f"{path}: a compressed .mat element declaring {size:,} bytes")
    inner = inflate(compressed, declared, f"{path}: compressed .mat element")
    if len(inner) < 8 + size:
        raise DataError(f"{path}: compressed .mat element holds {len(inner) - 8:,} bytes, its tag declares {size:,}")
    return first, memoryview(inner)[8 : 8 + size]


def read_mat(path: str | Path) -> dict[str, np.ndarray]:
    """Numeric variables of a MATLAB level-5 .mat file (compressed or not) as numpy arrays."""
    path = Path(path)
    try:
        check_allocation(path.stat().st_size, f".mat file {path}")
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
                kind, payload = _inflate_element(payload, order, path)
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
    if variables["X"].ndim != 4:
        raise DataError(f"{path}: 'X' must be images [H, W, C, M], got shape {variables['X'].shape}")
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


def _npz_split(arrays: dict[str, np.ndarray], images_key: str, labels_key: str, source: str) -> ImageData:
    images = as_nchw(arrays[images_key], source)
    labels = arrays[labels_key]
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise DataError(f"{source}: {labels_key!r} must be a 1-D integer array, got {labels.dtype} {labels.shape}")
    try:
        return ImageData(images, labels.astype(np.int64))
    except DataError as exc:
        split = "" if images_key == "images" else " (test split)"
        raise DataError(f"{source}{split}: {exc}") from None


def read_npz_dataset(path: str | Path) -> tuple[ImageData, ImageData | None, int | None]:
    """(train, test or None, the class count the file declares or None) from an .npz.

    Read without ``np.load``: each member's .npy header is checked against the member's
    uncompressed size and against the memory available before its array is allocated, and no
    more bytes are decompressed than the header declares; object arrays are refused. A damaged
    archive (truncated, corrupt, encrypted) is a one-line DataError.
    """
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as archive:
            members = {i.filename[: -len(".npy")]: i for i in archive.infolist() if i.filename.endswith(".npy")}
            if not {"images", "labels"} <= set(members):
                raise DataError(f"{path}: an .npz dataset needs arrays 'images' and 'labels' (has {sorted(members)})")
            arrays = {}
            for name in ("labels", "test_labels", "num_classes", "classes", "images", "test_images"):
                if name in members:
                    with archive.open(members[name]) as member:
                        what = f"{path}: array {name!r}"
                        header = read_npy_header(member, members[name].file_size, what)
                        arrays[name] = read_npy_data(member, header, what)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, zlib.error, NotImplementedError,
            RuntimeError, ValueError) as exc:
        raise DataError(f"cannot read {path} as an .npz archive ({_first_line(exc)})") from None
    train = _npz_split(arrays, "images", "labels", str(path))
    test = None
    if {"test_images", "test_labels"} <= set(arrays):
        test = _npz_split(arrays, "test_images", "test_labels", str(path))
    declared = None
    for key in ("num_classes", "classes"):
        if key in arrays:
            value = arrays[key]
            if value.size != 1 or value.dtype.kind not in "iu":
                raise DataError(f"{path}: {key!r} must be one integer (the number of classes), got {value.dtype} {value.shape}")
            declared = int(value.reshape(-1)[0])
            break
    return train, test, declared


def read_npz(path: str | Path) -> tuple[ImageData, ImageData | None]:
    """(train, test or None) from an .npz holding ``images``, ``labels`` [, ``test_images``, ``test_labels``]."""
    train, test, _ = read_npz_dataset(path)
    return train, test


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

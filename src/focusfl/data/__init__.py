"""Image datasets from their standard files, partitions among clients, histogram plots.

``load_dataset(name_or_path, data_dir, download_missing)`` returns a :class:`Dataset` (train split,
test split when the dataset has one, number of classes). Names: mnist, fashion-mnist, cifar10,
cifar100, svhn; anything ending in .npz is read as a file. Files are looked for in
``data_dir`` (default: $FOCUSFL_DATA, else ~/.cache/focusfl), in the dataset's own subfolder,
in torchvision's layout, or directly; a missing dataset says which files to put where.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import ConfigError, DataError
from .download import SOURCES, download_dataset, extract_tar
from .loaders import ImageData, concat, idx_split, read_cifar_batch, read_npz_dataset, svhn_split
from .partition import PARTITIONERS, label_histograms, make_partition


@dataclass(frozen=True)
class Dataset:
    """Train and test splits with their number of classes, checked to fit together: at least
    two classes, training labels in 0..num_classes-1 with at least two of them present, and
    test labels among the training classes."""

    name: str
    train: ImageData
    test: ImageData | None
    num_classes: int
    files: tuple[Path, ...] = ()  # the files it was read from (a run records their digest)

    def __post_init__(self) -> None:
        check_classes(self.name, self.train, self.test, self.num_classes)


def check_classes(name: str, train: ImageData, test: ImageData | None, num_classes: int) -> None:
    """DataError unless the labels fit ``num_classes`` (see :class:`Dataset`).

    A stray label would otherwise silently widen the model (label 1000 among digits: 1001
    outputs), and one class trains to a meaningless accuracy of 1.0.
    """
    where = f"dataset {name!r}"
    if not isinstance(num_classes, (int, np.integer)) or num_classes < 2:
        raise DataError(f"{where} has {num_classes} class(es); classification needs at least two")
    if len(train) and int(train.labels.max()) >= num_classes:
        raise DataError(f"{where}: label {int(train.labels.max())} is outside its {num_classes} classes 0..{num_classes - 1}")
    _check_two_present(where, np.flatnonzero(np.bincount(train.labels, minlength=num_classes)))
    if test is not None and len(test) and int(test.labels.max()) >= num_classes:
        raise DataError(
            f"{where}: test label {int(test.labels.max())} is not among the training classes 0..{num_classes - 1}"
        )


def _check_two_present(where: str, present: np.ndarray) -> None:
    if present.size < 2:
        only = f" (every image has label {int(present[0])})" if present.size else ""
        raise DataError(f"{where}: the training images hold {present.size} class{only}; classification needs at least two")


def infer_classes(labels: np.ndarray, source: str,
                  declare: str = "store the class count as 'num_classes' in the .npz") -> int:
    """The class count of labels that must be exactly 0..K-1, all present.

    A gap means a stray label (1000 among digits) or classes absent from the file; either way
    the class count cannot be read off the labels, and the file must declare it.
    """
    present = np.unique(labels)
    _check_two_present(source, present)
    gaps = np.flatnonzero(present != np.arange(present.size))
    if gaps.size:
        first = int(gaps[0])
        raise DataError(
            f"{source}: label {int(present[first])} leaves a gap (no sample has label {first}); labels must be "
            f"the classes 0..K-1, or {declare}"
        )
    return int(present.size)


def default_data_dir() -> Path:
    """$FOCUSFL_DATA, else ~/.cache/focusfl."""
    env = os.environ.get("FOCUSFL_DATA")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "focusfl"


# -- one loader per dataset: (folder candidates, file names) -> Dataset -------------------------
_IDX_NAMES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def _find(folders: list[Path], name: str, compressed_ok: bool = False) -> Path | None:
    for folder in folders:
        for candidate in (name, name + ".gz") if compressed_ok else (name,):
            if (folder / candidate).is_file():
                return folder / candidate
    return None


def _load_idx(name: str, folders: list[Path]) -> Dataset:
    paths = [_find(folders, n, compressed_ok=True) for n in _IDX_NAMES]
    if any(p is None for p in paths):
        raise _missing(name, folders[0], [n + ".gz" for n in _IDX_NAMES], "raw or .gz")
    return Dataset(name, idx_split(paths[0], paths[1]), idx_split(paths[2], paths[3]), 10, tuple(paths))


def _cifar_folder(folders: list[Path], base: str, archive: str) -> Path | None:
    for folder in folders:
        if (folder / base).is_dir():
            return folder / base
    for folder in folders:
        if (folder / archive).is_file():  # unpack a user-provided archive once
            extract_tar(folder / archive, folder)
            if (folder / base).is_dir():
                return folder / base
    return None


def _load_cifar10(name: str, folders: list[Path]) -> Dataset:
    files = [f"data_batch_{k}" for k in range(1, 6)] + ["test_batch"]
    folder = _cifar_folder(folders, "cifar-10-batches-py", "cifar-10-python.tar.gz")
    if folder is None or any(not (folder / f).is_file() for f in files):
        raise _missing(name, folders[0], ["cifar-10-python.tar.gz"], "or its unpacked folder cifar-10-batches-py/")
    train = concat([read_cifar_batch(folder / f, b"labels") for f in files[:5]])
    return Dataset(name, train, read_cifar_batch(folder / "test_batch", b"labels"), 10,
                   tuple(folder / f for f in files))


def _load_cifar100(name: str, folders: list[Path]) -> Dataset:
    folder = _cifar_folder(folders, "cifar-100-python", "cifar-100-python.tar.gz")
    if folder is None or any(not (folder / f).is_file() for f in ("train", "test")):
        raise _missing(name, folders[0], ["cifar-100-python.tar.gz"], "or its unpacked folder cifar-100-python/")
    train = read_cifar_batch(folder / "train", b"fine_labels")
    return Dataset(name, train, read_cifar_batch(folder / "test", b"fine_labels"), 100,
                   (folder / "train", folder / "test"))


def _load_svhn(name: str, folders: list[Path]) -> Dataset:
    paths = [_find(folders, n) for n in ("train_32x32.mat", "test_32x32.mat")]
    if any(p is None for p in paths):
        raise _missing(name, folders[0], ["train_32x32.mat", "test_32x32.mat"], "cropped digits")
    return Dataset(name, svhn_split(paths[0]), svhn_split(paths[1]), 10, tuple(paths))


@dataclass(frozen=True)
class DatasetInfo:
    loader: Callable[[str, list[Path]], Dataset]
    subfolder: str  # where focusfl keeps it under data_dir (and downloads it to)
    torchvision: str  # torchvision's folder for the same files, also searched


DATASETS: dict[str, DatasetInfo] = {
    "mnist": DatasetInfo(_load_idx, "mnist", "MNIST/raw"),
    "fashion-mnist": DatasetInfo(_load_idx, "fashion-mnist", "FashionMNIST/raw"),
    "cifar10": DatasetInfo(_load_cifar10, "cifar10", "."),
    "cifar100": DatasetInfo(_load_cifar100, "cifar100", "."),
    "svhn": DatasetInfo(_load_svhn, "svhn", "."),
}


def _missing(name: str, folder: Path, files: list[str], note: str) -> DataError:
    return DataError(
        f"{name} not found: put {', '.join(files)} ({note}) in {folder}, "
        f"or pass --data-dir FOLDER, or --download to fetch it"
    )


def load_dataset(data: str, data_dir: str | Path | None = None, download_missing: bool = False) -> Dataset:
    """The named dataset (or an .npz file) with its train and test splits."""
    if str(data).endswith(".npz"):
        return _load_npz(Path(data).expanduser(), data_dir)
    if data not in DATASETS:
        known = ", ".join(DATASETS)
        raise ConfigError(f"unknown dataset {data!r} (known: {known}, or a path to an .npz file)")
    info = DATASETS[data]
    root = Path(data_dir).expanduser() if data_dir else default_data_dir()
    home = root / info.subfolder
    folders = [home, root / info.torchvision, root]
    if download_missing:
        try:
            return info.loader(data, folders)
        except DataError:
            download_dataset(data, home)
    return info.loader(data, folders)


def _load_npz(path: Path, data_dir: str | Path | None) -> Dataset:
    if not path.is_absolute() and not path.is_file() and data_dir:
        path = Path(data_dir).expanduser() / path
    if not path.is_file():
        raise DataError(f"dataset file {path} not found")
    train, test, declared = read_npz_dataset(path)
    if declared is None:
        declared = infer_classes(train.labels, str(path))
    elif len(train) and declared > len(train):
        raise DataError(f"{path}: num_classes={declared} is more than its {len(train)} training images")
    return Dataset(path.stem, train, test, declared, (path,))


__all__ = [
    "DATASETS",
    "Dataset",
    "ImageData",
    "check_classes",
    "infer_classes",
    "PARTITIONERS",
    "SOURCES",
    "default_data_dir",
    "label_histograms",
    "load_dataset",
    "make_partition",
]

"""Hugging Face datasets as a data source: a ``save_to_disk`` folder, a folder of parquet files
named by split (the Hub's layout), or one parquet/csv/json file.

``load_hf(path, input, label, ...)`` reads one dataset and returns :class:`HFSplits`: the
training and test rows of the named input and label columns, as

- ``kind="image"``: images ``[M, C, H, W]`` (an ``Image`` feature or nested numeric lists);
- ``kind="tokens"``: token ids with their attention masks packed ``[M, 2, L]`` (row 0 the ids,
  row 1 the mask, 1 on a token and 0 on padding), from a text column run through a tokenizer
  read from a local folder, or from a pre-tokenized column of integer lists (``input_ids``);
  L is the longest sequence (after truncation to ``max_length``);

and, when asked, the values of a natural-id column (a writer, a speaker) of the training rows.

What is read never runs code: folders through ``datasets.load_from_disk`` (Arrow files and
JSON metadata), files through pyarrow's readers, tokenizers with ``local_files_only=True`` and
``trust_remote_code=False`` (a tokenizer folder that names its own Python class is refused). The
files' total size is checked against the memory available before anything is read
(focusfl.limits), and so is every array built from them.

The test split is the dataset's split named ``test_split`` (``test`` unless told) when it has
one; otherwise a seeded random ``test_fraction`` of the training rows (the rule of the image
datasets, ``held_out_rows``). The packages are imported only here, only when used; without them
the one-line error names the extra to install.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, DataError
from ..limits import check_allocation
from .loaders import as_nchw, check_labels, check_pixels

INSTALL_HINT = 'pip install ".[hf]" in a clone of focusfl (or "focusfl[hf]" from a package index)'
FILE_READERS = {".parquet": "parquet", ".csv": "csv", ".json": "json", ".jsonl": "json"}
AUTO_INPUTS = ("input_ids", "image", "img", "text", "sentence")


def require(module: str, purpose: str):
    """``import module``, or a one-line ConfigError naming the extra that provides it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(f"{purpose} needs the Hugging Face packages ({module} is missing): {INSTALL_HINT}") from None


@dataclass(frozen=True)
class HFSplits:
    """Rows of one dataset, as model inputs: ``train_inputs`` [M, ...] and ``train_labels`` [M]
    (int64), the same for the test split, the class count, the input kind (image or tokens),
    the vocabulary size the token ids need (tokens only: the tokenizer's length, or the
    largest id + 1), and ``train_ids``: the natural-id column of the training rows (or None)."""

    name: str
    kind: str
    train_inputs: np.ndarray
    train_labels: np.ndarray
    test_inputs: np.ndarray
    test_labels: np.ndarray
    num_classes: int
    vocabulary: int = 0
    train_ids: np.ndarray | None = None


def dataset_bytes(path: Path) -> int:
    """Bytes of a file, or of every file under a folder (symbolic links not followed)."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def check_dataset_size(path: Path) -> None:
    """DataError before reading when the dataset's files are larger than the memory available:
    the columns focusfl keeps are built from them in memory."""
    check_allocation(dataset_bytes(path), f"reading dataset {path}")


def _quiet_datasets(datasets) -> None:
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()


def read_tables(path: Path, test_split: str) -> tuple[Any, Any | None]:
    """(train, test or None) as ``datasets.Dataset`` objects, from a folder or a file."""
    if not path.exists():
        raise DataError(f"dataset {path} not found (a save_to_disk folder, or a .parquet/.csv/.json/.jsonl file)")
    check_dataset_size(path)
    datasets = require("datasets", "data=hf:PATH")
    _quiet_datasets(datasets)
    if path.is_dir() and parquet_splits(path):
        return _split_tables(datasets, path, test_split)
    if path.is_dir():
        try:
            loaded = datasets.load_from_disk(str(path))
        except (FileNotFoundError, ValueError, OSError) as exc:
            raise DataError(f"cannot read dataset folder {path} (saved with save_to_disk?): {_first_line(exc)}") from None
        if isinstance(loaded, datasets.DatasetDict):
            if "train" not in loaded:
                raise DataError(f"dataset {path} has splits {', '.join(loaded)}, none named train")
            return loaded["train"], loaded[test_split] if test_split in loaded else None
        return loaded, None
    reader = FILE_READERS.get(path.suffix.lower())
    if reader is None:
        raise DataError(f"dataset file {path}: expected .parquet, .csv, .json or .jsonl (or a save_to_disk folder)")
    return datasets.Dataset(_arrow_table(path, reader)), None


def parquet_splits(folder: Path) -> dict[str, list[Path]]:
    """A folder of parquet files named by split, as the Hub stores datasets
    (``train-00000-of-00001.parquet``, ``validation-....parquet``): split -> its files in name
    order; empty when the folder is a ``save_to_disk`` folder or holds no parquet file."""
    if (folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file():
        return {}
    splits: dict[str, list[Path]] = {}
    for file in sorted(folder.glob("*.parquet")):
        splits.setdefault(file.name.split("-")[0].split(".")[0], []).append(file)
    return splits


def _split_tables(datasets, folder: Path, test_split: str):
    """(train, test or None) from a folder of parquet files named by split (shards concatenated)."""
    import pyarrow

    splits = parquet_splits(folder)
    if "train" not in splits:
        raise DataError(f"dataset {folder} has parquet files of splits {', '.join(splits)}, none named train")

    def table(split: str):
        parts = [_arrow_table(file, "parquet") for file in splits[split]]
        try:
            return datasets.Dataset(pyarrow.concat_tables(parts))
        except pyarrow.ArrowInvalid as exc:
            raise DataError(f"dataset {folder}: the {split} files differ in columns ({_first_line(exc)})") from None

    return table("train"), table(test_split) if test_split in splits else None


def _arrow_table(path: Path, reader: str):
    """A file read by pyarrow (no cache written; Hugging Face feature metadata kept)."""
    import pyarrow

    try:
        if reader == "parquet":
            import pyarrow.parquet as pq

            return pq.read_table(path)
        if reader == "csv":
            import pyarrow.csv as pcsv

            return pcsv.read_csv(path)
        import pyarrow.json as pjson

        return pjson.read_json(path)  # JSON Lines: one object per line
    except (pyarrow.ArrowException, OSError, ValueError) as exc:
        raise DataError(f"cannot read {reader} file {path}: {_first_line(exc)}") from None


def pick_input(columns: list[str], wanted: str, path: Path) -> str:
    if wanted != "auto":
        return wanted
    for name in AUTO_INPUTS:
        if name in columns:
            return name
    raise DataError(f"dataset {path}: name its input column with input=COLUMN (columns: {', '.join(columns)})")


def check_columns(table, needed: list[str], path: Path, split: str) -> None:
    missing = [c for c in needed if c not in table.column_names]
    if missing:
        raise DataError(
            f"dataset {path} ({split}) has no column {missing[0]!r} (columns: {', '.join(table.column_names)})"
        )


def labels_of(table, column: str, where: str) -> np.ndarray:
    """The label column as int64 (integers or a ClassLabel; anything else refused)."""
    values = np.asarray(table[column])  # through the dataset's row order (an index mapping too)
    if values.dtype.kind not in "iu":
        raise DataError(f"{where}: label column {column!r} must hold integers, got {values.dtype}")
    labels = values.astype(np.int64)
    try:
        check_labels(labels)
    except DataError as exc:  # -1 marks an unlabelled split (GLUE's test splits)
        raise DataError(f"{where}: label column {column!r}: {exc} (an unlabelled split? see test_split)") from None
    return labels


def declared_classes(table, column: str) -> int | None:
    """The class count of a ClassLabel feature, else None."""
    feature = table.features.get(column)
    return int(feature.num_classes) if getattr(feature, "num_classes", None) else None


# -- inputs -------------------------------------------------------------------------------------------
def image_column(table, column: str, where: str) -> np.ndarray:
    """Images [M, C, H, W] from an Image feature (decoded with Pillow) or numeric arrays."""
    rows = len(table)
    if rows == 0:
        raise DataError(f"{where} has no rows")
    first = np.asarray(table[0][column])
    check_allocation(rows * first.nbytes, f"{where}: {rows:,} images of shape {first.shape}")
    try:
        images = np.stack([np.asarray(item) for item in table[column]])
    except ValueError as exc:
        raise DataError(f"{where}: images of column {column!r} differ in shape ({_first_line(exc)})") from None
    images = as_nchw(images, where)
    check_pixels(images)
    return images


def token_column(table, column: str, where: str) -> list[list[int]]:
    """Pre-tokenized rows: lists of integer token ids."""
    sequences = table[column]
    if not sequences or not isinstance(sequences[0], (list, tuple)) or (sequences[0] and not isinstance(sequences[0][0], int)):
        raise DataError(f"{where}: column {column!r} must hold lists of token ids (or give tokenizer=FOLDER for text)")
    return sequences


def load_tokenizer(folder: str):
    """A tokenizer from a local folder: files only, no code of its own, nothing downloaded."""
    path = Path(folder).expanduser()
    if not path.is_dir():
        raise DataError(f"tokenizer folder {path} not found")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    transformers = require("transformers", "tokenizer=FOLDER")
    transformers.logging.set_verbosity_error()
    try:
        return transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataError(f"cannot load a tokenizer from {path}: {_first_line(exc)}") from None


def tokenize(tokenizer, texts: list, max_length: int, where: str) -> list[list[int]]:
    if not texts or not all(isinstance(t, str) for t in texts[:100]):
        raise DataError(f"{where}: the text column must hold strings")
    return tokenizer(list(texts), truncation=True, max_length=max_length, padding=False)["input_ids"]


def pack_tokens(sequences: list[list[int]], length: int, where: str) -> np.ndarray:
    """[M, 2, length] int64: the ids (0 on padding) and the attention mask, sequences cut at ``length``."""
    check_allocation(len(sequences) * 2 * length * 8, f"{where}: {len(sequences):,} sequences of {length} tokens")
    packed = np.zeros((len(sequences), 2, length), dtype=np.int64)
    for row, ids in enumerate(sequences):
        ids = ids[:length]
        packed[row, 0, : len(ids)] = ids
        packed[row, 1, : len(ids)] = 1
    if packed.size and (packed[:, 0] < 0).any():
        raise DataError(f"{where}: negative token id {int(packed[:, 0].min())}")
    if (packed[:, 1, 0] == 0).any():
        raise DataError(f"{where}: row {int(np.argmin(packed[:, 1, 0]))} has no token")
    return packed


# -- the whole source ---------------------------------------------------------------------------------
def held_out_rows(count: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(training rows, test rows): a seeded random ``fraction`` held out (the image datasets' rule)."""
    order = np.random.default_rng(np.random.SeedSequence([seed, 13])).permutation(count)
    held = int(round(fraction * count))
    if held < 1 or held >= count:
        raise ConfigError(f"test_fraction={fraction} leaves no test or no training rows")
    return np.sort(order[held:]), np.sort(order[:held])


def load_hf(
    data: str, *, input: str, label: str, tokenizer: str, max_length: int, test_split: str,
    test_fraction: float, seed: int, id_column: str = "",
) -> HFSplits:
    """The dataset ``data`` (``hf:PATH``) as model inputs; see the module docstring."""
    path = Path(data[3:]).expanduser()
    train, test = read_tables(path, test_split)
    column = pick_input(train.column_names, input, path)
    needed = [column, label] + ([id_column] if id_column else [])
    check_columns(train, needed, path, "train")
    if test is not None:
        check_columns(test, [column, label], path, test_split)
    elif not test_fraction > 0:
        raise ConfigError(f"dataset {path} has no split named {test_split!r}: hold rows out with test_fraction (e.g. 0.2)")
    if test is not None and test_fraction > 0:
        raise ConfigError(f"dataset {path} has a {test_split!r} split; test_fraction applies only to datasets without one")
    where = f"dataset {path}"
    train_labels = labels_of(train, label, where)
    test_labels = labels_of(test, label, f"{where} ({test_split})") if test is not None else None
    kind, train_inputs, test_inputs, vocabulary = _inputs(train, test, column, tokenizer, max_length, where)
    ids = _natural_ids(train, id_column, where) if id_column else None
    if test is None:
        keep, held = held_out_rows(len(train_labels), test_fraction, seed)
        test_inputs, test_labels = train_inputs[held], train_labels[held]
        train_inputs, train_labels = train_inputs[keep], train_labels[keep]
        ids = ids[keep] if ids is not None else None
    classes = declared_classes(train, label)
    return HFSplits(path.name, kind, train_inputs, train_labels, test_inputs, test_labels,
                    classes or 0, vocabulary, ids)


def _inputs(train, test, column: str, tokenizer: str, max_length: int, where: str):
    """(kind, train inputs, test inputs or None, vocabulary) of the input column."""
    feature = train.features.get(column)
    first = train[0][column] if len(train) else None
    if type(feature).__name__ == "Image" or (first is not None and not isinstance(first, (str, list, tuple))):
        return ("image", image_column(train, column, where),
                image_column(test, column, where + " (test)") if test is not None else None, 0)
    if isinstance(first, str):
        if not tokenizer:
            raise ConfigError(f"{where}: column {column!r} holds text; give tokenizer=FOLDER (a local tokenizer)")
        tok = load_tokenizer(tokenizer)
        train_seqs = tokenize(tok, train[column], max_length, where)
        test_seqs = tokenize(tok, test[column], max_length, where) if test is not None else []
        vocabulary = len(tok)
    elif isinstance(first, (list, tuple)) and first and isinstance(first[0], (list, tuple)):
        return ("image", image_column(train, column, where),
                image_column(test, column, where + " (test)") if test is not None else None, 0)
    else:
        train_seqs = [s[:max_length] for s in token_column(train, column, where)]
        test_seqs = [s[:max_length] for s in token_column(test, column, where)] if test is not None else []
        vocabulary = 1 + max((max(s) for s in train_seqs + test_seqs if s), default=0)
    length = max(len(s) for s in train_seqs + test_seqs)
    train_inputs = pack_tokens(train_seqs, length, where)
    test_inputs = pack_tokens(test_seqs, length, where + " (test)") if test is not None else None
    return "tokens", train_inputs, test_inputs, vocabulary


def _natural_ids(table, column: str, where: str) -> np.ndarray:
    values = np.asarray(table[column])
    if values.dtype.kind not in "iuU":
        raise DataError(f"{where}: id column {column!r} must hold integers or strings, got {values.dtype}")
    return values


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

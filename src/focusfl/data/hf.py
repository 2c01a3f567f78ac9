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

Every file is untrusted and read by focusfl itself with pyarrow, never by code it names:
a ``save_to_disk`` folder's JSON (``dataset_dict.json``, ``state.json``, ``dataset_info.json``)
is checked field by field, its Arrow streams are memory-mapped and validated in full, and a
column is checked for its type, for empty values (nulls) anywhere in it and for its range
before anything is built from it. Images of an ``Image`` feature are decoded from the bytes
stored in the dataset (a path to a file elsewhere is refused). Tokenizers are read with
``local_files_only=True`` and ``trust_remote_code=False`` from a folder that must hold a
tokenizer's files and name a class transformers has (a folder that names its own Python code
is refused). The files' total size is checked against the memory available before anything
is read (focusfl.limits), and so is every array built from them. A library error that still
escapes (pyarrow, Pillow, tokenizers, transformers) becomes one line naming the file.

The test split is the dataset's split named ``test_split`` (``test`` unless told) when it has
one; otherwise a seeded random ``test_fraction`` of the training rows (the rule of the image
datasets, ``held_out_rows``). The packages are imported only here, only when used; without them
the one-line error names the extra to install.
"""
from __future__ import annotations

import importlib
import io
import itertools
import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, DataError, FocusflError
from ..limits import check_allocation, human_bytes
from .loaders import as_nchw, check_labels, check_pixels

INSTALL_HINT = 'pip install ".[hf]" in a clone of focusfl (or "focusfl[hf]" from a package index)'
FILE_READERS = {".parquet": "parquet", ".csv": "csv", ".json": "json", ".jsonl": "json"}
AUTO_INPUTS = ("input_ids", "image", "img", "text", "sentence")
# Parsing JSON costs about this many bytes of memory per byte of text (dicts, lists, strings).
JSON_BYTES_PER_BYTE = 20
# Files a tokenizer folder holds (one at least): the fast tokenizer's JSON, WordPiece, BPE and
# SentencePiece vocabularies.
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model",
                   "tokenizer.model")


def require(module: str, purpose: str):
    """``import module``, or a one-line ConfigError naming the extra that provides it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(f"{purpose} needs the Hugging Face packages ({module} is missing): {INSTALL_HINT}") from None


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


def short(value: Any) -> str:
    """A value of an untrusted file, for a message: its repr, cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def library_errors(exc: BaseException) -> bool:
    """Whether ``exc`` is a library's error that focusfl turns into one line: any Exception
    but focusfl's own and MemoryError, and the PanicException that Rust libraries (tokenizers,
    safetensors) raise as a BaseException."""
    if isinstance(exc, (FocusflError, MemoryError)):
        return False
    return isinstance(exc, Exception) or type(exc).__name__ == "PanicException"


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


@dataclass(frozen=True)
class Split:
    """One split as read: its pyarrow table, the Hugging Face features of its columns (the
    JSON of ``dataset_info.json`` or of the schema's metadata; empty when there is none) and
    where it came from (for messages)."""

    table: Any
    where: str
    features: dict = field(default_factory=dict)

    @property
    def column_names(self) -> list[str]:
        return list(self.table.column_names)

    def __len__(self) -> int:
        return int(self.table.num_rows)


# -- files --------------------------------------------------------------------------------------------
def dataset_bytes(path: Path) -> int:
    """Bytes of a file, or of every file under a folder (symbolic links not followed)."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def check_dataset_size(path: Path) -> None:
    """DataError before reading when the dataset's files are larger than the memory available:
    the columns focusfl keeps are built from them in memory."""
    check_allocation(dataset_bytes(path), f"reading dataset {path}")


def read_json_object(path: Path, what: str = "") -> dict:
    """The JSON object in ``path``; DataError (one line naming the file) for a file that is too
    large for memory, not JSON, or not an object."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror or exc}") from None
    check_allocation(size * JSON_BYTES_PER_BYTE, f"{what or 'reading'} {path} ({human_bytes(size)} of JSON)")
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise DataError(f"{path} is not readable JSON ({first_line(exc)})") from None
    if not isinstance(data, dict):
        raise DataError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def plain_name(name: Any) -> bool:
    """A file or folder name inside a folder: no separator, not '.', '..' or hidden tricks."""
    return isinstance(name, str) and bool(name) and name not in (".", "..") and "/" not in name \
        and "\\" not in name and "\0" not in name


def read_tables(path: Path, test_split: str) -> tuple[Split, Split | None]:
    """(train, test or None) from a folder or a file, read and validated by pyarrow."""
    if not path.exists():
        raise DataError(f"dataset {path} not found (a save_to_disk folder, or a .parquet/.csv/.json/.jsonl file)")
    check_dataset_size(path)
    require("pyarrow", "data=hf:PATH")
    if path.is_dir() and parquet_splits(path):
        return _split_tables(path, test_split)
    if path.is_dir():
        return _saved_folder(path, test_split)
    reader = FILE_READERS.get(path.suffix.lower())
    if reader is None:
        raise DataError(f"dataset file {path}: expected .parquet, .csv, .json or .jsonl (or a save_to_disk folder)")
    table = _arrow_table(path, reader)
    return Split(table, str(path), schema_features(table, path)), None


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


def _split_tables(folder: Path, test_split: str) -> tuple[Split, Split | None]:
    """(train, test or None) from a folder of parquet files named by split (shards concatenated)."""
    splits = parquet_splits(folder)
    if "train" not in splits:
        raise DataError(f"dataset {folder} has parquet files of splits {', '.join(splits)}, none named train")

    def split(name: str) -> Split:
        parts = [_arrow_table(file, "parquet") for file in splits[name]]
        table = _concat(parts, f"dataset {folder}: the {name} files")
        return Split(table, str(folder), schema_features(parts[0], splits[name][0]))

    return split("train"), split(test_split) if test_split in splits else None


def _saved_folder(folder: Path, test_split: str) -> tuple[Split, Split | None]:
    """(train, test or None) of a ``save_to_disk`` folder: a DatasetDict (dataset_dict.json and
    a folder per split) or one Dataset (state.json, dataset_info.json and Arrow files)."""
    listing = folder / "dataset_dict.json"
    if listing.is_file():
        splits = read_json_object(listing).get("splits")
        if not isinstance(splits, list) or not splits or not all(plain_name(s) for s in splits):
            raise DataError(f"{listing}: 'splits' must list the names of the split folders, got {short(splits)}")
        for name in splits:
            if not (folder / name).is_dir():
                raise DataError(f"{listing} lists split {name!r}, but {folder / name} is not a folder")
        if "train" not in splits:
            raise DataError(f"dataset {folder} has splits {', '.join(splits)}, none named train")
        return read_split(folder / "train"), read_split(folder / test_split) if test_split in splits else None
    if (folder / "state.json").is_file():
        return read_split(folder), None
    raise DataError(f"dataset folder {folder} holds no dataset_dict.json, state.json or parquet files "
                    "(save it with save_to_disk, or give the Hub's parquet files)")


def read_split(folder: Path) -> Split:
    """One ``save_to_disk`` split: state.json's Arrow files in order, dataset_info.json's features."""
    state_file = folder / "state.json"
    if not state_file.is_file():
        raise DataError(f"dataset split {folder} has no state.json (saved with save_to_disk?)")
    files = read_json_object(state_file).get("_data_files")
    if not isinstance(files, list) or not files:
        raise DataError(f"{state_file}: '_data_files' must be a non-empty list of {{\"filename\": ...}}, got "
                        f"{short(files)}")
    paths = []
    for k, entry in enumerate(files):
        name = entry.get("filename") if isinstance(entry, dict) else None
        if not plain_name(name):
            raise DataError(f"{state_file}: _data_files[{k}] must be {{\"filename\": NAME}} naming a file in "
                            f"{folder}, got {short(entry)}")
        if not (folder / name).is_file():
            raise DataError(f"{state_file}: _data_files[{k}] names {name!r}, which is not a file in {folder}")
        paths.append(folder / name)
    # Each file's own size: a name may be a link to a file elsewhere, which dataset_bytes skips.
    check_allocation(sum(path.stat().st_size for path in paths), f"reading the Arrow files of {folder}")
    info_file = folder / "dataset_info.json"
    features: Any = read_json_object(info_file).get("features") if info_file.is_file() else None
    if features is not None and not isinstance(features, dict):
        raise DataError(f"{info_file}: 'features' must be an object of column: feature, got {short(features)}")
    parts = [_arrow_stream(path) for path in paths]
    table = _concat(parts, f"dataset split {folder}: its Arrow files")
    return Split(table, str(folder), features or schema_features(parts[0], paths[0]))


def _arrow_stream(path: Path):
    """An Arrow IPC stream (what save_to_disk writes), memory-mapped and validated in full."""
    import pyarrow as pa

    try:
        source = pa.memory_map(str(path))
        try:
            table = pa.ipc.open_stream(source).read_all()
        except pa.ArrowInvalid:  # the IPC file format, as some writers use
            table = pa.ipc.open_file(source).read_all()
        table.validate(full=True)
    except Exception as exc:  # noqa: BLE001 - pyarrow's errors are many; any is one line here
        if not library_errors(exc):
            raise
        raise DataError(f"cannot read Arrow file {path}: {first_line(exc)}") from None
    return table


def _arrow_table(path: Path, reader: str):
    """A file read by pyarrow (no cache written; Hugging Face feature metadata kept), validated."""
    try:
        if reader == "parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(path)
        elif reader == "csv":
            import pyarrow.csv as pcsv

            table = pcsv.read_csv(path)
        else:
            import pyarrow.json as pjson

            table = pjson.read_json(path)  # JSON Lines: one object per line
        table.validate(full=True)
    except Exception as exc:  # noqa: BLE001
        if not library_errors(exc):
            raise
        raise DataError(f"cannot read {reader} file {path}: {first_line(exc)}") from None
    return table


def _concat(tables: list, where: str):
    import pyarrow as pa

    if len(tables) == 1:
        return tables[0]
    first = tables[0].schema.remove_metadata()
    for table in tables[1:]:
        if not table.schema.remove_metadata().equals(first):
            raise DataError(f"{where} differ in columns or types ({first} against {table.schema.remove_metadata()})"
                            .replace("\n", ", "))
    try:
        return pa.concat_tables([t.replace_schema_metadata(tables[0].schema.metadata) for t in tables])
    except pa.ArrowException as exc:
        raise DataError(f"{where} cannot be joined ({first_line(exc)})") from None


def schema_features(table, source: Path) -> dict:
    """The Hugging Face features a parquet or Arrow file stores in its schema metadata
    (``huggingface`` -> ``{"info": {"features": ...}}``), or {} when it stores none."""
    raw = (table.schema.metadata or {}).get(b"huggingface")
    if raw is None:
        return {}
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise DataError(f"{source}: its 'huggingface' schema metadata is not JSON") from None
    info = data.get("info") if isinstance(data, dict) else None
    features = info.get("features") if isinstance(info, dict) else None
    if features is not None and not isinstance(features, dict):
        raise DataError(f"{source}: the features in its 'huggingface' schema metadata must be an object, got "
                        f"{short(features)}")
    return features or {}


# -- columns ------------------------------------------------------------------------------------------
def pick_input(columns: list[str], wanted: str, path: Path) -> str:
    if wanted != "auto":
        return wanted
    for name in AUTO_INPUTS:
        if name in columns:
            return name
    raise DataError(f"dataset {path}: name its input column with input=COLUMN (columns: {', '.join(columns)})")


def check_columns(split: Split, needed: list[str], path: Path, name: str) -> None:
    missing = [c for c in needed if c not in split.column_names]
    if missing:
        raise DataError(f"dataset {path} ({name}) has no column {missing[0]!r} (columns: {', '.join(split.column_names)})")


def column(split: Split, name: str):
    """The column ``name`` as one pyarrow Array (chunks joined; an extension type's storage)."""
    import pyarrow as pa

    chunked = split.table.column(name)
    array = chunked.combine_chunks() if chunked.num_chunks != 1 else chunked.chunk(0)
    while isinstance(array, pa.ExtensionArray):  # datasets' Array2D..5D: nested lists underneath
        array = array.storage
    return array


def _type_name(kind) -> str:
    import pyarrow as pa

    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return f"lists of {_type_name(kind.value_type)}"
    if pa.types.is_struct(kind):
        return "records {" + ", ".join(kind.field(k).name for k in range(kind.num_fields)) + "}"
    return str(kind)


def _is_list(kind) -> bool:
    import pyarrow as pa

    return pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)


def _first_null(array) -> int:
    import pyarrow.compute as pc

    return int(pc.index(array.is_null(), True).as_py())


def _refuse_nulls(array, what: str) -> None:
    if array.null_count:
        raise DataError(f"{what} has an empty value (null) in row {_first_null(array)}")


def _integers(array, what: str) -> np.ndarray:
    """A null-free integer array as int64 (uint64 beyond int64's range refused)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_uint64(array.type) and len(array) and pc.max(array).as_py() > np.iinfo(np.int64).max:
        raise DataError(f"{what} holds {pc.max(array).as_py()}, beyond int64's range")
    return np.array(array.to_numpy(zero_copy_only=False), dtype=np.int64)  # owned: not a view of a mapped file


def labels_of(split: Split, name: str, where: str) -> np.ndarray:
    """The label column as int64 (integers or a ClassLabel; anything else refused)."""
    import pyarrow as pa

    values = column(split, name)
    what = f"{where}: label column {name!r}"
    _refuse_nulls(values, what)
    if not pa.types.is_integer(values.type):
        raise DataError(f"{what} must hold integers, got {_type_name(values.type)}")
    labels = _integers(values, what)
    try:
        check_labels(labels)
    except DataError as exc:  # -1 marks an unlabelled split (GLUE's test splits)
        raise DataError(f"{what}: {exc} (an unlabelled split? see test_split)") from None
    return labels


def feature(split: Split, name: str) -> dict:
    """The Hugging Face feature of column ``name`` (a dict; {} when none or not a typed one)."""
    entry = split.features.get(name)
    if entry is None or isinstance(entry, (list, tuple)):
        return {}
    if not isinstance(entry, dict) or not isinstance(entry.get("_type", ""), str):
        raise DataError(f"dataset {split.where}: the feature of column {name!r} must be an object with a "
                        f"'_type', got {short(entry)}")
    return entry


def declared_classes(split: Split, name: str, where: str) -> int | None:
    """The class count of a ClassLabel feature (its ``names`` or ``num_classes``), else None."""
    entry = feature(split, name)
    if entry.get("_type") != "ClassLabel":
        return None
    names, count = entry.get("names"), entry.get("num_classes")
    if names is not None:
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise DataError(f"{where}: ClassLabel 'names' of column {name!r} must be a list of strings, got {short(names)}")
        return len(names)
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise DataError(f"{where}: ClassLabel of column {name!r} needs 'names' or an integer 'num_classes', "
                        f"got {short(count)}")
    return count


# -- inputs -------------------------------------------------------------------------------------------
def nested_numbers(values, name: str, where: str) -> np.ndarray:
    """Nested numeric lists [M][d1][d2]... of one shape as an array [M, d1, d2, ...]."""
    import pyarrow as pa
    import pyarrow.compute as pc

    shape, current = [len(values)], values
    while _is_list(current.type):
        _refuse_nulls(current, f"{where}: column {name!r}")
        lengths = pc.list_value_length(current).to_numpy(zero_copy_only=False)
        if lengths.size and (lengths != lengths[0]).any():
            raise DataError(f"{where}: images of column {name!r} differ in shape (lengths {int(lengths.min())} and "
                            f"{int(lengths.max())} at one level)")
        shape.append(int(lengths[0]) if lengths.size else 0)
        current = pc.list_flatten(current)
    if not (pa.types.is_integer(current.type) or pa.types.is_floating(current.type)):
        raise DataError(f"{where}: column {name!r} must hold numbers (pixels), got {_type_name(values.type)}")
    _refuse_nulls(current, f"{where}: column {name!r} (a pixel)")
    dtype = np.dtype(current.type.to_pandas_dtype())
    check_allocation(int(np.prod(shape)) * dtype.itemsize, f"{where}: images of shape {tuple(shape)}")
    return np.array(current.to_numpy(zero_copy_only=False)).reshape(shape)  # owned: not a view of a mapped file


def decoded_images(values, name: str, where: str, folder: str) -> np.ndarray:
    """An ``Image`` feature's records {bytes, path} decoded with Pillow from their bytes."""
    from PIL import Image

    fields = {values.type.field(k).name for k in range(values.type.num_fields)}
    if "bytes" not in fields:
        raise DataError(f"{where}: image column {name!r} holds {_type_name(values.type)}, not {{bytes, path}}")
    _refuse_nulls(values, f"{where}: image column {name!r}")
    stored = values.field("bytes")
    if stored.null_count:
        row = _first_null(stored)
        raise DataError(f"{where}: image {row} of column {name!r} names a file instead of holding its bytes "
                        f"(focusfl reads only what {folder} holds: save the dataset with the images embedded)")
    images, shape = [], None
    for row, data in enumerate(stored.to_pylist()):
        try:
            with warnings.catch_warnings():  # a decompression bomb's warning is an error here
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                picture = Image.open(io.BytesIO(data))
            with picture:
                size = (picture.size[1], picture.size[0], len(picture.getbands()))
                if shape is None:
                    check_allocation(len(stored) * int(np.prod(size)) * 4, f"{where}: {len(stored):,} images of "
                                     f"{size[0]} x {size[1]} x {size[2]}")
                    shape = size
                elif size != shape:
                    raise DataError(f"{where}: images of column {name!r} differ in shape ({shape} and {size} at row {row})")
                images.append(np.asarray(picture))
        except FocusflError:
            raise
        except Exception as exc:  # noqa: BLE001 - Pillow's errors (a bomb, a broken file)
            if not library_errors(exc):
                raise
            raise DataError(f"{where}: image {row} of column {name!r} cannot be decoded ({first_line(exc)})") from None
    return np.stack(images)


def image_inputs(split: Split, name: str, where: str) -> np.ndarray:
    """Images [M, C, H, W] from an Image feature or nested numeric lists."""
    import pyarrow as pa

    if len(split) == 0:
        raise DataError(f"{where} has no rows")
    values = column(split, name)
    if pa.types.is_struct(values.type):
        images = decoded_images(values, name, where, split.where)
    else:
        images = nested_numbers(values, name, where)
    if images.ndim == 2:
        raise DataError(f"{where}: column {name!r} holds vectors, not images (lists of rows of pixels)")
    images = as_nchw(images, where)
    check_pixels(images)
    return images


@dataclass(frozen=True)
class Tokens:
    """Token sequences as flat ids and per-row lengths (row r: ids[starts[r] : starts[r] + lengths[r]])."""

    ids: np.ndarray  # int64
    starts: np.ndarray  # int64 [M]
    lengths: np.ndarray  # int64 [M]

    def cut(self, max_length: int) -> "Tokens":
        return Tokens(self.ids, self.starts, np.minimum(self.lengths, max_length))

    def largest(self) -> int:
        kept = self.kept()
        return int(self.ids[kept].max()) if kept.size else 0

    def kept(self) -> np.ndarray:
        """Indices into ids of the tokens rows keep (after a cut)."""
        positions = np.arange(int(self.lengths.sum())) - np.repeat(np.cumsum(self.lengths) - self.lengths, self.lengths)
        return np.repeat(self.starts, self.lengths) + positions


def token_lists(split: Split, name: str, where: str) -> Tokens:
    """A pre-tokenized column: lists of integer token ids, none empty (null), none negative."""
    import pyarrow as pa
    import pyarrow.compute as pc

    values = column(split, name)
    what = f"{where}: column {name!r}"
    if not _is_list(values.type) or not pa.types.is_integer(values.type.value_type):
        raise DataError(f"{what} must hold lists of token ids (integers), got {_type_name(values.type)} "
                        "(or give tokenizer=FOLDER for text)")
    _refuse_nulls(values, what)
    flat = pc.list_flatten(values)
    if flat.null_count:
        parents = pc.list_parent_indices(values).to_numpy(zero_copy_only=False)
        raise DataError(f"{what}: a token id of row {int(parents[_first_null(flat)])} is empty (null)")
    ids = _integers(flat, what)
    if ids.size and ids.min() < 0:
        parents = pc.list_parent_indices(values).to_numpy(zero_copy_only=False)
        raise DataError(f"{what}: row {int(parents[int(np.argmin(ids))])} has the negative token id {int(ids.min())}")
    lengths = pc.list_value_length(values).to_numpy(zero_copy_only=False).astype(np.int64)
    return Tokens(ids, np.cumsum(lengths) - lengths, lengths)


def text_column(split: Split, name: str, where: str) -> list[str]:
    """A text column's strings (none empty/null: a missing text is refused, not tokenized)."""
    import pyarrow as pa

    values = column(split, name)
    what = f"{where}: text column {name!r}"
    if not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)):
        raise DataError(f"{what} must hold strings, got {_type_name(values.type)}")
    _refuse_nulls(values, what)
    return values.to_pylist()


def tokenized(tokenizer, texts: list[str], max_length: int, where: str, folder: str) -> Tokens:
    try:
        sequences = tokenizer(texts, truncation=True, max_length=max_length, padding=False)["input_ids"]
    except BaseException as exc:  # noqa: BLE001 - tokenizers' Rust panics are BaseExceptions
        if not library_errors(exc):
            raise
        raise DataError(f"the tokenizer of {folder} fails on {where}: {first_line(exc)}") from None
    lengths = np.fromiter((len(s) for s in sequences), dtype=np.int64, count=len(sequences))
    ids = np.fromiter(itertools.chain.from_iterable(sequences), dtype=np.int64, count=int(lengths.sum()))
    return Tokens(ids, np.cumsum(lengths) - lengths, lengths)


def pack_tokens(tokens: Tokens, length: int, where: str) -> np.ndarray:
    """[M, 2, length] int64: the ids (0 on padding) and the attention mask, sequences cut at ``length``."""
    rows = len(tokens.lengths)
    check_allocation(rows * 2 * length * 8, f"{where}: {rows:,} sequences of {length} tokens")
    tokens = tokens.cut(length)
    if rows and (tokens.lengths == 0).any():
        raise DataError(f"{where}: row {int(np.argmin(tokens.lengths))} has no token")
    packed = np.zeros((rows, 2, length), dtype=np.int64)
    owner = np.repeat(np.arange(rows), tokens.lengths)
    position = np.arange(int(tokens.lengths.sum())) - np.repeat(np.cumsum(tokens.lengths) - tokens.lengths,
                                                                 tokens.lengths)
    packed[owner, 0, position] = tokens.ids[tokens.kept()]
    packed[owner, 1, position] = 1
    return packed


# -- tokenizers ---------------------------------------------------------------------------------------
def check_tokenizer_folder(path: Path) -> None:
    """DataError unless ``path`` holds a tokenizer's files, names no code of its own and (when
    it names one) a tokenizer class transformers has; nothing is imported."""
    if not path.is_dir():
        raise DataError(f"tokenizer folder {path} not found")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise DataError(f"tokenizer folder {path} holds no tokenizer files ({', '.join(TOKENIZER_FILES[:3])}, ...): "
                        "save the tokenizer there with save_pretrained")
    files = [entry for entry in path.iterdir() if entry.is_file()]
    check_allocation(sum(entry.stat().st_size for entry in files) * JSON_BYTES_PER_BYTE,
                     f"reading the tokenizer files of {path}")
    settings = path / "tokenizer_config.json"
    if not settings.is_file():
        return
    config = read_json_object(settings)
    if config.get("auto_map") is not None:
        raise DataError(f"{settings}: 'auto_map' names Python code of the folder's own, which focusfl never runs")
    name = config.get("tokenizer_class")
    if name is not None and (not isinstance(name, str) or not name.isidentifier()):
        raise DataError(f"{settings}: 'tokenizer_class' must be a class name, got {short(name)}")


def load_tokenizer(folder: str):
    """A tokenizer from a local folder: files only, no code of its own, nothing downloaded."""
    path = Path(folder).expanduser()
    check_tokenizer_folder(path)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    transformers = require("transformers", "tokenizer=FOLDER")
    transformers.logging.set_verbosity_error()
    settings = path / "tokenizer_config.json"
    name = read_json_object(settings).get("tokenizer_class") if settings.is_file() else None
    if name is not None and not any(_has_class(transformers, n) for n in (name, name.removesuffix("Fast"),
                                                                           name + "Fast")):
        raise DataError(f"{settings}: 'tokenizer_class' names {name!r}, which transformers does not have")
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True,
                                                               trust_remote_code=False)
    except BaseException as exc:  # noqa: BLE001 - transformers', tokenizers' and their Rust errors
        if not library_errors(exc):
            raise
        raise DataError(f"cannot load a tokenizer from {path}: {first_line(exc)}") from None
    if not callable(tokenizer) or len(tokenizer) < 1:
        raise DataError(f"tokenizer folder {path} gives no usable tokenizer")
    return tokenizer


def _has_class(transformers, name: str) -> bool:
    try:
        return isinstance(getattr(transformers, name), type)
    except (AttributeError, ImportError, RuntimeError):
        return False


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
    name = pick_input(train.column_names, input, path)
    needed = [name, label] + ([id_column] if id_column else [])
    check_columns(train, needed, path, "train")
    if test is not None:
        check_columns(test, [name, label], path, test_split)
    elif not test_fraction > 0:
        raise ConfigError(f"dataset {path} has no split named {test_split!r}: hold rows out with test_fraction (e.g. 0.2)")
    if test is not None and test_fraction > 0:
        raise ConfigError(f"dataset {path} has a {test_split!r} split; test_fraction applies only to datasets without one")
    where = f"dataset {path}"
    if len(train) == 0:
        raise DataError(f"{where} has no training rows")
    train_labels = labels_of(train, label, where)
    test_labels = labels_of(test, label, f"{where} ({test_split})") if test is not None else None
    classes = declared_classes(train, label, where)
    kind, train_inputs, test_inputs, vocabulary = _inputs(train, test, name, tokenizer, max_length, where)
    ids = _natural_ids(train, id_column, where) if id_column else None
    if test is None:
        keep, held = held_out_rows(len(train_labels), test_fraction, seed)
        test_inputs, test_labels = train_inputs[held], train_labels[held]
        train_inputs, train_labels = train_inputs[keep], train_labels[keep]
        ids = ids[keep] if ids is not None else None
    return HFSplits(path.name, kind, train_inputs, train_labels, test_inputs, test_labels,
                    classes or 0, vocabulary, ids)


def _kind(split: Split, name: str) -> str:
    """image, text or tokens: an Image feature or records, strings, lists of lists, lists of ids."""
    import pyarrow as pa

    kind = split.table.schema.field(name).type
    while isinstance(kind, pa.ExtensionType):
        kind = kind.storage_type
    if feature(split, name).get("_type") == "Image" or pa.types.is_struct(kind):
        return "image"
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return "text"
    if _is_list(kind) and _is_list(kind.value_type):
        return "image"
    return "tokens"


def _inputs(train: Split, test: Split | None, name: str, tokenizer: str, max_length: int, where: str):
    """(kind, train inputs, test inputs or None, vocabulary) of the input column."""
    kind = _kind(train, name)
    if test is not None and _kind(test, name) != kind:
        raise DataError(f"{where}: column {name!r} holds {kind} in the train split but not in the test split")
    if kind == "image":
        return ("image", image_inputs(train, name, where),
                image_inputs(test, name, where + " (test)") if test is not None else None, 0)
    if kind == "text":
        if not tokenizer:
            raise ConfigError(f"{where}: column {name!r} holds text; give tokenizer=FOLDER (a local tokenizer)")
        texts = text_column(train, name, where)
        test_texts = text_column(test, name, where + " (test)") if test is not None else []
        tok = load_tokenizer(tokenizer)
        train_tokens = tokenized(tok, texts, max_length, where, tokenizer)
        test_tokens = tokenized(tok, test_texts, max_length, where + " (test)", tokenizer) if test is not None else None
        vocabulary = len(tok)
    else:
        train_tokens = token_lists(train, name, where).cut(max_length)
        test_tokens = token_lists(test, name, where + " (test)").cut(max_length) if test is not None else None
        vocabulary = 1 + max(train_tokens.largest(), test_tokens.largest() if test_tokens is not None else 0)
    length = int(max(train_tokens.lengths.max(initial=0),
                     test_tokens.lengths.max(initial=0) if test_tokens is not None else 0, 1))
    train_inputs = pack_tokens(train_tokens, length, where)
    test_inputs = pack_tokens(test_tokens, length, where + " (test)") if test_tokens is not None else None
    return "tokens", train_inputs, test_inputs, vocabulary


def _natural_ids(split: Split, name: str, where: str) -> np.ndarray:
    import pyarrow as pa

    values = column(split, name)
    what = f"{where}: id column {name!r}"
    _refuse_nulls(values, what)
    if pa.types.is_integer(values.type):
        return _integers(values, what)
    if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
        return np.array(values.to_pylist(), dtype=str)
    raise DataError(f"{what} must hold integers or strings, got {_type_name(values.type)}")

"""Bad inputs of the Hugging Face surfaces, built on the spot: dataset folders and files, their
columns, model folders (config.json, safetensors), tokenizer folders.

``CASES`` maps a case name to ``(build, contains)``: ``build(fx, tmp)`` makes the bad input in
``tmp`` from the good fixtures in ``fx`` (see :func:`make_fixtures`) and returns the words of a
``focusfl`` command (without ``--out``); ``contains`` is what its one error line must say.
tests/test_bad_inputs_hf.py runs every case through the console script under a memory limit.
"""
from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np

from hf_fixtures import text_dataset, tiny_bert, tokenizer_folder

RUN = ("run", "--algorithm", "fedavg", "--lr", "0.1", "--rounds", "1")
COMMON = {"clients": 2, "batch": 4, "min_size": 1, "partition": "iid"}


def make_fixtures(root: Path) -> Path:
    """Good inputs every case starts from: a tokenizer, a tiny BERT, a text DatasetDict."""
    tokenizer_folder(root / "tok")
    tiny_bert(root / "bert")
    text_dataset(root / "sst", rows=60, test=20)
    parquet(root / "ids.parquet", id_rows())  # pre-tokenized: a model case needs no tokenizer
    return root


# -- specs -------------------------------------------------------------------------------------------
def spec(**params) -> str:
    """An nn problem SPEC: COMMON's keys, then ``params`` (which win)."""
    return "nn:" + ",".join(f"{key}={value}" for key, value in {**COMMON, **params}.items())


def text_run(fx: Path, data: Path | str, *, model: str = "text-mean", tokenizer: Path | str | None = None,
             algorithm: str = "fedavg", **params) -> list[str]:
    """``focusfl run`` on a text column tokenized by ``tokenizer`` (the fixture's by default)."""
    tok = fx / "tok" if tokenizer is None else tokenizer
    problem = spec(data=f"hf:{data}", input="sentence", tokenizer=tok, model=model, **params)
    return ["run", "--algorithm", algorithm, *RUN[3:], "--problem", problem]


def ids_run(data: Path | str, *, model: str = "text-mean") -> list[str]:
    """``focusfl run`` on a pre-tokenized column (input_ids), no tokenizer."""
    return [*RUN, "--problem", spec(data=f"hf:{data}", input="input_ids", model=model, test_fraction=0.25)]


def image_run(data: Path | str, column: str = "img") -> list[str]:
    return [*RUN, "--problem", spec(data=f"hf:{data}", input=column, model="logreg", test_fraction=0.25)]


def put(path: Path, data: bytes | str) -> Path:
    """``path`` with ``data`` written to it."""
    if isinstance(data, str):
        path.write_text(data)
    else:
        path.write_bytes(data)
    return path


# -- files ---------------------------------------------------------------------------------------------
def saved(fx: Path, tmp: Path) -> Path:
    """A copy of the fixture's save_to_disk DatasetDict to spoil."""
    target = tmp / "sst"
    shutil.copytree(fx / "sst", target)
    return target


def edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def set_json(path: Path, key: str, value) -> None:
    edit_json(path, lambda data: data.__setitem__(key, value))


def arrow_file(folder: Path) -> Path:
    return next(folder.glob("*.arrow"))


def parquet(path: Path, columns: dict, types: dict | None = None, metadata: dict | None = None) -> Path:
    """A parquet file of ``columns`` (pyarrow types in ``types`` where given)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    arrays = {name: pa.array(values, type=(types or {}).get(name)) for name, values in columns.items()}
    table = pa.table(arrays)
    if metadata is not None:
        table = table.replace_schema_metadata(metadata)
    pq.write_table(table, path)
    return path


def text_rows(count: int = 40) -> dict:
    words = ["good w1 w2", "bad w3", "w4 good good", "bad bad w5"]
    return {"sentence": [words[k % 4] for k in range(count)], "label": [k % 2 for k in range(count)]}


def id_rows(count: int = 40) -> dict:
    return {"input_ids": [[2, 5 + k % 30, 6, 3] for k in range(count)], "label": [k % 2 for k in range(count)]}


def with_row(rows: dict, column: str, row: int, value) -> dict:
    rows = {name: list(values) for name, values in rows.items()}
    rows[column][row] = value
    return rows


def pixel_rows(count: int = 40, side: int = 6) -> dict:
    rng = np.random.default_rng(0)
    return {"img": rng.integers(0, 255, (count, side, side)).tolist(), "label": [k % 2 for k in range(count)]}


def png_bytes(side: int = 6) -> bytes:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.zeros((side, side, 3), dtype=np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def image_records(tmp: Path, records: list, name: str = "pictures.parquet") -> Path:
    """A parquet file whose ``image`` column is an Image feature: records {bytes, path}."""
    import pyarrow as pa

    features = {"image": {"_type": "Image"}, "label": {"dtype": "int64", "_type": "Value"}}
    kind = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    return parquet(tmp / name, {"image": records, "label": [k % 2 for k in range(len(records))]},
                   types={"image": kind}, metadata={b"huggingface": json.dumps({"info": {"features": features}}).encode()})


def png_claiming(width: int, height: int) -> bytes:
    """The start of a PNG whose header claims ``width`` x ``height`` pixels (no pixel data)."""
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


def sparse(path: Path, size: int) -> Path:
    with open(path, "wb") as handle:
        handle.truncate(size)
    return path


# -- model folders -------------------------------------------------------------------------------------
def bert_copy(fx: Path, tmp: Path, name: str = "bert") -> Path:
    target = tmp / name
    shutil.copytree(fx / "bert", target)
    return target


def model_run(fx: Path, folder: Path, kind: str = "hf", algorithm: str = "fedavg", **params) -> list[str]:
    """``focusfl run`` of a model folder on pre-tokenized data (transformers is imported only
    once the model's files pass focusfl's own checks)."""
    problem = spec(data=f"hf:{fx / 'ids.parquet'}", input="input_ids", model=f"{kind}:{folder}", test_fraction=0.25,
                   **params)
    return ["run", "--algorithm", algorithm, *RUN[3:], "--problem", problem]


def config_case(key: str, value):
    """A case: the tiny BERT's config.json with ``key`` set to ``value`` (a random model, hf-config)."""
    def build(fx: Path, tmp: Path) -> list[str]:
        folder = bert_copy(fx, tmp)
        set_json(folder / "config.json", key, value)
        return model_run(fx, folder, "hf-config")
    return build


def config_text_case(text: str):
    def build(fx: Path, tmp: Path) -> list[str]:
        folder = bert_copy(fx, tmp)
        (folder / "config.json").write_text(text)
        return model_run(fx, folder)
    return build


def big_config(algorithm: str = "fedavg", params: dict | None = None, **sizes):
    """A BERT config.json of the given sizes (nothing else in the folder: hf-config), trained by
    ``algorithm`` with the problem's ``params``."""
    def build(fx: Path, tmp: Path) -> list[str]:
        folder = bert_copy(fx, tmp)
        (folder / "model.safetensors").unlink()
        edit_json(folder / "config.json", lambda data: data.update(sizes))
        return model_run(fx, folder, "hf-config", algorithm=algorithm, **(params or {}))
    return build


def safetensors_header(header, data: bytes = b"", length: int | None = None) -> bytes:
    text = json.dumps(header).encode() if not isinstance(header, bytes) else header
    return struct.pack("<Q", len(text) if length is None else length) + text + data


def weights_case(content):
    """A case: the tiny BERT with ``content(original bytes)`` as its model.safetensors."""
    def build(fx: Path, tmp: Path) -> list[str]:
        folder = bert_copy(fx, tmp)
        file = folder / "model.safetensors"
        file.write_bytes(content(file.read_bytes()))
        return model_run(fx, folder)
    return build


def reheader(change):
    """model.safetensors with its header changed by ``change(header dict)`` and the data kept."""
    def content(raw: bytes) -> bytes:
        length = struct.unpack("<Q", raw[:8])[0]
        header = json.loads(raw[8:8 + length])
        change(header)
        return safetensors_header(header, raw[8 + length:])
    return content


def first_tensor(header: dict) -> dict:
    return header[next(k for k in header if k != "__metadata__")]


def index_case(weight_map, shard: bool = True):
    def build(fx: Path, tmp: Path) -> list[str]:
        folder = bert_copy(fx, tmp)
        (folder / "model.safetensors").rename(folder / "model-00001-of-00001.safetensors")
        (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
        if not shard:
            (folder / "model-00001-of-00001.safetensors").unlink()
        return model_run(fx, folder)
    return build


# -- tokenizer folders ---------------------------------------------------------------------------------
def tokenizer_case(change):
    """A case: a copy of the fixture's tokenizer folder, spoiled by ``change(folder)``."""
    def build(fx: Path, tmp: Path) -> list[str]:
        folder = tmp / "tok"
        shutil.copytree(fx / "tok", folder)
        change(folder)
        return text_run(fx, fx / "sst", tokenizer=folder)
    return build


def folder_case(change, run=None):
    """A case: a copy of the saved DatasetDict, spoiled by ``change(folder)``."""
    def build(fx: Path, tmp: Path) -> list[str]:
        folder = saved(fx, tmp)
        change(folder)
        return (run or (lambda fx, data: text_run(fx, data)))(fx, folder)
    return build


def file_case(make, run=None):
    """A case: a dataset file ``make(tmp)`` (text rows unless ``run`` says how to read it)."""
    def build(fx: Path, tmp: Path) -> list[str]:
        data = make(tmp)
        return (run or (lambda fx, data: text_run(fx, data, test_fraction=0.25)))(fx, data)
    return build


def split_info(change):
    return lambda folder: edit_json(folder / "train" / "dataset_info.json", change)


def split_state(change):
    return lambda folder: edit_json(folder / "train" / "state.json", change)


def label_feature(value):
    return split_info(lambda info: info["features"].__setitem__("label", value))


def truncate_arrow(folder: Path) -> None:
    file = arrow_file(folder / "train")
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])


def second_shard(folder: Path) -> None:
    """A second Arrow file in train/ whose columns differ from the first's."""
    import pyarrow as pa

    table = pa.table({"sentence": ["good"], "label": pa.array([1], pa.int64())})
    with pa.OSFile(str(folder / "train" / "data-00001-of-00002.arrow"), "wb") as sink:
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
    edit_json(folder / "train" / "state.json", lambda state: state["_data_files"].append(
        {"filename": "data-00001-of-00002.arrow"}))


def int_test_column(folder: Path) -> None:
    """The test split's sentence column replaced by integers (the train split keeps text)."""
    import pyarrow as pa

    file = arrow_file(folder / "test")
    table = pa.ipc.open_stream(pa.memory_map(str(file))).read_all()
    table = table.set_column(table.column_names.index("sentence"), "sentence", pa.array(range(len(table))))
    with pa.OSFile(str(file), "wb") as sink:
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)


def write(path_name: str, text: str):
    return lambda folder: (folder / path_name).write_text(text)


def unlink(path_name: str):
    return lambda folder: (folder / path_name).unlink()


CASES: dict[str, tuple] = {
    # -- save_to_disk folders: dataset_info.json, state.json, dataset_dict.json, Arrow files
    "info-features-number": (folder_case(split_info(lambda i: i.__setitem__("features", 42))),
                             "'features' must be an object"),
    "info-features-string": (folder_case(split_info(lambda i: i.__setitem__("features", "abc"))),
                             "'features' must be an object"),
    "info-features-list": (folder_case(split_info(lambda i: i.__setitem__("features", [1, 2]))),
                           "'features' must be an object"),
    "info-not-json": (folder_case(write("train/dataset_info.json", "{")), "is not readable JSON"),
    "info-a-list": (folder_case(write("train/dataset_info.json", "[]")), "must hold a JSON object"),
    "info-feature-a-number": (folder_case(label_feature(5)), "the feature of column 'label' must be an object"),
    "classlabel-names-a-number": (folder_case(label_feature({"_type": "ClassLabel", "names": 7})),
                                  "'names' of column 'label' must be a list of strings"),
    "classlabel-names-numbers": (folder_case(label_feature({"_type": "ClassLabel", "names": [1, 2]})),
                                 "must be a list of strings"),
    "classlabel-count-a-string": (folder_case(label_feature({"_type": "ClassLabel", "num_classes": "two"})),
                                  "needs 'names' or an integer 'num_classes'"),
    "classlabel-count-huge": (folder_case(label_feature({"_type": "ClassLabel", "num_classes": 10**12})),
                              "1,000,000,000,000 classes for 2 clients would need"),
    "state-files-empty": (folder_case(split_state(lambda s: s.__setitem__("_data_files", []))),
                          "'_data_files' must be a non-empty list"),
    "state-files-a-string": (folder_case(split_state(lambda s: s.__setitem__("_data_files", "data.arrow"))),
                             "'_data_files' must be a non-empty list"),
    "state-files-a-number": (folder_case(split_state(lambda s: s.__setitem__("_data_files", 5))),
                             "'_data_files' must be a non-empty list"),
    "state-file-without-name": (folder_case(split_state(lambda s: s.__setitem__("_data_files", [{}]))),
                                "_data_files[0] must be {\"filename\": NAME}"),
    "state-file-outside": (folder_case(split_state(lambda s: s.__setitem__(
        "_data_files", [{"filename": "../test/data-00000-of-00001.arrow"}]))), "_data_files[0] must be"),
    "state-file-absolute": (folder_case(split_state(lambda s: s.__setitem__("_data_files", [{"filename": "/etc/passwd"}]))),
                            "_data_files[0] must be"),
    "state-file-missing": (folder_case(split_state(lambda s: s.__setitem__("_data_files", [{"filename": "nope.arrow"}]))),
                           "names 'nope.arrow', which is not a file"),
    "state-not-json": (folder_case(write("train/state.json", "{\"_data_files\": [")), "is not readable JSON"),
    "state-a-list": (folder_case(write("train/state.json", "[1]")), "must hold a JSON object"),
    "state-missing": (folder_case(unlink("train/state.json")), "has no state.json"),
    "splits-a-string": (folder_case(write("dataset_dict.json", '{"splits": "train"}')), "'splits' must list"),
    "splits-empty": (folder_case(write("dataset_dict.json", '{"splits": []}')), "'splits' must list"),
    "splits-outside": (folder_case(write("dataset_dict.json", '{"splits": ["train", "../x"]}')), "'splits' must list"),
    "split-folder-missing": (folder_case(write("dataset_dict.json", '{"splits": ["train", "test", "extra"]}')),
                             "lists split 'extra', but"),
    "splits-not-json": (folder_case(write("dataset_dict.json", "splits")), "is not readable JSON"),
    "arrow-truncated": (folder_case(truncate_arrow), "cannot read Arrow file"),
    "arrow-empty": (folder_case(lambda f: arrow_file(f / "train").write_bytes(b"")), "cannot read Arrow file"),
    "arrow-garbage": (folder_case(lambda f: arrow_file(f / "train").write_bytes(bytes(range(256)) * 8)),
                      "cannot read Arrow file"),
    "arrow-shards-differ": (folder_case(second_shard), "its Arrow files differ in columns or types"),
    "test-split-other-kind": (folder_case(int_test_column), "holds text in the train split but not in the test split"),
    "folder-without-metadata": (file_case(lambda tmp: (tmp / "empty").mkdir() or tmp / "empty"),
                                "holds no dataset_dict.json, state.json or parquet files"),
    "folder-claims-a-terabyte": (folder_case(lambda f: sparse(f / "train" / "extra.bin", 1 << 40)), "would need 1 TiB"),
    # -- single files and parquet folders
    "parquet-truncated": (file_case(lambda tmp: put(tmp / "t.parquet", parquet(
        tmp / "good.parquet", text_rows()).read_bytes()[:300])), "cannot read parquet file"),
    "parquet-garbage": (file_case(lambda tmp: put(tmp / "g.parquet", b"PAR1" + bytes(500) + b"PAR1")),
                        "cannot read parquet file"),
    "parquet-metadata-not-json": (file_case(lambda tmp: parquet(tmp / "m.parquet", text_rows(),
                                                                metadata={b"huggingface": b"{"})),
                                  "'huggingface' schema metadata is not JSON"),
    "parquet-features-a-number": (file_case(lambda tmp: parquet(tmp / "f.parquet", text_rows(), metadata={
        b"huggingface": json.dumps({"info": {"features": 3}}).encode()})), "must be an object, got 3"),
    "csv-ragged": (file_case(lambda tmp: put(tmp / "r.csv", "sentence,label\ngood,1\nbad,0,7\n")),
                   "cannot read csv file"),
    "jsonl-broken": (file_case(lambda tmp: put(tmp / "b.jsonl", '{"sentence": "good", "label": 1}\n{"sent\n')),
                     "cannot read json file"),
    "parquet-no-rows": (file_case(lambda tmp: parquet(tmp / "z.parquet", {"sentence": [], "label": []},
                                                      types={"sentence": __import__("pyarrow").string(),
                                                             "label": __import__("pyarrow").int64()})),
                        "has no training rows"),
    "unknown-suffix": (file_case(lambda tmp: put(tmp / "rows.txt", "sentence,label\n")),
                       "expected .parquet, .csv, .json or .jsonl"),
    "parquet-shards-differ": (file_case(lambda tmp: (tmp / "hub").mkdir() or parquet(
        tmp / "hub" / "train-00000-of-00002.parquet", text_rows()) and parquet(
        tmp / "hub" / "train-00001-of-00002.parquet", {"sentence": ["x"]}) and tmp / "hub"), "differ in columns"),
    # -- label columns
    "label-lists": (file_case(lambda tmp: parquet(tmp / "l.parquet", {**text_rows(), "label": [[0]] * 40})),
                    "must hold integers, got lists of int64"),
    "label-strings": (file_case(lambda tmp: parquet(tmp / "l.parquet", {**text_rows(), "label": ["pos"] * 40})),
                      "must hold integers, got string"),
    "label-floats": (file_case(lambda tmp: parquet(tmp / "l.parquet", {**text_rows(), "label": [0.5] * 40})),
                     "must hold integers, got double"),
    "label-bools": (file_case(lambda tmp: parquet(tmp / "l.parquet", {**text_rows(), "label": [True, False] * 20})),
                    "must hold integers, got bool"),
    "label-null-late": (file_case(lambda tmp: parquet(tmp / "l.parquet", with_row(text_rows(), "label", 30, None))),
                        "label column 'label' has an empty value (null) in row 30"),
    "label-negative": (file_case(lambda tmp: parquet(tmp / "l.parquet", with_row(text_rows(), "label", 3, -2))),
                       "labels must be >= 0"),
    "label-beyond-int64": (file_case(lambda tmp: parquet(tmp / "l.parquet", with_row(text_rows(), "label", 3, 2**64 - 1),
                                                         types={"label": __import__("pyarrow").uint64()})),
                           "beyond int64's range"),
    "label-huge": (file_case(lambda tmp: parquet(tmp / "l.parquet", with_row(text_rows(), "label", 3, 10**12))),
                   "leaves a gap"),
    # -- pre-tokenized columns
    "ids-null-row": (file_case(lambda tmp: parquet(tmp / "i.parquet", with_row(id_rows(), "input_ids", 25, None)),
                               run=lambda fx, data: ids_run(data)), "column 'input_ids' has an empty value (null) in row 25"),
    "ids-null-token": (file_case(lambda tmp: parquet(tmp / "i.parquet", with_row(id_rows(), "input_ids", 7, [2, None, 3])),
                                 run=lambda fx, data: ids_run(data)), "a token id of row 7 is empty (null)"),
    "ids-huge-token": (file_case(lambda tmp: parquet(tmp / "i.parquet", with_row(id_rows(), "input_ids", 7, [2, 10**12])),
                                 run=lambda fx, data: ids_run(data)),
                       "model text-mean (an embedding of 1,000,000,000,001 tokens)"),
    "ids-negative": (file_case(lambda tmp: parquet(tmp / "i.parquet", with_row(id_rows(), "input_ids", 9, [2, -4])),
                               run=lambda fx, data: ids_run(data)), "row 9 has the negative token id -4"),
    "ids-floats": (file_case(lambda tmp: parquet(tmp / "i.parquet", {**id_rows(), "input_ids": [[0.5, 1.5]] * 40}),
                             run=lambda fx, data: ids_run(data)), "got lists of double"),
    "ids-strings": (file_case(lambda tmp: parquet(tmp / "i.parquet", {**id_rows(), "input_ids": [["a", "b"]] * 40}),
                              run=lambda fx, data: ids_run(data)), "got lists of string"),
    "ids-empty-row": (file_case(lambda tmp: parquet(tmp / "i.parquet", with_row(id_rows(), "input_ids", 11, [])),
                                run=lambda fx, data: ids_run(data)), "has no token"),
    "ids-numbers": (file_case(lambda tmp: parquet(tmp / "i.parquet", {**id_rows(), "input_ids": list(range(40))}),
                              run=lambda fx, data: ids_run(data)), "must hold lists of token ids (integers), got int64"),
    "ids-beyond-the-model": (file_case(lambda tmp: parquet(tmp / "i.parquet", with_row(id_rows(), "input_ids", 4, [2, 500])),
                                       run=lambda fx, data: ids_run(data, model=f"hf:{fx / 'bert'}")),
                             "the token ids need a vocabulary of 501 is larger than the model's embedding (100"),
    # -- text, image and id columns
    "text-null-late": (file_case(lambda tmp: parquet(tmp / "t.parquet", with_row(text_rows(), "sentence", 33, None))),
                       "text column 'sentence' has an empty value (null) in row 33"),
    "text-without-tokenizer": (file_case(lambda tmp: parquet(tmp / "t.parquet", text_rows()), run=lambda fx, data: [
        *RUN, "--problem", spec(data=f"hf:{data}", input="sentence", test_fraction=0.25)]),
        "holds text; give tokenizer=FOLDER"),
    "images-differ-in-shape": (file_case(lambda tmp: parquet(tmp / "p.parquet", with_row(pixel_rows(), "img", 5, [[1, 2]] * 6)),
                                         run=lambda fx, data: image_run(data)), "images of column 'img' differ in shape"),
    "image-null": (file_case(lambda tmp: parquet(tmp / "p.parquet", with_row(pixel_rows(), "img", 5, None)),
                             run=lambda fx, data: image_run(data)), "has an empty value (null) in row 5"),
    "image-pixel-null": (file_case(lambda tmp: parquet(tmp / "p.parquet", with_row(pixel_rows(), "img", 5, [[None] * 6] * 6)),
                                   run=lambda fx, data: image_run(data)), "(a pixel) has an empty value (null)"),
    "image-strings": (file_case(lambda tmp: parquet(tmp / "p.parquet", {**pixel_rows(), "img": [[["x"] * 6] * 6] * 40}),
                                run=lambda fx, data: image_run(data)), "must hold numbers (pixels)"),
    "image-path-only": (file_case(lambda tmp: image_records(tmp, [{"bytes": None, "path": "/etc/passwd"}] * 12),
                                  run=lambda fx, data: image_run(data, "image")), "names a file instead of holding its bytes"),
    "image-not-an-image": (file_case(lambda tmp: image_records(tmp, [{"bytes": b"not a png", "path": None}] * 12),
                                     run=lambda fx, data: image_run(data, "image")), "image 0 of column 'image' cannot be decoded"),
    "images-of-two-sizes": (file_case(lambda tmp: image_records(tmp, [{"bytes": png_bytes(6 + (k == 4)), "path": None}
                                                                      for k in range(12)]),
                                      run=lambda fx, data: image_run(data, "image")), "differ in shape"),
    "id-column-null": (folder_case(lambda f: None, run=lambda fx, data: text_run(
        fx, parquet(data.parent / "n.parquet", {**with_row(text_rows(), "label", 0, 0), "writer": [None] + [1] * 39}),
        test_fraction=0.25, partition="natural", id_column="writer")), "id column 'writer' has an empty value (null) in row 0"),
    "id-column-floats": (folder_case(lambda f: None, run=lambda fx, data: text_run(
        fx, parquet(data.parent / "n.parquet", {**text_rows(), "writer": [0.5] * 40}),
        test_fraction=0.25, partition="natural", id_column="writer")), "must hold integers or strings, got double"),
    "image-bomb": (file_case(lambda tmp: image_records(tmp, [{"bytes": png_claiming(100_000, 100_000), "path": None}] * 12),
                             run=lambda fx, data: image_run(data, "image")), "exceeds limit"),
    "arrow-link-to-a-terabyte": (folder_case(lambda f: (arrow_file(f / "train").unlink(), (
        f / "train" / "data-00000-of-00001.arrow").symlink_to(sparse(f.parent / "elsewhere.arrow", 1 << 40)))),
        "reading the Arrow files of"),
    # -- model folders: safetensors headers
    "weights-truncated-header": (weights_case(lambda raw: raw[:4]), "is truncated"),
    "weights-header-too-large": (weights_case(lambda raw: struct.pack("<Q", 10**15) + raw[8:]),
                                 "its header claims 1,000,000,000,000,000 bytes"),
    "weights-header-too-small": (weights_case(lambda raw: struct.pack("<Q", 1) + raw[8:]), "its header claims 1 bytes"),
    "weights-header-not-json": (weights_case(lambda raw: safetensors_header(b"{nope}   ", raw[200:])),
                                "its header is not JSON"),
    "weights-header-a-list": (weights_case(lambda raw: safetensors_header([1, 2])), "must be a JSON object, got list"),
    "weights-unknown-dtype": (weights_case(reheader(lambda h: first_tensor(h).__setitem__("dtype", "F128"))),
                              "unknown dtype 'F128'"),
    "weights-negative-shape": (weights_case(reheader(lambda h: first_tensor(h).__setitem__("shape", [-1, 4]))),
                               "'shape' must be a list of integers >= 0"),
    "weights-offsets-mismatch": (weights_case(reheader(lambda h: first_tensor(h).__setitem__(
        "shape", [x * 2 for x in first_tensor(h)["shape"]]))), "its data_offsets span"),
    "weights-data-cut": (weights_case(lambda raw: raw[:-64]), "the file holds"),
    "weights-offsets-a-string": (weights_case(reheader(lambda h: first_tensor(h).__setitem__("data_offsets", "0-10"))),
                                 "'data_offsets' must be [begin, end]"),
    "weights-of-another-model": (lambda fx, tmp: model_run(fx, tiny_bert(tmp / "wide", vocab=100, seed=1) and _widen(tmp)),
                                 "cannot load a sequence classifier from"),
    "weights-of-another-architecture": (weights_case(reheader(lambda h: [h.__setitem__("other." + k, h.pop(k))
                                                                     for k in list(h) if k != "__metadata__"])),
                                        "holds none of the weights of the BertForSequenceClassification"),
    "weights-index-map-a-list": (index_case(["model-00001-of-00001.safetensors"]), "'weight_map' must map tensor names"),
    "weights-index-outside": (index_case({"x": "../bert/model.safetensors"}), "'weight_map' must map tensor names"),
    "weights-index-shard-missing": (index_case({"x": "model-00001-of-00001.safetensors"}, shard=False),
                                    "names the shard 'model-00001-of-00001.safetensors', which is not a file"),
    # -- model folders: config.json
    "config-width-a-string": (config_case("hidden_size", "abc"), "'hidden_size' must be an integer >= 1, got 'abc'"),
    "config-layers-fractional": (config_case("num_hidden_layers", 2.5), "'num_hidden_layers' must be an integer >= 1, got 2.5"),
    "config-width-null": (config_case("hidden_size", None), "'hidden_size' must be an integer >= 1, got None"),
    "config-width-nan": (config_case("hidden_size", float("nan")), "'hidden_size' must be an integer >= 1, got nan"),
    "config-vocabulary-zero": (config_case("vocab_size", 0), "'vocab_size' must be an integer >= 1, got 0"),
    "config-heads-zero": (config_case("num_attention_heads", 0), "'num_attention_heads' must be an integer >= 1"),
    "config-width-negative": (config_case("hidden_size", -4), "'hidden_size' must be an integer >= 1, got -4"),
    "config-width-bool": (config_case("hidden_size", True), "'hidden_size' must be an integer >= 1, got True"),
    "config-eps-a-string": (config_case("layer_norm_eps", "x"), "'layer_norm_eps' must be a number >= 0"),
    "config-dtype-unknown": (config_case("dtype", "float128"), "'dtype' must be one of"),
    "config-activation-unknown": (config_case("hidden_act", "nope"), "'hidden_act' names 'nope'"),
    "config-activation-a-number": (config_case("hidden_act", 3), "'hidden_act' must name an activation"),
    "config-architectures-a-string": (config_case("architectures", "BertModel"), "'architectures' must be a list"),
    "config-type-missing": (config_case("model_type", None), "'model_type' must name a transformers model type"),
    "config-type-unknown": (config_case("model_type", "nope"), "cannot read model config"),
    "config-own-code": (config_case("auto_map", {"AutoModel": "modeling.Net"}), "'auto_map' names Python code"),
    "config-heads-do-not-divide": (config_case("num_attention_heads", 3), "cannot build a model from"),
    "config-positions-too-few": (config_case("max_position_embeddings", 3), "longer than the model's 3 positions"),
    "config-not-json": (config_text_case("{\"model_type\": "), "is not readable JSON"),
    "config-a-list": (config_text_case("[]"), "must hold a JSON object"),
    "config-million-layers": (big_config(num_hidden_layers=10**6), "would need"),
    "config-many-thin-layers": (big_config(num_hidden_layers=10**6, hidden_size=1, num_attention_heads=1,
                                           intermediate_size=1), "more than 1,024"),
    "config-2.4-billion-parameters": (big_config(hidden_size=2560, num_hidden_layers=30, num_attention_heads=32,
                                                 intermediate_size=10240, vocab_size=50000), "at least 914,432,000 parameters"),
    "config-wide-feed-forward": (big_config(intermediate_size=10**9), "66,000,005,330 parameters x 4 copies"),
    "config-state-of-24-clients": (big_config(hidden_size=512, num_hidden_layers=8, num_attention_heads=8,
                                              intermediate_size=2048, vocab_size=30000, algorithm="mifa",
                                              params={"clients": 24, "batch": 1}), "mifa's state for 24 clients"),
    # -- tokenizer folders
    "tokenizer-class-unknown": (tokenizer_case(lambda f: set_json(f / "tokenizer_config.json", "tokenizer_class",
                                                                  "NopeTokenizer")), "names 'NopeTokenizer'"),
    "tokenizer-class-a-number": (tokenizer_case(lambda f: set_json(f / "tokenizer_config.json", "tokenizer_class", 5)),
                                 "'tokenizer_class' must be a class name"),
    "tokenizer-own-code": (tokenizer_case(lambda f: set_json(f / "tokenizer_config.json", "auto_map",
                                                             {"AutoTokenizer": ["tok.Tok", None]})), "'auto_map' names Python code"),
    "tokenizer-no-files": (tokenizer_case(lambda f: (f / "tokenizer.json").unlink()), "holds no tokenizer files"),
    "tokenizer-json-broken": (tokenizer_case(lambda f: (f / "tokenizer.json").write_text("{")), "cannot load a tokenizer"),
    "tokenizer-json-truncated": (tokenizer_case(lambda f: (f / "tokenizer.json").write_bytes(
        (f / "tokenizer.json").read_bytes()[:200])), "cannot load a tokenizer"),
    "tokenizer-json-another-shape": (tokenizer_case(lambda f: (f / "tokenizer.json").write_text('{"a": 1}')),
                                     "cannot load a tokenizer"),
    "tokenizer-config-not-json": (tokenizer_case(lambda f: (f / "tokenizer_config.json").write_text("nope")),
                                  "is not readable JSON"),
    "tokenizer-json-a-terabyte": (tokenizer_case(lambda f: sparse(f / "tokenizer.json", 1 << 40)), "would need"),
    "tokenizer-folder-missing": (lambda fx, tmp: text_run(fx, fx / "sst", tokenizer=tmp / "nothing"), "not found"),
    "sst2-model-without-tokenizer": (lambda fx, tmp: ["reproduce", "fedsum-sst2", "--data", str(fx / "sst"),
                                                      "--model", str(fx / "bert"), "--rounds", "1"],
                                     "holds no tokenizer files"),
}


def _widen(tmp: Path) -> Path:
    """tmp/wide: a BERT of vocabulary 100 whose config now says 120 (weights of another shape)."""
    set_json(tmp / "wide" / "config.json", "vocab_size", 120)
    return tmp / "wide"

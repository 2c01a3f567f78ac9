"""Every bad input file ends in one line and exit status 2: nothing allocated, nothing written.

Each bad file is built in tmp_path (crafted .npy headers, truncated zips, IDX files with absurd
dimensions, a zlib bomb in a .mat file, ...) and given to ``focusfl`` as a user would, in a
subprocess under a 4 GiB address-space limit (tests/cli_harness.py): a file claiming gigabytes
must be refused from its header, before the memory is asked for. The library-level tests below
cover focusfl.limits and the data checks directly.

The refused runs of bad files and sizes (REFUSED) run one after another in one child process
under that limit (cli_harness.run_in_one_process: each as the console script would run it, its
output caught at the file descriptors), which pays the interpreter's and torch's import once
instead of some thirty times; the console script itself reads a bad trace below
(test_participation_command_reports_a_bad_trace_in_one_line) and a user's model module.
"""
from __future__ import annotations

import gzip
import http.client
import io
import json
import os
import pickle
import struct
import subprocess
import sys
import textwrap
import urllib.request
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
from cli_harness import GIB, assert_one_line_error, cli_env, run_cli, run_in_one_process, snapshot

from focusfl import limits
from focusfl.io.atomic import read_csv
from focusfl.data import Dataset, ImageData, check_classes, infer_classes, load_dataset
from focusfl.data import download as dl
from focusfl.data.loaders import check_labels, check_pixels, pickle_footprint, read_cifar_batch, read_npz_dataset
from focusfl.errors import ConfigError, DataError
from focusfl.participation import make_participation
from focusfl.problems import make_problem
from focusfl.problems.models import make_model, refuse_model_import

MNIST1500 = Path(__file__).resolve().parent / "fixtures" / "mnist1500.npz"
NN = "nn:test_fraction=0.25,clients=2,batch=4,model=logreg,partition=iid"


# -- crafting bad files -----------------------------------------------------------------------------
def npy_header(shape, dtype="|b1", fortran=False) -> bytes:
    """A valid .npy header (version 1.0) claiming ``shape``; no data."""
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, {"descr": dtype, "fortran_order": fortran, "shape": tuple(shape)})
    return out.getvalue()


def write_claiming(path: Path, shape, dtype="|b1", data: bytes = b"", size: int | None = None) -> Path:
    """An .npy file whose header claims ``shape``, followed by ``data``; ``size`` pads it to that many
    bytes as a sparse file (holes take no disk)."""
    with open(path, "wb") as handle:
        handle.write(npy_header(shape, dtype) + data)
        if size is not None:
            handle.truncate(size)
    return path


def tiny_images(count=40, classes=4, seed=0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (count, 1, 8, 8), dtype=np.uint8), np.arange(count) % classes


def write_npz(path: Path, **arrays) -> Path:
    images, labels = tiny_images()
    np.savez(path, **{"images": images, "labels": labels, **arrays})
    return path


def npz_member_claiming(path: Path, claimed_bytes: int, shape) -> Path:
    """An .npz whose 'images' member holds an .npy header claiming ``shape`` and a few bytes, while
    the zip's directory says the member is ``claimed_bytes`` long (so only memory can refuse it)."""
    _, labels = tiny_images()
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("images.npy", npy_header(shape, "|u1") + bytes(64))
        buffer = io.BytesIO()
        np.save(buffer, labels)
        archive.writestr("labels.npy", buffer.getvalue())
    raw = bytearray(path.read_bytes())
    local, central = raw.find(b"PK\x03\x04"), raw.find(b"PK\x01\x02")  # the first member's records
    struct.pack_into("<I", raw, local + 22, claimed_bytes)  # uncompressed size
    struct.pack_into("<I", raw, central + 24, claimed_bytes)
    path.write_bytes(bytes(raw))
    return path


def idx_file(path: Path, array: np.ndarray, dims=None, compress=False, data: bytes | None = None) -> None:
    dims = array.shape if dims is None else dims
    raw = bytes([0, 0, 0x08, len(dims)]) + struct.pack(f">{len(dims)}I", *dims)
    raw += array.astype(np.uint8).tobytes() if data is None else data
    path.write_bytes(gzip.compress(raw) if compress else raw)


def mnist_folder(root: Path, train_images: tuple | None = None, compress=False) -> Path:
    """DATA/mnist with four small IDX files; ``train_images`` = (dims, data) replaces the first's."""
    folder = root / "mnist"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(1)
    suffix = ".gz" if compress else ""
    images, labels = rng.integers(0, 256, (20, 8, 8)), np.arange(20) % 4
    for name, array in (("train-images", images), ("train-labels", labels),
                        ("t10k-images", images[:6]), ("t10k-labels", labels[:6])):
        kind = "idx3" if "images" in name else "idx1"
        idx_file(folder / f"{name}-{kind}-ubyte{suffix}", array, compress=compress)
    if train_images is not None:
        dims, data = train_images
        idx_file(folder / f"train-images-idx3-ubyte{suffix}", np.zeros(0), dims=dims, data=data, compress=compress)
    return root


def mat_bomb(path: Path, declared: int, expands_to: int) -> None:
    """A MATLAB 5 file whose one compressed element's inner tag (an miMATRIX holding miDOUBLE
    values) declares ``declared`` bytes while its zlib stream expands to ``expands_to``."""
    header = b"MATLAB 5.0 MAT-file, crafted".ljust(116) + bytes(8) + struct.pack("<H", 0x0100) + b"IM"
    flags = struct.pack("<IIII", 6, 8, 6, 0)  # miUINT32 [class double]
    dims = struct.pack("<II", 5, 8) + struct.pack("<ii", expands_to // 8, 1)
    name = struct.pack("<HH", 1, 1) + b"X" + bytes(3)  # small element
    values = struct.pack("<II", 9, expands_to)  # miDOUBLE, followed by zeros
    inner = struct.pack("<II", 14, declared) + flags + dims + name + values
    stream = zlib.compressobj(9)
    compressed = stream.compress(inner)
    zeros = bytes(1 << 20)
    for _ in range(expands_to >> 20):
        compressed += stream.compress(zeros)
    compressed += stream.flush()
    path.write_bytes(header + struct.pack("<II", 15, len(compressed)) + compressed)


# -- running focusfl --------------------------------------------------------------------------------
# The tests of REFUSED: on one worker, which runs them all once (the ``refusals`` fixture).
REFUSAL = pytest.mark.xdist_group("bad_input_refusals")


def run_refused(tmp_path: Path, *args: str, contains: str, env=None) -> str:
    """``focusfl run ... --out OUT``: exit 2, one line, no traceback, nothing written anywhere
    under tmp_path (no OUT, no scratch folder beside it)."""
    before = snapshot(tmp_path)
    out = tmp_path / "out"
    proc = run_cli("run", "--algorithm", "focus", "--lr", "1e-4", "--rounds", "2", *args, "--out", str(out), env=env)
    line = assert_one_line_error(proc, code=2, contains=contains)
    assert not out.exists()
    assert snapshot(tmp_path) == before
    return line


# -- problems: sizes from options -------------------------------------------------------------------
SIZE_CASES = {
    "ridge-samples": ("ridge:samples=100000000,dim=50",
                      "ridge problem: 16 clients x 100,000,000 samples x 50 features would need"),
    "ridge-hessians": ("ridge:dim=100000", "16 Hessians of 100,000 x 100,000"),
    "logistic": ("logistic:clients=1000000,samples=1000,dim=1000", "logistic problem: 1,000,000 clients"),
    "nn-batch": (f"nn:data={MNIST1500},test_fraction=0.2,clients=4,batch=100000000000,model=logreg",
                 "minibatch of 100,000,000,000 images would need"),
}


@REFUSAL
@pytest.mark.parametrize("case", SIZE_CASES)
def test_sizes_from_options_are_checked_before_allocating(refusals, case):
    line = refused(refusals, "size", case)
    assert "more than the" in line and "available" in line


# -- numbers in a SPEC beyond what a process computes with (issue 54) -------------------------------
HUGE = "1" + "0" * 30
SPEC_CASES = {
    "separated-gap": (["--participation", f"separated:gap={HUGE}"], "separated: gap is an integer of 31 digits"),
    "separated-gap-float": (["--participation", "separated:gap=1e300"], "gap is an integer of 301 digits"),
    "banded-width": (["--participation", f"banded:width={HUGE}"], "banded: width is an integer of 31 digits"),
    "bernoulli-p": (["--participation", "bernoulli:p=1" + "0" * 400], "bernoulli: p is an integer of 401 digits"),
    "markov-rho-inf": (["--participation", "markov:p=0.5,rho=inf"], "rho"),
    "separated-p-nan": (["--participation", "separated:p=nan"], "p"),
    "sine-period": (["--participation", "sine:period=9223372036854775807"], "period=9,223,372,036,854,775,807"),
    "sine-period-large": (["--participation", "sine:period=1e12"], "would need"),
    "work-rates": (["--work", f"rates:r={HUGE}"], "work rates: r is an integer of 31 digits"),
    "work-markov": (["--work", "markov:slow=1" + "0" * 400], "work markov: slow is an integer of 401 digits"),
    "problem-clients": (["--problem", f"ridge:clients={HUGE}"], "clients is an integer of 31 digits"),
    # a rate's own domain, (0, 1]: a top far below the floor left every band at the floor
    "banded-top": (["--participation", "banded:top=-1e300"], "banded: top=-1e+300 is outside (0, 1]"),
    "banded-floor": (["--participation", "banded:floor=inf"], "banded: floor=inf is not finite"),
    "banded-floor-above-top": (["--participation", "banded:top=0.2,floor=0.5"], "floor=0.5 is above top=0.2"),
    # q's keys E_i / q_i and its sum stay ordinary floats (q=1e308 overflowed with a warning)
    "weighted-q-huge": (["--participation", "weighted:q=1e300"], "weighted: q[0]=1e+300 is outside [1e-100, 1e+100]"),
    "weighted-q-tiny": (["--participation", "weighted:q=1e-310"], "weighted: q[0]=1e-310 is outside"),
    "problem-hetero": (["--problem", "ridge:hetero=1e300,dim=5,samples=10"], "its minimizer is not finite"),
    "problem-reg-nan": (["--problem", "ridge:reg=nan,dim=5,samples=10"], "reg must be >= 0 (a finite number), got nan"),
}


@REFUSAL
@pytest.mark.parametrize("case", SPEC_CASES)
def test_numbers_beyond_a_process_range_are_refused(refusals, case):
    refused(refusals, "spec", case)


# -- participation traces ---------------------------------------------------------------------------
def _trace(tmp_path: Path, case: str) -> Path:
    npy = tmp_path / f"{case}.npy"
    ones = np.ones((5, 16), dtype=np.int8)
    if case == "zero-rows":
        np.save(npy, np.zeros((0, 16), dtype=bool))
    elif case == "zero-columns":
        np.save(npy, np.zeros((5, 0), dtype=bool))
    elif case == "zero-d":
        np.save(npy, np.array(1))
    elif case == "claims-more-than-file":
        write_claiming(npy, (10**6, 16), data=bytes(10))
    elif case == "claims-more-than-memory":
        rows = (5 * GIB) // 16  # 5 GiB of bools, really in the (sparse) file
        write_claiming(npy, (rows, 16), size=len(npy_header((rows, 16))) + rows * 16)
    elif case == "object":
        np.save(npy, np.array([[1, None]] * 3, dtype=object), allow_pickle=True)
    elif case == "strings":
        np.save(npy, np.array([["1"] * 16] * 3))
    elif case == "not-0-1":
        ones[1, 3] = 2
        np.save(npy, ones)
    elif case == "nan":
        np.save(npy, np.where(ones == 1, np.nan, 0.0))
    elif case == "client-never-participates":
        ones[:, 3] = 0
        np.save(npy, ones)
    elif case == "wrong-clients":
        np.save(npy, ones[:, :4])
    elif case == "csv-too-large":
        csv = tmp_path / "huge.csv"
        with open(csv, "wb") as handle:
            handle.write(b"0,1\n")
            handle.truncate(65 << 20)
        return csv
    return npy


TRACE_CASES = {
    "zero-rows": "non-empty 2-D matrix, got shape (0, 16)",
    "zero-columns": "got shape (5, 0)",
    "zero-d": "got shape ()",
    "claims-more-than-file": "but only 10 B follow it",
    "claims-more-than-memory": "would need",
    "object": "holds Python objects",
    "strings": "must hold numbers or bools",
    "not-0-1": "found 2 at round 1, client 3",
    "nan": "found nan at round 0, client 0",
    "client-never-participates": "client 3 never takes part",
    "wrong-clients": "has 4 columns, expected 16",
    "csv-too-large": "save it as a 0/1 .npy",
}


@REFUSAL
@pytest.mark.parametrize("case", TRACE_CASES)
def test_bad_trace_files(refusals, case):
    refused(refusals, "trace", case)


@pytest.mark.parametrize("spec,contains", [("banded:top=-1e300", "top=-1e+300 is outside (0, 1]"),
                                           ("weighted:q=1e300", "q[0]=1e+300 is outside")])
def test_participation_command_refuses_a_parameter_outside_its_domain(spec, contains):
    assert_one_line_error(run_cli("participation", spec, "--clients", "4", "--rounds", "10"), contains=contains)


def test_participation_command_reports_a_bad_trace_in_one_line(tmp_path):
    path = write_claiming(tmp_path / "t.npy", (1000, 3), data=bytes(7))
    proc = run_cli("participation", f"trace:path={path}", "--clients", "3")
    assert_one_line_error(proc, contains="only 7 B follow it")


# -- dataset files: .npz ----------------------------------------------------------------------------
def _npz(tmp_path: Path, case: str) -> Path:
    path = tmp_path / f"{case}.npz"
    images, labels = tiny_images()
    if case == "truncated":
        write_npz(path)
        path.write_bytes(path.read_bytes()[:-300])
    elif case == "member-claims-more-than-stored":
        npz_member_claiming(path, 200, (10**6, 1, 28, 28))
    elif case == "member-claims-more-than-memory":
        npz_member_claiming(path, 0xF000_0000 + 128, (0xF000_0000 // 64, 1, 8, 8))  # 3.75 GiB
    elif case == "object-member":
        np.savez(path, images=images, labels=np.array([None] * 40, dtype=object))
    elif case == "nan-pixels":
        floats = images.astype(np.float32)
        floats[3, 0, 2, :3] = np.nan
        floats[7, 0, 0, 0] = np.inf
        np.savez(path, images=floats, labels=labels)
    elif case == "stray-label":
        labels[5] = 1000
        write_npz(path, labels=labels)
    elif case == "one-class":
        write_npz(path, labels=np.zeros(40, dtype=np.int64))
    elif case == "negative-label":
        labels[0] = -1
        write_npz(path, labels=labels)
    elif case == "test-label-outside":
        write_npz(path, test_images=images[:6], test_labels=np.array([0, 1, 2, 3, 4, 0]))
    elif case == "string-pixels":
        np.savez(path, images=np.full((40, 8, 8), "x"), labels=labels)
    return path


NPZ_CASES = {
    "truncated": "as an .npz archive",
    "member-claims-more-than-stored": "but only",
    "member-claims-more-than-memory": "array 'images' (shape (62914560, 1, 8, 8), uint8) would need 3.8 GiB",
    "object-member": "holds Python objects",
    "nan-pixels": "4 non-finite pixel values",
    "stray-label": "label 1000 leaves a gap (no sample has label 4)",
    "one-class": "hold 1 class (every image has label 0)",
    "negative-label": "labels must be >= 0, found -1",
    "test-label-outside": "test label 4 is not among the training classes 0..3",
    "string-pixels": "integer or real pixel values",
}


@REFUSAL
@pytest.mark.parametrize("case", NPZ_CASES)
def test_bad_npz_datasets(refusals, case):
    refused(refusals, "npz", case)


# -- dataset files: IDX, .mat, downloads ------------------------------------------------------------
IDX_CASES = {
    # dimensions 2^31 x 2^31 x 2^31 overflow int64; the raw file holds 16 bytes
    "raw-overflow": ((2**31, 2**31, 2**31), bytes(16), False, "says 9,903,520,314,283,042,199,192,993,792 data bytes, file has 16"),
    "raw-short": ((20, 8, 8), bytes(100), False, "says 1,280 data bytes, file has 100"),
    "gz-huge": ((2**31, 8, 8), bytes(16), True, "would need 128 GiB"),
    "gz-short": ((20, 8, 8), bytes(100), True, "is truncated"),
}


@REFUSAL
@pytest.mark.parametrize("case", IDX_CASES)
def test_bad_idx_files(refusals, case):
    refused(refusals, "idx", case)


MAT_CASES = {"bomb": (48, 64 << 20, "decompresses to more than the 56 B it declares"),
             "tag-claims-gigabytes": (0xFFFF_FF00, 1 << 20, "would need 4 GiB")}


def _mat(tmp_path: Path, case: str) -> Path:
    declared, expands_to, _ = MAT_CASES[case]
    root = tmp_path / "data"
    (root / "svhn").mkdir(parents=True)
    for split in ("train", "test"):
        mat_bomb(root / "svhn" / f"{split}_32x32.mat", declared, expands_to)
    assert (root / "svhn" / "train_32x32.mat").stat().st_size < 200_000
    return root


@REFUSAL
@pytest.mark.parametrize("case", MAT_CASES)
def test_zlib_bomb_in_a_mat_file(refusals, case):
    refused(refusals, "mat", case)


class _Exploit:
    """Unpickled, it would run ``touch PATH``."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def _cifar_exploit(tmp_path: Path) -> Path:
    folder = tmp_path / "data" / "cifar10" / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for name in [f"data_batch_{k}" for k in range(1, 6)] + ["test_batch"]:
        (folder / name).write_bytes(pickle.dumps({b"data": _Exploit(tmp_path / "pwned"), b"labels": [0]}, protocol=2))
    return tmp_path / "data"


@REFUSAL
def test_code_in_a_cifar_pickle_is_refused(refusals):
    refused(refusals, "cifar", "exploit")
    folder = refusals[("cifar", "exploit")][0]
    assert not (folder / "pwned").exists()


# -- the refused runs, built and run once ---------------------------------------------------------------
def _refused_args(kind: str, case: str, folder: Path) -> tuple[list[str], str]:
    """The options of the refused run of ``case`` (its files built in ``folder``) and what its line says."""
    if kind == "size":
        problem, contains = SIZE_CASES[case]
        return ["--problem", problem], contains
    if kind == "spec":
        return list(SPEC_CASES[case][0]), SPEC_CASES[case][1]
    if kind == "trace":
        path = _trace(folder, case)
        return ["--problem", "ridge:dim=5,samples=10", "--participation", f"trace:path={path}"], TRACE_CASES[case]
    if kind == "npz":
        path = _npz(folder, case)
        spec = NN.replace("test_fraction=0.25", "test_fraction=0") if case == "test-label-outside" else NN
        return ["--problem", f"{spec},data={path}"], NPZ_CASES[case]
    if kind == "idx":
        dims, data, compress, contains = IDX_CASES[case]
        root = mnist_folder(folder / "data", train_images=(dims, data), compress=compress)
        return ["--problem", f"{NN},data=mnist,data_dir={root}"], contains
    if kind == "mat":
        return ["--problem", f"{NN},data=svhn,data_dir={_mat(folder, case)}"], MAT_CASES[case][2]
    assert kind == "cifar"
    return ["--problem", f"{NN},data=cifar10,data_dir={_cifar_exploit(folder)}"], "refusing to load"


REFUSED = [("size", case) for case in SIZE_CASES] + [("spec", case) for case in SPEC_CASES] + [("trace", case) for case in TRACE_CASES] + [
    ("npz", case) for case in NPZ_CASES] + [("idx", case) for case in IDX_CASES] + [
    ("mat", case) for case in MAT_CASES] + [("cifar", "exploit")]


@pytest.fixture(scope="module")
def refusals(tmp_path_factory) -> dict[tuple[str, str], tuple[Path, str, dict, dict]]:
    """Every case of REFUSED built in a folder of its own and run (``focusfl run ... --out
    FOLDER/out``): (kind, case) -> (its folder, what its line says, the folder's snapshot before,
    the command's result)."""
    root = tmp_path_factory.mktemp("refused")
    cases, commands = {}, []
    for k, (kind, case) in enumerate(REFUSED):
        folder = root / f"{kind}{k}"
        folder.mkdir()
        args, contains = _refused_args(kind, case, folder)
        cases[kind, case] = (folder, contains, snapshot(folder))
        commands.append((["run", "--algorithm", "focus", "--lr", "1e-4", "--rounds", "2", *args, "--out",
                          str(folder / "out")], [folder]))
    results = run_in_one_process(commands, root)
    return {key: (*cases[key], result) for key, result in zip(cases, results)}


def refused(refusals: dict, kind: str, case: str) -> str:
    """The refused run of ``case``: exit 2, one line, no traceback, nothing written anywhere
    under its folder (no OUT, no scratch folder beside it); returns the line."""
    folder, contains, before, result = refusals[kind, case]
    proc = subprocess.CompletedProcess(case, result["code"], result["stdout"], result["stderr"])
    line = assert_one_line_error(proc, code=2, contains=contains)
    assert not (folder / "out").exists()
    assert result["after"] == [before]
    return line


class _CutResponse:
    """A response whose body breaks after one chunk, as a dropped connection does."""

    def __init__(self, failure: BaseException):
        self.headers = {"Content-Length": "3000000"}
        self.failure = failure
        self.sent = False

    def read(self, size=-1):
        if not self.sent:
            self.sent = True
            return bytes(1000)
        raise self.failure

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize(
    "failure,contains",
    [
        (http.client.IncompleteRead(b"x" * 24, 2_999_000), "closed after 1,024 bytes (2,999,000 more expected)"),
        (ConnectionResetError(104, "Connection reset by peer"), "Connection reset by peer"),
        (TimeoutError("timed out"), "timed out"),
    ],
    ids=["incomplete-read", "reset", "timeout"],
)
def test_download_cut_short_is_one_line_and_leaves_no_partial_file(tmp_path, monkeypatch, failure, contains):
    monkeypatch.setattr(urllib.request, "urlopen", lambda request, timeout: _CutResponse(failure))
    remote = dl.RemoteFile("https://example.invalid/train.gz", "train.gz", "0" * 32)
    with pytest.raises(DataError) as info:
        dl.fetch(remote, tmp_path / "cache", progress=False)
    message = str(info.value)
    assert "\n" not in message and contains in message and "partial file was removed" in message
    assert list((tmp_path / "cache").iterdir()) == []


# -- user model import ------------------------------------------------------------------------------
@pytest.fixture
def user_models(tmp_path):
    """A package of the user's whose import leaves a marker file: shows whether its code ran."""
    package = tmp_path / "pkg"
    package.mkdir()
    marker = tmp_path / "imported"
    (package / "user_nets.py").write_text(textwrap.dedent(f"""
        from pathlib import Path
        from torch import nn
        Path({str(marker)!r}).write_text("ran")
        def tiny(input_shape, num_classes):
            return nn.Sequential(nn.Flatten(), nn.Linear(input_shape[1] * input_shape[2], num_classes))
    """))
    env = cli_env()
    env["PYTHONPATH"] += os.pathsep + str(package)
    return env, marker


def test_model_import_needs_the_flag_and_is_never_taken_from_a_config(tmp_path, user_models):
    env, marker = user_models
    data = tmp_path / "d.npz"
    write_npz(data)
    spec = f"{NN.replace('model=logreg', 'model=user_nets:tiny')},data={data}"
    run_refused(tmp_path, "--problem", spec, contains="model 'user_nets:tiny' would import and run Python code; "
                "pass --allow-model-import to allow it (never from a config file)", env=env)
    assert not marker.exists()

    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "algorithm": "focus", "problem": spec, "participation": "full", "rounds": 2, "seed": 0,
        "dtype": "float32", "device": "cpu", "engine": "vectorized", "eval_every": 1,
    }))
    run_refused(tmp_path, "--config", str(config), "--allow-model-import",
                contains="names model 'user_nets:tiny', which would import and run Python code", env=env)
    assert not marker.exists()

    out = tmp_path / "run"
    proc = run_cli("run", "--algorithm", "focus", "--lr", "1e-4", "--rounds", "2", "--problem", spec,
                   "--allow-model-import", "--out", str(out), env=env)
    assert proc.returncode == 0, proc.stderr
    assert marker.exists() and (out / "metrics.csv").is_file()

    # Resuming the run of a user's model: only with the command line's permission.
    marker.unlink()
    proc = run_cli("run", "--resume", str(out), "--rounds", "4", env=env)
    assert_one_line_error(proc, 2, f"to resume a run of your own model, give --resume {out} --allow-model-import")
    rows = read_csv(out / "metrics.csv")
    assert not marker.exists() and rows[-1]["round"] == "2"
    proc = run_cli("run", "--resume", str(out), "--rounds", "4", "--allow-model-import", env=env)
    assert proc.returncode == 0, proc.stderr
    resumed = read_csv(out / "metrics.csv")
    # Round 2 was the 2-round run's closing row (off the every-50 cadence): the run continued to 4
    # drops it, as the uninterrupted 4-round run never writes it (issue 27).
    assert marker.exists() and resumed[:len(rows) - 1] == rows[:-1] and resumed[-1]["round"] == "4"


def test_model_import_opt_in_is_a_library_keyword(tmp_path, monkeypatch):
    (tmp_path / "lib_nets.py").write_text(
        "from torch import nn\ndef tiny(num_classes):\n    return nn.Sequential(nn.Flatten(), nn.LazyLinear(num_classes))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match="--allow-model-import"):
        make_model("lib_nets:tiny", (1, 8, 8), 4)
    assert "lib_nets" not in sys.modules
    assert make_model("lib_nets:tiny", (1, 8, 8), 4, allow_import=True) is not None
    sys.modules.pop("lib_nets", None)
    data = write_npz(tmp_path / "d.npz")
    with pytest.raises(ConfigError, match="would import"):
        make_problem(f"{NN.replace('model=logreg', 'model=lib_nets:tiny')},data={data}")
    refuse_model_import("nn:model=mlp", "config x")  # zoo names are fine
    for spec in ("nn:model=os:system", {"name": "nn", "model": "custom:Net"}):
        with pytest.raises(ConfigError, match="config x names model"):
            refuse_model_import(spec, "config x")


# -- library level: focusfl.limits ------------------------------------------------------------------
def test_human_bytes():
    assert limits.human_bytes(17) == "17 B"
    assert limits.human_bytes(16 * 10**8 * 50 * 8) == "596 GiB"
    assert limits.human_bytes(3.9 * GIB) == "3.9 GiB"
    assert limits.human_bytes(12.25 * 2**20) == "12.2 MiB"
    assert limits.human_bytes(2**70) == "1 ZiB"


def test_check_allocation_names_the_size_and_what_needs_it(monkeypatch):
    monkeypatch.setattr(limits, "available_bytes", lambda: int(3.9 * GIB))
    limits.check_allocation(3 * GIB, "fits")
    with pytest.raises(DataError) as info:
        limits.check_allocation(16 * 10**8 * 50 * 8, "ridge problem: 16 clients x 10^8 samples x 50 features")
    assert str(info.value) == (
        "ridge problem: 16 clients x 10^8 samples x 50 features would need 596 GiB, "
        "more than the 3.9 GiB of memory available"
    )
    with pytest.raises(ConfigError):
        limits.check_allocation(4 * GIB, "x", error=ConfigError)


def test_available_bytes_respects_the_address_space_limit():
    code = "from focusfl.limits import available_bytes; print(available_bytes())"

    def limited():
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (GIB, GIB))

    free = subprocess.run([sys.executable, "-c", code], env=cli_env(), capture_output=True, text=True,
                          preexec_fn=limited, check=True)
    assert 0 < int(free.stdout) < GIB
    assert limits.available_bytes() > 0


def test_inflate_stops_at_the_cap():
    stream = zlib.compress(bytes(10 << 20))
    assert len(stream) < 20_000
    assert limits.inflate(stream, 10 << 20, "exact") == bytes(10 << 20)
    with pytest.raises(DataError, match="decompresses to more than the 1 MiB"):
        limits.inflate(stream, 1 << 20, "bomb")
    with pytest.raises(DataError, match="not a valid zlib stream"):
        limits.inflate(b"junk", 100, "junk")


def test_npy_header_is_checked_before_the_array_is_allocated(monkeypatch):
    good = io.BytesIO()
    np.save(good, np.arange(12, dtype=">i4").reshape(3, 4).T)  # big-endian, Fortran order
    header = limits.read_npy_header(io.BytesIO(good.getvalue()), len(good.getvalue()), "a")
    assert header.shape == (4, 3) and header.nbytes == 48
    stream = io.BytesIO(good.getvalue())
    limits.read_npy_header(stream, len(good.getvalue()), "a")
    array = limits.read_npy_data(stream, header, "a")
    assert np.array_equal(array, np.arange(12).reshape(3, 4).T) and array.dtype.isnative
    with pytest.raises(DataError, match="only 47 B follow it"):
        limits.read_npy_header(io.BytesIO(good.getvalue()[:-1]), len(good.getvalue()) - 1, "a")
    monkeypatch.setattr(limits, "available_bytes", lambda: 40)
    with pytest.raises(DataError, match=r"a \(shape \(4, 3\), >i4\) would need 48 B, more than the 40 B"):
        limits.read_npy_data(io.BytesIO(good.getvalue()[len(npy_header((4, 3), ">i4")):]), header, "a")
    with pytest.raises(DataError, match="not a readable .npy"):
        limits.read_npy_header(io.BytesIO(b"\x93NUMPY\x01\x00\x10\x00{'descr': 1}    \n"), 100, "a")


# -- library level: data checks ---------------------------------------------------------------------
def test_pixel_and_label_checks():
    check_pixels(np.zeros((2, 1, 2, 2), dtype=np.uint8))
    floats = np.zeros((5000, 1, 2, 2), dtype=np.float16)
    floats[0, 0, 0, 0], floats[4999, 0, 1, 1] = np.nan, -np.inf  # in different chunks
    with pytest.raises(DataError, match="^2 non-finite pixel values"):
        check_pixels(floats)
    with pytest.raises(DataError, match="integer or real"):
        check_pixels(np.zeros((1, 1, 1, 1), dtype=complex))
    with pytest.raises(DataError, match="integers"):
        check_labels(np.array([0.0, 1.0]))
    with pytest.raises(DataError, match="found -3"):
        ImageData(np.zeros((2, 1, 2, 2)), np.array([-3, 1]))


def test_class_checks():
    images, labels = tiny_images(classes=4)
    train = ImageData(images, labels)
    assert infer_classes(labels, "f") == 4
    with pytest.raises(DataError, match="label 1000 leaves a gap"):
        infer_classes(np.append(labels, 1000), "f")
    with pytest.raises(DataError, match="label 5 leaves a gap .no sample has label 4."):
        infer_classes(np.array([0, 1, 2, 3, 5, 6]), "f")
    check_classes("ok", train, None, 10)  # a known class count may exceed the labels present
    with pytest.raises(DataError, match="label 3 is outside its 3 classes 0..2"):
        Dataset("d", train, None, 3)
    with pytest.raises(DataError, match="at least two"):
        Dataset("d", train, None, 1)
    with pytest.raises(DataError, match="test label 7"):
        Dataset("d", train, ImageData(images[:2], np.array([0, 7])), 4)


def test_npz_may_declare_its_class_count(tmp_path):
    images, labels = tiny_images(classes=4)
    labels[labels == 2] = 5  # classes 2 and 4 have no image
    write_npz(tmp_path / "d.npz", labels=labels, num_classes=np.array(6))
    assert load_dataset(str(tmp_path / "d.npz")).num_classes == 6
    write_npz(tmp_path / "small.npz", labels=labels, num_classes=np.array(5))
    with pytest.raises(DataError, match="label 5 is outside its 5 classes"):
        load_dataset(str(tmp_path / "small.npz"))
    write_npz(tmp_path / "many.npz", num_classes=np.array(10**9))
    with pytest.raises(DataError, match="more than its 40 training images"):
        load_dataset(str(tmp_path / "many.npz"))
    train, test, declared = read_npz_dataset(MNIST1500)
    assert declared is None and test is None and len(train) == 1500


def test_cifar_pickle_footprint_is_checked_before_unpickling(tmp_path, monkeypatch):
    path = tmp_path / "data_batch_1"
    batch = {b"data": np.zeros((4, 3072), dtype=np.uint8), b"labels": [0, 1, 2, 3]}
    path.write_bytes(pickle.dumps(batch, protocol=2))
    with open(path, "rb") as handle:
        footprint = pickle_footprint(handle)
    assert 3 * 4 * 3072 < footprint < 20 * 4 * 3072
    assert len(read_cifar_batch(path, b"labels")) == 4
    monkeypatch.setattr(limits, "available_bytes", lambda: footprint - 1)
    with pytest.raises(DataError, match="cannot read CIFAR batch .*: unpickling it would need"):
        read_cifar_batch(path, b"labels")
    # One-byte opcodes that each build a list: memory far beyond the file's size.
    bomb = tmp_path / "bomb"
    bomb.write_bytes(b"\x80\x02]" + b"]a" * 200_000 + b".")
    monkeypatch.setattr("focusfl.data.loaders.MAX_PICKLE_OPCODES", 100_000)
    with pytest.raises(DataError, match="more than 100,000 opcodes"):
        read_cifar_batch(bomb, b"labels")


def test_trace_checks_in_process(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("1,0,1\n1,0,1\n")
    with pytest.raises(DataError, match="client 1 never takes part in the 2 recorded rounds.*absent=true"):
        make_participation(f"trace:path={path}", 3)
    # absent=true: the recording as it is (a federation's realised trace), and so recorded
    kept = make_participation(f"trace:path={path},absent=true", 3)
    assert kept.active_sets(0, 2)[1].tolist() == [0, 2] and kept.describe()["absent"] is True
    assert make_participation(kept.describe(), 3).describe() == kept.describe()
    with pytest.raises(ConfigError, match="absent='yes' is not a valid bool"):
        make_participation({"name": "trace", "path": str(path), "absent": "yes"}, 3)
    path.write_text("1,1,1\n1,0,1\n")
    assert make_participation(f"trace:path={path}", 3).recorded_rounds == 2
    assert "absent" not in make_participation(f"trace:path={path}", 3).describe()  # run keys as before

"""Dataset readers (IDX, CIFAR pickles, SVHN .mat, .npz), lookup and checksum-verified downloads.

Fixtures are tiny files written into tmp_path in each standard format; downloads are served by
a local HTTP server on 127.0.0.1, never the internet. 1,500 real MNIST digits committed in
tests/fixtures/mnist1500.npz check the .npz path on real data.
"""
from __future__ import annotations

import gzip
import hashlib
import http.server
import pickle
import struct
import tarfile
import threading
from pathlib import Path

import numpy as np
import pytest

from focusfl.data import DATASETS, load_dataset
from focusfl.data import download as dl
from focusfl.data.loaders import read_cifar_batch, read_idx, read_mat, read_npz
from focusfl.errors import ConfigError, DataError

# Real MNIST digits committed with the tests (see tests/fixtures/README.md).
REAL_MNIST = Path(__file__).resolve().parent / "fixtures" / "mnist1500.npz"
IDX_NAMES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


# -- fixture writers ----------------------------------------------------------------------------
def idx_bytes(array: np.ndarray) -> bytes:
    codes = {np.dtype(np.uint8): 0x08, np.dtype(">i4"): 0x0C, np.dtype(">f4"): 0x0D}
    header = bytes([0, 0, codes[array.dtype], array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.tobytes()


def write_idx_dataset(folder: Path, rng, train=12, test=5, compress=True) -> dict[str, np.ndarray]:
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {
        IDX_NAMES[0]: rng.integers(0, 256, (train, 28, 28), dtype=np.uint8),
        IDX_NAMES[1]: rng.integers(0, 10, train).astype(np.uint8),
        IDX_NAMES[2]: rng.integers(0, 256, (test, 28, 28), dtype=np.uint8),
        IDX_NAMES[3]: rng.integers(0, 10, test).astype(np.uint8),
    }
    for name, array in arrays.items():
        data = idx_bytes(array)
        if compress:
            (folder / f"{name}.gz").write_bytes(gzip.compress(data))
        else:
            (folder / name).write_bytes(data)
    return arrays


def write_cifar_batch(path: Path, images: np.ndarray, labels: np.ndarray, key: bytes) -> None:
    with open(path, "wb") as handle:
        batch = {b"data": images.reshape(len(images), -1), key: labels.tolist(), b"batch_label": b"x"}
        pickle.dump(batch, handle, protocol=2)


def write_cifar10(folder: Path, rng, per_batch=3) -> tuple[np.ndarray, np.ndarray]:
    base = folder / "cifar-10-batches-py"
    base.mkdir(parents=True)
    images = rng.integers(0, 256, (6 * per_batch, 3, 32, 32), dtype=np.uint8)
    labels = rng.integers(0, 10, 6 * per_batch)
    names = [f"data_batch_{k}" for k in range(1, 6)] + ["test_batch"]
    for k, name in enumerate(names):
        part = slice(k * per_batch, (k + 1) * per_batch)
        write_cifar_batch(base / name, images[part], labels[part], b"labels")
    return images, labels


# -- IDX -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("compress", [True, False])
def test_mnist_idx_raw_and_gz(tmp_path, compress):
    arrays = write_idx_dataset(tmp_path / "mnist", np.random.default_rng(0), compress=compress)
    data = load_dataset("mnist", data_dir=tmp_path)
    assert data.num_classes == 10
    assert data.train.images.shape == (12, 1, 28, 28) and data.train.images.dtype == np.uint8
    assert np.array_equal(data.train.images[:, 0], arrays[IDX_NAMES[0]])
    assert np.array_equal(data.test.labels, arrays[IDX_NAMES[3]].astype(np.int64))


def test_fashion_mnist_in_torchvision_layout(tmp_path):
    arrays = write_idx_dataset(tmp_path / "FashionMNIST" / "raw", np.random.default_rng(1))
    data = load_dataset("fashion-mnist", data_dir=tmp_path)
    assert np.array_equal(data.train.labels, arrays[IDX_NAMES[1]])


def test_idx_rejects_bad_magic_and_truncation(tmp_path):
    good = idx_bytes(np.zeros((2, 3), dtype=np.uint8))
    (tmp_path / "bad").write_bytes(b"\x01\x02" + good[2:])
    (tmp_path / "short").write_bytes(good[:-1])
    (tmp_path / "floats").write_bytes(idx_bytes(np.arange(4, dtype=">f4")))
    with pytest.raises(DataError, match="magic"):
        read_idx(tmp_path / "bad")
    with pytest.raises(DataError, match="data bytes"):
        read_idx(tmp_path / "short")
    assert read_idx(tmp_path / "floats").tolist() == [0.0, 1.0, 2.0, 3.0]


# -- CIFAR ---------------------------------------------------------------------------------------
def test_cifar10_batches(tmp_path):
    images, labels = write_cifar10(tmp_path / "cifar10", np.random.default_rng(2))
    data = load_dataset("cifar10", data_dir=tmp_path)
    assert data.train.images.shape == (15, 3, 32, 32)
    assert np.array_equal(data.train.images, images[:15])
    assert np.array_equal(data.test.labels, labels[15:])


def test_cifar10_archive_is_unpacked(tmp_path):
    source = tmp_path / "src"
    images, _ = write_cifar10(source, np.random.default_rng(3))
    target = tmp_path / "data" / "cifar10"
    target.mkdir(parents=True)
    with tarfile.open(target / "cifar-10-python.tar.gz", "w:gz") as tar:
        tar.add(source / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    data = load_dataset("cifar10", data_dir=tmp_path / "data")
    assert np.array_equal(data.test.images, images[15:])


def test_cifar100_fine_labels(tmp_path):
    base = tmp_path / "cifar-100-python"
    base.mkdir()
    rng = np.random.default_rng(4)
    for name, count in (("train", 7), ("test", 3)):
        write_cifar_batch(base / name, rng.integers(0, 256, (count, 3, 32, 32), dtype=np.uint8),
                          rng.integers(0, 100, count), b"fine_labels")
    data = load_dataset("cifar100", data_dir=tmp_path)
    assert data.num_classes == 100 and len(data.train) == 7 and len(data.test) == 3


def test_cifar_loader_refuses_code_in_pickles(tmp_path):
    class Exploit:
        def __reduce__(self):
            return (print, ("owned",))

    with open(tmp_path / "data_batch_1", "wb") as handle:
        pickle.dump({b"data": Exploit(), b"labels": [1]}, handle)
    with pytest.raises(DataError, match="refusing"):
        read_cifar_batch(tmp_path / "data_batch_1", b"labels")


# -- SVHN .mat -----------------------------------------------------------------------------------
@pytest.mark.parametrize("compressed", [True, False])
def test_svhn_mat_files(tmp_path, compressed):
    scipy_io = pytest.importorskip("scipy.io")
    rng = np.random.default_rng(5)
    expected = {}
    for split, count in (("train", 6), ("test", 4)):
        images = rng.integers(0, 256, (count, 3, 32, 32), dtype=np.uint8)
        digits = rng.integers(0, 10, count)
        digits[0] = 0
        stored = np.where(digits == 0, 10, digits).astype(np.float64)[:, None]  # SVHN: 10 means 0
        scipy_io.savemat(tmp_path / f"{split}_32x32.mat", {"X": np.transpose(images, (2, 3, 1, 0)), "y": stored},
                         do_compression=compressed)
        expected[split] = (images, digits)
    data = load_dataset("svhn", data_dir=tmp_path)
    assert np.array_equal(data.train.images, expected["train"][0])
    assert np.array_equal(data.test.labels, expected["test"][1])


def test_mat_reader_reads_types_and_rejects_other_files(tmp_path):
    scipy_io = pytest.importorskip("scipy.io")
    values = {"a": np.arange(6, dtype=np.int16).reshape(2, 3), "b": np.array([[1.5, -2.0]])}
    scipy_io.savemat(tmp_path / "v.mat", values)
    read = read_mat(tmp_path / "v.mat")
    assert np.array_equal(read["a"], values["a"]) and np.array_equal(read["b"], values["b"])
    (tmp_path / "h5.mat").write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(200))
    with pytest.raises(DataError, match="v7.3"):
        read_mat(tmp_path / "h5.mat")


# -- .npz ----------------------------------------------------------------------------------------
def test_real_mnist_npz():
    data = load_dataset(str(REAL_MNIST))
    assert data.train.images.shape == (1500, 1, 28, 28) and data.test is None
    assert data.num_classes == 10
    assert np.bincount(data.train.labels).tolist() == [150] * 10
    assert data.train.images.dtype == np.uint8 and data.train.images.max() == 255


def test_npz_layouts_and_test_split(tmp_path):
    rng = np.random.default_rng(6)
    nhwc = rng.integers(0, 256, (5, 8, 8, 3), dtype=np.uint8)
    np.savez(tmp_path / "d.npz", images=nhwc, labels=np.arange(5), test_images=nhwc[:2], test_labels=np.array([4, 1]))
    train, test = read_npz(tmp_path / "d.npz")
    assert train.images.shape == (5, 3, 8, 8)
    assert np.array_equal(train.images[:, 1], nhwc[..., 1])
    assert test.labels.tolist() == [4, 1]
    data = load_dataset("d.npz", data_dir=tmp_path)  # relative names are looked up in data_dir
    assert data.num_classes == 5


def test_npz_errors(tmp_path):
    np.savez(tmp_path / "nolabels.npz", images=np.zeros((2, 4, 4)))
    np.savez(tmp_path / "floatlabels.npz", images=np.zeros((2, 4, 4)), labels=np.array([0.5, 1.0]))
    with pytest.raises(DataError, match="'images' and 'labels'"):
        load_dataset(str(tmp_path / "nolabels.npz"))
    with pytest.raises(DataError, match="integer"):
        load_dataset(str(tmp_path / "floatlabels.npz"))
    with pytest.raises(DataError, match="not found"):
        load_dataset(str(tmp_path / "absent.npz"))


# -- lookup errors -------------------------------------------------------------------------------
def test_missing_dataset_says_which_files_go_where(tmp_path):
    with pytest.raises(DataError) as info:
        load_dataset("mnist", data_dir=tmp_path)
    message = str(info.value)
    assert "\n" not in message
    assert "train-images-idx3-ubyte.gz" in message and str(tmp_path / "mnist") in message
    assert "--download" in message
    with pytest.raises(DataError, match="cifar-10-python.tar.gz"):
        load_dataset("cifar10", data_dir=tmp_path)


def test_unknown_dataset_lists_the_known_ones():
    with pytest.raises(ConfigError, match="known: mnist"):
        load_dataset("imagenet")
    assert set(DATASETS) == {"mnist", "fashion-mnist", "cifar10", "cifar100", "svhn"}


def test_default_folder_follows_environment(tmp_path, monkeypatch):
    write_idx_dataset(tmp_path / "mnist", np.random.default_rng(7))
    monkeypatch.setenv("FOCUSFL_DATA", str(tmp_path))
    assert len(load_dataset("mnist").train) == 12


# -- downloads against a local server ------------------------------------------------------------
@pytest.fixture
def server(tmp_path):
    """Serves tmp_path/www on 127.0.0.1; yields the base URL."""
    root = tmp_path / "www"
    root.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(root), **kwargs)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/", root
    httpd.shutdown()
    httpd.server_close()


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def mnist_sources(base: str, files: dict[str, bytes]) -> dict:
    return {"mnist": tuple(dl.RemoteFile(base + name, name, md5(data)) for name, data in files.items())}


def served_mnist(root: Path) -> dict[str, bytes]:
    arrays = write_idx_dataset(root, np.random.default_rng(8))
    return {f"{name}.gz": (root / f"{name}.gz").read_bytes() for name in arrays}


def test_download_verifies_and_loads(server, tmp_path, monkeypatch):
    base, root = server
    files = served_mnist(root)
    monkeypatch.setitem(dl.SOURCES, "mnist", mnist_sources(base, files)["mnist"])
    data = load_dataset("mnist", data_dir=tmp_path / "cache", download_missing=True)
    assert len(data.train) == 12
    assert sorted(p.name for p in (tmp_path / "cache" / "mnist").iterdir()) == sorted(files)


def test_corrupted_download_is_rejected_and_removed(server, tmp_path):
    base, root = server
    files = served_mnist(root)
    sources = mnist_sources(base, files)
    name = IDX_NAMES[0] + ".gz"
    (root / name).write_bytes(files[name][:-10] + b"corrupted!")  # the server now sends other bytes
    target = tmp_path / "cache"
    with pytest.raises(DataError, match="corrupted"):
        dl.download_dataset("mnist", target, sources=sources, progress=False)
    assert not (target / name).exists()
    assert not any(p.name.endswith(".part") for p in target.iterdir())


def test_unreachable_file_is_a_data_error(server, tmp_path):
    base, _ = server
    sources = {"mnist": (dl.RemoteFile(base + "missing.gz", "missing.gz", "0" * 32),)}
    with pytest.raises(DataError, match="cannot download"):
        dl.download_dataset("mnist", tmp_path, sources=sources, progress=False)


def test_download_unpacks_archives(server, tmp_path):
    base, root = server
    write_cifar10(tmp_path / "src", np.random.default_rng(9))
    with tarfile.open(root / "cifar-10-python.tar.gz", "w:gz") as tar:
        tar.add(tmp_path / "src" / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    digest = md5((root / "cifar-10-python.tar.gz").read_bytes())
    sources = {"cifar10": (dl.RemoteFile(base + "cifar-10-python.tar.gz", "cifar-10-python.tar.gz", digest),)}
    dl.download_dataset("cifar10", tmp_path / "cache", sources=sources, progress=False)
    assert (tmp_path / "cache" / "cifar-10-batches-py" / "test_batch").is_file()


def test_canonical_sources_cover_every_dataset():
    assert set(dl.SOURCES) == set(DATASETS)
    for remotes in dl.SOURCES.values():
        for remote in remotes:
            assert remote.url.startswith(("https://", "http://")) and len(remote.md5) == 32


def test_cli_download_end_to_end(server, tmp_path, monkeypatch, capsys):
    from focusfl.cli import main

    base, root = server
    files = served_mnist(root)
    monkeypatch.setitem(dl.SOURCES, "mnist", mnist_sources(base, files)["mnist"])
    out = tmp_path / "run"
    argv = ["run", "--algorithm", "sg_focus", "--problem", "nn:data=mnist,model=logreg,partition=iid,clients=2,batch=4",
            "--data-dir", str(tmp_path / "cache"), "--rounds", "2", "--lr", "0.01", "--out", str(out)]
    assert main(argv) == 2  # without --download: the one-line "not found" error
    assert "not found" in capsys.readouterr().err
    assert main(argv + ["--download"]) == 0
    assert (tmp_path / "cache" / "mnist" / "t10k-labels-idx1-ubyte.gz").is_file()
    assert (out / "metrics.csv").is_file()


def test_an_oversized_download_is_stopped_and_removed(server, tmp_path, monkeypatch):
    base, root = server
    files = served_mnist(root)
    sources = mnist_sources(base, files)
    target = tmp_path / "cache"
    monkeypatch.setattr(dl, "MAX_DOWNLOAD_BYTES", 16)  # announced by Content-Length: refused at once
    with pytest.raises(DataError, match="more than the published file"):
        dl.download_dataset("mnist", target, sources=sources, progress=False)
    monkeypatch.setattr(dl, "_room", lambda out, remote, announced: 16)  # a server that keeps sending
    with pytest.raises(DataError, match="sent more than 16 bytes"):
        dl.download_dataset("mnist", target, sources=sources, progress=False)
    assert list(target.iterdir()) == []

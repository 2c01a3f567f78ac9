"""The FedSUM paper's appendix-H presets beyond fedsum-mnist: ``reproduce fedsum-resnet18``
(H.6, ResNet-18 on CIFAR-10/100) and ``reproduce fedsum-biased`` (H.8, biased sampling).

Each runs end to end at toy size: fedsum-biased through the console script on MNIST files made
from the committed digits (its 100 clients and small CNN fit a test); fedsum-resnet18 on a
generated CIFAR-100 folder, through ``main`` with the problem shrunk to 4 clients (50 clients of
ResNet-18 state do not fit a test on a CPU), as the focus-cifar10 test does.
"""
from __future__ import annotations

import csv
import dataclasses
import json
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
from torch import nn

from cli_harness import assert_one_line_error, run_cli, run_main
from focusfl.cli import main
from focusfl.reproduce import reproduce_nn
from focusfl.participation import make_participation
from focusfl.problems.models import make_model, prepare_for_clients

REAL_MNIST = Path(__file__).resolve().parent / "fixtures" / "mnist1500.npz"


def read_rows(path: Path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def write_mnist_idx(folder: Path) -> None:
    """The committed digits as MNIST IDX files: every 6th digit for test (the fixture is sorted by
    label, so a contiguous cut would leave the test set two classes)."""
    digits = np.load(REAL_MNIST)
    test = np.arange(len(digits["labels"])) % 6 == 0
    folder.mkdir(parents=True)
    arrays = {"train-images-idx3-ubyte": digits["images"][~test], "train-labels-idx1-ubyte": digits["labels"][~test],
              "t10k-images-idx3-ubyte": digits["images"][test], "t10k-labels-idx1-ubyte": digits["labels"][test]}
    for name, array in arrays.items():
        header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
        (folder / name).write_bytes(header + array.astype(np.uint8).tobytes())


def write_cifar100(folder: Path, train: int = 40, test: int = 10) -> None:
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    for name, count in (("train", train), ("test", test)):
        batch = {b"data": rng.integers(0, 256, (count, 3072), dtype=np.uint8),
                 b"fine_labels": rng.integers(0, 100, count).tolist()}
        with open(folder / name, "wb") as handle:
            pickle.dump(batch, handle, protocol=2)


# -- the settings -----------------------------------------------------------------------------------
def test_fedsum_resnet18_is_the_papers_h6_setting_on_both_datasets():
    setups = reproduce_nn.FEDSUM_RESNET18
    assert list(setups) == ["cifar10", "cifar100"]
    for dataset, setup in setups.items():
        problem = setup.problem
        assert (problem["data"], problem["model"], problem["clients"], problem["batch"], problem["partition"]) == \
            (dataset, "resnet18-gn", 50, 32, "dirichlet")
        assert list(setup.scenarios.values()) == ["uniform:m=10"]  # 10 of 50 sampled at random
        assert list(setup.algorithms) == ["fedsum", "fedavg", "scaffold"]
        assert all(h["local_steps"] == 10 for h in setup.algorithms.values())
        assert any("our choice" in note for note in setup.notes)
    # One command line serves both: everything but the data set and the title is shared.
    first, second = setups.values()
    assert dataclasses.replace(second, title=first.title, problem={**second.problem, "data": "cifar10"}) == first


def test_the_resnet18_has_group_norm_and_trains_per_client():
    model = make_model("resnet18-gn", (3, 32, 32), 100)
    layers = list(model.modules())
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in layers)
    assert sum(isinstance(m, nn.GroupNorm) for m in layers) == 20  # stem, 16 in the blocks, 3 shortcuts
    assert model.head.out_features == 100
    prepare_for_clients(model)  # refuses batch norm with running statistics; this one passes


def test_fedsum_biased_rates_are_the_papers_bands():
    setup = reproduce_nn.FEDSUM_BIASED
    assert list(setup.algorithms) == ["fedsum", "fedavg"] and setup.problem["clients"] == 100
    (spec,) = setup.scenarios.values()
    p = make_participation(spec, 100, seed=0).nominal_p()
    # Clients 1-11 (indices 0-10) at 0.5, 12-22 at 0.45, 23-33 at 0.4, ..., client 100 at 0.05.
    expected = [0.5 - 0.05 * (i // 11) for i in range(100)]
    assert np.allclose(p, expected, rtol=0, atol=1e-12)
    assert p[0] == p[10] == 0.5 and p[11] == 0.45 and abs(p[22] - 0.4) < 1e-12 and abs(p[99] - 0.05) < 1e-12


# -- the command lines --------------------------------------------------------------------------------
@pytest.mark.parametrize("preset,needle", [("fedsum-resnet18", "--dataset {cifar10,cifar100}"),
                                           ("fedsum-biased", "--data-dir")])
def test_the_presets_help(preset, needle):
    proc = run_main("reproduce", preset, "--help")
    assert proc.returncode == 0, proc.stderr
    assert needle in proc.stdout and "examples:" in proc.stdout


def test_fedsum_biased_runs_end_to_end_at_toy_size(tmp_path):
    # As a user types it: steps tuned on the validation share (4 grid points per algorithm, extended past
    # an end by the search rule), then
    # the runs, on 100 clients of the committed digits.
    write_mnist_idx(tmp_path / "data" / "mnist")
    out = tmp_path / "biased"
    proc = run_cli("reproduce", "fedsum-biased", "--data-dir", str(tmp_path / "data"), "--rounds", "2",
                   "--eval-every", "1", "--tune-rounds", "1", "--seeds", "1",
                   "--workers", "1", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "H.8 names no data set or model" in proc.stdout and "final acc" in proc.stdout
    summary = read_rows(out / "summary.csv")
    assert [row["algorithm"] for row in summary] == ["fedsum", "fedavg"]
    assert all(row["status"] == "complete" and row["steps"] == "tuned" and row["rounds"] == "2" for row in summary)
    steps = read_rows(out / "steps.csv")
    # The 4 grid points, and the steps the search added past an end (the reason says which)
    assert all(len(row["grid"].split(";")) == 4 + len([s for s in row["added_steps"].split(";") if s])
               and row["reason"] for row in steps)
    tag = "banded-width-11-top-0-5-step-0-05"
    assert (out / f"figure_{tag}.png").is_file() and (out / f"tuning-{tag}" / "grid.csv").is_file()
    for run in (out / f"runs-{tag}" / "runs").iterdir():
        config = json.loads((run / "config.json").read_text())
        assert config["participation"]["name"] == "banded" and config["problem"]["clients"] == 100
        assert config["schedule"] == "sqrt" and config["algorithm"]["local_steps"] == 10
        active = [int(row["active"]) for row in read_rows(run / "metrics.csv")[1:]]
        assert all(10 <= a <= 50 for a in active)  # about 29 of 100 expected


def test_fedsum_resnet18_runs_cifar100_end_to_end_at_toy_size(tmp_path, monkeypatch, capsys):
    # The command line as typed (--dataset picks CIFAR-100 and the default folder
    # runs/fedsum-resnet18-cifar100); the problem shrunk to 4 clients of 10 images, 2 of them per
    # round, 2 local steps of batch 2: ResNet-18 itself, 100 classes, every algorithm.
    write_cifar100(tmp_path / "data" / "cifar100" / "cifar-100-python")
    monkeypatch.chdir(tmp_path)
    real = reproduce_nn.run_preset
    seen = {}

    def shrunk(setup, spec, algorithms, args, folder):
        seen.update(setup=setup, folder=folder)
        small = dataclasses.replace(setup, scenarios={"uniform, 2 of 4": "uniform:m=2"},
                                    algorithms={a: {**h, "local_steps": 2} for a, h in setup.algorithms.items()})
        return real(small, {**spec, "clients": 4, "min_size": 2, "batch": 2}, algorithms, args, folder)

    monkeypatch.setattr(reproduce_nn, "run_preset", shrunk)
    code = main(["reproduce", "fedsum-resnet18", "--dataset", "cifar100", "--data-dir", "data", "--rounds", "2",
                 "--eval-every", "1", "--steps", "fixed", "--seeds", "1", "--workers", "1"])
    assert code == 0
    assert seen["setup"] is reproduce_nn.FEDSUM_RESNET18["cifar100"]
    assert seen["folder"] == Path("runs/fedsum-resnet18-cifar100")
    assert "GroupNorm" in capsys.readouterr().out  # the notes say what is ours
    out = tmp_path / "runs" / "fedsum-resnet18-cifar100"
    summary = read_rows(out / "summary.csv")
    assert [row["algorithm"] for row in summary] == ["fedsum", "fedavg", "scaffold"]
    assert all(row["status"] == "complete" and 0 <= float(row["final_test_accuracy"]) <= 1 for row in summary)
    config = json.loads(next((out / "runs-uniform-m-2" / "runs").glob("*/config.json")).read_text())
    assert (config["problem"]["data"], config["problem"]["model"]) == ("cifar100", "resnet18-gn")


def test_fedsum_resnet18_without_its_data_is_one_line_and_writes_nothing(tmp_path):
    proc = run_cli("reproduce", "fedsum-resnet18", "--dataset", "cifar100", "--data-dir", str(tmp_path / "none"),
                   "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert_one_line_error(proc, 2, "cifar100 not found")
    assert not (tmp_path / "out").exists() and not (tmp_path / "runs").exists()

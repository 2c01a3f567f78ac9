"""``focusfl reproduce fedsum-sst2``: the FedSUM paper's appendix H.7 (BERT on SST-2) on the
user's local folders, at toy size: the tiny random BERT of tests/hf_fixtures.py and a 96-row
SST-2-shaped dataset (columns sentence/label/idx; splits train, validation and an unlabelled
test), as a save_to_disk folder and as the Hub's parquet files. Nothing is downloaded.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("datasets")
pytest.importorskip("transformers")

from cli_harness import assert_one_line_error, run_cli  # noqa: E402
from hf_fixtures import sst2_dataset, tiny_bert, tokenizer_folder  # noqa: E402

from focusfl.reproduce import reproduce_nn  # noqa: E402
from focusfl.problems import make_problem  # noqa: E402


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """SST-2 twice (save_to_disk, parquet) and a model folder holding the tiny BERT and its tokenizer."""
    root = tmp_path_factory.mktemp("sst2")
    sst2_dataset(root / "sst2")
    sst2_dataset(root / "sst2-parquet", parquet=True)
    tokenizer_folder(root / "bert")
    tiny_bert(root / "bert")
    return root


def read_rows(path: Path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_fedsum_sst2_is_the_papers_h7_setting():
    setup = reproduce_nn.FEDSUM_SST2
    problem = setup.problem
    assert (problem["clients"], problem["partition"], problem["batch"]) == (8, "iid", 4)
    assert (problem["input"], problem["label"], problem["test_split"]) == ("sentence", "label", "validation")
    assert list(setup.scenarios.values()) == ["uniform:m=2"]  # 2 of 8 sampled at random
    assert list(setup.algorithms) == ["fedsum", "fedavg"]  # SCAFFOLD and FedSUM-CR did not converge
    assert all(h["local_steps"] == 3 for h in setup.algorithms.values())
    assert setup.schedule == "constant" and "weight_decay" not in str(setup.algorithms)
    notes = " ".join(setup.notes)
    assert "do not converge" in notes and "our choice" in notes and "validation split" in notes


def test_both_folder_forms_give_the_same_problem_with_8_equal_iid_clients(folders):
    specs = [reproduce_nn.sst2_spec(reproduce_nn.FEDSUM_SST2,
                                    reproduce_nn.PresetOptions(out="x", data=str(folders / data),
                                                               model=str(folders / "bert")))
             for data in ("sst2", "sst2-parquet")]
    problems = [make_problem({**spec, "min_size": 1}) for spec in specs]
    assert problems[0].data_fingerprint() == problems[1].data_fingerprint()
    rows = problems[0].client_rows()
    assert sorted(len(r) for r in rows) == [12] * 8  # 96 training sentences in 8 equal parts
    assert len({int(i) for r in rows for i in r}) == 96  # non-overlapping, all of them
    assert problems[0].test_labels.numel() == 24  # the labelled validation split, not GLUE's hidden test


def test_fedsum_sst2_runs_end_to_end_at_toy_size(folders, tmp_path):
    # As a user types it, steps tuned on the clients' validation share, on the parquet folder.
    out = tmp_path / "sst2-run"
    proc = run_cli("reproduce", "fedsum-sst2", "--data", str(folders / "sst2-parquet"), "--model",
                   str(folders / "bert"), "--rounds", "2", "--eval-every", "1", "--tune-rounds", "1",
                   "--seeds", "1", "--workers", "1", "--out", str(out), limit_gib=None)
    assert proc.returncode == 0, proc.stderr
    assert "do not converge" in proc.stdout and "final acc" in proc.stdout
    summary = read_rows(out / "summary.csv")
    assert [row["algorithm"] for row in summary] == ["fedsum", "fedavg"]
    assert all(row["status"] == "complete" and row["steps"] == "tuned" and row["rounds"] == "2" for row in summary)
    # The 4 grid points and the steps the search added past an end (with the reason it stopped).
    assert all(len(row["grid"].split(";")) == 4 + len([s for s in row["added_steps"].split(";") if s])
               and row["reason"] for row in read_rows(out / "steps.csv"))
    runs = list((out / "runs-uniform-m-2" / "runs").iterdir())
    assert len(runs) == 2
    for run in runs:
        config = json.loads((run / "config.json").read_text())
        assert config["problem"]["data"] == f"hf:{folders / 'sst2-parquet'}"
        assert config["problem"]["model"] == f"hf:{folders / 'bert'}"
        assert config["problem"]["tokenizer"] == str(folders / "bert")
        assert config["participation"]["name"] == "uniform" and config["algorithm"]["local_steps"] == 3
        active = [int(row["active"]) for row in read_rows(run / "metrics.csv")[1:]]
        assert active == [2, 2]
        saved = torch.load(run / "model.pt", weights_only=True)
        assert torch.isfinite(saved if isinstance(saved, torch.Tensor) else saved["x"]).all()


def test_fedsum_sst2_without_a_model_folder_is_one_line_and_writes_nothing(folders, tmp_path):
    proc = run_cli("reproduce", "fedsum-sst2", "--data", str(folders / "sst2"), "--model", str(tmp_path / "none"),
                   "--out", str(tmp_path / "out"), cwd=tmp_path, limit_gib=None)
    assert_one_line_error(proc, 2, "not found")
    assert not (tmp_path / "out").exists()


def test_fedsum_sst2_help_names_its_folders():
    proc = run_cli("reproduce", "fedsum-sst2", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "--data DIR" in proc.stdout and "--model DIR" in proc.stdout and "examples:" in proc.stdout


def test_a_parquet_folder_without_a_train_split_is_refused(folders, tmp_path):
    from focusfl.errors import DataError

    (tmp_path / "only-validation").mkdir()
    source = folders / "sst2-parquet" / "validation-00000-of-00001.parquet"
    (tmp_path / "only-validation" / source.name).write_bytes(source.read_bytes())
    spec = reproduce_nn.sst2_spec(reproduce_nn.FEDSUM_SST2, reproduce_nn.PresetOptions(
        out="x", data=str(tmp_path / "only-validation"), model=str(folders / "bert")))
    with pytest.raises(DataError, match="splits validation, none named train"):
        make_problem(spec)

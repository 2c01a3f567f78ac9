"""A DP run recorded before the noise was keyed by a nonce (config.json with a dp and no
dp_nonce) resumes with the noise its first rounds drew: byte for byte the run the old code ran
uninterrupted (docs/privacy.md, "Threat model").

The fixture (tests/fixtures/dp_before_nonce, its recorded.json says how) is what focusfl wrote at
the last commit before the nonce: ``short``, a 5-round run; ``killed``, the 12-round run killed
(SIGKILL) after its checkpoint of round 5, its partial folder as it was left; and ``whole``'s
metrics.csv and model.pt, the 12-round run uninterrupted. A resume that drew the noise keyed by
the nonce differs from round 6 on (every loss, the model)."""
from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
import torch

from cli_harness import run_cli, run_main
from focusfl.device import kernel_fingerprint
from focusfl.privacy.mechanism import keyed_gaussian

pytest.importorskip("dp_accounting")

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "dp_before_nonce"
RECORDED = json.loads((FIXTURE / "recorded.json").read_text())


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def _same_kernels() -> bool:
    """Whether this machine computes the bytes the fixture was recorded with (one thread, native
    numerics: the resumed run's record asks for both)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return kernel_fingerprint() == RECORDED["platform"]
    finally:
        torch.set_num_threads(threads)


def _assert_the_uninterrupted_run(resumed: Path) -> None:
    whole = FIXTURE / "whole"
    if _same_kernels():
        assert (resumed / "metrics.csv").read_bytes() == (whole / "metrics.csv").read_bytes()
        assert (resumed / "model.pt").read_bytes() == (whole / "model.pt").read_bytes()
        return
    # Other kernels round differently in the last digits; other noise moves every number.
    got, want = _rows(resumed / "metrics.csv"), _rows(whole / "metrics.csv")
    assert [sorted(r) for r in got] == [sorted(r) for r in want]
    for row, expected in zip(got, want, strict=True):
        for key, value in expected.items():
            if value == "" or row[key] == "":  # a column left empty on this row (not evaluated)
                assert row[key] == value, (row["round"], key)
                continue
            assert float(row[key]) == pytest.approx(float(value), rel=1e-9, abs=1e-12), (row["round"], key)


def test_a_dp_run_recorded_before_the_nonce_resumes_with_the_noise_it_drew(tmp_path):
    short = tmp_path / "short"
    shutil.copytree(FIXTURE / "short", short)
    before = json.loads((short / "config.json").read_text())
    assert "dp" in before and "dp_nonce" not in before
    proc = run_cli("run", "--resume", str(short), "--rounds", "12")
    assert proc.returncode == 0, proc.stderr
    _assert_the_uninterrupted_run(short)
    after = json.loads((short / "config.json").read_text())
    # its record stays one of a run before the nonce, so a later resume draws the same noise again
    assert "dp_nonce" not in after and after["dp"] == before["dp"] and after["rounds_done"] == 12


def _killed(tmp_path) -> Path:
    """A copy of the killed run's partial folder beside the folder it was writing (absent)."""
    partial = ".killed.focusfl-partial"
    shutil.copytree(FIXTURE / "killed" / partial, tmp_path / partial)
    return tmp_path / "killed"


def test_a_killed_dp_run_from_before_the_nonce_resumes_with_the_noise_it_drew(tmp_path):
    out = _killed(tmp_path)
    proc = run_cli("run", "--resume", str(out))
    assert proc.returncode == 0, proc.stderr
    _assert_the_uninterrupted_run(out)
    assert "dp_nonce" not in json.loads((out / "config.json").read_text())


def test_a_sweeps_batch_resumes_a_run_from_before_the_nonce_with_its_noise(tmp_path):
    """A sweep resumes its interrupted runs in batches (runs/batch.py), through the same rebuild."""
    from focusfl.runs.batch import BatchEntry, run_batch_to_folders
    from focusfl.runs.config import config_from_json

    out = _killed(tmp_path)
    config = config_from_json(json.loads((tmp_path / ".killed.focusfl-partial" / "config.json").read_text()))
    threads = torch.get_num_threads()
    try:
        [outcome] = run_batch_to_folders([BatchEntry(config, str(out), resume=True)], batch_runs=1)
    finally:
        torch.set_num_threads(threads)
    assert outcome.error is None and outcome.restarted is None, outcome
    _assert_the_uninterrupted_run(out)
    assert "dp_nonce" not in json.loads((out / "config.json").read_text())


def test_a_replay_of_a_record_before_the_nonce_is_a_new_run_with_its_own_nonce(tmp_path):
    """--config is a new run (options may change beside it): its noise is keyed by its own nonce,
    and it says so in its config.json; only a resume continues the old noise."""
    proc = run_main("run", "--config", str(FIXTURE / "short" / "config.json"), "--rounds", "12",
                    "--out", str(tmp_path / "replay"))
    assert proc.returncode == 0, proc.stderr
    assert isinstance(json.loads((tmp_path / "replay" / "config.json").read_text())["dp_nonce"], int)
    replayed, old = _rows(tmp_path / "replay" / "metrics.csv"), _rows(FIXTURE / "whole" / "metrics.csv")
    assert replayed[0]["loss"] == old[0]["loss"]  # round 0: before any noise
    assert all(new["loss"] != was["loss"] for new, was in zip(replayed[1:], old[1:], strict=True))


def test_the_legacy_key_is_the_seed_alone_and_differs_from_every_nonce():
    clients = torch.arange(16)
    legacy = keyed_gaussian(0, 3, clients, 0, 200, None)
    assert torch.equal(legacy, keyed_gaussian(0, 3, clients, 0, 200, None))
    assert not torch.equal(legacy, keyed_gaussian(0, 3, clients, 0, 200, 0))
    assert not torch.equal(legacy, keyed_gaussian(1, 3, clients, 0, 200, None))

"""A DP run recorded before the noise was keyed by a nonce (config.json with a dp and no
dp_nonce) resumes with the noise its first rounds drew: byte for byte the run the old code ran
uninterrupted (docs/privacy.md, "Threat model").

The fixture (tests/fixtures/dp_before_nonce, its recorded.json says how) is what focusfl wrote at
the last commit before the nonce: ``short``, a 5-round run, and ``whole``'s metrics.csv and
model.pt, the same run for 12 rounds uninterrupted. A resume to 12 rounds that drew the noise
keyed by the nonce differs from round 6 on (every loss, the model)."""
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

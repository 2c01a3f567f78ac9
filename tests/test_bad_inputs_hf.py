"""Every bad input of the Hugging Face surfaces ends in one line and exit status 2, nothing written.

Dataset folders (dataset_dict.json, state.json, dataset_info.json, Arrow streams), dataset files
(parquet, csv, JSON lines), their columns (types, empty values anywhere, ranges), model folders
(config.json's fields, a parameter count too large for memory with the algorithm's per-client
state, safetensors headers and shards) and tokenizer folders: each case of tests/hf_bad_cases.py
is built in tmp_path and given to the ``focusfl`` console script as a user would, under the
4 GiB address-space limit of tests/cli_harness.py, so a case that would allocate gigabytes fails
the test instead of being refused from its sizes. The command must print exactly one line
(saying what the case's ``contains`` says), exit 2, write no output folder and change nothing
under tmp_path.
"""
from __future__ import annotations

import resource
from pathlib import Path

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("transformers")
pytest.importorskip("datasets")  # the good fixtures every case starts from are written with it (hf_fixtures)

from cli_harness import assert_one_line_error, run_cli, snapshot  # noqa: E402
from hf_bad_cases import CASES, make_fixtures  # noqa: E402


@pytest.fixture(scope="module")
def fx(tmp_path_factory) -> Path:
    return make_fixtures(tmp_path_factory.mktemp("hf-good"))


def _child_seconds() -> float:
    """CPU seconds of the finished child processes of this (test worker) process."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def test_the_suite_is_large():
    assert len(CASES) >= 100


@pytest.mark.parametrize("case", CASES)
def test_bad_hf_input_is_one_line(fx, tmp_path, case):
    build, contains = CASES[case]
    made = tmp_path / "made"
    made.mkdir()
    args = build(fx, made)
    before, good = snapshot(tmp_path), snapshot(fx)
    out = tmp_path / "out"
    spent = _child_seconds()
    proc = run_cli(*args, "--out", str(out), timeout=600)
    spent = _child_seconds() - spent
    assert_one_line_error(proc, 2, contains)
    assert spent < 60, f"{spent:.0f} s of CPU"  # no case may hang (counted in CPU time: the machine may be busy)
    assert not out.exists()
    assert snapshot(tmp_path) == before and snapshot(fx) == good

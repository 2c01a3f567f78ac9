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

The cases run one after another in one child process (cli_harness.run_in_one_process: the
memory limit, the file descriptors and the exit status of each as the console script's), which
pays the interpreter's and transformers' import once instead of 120 times; the console script
itself runs the Hugging Face surfaces in tests/test_hf.py and tests/test_hf_sst2.py.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("transformers")
pytest.importorskip("datasets")  # the good fixtures every case starts from are written with it (hf_fixtures)

from cli_harness import assert_one_line_error, run_in_one_process, snapshot  # noqa: E402
from hf_bad_cases import CASES, make_fixtures  # noqa: E402

# One worker runs every case (the refusals below are computed once, for all of them).
pytestmark = pytest.mark.xdist_group("hf_bad_cases")


@pytest.fixture(scope="module")
def fx(tmp_path_factory) -> Path:
    return make_fixtures(tmp_path_factory.mktemp("hf-good"))


@pytest.fixture(scope="module")
def refusals(fx, tmp_path_factory) -> dict[str, tuple[Path, dict, dict]]:
    """Every case built in a folder of its own and run: case -> (its folder, the folder's and the
    good fixtures' snapshots before any case ran, the command's result)."""
    root = tmp_path_factory.mktemp("hf-bad")
    folders, before, commands = {}, {}, []
    good = snapshot(fx)
    for k, (case, (build, _)) in enumerate(CASES.items()):
        folder = folders[case] = root / f"case{k}"
        (folder / "made").mkdir(parents=True)
        args = build(fx, folder / "made")
        before[case] = snapshot(folder)
        commands.append(([*args, "--out", str(folder / "out")], [folder, fx]))
    results = run_in_one_process(commands, root)
    return {case: (folders[case], before[case], good, result) for case, result in zip(CASES, results)}


def test_the_suite_is_large():
    assert len(CASES) >= 100


@pytest.mark.parametrize("case", CASES)
def test_bad_hf_input_is_one_line(refusals, case):
    _, contains = CASES[case]
    folder, before, good, result = refusals[case]
    proc = subprocess.CompletedProcess(case, result["code"], result["stdout"], result["stderr"])
    assert_one_line_error(proc, 2, contains)
    # no case may hang (counted in CPU time: the machine may be busy)
    assert result["cpu"] < 60, f"{result['cpu']:.0f} s of CPU"
    assert not (folder / "out").exists()
    after_folder, after_fx = result["after"]
    assert after_folder == before and after_fx == good

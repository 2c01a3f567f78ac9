"""A full disk wherever a run writes: one line that says so and names the folder, nothing
half-written left as if complete, and the next command resumes to the bytes of a run that had
the space.

Where this machine lets the test mount a small tmpfs (root, Linux), a run writes into one that
cannot hold its second checkpoint, as a disk that another job has filled. Everywhere, a child
process injects the failure as the libraries report it: torch's zip writer raising
``RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos ...`` while handling
``OSError(ENOSPC)`` (a checkpoint, model.pt, a tune's trial), and ``OSError(ENOSPC)`` from
metrics.csv's write.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from cli_harness import assert_one_line_error, cli_env, run_cli, run_main

RUN = ["run", "--algorithm", "scaffold", "--lr", "1e-4", "--problem", "ridge:dim=1000", "--rounds", "40",
       "--checkpoint-every", "10"]
SMALL_RUN = ["run", "--algorithm", "scaffold", "--lr", "1e-4", "--problem", "ridge:dim=20,clients=6,samples=10",
             "--rounds", "30", "--checkpoint-every", "10", "--eval-every", "3"]

# Run `focusfl ARGV[2:]` in this process after patching one writer to fail, as a full disk makes it
# fail, at its ARGV[1]-th call (1-based); the other calls write as usual.
_INJECT = """
import errno, sys
from focusfl.cli import main
nth = int(sys.argv[1])
calls = [0]

def full():
    calls[0] += 1
    return calls[0] == nth

def enospc(path=None):
    return OSError(errno.ENOSPC, "No space left on device", path)

{setup}
sys.exit(main(sys.argv[2:]))
"""

TORCH_SAVE = """
import torch
real_save = torch.save

def save(payload, handle, *args, **kwargs):
    if full():
        handle.write(b"PK" * 100)  # the zip writer got this far
        try:
            raise enospc()
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1152 vs 1046")
    return real_save(payload, handle, *args, **kwargs)

torch.save = save
"""

METRICS_WRITE = """
import focusfl.runs.folder as folder
real_write = folder._MetricsWriter.write

def write(self, row):
    if full():
        raise enospc()
    return real_write(self, row)

folder._MetricsWriter.write = write
"""


def injected(nth: int, setup: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    code = _INJECT.replace("{setup}", textwrap.dedent(setup))
    return subprocess.run([sys.executable, "-c", code, str(nth), *args], env=cli_env(), cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def assert_disk_full(proc: subprocess.CompletedProcess, folder: Path, then: str) -> str:
    line = assert_one_line_error(proc, 2, "no space left on device: cannot write to")
    assert str(folder) in line and then in line, line
    return line


def assert_same_run(a: Path, b: Path) -> None:
    for name in ("metrics.csv", "model.pt", "checkpoint.pt"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def partial(out: Path) -> Path:
    return out.with_name(f".{out.name}.focusfl-partial")


# -- a real full file system ---------------------------------------------------------------------------
@pytest.fixture
def small_disk(tmp_path):
    """A 256 KiB tmpfs at tmp_path/disk (skipped where it cannot be mounted); unmounted after."""
    mount = shutil.which("mount")
    point = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    point.mkdir()
    if mount is None or not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root and mount(8)")
    made = subprocess.run([mount, "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(point)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode(errors='replace').strip()}")
    try:
        yield point
    finally:
        subprocess.run(["umount", "-l", str(point)], capture_output=True)


def test_a_checkpoint_on_a_full_filesystem_is_one_line_and_resumes(tmp_path, small_disk):
    """SCAFFOLD on ridge of dimension 1000: a checkpoint is 146 kB, so the second one (written
    beside the first, then renamed over it) does not fit in 256 KiB."""
    out = small_disk / "run"
    proc = run_cli(*RUN, "--out", str(out))
    assert_disk_full(proc, out, f"then continue with `focusfl run --resume {out}` (the checkpoint of round 10 is kept)")
    assert not out.exists()  # nothing published as if complete
    leftover = sorted(p.name for p in partial(out).iterdir())
    assert leftover == [".focusfl-output.json", "checkpoint.pt", "config.json", "metrics.csv"], leftover
    subprocess.run(["mount", "-o", "remount,size=4m", str(small_disk)], check=True)
    done = run_main("run", "--resume", str(out))
    assert done.returncode == 0, done.stderr
    whole = tmp_path / "whole"
    assert run_main(*RUN, "--out", str(whole)).returncode == 0
    assert_same_run(out, whole)


def test_a_sweep_of_two_workers_on_a_full_filesystem_stops_in_one_line_and_resumes(tmp_path, small_disk):
    """A run in a worker process meets the full disk: the sweep stops every worker, says so in
    one line, and the same command finishes the sweep once there is space."""
    experiment = tmp_path / "e.toml"
    experiment.write_text('algorithms = ["scaffold", "focus"]\nproblems = ["ridge:dim=1000"]\n'
                          'participation = "bernoulli"\nlr = [1e-4, 1e-5]\nrounds = 6\nseeds = 2\n')
    out = small_disk / "sweep"
    proc = run_cli("sweep", str(experiment), "--out", str(out), "--workers", "2")
    assert_disk_full(proc, out / "runs", "then run the same command again")
    assert not (out / "results.csv").exists()
    subprocess.run(["mount", "-o", "remount,size=8m", str(small_disk)], check=True)
    again = run_main("sweep", str(experiment), "--out", str(out), "--workers", "2")
    assert again.returncode == 0, again.stderr
    assert "8 runs:" in again.stdout and "0 failed" in again.stdout


# -- injected where a library reports it ----------------------------------------------------------------
@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    whole = tmp_path_factory.mktemp("whole") / "run"
    proc = run_main(*SMALL_RUN, "--out", str(whole))
    assert proc.returncode == 0, proc.stderr
    return whole


def test_torch_zip_writer_failing_on_a_full_disk_is_one_line_and_resumes(tmp_path, uninterrupted):
    """The second checkpoint (round 20) fails inside torch.save: the first stays, whole."""
    out = tmp_path / "run"
    proc = injected(2, TORCH_SAVE, *SMALL_RUN, "--out", str(out))
    assert_disk_full(proc, out, f"continue with `focusfl run --resume {out}` (the checkpoint of round 10 is kept)")
    assert not out.exists() and not any(p.name.endswith(".focusfl-tmp") for p in partial(out).iterdir())
    done = run_main("run", "--resume", str(out))
    assert done.returncode == 0, done.stderr
    assert_same_run(out, uninterrupted)


def test_a_metrics_write_on_a_full_disk_is_one_line_and_resumes(tmp_path, uninterrupted):
    """The 8th evaluated row (round 21, after the checkpoint of round 20) cannot be written."""
    out = tmp_path / "run"
    proc = injected(8, METRICS_WRITE, *SMALL_RUN, "--out", str(out))
    assert_disk_full(proc, out, "(the checkpoint of round 20 is kept)")
    assert not out.exists()
    done = run_main("run", "--resume", str(out))
    assert done.returncode == 0, done.stderr
    assert_same_run(out, uninterrupted)


def test_the_last_files_on_a_full_disk_are_finished_by_resume(tmp_path, uninterrupted):
    """The run's rounds are done; model.pt (the 4th torch.save: checkpoints 10, 20, 30, then the
    model) does not fit. --resume writes what is missing without running a round again."""
    out = tmp_path / "run"
    proc = injected(4, TORCH_SAVE, *SMALL_RUN, "--out", str(out))
    assert_disk_full(proc, out, f"then finish it with `focusfl run --resume {out}`")
    assert not out.exists() and not (partial(out) / "model.pt").exists()
    done = run_main("run", "--resume", str(out))
    assert done.returncode == 0, done.stderr
    assert_same_run(out, uninterrupted)


def test_a_full_disk_before_any_checkpoint_leaves_nothing(tmp_path):
    out = tmp_path / "run"
    proc = injected(1, METRICS_WRITE, *SMALL_RUN, "--out", str(out))
    assert_disk_full(proc, out, "then run the same command again")
    assert not out.exists() and not partial(out).exists()


TUNE = ["tune", "--algorithm", "focus,scaffold", "--problem", "ridge:dim=10,clients=4,samples=8", "--rounds", "12",
        "--points", "3", "--seeds", "2"]


def test_a_tune_trial_on_a_full_disk_stops_the_tune_in_one_line_and_the_rerun_finishes_it(tmp_path):
    """The failure the issue reports: `reproduce mnist-demo` ended in "3 tuning run(s) failed
    (the first, scaffold seed 1: RuntimeError: [enforce fail at inline_container.cc:672] ...)".
    Now the first trial that meets the full disk stops the tune, naming it; the rerun reuses the
    trials done and gives the tables of a tune that had the space."""
    out = tmp_path / "tune"
    proc = injected(5, TORCH_SAVE, *TUNE, "--out", str(out), cwd=tmp_path)
    line = assert_disk_full(proc, out / "runs", "then run the same command again")
    assert "RuntimeError" not in line and "failed" not in line
    assert not (out / "summary.csv").exists()
    again = run_main(*TUNE, "--out", str(out), cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "reused 2 trial(s)" in again.stdout
    whole = tmp_path / "whole"
    assert run_main(*TUNE, "--out", str(whole), cwd=tmp_path).returncode == 0
    for name in ("grid.csv", "summary.csv"):
        assert (out / name).read_text() == (whole / name).read_text(), name


def test_a_full_disk_found_anywhere_is_one_line_naming_the_folder(tmp_path):
    """Any write of a command that meets a full disk (here: the figure of `focusfl work --plot`)."""
    setup = """
    import matplotlib.figure
    real = matplotlib.figure.Figure.savefig

    def savefig(self, path, *args, **kwargs):
        if full():
            raise enospc(str(path))
        return real(self, path, *args, **kwargs)

    matplotlib.figure.Figure.savefig = savefig
    """
    target = tmp_path / "figures" / "steps.png"
    proc = injected(1, setup, "work", "uniform", "--clients", "3", "--rounds", "20", "--plot", str(target))
    line = assert_one_line_error(proc, 2, "no space left on device: cannot write to")
    assert str(target.parent) in line and not target.exists()
    assert not [p for p in target.parent.iterdir()]  # no scratch file left beside it

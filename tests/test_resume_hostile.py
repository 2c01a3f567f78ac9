"""`focusfl run --resume` and `--config` under hostile conditions, as a user types them.

- A resume reads its files where they are, size-checked first: a 300 GiB sparse checkpoint is
  refused without a byte written (under ``ulimit -f``), and no checkpoint is ever copied.
- A refused resume (bad checkpoint, bad config.json, too few rounds, no folder) prints one line
  naming the user's file and leaves nothing behind: no ``.NAME.focusfl-partial``, no lock.
- A run records the digests of its inputs; a resume or replay on changed data is refused, and
  goes on with --accept-changed-inputs, which config.json records.
- The algorithm's state is size-checked before init (pushsum_tracking under 4 GiB), and an
  allocator error that still escapes is one line.
- A run killed at any rename of its output's replacement leaves a complete run at the path,
  which the next command continues or replaces.
"""
from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cli_harness import (assert_one_line_error, cli_env, focusfl_command, killer_script, run_cli, run_cli_together,
                         run_main, snapshot)
from focusfl.cli import main

RIDGE = ["run", "--algorithm", "focus", "--problem", "ridge:clients=4,dim=3,samples=6", "--rounds", "5"]


def listing(folder: Path) -> dict:
    """What ``snapshot`` sees, but only names and sizes (a refused command writes nothing)."""
    return {name: size for name, (size, _) in snapshot(folder).items()}


@pytest.fixture
def finished(tmp_path) -> Path:
    """A finished 5-round ridge run in tmp_path/runs/a (nothing else in tmp_path/runs)."""
    out = tmp_path / "runs" / "a"
    assert main([*RIDGE, "--out", str(out)]) == 0
    return out


# -- size before copy ------------------------------------------------------------------------------
def _limit_file_size(limit: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_a_sparse_300_gib_checkpoint_is_refused_before_a_byte_is_written(finished):
    with open(finished / "checkpoint.pt", "r+b") as handle:
        handle.truncate(300 << 30)  # sparse: no disk used, 300 GiB to read or copy
    before = listing(finished.parent)
    limit = 1 << 20  # ulimit -f: a copy of the checkpoint would die of SIGXFSZ at 1 MiB
    proc = subprocess.run([*focusfl_command(), "run", "--resume", str(finished), "--rounds", "8"], env=cli_env(),
                          capture_output=True, text=True, timeout=120, preexec_fn=_limit_file_size(limit))
    line = assert_one_line_error(proc, 2, contains="300 GiB")
    assert f"'{finished}/checkpoint.pt'" in line and "focusfl-partial" not in line
    assert listing(finished.parent) == before  # no scratch folder, no lock, nothing grew


def test_a_checkpoint_claiming_300_gib_of_rows_is_refused_before_they_are_copied(finished):
    import torch

    payload = torch.load(finished / "checkpoint.pt", weights_only=True)
    payload["metrics_bytes"] = 300 << 30
    torch.save(payload, finished / "checkpoint.pt")
    with open(finished / "metrics.csv", "r+b") as handle:
        handle.truncate(300 << 30)  # sparse: as long as the checkpoint says
    before = listing(finished.parent)
    proc = subprocess.run([*focusfl_command(), "run", "--resume", str(finished), "--rounds", "8"], env=cli_env(),
                          capture_output=True, text=True, timeout=120, preexec_fn=_limit_file_size(1 << 20))
    assert_one_line_error(proc, 2, contains="would need 300 GiB of disk")
    assert listing(finished.parent) == before


# -- a refused resume leaves nothing ---------------------------------------------------------------
def _damage(out: Path, case: str, other: Path) -> tuple[str, str]:
    """Damage ``out`` as ``case`` says; the words the error must contain and the file it names."""
    checkpoint, config = out / "checkpoint.pt", out / "config.json"
    if case == "truncated":
        checkpoint.write_bytes(checkpoint.read_bytes()[:300])
    elif case == "pickled":
        import pickle

        checkpoint.write_bytes(pickle.dumps({"format": 1, "round": 3}))
    elif case == "json":
        checkpoint.write_text('{"format": 1}\n')
    elif case == "foreign":  # another problem's checkpoint
        checkpoint.write_bytes((other / "checkpoint.pt").read_bytes())
        return "server.x", str(checkpoint)
    elif case == "deleted":
        checkpoint.unlink()
        return "no checkpoint", repr(str(out))
    elif case == "garbage config":
        config.write_text("{not json")
        return "cannot read", str(config)
    elif case == "too few rounds":
        return "has run 5 of 3 rounds", str(out)
    return "checkpoint", str(checkpoint)


CASES = ["truncated", "pickled", "json", "foreign", "deleted", "garbage config", "too few rounds"]


def test_every_refused_resume_is_one_line_naming_the_users_file_and_leaves_nothing(tmp_path):
    other = tmp_path / "other"
    assert main(["run", "--algorithm", "focus", "--problem", "ridge:clients=4,dim=5,samples=5", "--rounds", "4",
                 "--out", str(other)]) == 0
    expected, commands = {}, []
    for case in CASES:
        out = tmp_path / case.replace(" ", "-") / "a"
        assert main([*RIDGE, "--out", str(out)]) == 0
        expected[case] = (out, *_damage(out, case, other), listing(out.parent))
        commands.append(("run", "--resume", str(out), "--rounds", "3" if case == "too few rounds" else "8"))
    missing = tmp_path / "nowhere" / "a"
    commands.append(("run", "--resume", str(missing)))
    procs = run_cli_together(commands)
    for case, proc in zip(CASES, procs):
        out, words, names, before = expected[case]
        line = assert_one_line_error(proc, 2, contains=words)
        assert names in line and "focusfl-partial" not in line and "Warning" not in proc.stderr, (case, line)
        assert listing(out.parent) == before, case
    assert_one_line_error(procs[-1], 2, contains="does not exist")
    assert not (tmp_path / "nowhere").exists()


def test_a_refused_resume_of_a_killed_run_keeps_its_partial_folder_as_it_was(tmp_path):
    out = tmp_path / "runs" / "k"
    args = [*RIDGE[:-1], "40", "--checkpoint-every", "10", "--out", str(out)]
    proc = subprocess.run([sys.executable, "-c", killer_script(), "25", *args], env=cli_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL
    # The dead writer's lock file goes (the next writer takes it and unlinks it); nothing else changes.
    before = {name: seen for name, seen in snapshot(out.parent).items() if not name.endswith("focusfl-lock")}
    assert_one_line_error(run_main("run", "--resume", str(out), "--rounds", "20"), 2, contains="has run 20 of 20")
    assert snapshot(out.parent) == before
    done = run_main("run", "--resume", str(out))
    assert done.returncode == 0, done.stderr
    assert json.loads((out / "config.json").read_text())["rounds_done"] == 40


def test_resume_copies_no_checkpoint(finished, monkeypatch):
    """The published run is read in place: the partial folder gets the rows of metrics.csv, and
    its first checkpoint is the one the resumed run saves."""
    import shutil

    copied = []

    def spy(real):
        def copy(src, dst, *args, **kwargs):
            copied.append(src)
            return real(src, dst, *args, **kwargs)
        return copy

    for name in ("copy", "copy2", "copyfile"):
        monkeypatch.setattr(shutil, name, spy(getattr(shutil, name)))
    assert main(["run", "--resume", str(finished), "--rounds", "7"]) == 0
    assert not any(str(src).endswith("checkpoint.pt") for src in copied), copied
    assert json.loads((finished / "config.json").read_text())["rounds_done"] == 7


# -- the inputs a run read -------------------------------------------------------------------------
def _dataset(path: Path, flip: bool = False) -> Path:
    rng = np.random.default_rng(0)
    labels = np.arange(120) % 3
    np.savez(path, images=rng.integers(0, 255, (120, 6, 6), dtype=np.uint8),
             labels=(labels + 1) % 3 if flip else labels,
             test_images=rng.integers(0, 255, (30, 6, 6), dtype=np.uint8), test_labels=np.arange(30) % 3)
    return path


def nn_run(data: Path, out: Path, rounds: int = 4) -> list[str]:
    return ["run", "--algorithm", "fedavg", "--problem", f"nn:data={data},clients=3,partition=iid,batch=4,model=mlp",
            "--rounds", str(rounds), "--eval-every", "2", "--lr", "0.05", "--out", str(out)]


def test_a_resume_after_the_dataset_changed_is_refused_and_goes_on_only_when_told(tmp_path):
    data = _dataset(tmp_path / "d.npz")
    out = tmp_path / "runs" / "a"
    assert main(nn_run(data, out)) == 0
    recorded = json.loads((out / "config.json").read_text())["inputs"]
    assert recorded == {"problem data": {"path": str(data), "sha256": __import__("hashlib").sha256(
        data.read_bytes()).hexdigest()}}
    _dataset(data, flip=True)  # the same rows, every label changed
    before = snapshot(out.parent)
    refused, replay = run_cli_together([("run", "--resume", str(out), "--rounds", "6"),
                                        ("run", "--config", str(out / "config.json"), "--out", str(tmp_path / "b"))])
    for proc in (refused, replay):
        line = assert_one_line_error(proc, 2, contains=f"problem data {data} has changed")
        assert "--accept-changed-inputs" in line
    assert snapshot(out.parent) == before and not (tmp_path / "b").exists()

    accepted = run_cli("run", "--resume", str(out), "--rounds", "6", "--accept-changed-inputs")
    assert accepted.returncode == 0, accepted.stderr
    info = json.loads((out / "config.json").read_text())
    assert info["status"] == "complete" and info["rounds_done"] == 6
    assert info["inputs"]["problem data"]["sha256"] != recorded["problem data"]["sha256"]
    assert info["inputs_changed"] == [{"input": "problem data", "path": str(data),
                                       "recorded": recorded["problem data"]["sha256"],
                                       "sha256": info["inputs"]["problem data"]["sha256"]}]
    # The run now records the new data: a replay of it on that data goes on without a word.
    again = run_main("run", "--config", str(out / "config.json"), "--out", str(tmp_path / "c"))
    assert again.returncode == 0, again.stderr
    assert "inputs_changed" not in json.loads((tmp_path / "c" / "config.json").read_text())


def test_a_changed_trace_is_refused_and_a_problem_given_anew_is_not_compared(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("a,b,c,d\n1,0,1,1\n0,1,1,1\n1,1,0,1\n")
    out = tmp_path / "runs" / "t"
    assert main([*RIDGE, "--participation", f"trace:path={trace}", "--out", str(out)]) == 0
    assert set(json.loads((out / "config.json").read_text())["inputs"]) == {"participation trace"}
    trace.write_text("a,b,c,d\n1,1,1,1\n0,1,1,1\n1,1,0,1\n")
    refused = run_main("run", "--resume", str(out), "--rounds", "8")
    assert_one_line_error(refused, 2, contains=f"participation trace {trace} has changed")
    # --participation beside --config reads another trace on purpose: not compared.
    other = run_main("run", "--config", str(out / "config.json"), "--participation", "full", "--out",
                     str(tmp_path / "full"))
    assert other.returncode == 0, other.stderr
    assert_one_line_error(run_main(*RIDGE, "--accept-changed-inputs", "--out", str(tmp_path / "n")), 2,
                          contains="--resume DIR or --config FILE")


# -- the algorithm's state, and allocator errors ----------------------------------------------------
PUSHSUM = ["run", "--algorithm", "pushsum_tracking", "--participation", "bernoulli", "--rounds", "1", "--lr", "0.01"]


@pytest.fixture
def digits10k(tmp_path) -> Path:
    """10,000 28x28 images of 10 classes: MNIST's shape, so the default model has MNIST's d."""
    rng = np.random.default_rng(0)
    path = tmp_path / "digits.npz"
    np.savez(path, images=rng.integers(0, 255, (10_000, 28, 28), dtype=np.uint8),
             labels=(np.arange(10_000) % 10).astype(np.uint8))
    return path


def test_pushsum_tracking_state_beyond_4_gib_is_one_line(tmp_path, digits10k):
    problem = f"nn:data={digits10k},test_fraction=0.2,clients=8000,partition=iid,min_size=1,batch=1"
    # --state-memory: the table stays in memory (beyond it, the 9.9 GB table would be mapped on disk)
    proc = run_cli(*PUSHSUM, "--problem", problem, "--state-memory", "1TB", "--out", str(tmp_path / "p"), limit_gib=4)
    assert_one_line_error(proc, 2, contains="pushsum_tracking's state for 8,000 clients x 51,480 parameters")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["digits.npz"]


ESCAPING = """
import sys
import focusfl.runs.driver as driver
driver.check_state_memory = lambda algorithm, problem, budget: None  # as if both checks had missed it:
driver.algorithm_state_size = lambda name, local_steps: None  # the model's check counts no state
from focusfl.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_an_allocator_error_that_escapes_the_checks_is_one_line(tmp_path, digits10k):
    problem = f"nn:data={digits10k},test_fraction=0.2,clients=8000,partition=iid,min_size=1,batch=1"

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    # --state-memory: the table stays in memory (a mapped one would not be allocated at all).
    proc = subprocess.run([sys.executable, "-c", ESCAPING, *PUSHSUM, "--problem", problem, "--state-memory", "1TB",
                           "--out", str(tmp_path / "p")], env=cli_env(), capture_output=True, text=True,
                          timeout=300, preexec_fn=limit)
    assert_one_line_error(proc, 2, contains="out of memory: tried to allocate")


# -- killed while the output is replaced -----------------------------------------------------------
PUBLISH_KILLER = """
import json, os, sys
from focusfl.io import folders
from focusfl.cli import main
kill_at, names = int(sys.argv[1]), []

def step(name):
    names.append(name)
    if len(names) == kill_at:
        os.kill(os.getpid(), 9)

folders._after_step = step
code = main(sys.argv[2:])
print(json.dumps(names), file=sys.stderr)
sys.exit(code)
"""


def test_a_run_killed_at_every_rename_of_its_replacement_leaves_a_complete_run(tmp_path):
    def replace(out: Path, kill_at: int) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", PUBLISH_KILLER, str(kill_at), *RIDGE[:-1], "6",
                               "--out", str(out)], env=cli_env(), capture_output=True, text=True, timeout=120)

    first = tmp_path / "probe" / "a"
    assert main([*RIDGE, "--out", str(first)]) == 0
    probe = replace(first, 0)
    assert probe.returncode == 0, probe.stderr
    names = json.loads(probe.stderr.strip().splitlines()[-1])
    renames = [k for k, name in enumerate(names, 1) if "rename" in name or "move" in name or "exchange" in name]
    assert len(renames) >= 4  # two markers renamed in, the exchange, the old output moved aside
    for k in renames:
        out = tmp_path / f"kill{k}" / "a"
        assert main([*RIDGE, "--out", str(out)]) == 0
        assert replace(out, k).returncode == -signal.SIGKILL
        info = json.loads((out / "config.json").read_text())
        assert info["status"] == "complete" and info["rounds_done"] in (5, 6), (k, names[k - 1])
        # The next command neither refuses ("holds an interrupted run", "has run 6 of 6") nor
        # leaves the finished run hidden: it finds the newest complete run in place.
        proc = run_main("run", "--resume", str(out), "--rounds", "9")
        assert proc.returncode == 0, (k, names[k - 1], proc.stderr)
        assert sorted(os.listdir(out.parent)) == ["a"], (k, names[k - 1])
        assert json.loads((out / "config.json").read_text())["rounds_done"] == 9

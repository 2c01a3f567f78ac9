"""Output folders never lose a user's files: what focusfl refuses, how it replaces its own
outputs (whole, under a lock, crash-safe), and how tune keeps finished trials across a kill."""
from __future__ import annotations

import ctypes
import json
import math
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from cli_harness import assert_one_line_error, cli_env, run_cli, run_main, snapshot
from focusfl.errors import ConfigError
from focusfl.sweeps.cache import ResultCache
from focusfl.io.atomic import read_csv
from focusfl.io.folders import MARKER, check_target, open_output, output_folder

RUN = ["run", "--algorithm", "focus", "--lr", "2e-4", "--rounds", "3"]


def make_output(target: Path, files: dict[str, str], kind: str = "test") -> None:
    with output_folder(target, kind=kind) as work:
        for rel, text in files.items():
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            (work / rel).write_text(text)


def contents(folder: Path) -> dict[str, str]:
    """Every file below ``folder`` but the marker, with its text."""
    return {p.relative_to(folder).as_posix(): p.read_text() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != MARKER}


def assert_published(folder: Path, files: dict[str, str]) -> None:
    """``folder`` holds exactly ``files`` and a complete marker that lists exactly them."""
    assert contents(folder) == files
    marker = json.loads((folder / MARKER).read_text())
    assert marker["state"] == "complete" and sorted(marker["files"]) == sorted(files)


# -- what focusfl refuses to replace -------------------------------------------------------------
def user_folder(path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(text)
    return path


@pytest.mark.parametrize("case", ["config.json and summary.csv", "cwd", "parent of cwd", "home", "git repository"])
def test_a_users_folder_is_never_touched(tmp_path, case):
    project = user_folder(tmp_path / "project", {".git/HEAD": "ref: refs/heads/main\n", "paper.tex": "precious",
                                                 "src/model.py": "x = 1\n"})
    home = user_folder(tmp_path / "users" / "me", {"notes.txt": "mine"})
    cwd, env = tmp_path, cli_env(HOME=str(home))
    out, reason = {
        "config.json and summary.csv": (
            user_folder(tmp_path / "exp", {"config.json": "{}", "summary.csv": "a,b\n", "data.txt": "1 2 3"}),
            "remove it yourself"),
        "cwd": (".", "current folder"),
        "parent of cwd": ("..", "ancestor of the current folder"),
        "home": (home, "home folder"),
        "git repository": (project, "not focusfl's"),
    }[case]
    if case in ("cwd", "parent of cwd"):
        cwd = project if case == "cwd" else project / "src"
    before = snapshot(tmp_path)
    proc = run_cli(*RUN, "--out", str(out), cwd=cwd, env=env)
    line = assert_one_line_error(proc, 2, reason)
    assert str(out) in line
    assert snapshot(tmp_path) == before  # nothing deleted, emptied, or written beside it


def test_the_home_folder_and_its_ancestors_and_the_root_are_refused(tmp_path, monkeypatch):
    home = tmp_path / "users" / "me"
    home.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    for folder, reason in [(home, "is the home folder"), (home.parent, "is an ancestor of the home folder"),
                           (Path("/"), "is the root folder"), (Path.cwd(), "is the current folder")]:
        with pytest.raises(ConfigError, match=reason):
            check_target(folder)
    check_target(home / "runs" / "x")


def test_legacy_outputs_without_a_marker_are_refused_with_advice(tmp_path):
    with pytest.raises(ConfigError, match="remove it yourself or choose another folder"):
        check_target(user_folder(tmp_path / "old-run", {"metrics.csv": "round\n0\n", "config.json": "{}"}))
    check_target(tmp_path / "empty-is-fine")
    (tmp_path / "empty-is-fine").mkdir()
    check_target(tmp_path / "empty-is-fine")


def test_a_symlink_is_judged_by_what_it_points_to(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    (tmp_path / "to-home").symlink_to(tmp_path / "home")
    with pytest.raises(ConfigError, match="home folder"):
        check_target(tmp_path / "to-home")
    (tmp_path / "to-thesis").symlink_to(user_folder(tmp_path / "thesis", {"a.tex": "x"}))
    with pytest.raises(ConfigError, match="not focusfl's"):
        check_target(tmp_path / "to-thesis")
    (tmp_path / "empty").mkdir()
    (tmp_path / "to-empty").symlink_to(tmp_path / "empty")
    assert check_target(tmp_path / "to-empty") == tmp_path / "empty"


def test_out_below_a_file_is_one_line(tmp_path):
    (tmp_path / "results.txt").write_text("mine")
    before = snapshot(tmp_path)
    proc = run_main(*RUN, "--out", str(tmp_path / "results.txt" / "run"), cwd=tmp_path)
    assert_one_line_error(proc, 2, "is a file, not a folder")
    assert snapshot(tmp_path) == before
    with pytest.raises(ConfigError, match="exists and is not a folder"):
        check_target(tmp_path / "results.txt")


def _without_permission_override() -> None:
    """Run as root without CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH, so mode bits bind it."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP: gone from the exec'd process
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def test_out_under_an_unwritable_folder_is_one_line(tmp_path):
    # Root passes every permission check (os.access says so too), so a 0o500 folder would just
    # be written. As root the CLI runs with the capabilities that bypass mode bits dropped from
    # its bounding set; it stays uid 0, so it can still read the interpreter under /root.
    readonly = user_folder(tmp_path / "readonly", {"data.txt": "mine"})
    readonly.chmod(0o500)
    try:
        before = snapshot(tmp_path)
        proc = subprocess.run(
            [sys.executable, "-m", "focusfl.cli", *RUN, "--out", str(readonly / "deeper" / "run")], cwd=tmp_path,
            env=cli_env(), capture_output=True, text=True, timeout=300,
            preexec_fn=_without_permission_override if os.geteuid() == 0 else None,
        )
        assert_one_line_error(proc, 2, "is not writable")
        assert snapshot(tmp_path) == before
    finally:
        readonly.chmod(0o700)


def test_a_user_file_added_to_a_focusfl_output_is_kept(tmp_path):
    out = tmp_path / "run"
    make_output(out, {"metrics.csv": "round\n0\n", "config.json": "{}"}, kind="run")
    (out / "my-notes.md").write_text("what I saw")
    before = snapshot(tmp_path)
    proc = run_main(*RUN, "--out", str(out), cwd=tmp_path)
    assert_one_line_error(proc, 2, "holds 'my-notes.md', which focusfl did not write")
    assert snapshot(tmp_path) == before


def test_a_user_file_added_during_the_run_stops_the_replacement(tmp_path):
    out = tmp_path / "run"
    make_output(out, {"a.csv": "old"})
    with pytest.raises(ConfigError, match="'later.txt', which focusfl did not write"):
        with output_folder(out, kind="test") as work:
            (work / "a.csv").write_text("new")
            (out / "later.txt").write_text("mine")
    assert contents(out) == {"a.csv": "old", "later.txt": "mine"}
    # The new results stay in the partial folder; the next writer without keep_partial clears it.
    assert contents(tmp_path / ".run.focusfl-partial") == {"a.csv": "new"}
    assert not (tmp_path / ".run.focusfl-lock").exists()


# -- replacing focusfl's own outputs -------------------------------------------------------------
def test_replacing_deletes_only_what_the_old_marker_lists_and_drops_the_cache(tmp_path):
    out = tmp_path / "run"
    make_output(out, {"a.csv": "old", "sub/b.csv": "old"})
    with output_folder(out, kind="test") as work:
        (work / "c.csv").write_text("new")
        ResultCache(work).get_or_compute({"trial": 1}, lambda: [{"x": 1.0}])
        assert (work / ".cache").is_dir()
    assert_published(out, {"c.csv": "new"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


CRASHING_WRITER = """
import json, os, sys
from pathlib import Path
from focusfl.io import folders as outputs

target, crash_at, mode = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
if len(sys.argv) > 4 and sys.argv[4] == "renames":  # a platform that cannot exchange two folders
    outputs.exchange = lambda first, second: False
steps = []

def crash_between_steps(name):
    if mode == "recover" and (name == "create partial folder" or "create partial folder" in steps):
        steps.append("create partial folder")  # recovery is over: the rest is an ordinary start
        return
    steps.append(name)
    if len(steps) == crash_at:
        os._exit(9)

outputs._after_step = crash_between_steps
if mode == "publish":
    with outputs.output_folder(target, kind="test") as work:
        for rel, text in {"a.csv": "new", "c.csv": "new", "d/e.csv": "new"}.items():
            (work / rel).parent.mkdir(exist_ok=True)
            (work / rel).write_text(text)
else:  # what the next writer does first: recover, then give up
    out = outputs.open_output(target, kind="test")
    out.discard()
    out.close()
print(json.dumps(steps))
"""

OLD = {"a.csv": "old", "b.csv": "old", "sub/f.csv": "old"}
NEW = {"a.csv": "new", "c.csv": "new", "d/e.csv": "new"}


def test_a_crash_between_any_two_steps_leaves_the_old_or_the_new_output_whole(tmp_path):
    script = tmp_path / "writer.py"
    script.write_text(CRASHING_WRITER)

    def writer(target: Path, crash_at: int, mode: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-S", str(script), str(target), str(crash_at), mode],
                              env=cli_env(), capture_output=True, text=True, timeout=60)

    def fresh(k: int) -> Path:
        (tmp_path / f"case{k}").mkdir()
        make_output(tmp_path / f"case{k}" / "out", OLD)
        return tmp_path / f"case{k}" / "out"

    steps = len(json.loads(writer(fresh(0), 0, "publish").stdout))
    assert_published(tmp_path / "case0" / "out", NEW)
    assert steps >= 15  # partial folder + marker, fsyncs, marker, 2 renames, fsync, 4 deletions, ...
    outcomes = set()
    for k in range(1, steps + 1):
        target = fresh(k)
        assert writer(target, k, "publish").returncode == 9
        # The next writer recovers; it may itself be killed at any step of recovering, and retried.
        j = 1
        while (recovery := writer(target, j, "recover")).returncode == 9:
            j += 1
        assert recovery.returncode == 0, recovery.stderr
        whole = contents(target)
        assert whole in (OLD, NEW), (k, whole)
        assert_published(target, whole)
        assert [p.name for p in target.parent.iterdir()] == ["out"], k
        outcomes.add("new" if whole == NEW else "old")
    assert outcomes == {"old", "new"}


@pytest.mark.parametrize("swap", ["exchange", "renames"])
def test_killed_at_every_step_of_a_replacement_the_path_holds_a_whole_output(tmp_path, swap):
    """The replacement killed after each of its steps: ``out`` holds the old or the new output,
    whole, at that instant (with an atomic exchange; the two-rename fallback may lack it only
    between its two renames); and once the new output was marked complete it is the one the
    next writer finds in place: a complete run is never stranded in the hidden folder."""
    script = tmp_path / "writer.py"
    script.write_text(CRASHING_WRITER)

    def writer(target: Path, crash_at: int, mode: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-S", str(script), str(target), str(crash_at), mode, swap],
                              env=cli_env(), capture_output=True, text=True, timeout=60)

    def fresh(k: int) -> Path:
        (tmp_path / f"case{k}").mkdir()
        make_output(tmp_path / f"case{k}" / "out", OLD)
        return tmp_path / f"case{k}" / "out"

    names = json.loads(writer(fresh(0), 0, "publish").stdout)
    assert_published(tmp_path / "case0" / "out", NEW)
    assert ("exchange new into place" in names) and ("move new into place" in names) == (swap == "renames")
    # The partial folder's own marker is renamed into place first, the complete one second.
    complete_at = [k for k, name in enumerate(names, 1) if name == "rename into place"][1]
    for k in range(1, len(names) + 1):
        target = fresh(k)
        assert writer(target, k, "publish").returncode == 9
        if swap == "exchange" or names[k - 1] != "move old aside":
            assert contents(target) in (OLD, NEW), (k, names[k - 1])
            assert json.loads((target / MARKER).read_text())["state"] == "complete"
        else:  # the fallback's window: between its two renames
            assert not target.exists()
        j = 1
        while (recovery := writer(target, j, "recover")).returncode == 9:
            j += 1
        assert recovery.returncode == 0, recovery.stderr
        assert_published(target, NEW if k >= complete_at else OLD)
        assert [p.name for p in target.parent.iterdir()] == ["out"], (k, names[k - 1])


def test_four_writers_racing_leave_one_whole_result_and_no_leftovers(tmp_path):
    out = tmp_path / "race" / "run"
    writers = [subprocess.Popen([sys.executable, "-m", "focusfl.cli", "run", "--algorithm", "focus", "--lr", "2e-4",
                                 "--rounds", "20", "--seed", str(seed), "--out", str(out)],
                                env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for seed in range(4)]
    finished = [(w.wait(timeout=300), w.communicate()) for w in writers]
    for code, (stdout, stderr) in finished:
        assert "Traceback" not in stderr, stderr
        if code != 0:
            proc = subprocess.CompletedProcess([], code, stdout, stderr)
            assert_one_line_error(proc, 2, "is being written by another focusfl process (pid ")
    assert any(code == 0 for code, _ in finished)
    assert sorted(p.name for p in out.parent.iterdir()) == ["run"]
    marker = json.loads((out / MARKER).read_text())
    assert marker["state"] == "complete"
    assert sorted(marker["files"]) == sorted(p.name for p in out.iterdir() if p.name != MARKER)
    assert sorted(marker["files"]) == ["checkpoint.pt", "config.json", "curve.png", "metrics.csv", "model.pt"]
    config = json.loads((out / "config.json").read_text())
    assert config["seed"] in [seed for seed, (code, _) in enumerate(finished) if code == 0]
    assert [int(row["round"]) for row in read_csv(out / "metrics.csv")] == list(range(21))


LOCK_STRESS = """
import sys
from focusfl.errors import ConfigError
from focusfl.io.folders import output_folder

wins = busy = 0
for i in range(40):
    try:
        with output_folder(sys.argv[1], kind="stress") as work:
            (work / "n.txt").write_text(sys.argv[2])
        wins += 1
    except ConfigError as exc:
        assert "being written by another focusfl process" in str(exc), exc
        busy += 1
print(wins, busy)
"""


def test_the_lock_leaves_no_file_behind_however_writers_interleave(tmp_path):
    script = tmp_path / "stress.py"
    script.write_text(LOCK_STRESS)
    out = tmp_path / "shared" / "out"
    procs = [subprocess.Popen([sys.executable, str(script), str(out), str(k)], env=cli_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for k in range(4)]
    results = [p.communicate(timeout=120) + (p.returncode,) for p in procs]
    for stdout, stderr, code in results:
        assert code == 0 and not stderr, stderr
    assert sum(int(stdout.split()[0]) for stdout, _, _ in results) > 0
    assert [p.name for p in out.parent.iterdir()] == ["out"]
    assert_published(out, {"n.txt": (out / "n.txt").read_text()})


# -- permissions and stale leftovers -------------------------------------------------------------
def test_created_folders_follow_the_umask(tmp_path):
    previous = os.umask(0o022)  # inherited by the subprocess
    try:
        proc = run_cli(*RUN, "--out", str(tmp_path / "new" / "run"), cwd=tmp_path)
    finally:
        os.umask(previous)
    assert proc.returncode == 0, proc.stderr
    for folder in (tmp_path / "new", tmp_path / "new" / "run"):
        assert folder.stat().st_mode & 0o777 == 0o755
    for name in ("metrics.csv", "config.json", MARKER):
        assert (tmp_path / "new" / "run" / name).stat().st_mode & 0o777 == 0o644
    for umask in (0o002, 0o077):
        previous = os.umask(umask)
        try:
            make_output(tmp_path / f"u{umask:o}" / "out", {"a.csv": "x"})
        finally:
            os.umask(previous)
        assert (tmp_path / f"u{umask:o}" / "out").stat().st_mode & 0o777 == 0o777 & ~umask
        assert (tmp_path / f"u{umask:o}").stat().st_mode & 0o777 == 0o777 & ~umask


def test_stale_scratch_of_dead_writers_is_cleaned_and_nothing_else(tmp_path):
    out = tmp_path / "run"
    # The old scheme: a dead focusfl left .run.XXXXXXXX (mkdtemp, mode 0700) with its files.
    dead = subprocess.run([sys.executable, "-c", (
        "import tempfile, pathlib, sys; d = pathlib.Path(tempfile.mkdtemp(prefix='.run.', dir=sys.argv[1]));"
        "(d / 'metrics.csv').write_text('round\\n'); (d / 'curve.png').write_bytes(b'png'); print(d)"),
        str(tmp_path)], capture_output=True, text=True, check=True)
    legacy = Path(dead.stdout.strip())
    assert legacy.is_dir()
    user_hidden = user_folder(tmp_path / ".run.drafts01", {"draft.tex": "mine"})  # not focusfl's files
    user_hidden.chmod(0o700)
    # A partial of a writer killed in the middle of its block.
    subprocess.run([sys.executable, "-c", (
        "import os, sys; from focusfl.io.folders import output_folder\n"
        "with output_folder(sys.argv[1], kind='test', keep_partial=True) as work:\n"
        "    (work / 'half.csv').write_text('1')\n"
        "    os._exit(9)\n"), str(out)], env=cli_env())
    partial = tmp_path / ".run.focusfl-partial"
    assert (partial / "half.csv").exists()
    with open_output(out, kind="test") as kept:  # keep_partial (the default of open_output)
        assert kept.found_partial and (kept.work / "half.csv").exists()
    assert not legacy.exists()
    make_output(out, {"a.csv": "new"})  # output_folder: keep_partial=False clears it
    assert_published(out, {"a.csv": "new"})
    assert sorted(p.name for p in tmp_path.iterdir()) == [".run.drafts01", "run"]
    assert contents(user_hidden) == {"draft.tex": "mine"}


def test_a_partial_of_another_kind_is_not_reused(tmp_path):
    out = tmp_path / "run"
    with open_output(out, kind="tune") as first:
        (first.work / "x").write_text("1")
    with open_output(out, kind="run") as second:
        assert not second.found_partial and not (second.work / "x").exists()
        second.discard()
    assert list(tmp_path.iterdir()) == []


# -- finished runs survive a kill ----------------------------------------------------------------
def test_result_cache_round_trips_floats_bit_for_bit(tmp_path):
    values = [math.inf, -math.inf, math.nan, -0.0, 0.1 + 0.2, 5e-324, 1.7976931348623157e308, 1 / 3]
    rows = [{"v": v, "i": 2**70, "s": "x,y", "n": None} for v in values]
    first = ResultCache(tmp_path).get_or_compute({"lr": 1e-3}, lambda: rows)
    again = ResultCache(tmp_path).get_or_compute({"lr": 1e-3}, lambda: pytest.fail("recomputed"))
    for got in (first, again):
        assert [struct.pack("<d", r["v"]) for r in got] == [struct.pack("<d", v) for v in values]
        assert all(r["i"] == 2**70 and r["s"] == "x,y" and r["n"] is None for r in got)
    assert len(list((tmp_path / ".cache").glob("*.json"))) == 1
    assert ResultCache.digest({"a": 1, "b": 2}) == ResultCache.digest({"b": 2, "a": 1})


TUNE = ["tune", "--algorithm", "focus", "--problem", "ridge:dim=5,clients=4,samples=10", "--rounds", "1000",
        "--eval-every", "10", "--points", "6", "--lr-min", "1e-4", "--lr-max", "1e-2"]



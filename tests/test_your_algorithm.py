"""An algorithm of the user's own (docs/your-algorithm.md), through the installed ``focusfl``.

The tutorial's file is written into a temporary folder and its commands run as a user types
them (at test size): `focusfl check` passes it, `run`, `sweep` and `federation local` run it
by its import path. Copies with planted bugs each fail the matching check, with its own line.
Without --allow-algorithm-import nothing is imported: a module whose import leaves a marker
file leaves none, and every command says so in one line naming the flag (exit 2).

The tutorial's commands, a module path and the federation app's permission run through the
console script; the other tests call ``focusfl.cli.main`` in this process (cli_harness.run_main),
for commands whose console script those already run.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from cli_harness import cli_env, run_cli, run_main
from test_docs import ROOT, FENCE
from test_docs_run import _small_experiment, small

TUTORIAL = ROOT / "docs" / "your-algorithm.md"
FLAG = "--allow-algorithm-import"
TARGET = "my_prox.py:MyProx"


def tutorial_blocks() -> list[tuple[str, str]]:
    """(language, text) of every fenced block of the tutorial, in order ("shell" when unnamed)."""
    blocks, lang, lines = [], None, []
    for line in TUTORIAL.read_text().splitlines():
        fence = FENCE.match(line.strip())
        if fence and lang is None:
            lang, lines = fence.group(1) or "shell", []
        elif fence:
            blocks.append((lang, "\n".join(lines) + "\n"))
            lang = None
        elif lang is not None:
            lines.append(line)
    return blocks


def named_file(text: str) -> str | None:
    """The file a block is (its first line ``# NAME.ext``), or None."""
    match = re.match(r"# ([\w.-]+\.(py|csv|toml))\b", text)
    return match.group(1) if match else None


def algorithm_source() -> str:
    return next(text for lang, text in tutorial_blocks() if named_file(text) == "my_prox.py")


def write_algorithm(folder: Path, name: str = "my_prox.py", source: str | None = None) -> Path:
    path = folder / name
    path.write_text(source if source is not None else algorithm_source())
    return path


def planted(old: str, new: str) -> str:
    """The tutorial's algorithm with ``old`` (which it holds once) replaced by ``new``."""
    source = algorithm_source()
    assert source.count(old) == 1, old
    return source.replace(old, new)


# -- the tutorial, as a user types it --------------------------------------------------------------
def _run_line(line: str, folder: Path) -> tuple[list[str], subprocess.CompletedProcess, int]:
    command, _, comment = line.partition("#")
    expected = int(m.group(1)) if (m := re.search(r"exit (\d)", comment)) else 0
    words = shlex.split(command)
    if words[0] == "focusfl":
        argv = small(words[1:])
        return argv, run_cli(*argv, cwd=folder, timeout=300), expected
    return words, subprocess.run(["bash", "-c", command], cwd=folder, capture_output=True, text=True,
                                 env=cli_env()), expected


@pytest.fixture(scope="module")
def tutorial(tmp_path_factory) -> tuple[Path, list]:
    """docs/your-algorithm.md followed once in a fresh folder: that folder and, for each command
    line in order, (argv, its process, the exit status the tutorial expects)."""
    tmp_path = tmp_path_factory.mktemp("tutorial")
    ran = []
    for lang, text in tutorial_blocks():
        name = named_file(text)
        if name is not None:
            (tmp_path / name).write_text(_small_experiment(text) if name.endswith(".toml") else text)
        elif lang == "python":
            proc = subprocess.run([sys.executable, "-c", text], cwd=tmp_path, capture_output=True, text=True,
                                  env=cli_env(), timeout=300)
            assert proc.returncode == 0, proc.stderr
            assert float(proc.stdout.strip()) < 1.0
        elif lang == "shell":
            for line in filter(None, (raw.strip() for raw in text.splitlines())):
                if line.startswith("focusfl federation") and importlib.util.find_spec("flwr") is None:
                    continue  # the tutorial's test is skipped without Flower, the check's is not
                ran.append(_run_line(line, tmp_path))
    return tmp_path, ran


@pytest.mark.slow
def test_the_tutorial_runs_as_a_user_types_it(tutorial):
    """Every block of docs/your-algorithm.md: its files written, its Python run, its commands
    run at test size: check passes the class, the broken copy fails (exit 1), run, sweep, and
    federation local run it by its import path."""
    pytest.importorskip("flwr")
    tmp_path, ran = tutorial
    for argv, proc, expected in ran:
        assert proc.returncode == expected, f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr[-800:]}"
        assert "Traceback" not in proc.stderr
    outputs = {" ".join(argv[:2]): proc.stdout for argv, proc, _ in ran}
    assert "14 passed, 0 failed" in outputs[f"check {TARGET}"]
    assert "FAIL tracking" in outputs["check broken_prox.py:MyProx"]
    record = json.loads((tmp_path / "runs/my_prox/config.json").read_text())
    assert record["algorithm"]["name"] == TARGET and record["algorithm"]["mu"] == 0.1
    assert record["inputs"]["algorithm code"]["sha256"] == record["algorithm"]["sha256"]
    summary = (tmp_path / "runs/compare/summary.csv").read_text()
    assert summary.count(f"{TARGET}:mu=0.1") == 2  # under markov and under the trace
    if (tmp_path / "runs/fed").is_dir():
        federated = json.loads((tmp_path / "runs/fed/config.json").read_text())
        assert federated["algorithm"]["name"].endswith(TARGET) and federated["algorithm"]["sha256"]


# -- focusfl check: the kit on planted bugs ----------------------------------------------------------
BUGS = {
    # a client row not written back: the new memory computed, the old rows returned
    "tracking": ("return Clients(m=update), ", "return clients, "),
    # state_size forgets the N x d table
    "state_size": ("StateSize(floats=2 * dim + num_clients * dim)", "StateSize(floats=2 * dim)"),
    # the server step gives the last message extra weight: it depends on the clients' order
    "server_order": ("x=server.x + self.server_lr * u / ctx.num_clients",
                     "x=server.x + self.server_lr * (u + message.change[-1:].sum(0)) / ctx.num_clients"),
}


def test_check_passes_the_tutorial_algorithm(tutorial):
    """The tutorial's own `focusfl check my_prox.py:MyProx --allow-algorithm-import`, line by line."""
    tmp_path, ran = tutorial
    (proc,) = [proc for argv, proc, _ in ran if argv[:3] == ["check", TARGET, FLAG]]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"checking {TARGET} from {tmp_path / 'my_prox.py'} (SHA-256 ")
    checks = [line for line in lines[1:-1]]
    assert len(checks) == 14 and all(line.startswith("ok ") for line in checks), proc.stdout
    assert lines[-1] == "14 passed, 0 failed, 0 not applicable"


@pytest.mark.parametrize("check", list(BUGS))
def test_a_planted_bug_fails_its_own_check(tmp_path, check):
    old, new = BUGS[check]
    write_algorithm(tmp_path, "buggy.py", planted(old, new))
    proc = run_main("check", "buggy.py:MyProx", FLAG, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    failed = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("FAIL")]
    assert check in failed, proc.stdout
    # the bug's own line; the others it may cause say the same fault in other words
    expected_alongside = {"tracking": {"convergence"}, "state_size": {"state_size_1e5"}, "server_order": set()}
    assert set(failed) <= {check} | expected_alongside[check], proc.stdout


def test_check_of_a_registered_algorithm_and_its_bad_inputs(tmp_path):
    proc = run_main("check", "fedavg:server_lr=0.5", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1].endswith("1 not applicable"), proc.stdout
    for argv, words in [(["nope"], "unknown algorithm 'nope'"), (["fedavg:wat=1"], "unknown key 'wat'"),
                        (["fedavg:server_lr=0"], "server_lr must be a positive number"),
                        (["missing.py:MyProx", FLAG], "file 'missing.py' not found")]:
        bad = run_main("check", *argv, cwd=tmp_path)
        assert bad.returncode == 2 and words in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


# -- without the flag, nothing is imported -----------------------------------------------------------
MARKER_SOURCE = '''
from pathlib import Path
Path(__file__).with_suffix(".imported").write_text("imported")
'''


@pytest.mark.parametrize("argv", [
    ["run", "--algorithm", "marked.py:MyProx", "--rounds", "2", "--out", "runs/a"],
    # refused before the problem is built: no dataset is looked for, let alone downloaded
    ["run", "--algorithm", "marked.py:MyProx", "--problem", "nn:data=mnist,clients=4", "--download",
     "--data-dir", "data", "--out", "runs/n"],
    ["check", "marked.py:MyProx"],
    ["tune", "--algorithm", "focus,marked.py:MyProx", "--rounds", "2", "--points", "2", "--out", "runs/t"],
    ["sweep", "exp.toml", "--out", "runs/s"],
    ["reproduce", "mnist-demo", "--data", "x.npz", "--algorithms", "fedavg,marked.py:MyProx", "--out", "runs/d"],
    ["federation", "local", "--nodes", "2", "--algorithm", "marked.py:MyProx", "--problem", "ridge:clients=2"],
])
def test_without_the_flag_nothing_is_imported(tmp_path, argv):
    write_algorithm(tmp_path, "marked.py", algorithm_source() + MARKER_SOURCE)
    (tmp_path / "exp.toml").write_text('algorithms = ["focus", "marked.py:MyProx"]\nrounds = 2\n')
    proc = run_main(*argv, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and FLAG in lines[0] and "would import and run Python code" in lines[0], proc.stderr
    assert not (tmp_path / "marked.imported").exists() and not (tmp_path / "data").exists()


def test_with_the_flag_the_marker_shows_it_was_imported(tmp_path):
    write_algorithm(tmp_path, "marked.py", algorithm_source() + MARKER_SOURCE)
    proc = run_main("run", "--algorithm", "marked.py:MyProx", FLAG, "--rounds", "2", "--out", "runs/a", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "marked.imported").exists()


def test_a_module_path_is_imported_and_its_source_recorded(tmp_path):
    package = tmp_path / "mine"
    package.mkdir()
    (package / "__init__.py").write_text("")
    write_algorithm(package, "prox.py")
    env = cli_env(PYTHONPATH=f"{cli_env()['PYTHONPATH']}:{tmp_path}")
    proc = run_cli("run", "--algorithm", "mine.prox:MyProx:mu=0.2", FLAG, "--rounds", "2", "--out", "runs/m",
                   cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    record = json.loads((tmp_path / "runs/m/config.json").read_text())
    assert record["algorithm"]["name"] == "mine.prox:MyProx" and record["algorithm"]["mu"] == 0.2
    assert record["inputs"]["algorithm code"]["path"] == str(package / "prox.py")


@pytest.mark.parametrize("source,target,words", [
    ("x = 1\n", "bad.py:MyProx", "the module has no 'MyProx'"),
    ("MyProx = 3\n", "bad.py:MyProx", "is not a subclass of focusfl.algorithms.Algorithm"),
    ("def broken(:\n", "bad.py:MyProx", "cannot import algorithm 'bad.py:MyProx': SyntaxError"),
    ("raise RuntimeError('no GPU here')\n", "bad.py:MyProx", "RuntimeError: no GPU here"),
    ("from focusfl.algorithms import Algorithm\nclass MyProx(Algorithm):\n    name = 'p'\n", "bad.py:MyProx",
     "does not define client_round, communication, init, server_round, state_size"),
    (None, "bad.py:MyProx:nu=1", "unknown key 'nu'"),
    (None, "bad.py:MyProx:mu=-1", "mu must be >= 0"),
])
def test_bad_algorithm_files_end_in_one_line(tmp_path, source, target, words):
    write_algorithm(tmp_path, "bad.py", source)
    proc = run_main("run", "--algorithm", target, FLAG, "--rounds", "2", "--out", "runs/b", cwd=tmp_path)
    assert proc.returncode == 2 and words in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "runs").exists()


# -- changed code: a replay or a resume says so ---------------------------------------------------------
def test_replay_and_resume_on_changed_code_are_refused_unless_accepted(tmp_path):
    path = write_algorithm(tmp_path)
    base = ["--algorithm", f"{TARGET}:mu=0.1", "--participation", "markov", "--rounds", "3"]
    assert run_main("run", *base, FLAG, "--out", "runs/a", cwd=tmp_path).returncode == 0
    assert run_main("run", "--config", "runs/a/config.json", FLAG, "--out", "runs/r", cwd=tmp_path).returncode == 0
    assert (tmp_path / "runs/r/metrics.csv").read_bytes() == (tmp_path / "runs/a/metrics.csv").read_bytes()
    refused = run_main("run", "--resume", "runs/a", "--rounds", "5", cwd=tmp_path)
    assert refused.returncode == 2 and FLAG in refused.stderr
    path.write_text(path.read_text() + "\n# an edit\n")
    for argv in (["--config", "runs/a/config.json", "--out", "runs/r2"], ["--resume", "runs/a", "--rounds", "5"]):
        proc = run_main("run", *argv, FLAG, cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr
        line = proc.stderr.strip()
        assert "algorithm code" in line and "has changed since" in line and "--accept-changed-inputs" in line
        assert len(line.splitlines()) == 1
    proc = run_main("run", "--resume", "runs/a", "--rounds", "5", FLAG, "--accept-changed-inputs", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    record = json.loads((tmp_path / "runs/a/config.json").read_text())
    assert record["inputs_changed"][0]["input"] == "algorithm code"
    assert record["algorithm"]["sha256"] == record["inputs"]["algorithm code"]["sha256"]


def test_the_permission_is_the_commands_never_the_experiment_files(tmp_path):
    write_algorithm(tmp_path, "marked.py", algorithm_source() + MARKER_SOURCE)
    (tmp_path / "exp.toml").write_text('algorithms = ["marked.py:MyProx"]\nallow_algorithm_import = true\nrounds = 2\n')
    proc = run_main("sweep", "exp.toml", "--out", "runs/s", cwd=tmp_path)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "marked.imported").exists()


# -- the library side ------------------------------------------------------------------------------------
def test_import_targets_parse_and_format_as_specs():
    from focusfl.spec import format_spec, parse_spec

    assert parse_spec("a/b.py:MyProx:mu=0.1,server_lr=2") == ("a/b.py:MyProx", {"mu": 0.1, "server_lr": 2})
    assert parse_spec("pkg.mod:Cls") == ("pkg.mod:Cls", {})
    assert format_spec("a/b.py:MyProx", {"mu": 0.1}) == "a/b.py:MyProx:mu=0.1"
    # registered SPECs and nn's model=package.module:factory read as before
    assert parse_spec("fedavg:weighting=all") == ("fedavg", {"weighting": "all"})
    assert parse_spec("nn:model=pkg.mod:factory,data=x.npz") == ("nn", {"model": "pkg.mod:factory", "data": "x.npz"})


def test_make_algorithm_imports_only_within_the_permission(tmp_path):
    from focusfl.algorithms import algorithm_record, make_algorithm
    from focusfl.algorithms.importing import ChangedCode, algorithm_imports, planned_code, recorded_code
    from focusfl.errors import ConfigError

    path = write_algorithm(tmp_path, "perm.py", algorithm_source() + MARKER_SOURCE)
    target = f"{path}:MyProx"
    with pytest.raises(ConfigError, match="pass --allow-algorithm-import"):
        make_algorithm(target)
    assert not (tmp_path / "perm.imported").exists()
    with algorithm_imports(True):
        algorithm = make_algorithm(f"{target}:mu=0.3", lr=0.01)
        record = algorithm_record(algorithm)
        assert record["name"] == target and record["mu"] == 0.3 and len(record["sha256"]) == 64
        assert make_algorithm(record) == algorithm
        with pytest.raises(ConfigError, match="has changed since it was recorded"):
            make_algorithm({**record, "sha256": "0" * 64})
        # a sweep's worker builds only the code its runs were planned with (planned_code)
        assert recorded_code(record) == {target: record["sha256"]} and recorded_code("fedavg") == {}
        with planned_code(recorded_code(record)):
            assert make_algorithm(f"{target}:mu=0.3", lr=0.01) == algorithm
            path.write_text(path.read_text() + "\n# an edit\n")
            with pytest.raises(ChangedCode, match="has changed since its runs were planned"):
                make_algorithm(f"{target}:mu=0.3", lr=0.01)
        make_algorithm(f"{target}:mu=0.3", lr=0.01)  # planned no more: the new code is built
    assert (tmp_path / "perm.imported").exists()
    with pytest.raises(ConfigError, match="pass --allow-algorithm-import"):
        make_algorithm(record)  # the permission ended with the block


def test_federation_app_carries_the_permission_and_an_absolute_path(tmp_path):
    pytest.importorskip("flwr")
    from focusfl.flower.server_app import FederationConfig

    write_algorithm(tmp_path)
    refused = run_main("federation", "app", "app", "--algorithm", TARGET, "--problem", "ridge:clients=3", cwd=tmp_path)
    assert refused.returncode == 2 and FLAG in refused.stderr and not (tmp_path / "app").exists()
    proc = run_cli("federation", "app", "app", "--algorithm", f"{TARGET}:mu=0.2", "--problem", "ridge:clients=3", FLAG,
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "app" / "run.toml").read_text()
    config = FederationConfig.from_json(json.loads(text.split("=", 1)[1]))
    assert config.allow_algorithm_import is True
    assert config.algorithm == f"{tmp_path / 'my_prox.py'}:MyProx:mu=0.2"


# -- code that changes between planning and running ------------------------------------------------------
# The class edits its own source in its first round (a sweep's planning builds runs, never steps
# them): the sweep's first run runs the planned code, and every later run would build the edited one.
EDITING_SOURCE = '''

from pathlib import Path as _Path


@dataclass(frozen=True)
class Editing(MyProx):
    name = "editing"

    def client_round(self, server, clients, oracle, ctx):
        path, edit = _Path(__file__), "# " + "edited"  # not a line of the file until it is edited
        if edit not in path.read_text().splitlines():
            path.write_text(path.read_text() + "\\n" + edit + "\\n")
        return super().client_round(server, clients, oracle, ctx)
'''


@pytest.mark.parametrize("argv", [
    ["sweep", "exp.toml", "--out", "runs/s"],
    ["sweep", "exp.toml", "--out", "runs/s", "--workers", "2"],  # the planned digest travels to the workers
    ["tune", "--algorithm", "editing.py:Editing", "--rounds", "2", "--points", "3", "--out", "runs/s"],
])
def test_code_edited_between_planning_and_running_is_refused(tmp_path, argv):
    """The runs are keyed (and their folders named) by the digest of the code the sweep planned them
    with: a run that would build other code stops the sweep in one line (exit 2) instead of writing
    results of other code under the planned key; the runs finished before it stay, valid."""
    path = write_algorithm(tmp_path, "editing.py", algorithm_source() + EDITING_SOURCE)
    planned = hashlib.sha256(path.read_bytes()).hexdigest()
    (tmp_path / "exp.toml").write_text('algorithms = ["editing.py:Editing"]\nseeds = [0, 1, 2]\nrounds = 2\n')
    proc = run_cli(*argv, FLAG, "--batch-runs", "1", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    line = proc.stderr.strip()
    assert len(line.splitlines()) == 1 and "algorithm code" in line and "since its runs were planned" in line, line
    assert "# edited" in path.read_text().splitlines()
    assert not (tmp_path / "runs/s/results.csv").exists()
    runs = [folder for folder in (tmp_path / "runs/s/runs").iterdir() if (folder / "config.json").is_file()]
    assert 1 <= len(runs) < 3  # the first run (or one per worker) ran the planned code
    for folder in runs:  # a run stopped when the sweep stopped is interrupted, with the planned code too
        record = json.loads((folder / "config.json").read_text())
        assert record["algorithm"]["sha256"] == planned and record["status"] in ("complete", "interrupted"), folder

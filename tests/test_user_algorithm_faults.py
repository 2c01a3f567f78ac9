"""Your own algorithm when it misbehaves (docs/your-algorithm.md), through the installed ``focusfl``:
an exception in its code or a state of the wrong shape is one line naming its file, line and
method (exit 2, nothing written; --debug adds the traceback), a hyperparameter of the wrong type
is refused before its validate() sees it, a NaN is "not finite" in `focusfl check`, and the help
of --allow-algorithm-import says only what its command does.

The tutorial's class is the fixture (test_your_algorithm.planted); commands whose console script
other tests launch run through ``focusfl.cli.main`` in this process (cli_harness.run_main).
"""
from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from cli_harness import popen_cli, run_cli, run_main
from test_your_algorithm import FLAG, planted, write_algorithm

SMALL = ("--problem", "ridge:clients=4,samples=10,dim=5", "--rounds", "3")
SERVER_STEP = "return Server(x=server.x + self.server_lr * u / ctx.num_clients, u=u)"
CLIENT_ROWS = "return Clients(m=update), Message(change=update - clients.m)"


def _one_line(proc, words: str) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert re.search(words, lines[0]), lines[0]
    return lines[0]


def _line_of(source: str, text: str) -> int:
    return next(i for i, line in enumerate(source.splitlines(), 1) if text in line)


# -- an exception in the user's code ----------------------------------------------------------------
RAISING = {
    "server_round": (SERVER_STEP, "return Server(x=server.x / (ctx.round - ctx.round), u=u) if 1 / 0 else None"),
    "client_round": ("update = z - server.x", "update = z - server.x + int('x')"),
    "init": ("server = Server(x=x0.clone(), u=torch.zeros_like(x0))", "server = [][3]"),
    "validate": ('self._check_positive("server_lr", self.server_lr)', "{}['missing']"),
}
ERRORS = {"server_round": "ZeroDivisionError: division by zero",
          "client_round": "ValueError: invalid literal for int() with base 10: 'x'",
          "init": "IndexError: list index out of range", "validate": "KeyError: 'missing'"}


@pytest.mark.parametrize("method", list(RAISING))
def test_an_exception_in_the_users_code_is_their_line(tmp_path, method):
    source = planted(*RAISING[method])
    write_algorithm(tmp_path, "my_prox.py", source)
    line = _line_of(source, RAISING[method][1])
    proc = run_main("run", "--algorithm", "my_prox.py:MyProx", FLAG, *SMALL, "--out", "runs/a", cwd=tmp_path)
    said = _one_line(proc, re.escape(f"my_prox.py:MyProx: my_prox.py:{line} in {method}: {ERRORS[method]}"))
    assert said.startswith("focusfl: error: your algorithm"), said
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_debug_adds_the_users_traceback_through_the_console_script(tmp_path):
    source = planted(*RAISING["server_round"])
    write_algorithm(tmp_path, "my_prox.py", source)
    argv = ("run", "--algorithm", "my_prox.py:MyProx", FLAG, *SMALL, "--out", "runs/a")
    plain = run_cli(*argv, cwd=tmp_path)
    _one_line(plain, r"my_prox\.py:\d+ in server_round: ZeroDivisionError")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    debug = run_cli(*argv, "--debug", cwd=tmp_path)
    assert debug.returncode == 2 and "Traceback" in debug.stderr, debug.stderr
    assert f'my_prox.py", line {_line_of(source, RAISING["server_round"][1])}, in server_round' in debug.stderr
    assert debug.stderr.strip().splitlines()[-1] == plain.stderr.strip()


def test_sweep_tune_and_check_name_the_users_line(tmp_path):
    source = planted(*RAISING["client_round"])
    write_algorithm(tmp_path, "my_prox.py", source)
    where = rf"my_prox\.py:{_line_of(source, RAISING['client_round'][1])} in client_round: ValueError"
    (tmp_path / "exp.toml").write_text('algorithms = ["my_prox.py:MyProx"]\nproblems = ["ridge:clients=4,samples=10,'
                                       'dim=5"]\nrounds = 2\n')
    sweep = run_main("sweep", "exp.toml", FLAG, "--out", "runs/s", cwd=tmp_path)
    assert sweep.returncode != 0 and re.search(where, sweep.stdout + sweep.stderr), sweep.stdout + sweep.stderr
    assert "Traceback" not in sweep.stderr
    debug = run_main("sweep", "exp.toml", FLAG, "--out", "runs/s2", "--debug", cwd=tmp_path)
    assert "Traceback" in debug.stderr and "in client_round" in debug.stderr, debug.stderr
    tune = run_main("tune", "--algorithm", "my_prox.py:MyProx", FLAG, *SMALL, "--points", "2", "--out", "runs/t",
                    cwd=tmp_path)
    assert tune.returncode != 0 and re.search(where, tune.stdout + tune.stderr), tune.stdout + tune.stderr
    assert "Traceback" not in tune.stderr
    check = run_main("check", "my_prox.py:MyProx", FLAG, cwd=tmp_path)
    assert check.returncode == 1 and re.search(r"FAIL engines +raised in " + where, check.stdout), check.stdout


# -- a state of the wrong shape ----------------------------------------------------------------------
@pytest.mark.parametrize("old,new,words", [
    (CLIENT_ROWS, "return Clients(m=torch.cat([update, update[:, :1]], 1)), Message(change=update - clients.m)",
     r"client_round returned clients\.m of shape \[2, 6\], expected \[2, 5\]"),
    (SERVER_STEP, "return Server(x=torch.cat([server.x, server.x[:1]]), u=u)",
     r"server_round returned server\.x of shape \[6\], expected \[5\]"),
])
def test_a_state_of_the_wrong_shape_names_its_field(tmp_path, old, new, words):
    write_algorithm(tmp_path, "my_prox.py", planted(old, new))
    proc = run_main("run", "--algorithm", "my_prox.py:MyProx", FLAG, *SMALL, "--out", "runs/a", cwd=tmp_path)
    said = _one_line(proc, words)
    assert "my_prox.py:MyProx" in said and "size mismatch" not in said and "index_copy" not in said
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_check_names_the_field_of_the_wrong_shape(tmp_path):
    write_algorithm(tmp_path, "my_prox.py", planted(
        CLIENT_ROWS, "return Clients(m=torch.cat([update, update[:, :1]], 1)), Message(change=update - clients.m)"))
    proc = run_main("check", "my_prox.py:MyProx", FLAG, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert re.search(r"FAIL engines +raised: client_round returned clients\.m of shape \[2, 6\], expected \[2, 5\]",
                     proc.stdout), proc.stdout
    assert "index_copy" not in proc.stdout


# -- a hyperparameter of the wrong type ----------------------------------------------------------------
@pytest.mark.parametrize("spec,words", [
    ("my_prox.py:MyProx:mu=abc", "mu must be a number, got 'abc'"),
    ("my_prox.py:MyProx:server_lr=true", "server_lr must be a number, got True"),
    ("fedprox:mu=abc", "mu must be a number, got 'abc'"),
])
def test_a_hyperparameter_of_the_wrong_type_is_refused_by_its_annotation(tmp_path, spec, words):
    write_algorithm(tmp_path)
    proc = run_main("run", "--algorithm", spec, FLAG, *SMALL, "--out", "runs/a", cwd=tmp_path)
    _one_line(proc, re.escape(words))
    assert "not supported between" not in proc.stderr


# -- check says when a run is not finite ----------------------------------------------------------------
def test_check_says_not_finite_for_a_nan(tmp_path):
    write_algorithm(tmp_path, "my_prox.py", planted(SERVER_STEP, SERVER_STEP.replace("u=u)", "u=u * float('nan'))")))
    proc = run_main("check", "my_prox.py:MyProx", FLAG, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    engines = next(line for line in proc.stdout.splitlines() if line.split()[1:2] == ["engines"])
    assert engines.startswith("FAIL") and "not finite" in engines and "0.00e+00" not in engines, engines
    # the whole runs stop at the NaN; each says where it appeared (the server's u, in round 1)
    assert "KeyError" not in proc.stdout + proc.stderr, proc.stdout
    for check in ("float32", "communication", "convergence"):
        line = next(line for line in proc.stdout.splitlines() if line.split()[1:2] == [check])
        assert line.startswith("FAIL") and "not finite after round 1: server.u (NaN)" in line, line


# -- the flag's help says what each command does ---------------------------------------------------------
@pytest.mark.parametrize("command,recorded", [(["run"], True), (["sweep"], False), (["tune"], False),
                                              (["check"], False)])
def test_the_flag_help_names_config_and_resume_only_where_they_exist(command, recorded):
    proc = run_main(*command, "--help")
    text = " ".join(proc.stdout.split())
    assert FLAG in text, text
    assert ("--config or --resume" in text) == recorded and ("--resume" in text) == recorded, text


# -- a round that never ends stops on a second signal ---------------------------------------------------
HANG = ("        u = server.u + message.change.sum(0)\n",
        "        while ctx.round >= 2:  # a round that never ends\n            time.sleep(0.05)\n"
        "        u = server.u + message.change.sum(0)\n")


def _descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (read from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _wait_for(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="counts processes through /proc")
@pytest.mark.parametrize("command", ["run", "sweep"])
def test_a_hanging_algorithm_stops_on_the_second_sigterm_leaving_no_process(tmp_path, command):
    source = planted(*HANG).replace("import torch\n", "import time\n\nimport torch\n", 1)
    write_algorithm(tmp_path, "hang.py", source)
    if command == "run":
        argv = ("run", "--algorithm", "hang.py:MyProx", FLAG, *SMALL[:2], "--rounds", "5", "--checkpoint-every", "1",
                "--out", "runs/h")
        checkpoints = lambda: len(list(tmp_path.glob("runs/.h.*/checkpoint.pt")))  # noqa: E731
        wanted = 1
    else:
        (tmp_path / "exp.toml").write_text('algorithms = ["hang.py:MyProx"]\nproblems = ["ridge:clients=4,samples=10,'
                                           'dim=5"]\nrounds = 5\nseeds = [0, 1]\n')
        argv = ("sweep", "exp.toml", FLAG, "--workers", "2", "--checkpoint-every", "1", "--out", "runs/s")
        checkpoints = lambda: len(list(tmp_path.glob("runs/s/runs/.*/checkpoint.pt")))  # noqa: E731
        wanted = 2
    proc = popen_cli(*argv, cwd=tmp_path)
    assert _wait_for(lambda: checkpoints() >= wanted or proc.poll() is not None, 240), "no checkpoint"
    assert proc.poll() is None, proc.communicate()
    time.sleep(0.5)  # inside the round that never ends
    proc.send_signal(signal.SIGTERM)
    if command == "run":
        time.sleep(1.0)
        assert proc.poll() is None  # the first asks for the end of the round, which never comes
        below = _descendants(proc.pid)
        proc.send_signal(signal.SIGTERM)
    else:
        below = _descendants(proc.pid)
        assert below, "the sweep's workers"
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) <= 2, stderr
    assert _wait_for(lambda: not (_descendants(proc.pid) | {p for p in below if Path(f"/proc/{p}").exists()}), 30)
    assert checkpoints() >= wanted  # the last checkpoints are kept: `run --resume` / the same sweep continue them

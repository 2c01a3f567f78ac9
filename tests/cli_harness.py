"""Run ``focusfl`` as a user would: a subprocess under a memory limit, judged by what it prints.

Shared by the tests of bad inputs, output folders and interrupted runs. The subprocess gets an
address-space limit (4 GiB by default) so that an input which would make focusfl allocate too
much fails as it would on a small machine, instead of swapping this one.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import signal
import subprocess
import sys
import warnings
from pathlib import Path

GIB = 1 << 30


def _limit_memory(limit_bytes: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    return apply


def cli_env(**extra: str) -> dict[str, str]:
    """The environment of a focusfl subprocess: this checkout's sources first, one thread."""
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra)
    return env


def default_signals() -> None:
    """preexec_fn: SIGINT, SIGTERM and SIGHUP at their default dispositions in the child.

    A test runner started as a background job of a non-interactive shell ignores SIGINT, and
    children inherit that; signal tests must not depend on how the suite was started."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def focusfl_command() -> list[str]:
    """The installed ``focusfl`` console script beside this interpreter, as a user types it (its
    imports come from this checkout through cli_env's PYTHONPATH); ``python -m focusfl.cli`` only
    where the package was not installed."""
    script = Path(sys.executable).with_name("focusfl")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "focusfl.cli"]


_STARTED: list[subprocess.Popen] = []


def stop_started() -> None:
    """Kill what popen_cli started and is still running (a failed test must leave no orphan)."""
    while _STARTED:
        proc = _STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def popen_cli(*args: str, **kwargs) -> subprocess.Popen:
    """``focusfl ARGS`` started in the background, signals at their defaults;
    the ``no_orphans`` fixture of conftest.py kills it after the test if it still runs."""
    proc = subprocess.Popen([*focusfl_command(), *args], env=kwargs.pop("env", None) or cli_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=kwargs.pop("preexec_fn", default_signals), **kwargs)
    _STARTED.append(proc)
    return proc


def run_cli(
    *args: str,
    cwd: str | Path | None = None,
    limit_gib: float | None = 4,
    timeout: float = 300,
    env: dict[str, str] | None = None,
    stdin: str | None = None,
) -> subprocess.CompletedProcess:
    """``focusfl ARGS`` in ``cwd``; text output captured."""
    preexec = _limit_memory(int(limit_gib * GIB)) if limit_gib else None
    return subprocess.run(
        [*focusfl_command(), *args],
        cwd=cwd,
        env=env or cli_env(),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=preexec,
    )


def run_cli_together(commands: list[tuple[str, ...]], *, limit_gib: float | None = 4,
                     timeout: float = 300) -> list[subprocess.CompletedProcess]:
    """``run_cli`` of independent commands, all started before any is waited for: most of a short
    focusfl run is importing torch and its kin, which the processes do side by side (a test's
    wall time, not its result, changes). The results in the commands' order."""
    def preexec() -> None:
        default_signals()
        if limit_gib:
            _limit_memory(int(limit_gib * GIB))()

    started = [popen_cli(*args, preexec_fn=preexec) for args in commands]
    results = []
    for args, proc in zip(commands, started):
        stdout, stderr = proc.communicate(timeout=timeout)
        results.append(subprocess.CompletedProcess([*focusfl_command(), *args], proc.returncode, stdout, stderr))
    return results


def _warning_to_stderr(message, category, filename, lineno, file=None, line=None) -> None:
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def run_main(*args: str, cwd: str | Path | None = None, stdin: str | None = None) -> subprocess.CompletedProcess:
    """``focusfl ARGS`` run by ``focusfl.cli.main`` in this process, judged as ``run_cli``'s result.

    For a command whose console script another test already runs (this module's ``run_cli``):
    it costs no interpreter and no torch import (1-3 s a launch). What a user would see on the
    terminal is captured: stdout, stderr with argparse's exits, and the warnings an interpreter
    shows by default (as text on stderr, where a one-line check sees them); no memory limit."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.ExitStack() as stack:
        if cwd is not None:
            stack.enter_context(contextlib.chdir(cwd))
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        stack.enter_context(warnings.catch_warnings())
        warnings.resetwarnings()  # the interpreter's defaults, not the test runner's filters
        for quiet in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
            warnings.simplefilter("ignore", quiet)
        warnings.showwarning = _warning_to_stderr
        if stdin is not None:
            stack.enter_context(_stdin_from(stdin))
        from focusfl.cli import main

        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse: a bad option (2) or --help (0); as the interpreter exits
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if not isinstance(exc.code, (int, type(None))):
                print(exc.code, file=sys.stderr)
    return subprocess.CompletedProcess(["focusfl", *args], code, out.getvalue(), err.getvalue())


@contextlib.contextmanager
def _stdin_from(text: str):
    before, sys.stdin = sys.stdin, io.StringIO(text)
    try:
        yield
    finally:
        sys.stdin = before


# A child that runs ``focusfl.cli.main`` on each command of the JSON file ARGV[1] in turn, as
# the console script would (its own stdout and stderr, caught at the file descriptors so that
# what a library writes there counts too; the warnings shown afresh; an escaping exception a
# traceback and exit 1), and writes to ARGV[2] each command's exit status, output, CPU seconds
# and the snapshots of the folders it names after it ran.
_BATCH = """
import json, os, resource, sys, tempfile, traceback, warnings
from cli_harness import snapshot
from focusfl.cli import main


def cpu():
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in usage)


def run(argv):
    files = [tempfile.TemporaryFile(), tempfile.TemporaryFile()]
    sys.stdout.flush(), sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    for fd, file in zip((1, 2), files):
        os.dup2(file.fileno(), fd)
    try:
        with warnings.catch_warnings():  # what a fresh interpreter shows once, shown again
            try:
                code = main(argv)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except BaseException:
                traceback.print_exc()
                code = 1
    finally:
        sys.stdout.flush(), sys.stderr.flush()
        for fd, old in zip((1, 2), saved):
            os.dup2(old, fd)
            os.close(old)
    out, err = (file.seek(0) or file.read().decode(errors="replace") for file in files)
    return code, out, err


results = []
for argv, watched in json.load(open(sys.argv[1])):
    start = cpu()
    code, out, err = run(argv)
    results.append({"code": code, "stdout": out, "stderr": err, "cpu": cpu() - start,
                    "after": [snapshot(folder) for folder in watched]})
with open(sys.argv[2], "w") as handle:
    json.dump(results, handle)
"""


def run_in_one_process(commands: list[tuple[list[str], list[Path]]], scratch: Path, *, limit_gib: float = 4,
                       timeout: float = 1800) -> list[dict]:
    """``focusfl ARGV`` for each ``(ARGV, folders)`` of ``commands``, one after the other in ONE
    child process under run_cli's memory limit: its interpreter and imports (torch's,
    transformers') are paid once, not once a command. Each result: ``code``, ``stdout``,
    ``stderr`` as the console script would give them, ``cpu`` (the command's CPU seconds) and
    ``after``, the snapshot of each of its folders once it ran. For many refusals of one input
    surface whose console script another test runs (a command's state could outlive it here: the
    commands must not depend on each other)."""
    plan, results = scratch / "commands.json", scratch / "results.json"
    plan.write_text(json.dumps([[list(argv), [str(folder) for folder in folders]] for argv, folders in commands]))
    env = cli_env()
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parent), env["PYTHONPATH"]])
    proc = subprocess.run([sys.executable, "-c", _BATCH, str(plan), str(results)], env=env, capture_output=True,
                          text=True, timeout=timeout, preexec_fn=_limit_memory(int(limit_gib * GIB)))
    assert proc.returncode == 0 and results.is_file(), proc.stderr[-3000:]
    answers = json.loads(results.read_text())
    for answer in answers:
        answer["after"] = [{name: tuple(seen) for name, seen in after.items()} for after in answer["after"]]
    return answers


def assert_one_line_error(proc: subprocess.CompletedProcess, code: int = 2, contains: str = "") -> str:
    """Exit ``code``, no traceback, exactly one non-empty line on stderr; returns that line."""
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{proc.stderr}"
    assert proc.returncode == code, f"exit {proc.returncode}, expected {code}: {proc.stderr}"
    assert contains.lower() in lines[0].lower(), f"{contains!r} not in {lines[0]!r}"
    return lines[0]


def snapshot(folder: str | Path) -> dict[str, tuple[int, int]]:
    """Every file and folder below ``folder`` (hidden ones too) with its size and mtime."""
    folder = Path(folder)
    out: dict[str, tuple[int, int]] = {}
    for path in sorted(folder.rglob("*")):
        st = path.lstat()
        out[str(path.relative_to(folder))] = (st.st_size if path.is_file() else -1, st.st_mtime_ns)
    return out


_KILLER = """
import os, signal, sys
import focusfl.runs.driver as runner
from focusfl.cli import main
kill_at = int(sys.argv[1])
real = runner.simulate

def simulate(*args, on_round, **kwargs):
    def then_die(result):
        on_round(result)
        if result.rounds_done == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
    return real(*args, on_round=then_die, **kwargs)

runner.simulate = simulate
{setup}
sys.exit(main(sys.argv[2:]))
"""


def killer_script(setup: str = "") -> str:
    """Python for ``python -c``: runs ``focusfl ARGV[2:]`` and SIGKILLs itself at the end of round
    ARGV[1] (after any checkpoint of that round), as ``kill -9`` from outside would at an unlucky
    moment. ``setup`` runs just before the command (more patches)."""
    return _KILLER.replace("{setup}", setup)

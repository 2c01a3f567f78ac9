"""Failures around a run, as a user meets them: each one line, the right exit status, nothing lost."""
from __future__ import annotations

import errno
import json
import signal
import subprocess
import sys
import time

import pytest

from cli_harness import assert_one_line_error, cli_env, popen_cli, run_cli, snapshot
from focusfl.cli import main

SMALL = ["--problem", "ridge:clients=4,dim=3,samples=5"]


def test_a_huge_step_diverges_with_exit_1_and_keeps_its_rows(tmp_path):
    out = tmp_path / "boom"
    proc = run_cli("run", "--algorithm", "focus", *SMALL, "--lr", "1e308", "--rounds", "5", "--out", str(out))
    line = assert_one_line_error(proc, 1, contains="diverged")
    assert str(out) in line and "(non-finite model)" in line
    assert json.loads((out / "config.json").read_text())["status"] == "diverged"
    assert (out / "curve.png").is_file() and not (out / "checkpoint.pt").exists()


def test_a_finite_blow_up_names_the_rule_that_stopped_it(tmp_path):
    # Row 21 is finite (loss 3e97): the blow-up rule stopped the run, not a non-finite model.
    out = tmp_path / "boom"
    proc = run_cli("run", "--algorithm", "fedavg", "--problem", "ridge", "--participation", "full", "--rounds", "50",
                   "--lr", "1", "--out", str(out))
    line = assert_one_line_error(proc, 1, contains="diverged at round 21 (blow-up rule: loss 2.98e+97, above 10x")
    assert "non-finite" not in line


def test_a_step_beyond_the_float_types_range_is_one_line_before_anything_is_written(tmp_path):
    # torch refused the scalar mid-run with a RuntimeError traceback; a huge step that fits diverges (above).
    for flags in (["--lr", "1e39"], ["--algorithm", "fedavg:server_lr=1e39", "--lr", "1"]):
        proc = run_cli("run", "--algorithm", "fedavg", *SMALL, "--dtype", "float32", *flags, "--rounds", "2",
                       "--out", str(tmp_path / "big"))
        assert_one_line_error(proc, 2, contains="is beyond float32's range")
    assert not list(tmp_path.iterdir())


def test_output_piped_into_head_ends_quietly():
    proc = subprocess.Popen([sys.executable, "-m", "focusfl.cli", "participation", "bernoulli", "--clients", "5000",
                             "--rounds", "20"], env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.readline()
    proc.stdout.close()  # what `| head -1` does after its line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0 and first.startswith(b"bernoulli") and err == ""



def test_version_into_a_closed_pipe_ends_quietly():
    """`focusfl --version` prints before any parser is built: into a reader that has gone, it
    still ends without a traceback (the shortcut sits inside main's handling of a broken pipe)."""
    proc = subprocess.Popen([sys.executable, "-m", "focusfl.cli", "--version"], env=cli_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # `| head -0`: the reader went away before the line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0 and err == "", err


# From 0.3 s: the first ~0.1 s is the interpreter's own start-up, before any focusfl code can act.
@pytest.mark.parametrize("delay", [0.3, 0.4, 0.6, 1.0, 2.5])
def test_ctrl_c_during_start_up_is_one_line_and_writes_nothing(tmp_path, delay):
    proc = popen_cli("run", "--algorithm", "focus", *SMALL, "--rounds", "100000000", "--out", str(tmp_path / "x"))
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip() and "round/s" not in line]
    if proc.returncode == 130 and lines and "stopped after round" in lines[-1]:
        return  # start-up was over: the run stopped with a checkpoint, as tested elsewhere
    assert proc.returncode in (130, -signal.SIGINT), err
    assert lines in ([], ["focusfl: interrupted"]), err
    assert not list(tmp_path.iterdir())


def test_a_full_disk_is_one_line_and_leaves_no_partial_folder(tmp_path, capsys, monkeypatch):
    import focusfl.runs.folder as run_folder

    def no_space(path, checkpoint):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(run_folder, "save_checkpoint", no_space)
    out = tmp_path / "full"
    assert main(["run", "--algorithm", "focus", *SMALL, "--rounds", "20", "--checkpoint-every", "5",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"focusfl: error: no space left on device: cannot write to {out};"), err
    assert "\n" not in err and not list(tmp_path.iterdir())


def test_an_unreadable_config_is_one_line(tmp_path):
    before = snapshot(tmp_path)
    for content in (None, "{not json", "[1, 2]", "x" * (2 << 20)):
        path = tmp_path / "c.json"
        if content is not None:
            path.write_text(content)
        proc = run_cli("run", "--config", str(path), "--out", str(tmp_path / "o"), limit_gib=None)
        assert_one_line_error(proc, 2)
        path.unlink(missing_ok=True)
    assert snapshot(tmp_path) == before


def test_sighup_stops_with_exit_129_and_a_checkpoint(tmp_path):
    out = tmp_path / "run"
    proc = popen_cli("run", "--algorithm", "focus", *SMALL, "--rounds", "100000000", "--eval-every", "500",
                     "--out", str(out))
    metrics = tmp_path / ".run.focusfl-partial" / "metrics.csv"
    deadline = time.monotonic() + 90
    while not (metrics.exists() and metrics.stat().st_size > 0) and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 129, err
    assert json.loads((out / "config.json").read_text())["status"] == "interrupted"


def test_a_signal_ignored_by_the_parent_stays_ignored(tmp_path):
    """nohup's SIGHUP (or a background job's SIGINT) does not stop a run."""
    import os

    def ignore_hup():
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    out = tmp_path / "run"
    proc = popen_cli("run", "--algorithm", "focus", *SMALL, "--rounds", "3000", "--eval-every", "500",
                     "--out", str(out), preexec_fn=ignore_hup)
    metrics = tmp_path / ".run.focusfl-partial" / "metrics.csv"
    deadline = time.monotonic() + 90
    while not metrics.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGHUP)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert json.loads((out / "config.json").read_text())["status"] == "complete"


@pytest.mark.parametrize("argv", [["run", "--rounds", "0"], ["reproduce", "ridge", "--rounds", "x"], [],
                                  ["run", "--checkpoint-every", "-1"], ["nonsense"]])
def test_usage_errors_are_one_line(argv):
    assert_one_line_error(run_cli(*argv, limit_gib=None), 2, contains="--help")


@pytest.mark.parametrize("argv", [["federation"], ["federation", "local", "--nodes", "3", "--tls"],
                                  ["federation", "app", "flower-app", "--rounds", "3"]])
def test_federation_without_flower_says_how_to_install_it(argv, capsys, monkeypatch):
    """Without Flower, every `focusfl federation ...` line (options included) gets the same
    one-line error naming the install command, not an argparse complaint about its options."""
    monkeypatch.setitem(sys.modules, "flwr", None)  # importlib.util.find_spec("flwr") is None
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("focusfl: error: focusfl federation needs Flower") and '".[flower]"' in err
    assert "\n" not in err


def test_a_command_runs_only_when_it_is_the_first_word(capsys):
    """cli.main builds the parser of argv[0] alone when it names a command (so that `participation
    import` need not import torch), and every parser otherwise. That is the only place argparse
    finds a command that runs: the top-level options (help, version) take no value and end the
    parse, and `--` before the command is an argparse error. Pinned here: a top-level option
    with a value would need cli._command_of to skip it."""
    from focusfl.cli import _command_of, build_parser

    parser = build_parser()
    top_options = [action for action in parser._actions if action.option_strings]
    assert sorted(action.dest for action in top_options) == ["help", "version"]
    line = ["participation", "import", "matrix", "matrix.csv", "--out", "trace.csv"]
    for action in top_options:
        assert action.nargs == 0, action.option_strings
        for option in action.option_strings:
            with pytest.raises(SystemExit) as stop:  # the command after it never runs
                parser.parse_args([option, *line])
            assert stop.value.code == 0, option
    with pytest.raises(SystemExit) as stop:
        parser.parse_args(["--", *line])
    assert stop.value.code == 2
    capsys.readouterr()
    assert _command_of(line) == "participation"
    assert _command_of(["--version", *line]) is None and _command_of(["--", *line]) is None


def _commands(parser, name=""):
    import argparse

    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _commands(sub, f"{name} {sub_name}".strip())


def test_every_command_has_a_description_examples_and_option_help():
    from focusfl.cli import build_parser

    for name, parser in _commands(build_parser()):
        assert parser.description, name
        assert "examples:" in (parser.epilog or ""), name
        for action in parser._actions:
            if action.option_strings and action.dest != "help":
                assert action.help, (name, action.option_strings)
        text = parser.format_help()
        assert "(default: None)" not in text, name
    run_help = build_parser()._subparsers._group_actions[0].choices["run"].format_help()
    for needle in ("ridge", "bernoulli", "markov", "trace", "focus", "--resume", "default: 'auto'"[:7]):
        assert needle in run_help, needle


"""The command line as a user meets it: outputs, reruns, and one-line errors with exit code 2."""
import json
import os
import subprocess
import sys

import pytest

from cli_harness import assert_one_line_error, run_cli, run_main
from focusfl.cli import main
from focusfl.errors import FocusflError
from focusfl.io.atomic import read_csv

RUN = ["run", "--algorithm", "focus", "--problem", "ridge:dim=20,clients=8,samples=30",
       "--participation", "bernoulli", "--rounds", "30", "--local-steps", "3", "--lr", "5e-4"]


def test_run_writes_metrics_config_and_curve(tmp_path):
    out = tmp_path / "a"
    assert main(RUN + ["--out", str(out)]) == 0
    rows = read_csv(out / "metrics.csv")
    assert {"round", "loss", "grad_norm", "rel_error", "comm_up", "comm_down"} <= set(rows[0])
    assert [int(r["round"]) for r in rows] == list(range(31))
    config = json.loads((out / "config.json").read_text())
    assert config["seed"] == 0 and config["focusfl_version"]
    assert config["problem"]["dim"] == 20 and config["problem"]["reg"] == 0.01  # defaults resolved
    assert len(config["participation"]["p"]) == 8
    assert (out / "curve.png").stat().st_size > 1000


def test_same_seed_gives_identical_metrics_and_config_reruns_it(tmp_path):
    assert main(RUN + ["--out", str(tmp_path / "a")]) == 0
    assert main(RUN + ["--out", str(tmp_path / "b")]) == 0
    assert main(["run", "--config", str(tmp_path / "a" / "config.json"), "--out", str(tmp_path / "c")]) == 0
    first = (tmp_path / "a" / "metrics.csv").read_text()
    assert first == (tmp_path / "b" / "metrics.csv").read_text()
    assert first == (tmp_path / "c" / "metrics.csv").read_text()
    assert main(RUN + ["--seed", "1", "--out", str(tmp_path / "d")]) == 0
    assert first != (tmp_path / "d" / "metrics.csv").read_text()


@pytest.mark.parametrize(
    "args,message",
    [
        (["--algorithm", "nope"], "unknown algorithm 'nope'"),
        (["--algorithm", "focus", "--problem", "ridge:foo=1"], "unknown key 'foo'"),
        (["--algorithm", "focus", "--participation", "uniform:m=20"], "m=20"),
        (["--algorithm", "focus", "--participation", "bernoulli:p=1.5"], "p"),
        (["--algorithm", "focus", "--participation", "trace:path=/nonexistent.csv"], "nonexistent"),
        (["--algorithm", "focus", "--participation", "warp"], "unknown participation"),
        (["--algorithm", "fedavg:weighting=median"], "weighting"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_no_folder(tmp_path, capsys, args, message):
    out = tmp_path / "never"
    assert main(["run", *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("focusfl: error:") and "\n" not in err and message in err
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("flag", [["--lr", "-1"], ["--lr", "0"], ["--rounds", "0"], ["--local-steps", "0"]])
def test_bad_numbers_exit_2_without_traceback(tmp_path, flag):
    proc = subprocess.run(
        [sys.executable, "-m", "focusfl.cli", "run", "--algorithm", "focus", *flag, "--out", str(tmp_path / "x")],
        capture_output=True, text=True,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "x").exists()


def test_existing_foreign_folder_is_not_overwritten(tmp_path, capsys):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("precious")
    assert main(RUN + ["--out", str(tmp_path / "mine")]) == 2
    assert (tmp_path / "mine" / "thesis.tex").read_text() == "precious"


def test_divergence_keeps_what_was_written(tmp_path, capsys):
    out = tmp_path / "boom"
    code = main(["run", "--algorithm", "fedavg", "--problem", "ridge:dim=10,clients=4,samples=20",
                 "--rounds", "200", "--lr", "0.5", "--out", str(out)])
    assert code == 1
    assert "diverged" in capsys.readouterr().err
    rows = read_csv(out / "metrics.csv")
    assert 1 < len(rows) < 202
    assert json.loads((out / "config.json").read_text())["diverged_at_round"] == int(rows[-1]["round"])


def test_interrupted_run_keeps_the_rounds_it_evaluated(tmp_path, capsys, monkeypatch):
    """Ctrl-C (a real SIGINT) stops the run at the end of its round, with a checkpoint."""
    import signal

    import focusfl.runs.driver as runner

    real_simulate = runner.simulate

    def ctrl_c_at_round_12(*args, on_row, **kwargs):
        def row_then_ctrl_c(row):
            on_row(row)
            if row["round"] == 12:
                signal.raise_signal(signal.SIGINT)

        return real_simulate(*args, on_row=row_then_ctrl_c, **kwargs)

    monkeypatch.setattr(runner, "simulate", ctrl_c_at_round_12)
    # As in a terminal (a suite started as a background job inherits an ignored SIGINT).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    out = tmp_path / "a"
    try:
        assert main(RUN + ["--out", str(out)]) == 130
    finally:  # the test worker's own handler back: a later SIGINT must not raise inside pytest
        signal.signal(signal.SIGINT, previous)
    err = capsys.readouterr().err
    assert "stopped after round 12" in err and f"--resume {out}" in err
    assert [int(r["round"]) for r in read_csv(out / "metrics.csv")] == list(range(13))
    info = json.loads((out / "config.json").read_text())
    assert info["interrupted_after_round"] == 12 and info["status"] == "interrupted"
    assert (out / "curve.png").exists() and (out / "checkpoint.pt").exists()


def test_interrupted_before_any_round_leaves_nothing(tmp_path, capsys, monkeypatch):
    import focusfl.runs.driver as runner

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "simulate", ctrl_c)
    out = tmp_path / "a"
    assert main(RUN + ["--out", str(out)]) == 130
    assert capsys.readouterr().err.strip() == "focusfl: interrupted"
    assert not out.exists() and not list(tmp_path.iterdir())


def test_participation_command_prints_statistics_and_plots(tmp_path, capsys):
    plot = tmp_path / "raster.png"
    assert main(["participation", "markov", "--clients", "6", "--rounds", "500", "--plot", str(plot)]) == 0
    text = capsys.readouterr().out
    assert "tau_max" in text and "q (empirical)" in text
    assert len([line for line in text.splitlines() if line.strip()[:1].isdigit()]) == 6
    assert plot.stat().st_size > 1000


RASTER_COMMANDS = {"participation": ["participation", "bernoulli"], "work": ["work", "uniform"]}


def _unwritable_target(tmp_path, case: str):
    if case == "below a file":
        (tmp_path / "taken.png").write_bytes(b"mine")
        return tmp_path / "taken.png" / "raster.png", "is a file, not a folder"
    if case == "read-only folder":
        if os.geteuid() == 0:
            pytest.skip("root writes into a read-only folder")
        folder = tmp_path / "locked"
        folder.mkdir(mode=0o555)
        return folder / "raster.png", "is not writable"
    # a name the check accepts whose scratch file (.NAME.PID.focusfl-tmp.png) the filesystem refuses
    return tmp_path / ("r" * 240 + ".png"), "cannot be written: File name too long"


@pytest.mark.parametrize("case", ["below a file", "read-only folder", "scratch name too long"])
@pytest.mark.parametrize("command", list(RASTER_COMMANDS))
def test_a_raster_that_cannot_be_written_is_one_line_and_prints_nothing_else(tmp_path, command, case):
    """The statistics and "wrote" are printed once the figure is in place; a write the filesystem
    refuses (before the work where it can be seen, else when it happens) is one line, exit 2."""
    target, says = _unwritable_target(tmp_path, case)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    proc = run_cli(*RASTER_COMMANDS[command], "--clients", "3", "--rounds", "20", "--plot", str(target))
    line = assert_one_line_error(proc, contains=says)
    assert "--plot" in line and proc.stdout == "", proc.stdout
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # no figure, no scratch file


@pytest.mark.parametrize("command", list(RASTER_COMMANDS))
def test_wrote_is_the_last_line_and_names_the_figure_in_place(tmp_path, command):
    plot = tmp_path / "new" / "raster.png"
    proc = run_main(*RASTER_COMMANDS[command], "--clients", "3", "--rounds", "20", "--plot", str(plot))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == f"wrote {plot}" and plot.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("suffix", [".svg", ".pdf"])
def test_participation_plot_writes_svg_and_pdf_the_same_bytes_and_never_over_a_users_file(tmp_path, suffix):
    args = ["participation", "weighted:m=2", "--clients", "4", "--rounds", "60", "--plot"]
    plot = tmp_path / f"raster{suffix}"
    assert run_cli(*args, str(plot)).returncode == 0
    first = plot.read_bytes()
    again = run_main(*args, str(plot))  # focusfl's own figure: replaced, by the same bytes
    assert again.returncode == 0, again.stderr
    assert plot.read_bytes() == first
    mine = tmp_path / f"mine{suffix}"
    mine.write_bytes(b'<svg xmlns="http://www.w3.org/2000/svg"/>' if suffix == ".svg" else b"%PDF-1.4 mine")
    refused = run_main(*args, str(mine))
    assert refused.returncode == 2 and "focusfl did not write it" in refused.stderr
    assert mine.read_bytes().endswith(b"/>" if suffix == ".svg" else b"mine")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([plot.name, mine.name])


def test_participation_command_rejects_bad_spec(capsys):
    assert main(["participation", "uniform:m=9", "--clients", "4"]) == 2


def test_algorithms_lists_the_registry(capsys):
    from focusfl.algorithms import ALGORITHMS

    assert main(["algorithms"]) == 0
    text = capsys.readouterr().out
    for name in ALGORITHMS:
        assert name in text


def test_algorithms_lists_every_hyperparameter_as_a_spec_takes_it():
    """docs/experiments.md sends readers to `focusfl algorithms` for the keys an algorithm table takes."""
    import dataclasses

    from focusfl.algorithms import ALGORITHMS, make_algorithm

    proc = run_cli("algorithms")
    assert proc.returncode == 0, proc.stderr
    section = proc.stdout.split("\nhyperparameters")[1].splitlines()[2:]  # after its two-line header
    shown = {line.split()[0]: line.split(maxsplit=1)[1] for line in section if line.strip()}
    assert list(shown) == list(ALGORITHMS)
    for name, cls in ALGORITHMS.items():
        keys = [f.name for f in dataclasses.fields(cls) if f.init and f.name not in ("lr", "local_steps")]
        items = [] if shown[name] == "(none)" else shown[name].split(", ")
        assert [item.split("=")[0] for item in items] == keys, name
        defaults = ",".join(item for item in items if not item.endswith("=(unset)"))
        make_algorithm(f"{name}:{defaults}" if defaults else name)  # each default, typed back, is accepted
    with pytest.raises(FocusflError, match="p must be rates"):  # not a ValueError's traceback
        make_algorithm("fedavg:p=None")


def test_reproduce_ridge_small(tmp_path, capsys):
    out = tmp_path / "fig4"
    assert main(["reproduce", "ridge", "--rounds", "40", "--out", str(out)]) == 0
    summary = read_csv(out / "summary.csv")
    assert {row["participation"] for row in summary} == {"full", "uniform:m=4", "weighted:m=4"}
    assert {"focus", "fedavg"} <= {row["algorithm"] for row in summary}
    assert (out / "figure.png").exists() and (out / "figure.pdf").exists()
    assert "first round < 1e-8" in capsys.readouterr().out


def test_algorithms_lists_each_algorithms_hyperparameters_as_docs_say(tmp_path):
    from cli_harness import run_cli

    proc = run_cli("algorithms")
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line for line in proc.stdout.split("hyperparameters")[1].splitlines()[1:] if line.strip()}
    assert "notebook=false" in rows["mifa"] and "cutoff=50" in rows["fedau"] and "server_lr=1.0" in rows["scaffold"]

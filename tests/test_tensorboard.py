"""`--tensorboard`: run and sweep logs read back with TensorBoard's own reader, a SIGKILLed and
resumed run logging each step once, and the one-line errors (no package, a folder inside --out)."""
from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cli_harness import cli_env, killer_script, run_main
from focusfl.cli import main

SMALL = "ridge:clients=4,dim=3,samples=5"
RUN = ["run", "--algorithm", "focus", "--problem", SMALL, "--participation", "bernoulli"]
MISSING = "focusfl: error: --tensorboard needs the tensorboard package: pip install tensorboard"


def _needs_tensorboard():
    pytest.importorskip("tensorboard")
    pytest.importorskip("torch.utils.tensorboard")


def _rows(folder: Path) -> list[dict]:
    with open(folder / "metrics.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def _read_log(log_dir: Path):
    """(scalars {tag: [(step, value)]}, hparams {name: value}, end status, text tags) as
    TensorBoard reads them: older event files' purged steps dropped, the first hparams kept."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    scalars = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    texts = [tag for tag in acc.Tags()["tensors"] if acc.SummaryMetadata(tag).plugin_data.plugin_name == "text"]
    content = acc.PluginTagToContent("hparams")
    start = HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    end = HParamsPluginData.FromString(content["_hparams_/session_end_info"]).session_end_info
    hparams = {k: getattr(v, v.WhichOneof("kind")) for k, v in start.hparams.items()}
    return scalars, hparams, end.status, texts


def _assert_scalars_are_metrics(scalars: dict, rows: list[dict]) -> None:
    """Each metric at each evaluated round exactly once, equal to metrics.csv's value (as float32)."""
    rounds = [int(row["round"]) for row in rows]
    metrics = [k for k in rows[0] if k not in ("round", "diverged")]
    assert sorted(scalars) == sorted(metrics)
    for tag in metrics:
        steps = [step for step, _ in scalars[tag]]
        assert steps == rounds, tag  # once each, in order
        logged = np.array([value for _, value in scalars[tag]], dtype=np.float32)
        with np.errstate(over="ignore"):  # a diverged run's values beyond float32: inf in both
            expected = np.array([float(row[tag]) for row in rows], dtype=np.float32)
        np.testing.assert_array_equal(logged, expected, err_msg=tag)


def _raw_steps(log_dir: Path, tag: str) -> list[int]:
    """Every step of ``tag`` in the event files, purged ones included."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    steps = []
    for path in sorted(log_dir.glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():
            steps += [event.step for value in event.summary.value if value.tag == tag]
    return steps


def test_run_logs_every_metric_of_every_evaluated_round_and_its_config_as_hparams(tmp_path, capsys):
    _needs_tensorboard()
    from focusfl.runs.config import config_from_json
    from focusfl.sweeps.sweep import run_key

    out, tb = tmp_path / "runs" / "focus", tmp_path / "tb"
    assert main([*RUN, "--rounds", "30", "--eval-every", "4", "--out", str(out), "--tensorboard", str(tb)]) == 0
    assert f"logged to TensorBoard in {tb / 'focus'}" in capsys.readouterr().out
    info = json.loads((out / "config.json").read_text())
    assert info["tensorboard"] == str(tb / "focus")
    config_from_json(info)  # an output option: config.json stays a valid --config
    assert run_key(info) == run_key({k: v for k, v in info.items() if k != "tensorboard"})

    scalars, hparams, status, texts = _read_log(tb / "focus")
    rows = _rows(out)
    assert [int(r["round"]) for r in rows] == [0, 4, 8, 12, 16, 20, 24, 28, 30]
    _assert_scalars_are_metrics(scalars, rows)
    assert hparams["algorithm.name"] == "focus" and hparams["participation.name"] == "bernoulli"
    assert hparams["problem.dim"] == 3 and hparams["rounds"] == 30 and hparams["seed"] == 0
    assert hparams["algorithm.lr"] == info["algorithm"]["lr"] and hparams["status"] == "complete"
    assert "tensorboard" not in hparams
    assert status == 1  # STATUS_SUCCESS
    assert texts == ["config/text_summary"]

    # The same --out again: a new log beside the old one, never mixed into it.
    assert main([*RUN, "--rounds", "10", "--out", str(out), "--tensorboard", str(tb)]) == 0
    assert sorted(p.name for p in tb.iterdir()) == ["focus", "focus-2"]
    _assert_scalars_are_metrics(_read_log(tb / "focus-2")[0], _rows(out))


def test_a_diverged_run_logs_its_huge_and_infinite_values_and_its_status(tmp_path, capsys):
    _needs_tensorboard()
    out, tb = tmp_path / "div", tmp_path / "tb"
    assert main([*RUN[:-2], "--lr", "50", "--rounds", "200", "--out", str(out), "--tensorboard", str(tb)]) == 1
    scalars, hparams, status, _ = _read_log(tb / "div")
    rows = _rows(out)
    assert rows[-1]["diverged"] == "True" and np.isinf(scalars["loss"][-1][1])
    _assert_scalars_are_metrics(scalars, rows)
    assert hparams["status"] == "diverged" and status == 2  # STATUS_FAILURE


def test_resume_extends_the_same_log_and_replaces_its_hparams(tmp_path):
    _needs_tensorboard()
    out, tb = tmp_path / "a", tmp_path / "tb"
    assert main([*RUN, "--rounds", "20", "--eval-every", "3", "--out", str(out), "--tensorboard", str(tb)]) == 0
    # --resume remembers the folder (config.json); naming another one is refused.
    assert main(["run", "--resume", str(out), "--rounds", "31", "--tensorboard", str(tmp_path / "other")]) == 2
    assert main(["run", "--resume", str(out), "--rounds", "31"]) == 0
    scalars, hparams, status, _ = _read_log(tb / "a")
    _assert_scalars_are_metrics(scalars, _rows(out))
    assert hparams["rounds"] == 31 and hparams["rounds_done"] == 31 and status == 1
    assert len(list((tb / "a").glob("*.focusfl-hparams"))) == 1


def test_a_stopped_run_logs_status_interrupted_and_its_resume_replaces_it(tmp_path, monkeypatch):
    _needs_tensorboard()
    import os

    import focusfl.runs.driver as runner

    real = runner.simulate

    def simulate(*args, on_round, **kwargs):  # SIGTERM arrives during round 10
        def then_stop(result):
            if result.rounds_done == 10:
                os.kill(os.getpid(), signal.SIGTERM)
            on_round(result)
        return real(*args, on_round=then_stop, **kwargs)

    monkeypatch.setattr(runner, "simulate", simulate)
    out, tb = tmp_path / "s", tmp_path / "tb"
    assert main([*RUN, "--rounds", "25", "--out", str(out), "--tensorboard", str(tb)]) == 143
    scalars, hparams, status, texts = _read_log(tb / "s")
    assert hparams["status"] == "interrupted" and hparams["interrupted_after_round"] == 10 and status == 3
    assert [step for step, _ in scalars["loss"]] == list(range(11)) and texts
    monkeypatch.setattr(runner, "simulate", real)
    assert main(["run", "--resume", str(out)]) == 0
    scalars, hparams, status, _ = _read_log(tb / "s")
    _assert_scalars_are_metrics(scalars, _rows(out))
    assert hparams["status"] == "complete" and "interrupted_after_round" not in hparams and status == 1


def test_resume_with_tensorboard_starts_a_log_for_a_run_that_had_none(tmp_path):
    _needs_tensorboard()
    out, tb = tmp_path / "a", tmp_path / "tb"
    assert main([*RUN, "--rounds", "12", "--out", str(out)]) == 0
    assert main(["run", "--resume", str(out), "--rounds", "20", "--tensorboard", str(tb)]) == 0
    _assert_scalars_are_metrics(_read_log(tb / "a")[0], _rows(out))  # the first 12 rounds included


# A child that runs `focusfl ARGS`, flushes its TensorBoard log after every row (so that steps
# after the checkpoint are on disk), and SIGKILLs itself at the end of round KILL_AT.
KILLER = killer_script("""
import focusfl.runs.tensorboard as tb
log_row = tb.RunLogger.log_row

def flushed(self, row):
    log_row(self, row)
    self.flush()

tb.RunLogger.log_row = flushed
""")


def test_a_sigkilled_and_resumed_run_logs_each_step_once_with_the_values_of_metrics_csv(tmp_path):
    _needs_tensorboard()
    out, tb = tmp_path / "k", tmp_path / "tb"

    def killed_at(round_: int, *args: str) -> None:
        proc = subprocess.run([sys.executable, "-c", KILLER, str(round_), *args], env=cli_env(),
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == -signal.SIGKILL, proc.stderr

    # Checkpoints every 7 rounds: killed at 26 (checkpoint 21), then at 45 (checkpoint 42).
    killed_at(26, *RUN, "--rounds", "60", "--eval-every", "2", "--checkpoint-every", "7", "--out", str(out),
              "--tensorboard", str(tb))
    killed_at(45, "run", "--resume", str(out), "--checkpoint-every", "7")
    done = run_main("run", "--resume", str(out))
    assert done.returncode == 0, done.stderr

    raw = _raw_steps(tb / "k", "loss")
    assert raw.count(22) == 2 and raw.count(44) == 2  # logged, killed, logged again: TensorBoard keeps one
    scalars, hparams, status, _ = _read_log(tb / "k")
    _assert_scalars_are_metrics(scalars, _rows(out))
    assert hparams["status"] == "complete" and status == 1


def test_a_sweep_logs_each_run_once_with_its_axes_as_hparams(tmp_path):
    _needs_tensorboard()
    from focusfl.sweeps.sweep import load_experiment, log_name, run_sweep

    path = tmp_path / "experiment.toml"
    path.write_text(f'algorithms = ["focus", "fedavg"]\nproblems = ["{SMALL}"]\nparticipation = "bernoulli"\n'
                    'lr = 0.01\nseeds = 2\nrounds = 6\neval_every = 2\n')
    experiment = load_experiment(path)
    out, tb = tmp_path / "sweep", tmp_path / "tb"
    report = run_sweep(experiment, out, tensorboard=tb)
    assert report.ran == 4 and report.logged == 4
    names = {run.key: log_name(run) for run in report.runs}
    assert sorted(p.name for p in tb.iterdir()) == sorted(names.values())
    for run in report.runs:
        assert names[run.key] == f"{run.axes['algorithm']}-lr0.01-seed{run.axes['seed']}-{run.key[:8]}"
        scalars, hparams, status, _ = _read_log(tb / names[run.key])
        _assert_scalars_are_metrics(scalars, _rows(out / "runs" / run.key))
        assert hparams == {k: v for k, v in run.axes.items() if v is not None} and status == 1
        assert set(hparams) >= {"problem", "participation", "algorithm", "lr", "rounds", "eval_every", "seed"}

    # Finished runs with a complete log are not logged again; one whose log lacks its end (the
    # driver was killed while writing it) is written again, each step still once.
    files = sorted(tb.rglob("*"))
    assert run_sweep(experiment, out, tensorboard=tb).logged == 0
    assert sorted(tb.rglob("*")) == files
    first = report.runs[0]
    for path in (tb / names[first.key]).glob("*.focusfl-hparams"):
        path.unlink()
    assert run_sweep(experiment, out, tensorboard=tb).logged == 1
    _assert_scalars_are_metrics(_read_log(tb / names[first.key])[0], _rows(out / "runs" / first.key))


def test_without_the_package_tensorboard_is_a_one_line_error_before_anything_is_written(
        tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # `import tensorboard` fails
    out, tb = tmp_path / "run", tmp_path / "tb"
    assert main([*RUN, "--rounds", "5", "--out", str(out), "--tensorboard", str(tb)]) == 2
    assert capsys.readouterr().err.strip() == MISSING
    path = tmp_path / "experiment.toml"
    path.write_text('algorithms = ["focus"]\nrounds = 3\n')
    assert main(["sweep", str(path), "--out", str(tmp_path / "sweep"), "--tensorboard", str(tb)]) == 2
    assert capsys.readouterr().err.strip() == MISSING
    assert sorted(p.name for p in tmp_path.iterdir()) == ["experiment.toml"]


def test_a_tensorboard_folder_inside_out_is_refused_before_anything_is_written(tmp_path, capsys):
    _needs_tensorboard()
    out = tmp_path / "run"
    for inside in (out, out / "tb"):
        assert main([*RUN, "--rounds", "5", "--out", str(out), "--tensorboard", str(inside)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "is inside --out" in err, err
    path = tmp_path / "experiment.toml"
    path.write_text('algorithms = ["focus"]\nrounds = 3\n')
    assert main(["sweep", str(path), "--out", str(tmp_path / "sweep"), "--tensorboard",
                 str(tmp_path / "sweep" / "tb")]) == 2
    assert "is inside the sweep folder" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["experiment.toml"]


def test_reproduce_ridge_logs_its_runs_through_the_sweep(tmp_path):
    _needs_tensorboard()
    tb = tmp_path / "tb"
    assert main(["reproduce", "ridge", "--rounds", "2", "--out", str(tmp_path / "fig4"), "--tensorboard", str(tb)]) == 0
    assert len([p for p in tb.iterdir() if p.is_dir()]) == 33

"""One run: one record, one builder, one round loop, oracles without side effects (issue 27).

Each test here failed before the run layer had one home per concept: the training loss of an nn
run depended on the engine and the client chunk under a work process, a run resumed past its end
kept a row the uninterrupted run never wrote, a resumed run re-measured its formulation, an nn
federation never stopped on a blow-up, and `focusfl plot` merged runs of different experiments.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cli_harness import cli_env, killer_script, run_cli, run_cli_together
from focusfl.runs.checkpoint import load_model

MNIST = Path(__file__).resolve().parent / "fixtures" / "mnist1500.npz"
NN = f"nn:data={MNIST},test_fraction=0.2,clients=6,alpha=0.5,batch=8,model=mlp"


def _metrics(folder: Path) -> bytes:
    return (folder / "metrics.csv").read_bytes()


# -- oracles without side effects ----------------------------------------------------------------
def test_nn_metrics_under_a_work_process_are_the_same_in_every_engine_and_chunk(tmp_path):
    """train_loss counts the steps each client really took: the batched loop (max tau_i steps for
    everyone) and the reference loop (tau_i each) give the same float64 bytes, in any chunks."""
    common = ("run", "--algorithm", "sg_focus", "--lr", "0.01", "--local-steps", "3", "--work", "uniform",
              "--participation", "bernoulli", "--rounds", "6", "--eval-every", "2", "--dtype", "float64")
    runs = {f"{engine}-{chunk}": (*common, "--engine", engine, "--problem", f"{NN},client_chunk={chunk}",
                                  "--out", str(tmp_path / f"{engine}-{chunk}"))
            for engine, chunk in (("vectorized", 0), ("vectorized", 1), ("vectorized", 2), ("reference", 0))}
    for name, proc in zip(runs, run_cli_together(list(runs.values()))):
        assert proc.returncode == 0, f"{name}: {proc.stderr}"
    reference = _metrics(tmp_path / "reference-0")
    assert b"train_loss" in reference.splitlines()[0]
    for name in runs:
        assert _metrics(tmp_path / name) == reference, name
        assert torch.equal(load_model(tmp_path / name / "model.pt"), load_model(tmp_path / "reference-0" / "model.pt"))


# -- resume ----------------------------------------------------------------------------------------
def test_a_run_resumed_past_its_end_writes_the_uninterrupted_runs_metrics(tmp_path):
    """The 10-round run's last row (round 10) is off the every-3 cadence: the 20-round run never
    writes it, and neither does the 10-round run continued to 20."""
    common = ("run", "--algorithm", "sg_focus", "--lr", "0.01", "--local-steps", "2", "--participation", "bernoulli",
              "--problem", NN, "--eval-every", "3")
    short, whole = run_cli_together([(*common, "--rounds", "10", "--out", str(tmp_path / "short")),
                                     (*common, "--rounds", "20", "--out", str(tmp_path / "whole"))])
    assert short.returncode == 0 and whole.returncode == 0, short.stderr + whole.stderr
    assert b"\n10," in _metrics(tmp_path / "short")
    resumed = run_cli("run", "--resume", str(tmp_path / "short"), "--rounds", "20")
    assert resumed.returncode == 0, resumed.stderr
    assert _metrics(tmp_path / "short") == _metrics(tmp_path / "whole")
    assert torch.equal(load_model(tmp_path / "short" / "model.pt"), load_model(tmp_path / "whole" / "model.pt"))


# A timer under which the per-client chunk and NCHW win, and one under which every client at once
# in channels-last wins: two processes that measure would choose differently.
TIMERS = {
    "small": "import focusfl.problems.nn as nn\n"
             "nn.NeuralNetwork._time_gradients = lambda self, k, layout, repeats=2: "
             "(1.0 if layout == 'nchw' else 9.0) * (k or 99) ** 2\n",
    "large": "import focusfl.problems.nn as nn\n"
             "nn.NeuralNetwork._time_gradients = lambda self, k, layout, repeats=2: "
             "(9.0 if layout == 'nchw' else 1.0)\n",
}
MEASURED = f"nn:data={MNIST},test_fraction=0.2,clients=6,alpha=0.5,batch=8,model=fedsum-mnist-cnn," \
           "client_chunk=measure,layout=measure"
MEASURED_RUN = ("run", "--algorithm", "sg_focus", "--lr", "0.005", "--local-steps", "2", "--participation",
                "bernoulli", "--problem", MEASURED, "--eval-every", "2", "--rounds", "6")


def _with_timer(timer: str, script: str, *args: str) -> subprocess.CompletedProcess:
    setup = TIMERS[timer] + script
    return subprocess.run([sys.executable, "-c", setup, *args], env=cli_env(), capture_output=True, text=True,
                          timeout=300)


MAIN = "from focusfl.cli import main\nimport sys\nsys.exit(main(sys.argv[1:]))\n"


@pytest.mark.parametrize("kill_at", [1, 4])
def test_a_killed_run_resumes_with_the_formulation_it_measured(tmp_path, kill_at):
    """Killed after round 1 (one checkpoint, one row) or round 4, under one timer; resumed in a
    process whose timer would choose otherwise: the bytes of the uninterrupted run."""
    whole = _with_timer("small", MAIN, *MEASURED_RUN, "--out", str(tmp_path / "whole"))
    assert whole.returncode == 0, whole.stderr
    chosen = json.loads((tmp_path / "whole" / "config.json").read_text())["problem"]
    assert (chosen["client_chunk"], chosen["layout"]) == (1, "nchw")
    out = tmp_path / "killed"
    killed = _with_timer("small", killer_script(), str(kill_at), *MEASURED_RUN, "--checkpoint-every", "1",
                         "--out", str(out))
    assert killed.returncode == -9, killed.stderr
    resumed = _with_timer("large", MAIN, "run", "--resume", str(out))
    assert resumed.returncode == 0, resumed.stderr
    assert _metrics(out) == _metrics(tmp_path / "whole")
    assert torch.equal(load_model(out / "model.pt"), load_model(tmp_path / "whole" / "model.pt"))

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

from cli_harness import cli_env, killer_script, run_cli, run_main
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
    for name, proc in zip(runs, [run_main(*command) for command in runs.values()]):
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
    short, whole = (run_main(*common, "--rounds", "10", "--out", str(tmp_path / "short")),
                    run_main(*common, "--rounds", "20", "--out", str(tmp_path / "whole")))
    assert short.returncode == 0 and whole.returncode == 0, short.stderr + whole.stderr
    assert b"\n10," in _metrics(tmp_path / "short")
    resumed = run_main("run", "--resume", str(tmp_path / "short"), "--rounds", "20")
    assert resumed.returncode == 0, resumed.stderr
    assert _metrics(tmp_path / "short") == _metrics(tmp_path / "whole")
    assert torch.equal(load_model(tmp_path / "short" / "model.pt"), load_model(tmp_path / "whole" / "model.pt"))


# A timer under which the per-client chunk and NCHW win, and one under which every client at once
# in channels-last wins: two processes that measure would choose differently.
TIMERS = {
    "small": "import focusfl.problems.nn as nn\n"
             "nn.GroupedFormulation._time_gradients = lambda self, k, layout, repeats=2: "
             "(1.0 if layout == 'nchw' else 9.0) * (k or 99) ** 2\n",
    "large": "import focusfl.problems.nn as nn\n"
             "nn.GroupedFormulation._time_gradients = lambda self, k, layout, repeats=2: "
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


# -- a federation and a run stop alike -------------------------------------------------------------
def test_an_nn_federation_stops_on_a_blow_up_where_the_run_does(tmp_path):
    """FedAvg at a step 10,000 times too large: the test loss climbs far above its start and stays
    there (finite). The federation (every client on its own node) stops at the round `focusfl run`
    stops at, with the same row: the blow-up rule watches the same loss in both."""
    pytest.importorskip("flwr")
    from focusfl.cli import main
    from focusfl.flower.client_app import make_client_app
    from focusfl.flower.server_app import FederationConfig, run_federation
    from focusfl.flower.testing import FakeGrid
    from focusfl.io.atomic import read_csv

    problem = f"nn:data={MNIST},test_fraction=0.2,clients=4,alpha=0.5,batch=8,model=logreg"
    settings = dict(algorithm="fedavg", problem=problem, participation="full", rounds=80, local_steps=2, lr=20.0,
                    eval_every=5, dtype="float64")
    config = FederationConfig(**settings, out=str(tmp_path / "fed"), audit=False)
    result = run_federation(FakeGrid(make_client_app(), range(4)), config, log=lambda text: None)
    assert main(["run", *(f"--{k.replace('_', '-')}={v}" for k, v in settings.items()), "--engine", "reference",
                 "--out", str(tmp_path / "run")]) == 1  # diverged
    alone = read_csv(tmp_path / "run" / "metrics.csv")
    federated = read_csv(tmp_path / "fed" / "metrics.csv")
    assert result.diverged_at is not None and alone[-1]["diverged"] == "True"
    assert int(alone[-1]["round"]) == result.diverged_at < 80
    assert all(float(row["test_loss"]) < 1e300 for row in alone)  # finite: the blow-up rule, not NaN, stopped it
    for mine, theirs in zip(federated, alone, strict=True):
        assert {k: mine[k] for k in theirs} == theirs


# -- one record, one builder -----------------------------------------------------------------------
RIDGE = "ridge:clients=4,dim=3,samples=5"


def _record_of_command(argv: list[str]):
    """The records a command line becomes (through the command line's own parser)."""
    from focusfl.cli import build_parser

    return build_parser().parse_args(argv)


def test_run_sweep_tune_preset_and_federation_resolve_the_same_settings_alike(tmp_path):
    """The same settings through each command's record and the one builder: the same resolved
    record (config.json's run keys) and run key, for a convex problem and a neural network."""
    from focusfl.cli import _run_config
    from focusfl.reproduce import reproduce_nn
    from focusfl.sweeps.cli import setup_from_args
    from focusfl.sweeps.sweep import expand, make_experiment
    from focusfl.runs.config import RunConfig, config_from_json
    from focusfl.runs.driver import build

    nn = f"nn:data={MNIST},test_fraction=0.2,clients=4,alpha=0.5,batch=8,model=logreg"
    for problem, lr in ((RIDGE, "0.01"), (nn, "0.05")):
        args = _record_of_command(["run", "--algorithm", "fedavg", "--problem", problem, "--participation",
                                   "bernoulli", "--rounds", "4", "--lr", lr, "--local-steps", "2", "--seed", "3",
                                   "--engine", "reference"])
        alone = build(_run_config(args, RunConfig, config_from_json))
        tuned = setup_from_args(_record_of_command(["tune", "--algorithm", "fedavg", "--problem", problem,
                                                    "--participation", "bernoulli", "--rounds", "4",
                                                    "--local-steps", "2", "--seed", "3"]))
        if problem.startswith("nn"):  # tune scores a neural network on its validation share: not this run
            assert tuned.run.dtype == alone.config.dtype and tuned.run.eval_every == alone.config.eval_every
        else:
            trial = build(tuned.trial("fedavg", float(lr)).replace(engine="reference"))
            assert (trial.requested, trial.key) == (alone.requested, alone.key)
        swept = expand(make_experiment(algorithms=["fedavg"], problems=[problem], participation=["bernoulli"],
                                       rounds=4, lr=float(lr), local_steps=2, seeds=[3], engine="reference"))
        assert [(run.resolved, run.key) for run in swept] == [(alone.requested, alone.key)]
        preset = reproduce_nn.PresetOptions(out="x", run=RunConfig(rounds=4, seed=3, dtype=None, eval_every=None))
        setup = reproduce_nn.MNIST_DEMO
        preset_run = reproduce_nn.preset_run(setup, preset, problem).replace(
            algorithm="fedavg", participation="bernoulli", lr=float(lr), local_steps=2, engine="reference",
            schedule="constant", eval_every=alone.config.eval_every)
        assert (build(preset_run).requested, build(preset_run).key) == (alone.requested, alone.key)
        pytest.importorskip("flwr")
        from focusfl.flower.cli import add_parser  # noqa: F401 (the federation command exists)
        from focusfl.flower.server_app import build_strategy
        from focusfl.flower import cli as flower_cli

        fed_args = _record_of_command(["federation", "app", str(tmp_path / "app"), "--algorithm", "fedavg",
                                       "--problem", problem, "--participation", "bernoulli", "--rounds", "4",
                                       "--lr", lr, "--local-steps", "2", "--seed", "3"])
        _strategy, federated = build_strategy(flower_cli._config(fed_args), log=lambda text: None)
        assert (federated.requested, federated.key) == (alone.requested, alone.key)


def test_threads_are_part_of_the_run_key_and_one_thread_keeps_the_old_keys():
    """Two threads change an nn run's bytes (reductions split differently), so they are another
    run: a sweep rerun with --threads 2 does not take the one-thread runs for its own."""
    from focusfl.sweeps.sweep import expand, make_experiment

    experiment = make_experiment(algorithms=["focus"], problems=[RIDGE], rounds=3)
    one, two = expand(experiment, threads=1), expand(experiment, threads=2)
    assert one[0].key != two[0].key and two[0].resolved["threads"] == 2
    before = {k: v for k, v in one[0].resolved.items() if k != "threads"}
    from focusfl.runs.config import run_key

    assert run_key(before) == one[0].key  # a record from before threads existed: the same key


def test_a_sweep_that_restarts_a_run_says_so(tmp_path):
    """A run to be resumed whose checkpoint cannot be read runs again from round 0: the outcome,
    the report and the command's summary say which and why (it used to happen without a word)."""
    (tmp_path / "sweep.toml").write_text(f"algorithms = ['focus']\nproblems = ['{RIDGE}']\nrounds = 4\nseeds = 2\n")
    first = run_cli("sweep", str(tmp_path / "sweep.toml"), "--out", str(tmp_path / "out"))
    assert first.returncode == 0, first.stderr
    run = sorted((tmp_path / "out" / "runs").iterdir())[0]
    info = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**info, "status": "interrupted"}))
    (run / "checkpoint.pt").write_bytes(b"not a checkpoint")
    again = run_main("sweep", str(tmp_path / "sweep.toml"), "--out", str(tmp_path / "out"))
    assert again.returncode == 0, again.stderr
    assert "1 run(s) restarted from round 0 instead of resumed" in again.stdout
    assert "checkpoint" in again.stdout.split("restarted from round 0")[1]
    assert json.loads((run / "config.json").read_text())["status"] == "complete"


# -- one identity ----------------------------------------------------------------------------------
@pytest.mark.parametrize("first,second,telling", [
    ("ridge:clients=4,dim=3,samples=5", "ridge:clients=4,dim=5,samples=5", "problem.dim="),
    ("bernoulli:p=0.2;0.4;0.6;0.8", "bernoulli:p=0.3;0.5;0.7;0.9", "participation.p="),
])
def test_plot_draws_runs_of_different_experiments_as_different_curves(tmp_path, first, second, telling):
    """Two run folders that differ only in a problem parameter, or only in per-client rates, are
    two configurations with two labels, not two seeds of one (their records say so)."""
    from focusfl.sweeps.aggregate import curve_labels, iter_groups, read_folders

    key = "problem" if first.startswith("ridge") else "participation"
    base = {"problem": RIDGE, "participation": "bernoulli"}
    commands = [("run", "--algorithm", "focus", "--rounds", "5", "--lr", "0.01", *(f"--{k}={v}" for k, v in
                                                                   {**base, key: spec}.items()),
                 "--out", str(tmp_path / name)) for name, spec in (("a", first), ("b", second))]
    assert all(run_main(*command).returncode == 0 for command in commands)
    plotted = run_main("plot", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "plot.png"))
    assert plotted.returncode == 0, plotted.stderr
    assert "2 runs in 2 configurations" in plotted.stdout
    series, _ = read_folders([tmp_path / "a", tmp_path / "b"], None)
    labels = curve_labels(series)
    assert len(iter_groups(series)) == 2 and len(set(labels.values())) == 2
    assert all(telling in label for label in labels.values())


def test_one_configuration_writes_one_set_of_bytes_through_the_library_and_the_cli(tmp_path):
    """run_to_folder in this process and `focusfl run` in a fresh one, the same options: the same
    metrics.csv and config.json. The library's caller runs torch with two threads here (a notebook
    keeps the machine's count), the console script with one: what a run computes before its rounds
    (ridge's exact minimizer, the rel_error every row divides by) once took the caller's count and
    rel_error its last digit from it. The problem is large enough for the thread count to show."""
    from focusfl.runs.config import RunConfig
    from focusfl.runs.folder import run_to_folder

    problem = "ridge:dim=300,samples=400"
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        run_to_folder(RunConfig(algorithm="focus", problem=problem, participation="bernoulli", rounds=5,
                                local_steps=1, lr=1e-4, seed=0), tmp_path / "library", curve=False)
    finally:
        torch.set_num_threads(before)
    proc = run_cli("run", "--algorithm", "focus", "--problem", problem, "--participation", "bernoulli",
                   "--rounds", "5", "--local-steps", "1", "--lr", "1e-4", "--seed", "0",
                   "--out", str(tmp_path / "cli"), env=cli_env(OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr
    assert _metrics(tmp_path / "library") == _metrics(tmp_path / "cli")
    assert (json.loads((tmp_path / "library" / "config.json").read_text())
            == json.loads((tmp_path / "cli" / "config.json").read_text()))

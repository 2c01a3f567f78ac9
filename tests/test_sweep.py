"""`focusfl sweep`: the experiment file, the grid and its hashes, parallel and Ray execution
equal to sequential, a SIGKILLed sweep resumed, and `focusfl plot`."""
from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from cli_harness import assert_one_line_error, popen_cli, run_cli, run_main
from focusfl.algorithms import ALGORITHMS, make_algorithm
from focusfl.errors import ConfigError
from focusfl.spec import format_spec
from focusfl.io.atomic import read_csv
from focusfl.sweeps.sweep import count_runs, expand, load_experiment, parse_experiment, run_key, run_sweep

# Tests that start or look for a Ray cluster run one after another on one xdist worker
# (--dist loadgroup): one test's local cluster must not be found by another's --address auto.
RAY = pytest.mark.xdist_group("ray")

SMALL = "ridge:clients=4,dim=5,samples=10"
# The acceptance grid: 3 algorithms x 2 participation processes x 3 step sizes x 5 seeds = 90 runs.
GRID = f"""
name = "acceptance"
algorithms = ["focus", "fedavg", "scaffold"]
problems = ["{SMALL}"]
participation = ["bernoulli", "markov:rho=0.8"]
lr = [0.003, 0.01, 0.03]
seeds = 5
rounds = 20
local_steps = 2
targets = [0.1, 0.01]
"""


def write(tmp_path: Path, text: str, name: str = "experiment.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def files_of(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.suffix in (".csv", ".pt")}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The 90-run grid run sequentially in this process: what every other execution must equal."""
    tmp = tmp_path_factory.mktemp("reference")
    experiment = load_experiment(write(tmp, GRID))
    out = tmp / "sweep"
    report = run_sweep(experiment, out, workers=1, threads=1)
    assert report.ran == 90 and not report.failed
    return out


# -- the file and the grid ----------------------------------------------------------------------
def test_the_grid_is_the_product_of_the_axes_with_overrides_and_hyperparameter_axes():
    experiment = parse_experiment({
        "algorithms": ["focus", {"name": "fedavg", "lr": [0.1], "server_lr": [0.5, 1.0]}],
        "problems": SMALL, "participation": ["full", "bernoulli"], "lr": [0.01, 0.02], "seeds": [3, 7],
        "rounds": 5,
    })
    # focus: 2 lr; fedavg: 1 lr (its override) x 2 server_lr; x 2 participation x 2 seeds.
    assert count_runs(experiment)[0] == (2 + 2) * 2 * 2
    runs = expand(experiment)
    assert len(runs) == 16 and len({run.key for run in runs}) == 16
    first = runs[0]
    assert first.axes == {"problem": SMALL, "participation": "full", "algorithm": "focus", "lr": 0.01,
                          "local_steps": 1, "rounds": 5, "eval_every": 1, "seed": 3}
    assert {run.axes["algorithm"] for run in runs} == {"focus", "fedavg:server_lr=0.5", "fedavg:server_lr=1.0"}
    assert {run.axes["lr"] for run in runs if run.axes["algorithm"] != "focus"} == {0.1}
    # The hash is that of the resolved config: recomputed from it, and stable across expansions.
    assert run_key(first.resolved) == first.key == expand(experiment)[0].key
    assert len(first.key) == 16


def test_lr_auto_resolves_and_a_duplicate_run_is_refused():
    runs = expand(parse_experiment({"algorithms": ["focus", "fedavg"], "problems": SMALL, "rounds": 5}))
    assert all(isinstance(run.axes["lr"], float) and run.axes["lr"] > 0 for run in runs)
    with pytest.raises(ConfigError, match=r"algorithms\[1\]: gives the same run as algorithms\[0\]"):
        expand(parse_experiment({"algorithms": ["focus", {"name": "focus"}], "problems": SMALL}))


def test_a_participation_table_sets_the_step_size_of_its_runs_unless_the_algorithm_does():
    experiment = parse_experiment({
        "algorithms": ["focus", {"name": "fedavg", "lr": 0.03}], "problems": SMALL, "rounds": 4, "lr": 0.01,
        "participation": [{"name": "full", "lr": [0.02, 0.04]}, {"name": "uniform", "m": 2}],
    })
    # full: focus 2 lr + fedavg 1 (its own); uniform: focus 1 (the experiment's) + fedavg 1.
    assert count_runs(experiment)[0] == 5
    lrs = {(run.axes["participation"], run.axes["algorithm"], run.axes["lr"]) for run in expand(experiment)}
    assert lrs == {("full", "focus", 0.02), ("full", "focus", 0.04), ("full", "fedavg", 0.03),
                   ("uniform:m=2", "focus", 0.01), ("uniform:m=2", "fedavg", 0.03)}


BAD_FILES = [
    ("lrs = [0.1]\nalgorithms = ['focus']", "lrs: unknown key; did you mean 'lr'?"),
    ("algorithms = ['focus']\nrounds = 'ten'", "rounds: expected an integer >= 1"),
    ("algorithms = ['focus']\nparticipation = []", "participation: empty list"),
    ("algorithms = ['focus', 'fedavgg']", "algorithms[1]: unknown algorithm 'fedavgg'; did you mean 'fedavg'?"),
    ("algorithms = [{name = 'focus', lr = [0.1, -1]}]", "algorithms[0].lr[1]: expected a positive number"),
    ("algorithms = [{name = 'fedavg', server_lrr = 1}]", "algorithms[0].server_lrr: unknown key"),
    ("algorithms = ['focus']\nproblems = ['ridge:dimm=3']", "problems[0]: problem 'ridge': unknown key 'dimm'"),
    ("algorithms = ['focus', 'fedavg']\nlr = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]\nseeds = 1000000",
     "seeds: the grid has 20,000,000 runs"),
    ("algorithms = ['focus'\n", "not valid TOML"),
    ("algorithms = ['focus']\nparticipation = [{name = 'full', lr = 'fast'}]",
     "participation[0].lr: expected a positive number"),
    # The keys listed are the ones accepted: a SPEC's are the algorithm's own, never its class facts.
    ("algorithms = ['focus:foo=1']", "algorithms[0].foo: unknown key (known: skip_empty)"),
    ("algorithms = ['focus:in_paper_figure=false']", "algorithms[0].in_paper_figure: unknown key (known: skip_empty)"),
    ("algorithms = [{name = 'focus', in_paper_figure = false}]",
     "in_paper_figure: unknown key (known: lr, local_steps, rounds, eval_every, schedule, skip_empty)"),
    ("algorithms = ['focus:rounds=3']", "give rounds as a key of the experiment or of an algorithm table"),
]


@pytest.mark.parametrize("text,message", BAD_FILES, ids=[m.split(":")[0] for _, m in BAD_FILES])
def test_bad_experiment_files_are_one_line_errors_and_write_nothing(tmp_path, text, message):
    path = write(tmp_path, text)
    # In this process (run_main), but for the grid too large to allocate: under the console
    # script's memory limit, as a user's machine would meet it.
    proc = (run_cli("sweep", str(path), "--out", str(tmp_path / "out"), timeout=120) if "20,000,000" in message
            else run_main("sweep", str(path), "--out", str(tmp_path / "out")))
    assert_one_line_error(proc, 2, message)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["experiment.toml"]


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_every_key_an_unknown_key_error_lists_is_accepted(name):
    """The known keys an error lists, in a SPEC and in a table, each parse and build with the
    algorithm's own default value."""
    defaults = make_algorithm(name).describe()
    for entry in (f"{name}:nope=1", {"name": name, "nope": 1}):
        with pytest.raises(ConfigError, match="unknown key") as error:
            parse_experiment({"algorithms": [entry], "problems": SMALL})
        known = str(error.value).split("(known: ")[1].rstrip(")").split(", ")
        for key in known:
            value = defaults.get(key, {"rounds": 3, "eval_every": 1, "schedule": "constant"}.get(key))
            if value is None:
                continue  # a default derived at run time (period, p, ...): no value to type
            value = tuple(value) if isinstance(value, list) else value
            if isinstance(entry, str):
                given = format_spec(name, {key: value})
            else:
                given = {"name": name, key: value}
            experiment = parse_experiment({"algorithms": [given], "problems": SMALL, "rounds": 3})
            for run in expand(experiment):  # lr "auto" is resolved by the run's problem: any step builds
                lr = run.config.lr if isinstance(run.config.lr, float) else 0.01
                make_algorithm(run.config.algorithm, lr=lr, local_steps=run.config.local_steps)


# The run fields that change a run's bytes (runs.config's keyed fields) and where a sweep takes
# each: its experiment file's key, the command's --threads (each run's config.json records it),
# or run's default.
SWEEP_KEY_OF = {"algorithm": "algorithms", "problem": "problems", "seed": "seeds"}
SET_BY_THE_COMMAND = {"threads"}
LEFT_AT_DEFAULT = {"deterministic"}


def test_a_sweep_names_every_run_field_that_changes_a_runs_bytes():
    """A new run field that changes bytes fails here until the experiment file takes it or the
    sweep leaves it at the default (dp was once a run option a sweep file could not say)."""
    from focusfl.sweeps.sweep import TOP_KEYS, plan
    from focusfl.runs.config import _KEYED, field_defaults

    assert {SWEEP_KEY_OF.get(name, name) for name in _KEYED} - SET_BY_THE_COMMAND - LEFT_AT_DEFAULT <= set(TOP_KEYS)
    experiment = parse_experiment({"algorithms": ["focus"], "problems": SMALL, "rounds": 3,
                                   "dp": "clip=1,noise=1,mode=central"})
    defaults = field_defaults()
    for planned in plan(experiment, threads=2):
        assert planned.config.threads == 2 and planned.config.dp == "clip=1,noise=1,mode=central"
        assert all(getattr(planned.config, name) == defaults[name] for name in LEFT_AT_DEFAULT)


def test_a_folder_that_is_not_a_sweep_is_refused(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    experiment = parse_experiment({"algorithms": ["focus"], "problems": SMALL, "rounds": 3})
    with pytest.raises(ConfigError, match="not focusfl's"):
        run_sweep(experiment, tmp_path / "mine")
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["notes.txt"]


# -- results ------------------------------------------------------------------------------------
def test_the_acceptance_grid_gives_90_runs_18_configurations_and_band_figures(reference):
    rows = read_csv(reference / "results.csv")
    assert len({row["run"] for row in rows}) == 90 and len(rows) == 90 * 21
    assert list(rows[0])[:10] == ["problem", "participation", "algorithm", "lr", "local_steps", "rounds",
                                  "eval_every", "seed", "run", "status"]
    summary = read_csv(reference / "summary.csv")
    assert len(summary) == 18 and {row["seeds"] for row in summary} == {"5"}
    row = summary[0]
    finals = [float(r["rel_error"]) for r in rows if r["round"] == "20" and r["algorithm"] == row["algorithm"]
              and r["participation"] == row["participation"] and r["lr"] == row["lr"]]
    assert float(row["final_rel_error_mean"]) == pytest.approx(sum(finals) / 5)
    assert float(row["final_rel_error_min"]) == min(finals) and float(row["final_rel_error_max"]) == max(finals)
    assert {"reached_0.1", "rounds_to_0.01_mean", "floats_to_0.1_std"} <= set(row)
    for name in ("figure.png", "figure.pdf", "figure_communication.png", "figure_communication.pdf"):
        assert (reference / name).stat().st_size > 10_000


def test_two_workers_write_the_same_bytes_as_one(reference, tmp_path):
    out = tmp_path / "sweep"
    report = run_sweep(load_experiment(write(tmp_path, GRID)), out, workers=2, threads=1)
    assert report.ran == 90 and not report.failed
    assert files_of(out) == files_of(reference)


def test_a_sigkilled_sweep_skips_finished_runs_and_ends_as_an_uninterrupted_one(reference, tmp_path):
    path = write(tmp_path, GRID.replace("rounds = 20", "rounds = 20\neval_every = 1"))
    out = tmp_path / "sweep"
    proc = popen_cli("sweep", str(path), "--out", str(out), "--checkpoint-every", "2", "--threads", "1")
    runs = out / "runs"
    deadline = time.monotonic() + 120
    # Kill it half way, while a run is under way with a checkpoint in its partial folder.
    while time.monotonic() < deadline and proc.poll() is None:
        finished = [p for p in runs.glob("[!.]*") if (p / "config.json").is_file()] if runs.is_dir() else []
        partial = list(runs.glob(".*.focusfl-partial/checkpoint.pt")) if runs.is_dir() else []
        if len(finished) >= 45 and partial:
            break
        time.sleep(0.01)
    assert proc.poll() is None, "the sweep ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    finished = sorted(p for p in runs.glob("[!.]*") if (p / "config.json").is_file())
    before = {str(f): (f.stat().st_ino, f.stat().st_mtime_ns) for d in finished for f in d.iterdir()}
    # the runs of the batch under way when it was killed, each with its own checkpoint
    resumable = list(runs.glob(".*.focusfl-partial/checkpoint.pt"))
    assert not (out / "results.csv").exists()
    again = run_cli("sweep", str(path), "--out", str(out), "--threads", "1", timeout=300)
    assert again.returncode == 0, again.stderr
    assert f"{len(finished)} finished earlier" in again.stdout and f"({len(resumable)} resumed)" in again.stdout
    after = {str(f): (f.stat().st_ino, f.stat().st_mtime_ns) for d in finished for f in d.iterdir()}
    assert after == before  # finished runs were not rewritten
    assert files_of(out) == files_of(reference)


@RAY
def test_ray_on_a_local_two_cpu_cluster_writes_the_same_results(reference, tmp_path):
    ray = pytest.importorskip("ray", reason="Ray is an optional extra (pip install 'focusfl[ray]')")
    from focusfl.sweeps.executors import ray_runtime_env

    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False,
             runtime_env=ray_runtime_env())
    try:
        out = tmp_path / "sweep"
        report = run_sweep(load_experiment(write(tmp_path, GRID)), out, executor="ray")
        assert report.ran == 90 and not report.failed
        assert (out / "results.csv").read_bytes() == (reference / "results.csv").read_bytes()
        assert files_of(out) == files_of(reference)
    finally:
        ray.shutdown()


def test_a_run_shipped_back_from_a_node_without_the_folder_is_the_same_run(reference, tmp_path):
    from focusfl.sweeps.executors import RunTask, publish_shipped, run_task

    run = expand(load_experiment(write(tmp_path, GRID)))[7]
    task = RunTask(key=run.key, config=dict(run.config.__dict__), out=str(tmp_path / "runs" / run.key), ship=True)
    outcome = run_task(task)
    assert outcome["status"] == "complete" and set(outcome["files"]) >= {"metrics.csv", "model.pt", "config.json"}
    publish_shipped(task, outcome["files"])
    assert files_of(tmp_path / "runs" / run.key) == files_of(reference / "runs" / run.key)


def test_failures_are_collected_not_fatal(tmp_path, monkeypatch):
    from focusfl.sweeps import executors

    real = executors.run_task

    def flaky(task):
        if task.config["seed"] == 1:
            return {"status": "failed", "error": "simulated fault"}
        return real(task)

    monkeypatch.setattr(executors, "run_task", flaky)
    experiment = parse_experiment({"algorithms": ["focus"], "problems": SMALL, "rounds": 3, "seeds": 3})
    report = run_sweep(experiment, tmp_path / "sweep", batch_runs=1)  # one run_task per run
    assert report.ran == 2 and len(report.failed) == 1
    failures = read_csv(tmp_path / "sweep" / "failures.csv")
    assert failures[0]["seed"] == "1" and failures[0]["error"] == "simulated fault"
    assert read_csv(tmp_path / "sweep" / "summary.csv")[0]["failed"] == "1"
    monkeypatch.setattr(executors, "run_task", real)
    report = run_sweep(experiment, tmp_path / "sweep")  # the rerun retries only the failed run
    assert (report.skipped, report.ran, report.failed) == (2, 1, [])
    assert not (tmp_path / "sweep" / "failures.csv").exists()


# -- focusfl plot -------------------------------------------------------------------------------
def test_plot_overlays_a_sweep_and_runs_grouping_seeds(reference, tmp_path):
    runs = []
    for seed in (0, 1):
        out = tmp_path / f"focus-{seed}"
        proc = run_main("run", "--algorithm", "focus", "--problem", SMALL, "--participation", "bernoulli",
                        "--rounds", "20", "--local-steps", "2", "--lr", "0.01", "--seed", str(seed), "--out", str(out))
        assert proc.returncode == 0, proc.stderr
        runs.append(str(out))
    target = tmp_path / "figs" / "overlay.png"
    target.parent.mkdir()
    proc = run_cli("plot", *runs, "--x", "comm_total", "--out", str(target))
    assert proc.returncode == 0, proc.stderr
    assert "2 runs in 1 configurations" in proc.stdout
    assert target.stat().st_size > 10_000 and target.with_suffix(".pdf").is_file()
    proc = run_main("plot", str(reference), *runs, "--y", "loss", "--out", str(tmp_path / "figs" / "both.png"))
    assert proc.returncode == 0, proc.stderr
    assert "92 runs in 19 configurations" in proc.stdout
    bad = run_main("plot", str(reference), "--y", "accuracy", "--out", str(tmp_path / "figs" / "x.png"))
    assert_one_line_error(bad, 2, "--y accuracy")


# -- focusfl tune over seeds --------------------------------------------------------------------
def test_tune_over_seeds_ranks_step_sizes_by_their_mean_and_reports_the_spread(tmp_path):
    import math

    from focusfl.sweeps.tune import ranking_key

    out = tmp_path / "tune"
    argv = ["tune", "--algorithm", "fedavg", "--problem", SMALL, "--participation", "bernoulli", "--rounds", "30",
            "--lr-min", "1e-3", "--lr-max", "1e-1", "--points", "3", "--seeds", "3", "--workers", "2", "--out", str(out)]
    proc = run_cli(*argv)
    assert proc.returncode == 0, proc.stderr
    assert "means over 3 seeds" in proc.stdout
    grid = read_csv(out / "grid.csv")
    assert [row["seeds"] for row in grid] == ["3"] * 3
    for row in grid:  # the mean and spread of the three runs' last rel_error
        finals = []
        for run in (out / "runs").iterdir():
            info = (run / "config.json").read_text()
            if f'"lr": {row["lr"]}' in info:
                finals.append(float(read_csv(run / "metrics.csv")[-1]["rel_error"]))
        assert len(finals) == 3
        assert float(row["final"]) == pytest.approx(sum(finals) / 3, rel=1e-12)
        assert float(row["final_min"]) == min(finals) and float(row["final_max"]) == max(finals)

    def parsed(row):
        first = row["first_round_below_target"]
        return {"lr": float(row["lr"]), "final": float(row["final"]),
                "first_round_below_target": float(first) if first else None}

    best = read_csv(out / "summary.csv")[0]
    assert ranking_key(parsed(best)) == min(ranking_key(parsed(row)) for row in grid)
    assert math.isfinite(float(best["final_std"]))
    again = run_main(*argv)  # the same command reuses every trial
    assert "reused 9 trial(s)" in again.stdout


def test_the_docs_example_is_the_shipped_file_and_a_valid_40_run_experiment():
    root = Path(__file__).resolve().parent.parent
    shown = (root / "docs" / "experiments.md").read_text().split("```toml\n", 1)[1].split("```", 1)[0]
    path = root / "docs" / "examples" / "experiment.toml"
    assert shown == path.read_text()
    experiment = load_experiment(path)
    assert count_runs(experiment)[0] == 40


def test_an_nn_sweep_of_the_users_own_model_runs_with_the_callers_permission_and_reruns_skip_it(tmp_path, monkeypatch):
    import numpy as np

    (tmp_path / "sweep_nets.py").write_text(
        "from torch import nn\ndef tiny(num_classes):\n    return nn.Sequential(nn.Flatten(), nn.LazyLinear(num_classes))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", images=rng.integers(0, 256, (40, 1, 8, 8), dtype=np.uint8),
             labels=np.arange(40) % 4)
    problem = f"nn:data={tmp_path / 'd.npz'},test_fraction=0.25,clients=2,batch=4,model=sweep_nets:tiny,partition=iid"
    experiment = parse_experiment({"algorithms": ["fedavg"], "problems": [problem], "rounds": 2, "lr": 0.01,
                                   "seeds": 2})
    with pytest.raises(ConfigError, match="would import and run Python code"):
        run_sweep(experiment, tmp_path / "refused")
    assert not (tmp_path / "refused").exists()
    report = run_sweep(experiment, tmp_path / "out", allow_model_import=True)
    assert report.ran == 2 and not report.failed
    assert {row["status"] for row in read_csv(tmp_path / "out" / "results.csv")} == {"complete"}
    # An nn run records the formulation it measured (client_chunk, layout: "auto" in the sweep);
    # its folder still counts as this run, so a rerun skips it.
    again = run_sweep(experiment, tmp_path / "out", allow_model_import=True)
    assert (again.skipped, again.ran) == (2, 0)


@pytest.mark.parametrize("signum,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_stopped_sweep_exits_with_its_signals_status_and_one_line(tmp_path, signum, code):
    path = write(tmp_path, f"algorithms = ['focus']\nproblems = ['{SMALL}']\nrounds = 10000000\nseeds = 2\n")
    out = tmp_path / "sweep"
    proc = popen_cli("sweep", str(path), "--out", str(out), "--checkpoint-every", "1000")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list((out / "runs").glob(".*.focusfl-partial/checkpoint.pt")):
        time.sleep(0.05)
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == code
    # the two seeds are one batch of runs (--batch-runs auto): both stop with a checkpoint
    assert stderr.strip().splitlines() == [
        "focusfl: sweep interrupted: 2 run(s) stopped with a checkpoint; run the same command again to continue"]


def test_plot_never_replaces_a_users_file_but_replaces_its_own(reference, tmp_path, capsys):
    from focusfl.cli import main

    mine = tmp_path / "fig.png"
    mine.write_text("my picture")
    assert main(["plot", str(reference), "--out", str(mine)]) == 2
    assert "exists and focusfl did not write it" in capsys.readouterr().err
    assert mine.read_text() == "my picture" and sorted(p.name for p in tmp_path.iterdir()) == ["fig.png"]
    ours = tmp_path / "ours.png"
    assert main(["plot", str(reference), "--out", str(ours)]) == 0
    assert main(["plot", str(reference), "--out", str(ours), "--band", "minmax"]) == 0  # its own: replaced
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fig.png", "ours.pdf", "ours.png"]
    (tmp_path / "raster.pdf").write_text("mine")
    assert main(["participation", "bernoulli", "--plot", str(tmp_path / "raster.pdf")]) == 2
    assert (tmp_path / "raster.pdf").read_text() == "mine"
    assert main(["participation", "bernoulli", "--plot", str(tmp_path / "r.pdf")]) == 0
    assert main(["participation", "bernoulli", "--plot", str(tmp_path / "r.pdf")]) == 0
    # SVG too (the plotting code always wrote it): tagged, replaced when ours, refused when not.
    assert main(["participation", "bernoulli", "--plot", str(tmp_path / "r.svg")]) == 0
    first = (tmp_path / "r.svg").read_bytes()
    assert main(["participation", "bernoulli", "--plot", str(tmp_path / "r.svg")]) == 0
    assert (tmp_path / "r.svg").read_bytes() == first  # no date in it: the same figure, the same bytes
    (tmp_path / "mine.svg").write_text("<?xml version='1.0'?><svg/>")
    assert main(["participation", "bernoulli", "--plot", str(tmp_path / "mine.svg")]) == 2


@RAY
def test_a_ray_cluster_that_is_not_there_leaves_no_folder_behind(tmp_path):
    pytest.importorskip("ray")
    from cli_harness import assert_one_line_error, cli_env, run_cli

    experiment = tmp_path / "experiment.toml"
    experiment.write_text('algorithms = ["focus"]\nproblems = ["ridge:dim=3,clients=4,samples=5"]\nrounds = 5\n')
    env = cli_env()
    env.pop("RAY_ADDRESS", None)
    proc = run_cli("sweep", str(experiment), "--out", str(tmp_path / "big"), "--executor", "ray", "--address", "auto",
                   env=env, limit_gib=None, timeout=120)
    assert_one_line_error(proc, 2, contains="cannot connect to Ray at auto")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["experiment.toml"]


@RAY
def test_ray_address_where_nothing_listens_is_one_line_within_seconds(tmp_path):
    pytest.importorskip("ray")
    import socket

    from cli_harness import assert_one_line_error, run_cli

    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    experiment = tmp_path / "experiment.toml"
    experiment.write_text('algorithms = ["focus"]\nproblems = ["ridge:dim=3,clients=4,samples=5"]\nrounds = 5\n')
    started = time.monotonic()
    proc = run_cli("sweep", str(experiment), "--out", str(tmp_path / "big"), "--executor", "ray",
                   "--address", f"127.0.0.1:{port}", timeout=120)
    line = assert_one_line_error(proc, 2, contains=f"cannot connect to Ray at 127.0.0.1:{port}")
    assert "ray start --head" in line and time.monotonic() - started < 60  # Ray alone retries for minutes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["experiment.toml"]


def test_plot_labels_spell_booleans_as_specs_do(tmp_path):
    from focusfl.cli import main
    from focusfl.sweeps.aggregate import read_folders

    for name, participation in (("a", "bernoulli:redraw=true"), ("b", "bernoulli:redraw=false")):
        assert main(["run", "--algorithm", "focus", "--problem", SMALL, "--participation", participation,
                     "--rounds", "3", "--out", str(tmp_path / name)]) == 0
    series, _ = read_folders([tmp_path / "a", tmp_path / "b"], "loss")
    assert sorted(s.axes["participation"] for s in series) == ["bernoulli:redraw=false", "bernoulli:redraw=true"]
    assert json.loads((tmp_path / "a" / "config.json").read_text())["participation"]["redraw"] is True


def test_plot_labels_a_run_by_the_hyperparameters_it_changed(tmp_path):
    # `focusfl plot` of MIFA and the notebook's MIFA once drew two curves both labelled "mifa".
    from focusfl.cli import main
    from focusfl.sweeps.aggregate import read_folders

    for name, algorithm in (("a", "mifa:notebook=true"), ("b", "mifa")):
        assert main(["run", "--algorithm", algorithm, "--problem", "ridge:dim=3,clients=4,samples=5", "--rounds", "5",
                     "--lr", "1e-3", "--out", str(tmp_path / name)]) == 0
    series, _ = read_folders([tmp_path / "a", tmp_path / "b"], None)
    assert [s.axes["algorithm"] for s in series] == ["mifa:notebook=true", "mifa"]


def test_plot_panels_say_what_the_participation_was():
    # Panels were titled "markov" (rho dropped) and "bernoulli:redraw=False".
    from focusfl.sweeps.aggregate import _participation_label

    assert _participation_label({"name": "markov", "p": [0.1, 0.2], "rho": [0.8, 0.8]}) == "markov:rho=0.8"
    assert _participation_label({"name": "bernoulli", "p": [0.1, 0.2], "redraw": False}) == "bernoulli:redraw=false"
    assert _participation_label({"name": "bernoulli", "p": [0.5, 0.5], "redraw": False}) == \
        "bernoulli:p=0.5,redraw=false"


def _deaf_worker(ready) -> None:
    """A worker that ignores SIGTERM (as one stuck where its run never reaches the end of a round)."""
    import signal as _signal
    import time as _time

    _signal.signal(_signal.SIGTERM, _signal.SIG_IGN)
    ready.set()
    _time.sleep(600)


def test_a_worker_that_ignores_sigterm_is_killed_after_the_grace():
    """A stopped sweep returns even when a worker does not exit on SIGTERM: it is killed after the
    grace, instead of keeping the sweep (and whoever reads its output) waiting for ever."""
    import multiprocessing as mp

    from focusfl.sweeps.executors import _stop_workers

    context = mp.get_context("spawn")
    ready = context.Event()
    deaf = context.Process(target=_deaf_worker, args=(ready,))
    deaf.start()
    assert ready.wait(120)
    _stop_workers([deaf], grace=0.5)
    assert not deaf.is_alive() and deaf.exitcode == -9


def _worker_whose_run_takes_the_first_sigterm(ready) -> None:
    """A worker whose run's handler takes the first SIGTERM and stops; idle again, it waits."""
    import signal as _signal
    import time as _time

    _signal.signal(_signal.SIGTERM, lambda signum, frame: _signal.signal(_signal.SIGTERM, _signal.SIG_DFL))
    ready.set()
    _time.sleep(600)


def test_a_worker_whose_run_took_the_first_sigterm_is_stopped_by_another_not_killed():
    """The full-disk sweep once waited the whole 60 s grace for a worker whose run had stopped on
    the first SIGTERM: the signal is sent again, so such a worker ends by SIGTERM (-15), not by
    the SIGKILL (-9) at the end of the grace."""
    import multiprocessing as mp

    from focusfl.sweeps.executors import STOP_GRACE_SECONDS, _stop_workers

    ready = mp.get_context("spawn").Event()
    worker = mp.get_context("spawn").Process(target=_worker_whose_run_takes_the_first_sigterm, args=(ready,))
    worker.start()
    assert ready.wait(120)
    _stop_workers([worker], grace=STOP_GRACE_SECONDS)
    assert not worker.is_alive() and worker.exitcode == -15


@pytest.mark.parametrize("cause", ["changed code", "full disk"])
def test_what_ends_a_sweep_ends_it_also_from_a_ray_task(cause):
    """Ray hands a task's error back wrapped (RayTaskError, the original as ``cause``): a changed
    algorithm file or a full disk must still end the sweep in one line, not fail one run."""
    from types import SimpleNamespace

    from focusfl.algorithms.importing import ChangedCode
    from focusfl.errors import DiskFullError
    from focusfl.sweeps.executors import RayExecutor

    raised = ChangedCode("algorithm code a.py has changed") if cause == "changed code" else DiskFullError("disk full")

    class Wrapped(RuntimeError):  # what ray.get raises: the task's error as its cause
        def __init__(self):
            super().__init__("RayTaskError: ...")
            self.cause = raised

    def get(ref):
        raise Wrapped()

    executor = RayExecutor.__new__(RayExecutor)
    with pytest.raises(type(raised)) as caught:
        executor._receive(SimpleNamespace(get=get), ref=None, item=SimpleNamespace(key="run"))
    assert caught.value is raised

    class Crashed(RuntimeError):  # a worker that died: one failed run, the sweep goes on
        cause = None

    def crash(ref):
        raise Crashed("worker died")

    [(_, outcome)] = executor._receive(SimpleNamespace(get=crash), ref=None, item=SimpleNamespace(key="run"))
    assert outcome["status"] == "failed" and "worker died" in outcome["error"]


def test_a_run_killed_while_publishing_is_put_in_place_by_the_rerun(tmp_path):
    """A run killed between marking its partial folder complete and moving it into place is
    'done' for the rerun, which skips it: the rerun puts it in place before reading its rows."""
    from focusfl.io.folders import PARTIAL_SUFFIX

    path = write(tmp_path, f'algorithms = ["focus", "fedavg"]\nproblems = ["{SMALL}"]\nrounds = 4\n')
    whole, out = tmp_path / "whole", tmp_path / "cut"
    assert run_main("sweep", str(path), "--out", str(whole)).returncode == 0
    assert run_main("sweep", str(path), "--out", str(out)).returncode == 0
    # the state publish leaves when killed after its marker and before its rename
    run = next(p for p in (out / "runs").iterdir() if not p.name.startswith("."))
    run.rename(run.parent / f".{run.name}{PARTIAL_SUFFIX}")
    (out / "results.csv").unlink()
    again = run_main("sweep", str(path), "--out", str(out))
    assert again.returncode == 0, again.stderr
    assert files_of(out) == files_of(whole)


def test_the_sweeps_console_summary_counts_diverged_runs_and_prints_no_band_of_infinities(tmp_path):
    """Two seeds of a step size that blows up: the table says "2 of 2 diverged" (not "inf
    (inf-inf)") and the closing line "2 diverged" beside "0 failed"."""
    from cli_harness import run_cli

    experiment = write(tmp_path, 'algorithms = ["focus"]\nproblems = ["ridge:dim=3,clients=4,samples=5"]\n'
                                 'lr = [1e30]\nseeds = 2\nrounds = 8\n')
    proc = run_cli("sweep", str(experiment), "--out", str(tmp_path / "sweep"))
    assert proc.returncode == 0, proc.stderr
    assert "inf (" not in proc.stdout and "2 of 2 diverged" in proc.stdout
    assert "2 runs: 0 finished earlier, 2 ran, 0 failed, 2 diverged;" in proc.stdout

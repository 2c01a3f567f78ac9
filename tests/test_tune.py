"""`focusfl tune`: the step-size grid, the ranking rule and the command."""
import json
import math

import pytest

from cli_harness import assert_one_line_error, run_cli, run_main, snapshot
from focusfl.cli import main
from focusfl.errors import ConfigError
from focusfl.io.atomic import read_csv
from focusfl.sweeps import tune
from focusfl.sweeps.tune import expand_algorithms, lr_grid, pick_best

SMALL = "ridge:dim=5,clients=4,samples=10"


def test_grid_is_log_spaced_with_both_ends():
    grid = lr_grid(1e-4, 1e-1, 4)
    assert grid == pytest.approx([1e-4, 1e-3, 1e-2, 1e-1])
    assert lr_grid(0.5, 0.5, 1) == [0.5]
    ratios = [b / a for a, b in zip(lr_grid(1e-3, 1.0, 7), lr_grid(1e-3, 1.0, 7)[1:])]
    assert ratios == pytest.approx([ratios[0]] * len(ratios), rel=1e-4)


@pytest.mark.parametrize("lo,hi,points", [(0.0, 1.0, 3), (1.0, 0.1, 3), (1e-3, 1e-1, 1), (1e-3, math.inf, 3)])
def test_bad_grids_are_config_errors(lo, hi, points):
    with pytest.raises(ConfigError):
        lr_grid(lo, hi, points)


def trial(lr, final, first=None):
    return {"lr": lr, "final": final, "first_round_below_target": first}


def test_reaching_the_target_first_beats_a_lower_final_value():
    trials = [trial(1e-3, 1e-16, first=300), trial(1e-2, 1e-12, first=120), trial(1e-1, math.inf)]
    assert pick_best(trials)["lr"] == 1e-2
    assert pick_best([trial(1e-3, 2e-3), trial(1e-2, 5e-4), trial(1e-1, math.inf)])["lr"] == 1e-2


def test_all_means_every_non_alias_algorithm():
    names = expand_algorithms(["all"])
    assert "focus" in names and "fedsum" in names
    assert "sg_focus" not in names and "fedavg_all" not in names
    with pytest.raises(ConfigError):
        expand_algorithms(["nope"])


def test_tune_command_writes_the_best_step_per_algorithm(tmp_path, capsys):
    out = tmp_path / "tune"
    argv = ["tune", "--algorithm", "focus", "--algorithm", "fedsum", "--problem", SMALL,
            "--rounds", "80", "--local-steps", "2", "--lr-min", "1e-3", "--lr-max", "1e-1",
            "--points", "3", "--out", str(out)]
    assert main(argv) == 0
    grid = read_csv(out / "grid.csv")
    best = read_csv(out / "summary.csv")
    assert len(grid) == 6 and [row["algorithm"] for row in best] == ["focus", "fedsum"]
    for row in best:
        mine = [g for g in grid if g["algorithm"] == row["algorithm"]]
        reached = [g for g in mine if g["first_round_below_target"]]
        if reached:  # the earliest to reach the target wins
            assert int(row["first_round_below_target"]) == min(int(g["first_round_below_target"]) for g in reached)
        else:
            assert float(row["final"]) == min(float(g["final"]) for g in mine)
    assert (out / "config.json").exists()
    assert "best lr" in capsys.readouterr().out


def test_tune_command_rejects_bad_input_without_output(tmp_path):
    out = tmp_path / "tune"
    assert main(["tune", "--algorithm", "nope", "--out", str(out)]) == 2
    assert main(["tune", "--algorithm", "fedsum", "--problem", "ridge:foo=1", "--out", str(out)]) == 2
    assert main(["tune", "--algorithm", "fedsum", "--lr-min", "1", "--lr-max", "0.1", "--out", str(out)]) == 2
    assert not out.exists()


def test_tune_ranks_neural_networks_on_a_validation_split_never_the_test_set(tmp_path, capsys):
    # nn rows carry test metrics, and the clients' held-out share gives val_loss: tune ranks by it.
    import json

    import numpy as np

    rng = np.random.default_rng(0)
    data = tmp_path / "tiny.npz"
    np.savez(data, images=rng.integers(0, 256, (80, 1, 6, 6), dtype=np.uint8), labels=rng.integers(0, 3, 80))
    out = tmp_path / "t"
    problem = f"nn:data={data},clients=4,model=logreg,batch=8,test_fraction=0.25,partition=iid"
    code = main(["tune", "--algorithm", "fedavg", "--problem", problem, "--participation", "full", "--rounds", "3",
                 "--lr-min", "0.01", "--lr-max", "0.1", "--points", "2", "--out", str(out)])
    assert code == 0
    grid = read_csv(out / "grid.csv")
    assert {row["metric"] for row in grid} == {"val_loss"}
    assert all(math.isfinite(float(row["final"])) for row in grid)
    assert json.loads((out / "config.json").read_text())["tune"]["problem"]["validation"] == 0.1
    assert "first <=" not in capsys.readouterr().out  # no target for neural networks
    assert main(["tune", "--algorithm", "fedavg", "--problem", problem, "--target", "0.1",
                 "--out", str(tmp_path / "u")]) == 2
    assert main(["tune", "--algorithm", "fedavg", "--validation", "0.1", "--out", str(tmp_path / "v")]) == 2


def test_a_stochastic_score_prefers_a_steady_loss_to_an_oscillating_one():
    steady = [2.3, 1.0, 0.8, 0.7, 0.65, 0.6]
    oscillating = [2.3, 0.9, 0.5, 2.0, 1.8, 0.4]  # lower final, but not where it ends on average
    assert tune.trial_score(oscillating, "val_loss", False) > tune.trial_score(steady, "val_loss", False)
    assert tune.trial_score(oscillating, "rel_error", False) == 0.4  # convex: the final value
    assert tune.trial_score(steady, "val_loss", True) == math.inf


def test_algorithms_are_a_comma_separated_list_as_the_help_shows():
    assert tune.split_algorithms("focus,fedavg") == ["focus", "fedavg"]
    assert tune.split_algorithms("focus, fedavg:weighting=p,server_lr=1,scaffold") == [
        "focus", "fedavg:weighting=p,server_lr=1", "scaffold"]
    assert tune.expand_algorithms(["focus,fedavg", "scaffold"]) == ["focus", "fedavg", "scaffold"]


def test_the_help_example_runs_as_a_user_types_it(tmp_path):
    from cli_harness import run_cli

    out = tmp_path / "tune"
    proc = run_cli("tune", "--algorithm", "focus,fedavg", "--problem", "ridge", "--participation", "bernoulli",
                   "--rounds", "20", "--points", "2", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert [row["algorithm"] for row in read_csv(out / "summary.csv")] == ["focus", "fedavg"]
    # Its trials are a sweep whose experiment.toml `focusfl sweep` runs (and finds finished).
    import tomllib

    entries = tomllib.loads((out / "experiment.toml").read_text())["algorithms"]
    assert [entry["name"] for entry in entries] == ["focus", "fedavg"]  # each with the steps its search tried
    again = run_cli("sweep", str(out / "experiment.toml"), "--out", str(tmp_path / "sweep"))
    assert again.returncode == 0, again.stderr


def test_a_stochastic_choice_keeps_one_grid_point_below_the_edge_of_stability():
    def trial(lr, final, diverged=0):
        return {"algorithm": "scaffold", "lr": lr, "metric": "val_loss", "final": final,
                "first_round_below_target": None, "diverged": diverged}

    # 0.02 scores best but 0.06 diverged: 0.02 sits at the edge, 0.0067 is taken.
    trials = [trial(0.0022, 2.2), trial(0.0067, 1.19), trial(0.02, 0.64), trial(0.06, math.inf, 2)]
    assert tune.choose(trials)["lr"] == 0.0067
    assert tune.pick_best(trials)["lr"] == 0.02  # convex problems keep the plain ranking
    assert tune.choose([trial(0.05, 0.6), trial(0.15, 0.38)])["lr"] == 0.15  # the grid's top: nothing above
    everything = [trial(0.1, math.inf, 1), trial(0.3, math.inf, 2)]
    assert tune.choose(everything)["lr"] == 0.1


def test_tune_shows_booleans_as_a_spec_spells_them_and_keeps_them_in_its_runs(tmp_path):
    out = tmp_path / "tune"
    proc = run_main("tune", "--algorithm", "proxskip:pull=true", "--problem", SMALL, "--participation",
                    "bernoulli:redraw=true", "--rounds", "5", "--points", "2", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "proxskip:pull=true" in proc.stdout and "True" not in proc.stdout
    assert {row["algorithm"] for row in read_csv(out / "grid.csv")} == {"proxskip:pull=true"}
    # Display only: the runs' configurations keep their booleans.
    configs = [json.loads(p.read_text()) for p in (out / "runs").glob("*/config.json")]
    assert len(configs) >= 2 and all(c["algorithm"]["pull"] is True for c in configs)  # the grid and its extension


def test_a_tune_folder_of_another_experiment_is_refused_and_the_same_one_is_extended(tmp_path):
    """The README's two tune examples both wrote runs/tune: the second replaced the first's
    tables and left its trial folders mixed with its own. Now the default folder (or any) that
    holds a tune of another setup is refused in one line, before anything is written; a rerun of
    the same setup with more steps or seeds reuses the trials it has."""
    ridge = ["tune", "--algorithm", "focus", "--problem", "ridge:dim=5,clients=4,samples=6", "--rounds", "6",
             "--points", "2"]
    first = run_cli(*ridge, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    folder = tmp_path / "runs" / "tune"
    before = snapshot(folder)
    other = ["tune", "--algorithm", "focus", "--problem", "logistic:dim=4,clients=4,samples=6", "--rounds", "6",
             "--points", "2"]
    line = assert_one_line_error(run_main(*other, cwd=tmp_path), 2, "holds a focusfl tune of another experiment")
    assert "runs/tune" in line and "problems" in line and "choose another folder" in line
    longer = [*ridge[:-4], "--rounds", "8", "--points", "2"]
    assert_one_line_error(run_main(*longer, cwd=tmp_path), 2, "its rounds is 6, this one's 8")
    assert snapshot(folder) == before
    more = run_main(*ridge[:-1], "3", "--seeds", "2", cwd=tmp_path)  # a larger grid, two seeds: the same setup
    assert more.returncode == 0, more.stderr
    assert "reused 2 trial(s)" in more.stdout
    elsewhere = run_main(*other, "--out", "runs/tune-logistic", cwd=tmp_path)
    assert elsewhere.returncode == 0, elsewhere.stderr
    

# The run fields that change a run's bytes (runs.config's keyed fields), by where a tune takes
# each: per trial, from its setup (config.json's "tune" record), or left at run's default.
PER_TRIAL = {"algorithm"}
LEFT_AT_DEFAULT = {"engine", "deterministic"}


def test_the_tune_record_names_every_run_field_that_changes_a_trials_bytes():
    """A new run field that changes bytes fails here until tune records it or leaves it at the
    default (its trials were run under a dp its config.json did not name)."""
    from focusfl.sweeps.sweep import make_experiment, plan
    from focusfl.runs.config import _KEYED, field_defaults

    assert set(_KEYED) - PER_TRIAL - LEFT_AT_DEFAULT <= set(tune.SETUP_KEYS)
    assert set(tune.RUN_OPTIONS) <= set(tune.SETUP_KEYS) and not LEFT_AT_DEFAULT & set(tune.RUN_OPTIONS)
    experiment = make_experiment(algorithms=["fedavg"], problems=[SMALL], rounds=2, lr=[0.1])
    defaults = field_defaults()
    for planned in plan(experiment):
        assert {name: getattr(planned.config, name) for name in LEFT_AT_DEFAULT} == \
            {name: defaults[name] for name in LEFT_AT_DEFAULT}


def test_a_private_tune_records_its_dp_and_threads_and_refuses_another_in_its_folder(tmp_path):
    out = tmp_path / "t"
    dp = "clip=1,noise=1,mode=central,delta=1e-5"
    common = ["tune", "--algorithm", "fedavg", "--problem", SMALL, "--rounds", "3", "--lr-min", "0.01",
              "--lr-max", "0.1", "--points", "2", "--out", str(out)]
    proc = run_cli(*common, "--dp", dp)
    assert proc.returncode == 0, proc.stderr
    record = json.loads((out / "config.json").read_text())["tune"]
    assert record["dp"] == {"clip": 1, "noise": 1, "mode": "central", "delta": 1e-5}
    assert record["threads"] == 1 and record["numerics"] == "native"
    trials = [json.loads(path.read_text()) for path in (out / "runs").glob("*/config.json")]
    assert len(trials) >= 2 and all(t["dp"] == record["dp"] and isinstance(t["dp_nonce"], int) for t in trials)
    before = snapshot(out)
    for other, says in ((["--dp", dp.replace("noise=1", "noise=2")], "its dp is"), ([], "its dp is"),
                        (["--dp", dp, "--threads", "2"], "its threads is null, this one's 2")):
        assert_one_line_error(run_main(*common, *other), 2, says)
    assert snapshot(out) == before
    plain = run_main(*common[:-1], str(tmp_path / "plain"))
    assert plain.returncode == 0, plain.stderr
    assert json.loads((tmp_path / "plain" / "config.json").read_text())["tune"]["dp"] == "none"


# -- the search rule: an interior optimum ------------------------------------------------------------
def scored(lr, final, diverged=False):
    return {"lr": lr, "final": math.inf if diverged else final, "first_round_below_target": None,
            "diverged_at": 10 if diverged else None}


def bowl(optimum, diverge_above=math.inf):
    """A trial function whose score is best at ``optimum`` (log distance) and that diverges above a step."""
    return lambda lr: scored(lr, abs(math.log10(lr / optimum)) + 1e-3, lr > diverge_above)


def run_search(function, grid, **kw):
    def evaluate(asked):
        return {key: [function(lr) for lr in lrs] for key, lrs in asked.items()}

    return tune.search_steps(evaluate, {"a": grid}, pick=tune.pick_best, **kw)["a"]


def test_the_search_extends_the_grid_until_the_best_step_is_interior():
    grid = lr_grid(1e-4, 1e-3, 3)
    choice = run_search(bowl(3e-2), grid)  # the optimum lies 1.5 decades above the grid
    assert choice.reason.startswith("interior") and not choice.capped
    assert choice.lower["lr"] < choice.lr < choice.upper["lr"] and choice.lr == pytest.approx(3.16e-2, rel=0.01)
    assert min(choice.added) > 1e-3 and len(choice.added) == 4  # 3.2e-3, 1e-2, 3.2e-2, 1e-1
    below = run_search(bowl(2e-6), grid)  # and below it
    assert below.reason.startswith("interior") and below.lr < 1e-4 and max(below.added) < 1e-4


def test_the_search_stops_at_a_diverged_step_and_reports_its_cap():
    grid = lr_grid(1e-4, 1e-3, 3)
    bounded = run_search(bowl(1.0, diverge_above=5e-3), grid)
    assert bounded.reason == "bounded by a diverged step above" and tune.is_diverged(bounded.upper)
    assert bounded.lr == pytest.approx(3.16e-3, rel=0.01)
    capped = run_search(bowl(1e6), grid, cap=2)
    assert capped.capped and "the cap" in capped.reason and capped.upper is None and len(capped.added) == 2
    inside = run_search(bowl(3e-4), grid)
    assert inside.added == () and inside.reason.startswith("interior")


def test_tune_reports_the_extension_and_picks_an_interior_step(tmp_path):
    # FOCUS's best step on this ridge lies above the range given: tune extends it and says so.
    out = tmp_path / "tune"
    proc = run_main("tune", "--algorithm", "focus", "--problem", "ridge:dim=5,clients=4,samples=10",
                    "--participation", "bernoulli", "--rounds", "150", "--local-steps", "2", "--lr-min", "1e-5",
                    "--lr-max", "1e-4", "--points", "3", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "extending the grid of focus" in proc.stdout and "added beyond the grid" in proc.stdout
    row = read_csv(out / "summary.csv")[0]
    assert float(row["lr"]) > 1e-4 and row["added_steps"]
    assert float(row["lower_lr"]) < float(row["lr"]) < float(row["upper_lr"])
    assert row["reason"].startswith(("interior", "bounded")) and row["capped"] == "False"
    steps = {float(g["lr"]) for g in read_csv(out / "grid.csv")}
    assert len(steps) > 3 and max(steps) > float(row["lr"])
    # The steps added continue the grid itself (10 ** 0.5 apart), not rounded steps times 3.16.
    added = sorted(steps - {1e-5, 3.16228e-5, 1e-4})
    assert added == [3.16228e-4, 1e-3, 3.16228e-3, 1e-2, 3.16228e-2, 1e-1][:len(added)]


@pytest.mark.parametrize("grid,above,below", [
    ([1e-5, 3.16228e-5, 1e-4], [3.16228e-4, 1e-3, 3.16228e-3, 1e-2], [3.16228e-6, 1e-6]),
    (lr_grid(1e-5, 1e-1, 9), [0.316228, 1.0, 3.16228, 10.0], [3.16228e-6, 1e-6]),
    # A preset's steps x 1/9 .. 3 rounded to three digits extend by 3, from the exact largest step.
    ([0.00111, 0.00333, 0.01, 0.03], [0.09, 0.27, 0.81, 2.43], [0.00037037, 0.000123457]),
    ([0.00556, 0.0167, 0.05, 0.15], [0.45, 1.35, 4.05, 12.15], [0.00185185, 0.000617284]),
])
def test_the_extension_stays_on_the_grid(grid, above, below):
    rising = run_search(lambda lr: scored(lr, 1 / lr), grid, cap=len(above))
    assert sorted(rising.added) == above and rising.capped
    falling = run_search(lambda lr: scored(lr, lr), grid, cap=len(below))
    assert sorted(falling.added, reverse=True) == below and falling.capped


@pytest.mark.parametrize("algorithms,says", [
    ([" "], "an empty algorithm name"),
    ([","], "an empty algorithm name"),
    (["focus,,fedavg"], "an empty algorithm name"),
    (["focus:lr=0.1,fedavg"], "give lr as --lr-min and --lr-max"),
    (["focus:lr=0.1"], "not inside the SPEC"),
    (["fedavg:local_steps=3"], "give local_steps as --local-steps, not inside the SPEC"),
    (["focus,fedavg", "focus"], "'focus' is listed twice"),
    (["focus,all"], "'focus' is listed twice"),
    (["scaffold", "scaffold:server_lr=1"], "listed twice (as 'scaffold' too)"),
    (["nope"], "unknown algorithm 'nope'"),
    (["focus:nope=1"], "unknown key 'nope'"),
])
def test_tune_refuses_a_bad_algorithm_list_before_any_trial(tmp_path, algorithms, says):
    """Blank names, lr or local_steps inside a SPEC, one algorithm twice and unknown names: one
    line, exit 2, and no folder (nothing ran)."""
    options = [arg for name in algorithms for arg in ("--algorithm", name)]
    proc = run_main("tune", *options, "--problem", SMALL, "--rounds", "4", "--points", "2", "--out", "out",
                    cwd=tmp_path)
    assert_one_line_error(proc, 2, says)
    assert list(tmp_path.iterdir()) == []


# -- trials in batches of runs (runs/batch.py) -------------------------------------------------------
TINY_RIDGE = "ridge:dim=5,clients=4,samples=10"


def _group_sizes(monkeypatch) -> list[int]:
    """The size of every batch sweep.compute_configs steps from now on (appended as they run)."""
    from focusfl.sweeps import sweep

    sizes: list[int] = []
    execute_batch = sweep.execute_batch

    def counted(runs):
        sizes.append(len(runs))
        return execute_batch(runs)

    monkeypatch.setattr(sweep, "execute_batch", counted)
    return sizes


def test_trials_run_in_batches_and_give_each_trials_own_row(monkeypatch):
    setup = tune.setup(problem=TINY_RIDGE, participation="bernoulli:p=0.3;0.5;0.7;0.9", rounds=40, local_steps=2,
                       target=1e-8, eval_every=5)
    # 0.3 diverges (it stops alone, at the round it stops alone); the others differ by algorithm and step.
    trials = [tune.Trial(algorithm, lr, setup) for algorithm in ("focus", "fedavg", "scaffold:server_lr=0.5", "scaffold")
              for lr in (1e-3, 1e-2, 0.3)]
    alone = [tune.run_trial(*trial) for trial in trials]
    assert any(row["diverged_at"] is not None for row in alone) and any(row["diverged_at"] is None for row in alone)
    sizes = _group_sizes(monkeypatch)
    assert tune.run_trials(trials) == alone
    # One batch per algorithm (its hyperparameters may differ within it), in the order of its first trial.
    assert sizes == [3, 3, 6]
    sizes.clear()
    with_rows = tune.run_trials(trials, rows=True, batch_runs=2)
    assert with_rows == [tune.run_trial(*trial, rows=True) for trial in trials] and max(sizes) == 2
    sizes.clear()
    assert tune.run_trials(trials, batch_runs=1) == alone and set(sizes) == {1}


def test_searches_evaluated_together_choose_what_each_alone_chooses(monkeypatch):
    setups = {process: tune.setup(problem=TINY_RIDGE, participation=process, rounds=60, local_steps=2, target=1e-8,
                                  eval_every=10) for process in ("full", "cyclic:groups=2")}
    cells = {(process, algorithm): (algorithm, setup) for process, setup in setups.items()
             for algorithm in ("focus", "fedavg")}
    grid = lr_grid(1e-3, 1e-1, 3)
    sizes = _group_sizes(monkeypatch)
    together = tune.search_steps(tune.trial_evaluator(cells), {key: grid for key in cells}, pick=pick_best)
    assert max(sizes) > 1
    for key, (algorithm, setup) in cells.items():
        def evaluate(asked, algorithm=algorithm, setup=setup):
            return {k: [tune.run_trial(algorithm, lr, setup) for lr in lrs] for k, lrs in asked.items()}

        assert together[key] == tune.search_steps(evaluate, {key: grid}, pick=pick_best)[key]

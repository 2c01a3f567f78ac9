"""`focusfl reproduce delays` (FedSUM delay metrics) and the communication figure of
`focusfl reproduce ridge`."""
from focusfl.cli import main
from focusfl.reproduce import reproduce_ridge
from focusfl.io.atomic import read_csv
from focusfl.reproduce.reproduce_delays import measure, pattern_specs, summarize_rows


def test_patterns_keep_their_rates_for_any_population():
    specs = pattern_specs(40)
    assert specs["Case 1: uniform, 10 of N"] == "uniform:m=4"
    assert specs["P1: uniform, 20 of N"] == "uniform:m=8"
    assert len(specs) == 7


def test_cyclic_cases_have_their_known_delays():
    rows, traces = measure(clients=30, rounds=300, seeds=[0, 1])
    summary = {row["pattern"]: row for row in summarize_rows(rows)}
    cyclic = summary["Case 3: cyclic, 10 groups"]
    # E groups: every client waits exactly E - 1 rounds once all have been seen.
    assert cyclic["tau_max_mean"] == 9 and cyclic["tau_max_min"] == 9
    reshuffled = summary["Case 4: reshuffled cyclic, 10 groups"]
    assert 9 <= reshuffled["tau_max_mean"] <= 18  # gaps of up to 2E - 1 rounds
    # Random patterns at the same mean rate have far longer worst delays than cyclic ones.
    assert summary["Case 2: independent, p = 0.1"]["tau_max_mean"] > 2 * reshuffled["tau_max_mean"]
    assert len(traces["Case 3: cyclic, 10 groups"]) == 300


def test_delays_command_writes_table_and_figure(tmp_path, capsys):
    out = tmp_path / "delays"
    assert main(["reproduce", "delays", "--clients", "20", "--rounds", "200", "--seeds", "2", "--out", str(out)]) == 0
    summary = read_csv(out / "summary.csv")
    labels = [row["pattern"].split(":")[0] for row in summary]
    assert labels == ["Case 1", "Case 2", "Case 3", "Case 4", "P1", "P2", "P3"]
    assert len(read_csv(out / "per_seed.csv")) == 14
    assert (out / "figure.png").exists() and (out / "figure.pdf").exists()
    assert "tau_max" in capsys.readouterr().out


def test_delays_command_rejects_too_few_clients(tmp_path):
    out = tmp_path / "delays"
    assert main(["reproduce", "delays", "--clients", "5", "--out", str(out)]) == 2
    assert not out.exists()


def test_ridge_figure_counts_floats_and_draws_both_figures(tmp_path):
    panels, summary = reproduce_ridge.run_figure4(rounds=6, algorithms=["focus", "scaffold"])
    floats = {(row["algorithm"], row["scenario"]): row["floats_communicated"] for row in summary}
    for scenario in reproduce_ridge.SCENARIOS.values():
        # SCAFFOLD sends 2 vectors each way per participant, FOCUS 1: twice the traffic.
        assert floats[("scaffold", scenario)] == 2 * floats[("focus", scenario)] > 0
    assert floats[("focus", "full")] == 6 * 16 * 2 * 100  # rounds x clients x (down + up) x d
    traffic = reproduce_ridge.with_total_traffic(panels)
    last = traffic["full participation"]["focus"][-1]
    assert last["floats"] == last["comm_down"] + last["comm_up"] == floats[("focus", "full")]
    with reproduce_ridge.many_lines_style():
        reproduce_ridge.plot_figures(panels, tmp_path)
    assert (tmp_path / "figure_communication.png").exists() and (tmp_path / "figure.pdf").exists()


# -- reproduce ridge on the sweep machinery: shipped experiment files, --seeds, --export ----------
def test_shipped_paper_setting_lists_every_figure_algorithm():
    experiment = reproduce_ridge.load_setting("paper")
    assert sorted(entry.name for entry in experiment.algorithms) == sorted(reproduce_ridge.figure_algorithms())
    assert experiment.participation == list(reproduce_ridge.SCENARIOS.values())


def test_notebook_setting_runs_a_step_size_per_participation_process(tmp_path):
    out = tmp_path / "nb"
    assert main(["reproduce", "ridge", "--setting", "notebook", "--rounds", "3", "--out", str(out)]) == 0
    lrs = {(row["participation"], float(row["lr"])) for row in read_csv(out / "summary.csv")}
    assert lrs == {("full", 3e-4), ("uniform:m=4", 7.5e-5), ("weighted:m=4", 5e-5)}
    assert (out / "figure_notebook_axis.png").exists()


def test_seeds_give_a_band_and_a_rerun_skips_finished_runs(tmp_path, capsys):
    out = tmp_path / "fig4"
    argv = ["reproduce", "ridge", "--rounds", "4", "--seeds", "2", "--seed", "3", "--out", str(out)]
    assert main(argv) == 0
    summary = read_csv(out / "summary.csv")
    assert len(summary) == 33 and {row["seeds"] for row in summary} == {"2"}
    assert {row["seed"] for row in read_csv(out / "results.csv")} == {"3", "4"}
    stamps = {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("metrics.csv")}
    capsys.readouterr()
    assert main(argv) == 0
    assert "66 finished earlier, 0 ran" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("metrics.csv")} == stamps


def test_exported_file_runs_as_a_sweep_to_the_same_bytes(tmp_path, capsys):
    exported = tmp_path / "experiment.toml"
    assert main(["reproduce", "ridge", "--export", str(exported), "--rounds", "5", "--seeds", "2"]) == 0
    text = exported.read_text()
    assert "rounds = 5\n" in text and "seeds = 2 " in text and "# Figure 4 of the FOCUS paper" in text
    assert main(["reproduce", "ridge", "--rounds", "5", "--seeds", "2", "--out", str(tmp_path / "preset")]) == 0
    assert main(["sweep", str(exported), "--out", str(tmp_path / "sweep")]) == 0
    assert (tmp_path / "preset" / "results.csv").read_bytes() == (tmp_path / "sweep" / "results.csv").read_bytes()
    # --export never replaces a file.
    exported.write_text("mine")
    assert main(["reproduce", "ridge", "--export", str(exported)]) == 2
    assert exported.read_text() == "mine"
    assert "exists" in capsys.readouterr().err


def test_reproduce_ridge_refuses_a_huge_grid_and_bad_export_names_before_writing(tmp_path, capsys):
    out = tmp_path / "fig4"
    assert main(["reproduce", "ridge", "--seeds", "100000", "--out", str(out)]) == 2
    assert "--seeds: the grid has 3,300,000 runs" in capsys.readouterr().err and not out.exists()
    (tmp_path / "folder").mkdir()
    (tmp_path / "afile").write_text("mine")
    for name, message in (("", "--export needs a file name"), (str(tmp_path / "folder"), "is a folder"),
                          (str(tmp_path / "afile" / "x.toml"), "is not a folder")):
        assert main(["reproduce", "ridge", "--export", name]) == 2
        assert message in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "folder"]
    assert (tmp_path / "afile").read_text() == "mine"


def test_the_two_ridge_settings_default_to_their_own_folders(tmp_path):
    # The notebook setting once replaced a 165-run paper result in the shared default folder.
    from cli_harness import run_cli

    for setting in ("paper", "notebook"):
        proc = run_cli("reproduce", "ridge", "--setting", setting, "--rounds", "2", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "runs" / "reproduce-ridge" / "summary.csv").is_file()
    assert (tmp_path / "runs" / "reproduce-ridge-notebook" / "summary.csv").is_file()

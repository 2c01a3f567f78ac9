"""The reproduction report (`focusfl reproduce report`): every verdict recomputed at a smaller size,
the blow-up detector, the ridge settings, ProxSkip's adaptations, MIFA's notebook variant, the bias
window and the figure helpers."""
import math
from pathlib import Path

import pytest
import torch

from focusfl.algorithms import make_algorithm
from focusfl.cli import main
from focusfl.engine import simulate
from focusfl.engine.divergence import BlowUpDetector, blew_up
from focusfl.reproduce import studies
from focusfl.io.atomic import read_csv
from focusfl.plots import coinciding_groups
from focusfl.runs.config import RunConfig
from focusfl.runs.driver import build, execute
from focusfl.participation import make_participation
from focusfl.problems import make_problem

SMALL = "ridge:dim=10,clients=8,samples=20"
RATES = "0.1;0.2;0.3;0.4;0.5;0.6;0.7;0.9"


def run(algorithm, participation, rounds, lr, problem=SMALL, local_steps=2, eval_every=10):
    config = RunConfig(algorithm=algorithm, problem=problem, participation=participation, rounds=rounds,
                       local_steps=local_steps, lr=lr, eval_every=eval_every)
    return execute(build(config))


# -- blow-up detector -----------------------------------------------------------------------------
def test_blow_up_rule_needs_a_sustained_rise():
    assert not blew_up([1.0, 50.0, 50.0, 50.0])  # three evaluations, but 2 rounds apart only
    assert blew_up([1.0, 50.0, 50.0, 50.0], rounds=[0, 25, 50, 75])  # eval every 25: 50 rounds
    assert not blew_up([1.0, 50.0, 5.0, 50.0, 50.0], rounds=[0, 25, 50, 75, 100])  # streak broken
    assert not blew_up([0.0, 50.0, 50.0, 50.0], rounds=[0, 25, 50, 75])  # no reference
    assert blew_up([2.3] + [2500.0] * 21)  # the SG-FOCUS blow-up, evaluated every round


def test_detector_reads_the_first_loss_a_row_has():
    detector = BlowUpDetector()
    rows = [{"round": 0, "test_loss": 2.3}] + [{"round": 25 * k, "test_loss": 2500.0, "train_loss": 9.0}
                                               for k in range(1, 4)]
    assert [detector.update(row) for row in rows] == [False, False, False, True]
    assert detector.key == "test_loss"


def test_a_blown_up_run_stops_and_says_so():
    # The notebook's MIFA under uniform participation: the loss leaves its start for good.
    result = run("mifa:notebook=true", "uniform:m=2", 400, 0.01, eval_every=1)
    assert result.diverged_at is not None and result.diverged_at < 400
    assert result.rows[-1]["diverged"] is True and math.isfinite(result.rows[-1]["loss"])


# -- Figure 4: MIFA and ProxSkip ------------------------------------------------------------------
def test_notebook_mifa_diverges_where_mifa_plateaus():
    faithful = run("mifa", "uniform:m=2", 400, 0.001)
    notebook = run("mifa:notebook=true", "uniform:m=2", 400, 0.001)
    assert faithful.diverged_at is None and 1e-6 < faithful.rows[-1]["rel_error"] < 1e-2
    assert notebook.diverged_at is not None
    # Under full participation the notebook's MIFA is FedAvg (and MIFA), round by round.
    full = [run(a, "full", 30, 0.001, eval_every=1).rows for a in ("mifa:notebook=true", "fedavg")]
    assert max(abs(a["rel_error"] - b["rel_error"]) for a, b in zip(*full)) < 1e-12


@pytest.mark.parametrize("process", [f"bernoulli:p={RATES}", "uniform:m=2", f"markov:p={RATES},rho=0.5"])
def test_proxskip_plain_average_is_exact_where_the_others_are_not(process):
    plain = run("proxskip:partial=plain", process, 800, 0.01)
    shifted = run("proxskip", process, 600, 0.001)
    deferred = run("proxskip:partial=deferred", process, 600, 3e-4)
    assert plain.rows[-1]["rel_error"] < 1e-10
    assert 1e-5 < shifted.rows[-1]["rel_error"] < 1e-1 and shifted.diverged_at is None
    assert deferred.diverged_at is not None


def test_proxskip_plain_average_plateaus_under_cyclic_participation():
    assert run("proxskip:partial=plain", "cyclic:groups=4", 600, 0.001).rows[-1]["rel_error"] > 1e-4


def test_proxskip_adaptations_coincide_under_full_participation():
    rows = [run(a, "full", 30, 0.01, eval_every=1).rows for a in
            ("proxskip", "proxskip:partial=plain", "proxskip:partial=deferred", "scaffold")]
    for other in rows[1:]:
        assert max(abs(a["rel_error"] - b["rel_error"]) for a, b in zip(rows[0], other)) < 1e-12


def test_proxskip_keeps_sum_of_controls_zero_only_with_the_plain_average():
    problem = make_problem(SMALL)
    process = make_participation(f"bernoulli:p={RATES}", 8, seed=0)
    sums = {}
    for partial in ("plain", "shifted"):
        algorithm = make_algorithm("proxskip", lr=0.01, local_steps=2, partial=partial)
        result = simulate(algorithm, problem, process, 50, eval_every=50)
        sums[partial] = float(result.state.clients.h.sum(0).norm())
    assert sums["plain"] < 1e-9 < sums["shifted"]


def test_proxskip_rejects_unknown_adaptations():
    from focusfl.errors import ConfigError

    with pytest.raises(ConfigError, match="partial"):
        make_algorithm("proxskip:partial=average")


# -- SCAFFOLD -------------------------------------------------------------------------------------
def test_scaffold_is_exact_under_bernoulli_with_unequal_rates():
    result = run("scaffold", f"bernoulli:p={RATES}", 300, 0.01)
    assert result.rows[-1]["rel_error"] < 1e-10


def test_scaffold_fixed_point_holds_only_while_c_is_the_mean_of_the_c_i():
    assert studies.scaffold_fixed_point(rounds=40) < 1e-12
    assert studies.scaffold_fixed_point(rounds=40, offset=0.1) > 1e-4


# -- FedAvg's bias (Theorem 3) and `focusfl bias` ----------------------------------------------------
def test_fedavg_time_average_lands_on_the_weighted_target_once_warmup_is_excluded():
    from focusfl.matrix import bias

    problem = make_problem("ridge:dim=5,clients=6,samples=30,hetero=1")
    process = make_participation("bernoulli:p=0.15;0.3;0.45;0.6;0.75;0.9", 6, seed=0)
    quad = bias.client_quadratics(problem)
    q = bias.participation_weights(process).q
    lr = 0.05 / bias.smoothness(quad)
    mode = bias.slowest_mode(quad, q, lr)
    start = math.ceil(10 * mode.rounds_per_efold)
    limits = bias.limit_points(problem, process, rounds=3 * start, fedavg_lr=lr, focus_lr=lr / 6, average_from=start)
    target = bias.weighted_target(quad, q)
    gap = float((target - problem.x_star).norm())
    ratio = float((limits.fedavg_average - problem.x_star).norm()) / gap
    assert abs(ratio - 1) < 0.02
    assert bias.warmup_in_average(quad, q, problem.initial_point(), lr, start, 3 * start) < 1e-3 * gap
    # Starting the average after one e-fold leaves a visible share of the start in it.
    early = bias.warmup_in_average(quad, q, problem.initial_point(), lr, int(mode.rounds_per_efold), start)
    assert early > 10 * bias.warmup_in_average(quad, q, problem.initial_point(), lr, start, 3 * start)


def test_bias_command_prints_the_warmup_share(capsys):
    assert main(["bias", "--problem", "ridge:dim=4,clients=4,samples=20,hetero=1",
                 "--participation", "bernoulli:p=0.3;0.5;0.7;0.9", "--rounds", "400"]) == 0
    out = capsys.readouterr().out
    assert "one e-fold every" in out and "warm-up left in the average over rounds" in out


# -- the reviewers' studies and the reductions --------------------------------------------------------
def test_low_participation_focus_converges_mifa_does_not():
    rows = studies.low_participation((0.1,), ("focus", "mifa"), rounds=1500, grid=(1e-3, 3e-3))
    outcome = {r["algorithm"]: r for r in rows}
    assert outcome["focus"]["rounds_to_target"] is not None
    assert outcome["mifa"]["rounds_to_target"] is None and outcome["mifa"]["final"] > 1e-6


def test_focus_is_exact_under_long_markov_absences():
    rows = studies.long_absences((0.9,), ("focus",), rounds=1500, grid=(1e-3, 3e-3))
    assert rows[0]["rounds_to_target"] is not None and rows[0]["tau_max"] > 20


def test_pushsum_plateaus_where_tracking_is_exact():
    rows = studies.pushsum_against_focus({"uniform": "uniform:m=4"}, rounds=1500, grid=(1e-4, 3e-4))
    outcome = {r["algorithm"]: r for r in rows}
    assert outcome["pushsum_tracking"]["rounds_to_target"] is not None
    assert outcome["pushsum"]["rounds_to_target"] is None and outcome["pushsum"]["final"] > 1e-3


def test_fedsum_reductions_hold_to_rounding_error():
    gaps = studies.reductions(rounds=20)
    assert max(gaps.values()) < 1e-12 and len(gaps) == 6


# -- ridge settings and figures -------------------------------------------------------------------
def test_notebook_setting_runs_the_notebook_variants(tmp_path):
    from focusfl.reproduce import reproduce_ridge

    panels, summary = reproduce_ridge.run_figure4(rounds=3, setting="notebook",
                                                  algorithms=["focus", "mifa:notebook=true"])
    lrs = {row["scenario"]: row["lr"] for row in summary}
    assert lrs == {"full": 3e-4, "uniform:m=4": 7.5e-5, "weighted:m=4": 5e-5}
    written = reproduce_ridge.plot_figures(panels, tmp_path, "notebook")
    assert "figure_notebook_axis.png/.pdf" in written and (tmp_path / "figure_notebook_axis.png").exists()
    assert not any("q_i" in title for title in reproduce_ridge.SCENARIOS)  # q_i = E[1{i in S}/|S|] elsewhere


def test_notebook_loss_scaling_gives_the_notebooks_iterates():
    # Our ridge is ||Ax - b||^2, the notebook's 1/2 ||Ax - b||^2: eta/2 on ours = eta on theirs.
    problem = make_problem("ridge:dim=4,clients=2,samples=10,reg=0")
    a, b = problem.features[0], problem.targets[0]
    x = torch.zeros(4, dtype=torch.float64)
    theirs = x - 6e-4 * (a.T @ (a @ x - b))
    ours = x - 3e-4 * problem.client_gradients(x[None], torch.tensor([0]), seed=0, round=0, step=0)[0]
    assert torch.allclose(theirs, ours, atol=1e-15)


def test_coinciding_curves_are_grouped():
    rows = lambda values: [{"round": k, "rel_error": v} for k, v in enumerate(values)]  # noqa: E731
    curves = {"a": rows([1, 0.1, 1e-15]), "b": rows([1, 0.1005, 3e-15]), "c": rows([1, 0.2, 1e-15])}
    assert coinciding_groups(curves) == [["a", "b"]]


def test_algorithms_table_stays_aligned(capsys):
    assert main(["algorithms"]) == 0
    lines = capsys.readouterr().out.splitlines()
    table = [line for line in lines[: lines.index("")]]
    starts = {line.index(" what it is") if k == 0 else len(line.split("  ")[0]) for k, line in enumerate(table[:1])}
    assert len(starts) == 1
    # The 'down' column ends at the same character in every row.
    header = table[0]
    end = header.index("down") + len("down")
    assert all(row[end - 1] != " " for row in table[1:])


def test_report_quick_writes_every_verdict(tmp_path, capsys):
    from focusfl.reproduce import nn_study, reproduce_report

    sizes = reproduce_report.QUICK
    images = tmp_path
    section = reproduce_report.fedsum_section(sizes, images)
    text = reproduce_report.build_report([section], 1.0, None, quick=True)
    assert "| 1 | FedSUM paper" in text and "**reproduced** (criterion:" in text
    assert text.splitlines()[0].endswith("(quick: toy sizes, not findings)") and "None" not in text
    assert (images / "delays.png").exists()
    skipped = nn_study.nn_section(None, nn_study.QUICK_STUDY, images, tmp_path / "study")
    assert "skipped" in skipped.text[-1] and [c.verdict.outcome for c in skipped.claims] == ["not reproduced"]
    assert not (tmp_path / "study").exists()


def test_report_header_leaves_out_every_sections_neural_network_time():
    """"Y of them without the neural-network part" subtracts what each section measured of its own
    neural networks (the privacy study's MNIST half as well as the nn study), not one section
    picked by its title."""
    from focusfl.reproduce.reproduce_report import build_report
    from focusfl.reproduce.verdicts import Section

    sections = [Section("Ridge", seconds=600.0), Section("Privacy: both halves", seconds=900.0, nn_seconds=540.0),
                Section("SG-FOCUS against FedAvg (the nn study)", seconds=1800.0, nn_seconds=1800.0)]
    text = build_report(sections, 3300.0, "digits.npz")
    assert "This run took 55.0 minutes on one CPU thread, 16.0 of them without the neural-network part" in text
    skipped = [Section("Ridge", seconds=600.0), Section("Privacy: ridge only", seconds=360.0)]
    assert "took 16.0 minutes on one CPU thread (the neural-network part was skipped)" in build_report(skipped, 960.0,
                                                                                                      None)


def test_report_command_rejects_a_missing_data_file(tmp_path):
    out = tmp_path / "report"
    assert main(["reproduce", "report", "--data", str(tmp_path / "none.npz"), "--out", str(out)]) == 2
    assert not out.exists()


def test_report_and_study_commands_refuse_bad_input_in_one_line(tmp_path):
    """In this process (run_main): the next test runs both commands through the console script."""
    from cli_harness import assert_one_line_error, run_main

    fixture = Path(__file__).resolve().parent / "fixtures" / "mnist1500.npz"
    out = tmp_path / "out"
    users = tmp_path / "mine"
    users.mkdir()
    (users / "notes.txt").write_text("a user's file")
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(fixture.read_bytes()[:1000])
    for argv in (["reproduce", "report", "--quick", "--nn-study", str(tmp_path / "s"), "--out", str(out)],
                 ["reproduce", "report", "--quick", "--data", str(fixture), "--nn-study", str(users), "--out", str(out)],
                 ["reproduce", "report", "--quick", "--workers", "0", "--out", str(out)],
                 ["reproduce", "report", "--quick", "--data", str(truncated), "--out", str(out)],
                 ["reproduce", "nn-study", "--quick", "--data", str(tmp_path / "none.npz"), "--out", str(out)],
                 ["reproduce", "nn-study", "--quick", "--data", str(fixture), "--workers", "0", "--out", str(out)],
                 ["reproduce", "nn-study", "--quick", "--data", str(fixture), "--out", str(users)]):
        proc = run_main(*argv)
        assert proc.returncode == 2, argv
        assert_one_line_error(proc)
    assert not out.exists() and not (tmp_path / "s").exists()
    assert sorted(p.name for p in users.iterdir()) == ["notes.txt"]


def test_nn_study_and_report_commands_run_as_a_user_types_them(tmp_path, monkeypatch):
    """``reproduce nn-study`` at toy sizes; the same command again reuses every run and writes the
    same summary; then the whole ``reproduce report`` on the same digits, reusing that study
    (``--nn-study``, as its help offers) rather than running it a third time. The report once
    crashed on a fresh install while its parts were tested one by one."""
    import re

    from cli_harness import run_cli, run_main

    fixture = Path(__file__).resolve().parent / "fixtures" / "mnist1500.npz"
    study = tmp_path / "study"
    command = ["reproduce", "nn-study", "--quick", "--data", str(fixture), "--out", str(study)]
    proc = run_cli(*command, timeout=900)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("quick study") and "SG-FOCUS as the authors run it" in proc.stdout
    text = (study / "report.md").read_text()
    assert "(quick: toy sizes, not findings)" in text.splitlines()[0] and "None" not in text
    assert "What drives the gap" in text and "| suspected driver | verdict |" in text
    first = (study / "summary.csv").read_bytes()
    # In this process: what is checked is the reuse and summary.csv, so the rerun keeps the first
    # run's figures instead of drawing them again (most of its time after the authors' loop).
    from focusfl.reproduce import reproduce_nn

    monkeypatch.setattr(reproduce_nn, "plot_training_bands", lambda *args, **kwargs: None)
    monkeypatch.setattr(reproduce_nn, "plot_label_histograms", lambda *args, **kwargs: None)
    again = run_main(*command)
    monkeypatch.undo()
    sweeps = [line for line in again.stdout.splitlines() if line.startswith("sweep ")]
    assert again.returncode == 0 and sweeps and all(", 0 to run;" in line for line in sweeps)  # every run reused
    assert (study / "summary.csv").read_bytes() == first

    out = tmp_path / "report"
    proc = run_cli("reproduce", "report", "--quick", "--out", str(out), "--data", str(fixture),
                   "--nn-study", str(study), timeout=900)
    assert proc.returncode == 0, proc.stderr
    assert "quick report" in proc.stdout.splitlines()[0] and "QUICK" in proc.stdout
    sweeps = [line for line in proc.stdout.splitlines() if line.startswith("sweep ")]
    assert all(", 0 to run;" in line for line in sweeps)  # the study's runs, reused
    text = (out / "report.md").read_text()
    assert "quick" in "\n".join(text.splitlines()[:3]) and "None" not in text
    verdicts = re.findall(VERDICT, text)
    assert len(verdicts) >= 25 and "inconclusive (quick)" in verdicts
    assert "on MNIST (mnist1500.npz)" in text and "tuned on the clients' validation share" in text
    assert (study / "alpha-0.3" / "steps.csv").is_file() and not (out / "nn-study").exists()
    figures = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert figures and all((out / figure).is_file() for figure in figures)
    rows = read_csv(out / "summary.csv")
    assert rows and all(row["criterion"] and row["measured"] for row in rows)
    # Counts are spelled for their number, and the product speaks of itself, not of its tracker.
    counts = re.findall(r": (\d+) (claims?), \d+ s$", proc.stdout, re.M)
    assert counts and all((n == "1") == (word == "claim") for n, word in counts), counts
    assert not re.search(r"\b1 (claims|seeds|runs|cells)\b|seed\(s\)", proc.stdout + text)
    told = proc.stdout + text + (out / "summary.csv").read_text()
    assert not re.search(r"\bissues? ?#?\d", told, re.I)


def test_counts_are_spelled_for_their_number_and_user_pages_cite_no_tracker():
    import re
    from pathlib import Path

    from focusfl.words import counted

    assert (counted(1, "claim"), counted(0, "claim"), counted(2, "claim")) == ("1 claim", "0 claims", "2 claims")
    root = Path(__file__).resolve().parents[1]
    for page in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        assert not re.search(r"\bissues? ?#?\d", page.read_text(), re.I), page.name


VERDICT = r"\*\*(reproduced|reproduced on another axis|not reproduced|inconclusive|inconclusive \(quick\))\*\* \(criterion:"


def test_reproductions_page_is_a_report_whose_figures_exist():
    import re
    from pathlib import Path

    docs = Path(__file__).resolve().parents[1] / "docs"
    text = (docs / "reproductions.md").read_text()
    assert text.startswith("# Reproduction report\n") and "| # | paper | where | claim |" in text
    figures = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert figures and all((docs / figure).is_file() for figure in figures)
    verdicts = re.findall(VERDICT, text)
    assert len(verdicts) >= 25 and "inconclusive (quick)" not in verdicts and "None" not in text


# -- exactness under arbitrary work ----------------------------------------------------------------
def test_work_study_focus_exact_fedavg_on_its_predicted_plateau():
    rows = studies.exactness_under_work(
        {"ridge": studies.SMALL_RIDGE}, {"rates": "rates:r=0.25;0.25;0.5;0.5;1;1;1;1"}, {"full": "full"},
        ("focus", "fedavg"), rounds=200, grids={"ridge": (3e-3,)}, predict_rounds=600)
    outcome = {r["algorithm"]: r for r in rows}
    assert outcome["focus"]["verdict"] == "exact" and outcome["fedavg"]["verdict"].startswith("plateau at")
    # Full participation with fixed per-client counts is deterministic: FedAvg sits on x_w.
    prediction = outcome["fedavg"]["prediction"]
    assert prediction["mismatch"] < 1e-8 and prediction["predicted"] == pytest.approx(outcome["fedavg"]["final"], rel=1e-3)
    assert outcome["focus"]["curve"][-1][1] < 1e-8


def test_the_work_study_takes_its_algorithms_when_registered():
    from focusfl.algorithms import ALGORITHMS

    names = studies.partial_work_algorithms()
    assert names == studies.WORK_ALGORITHMS
    assert all(ALGORITHMS[n].partial_work for n in names)


# -- batches of runs (--batch-runs) ------------------------------------------------------------------
def test_the_convex_sections_say_the_same_in_batches_and_one_run_at_a_time(tmp_path, monkeypatch):
    """Every convex section that computes runs, at sizes below the quick report's: report.md's
    text and summary.csv's rows with --batch-runs 1 and auto are the same, and auto did step runs
    together in every section (so that a section that silently ran one at a time fails here)."""
    import dataclasses

    from focusfl.reproduce import baselines_study, reproduce_report, suite_study
    from focusfl.sweeps import sweep
    from focusfl.reproduce.verdicts import claims_rows

    # The figures are tested above; here they would cost most of the time (the ridge section's ten).
    monkeypatch.setattr(reproduce_report, "plot_figures", lambda *args: None)
    small = suite_study.SuiteSizes(rounds=40, seeds=1, grid_every=4, eval_every=10)
    monkeypatch.setattr(suite_study, "QUICK", small)
    monkeypatch.setattr(baselines_study, "QUICK", small)
    batches: list[int] = []
    execute_batch = sweep.execute_batch
    monkeypatch.setattr(sweep, "execute_batch", lambda runs: batches.append(len(runs)) or execute_batch(runs))
    tiny = dataclasses.replace(reproduce_report.QUICK, ridge_rounds=20, study_rounds=100, prox_rounds=60,
                               push_rounds=60, low_p=(0.3,), rhos=(0.9,), versus_seeds=2, work_rounds=40,
                               work_processes=("rates (slow clients)",))
    sections = {
        "ridge": lambda sizes, images: reproduce_report.ridge_section(sizes, images),
        "exactness": lambda sizes, images: reproduce_report.exactness_section(sizes),
        "studies": reproduce_report.studies_section,
        "work": reproduce_report.work_section,
        "suite": reproduce_report.suite_section,
        "baselines": lambda sizes, images: reproduce_report.baselines_section(sizes),
    }
    written = {}
    for batch_runs in (1, "auto"):
        sizes = dataclasses.replace(tiny, batch_runs=batch_runs)
        images = tmp_path / str(batch_runs) / "images" / "reproductions"
        images.mkdir(parents=True)
        for name, make in sections.items():
            batches.clear()
            section = make(sizes, images)
            assert (max(batches) > 1) == (batch_runs == "auto"), (name, batch_runs, batches)
            written[(name, batch_runs)] = (reproduce_report.build_report([section], 0.0, None, quick=True),
                                           claims_rows([section]))
    for name in sections:
        assert written[(name, 1)] == written[(name, "auto")], name

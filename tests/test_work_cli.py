"""Work processes through the console script: `focusfl run|sweep|tune --work SPEC`, `focusfl work`.

What is checked: a constant work process (rates with every rate 1, which passes step counts of
tau to the masked loops) writes today's metrics.csv byte for byte; a sweep's ``work`` axis and
``--work`` (a column after participation, the copied experiment.toml rewritten); tune's trials
run the work asked; `focusfl work` prints per-client statistics that match the process and
draws a raster; bad work specs are one line and exit 2, with nothing written.

Each command and option surface runs through the console script at least once (run --work,
sweep's work axis, tune --work, `focusfl work` and the work page's commands, bias among them);
the further cases of a surface call focusfl.cli.main in this process (cli_harness.run_main), which
saves an interpreter and torch's import a case.
"""
import csv
import json

import pytest

from cli_harness import assert_one_line_error, run_cli, run_main
from focusfl.work import make_work
from focusfl.work.statistics import summarize_work

SMALL = "ridge:clients=4,dim=3,samples=5"
RUN = ["--problem", SMALL, "--participation", "bernoulli", "--rounds", "4", "--local-steps", "3", "--lr", "1e-3"]
BAD_SPECS = [("nope", "unknown work"), ("uniform:x=1", "unknown key"), ("rates:r=0", "outside"),
             ("rates:r=1.5", "outside"), ("rates:r=0.5;1", "one per client"), ("markov:p=2", "p=2")]


def _rows(path):
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.mark.parametrize("algorithm", ["fedsum_cr", "pushsum_tracking"])
def test_run_with_every_rate_1_writes_todays_metrics_byte_for_byte(tmp_path, algorithm):
    today = run_main("run", "--algorithm", algorithm, *RUN, "--out", str(tmp_path / "today"))
    assert today.returncode == 0, today.stderr
    run = run_cli if algorithm == "fedsum_cr" else run_main  # `run --work` as a user types it, once
    full = run("run", "--algorithm", algorithm, *RUN, "--work", "rates:r=1", "--out", str(tmp_path / "full"))
    assert full.returncode == 0, full.stderr
    assert (tmp_path / "full" / "metrics.csv").read_bytes() == (tmp_path / "today" / "metrics.csv").read_bytes()
    # ... and a process that cuts steps short changes them.
    short = run_main("run", "--algorithm", algorithm, *RUN, "--work", "rates:r=0.34", "--out", str(tmp_path / "short"))
    assert short.returncode == 0, short.stderr
    assert (tmp_path / "short" / "metrics.csv").read_bytes() != (tmp_path / "today" / "metrics.csv").read_bytes()


def test_sweep_work_axis_and_override(tmp_path):
    (tmp_path / "e.toml").write_text(
        f'algorithms = ["focus", "fedavg"]\nproblems = ["{SMALL}"]\nparticipation = "bernoulli"\n'
        'work = ["uniform", "fixed"]\nlocal_steps = 3\nlr = 1e-3\nrounds = 3\n')
    proc = run_cli("sweep", str(tmp_path / "e.toml"), "--out", str(tmp_path / "axis"))
    assert proc.returncode == 0, proc.stderr
    rows = _rows(tmp_path / "axis" / "results.csv")
    assert list(rows[0])[:4] == ["problem", "participation", "work", "algorithm"]
    summary = _rows(tmp_path / "axis" / "summary.csv")
    assert [(r["work"], r["algorithm"]) for r in summary] == [("uniform", "focus"), ("uniform", "fedavg"),
                                                              ("fixed", "focus"), ("fixed", "fedavg")]
    assert "uniform" in proc.stdout  # the printed summary has the work column
    # focusfl plot reads the column back: configurations that differ in their work only stay apart.
    proc = run_main("plot", str(tmp_path / "axis"), "--out", str(tmp_path / "axis.png"))
    assert proc.returncode == 0 and "4 runs in 4 configurations" in proc.stdout, proc.stdout + proc.stderr
    # --work replaces the file's axis; the copied experiment.toml says so and reruns the same grid.
    proc = run_main("sweep", str(tmp_path / "e.toml"), "--work", "markov:slow=0.34", "--out", str(tmp_path / "over"))
    assert proc.returncode == 0, proc.stderr
    assert {r["work"] for r in _rows(tmp_path / "over" / "summary.csv")} == {"markov:slow=0.34"}
    assert 'work = "markov:slow=0.34"' in (tmp_path / "over" / "experiment.toml").read_text()
    again = run_main("sweep", str(tmp_path / "over" / "experiment.toml"), "--out", str(tmp_path / "over"))
    assert again.returncode == 0 and "2 finished earlier" in again.stdout, again.stdout + again.stderr
    config = json.loads(next((tmp_path / "over" / "runs").glob("*/config.json")).read_text())
    assert config["work"] == {"name": "markov", "p": 0.3, "rho": 0.8, "slow": 0.34}


def test_sweep_without_work_has_no_work_column(tmp_path):
    (tmp_path / "e.toml").write_text(f'algorithms = ["focus"]\nproblems = ["{SMALL}"]\nrounds = 2\n')
    proc = run_main("sweep", str(tmp_path / "e.toml"), "--out", str(tmp_path / "s"))
    assert proc.returncode == 0, proc.stderr
    assert "work" not in _rows(tmp_path / "s" / "results.csv")[0]


def test_sweep_and_tune_refuse_bad_work_in_one_line_and_write_nothing(tmp_path):
    (tmp_path / "e.toml").write_text(f'algorithms = ["focus"]\nproblems = ["{SMALL}"]\nrounds = 2\n')
    for bad, says in BAD_SPECS[:3]:
        assert_one_line_error(run_main("sweep", str(tmp_path / "e.toml"), "--work", bad, "--out",
                                       str(tmp_path / "bad")), contains=says)
    (tmp_path / "list.toml").write_text(f'algorithms = ["focus"]\nproblems = ["{SMALL}"]\nwork = ["uniform", 3]\n')
    assert_one_line_error(run_main("sweep", str(tmp_path / "list.toml"), "--out", str(tmp_path / "bad")),
                          contains="work[1]")
    (tmp_path / "refuse.toml").write_text(
        f'algorithms = ["proxskip:random_steps=true"]\nproblems = ["{SMALL}"]\nwork = "uniform"\n')
    assert_one_line_error(run_main("sweep", str(tmp_path / "refuse.toml"), "--out", str(tmp_path / "bad")),
                          contains="random_steps")
    assert_one_line_error(run_main("tune", "--algorithm", "focus", "--problem", SMALL, "--work", "rates:r=2",
                                   "--out", str(tmp_path / "bad")), contains="outside")
    assert not (tmp_path / "bad").exists()


def test_tune_runs_its_trials_under_the_work_asked(tmp_path):
    proc = run_cli("tune", "--algorithm", "scaffold", "--problem", SMALL, "--participation", "bernoulli",
                   "--work", "uniform", "--local-steps", "3", "--rounds", "4", "--points", "2", "--out",
                   str(tmp_path / "t"))
    assert proc.returncode == 0, proc.stderr
    configs = [json.loads(p.read_text()) for p in (tmp_path / "t" / "runs").glob("*/config.json")]
    # The 2 grid points and any step the search added past an end: every trial under the work asked.
    assert len(configs) >= 2 and all(c["work"] == {"name": "uniform"} for c in configs)
    assert json.loads((tmp_path / "t" / "config.json").read_text())["tune"]["work"] == "uniform"


def test_work_statistics_match_the_table():
    table = make_work("markov:p=0.5,rho=0.5,slow=0.5", 5, 4, seed=2).table(300)
    stats = summarize_work(table, 4)
    assert stats.mean == pytest.approx(table.double().mean(0).tolist())
    assert stats.short == pytest.approx((table == 2).double().mean(0).tolist())
    assert set(stats.min) == {2} and set(stats.max) == {4}
    assert stats.mean_steps == pytest.approx(table.double().mean().item())
    assert abs(stats.mean_short - 0.5) < 0.08  # P(slow) = p in the long run
    fixed = summarize_work(make_work("fixed", 3, 4).table(10), 4)
    assert fixed.mean == [4.0] * 3 and fixed.short == [0.0] * 3


def test_work_command_prints_statistics_and_plots(tmp_path):
    plot = tmp_path / "steps.png"
    proc = run_cli("work", "rates:r=0.25;1;0.5", "--clients", "3", "--local-steps", "4", "--rounds", "20",
                   "--plot", str(plot))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "rates: 3 clients, tau 4, 20 rounds, seed 0"
    assert lines[1] == "mean steps 2.333 of 4, short rounds 0.667"
    assert lines[3].split() == ["0", "1.000", "1", "1", "1.000"]
    assert lines[4].split() == ["1", "4.000", "4", "4", "0.000"]
    assert lines[5].split() == ["2", "2.000", "2", "2", "1.000"]
    assert lines[6].split() == ["mean", "2.333", "2.3", "2.3", "0.667"]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # uniform: the statistics of the process as drawn.
    proc = run_main("work", "uniform", "--clients", "2", "--local-steps", "5", "--rounds", "50", "--seed", "3")
    table = make_work("uniform", 2, 5, seed=3).table(50)
    assert proc.stdout.splitlines()[3].split()[1] == f"{table[:, 0].double().mean().item():.3f}"


@pytest.mark.parametrize("bad,says", BAD_SPECS[::-1][:4])
def test_work_command_refuses_bad_specs_in_one_line(tmp_path, bad, says):
    proc = run_main("work", bad, "--clients", "3", "--plot", str(tmp_path / "p.png"))
    assert_one_line_error(proc, contains=says)
    assert not (tmp_path / "p.png").exists()


# -- recorded counts: trace:path=FILE --------------------------------------------------------------
def _steps_csv(path, rounds=4, clients=3, tau=4):
    lines = ["round,client,steps"] + [f"{r},{c},{(r + c) % tau + 1}" for r in range(rounds) for c in range(clients)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_work_summarizes_a_trace_over_the_rows_it_records(tmp_path):
    """`focusfl work trace:path=VALID.csv --rounds 50` ended in "TypeError: 'dict' object is not
    callable"; rounds and clients the trace does not name are left out of its statistics."""
    trace = tmp_path / "t.csv"
    trace.write_text("round,client,steps\n0,0,3\n0,1,2\n1,0,5\n")
    proc = run_main("work", f"trace:path={trace}", "--clients", "3", "--rounds", "50")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "the 3 client-rounds the trace records in rounds 0..49 (of 150)" in proc.stdout
    assert lines[-4].split() == ["0", "4.000", "3", "5", "0.500"]  # rounds 0 and 1: 3 and 5 of tau 5
    assert lines[-3].split() == ["1", "2.000", "2", "2", "1.000"]
    assert lines[-2].split() == ["2", "-", "-", "-", "-"]
    assert lines[-1].split() == ["mean", "3.000", "2.5", "3.5", "0.750"]


@pytest.mark.parametrize("text,contains", [
    ("round,client,steps\n0,0,0\n", "steps=0 must be at least 1"),
    ("round,client,steps\n0,7,1\n", "names client 7, but the problem has 3 clients"),
    ("round,client,steps\n0,0,9\n", "took 9 steps, more than local_steps=5"),
    ("round,client\n0,0\n", "expected the header round,client,steps"),
    ("round,client,steps\n0,0,1\n0,0,2\n", "round 0, client 0 is given twice"),
    ("round,client,steps\n", "has a header but no rows"),
])
def test_work_refuses_a_bad_trace_in_one_line(tmp_path, text, contains):
    trace = tmp_path / "t.csv"
    trace.write_text(text)
    assert_one_line_error(run_main("work", f"trace:path={trace}", "--clients", "3"), 2, contains)


def test_bias_refuses_rounds_beyond_the_trace_and_takes_its_law(tmp_path):
    trace = _steps_csv(tmp_path / "steps.csv")
    common = ["bias", "--problem", "ridge:clients=3", "--local-steps", "4", "--participation", "full",
              "--work", f"trace:path={trace}", "--mc-rounds", "4"]
    assert_one_line_error(run_main(*common, "--rounds", "10"), 2, "has no row for round 4, client 0: steps.csv covers "
                                                                 "rounds 0..3 and, unlike a participation trace, "
                                                                 "does not wrap around; run at most 4 rounds")
    proc = run_main(*common, "--rounds", "4")
    assert proc.returncode == 0, proc.stderr
    assert "step counts by the trace's recorded rows; mean E[tau_i] = 2.5 of tau = 4" in proc.stdout


def _fedscale_population(folder) -> None:
    """FedScale's two device files in their layouts (client_behave_trace, client_device_capacity:
    pickles of plain dicts), for the page's import: every device available, and each finishing a different number of steps before the deadline."""
    import pickle

    behave = {k: {"active": [60.0 * k], "inactive": [60.0 * k + 900], "finish_time": 3600, "duration": 900,
                  "model": "phone"} for k in range(5)}
    speeds = {k: {"computation": 100.0 + 100 * k, "communication": 500.0 + 100 * k} for k in range(5)}
    (folder / "client_behave_trace").write_bytes(pickle.dumps(behave))
    (folder / "client_device_capacity").write_bytes(pickle.dumps(speeds))


def test_every_command_of_the_work_page_runs(tmp_path):
    """docs/work.md's commands, as a user types them (bias's long averages shortened), with the
    trace they read written first."""
    from test_docs_run import ROOT, documented_commands

    _steps_csv(tmp_path / "steps.csv")
    _fedscale_population(tmp_path)
    commands = documented_commands("docs/work.md")
    assert any(words[:2] == ["work", "trace:path=steps.csv"] for _, words in commands)
    assert len(commands) >= 5
    inline = "`focusfl matrices --clients 4 --active 1,3 --steps 3,1`"  # in the text, not a code block
    assert inline in (ROOT / "docs" / "work.md").read_text()
    commands.append(("docs/work.md (text)", inline.strip("`").split()[1:]))
    for where, words in commands:
        if words[0] == "bias" and "--rounds" not in words:
            words = [*words, "--rounds", "2000", "--mc-rounds", "2000"]
        words = ["4000" if k and words[k - 1] == "--rounds" and w == "30000" else w for k, w in enumerate(words)]
        proc = run_cli(*words, cwd=tmp_path)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, f"{where}: focusfl {' '.join(words)}\n{proc.stderr}"

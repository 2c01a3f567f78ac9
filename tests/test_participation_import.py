"""`focusfl participation import`: FedScale behaviour pickles, FLASH state JSON and clients x rounds
availability matrices into focusfl's participation trace, with the statistics printed.

Every file here is made by the test (small and synthetic; nothing is downloaded): a round trip
per format against the availability worked out by hand, the options (round rule, FLASH's
readiness conditions, rounds, clients), the bad files (one line, exit 2, nothing written), a
pickle that would run code (it never does: a marker file stays absent), and the --out file
that is not focusfl's (never replaced).
"""
from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest

from cli_harness import assert_one_line_error, cli_env, run_cli, run_cli_together, run_main
from focusfl.cli import main
from focusfl.errors import DataError
from focusfl.participation import make_participation, summarize
from focusfl.recordings import importing, parsing
from focusfl.recordings.importing import ImportOptions, import_trace, trace_text
from focusfl.participation.trace import TAG, load_trace

# Client 0: available 10..30 and 50..90 of every 100 s; client 1 always; client 7 only 1..5 of
# every 200 s (never at a round's start with 10 s rounds: dropped).
FEDSCALE = {
    0: {"duration": 100, "inactive": [30, 90], "finish_time": 100, "active": [10, 50], "model": "Pixel"},
    1: {"duration": 100, "inactive": [100], "finish_time": 100, "active": [0], "model": "Galaxy"},
    7: {"duration": 200, "inactive": [5], "finish_time": 200, "active": [1], "model": "Moto"},
}
# Rounds of 10 s over the longest finish_time (200 s): 20 rounds; at the round's start.
FEDSCALE_START = {"0": [0, 1, 1, 1, 0, 1, 1, 1, 1, 1] * 2, "1": [1] * 20}
# ... and throughout the round ([t, t + 10] inside a spell).
FEDSCALE_WHOLE = {"0": [0, 1, 1, 0, 0, 1, 1, 1, 1, 0] * 2, "1": [1] * 20}

# Device 1: charging at 0 s, WiFi at 10 s, locked at 20 s, unlocked at 60 s (ready 20..60), last event
# at 120 s. Device 2 (from 30 s): WiFi, charging at 40 s, screen off at 50 s, locked at 55 s,
# unplugged at 90 s (ready 55..90 when idle means locked, 50..90 when it means screen off).
FLASH = {
    "1": {"guid": "a", "model": "m", "messages": "2020-01-02 00:00:00\tbattery_charged_on\n2020-01-02 00:00:10\twifi\n"
          "2020-01-02 00:00:20\tscreen_lock\n2020-01-02 00:01:00\tscreen_unlock\n2020-01-02 00:02:00\t80%\n"},
    "2": {"guid": "b", "model": "m", "messages": "2020-01-02 00:00:30\twifi\n2020-01-02 00:00:40\tbattery_charged_on\n"
          "2020-01-02 00:00:50\tscreen_off\n2020-01-02 00:00:55\tscreen_lock\n2020-01-02 00:01:30\tbattery_charged_off\n"},
}
# 10 s rounds from 00:00:00 over 120 s; device 2 replays its 60 s recording from 30 s on (FLASH's wrap).
FLASH_LOCKED = {"1": [0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0], "2": [1, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0]}
FLASH_SCREEN_OFF = {"1": [0] * 12, "2": [1, 1, 1, 0, 0, 1, 1, 1, 1, 0, 0, 1]}  # device 1's screen never goes off
# Device 1 is charging on WiFi from 10 s to its last event: a spell still open at the last event is
# not kept (FLASH's Timer appends only closed spells, models/timer.py), so it is never ready.
FLASH_NO_IDLE = {"2": [1, 1, 1, 0, 1, 1, 1, 1, 1, 0, 1, 1]}

MATRIX = np.array([[1, 0, 1, 1, 0], [0, 1, 1, 0, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1]])  # clients x rounds


def expected(columns: dict[str, list[int]]) -> np.ndarray:
    return np.array(list(columns.values()), dtype=bool).T


@pytest.fixture
def files(tmp_path):
    (tmp_path / "behave.pkl").write_bytes(pickle.dumps(FEDSCALE))
    (tmp_path / "states.json").write_text(json.dumps(FLASH))
    np.savetxt(tmp_path / "matrix.csv", MATRIX, fmt="%d", delimiter=",", header="r0,r1,r2,r3,r4", comments="")
    np.save(tmp_path / "matrix.npy", MATRIX.astype(np.float32))
    return tmp_path


def imported(fmt, path, **options):
    return import_trace(fmt, path, ImportOptions(**options))


# -- round trips ------------------------------------------------------------------------------------
def test_fedscale_round_trip_as_a_user_types_it(files):
    out = files / "out" / "trace.csv"
    proc = run_cli("participation", "import", "fedscale", str(files / "behave.pkl"), "--round-seconds", "10",
                   "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    mask = load_trace(out)
    assert np.array_equal(mask, expected(FEDSCALE_START))
    assert out.read_text().startswith(TAG) and out.read_text().splitlines()[1] == "client_0,client_1"
    # The statistics printed are those of the trace written (FedSUM's delays, p_i, q_i).
    stats = summarize(mask)
    assert f"tau_max {stats.tau_max}, tau_avg {stats.tau_avg:.3f}" in proc.stdout
    assert "dropped 1 device(s) never available in these rounds: 7" in proc.stdout
    for i in range(2):
        assert f"{stats.p[i]:>14.4f} {stats.q[i]:>14.4f}" in proc.stdout
    # It replays as a participation process of 2 clients, and a run takes it.
    process = make_participation(f"trace:path={out}", 2)
    assert np.array_equal(process.mask(20), mask)
    run = run_main("run", "--algorithm", "fedstale", "--problem", "ridge:clients=2,dim=3,samples=5",
                   "--participation", f"trace:path={out}", "--rounds", "5", "--out", str(files / "run"))
    assert run.returncode == 0, run.stderr


def test_fedscale_round_rule_whole_needs_the_whole_round(files):
    trace = imported("fedscale", files / "behave.pkl", round_seconds=10, rule="whole")
    assert np.array_equal(trace.mask, expected(FEDSCALE_WHOLE)) and trace.dropped == ["7"]


def test_fedscale_rounds_clients_and_string_ids(files, tmp_path):
    trace = imported("fedscale", files / "behave.pkl", round_seconds=10, rounds=5, clients=1)
    assert trace.names == ["0"] and np.array_equal(trace.mask[:, 0], FEDSCALE_START["0"][:5])
    # Past finish_time the behaviour repeats (FedScale's cur_time % finish_time).
    long = imported("fedscale", files / "behave.pkl", round_seconds=10, rounds=45)
    assert np.array_equal(long.mask[40:, 0], long.mask[:5, 0])
    named = {"dev-b": FEDSCALE[0], "dev-a": FEDSCALE[1]}
    (tmp_path / "named.pkl").write_bytes(pickle.dumps(named, protocol=0))
    trace = imported("fedscale", tmp_path / "named.pkl", round_seconds=10)
    assert trace.names == ["dev-a", "dev-b"]


def test_flash_round_trip_and_readiness_rules(files):
    out = files / "flash.csv"
    assert main(["participation", "import", "flash", str(files / "states.json"), "--round-seconds", "10",
                 "--out", str(out)]) == 0
    assert np.array_equal(load_trace(out), expected(FLASH_LOCKED))
    screen_off = imported("flash", files / "states.json", round_seconds=10, idle="screen_off")
    assert np.array_equal(screen_off.mask, expected({"2": FLASH_SCREEN_OFF["2"]})) and screen_off.dropped == ["1"]
    no_idle = imported("flash", files / "states.json", round_seconds=10, ready=("charging", "wifi"))
    assert np.array_equal(no_idle.mask, expected(FLASH_NO_IDLE)) and no_idle.dropped == ["1"]
    whole = imported("flash", files / "states.json", round_seconds=10, rule="whole")
    assert (whole.mask <= expected(FLASH_LOCKED)).all() and whole.mask.sum() < expected(FLASH_LOCKED).sum()


@pytest.mark.parametrize("name", ["matrix.csv", "matrix.npy"])
def test_matrix_round_trip(files, name):
    out = files / f"{name}.csv"
    assert main(["participation", "import", "matrix", str(files / name), "--out", str(out)]) == 0
    trace = load_trace(out)
    assert np.array_equal(trace, MATRIX.T.astype(bool))  # client 2, never available, kept (FedStale's rows)
    assert np.array_equal(imported("matrix", files / name, rounds=3, clients=2).mask, MATRIX[:2, :3].T.astype(bool))


def test_written_trace_is_replaced_only_when_focusfl_wrote_it(files, capsys):
    out = files / "trace.csv"
    args = ["participation", "import", "matrix", str(files / "matrix.csv"), "--out", str(out)]
    assert main(args) == 0 and main(args[:-1] + [str(out)]) == 0  # its own file: replaced
    mine = files / "mine.csv"
    mine.write_text("0,1\n1,1\n")
    assert main(args[:-1] + [str(mine)]) == 2
    assert "not a trace focusfl wrote" in capsys.readouterr().err and mine.read_text() == "0,1\n1,1\n"
    assert main(args[:-1] + [str(files)]) == 2  # a folder
    assert main(args[:-1] + [str(files / "trace.txt")]) == 2 and not (files / "trace.txt").exists()
    # Without --out only the statistics are printed.
    before = sorted(p.name for p in files.iterdir())
    assert main(args[:-2]) == 0 and "tau_max" in capsys.readouterr().out
    assert sorted(p.name for p in files.iterdir()) == before


def test_trace_text_header_is_never_read_as_a_round(tmp_path):
    # Numeric device ids become client_ID: the reader takes the line as a header, not as data.
    trace = importing.ImportedTrace(np.array([[True, False], [True, True]]), ["0", "1"], source="x\ny")
    path = tmp_path / "t.csv"
    path.write_text(trace_text(trace))
    assert np.array_equal(load_trace(path), trace.mask)
    assert len(path.read_text().splitlines()) == 4  # a line break in the source stays in the comment


# -- bad files ----------------------------------------------------------------------------------
class Opens:
    """A pickle payload that creates ``path`` when unpickled (open(path, "w"))."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _bad_files(folder: Path) -> dict[str, tuple[str, str, list[str]]]:
    """name -> (format, file, extra options)."""
    good = pickle.dumps(FEDSCALE)
    pickles = {
        "truncated.pkl": good[: len(good) // 2],
        "notdict.pkl": pickle.dumps([1, 2, 3]),
        "strtimes.pkl": pickle.dumps({0: {"active": ["a"], "inactive": [5], "finish_time": 10}}),
        "negative.pkl": pickle.dumps({0: {"active": [-5], "inactive": [5], "finish_time": 10}}),
        "reversed.pkl": pickle.dumps({0: {"active": [8], "inactive": [2], "finish_time": 10}}),
        "nofinish.pkl": pickle.dumps({0: {"active": [1], "inactive": [2]}}),
        "zerofinish.pkl": pickle.dumps({0: {"active": [1], "inactive": [2], "finish_time": 0}}),
        "set.pkl": pickle.dumps({0: {"active": [1], "inactive": [2], "finish_time": 10, "model": {"a"}}}),
        "bytes.pkl": pickle.dumps({0: {"active": [1], "inactive": [2], "finish_time": 10, "model": b"x"}}),
        "numpy.pkl": pickle.dumps({0: {"active": np.array([1]), "inactive": [2], "finish_time": 10}}),
        "code.pkl": pickle.dumps({0: Opens(folder / "marker")}),
        "empty.pkl": b"",
    }
    for name, data in pickles.items():
        (folder / name).write_bytes(data)
    jsons = {
        "truncated.json": json.dumps(FLASH)[:40],
        "list.json": "[1, 2]",
        "state.json": json.dumps({"1": {"messages": "2020-01-02 00:00:00\tflying"}}),
        "time.json": json.dumps({"1": {"messages": "yesterday\twifi"}}),
        "backwards.json": json.dumps({"1": {"messages": "2020-01-02 00:00:09\twifi\n2020-01-02 00:00:01\tscreen_on"}}),
        "nomessages.json": json.dumps({"1": {"guid": "a"}}),
        "deep.json": "[" * 100_000 + "]" * 100_000,
    }
    for name, text in jsons.items():
        (folder / name).write_text(text)
    (folder / "two.csv").write_text("1,0\n0,2\n")
    (folder / "ragged.csv").write_text("1,0,1\n0,1\n")
    (folder / "zeros.csv").write_text("0,0\n0,0\n")
    (folder / "words.csv").write_text("1,0\nyes,no\n")
    cases = {name: ("fedscale", name, ["--round-seconds", "10"]) for name in pickles}
    cases.update({name: ("flash", name, ["--round-seconds", "10"]) for name in jsons})
    cases.update({name: ("matrix", name, []) for name in ("two.csv", "ragged.csv", "zeros.csv", "words.csv")})
    cases.update({
        "missing": ("matrix", "none.csv", []),
        "round seconds 0": ("fedscale", "negative.pkl", ["--round-seconds", "0"]),
        "round seconds nan": ("flash", "list.json", ["--round-seconds", "nan"]),
        "round seconds for a matrix": ("matrix", "two.csv", ["--round-seconds", "5"]),
        "ready unknown": ("flash", "list.json", ["--round-seconds", "5", "--ready", "charging,sunny"]),
        "ready for fedscale": ("fedscale", "negative.pkl", ["--round-seconds", "5", "--ready", "wifi"]),
        "rounds past a matrix": ("matrix", "zeros.csv", ["--rounds", "9"]),
    })
    return cases


# One of each kind, as a user types it (a process each); every case runs in process below.
TYPED = ("truncated.pkl", "negative.pkl", "set.pkl", "code.pkl", "state.json", "backwards.json", "two.csv",
         "round seconds for a matrix", "missing")


def test_bad_files_and_options_are_one_line_exit_2_and_write_nothing(tmp_path):
    cases = _bad_files(tmp_path)
    commands = [("participation", "import", fmt, str(tmp_path / name), *extra, "--out", str(tmp_path / "out.csv"))
                for fmt, name, extra in (cases[case] for case in TYPED)]
    for case, proc in zip(TYPED, run_cli_together(commands)):
        assert_one_line_error(proc, 2)
        assert not (tmp_path / "out.csv").exists(), case
    assert not (tmp_path / "marker").exists()  # the pickle that opens a file never ran


def test_every_bad_file_and_option_is_one_line_exit_2_in_process(tmp_path, capsys):
    for case, (fmt, name, extra) in _bad_files(tmp_path).items():
        out = tmp_path / "out.csv"
        assert main(["participation", "import", fmt, str(tmp_path / name), *extra, "--out", str(out)]) == 2, case
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, (case, err)
        assert not out.exists(), case
    assert not (tmp_path / "marker").exists()


@pytest.mark.parametrize("name,says", [
    ("truncated.pkl", "truncated"), ("notdict.pkl", "non-empty dict"), ("strtimes.pkl", "number of seconds"),
    ("negative.pkl", "must not be negative"), ("reversed.pkl", "before it becomes active"),
    ("nofinish.pkl", "finish_time"), ("zerofinish.pkl", "positive"), ("set.pkl", "holds a set"),
    ("bytes.pkl", "holds a bytes"), ("numpy.pkl", "refers to numpy"), ("code.pkl", "refers to io.open"),
    ("empty.pkl", "truncated"), ("truncated.json", "not valid JSON"), ("list.json", "JSON object"),
    ("state.json", "unknown state"), ("time.json", "is not a time"), ("backwards.json", "no device is available"),
    ("nomessages.json", "'messages'"), ("deep.json", "not valid JSON"), ("two.csv", "only 0 and 1"),
    ("ragged.csv", "different lengths"), ("zeros.csv", "no device is available"), ("words.csv", "not numeric"),
])
def test_bad_files_say_what_is_wrong(tmp_path, name, says):
    fmt, file, extra = _bad_files(tmp_path)[name]
    seconds = 10.0 if extra else None
    with pytest.raises(DataError) as info:
        import_trace(fmt, tmp_path / file, ImportOptions(round_seconds=seconds))
    assert says in str(info.value) and "\n" not in str(info.value)


def test_a_pickle_that_would_run_code_never_runs_it(tmp_path):
    marker = tmp_path / "marker"
    payload = tmp_path / "payload.pkl"
    payload.write_bytes(pickle.dumps({0: {"active": [1], "inactive": [2], "finish_time": 10, "model": Opens(marker)}}))
    with pytest.raises(DataError, match="refers to io.open"):
        import_trace("fedscale", payload, ImportOptions(round_seconds=1))
    assert not marker.exists()
    # The payload is live: a plain unpickler creates the marker (what the restricted one prevents).
    pickle.loads(payload.read_bytes())
    assert marker.exists()


@pytest.mark.parametrize("protocol", [0, 2, 5])
def test_plain_pickles_of_every_protocol_are_read(tmp_path, protocol):
    path = tmp_path / "p.pkl"
    path.write_bytes(pickle.dumps(FEDSCALE, protocol=protocol))
    assert np.array_equal(imported("fedscale", path, round_seconds=10).mask, expected(FEDSCALE_START))


def test_inputs_are_size_checked_before_they_are_read(files, monkeypatch):
    for cap, fmt, name in (("MAX_PICKLE_BYTES", "fedscale", "behave.pkl"), ("MAX_JSON_BYTES", "flash", "states.json")):
        monkeypatch.setattr(parsing, cap, 16)
        with pytest.raises(DataError, match="more than the 16 B"):
            imported(fmt, files / name, round_seconds=10)
        monkeypatch.undo()
    monkeypatch.setattr(parsing, "check_allocation", _refuse)
    with pytest.raises(DataError, match="refused"):
        imported("fedscale", files / "behave.pkl", round_seconds=10)


def _refuse(nbytes, what, error=DataError):
    raise error(f"{what}: refused")


def test_a_trace_too_large_to_read_back_is_refused_before_writing(files, capsys, monkeypatch):
    monkeypatch.setattr(importing, "MAX_CSV_BYTES", 10)
    out = files / "big.csv"
    assert main(["participation", "import", "matrix", str(files / "matrix.csv"), "--out", str(out)]) == 2
    assert "import fewer --rounds or --clients" in capsys.readouterr().err and not out.exists()


def test_a_round_that_crosses_the_end_of_the_recording_continues_at_its_start():
    # Spells 80..100 and 0..20 of a 100 s recording: the round [90, 120] is [90, 100] then [0, 20].
    starts, ends = parsing.merged([(80, 100), (0, 10), (10, 20)])  # touching spells are joined
    assert starts.tolist() == [0, 80] and ends.tolist() == [20, 100]
    device = parsing.Availability(starts, ends, origin=0.0, span=100.0)
    whole = parsing.availability_mask([device], 30.0, 4, "whole")[:, 0]
    start = parsing.availability_mask([device], 30.0, 4, "start")[:, 0]
    assert whole.tolist() == [False, False, False, True] and start.tolist() == [True, False, False, True]
    # A round longer than the recording is whole only if the device is always available.
    always = parsing.Availability(np.array([0.0]), np.array([100.0]), origin=0.0, span=100.0)
    assert parsing.availability_mask([device, always], 250.0, 2, "whole").tolist() == [[False, True]] * 2


def imported_modules(stderr: str) -> set[str]:
    """The modules a process imported, from what PYTHONPROFILEIMPORTTIME (python -X importtime)
    printed: ``import time: SELF | CUMULATIVE | NAME`` (indented by depth)."""
    return {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines() if line.startswith("import time:")}


def test_import_starts_without_torch(files):
    """`participation import` reads and writes traces with numpy alone: the command typed builds
    its own parser only (cli.build_parser), and focusfl.work (torch) is reached with --work-out
    only. Imports are read from the process itself, through the entry point as a user types it."""
    env = cli_env(PYTHONPROFILEIMPORTTIME="1")  # python -X importtime
    for argv in (["participation", "import", "--help"],
                 ["participation", "import", "matrix", "matrix.csv", "--out", "trace.csv"]):
        proc = run_cli(*argv, cwd=files, env=env)
        assert proc.returncode == 0, proc.stderr[-2000:]
        modules = imported_modules(proc.stderr)
        assert "focusfl.recordings.importing" in modules, argv
        assert "torch" not in modules and "focusfl.work" not in modules, argv
    assert np.array_equal(load_trace(files / "trace.csv"), MATRIX.T.astype(bool))
    # `focusfl --version` builds no command's parser
    proc = run_cli("--version", cwd=files, env=env)
    assert proc.returncode == 0 and proc.stdout.startswith("focusfl ") and "torch" not in imported_modules(proc.stderr)
    # the control: a command that needs torch is seen importing it
    proc = run_cli("algorithms", cwd=files, env=env)
    assert proc.returncode == 0 and "torch" in imported_modules(proc.stderr)


def test_a_matrix_keeps_its_never_available_clients_so_indices_do_not_shift(tmp_path):
    """FedStale keeps every client of a matrix (e.g. Germany and Finland never available in
    availability_matrix_global_mean.csv): client k stays the k-th row, and the trace replays
    with absent=true and all the clients."""
    countries = ["Ireland", "Germany", "Great Britain", "France", "Sweden", "Finland", "Belgium"]
    rng = np.random.default_rng(3)
    matrix = rng.random((7, 12)) < 0.5
    matrix[[1, 5]] = False
    matrix[[0, 2, 3, 4, 6], 0] = True
    path = tmp_path / "gm.csv"
    path.write_text("," + ",".join(str(r) for r in range(12)) + "\n"
                    + "".join(f"{c}," + ",".join(str(int(v)) for v in row) + "\n" for c, row in zip(countries, matrix)))
    out = tmp_path / "gm_trace.csv"
    proc = run_cli("participation", "import", "matrix", str(path), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "kept 2 device(s) never available in these rounds (empty columns; replay with absent=true): " \
           "Germany, Finland" in proc.stdout
    assert f"--participation trace:path={out},absent=true" in proc.stdout
    assert np.array_equal(load_trace(out), matrix.T)  # FedStale's read_csv(index_col=0), every client
    run = run_cli("run", "--algorithm", "fedavg", "--problem", "ridge:clients=7,dim=3,samples=5", "--participation",
                  f"trace:path={out},absent=true", "--rounds", "12", "--local-steps", "1", "--out", str(tmp_path / "r"))
    assert run.returncode == 0, run.stderr
    dropped = tmp_path / "gm_dropped.csv"
    proc = run_main("participation", "import", "matrix", str(path), "--absent", "drop", "--out", str(dropped))
    assert proc.returncode == 0 and "dropped 2 device(s) never available in these rounds: Germany, Finland" in proc.stdout
    assert np.array_equal(load_trace(dropped), matrix[[0, 2, 3, 4, 6]].T)
    # A timed recording drops them by default and keeps them when asked.
    behave = tmp_path / "behave.pkl"
    behave.write_bytes(pickle.dumps(FEDSCALE))
    kept = import_trace("fedscale", behave, ImportOptions(round_seconds=10, absent="keep"))
    assert kept.names == ["0", "1", "7"] and kept.absent == ["7"] and not kept.mask[:, 2].any()
    assert import_trace("fedscale", behave, ImportOptions(round_seconds=10)).dropped == ["7"]
    assert_one_line_error(run_main("participation", "import", "matrix", str(path), "--absent", "sometimes"), 2)

"""`focusfl participation import` on files in the real layouts that FedStale, FLASH and FedScale
publish, compared with what each tool's own loader does with the same file.

Every file is written here, in the layout the tool writes or reads (nothing is downloaded). Each
tool's loader is re-created in this file from its code (read at the commit named; never copied):
its semantics, in a few lines of plain Python, so that a test fails when focusfl reads a file
differently from the tool that made it.

- FedStale (arodio/FedStale, branch CI_based_avail @ 1989ef1), fl_training/activity_simulator.py
  lines 55-59: ``pd.read_csv(path, index_col=[0])`` then ``df.iloc[:, :n_rounds].to_numpy()``;
  line 73: round c's clients are ``np.where(matrix[:, c] == 1)``.
- FLASH (PKU-Chengxu/FLASH @ 55cbede), models/timer.py: time 0 is ``refer_time = '2020-01-02
  00:00:00'`` (line 40); ready spells open and close at events (lines 84-131) and are merged
  (167-177); a malformed line makes the device fail (``except ValueError``, line 154: never
  ready); ``ready(round_start, time_window)`` (lines 235-255) tests ``now = int(round_start +
  time_window - trace_start) % int(trace_end - trace_start) + trace_start`` against the spells;
  models/main.py line 244 asks ``ready(cur_time, time_window)`` with the window of
  models/utils/config.py line 45 (20 s by default).
- FLASH's ready windows (lh-ycx/leaf @ 213ee78): data/ready_strict.json, written by
  models/utils/plot.py ``static_ready`` (lines 68-120): ``{uid: [[start, end], ...]}`` seconds
  from its reference time.
- FedScale (SymbioticLab/FedScale @ 7ec441c): fedscale/cloud/client_manager.py line 51 gives
  client ``client_id`` the trace ``user_trace[user_trace_keys[client_id % len]]`` (keys in the
  pickle's order); fedscale/cloud/aggregation/aggregator.py lines 277-287 number the clients
  from 1 and look their speed up as ``client_profiles.get((num_of_clients + 1) % len, {1.0,
  1.0})``; fedscale/cloud/internal/client_metadata.py lines 56-63 price a round
  (``get_completion_time``).
"""
from __future__ import annotations

import csv
import json
import math
import os
import pickle
import subprocess
from datetime import datetime, timedelta

import numpy as np
import pytest

from cli_harness import assert_one_line_error, cli_env, focusfl_command, run_cli, run_cli_together, run_main
from focusfl.cli import main
from focusfl.errors import DataError
from focusfl.recordings import capacity as capacity_file, matrix as matrix_files, parsing
from focusfl.participation import make_participation, summarize
from focusfl.recordings.importing import CapacityOptions, ImportOptions, import_trace
from focusfl.participation.trace import load_trace
from focusfl.work import make_work
from focusfl.recordings.capacity import deadline_steps

COUNTRIES = ["Ireland", "Germany", "Great Britain", "France", "Sweden", "Finland", "Belgium"]
HOURS = [f"2022-01-01 {h:02d}:00:00" for h in range(24)] + [f"2022-01-02 {h:02d}:00:00" for h in range(6)]


def _availability(seed: int = 0) -> np.ndarray:
    """7 countries x 30 hourly rounds, every country available at least once."""
    matrix = np.random.default_rng(seed).random((len(COUNTRIES), len(HOURS))) < 0.4
    matrix[:, 0] = True
    return matrix


# -- FedStale ---------------------------------------------------------------------------------
def _write_fedstale(path, matrix: np.ndarray, layout: str) -> None:
    """A matrix as pandas' DataFrame.to_csv writes FedStale's three kinds of file: ``gaussian``
    (int index 1..N under an empty header cell, round numbers, 1.0/0.0), ``cyclic`` (country
    index, datetime header, 1/0) and ``budget`` (country index, datetime header, True/False)."""
    names = [str(k + 1) for k in range(len(matrix))] if layout == "gaussian" else COUNTRIES
    labels = [str(r) for r in range(matrix.shape[1])] if layout == "gaussian" else HOURS[: matrix.shape[1]]
    cell = {"gaussian": lambda v: "1.0" if v else "0.0", "cyclic": lambda v: "1" if v else "0",
            "budget": lambda v: "True" if v else "False"}[layout]
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["", *labels])
        for name, row in zip(names, matrix):
            writer.writerow([name, *(cell(v) for v in row)])


def fedstale_active_sets(path, n_rounds: int) -> list[list[int]]:
    """FedStale's ActivitySimulator on ``path``: the first column is the index (index_col=[0]),
    the header names the columns, the first n_rounds columns are kept, and round c's clients are
    those whose cell equals 1 (pandas reads 1.0, 1 and True all as equal to 1)."""
    with open(path, newline="") as handle:
        rows = list(csv.reader(handle))[1:]
    matrix = np.array([[_pandas_value(cell) for cell in row[1:]] for row in rows])[:, :n_rounds]
    return [np.flatnonzero(matrix[:, c] == 1).tolist() for c in range(matrix.shape[1])]


def _pandas_value(cell: str) -> float:
    """A cell as pandas parses it: True/False as booleans (== 1 and == 0), the rest as numbers."""
    return 1.0 if cell == "True" else 0.0 if cell == "False" else float(cell)


@pytest.mark.parametrize("layout", ["gaussian", "cyclic", "budget"])
def test_fedstale_layouts_import_as_fedstale_reads_them(tmp_path, layout):
    matrix = _availability(seed=len(layout))
    path = tmp_path / f"av-mat_{layout}.csv"
    _write_fedstale(path, matrix, layout)
    out = tmp_path / "trace.csv"
    run = run_cli if layout == "gaussian" else run_main  # the console script once; in this process after
    proc = run("participation", "import", "matrix", str(path), "--rounds", "20", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    mask = load_trace(out)
    assert [np.flatnonzero(row).tolist() for row in mask] == fedstale_active_sets(path, 20)
    # The clients' names are kept in the trace's header, the round labels in its first line.
    names = [str(k + 1) for k in range(7)] if layout == "gaussian" else COUNTRIES
    assert out.read_text().splitlines()[1] == ",".join(f"client_{n}" for n in names)
    first, last = ("0", "19") if layout == "gaussian" else (HOURS[0], HOURS[19])
    assert f"rounds {first} .. {last}" in out.read_text().splitlines()[0]
    assert "clients named in its first column" in proc.stdout


def test_a_0_1_index_column_under_a_header_that_names_it_is_an_index(tmp_path):
    # Two clients named 0 and 1 (pandas' default RangeIndex): read as rounds, client 1 would gain a
    # round and client 0 lose one.
    path = tmp_path / "range_index.csv"
    path.write_text(",0,1,2\n0,1,0,1\n1,0,1,1\n")
    trace = import_trace("matrix", path, ImportOptions())
    assert trace.names == ["0", "1"] and trace.mask.T.tolist() == [[True, False, True], [False, True, True]]
    assert [np.flatnonzero(r).tolist() for r in trace.mask] == fedstale_active_sets(path, 3)
    named = tmp_path / "named_index.csv"
    named.write_text("client,2022-01-01 00:00:00,2022-01-01 01:00:00\n0,1,0\n1,1,1\n")
    assert import_trace("matrix", named, ImportOptions()).mask.T.tolist() == [[True, False], [True, True]]
    # A header of the same kind throughout names rounds only: every column is a round.
    plain = tmp_path / "plain.csv"
    plain.write_text("r0,r1,r2\n0,1,0\n1,1,1\n")
    assert import_trace("matrix", plain, ImportOptions()).mask.shape == (3, 2)
    # The explicit option decides either way.
    assert import_trace("matrix", plain, ImportOptions(index_column="yes")).names == ["0", "1"]
    assert import_trace("matrix", path, ImportOptions(index_column="no", rounds=3)).mask.shape == (3, 2)
    bare = tmp_path / "bare.csv"
    bare.write_text("1,1,0\n2,0,1\n")
    assert main(["participation", "import", "matrix", str(bare), "--index-column", "yes"]) == 0


# -- FLASH ------------------------------------------------------------------------------------
REFER = datetime(2020, 1, 2)


def _stamp(seconds: float) -> str:
    return (REFER + timedelta(seconds=seconds)).strftime("%Y-%m-%d %H:%M:%S")


def _messages(events: list[tuple[float, str]]) -> str:
    return "".join(f"{_stamp(t)}\t{state}\n" for t, state in events)


class FlashTimer:
    """FLASH's Timer (models/timer.py) re-created: its ready spells (charging, WiFi and locked,
    opened and closed at events, only closed spells kept, merged), its trace span (first to last
    event) and ``ready(round_start, time_window)``; ``ok`` is False where the Timer fails."""

    def __init__(self, messages: str) -> None:
        self.ok, self.spells = False, []
        held = {"charged": False, "wifi": False, "locked": False}
        opened, spells, stamps = None, [], []
        for line in messages.split("\n"):
            if not line.strip():
                continue
            parts = line.strip().split("\t")
            if len(parts) != 2:
                return  # ValueError in the Timer: the device fails
            t, s = parts[0].strip(), parts[1].strip().lower()
            try:
                # time.mktime(...) - time.mktime(refer): local wall-clock seconds (no DST here)
                seconds = (datetime.strptime(t, "%Y-%m-%d %H:%M:%S") - REFER).total_seconds()
            except ValueError:
                return
            stamps.append(seconds)
            for state, key, value in (("battery_charged_on", "charged", True), ("battery_charged_off", "charged", False),
                                      ("wifi", "wifi", True), ("4g", "wifi", False), ("screen_lock", "locked", True),
                                      ("screen_unlock", "locked", False)):
                if s == state:
                    held[key] = value
            ready = all(held.values())
            if ready and opened is None:
                opened = seconds
            if opened is not None and not ready:
                spells.append([opened, seconds])
                opened = None
        if not spells or int(stamps[-1] - stamps[0]) == 0:
            return
        spells.sort()
        now = spells[0]
        for a in spells:
            if now[1] >= a[0]:
                now = [now[0], max(a[1], now[1])]
            else:
                self.spells.append(now)
                now = a
        self.spells.append(now)
        self.start, self.end, self.ok = stamps[0], stamps[-1], True

    def ready(self, round_start: float, time_window: float) -> bool:
        if not self.ok:
            return False
        now = int(round_start + time_window - self.start) % int(self.end - self.start) + self.start
        return any(a <= now <= b for a, b in self.spells)


# Device a: recorded from 00:01:40 after refer_time; device b: recorded in March 2018, before it
# (FLASH's data). Rounds before device a's first event have negative offsets, which int() truncates
# toward zero: 7.5 s into the clock device a reads 408 s (its spell from 408 s: ready), not 407.5 s.
FLASH_DEVICES = {
    "a": [(100, "battery_charged_on"), (130, "wifi"), (170, "screen_lock"), (260, "screen_unlock"), (300, "4g"),
          (330, "wifi"), (408, "screen_lock"), (420, "battery_charged_off"), (500, "55%")],
    "b": [(-57_000_005, "wifi"), (-57_000_000, "battery_charged_on"), (-56_999_950, "screen_lock"),
          (-56_999_890, "battery_charged_off"), (-56_999_800, "screen_unlock")],
}


def _flash_file(path, devices=FLASH_DEVICES, extra: dict | None = None):
    data = {uid: {"guid": uid, "model": "m", "messages": _messages(events)} for uid, events in devices.items()}
    data.update(extra or {})
    path.write_text(json.dumps(data))
    return data


@pytest.mark.parametrize("window", [0, 20])
def test_flash_clock_starts_at_refer_time_and_checks_after_the_window(tmp_path, window):
    path = tmp_path / "state_traces.json"
    data = _flash_file(path)
    out = tmp_path / "flash.csv"
    # Rounds of 7.5 s: FLASH's int() truncates the clock offsets (toward zero, also the negative ones).
    args = ["participation", "import", "flash", str(path), "--round-seconds", "7.5", "--rounds", "80", "--out",
            str(out)] + (["--window", str(window)] if window else [])
    proc = (run_cli if window else run_main)(*args)  # --window through the console script
    assert proc.returncode == 0, proc.stderr
    timers = {uid: FlashTimer(entry["messages"]) for uid, entry in data.items()}
    flash = np.array([[timers[uid].ready(7.5 * r, window) for uid in ("a", "b")] for r in range(80)])
    assert np.array_equal(load_trace(out), flash)
    assert "from 2020-01-02 00:00:00" in proc.stdout


def test_flash_start_moves_the_clock(tmp_path):
    path = tmp_path / "state_traces.json"
    data = _flash_file(path)
    timers = {uid: FlashTimer(entry["messages"]) for uid, entry in data.items()}
    moved = import_trace("flash", path, ImportOptions(round_seconds=15, rounds=30, start="2020-01-02 00:01:40"))
    flash = np.array([[timers[uid].ready(100 + 15 * r, 0) for uid in ("a", "b")] for r in range(30)])
    assert np.array_equal(moved.mask, flash)
    # `earliest` is the file's first event (device b's, in 2018): another phase.
    earliest = import_trace("flash", path, ImportOptions(round_seconds=15, rounds=30, start="earliest"))
    flash = np.array([[timers[uid].ready(-57_000_005 + 15 * r, 0) for uid in ("a", "b")] for r in range(30)])
    assert np.array_equal(earliest.mask, flash)
    default = import_trace("flash", path, ImportOptions(round_seconds=15, rounds=30))
    assert not np.array_equal(default.mask, moved.mask)


def test_flash_bad_devices_are_refused_or_skipped_and_named(tmp_path):
    path = tmp_path / "state_traces.json"
    bad = {"c": {"guid": "c", "messages": f"{_stamp(5)}\twifi\nno tab here\n"},
           "d": {"guid": "d", "messages": "yesterday\twifi\n"}}
    data = _flash_file(path, extra=bad)
    out = tmp_path / "flash.csv"
    refused = run_main("participation", "import", "flash", str(path), "--round-seconds", "15", "--out", str(out))
    assert "--skip-bad-devices" in assert_one_line_error(refused, 2) and not out.exists()
    proc = run_cli("participation", "import", "flash", str(path), "--round-seconds", "15", "--rounds", "40",
                   "--skip-bad-devices", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "skipped 2 device(s) with malformed records: c (" in proc.stdout and ", d (" in proc.stdout
    # FLASH's Timer fails both (ValueError): they are never ready; the others are as FLASH reads them.
    timers = {uid: FlashTimer(entry["messages"]) for uid, entry in data.items()}
    assert not timers["c"].ok and not timers["d"].ok
    flash = np.array([[timers[uid].ready(15 * r, 0) for uid in ("a", "b")] for r in range(40)])
    assert np.array_equal(load_trace(out), flash)


def test_flash_devices_whose_time_goes_back_are_read_as_flash_reads_them(tmp_path):
    """FLASH's Timer does not check time order: it reads the events in the file's order, a spell
    may close before it opens (never matched), and its span is last minus first event (negative
    when the last is the earlier: Python's modulo then reads back from the first event)."""
    devices = dict(FLASH_DEVICES)
    devices["c"] = [(100, "battery_charged_on"), (130, "wifi"), (170, "screen_lock"), (150, "screen_unlock"),
                    (200, "screen_lock"), (260, "battery_charged_off"), (240, "4g"), (400, "70%")]
    devices["d"] = [(500, "battery_charged_on"), (510, "wifi"), (300, "screen_lock"), (350, "4g"),
                    (90, "screen_unlock")]  # the last event is the earliest: a negative span
    path = tmp_path / "state_traces.json"
    data = _flash_file(path, devices)
    out = tmp_path / "flash.csv"
    proc = run_cli("participation", "import", "flash", str(path), "--round-seconds", "15", "--rounds", "60",
                   "--absent", "keep", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "read 2 device(s) whose time goes back in the file's order, as FLASH's Timer reads them: c, d" in proc.stdout
    timers = {uid: FlashTimer(entry["messages"]) for uid, entry in data.items()}
    flash = np.array([[timers[uid].ready(15 * r, 0) for uid in sorted(devices)] for r in range(60)])
    assert flash[:, 2].any() and flash[:, 3].any()  # both devices are ready in some rounds, as in FLASH
    assert int((load_trace(out) != flash).sum()) == 0


def test_flash_assignment_draws_each_client_a_recording_with_replacement(tmp_path):
    path = tmp_path / "state_traces.json"
    data = _flash_file(path)
    out = tmp_path / "flash.csv"
    proc = run_cli("participation", "import", "flash", str(path), "--round-seconds", "15", "--rounds", "40",
                   "--assign", "flash", "--seed", "3", "--clients", "6", "--absent", "keep", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    drawn = np.random.default_rng(3).integers(0, 2, size=6)  # NumPy's PCG64, the recordings in id order
    uids = sorted(data)
    header = out.read_text().splitlines()[1]
    assert header == ",".join(f"client_{k}:{uids[d]}" for k, d in enumerate(drawn))
    assert "FLASH's assignment (each client a recording drawn with replacement, seed 3)" in out.read_text()
    timers = {uid: FlashTimer(entry["messages"]) for uid, entry in data.items()}
    flash = np.array([[timers[uids[d]].ready(15 * r, 0) for d in drawn] for r in range(40)])
    assert np.array_equal(load_trace(out), flash)
    again = import_trace("flash", path, ImportOptions(round_seconds=15, rounds=40, assign="flash", seed=3, clients=6,
                                                      absent="keep"))
    assert np.array_equal(again.mask, flash)  # seeded: the same draw
    for bad in (("--seed", "-1", "--assign", "flash"), ("--seed", "2"), ("--assign", "flash", "--seed", "x")):
        assert_one_line_error(run_main("participation", "import", "flash", str(path), "--round-seconds", "15", *bad), 2)
    behave = tmp_path / "behave.pkl"
    behave.write_bytes(pickle.dumps(BEHAVE))
    assert_one_line_error(run_main("participation", "import", "fedscale", str(behave), "--round-seconds", "15",
                                   "--assign", "flash"), 2, "flash traces only")


# -- FLASH's ready windows ------------------------------------------------------------------
def test_ready_windows_import_as_flash_checks_them(tmp_path):
    """lh-ycx/leaf data/ready_strict.json: {uid: [[start, end], ...]} (floats, possibly
    zero-length or touching spells, users with none)."""
    ready = {"b433527bfa11432291c22d8bb8a50c5d": [[78.0, 112.0]],
             "3cf7e247ebef436da04d868a8e525c47": [[14.0, 20.0], [21.0, 21.0], [22.0, 40.0], [90.0, 95.5]],
             "e0": []}
    path = tmp_path / "ready_strict.json"
    path.write_text(json.dumps(ready, indent=4))
    out = tmp_path / "ready.csv"
    proc = run_cli("participation", "import", "ready", str(path), "--round-seconds", "7", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    kept = [uid for uid in sorted(ready) if ready[uid]]
    rounds = math.ceil(112.0 / 7)
    flash = np.array([[any(a <= 7 * r <= b for a, b in ready[uid]) for uid in kept] for r in range(rounds)])
    assert np.array_equal(load_trace(out), flash)
    assert "dropped 1 device(s) never available in these rounds: e0" in proc.stdout
    shifted = import_trace("ready", path, ImportOptions(round_seconds=7, rounds=5, start="10", window=3))
    flash = np.array([[any(a <= 10 + 7 * r + 3 <= b for a, b in ready[uid]) for uid in kept] for r in range(5)])
    assert np.array_equal(shifted.mask, flash[:, flash.any(axis=0)])



def test_ready_windows_with_reversed_spells_import_without_them(tmp_path):
    """The published ready_strict.json holds 4 spells that end before they start in 3 devices
    (e.g. [112762, 112759]): FLASH's start <= now <= end never matches one, and the device's
    other spells are read as they are; focusfl skips the spell, not the device, and says so."""
    ready = {"a": [[0.0, 30.0], [112762.0, 112759.0], [40.0, 70.0]],
             "b": [[50.0, 45.0], [10.0, 25.0], [90.0, 80.0]],
             "c": [[5.0, 60.0]]}
    path = tmp_path / "ready_strict.json"
    path.write_text(json.dumps(ready))
    out = tmp_path / "ready.csv"
    proc = run_cli("participation", "import", "ready", str(path), "--round-seconds", "5", "--rounds", "20",
                   "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "skipped 3 spell(s) that end before they start (never matched by start <= t <= end) in 2 device(s), " \
           "their other spells kept: a (1), b (2)" in proc.stdout
    flash = np.array([[any(a <= 5 * r <= b for a, b in ready[uid]) for uid in sorted(ready)] for r in range(20)])
    assert np.array_equal(load_trace(out), flash)  # 0 mismatching client-rounds


# -- FedScale ---------------------------------------------------------------------------------
# Insertion order 30, 10, 20 (FedScale's keys order); sorted order 10, 20, 30.
BEHAVE = {
    30: {"duration": 100, "inactive": [40], "finish_time": 100, "active": [0], "model": "a"},
    10: {"duration": 100, "inactive": [100], "finish_time": 100, "active": [50], "model": "b"},
    20: {"duration": 100, "inactive": [30, 90], "finish_time": 100, "active": [10, 70], "model": "c"},
}


def fedscale_active(trace: dict, cur_time: float) -> bool:
    """ClientMetadata.is_active's test: active[k] <= cur_time % finish_time <= inactive[k]."""
    norm = cur_time % trace["finish_time"]
    return any(a <= norm <= b for a, b in zip(trace["active"], trace["inactive"]))


def test_fedscale_assignment_is_fedscales_own(tmp_path):
    path = tmp_path / "client_behave_trace"
    path.write_bytes(pickle.dumps(BEHAVE))
    out = tmp_path / "trace.csv"
    proc = run_cli("participation", "import", "fedscale", str(path), "--round-seconds", "10", "--assign", "fedscale",
                   "--clients", "5", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    keys = list(BEHAVE)  # FedScale's user_trace_keys
    fedscale = np.array([[fedscale_active(BEHAVE[keys[client_id % len(keys)]], 10 * r) for client_id in range(1, 6)]
                         for r in range(10)])
    assert np.array_equal(load_trace(out), fedscale)
    assert out.read_text().splitlines()[1] == "client_1:10,client_2:20,client_3:30,client_4:10,client_5:20"
    # Today's order: sorted ids, the first N; a different population for the same --clients.
    ordered = import_trace("fedscale", path, ImportOptions(round_seconds=10, clients=2))
    assert ordered.names == ["10", "20"]
    assert np.array_equal(ordered.mask, np.array([[fedscale_active(BEHAVE[k], 10 * r) for k in (10, 20)]
                                                  for r in range(10)]))


class FedScaleClient:
    """FedScale's ClientMetadata.is_active (fedscale/cloud/internal/client_metadata.py, fedscale 1.0
    on PyPI) re-created: a spell index kept between calls, moved on by one when the time of the
    cycle is past the spell's end, wrapped past the last; active inside the indexed spell."""

    def __init__(self, trace: dict) -> None:
        self.trace, self.index = trace, 0

    def is_active(self, cur_time: float) -> bool:
        norm = cur_time % self.trace["finish_time"]
        if norm > self.trace["inactive"][self.index]:
            self.index += 1
        self.index %= len(self.trace["active"])
        return self.trace["active"][self.index] <= norm <= self.trace["inactive"][self.index]


# FedScale's unit-test fixture as the issue reports it: 1-second rounds, a 10-second cycle whose
# last spell ends at finish_time.
FEDSCALE_FIXTURE = {"active": [1, 3, 6, 9], "inactive": [1, 4, 7, 10], "finish_time": 10}


def _fedscale_walk(traces: list[dict], seconds: float, rounds: int) -> np.ndarray:
    clients = [FedScaleClient(t) for t in traces]
    return np.array([[c.is_active(r * seconds) for c in clients] for r in range(rounds)])


def test_fedscale_semantics_walk_the_spells_as_is_active_does(tmp_path):
    path = tmp_path / "client_behave_trace"
    path.write_bytes(pickle.dumps({1: FEDSCALE_FIXTURE, 2: {"active": [0], "inactive": [10], "finish_time": 10}}))
    out, clean = tmp_path / "fedscale.csv", tmp_path / "replay.csv"
    procs = run_cli_together([("participation", "import", "fedscale", str(path), "--round-seconds", "1", "--rounds", "30",
                               "--semantics", "fedscale", "--out", str(out)),
                              ("participation", "import", "fedscale", str(path), "--round-seconds", "1", "--rounds", "30",
                               "--out", str(clean))])
    assert all(proc.returncode == 0 for proc in procs), [proc.stderr for proc in procs]
    fedscale, replay = load_trace(out)[:, 0], load_trace(clean)[:, 0]
    assert "".join(".1"[int(v)] for v in fedscale) == ".1.11.11.1.........1.........1"
    assert "".join(".1"[int(v)] for v in replay) == ".1.11.11.1.1.11.11.1.1.11.11.1"
    assert np.array_equal(load_trace(out), _fedscale_walk([FEDSCALE_FIXTURE, {"active": [0], "inactive": [10],
                                                                               "finish_time": 10}], 1, 30))
    # 60 devices of sorted random spells, cycles of 50..400 s, 7 s rounds: 0 mismatching client-rounds.
    rng = np.random.default_rng(5)
    traces = {}
    for k in range(60):
        finish = float(rng.integers(50, 400))
        cuts = np.sort(rng.choice(np.arange(1, int(finish)), size=2 * int(rng.integers(1, 6)), replace=False))
        active, inactive = cuts[0::2].tolist(), cuts[1::2].tolist()
        if k % 4 == 0:
            inactive[-1] = finish  # a last spell that ends at finish_time
        traces[k] = {"active": active, "inactive": inactive, "finish_time": finish}
    many = tmp_path / "many.pkl"
    many.write_bytes(pickle.dumps(traces))
    walked = import_trace("fedscale", many, ImportOptions(round_seconds=7, rounds=300, semantics="fedscale",
                                                          absent="keep"))
    expected = _fedscale_walk([traces[k] for k in range(60)], 7, 300)
    assert int((walked.mask != expected).sum()) == 0
    assert not np.array_equal(walked.mask, import_trace("fedscale", many, ImportOptions(
        round_seconds=7, rounds=300, absent="keep")).mask)
    for bad in (("--semantics", "fedscale", "--rule", "whole"), ("--semantics", "sometimes")):
        assert_one_line_error(run_main("participation", "import", "fedscale", str(path), "--round-seconds", "1", *bad), 2)
    flash = tmp_path / "flash.json"
    _flash_file(flash)
    assert_one_line_error(run_main("participation", "import", "flash", str(flash), "--round-seconds", "1",
                                   "--semantics", "fedscale"), 2, "fedscale traces only")


def test_asking_more_clients_than_recorded_says_so(tmp_path):
    path = tmp_path / "client_behave_trace"
    path.write_bytes(pickle.dumps(BEHAVE))
    proc = run_main("participation", "import", "fedscale", str(path), "--round-seconds", "10", "--clients", "100")
    assert proc.returncode == 0, proc.stderr
    assert "--clients 100 asked, but the recording holds only 3 devices: all 3 imported" in proc.stdout
    assert "10 rounds x 3 clients" in proc.stdout


# Speeds: ms per sample (inference) and kbit/s, keyed 1..4 as FedScale's file is keyed by client id.
CAPACITY = {1: {"computation": 10.0, "communication": 400.0}, 2: {"computation": 50.0, "communication": 100.0},
            3: {"computation": 2.0, "communication": 5.0}, 4: {"computation": 400.0, "communication": 1000.0}}


def fedscale_steps(speed: dict, deadline: float, batch_size: int, model_kbits: float, tau: int) -> int:
    """The most local steps s <= tau whose FedScale round cost (get_completion_time: computation
    3 B s c / 1000, communication (up + down) / bandwidth) fits the deadline; 0 if none does."""
    def cost(s):
        return (3.0 * batch_size * s * float(speed["computation"]) / 1000.0
                + (model_kbits + model_kbits) / float(speed["communication"]))
    return max((s for s in range(1, tau + 1) if cost(s) <= deadline), default=0)


def test_device_capacity_becomes_a_work_trace_that_replays_with_the_participation(tmp_path):
    behave, capacity = tmp_path / "client_behave_trace", tmp_path / "client_device_capacity"
    behave.write_bytes(pickle.dumps(BEHAVE))
    capacity.write_bytes(pickle.dumps(CAPACITY))
    out, work = tmp_path / "trace.csv", tmp_path / "work.csv"
    proc = run_cli("participation", "import", "fedscale", str(behave), "--round-seconds", "10", "--assign", "fedscale",
                   "--clients", "4", "--capacity", str(capacity), "--deadline", "12", "--batch-size", "20",
                   "--model-kbits", "200", "--local-steps", "8", "--out", str(out), "--work-out", str(work))
    assert proc.returncode == 0, proc.stderr
    # FedScale's client c gets the speed client_profiles.get(c % len, {1.0, 1.0}).
    speeds = [CAPACITY.get(c % len(CAPACITY), {"computation": 1.0, "communication": 1.0}) for c in range(1, 5)]
    expected = [fedscale_steps(s, 12, 20, 200, 8) for s in speeds]
    assert expected == [8, 2, 0, 0]  # client 3 cannot upload in time; client 4 gets the default speed
    assert "cannot finish one local step before the deadline: 3:30, 4:10" in proc.stdout
    mask = load_trace(out)
    assert mask.shape[1] == 2
    work_process = make_work(f"trace:path={work}", 2, 8)
    table = work_process.active_table(mask).numpy()
    assert np.array_equal(table[mask], np.broadcast_to(np.array(expected[:2]), mask.shape)[mask])
    run = run_main("run", "--algorithm", "fedavg", "--problem", "ridge:clients=2,dim=3,samples=5",
                   "--participation", f"trace:path={out}", "--work", f"trace:path={work}", "--rounds",
                   str(len(mask)), "--local-steps", "8", "--out", str(tmp_path / "run"))
    assert run.returncode == 0, run.stderr
    # The participation trace wraps; the work trace beside it does not: a longer run is refused in
    # one line that says which rounds work.csv covers and what to do.
    longer = run_cli("run", "--algorithm", "fedavg", "--problem", "ridge:clients=2,dim=3,samples=5",
                     "--participation", f"trace:path={out}", "--work", f"trace:path={work}", "--rounds",
                     str(len(mask) + 5), "--local-steps", "8", "--out", str(tmp_path / "longer"))
    last = max(int(line.split(",")[0]) for line in work.read_text().splitlines()[1:])
    assert_one_line_error(longer, 2, f"work.csv covers rounds 0..{last} and, unlike a participation trace, does not "
                                     f"wrap around; run at most {last + 1} rounds (or import more --rounds)")


def test_deadline_steps_is_fedscales_price_inverted():
    rng = np.random.default_rng(0)
    computation, bandwidth = rng.uniform(0, 100, 200), rng.uniform(1, 2000, 200)
    computation[:3] = 0.0
    steps = deadline_steps(computation, bandwidth, 30.0, 16, 500.0, 12)
    expected = [fedscale_steps({"computation": c, "communication": w}, 30.0, 16, 500.0, 12)
                for c, w in zip(computation, bandwidth)]
    assert steps.tolist() == expected and steps.dtype == np.int64


# -- separated ------------------------------------------------------------------------------
def test_separated_clients_sit_out_gap_rounds_and_match_their_long_run_rate():
    proc = make_participation("separated:gap=3", 16, seed=4)
    mask = proc.mask(20_000)
    for i in range(16):
        assert (np.diff(np.flatnonzero(mask[:, i])) >= 4).all()
    assert np.allclose(mask.mean(axis=0), proc.nominal_p(), atol=0.015)
    assert np.allclose(proc.nominal_p(), proc.p / (1 + 3 * proc.p))
    # Prefix-consistent, rebuilt from describe(), and rows asked out of order are the same rows.
    again = make_participation(proc.describe(), 16, seed=4)
    assert np.array_equal(again.rows(500, 800), mask[500:800]) and np.array_equal(again.rows(10, 20), mask[10:20])


@pytest.mark.parametrize("spec, clients, seed", [("separated:gap=5,p=0.5", 12, 0), ("separated:gap=3", 16, 4),
                                                 ("separated:gap=2,p=0.9", 5, 1), ("separated:gap=7,p=0.3", 30, 2)])
def test_separated_delay_reaches_the_gap_before_a_client_returns(spec, clients, seed):
    """The guarantee docs/participation.md states: tau(r - 1) >= R whenever a client seen before
    takes part in round r. tau(r) >= R once every client was seen does not hold (the first case:
    tau(13) = 4 with R = 5)."""
    gap = int(spec.split("gap=")[1].split(",")[0])
    mask = make_participation(spec, clients, seed=seed).mask(4000)
    stats = summarize(mask)
    seen_before = np.vstack([np.zeros((1, clients), dtype=bool), np.logical_or.accumulate(mask, axis=0)[:-1]])
    returns = np.flatnonzero((mask & seen_before).any(axis=1))
    assert returns.size > 1000 and returns.min() > 0
    assert (stats.tau[returns - 1] >= gap).all()
    if seed == 0:
        assert stats.tau[13] == 4 < gap


def test_separated_as_a_user_types_it():
    proc = run_cli("participation", "separated:gap=2,p=0.5", "--clients", "4", "--rounds", "300")
    assert proc.returncode == 0, proc.stderr
    assert "0.2500" in proc.stdout  # nominal 0.5 / (1 + 2 * 0.5)
    for bad in ("separated:gap=-1", "separated:gap=x", "separated:p=0"):
        assert_one_line_error(run_main("participation", bad, "--clients", "4"), 2)


# -- hostile inputs -------------------------------------------------------------------------
class Opens:
    """A pickle payload that creates ``path`` when unpickled."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _hostile(folder) -> dict[str, tuple[str, ...]]:
    """case -> the command's arguments after `participation import`."""
    pickles = {"behave.pkl": BEHAVE, "capacity.pkl": CAPACITY, "code_capacity.pkl": {1: Opens(folder / "marker")},
               "neg_capacity.pkl": {1: {"computation": -1.0, "communication": 5.0}},
               "zero_bw.pkl": {1: {"computation": 1.0, "communication": 0}},
               "str_capacity.pkl": {1: {"computation": "fast", "communication": 5.0}},
               "list_capacity.pkl": [1.0, 2.0],
               "huge_capacity.pkl": {1: {"computation": 10 ** 400, "communication": 5.0}},
               "huge_behave.pkl": {1: {"active": [0], "inactive": [10 ** 400], "finish_time": 100}}}
    texts = {"ready_trunc.json": '{"u": [[1, 2]', "ready_reversed.json": '{"u": [[5, 2]]}',
             "ready_nan.json": '{"u": [[NaN, 2]]}', "ready_shape.json": '{"u": [[1, 2, 3]]}',
             "ready_list.json": "[[1, 2]]", "ready_huge.json": '{"u": [[0, 1%s]]}' % ("0" * 400), "ready_good.json": '{"u": [[0, 20]]}',
             "flash.json": json.dumps({"1": {"messages": f"{_stamp(1)}\twifi\n{_stamp(9)}\t4g\n"}}),
             "labels_ragged.csv": ",a,b\nx,1,0\ny,1\n", "labels_cell.csv": ",a,b\nx,1,maybe\n",
             "labels_empty.csv": ",a,b\nx,1,\n", "labels_header.csv": ",a,b,c\nx,1,0\n",
             "labels_two.csv": ",a,b\nx,1,2\n", "labels_only.csv": ",a,b\n", "mine.csv": "round,client,steps\n",
             "user.png": "a user's picture"}
    for name, value in pickles.items():
        (folder / name).write_bytes(pickle.dumps(value))
    for name, text in texts.items():
        (folder / name).write_text(text)
    np.save(folder / "m.npy", np.ones((2, 2)))
    s10 = ("--round-seconds", "10")
    priced = ("--deadline", "10", "--batch-size", "4", "--local-steps", "5")
    return {
        "capacity runs code": ("fedscale", "behave.pkl", *s10, "--capacity", "code_capacity.pkl", *priced),
        "capacity negative": ("fedscale", "behave.pkl", *s10, "--capacity", "neg_capacity.pkl", *priced),
        "capacity zero bandwidth": ("fedscale", "behave.pkl", *s10, "--capacity", "zero_bw.pkl", *priced),
        "capacity string": ("fedscale", "behave.pkl", *s10, "--capacity", "str_capacity.pkl", *priced),
        "capacity integer too large for a float": ("fedscale", "behave.pkl", *s10, "--capacity", "huge_capacity.pkl",
                                                   *priced),
        "behaviour integer too large for a float": ("fedscale", "huge_behave.pkl", *s10),
        "ready integer too large for a float": ("ready", "ready_huge.json", *s10),
        "capacity not a dict": ("fedscale", "behave.pkl", *s10, "--capacity", "list_capacity.pkl", *priced),
        "capacity missing": ("fedscale", "behave.pkl", *s10, "--capacity", "none.pkl", *priced),
        "capacity without deadline": ("fedscale", "behave.pkl", *s10, "--capacity", "capacity.pkl",
                                      "--batch-size", "4", "--local-steps", "5"),
        "deadline without capacity": ("fedscale", "behave.pkl", *s10, "--deadline", "5"),
        "deadline negative": ("fedscale", "behave.pkl", *s10, "--capacity", "capacity.pkl", "--deadline", "-1",
                              "--batch-size", "4", "--local-steps", "5"),
        "model kbits nan": ("fedscale", "behave.pkl", *s10, "--capacity", "capacity.pkl", *priced,
                            "--model-kbits", "nan"),
        "capacity for flash": ("flash", "flash.json", *s10, "--capacity", "capacity.pkl", *priced),
        "work-out without capacity": ("fedscale", "behave.pkl", *s10, "--work-out", "w.csv"),
        "work-out exists": ("fedscale", "behave.pkl", *s10, "--capacity", "capacity.pkl", *priced, "--work-out",
                            "mine.csv"),
        "assign for flash": ("flash", "flash.json", *s10, "--assign", "fedscale"),
        "ready truncated": ("ready", "ready_trunc.json", *s10),
        "ready reversed": ("ready", "ready_reversed.json", *s10),
        "ready nan": ("ready", "ready_nan.json", *s10),
        "ready shape": ("ready", "ready_shape.json", *s10),
        "ready not an object": ("ready", "ready_list.json", *s10),
        "ready start not seconds": ("ready", "ready_good.json", *s10, "--start", "noon"),
        "ready without round seconds": ("ready", "ready_good.json"),
        "flash start bad": ("flash", "flash.json", *s10, "--start", "2020-13-01 00:00:00"),
        "window negative": ("flash", "flash.json", *s10, "--window", "-1"),
        "window nan": ("flash", "flash.json", *s10, "--window", "nan"),
        "window for fedscale": ("fedscale", "behave.pkl", *s10, "--window", "5"),
        "start for fedscale": ("fedscale", "behave.pkl", *s10, "--start", "earliest"),
        "skip for a matrix": ("matrix", "labels_two.csv", "--skip-bad-devices"),
        "index column for flash": ("flash", "flash.json", *s10, "--index-column", "yes"),
        "index column for npy": ("matrix", "m.npy", "--index-column", "yes"),
        "labels ragged": ("matrix", "labels_ragged.csv"),
        "labels bad cell": ("matrix", "labels_cell.csv"),
        "labels empty cell": ("matrix", "labels_empty.csv"),
        "labels header width": ("matrix", "labels_header.csv"),
        "labels not 0/1": ("matrix", "labels_two.csv"),
        "labels no data": ("matrix", "labels_only.csv"),
        "plot not a figure": ("matrix", "labels_two.csv", "--plot", "raster.txt"),
        "plot over a user's file": ("fedscale", "behave.pkl", *s10, "--plot", "user.png"),
    }


TYPED = ("capacity runs code", "capacity integer too large for a float", "capacity zero bandwidth", "capacity without deadline", "work-out exists",
         "ready reversed", "flash start bad", "window for fedscale", "labels bad cell", "index column for npy")


def _command(folder, args: tuple[str, ...]) -> list[str]:
    resolved = [str(folder / a) if (folder / a).suffix in (".pkl", ".json", ".csv", ".npy", ".txt", ".png") else a
                for a in args]
    return ["participation", "import", *resolved, "--out", str(folder / "out.csv")]


def test_hostile_inputs_as_a_user_types_them(tmp_path):
    cases = _hostile(tmp_path)
    for case, proc in zip(TYPED, run_cli_together([tuple(_command(tmp_path, cases[c])) for c in TYPED])):
        assert_one_line_error(proc, 2)
        assert not (tmp_path / "out.csv").exists() and not (tmp_path / "w.csv").exists(), case
    assert not (tmp_path / "marker").exists()  # the capacity pickle that opens a file never ran
    assert (tmp_path / "mine.csv").read_text() == "round,client,steps\n"


def test_every_hostile_input_is_one_line_exit_2_in_process(tmp_path, capsys):
    for case, args in _hostile(tmp_path).items():
        assert main(_command(tmp_path, args)) == 2, case
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, (case, err)
        assert not (tmp_path / "out.csv").exists() and not (tmp_path / "w.csv").exists(), case
    assert not (tmp_path / "marker").exists()
    assert (tmp_path / "user.png").read_text() == "a user's picture" and not (tmp_path / "raster.txt").exists()


def test_new_inputs_are_size_checked_before_they_are_read(tmp_path, monkeypatch):
    (tmp_path / "ready.json").write_text('{"u": [[0, 20]]}')
    (tmp_path / "behave.pkl").write_bytes(pickle.dumps(BEHAVE))
    (tmp_path / "capacity.pkl").write_bytes(pickle.dumps(CAPACITY))
    (tmp_path / "m.csv").write_text(",a\nx,1\n")
    monkeypatch.setattr(parsing, "MAX_JSON_BYTES", 8)
    with pytest.raises(DataError, match="more than the 8 B"):
        import_trace("ready", tmp_path / "ready.json", ImportOptions(round_seconds=5))
    monkeypatch.setattr(matrix_files, "MAX_MATRIX_CSV_BYTES", 4)
    with pytest.raises(DataError, match="more than the 4 B"):
        import_trace("matrix", tmp_path / "m.csv", ImportOptions())
    monkeypatch.undo()
    capacity = CapacityOptions(tmp_path / "capacity.pkl", 10.0, 4, 0.0, 5)
    calls = []
    real = capacity_file.read_plain_pickle

    def spy(path, what):
        calls.append(what)
        return real(path, what)

    monkeypatch.setattr(capacity_file, "read_plain_pickle", spy)
    import_trace("fedscale", tmp_path / "behave.pkl", ImportOptions(round_seconds=10), capacity)
    assert any("device capacity" in what for what in calls)  # the safe, size-checked unpickler


def test_import_help_lists_the_new_options():
    proc = run_main("participation", "import", "--help")
    assert proc.returncode == 0, proc.stderr
    for option in ("--start", "--window", "--skip-bad-devices", "--assign", "--index-column", "--capacity",
                   "--work-out", "--plot"):
        assert option in proc.stdout


# -- a reader that has gone ------------------------------------------------------------------
def _closed_reader(args: list[str]) -> subprocess.CompletedProcess:
    """``focusfl ARGS | head -1`` at its worst: the reader has gone before the first line (its end
    of the pipe is closed before focusfl starts), so every print meets a broken pipe."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([*focusfl_command(), *args], stdout=write, stderr=subprocess.PIPE, text=True,
                              env=cli_env(), timeout=300)
    finally:
        os.close(write)


def test_an_import_into_a_closed_reader_writes_every_output(tmp_path):
    behave, capacity = tmp_path / "client_behave_trace", tmp_path / "client_device_capacity"
    behave.write_bytes(pickle.dumps(BEHAVE))
    capacity.write_bytes(pickle.dumps(CAPACITY))
    matrix = tmp_path / "m.csv"
    matrix.write_text("1,0,1\n0,1,1\n")
    forms = {
        "matrix --out": (["matrix", str(matrix)], ["--out"]),
        "fedscale --out --work-out --plot": (["fedscale", str(behave), "--round-seconds", "10", "--capacity",
                                              str(capacity), "--deadline", "12", "--batch-size", "20",
                                              "--local-steps", "8"], ["--out", "--work-out", "--plot"]),
        "matrix --plot": (["matrix", str(matrix)], ["--plot"]),
    }
    for k, (form, (args, outputs)) in enumerate(forms.items()):
        files = {"--out": tmp_path / f"t{k}.csv", "--work-out": tmp_path / f"w{k}.csv", "--plot": tmp_path / f"p{k}.png"}
        proc = _closed_reader(["participation", "import", *args,
                               *(a for o in outputs for a in (o, str(files[o])))])
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (form, proc.stderr)
        for option in outputs:
            assert files[option].is_file() and files[option].stat().st_size > 0, (form, option)

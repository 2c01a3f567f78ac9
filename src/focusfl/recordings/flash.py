"""FLASH's recordings (PKU-Chengxu/FLASH): its state traces (``data/state_traces.json``, timestamped
device events; a device is ready while charging, on WiFi and idle, with spells found as FLASH's
Timer finds them) and its ready windows (lh-ycx/leaf ``data/ready_strict.json``, ``{uid: [[start,
end], ...]}`` in seconds). The options: importing.py."""
from __future__ import annotations

import math
import re
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, DataError
from .parsing import (Availability, ImportedTrace, ImportOptions, as_float, availability_mask, check_mask_size,
                      first_clients, merged, ordered_ids, parse_devices, read_json, rounds_for)


# A ready spell "[a, b]," of 6 or more bytes parses to a list of two floats (about 130 bytes).
READY_JSON_BYTES_PER_BYTE = 32
TIME_FORMAT = "%Y-%m-%d %H:%M:%S"
# FLASH's time 0 (models/timer.py, Timer.refer_time): its rounds' clock starts there.
FLASH_REFER_TIME = "2020-01-02 00:00:00"
EARLIEST = "earliest"
# Each state event sets (condition, value); None: read and ignored.
FLASH_EVENTS: dict[str, tuple[str, bool] | None] = {
    "battery_charged_on": ("charging", True), "battery_charged_off": ("charging", False),
    "wifi": ("wifi", True), "unknown": ("wifi", False), "2g": ("wifi", False), "3g": ("wifi", False),
    "4g": ("wifi", False), "5g": ("wifi", False),
    "screen_on": ("screen_off", False), "screen_off": ("screen_off", True),
    "screen_lock": ("locked", True), "screen_unlock": ("locked", False),
    "battery_low": None, "battery_okay": None, "phone_on": None, "phone_off": None,
}
BATTERY_LEVEL = re.compile(r"\d+(\.\d+)?%")


def read_flash(path: Path, options: ImportOptions) -> ImportedTrace:
    what = f"FLASH trace {path.name!r}"
    data = read_json(path, what)
    if not isinstance(data, dict) or not data:
        raise DataError(f"{what} must hold a non-empty JSON object of devices (uid -> its messages), "
                        f"got {type(data).__name__}")
    ids = ordered_ids(list(data)) if options.assign == "flash" else first_clients(options, ordered_ids(list(data)))
    ids, events, skipped = parse_devices(what, ids, [data[key] for key in ids],
                                    lambda key, entry: _flash_events(what, key, entry), options)
    if not any(times for times, _ in events):
        raise DataError(f"{what}: no device has any event")
    backward = [str(key) for key, (times, _) in zip(ids, events) if any(b < a for a, b in zip(times, times[1:]))]
    names = [str(k) for k in ids]
    if options.assign == "flash":
        drawn = flash_assignment(len(ids), options.clients or len(ids), options.seed)
        names = [f"{k}:{names[d]}" for k, d in enumerate(drawn)]
        events = [events[d] for d in drawn]
    start = flash_start(options.start, min(min(times) for times, _ in events if times))
    devices = [_flash_device(times, states, options) for times, states in events]
    last = max(max(times) for times, _ in events if times)
    # Default: the rounds from the start to the last event; a recording that ends before the start
    # (FLASH replays each device's own span, wrapped, at any time) gets its longest device's span.
    span = last - start if last > start else max(d.span for d in devices)
    rounds = rounds_for(options, span)
    check_mask_size(rounds, len(devices), what)
    mask = availability_mask(devices, options.round_seconds, rounds, options.rule, start=start + options.window)
    ready = " and ".join({"idle": f"idle ({options.idle.replace('_', ' ')})"}.get(c, c) for c in options.ready)
    source = (f"flash {path.name!r}, {options.round_seconds:g} s rounds from {_when(start)}, ready = {ready}, "
              f"{_checked_when(options)}")
    if options.assign == "flash":
        source += f", FLASH's assignment (each client a recording drawn with replacement, seed {options.seed})"
    return ImportedTrace(mask, names, source=source, skipped=skipped, backward=backward,
                         offered=None if options.assign == "flash" else len(data))


def flash_assignment(recordings: int, clients: int, seed: int) -> np.ndarray:
    """FLASH's kind of assignment: each of ``clients`` clients replays a recording drawn uniformly
    with replacement, here from NumPy's PCG64 seeded with ``seed`` (the same draw on any machine;
    not FLASH's own generator): the indices into the recordings in id order."""
    return np.random.default_rng(seed).integers(0, recordings, size=clients)


def _checked_when(options: ImportOptions) -> str:
    at = f"{options.window:g} s into the round" if options.window else "the round's start"
    return f"at {at}" + (" and until its end" if options.rule == "whole" else "")


def flash_start(start: str | None, earliest: float) -> float:
    """The clock's time 0 in seconds: FLASH's refer_time by default, ``earliest`` (the file's first
    event), or a time YYYY-mm-dd HH:MM:SS."""
    if start is None:
        start = FLASH_REFER_TIME
    if start == EARLIEST:
        return earliest
    try:
        return (datetime.strptime(start.strip(), TIME_FORMAT) - EPOCH).total_seconds()
    except ValueError:
        raise ConfigError(f"--start must be a time YYYY-mm-dd HH:MM:SS or {EARLIEST!r}, got {start[:40]!r}") from None
EPOCH = datetime(1970, 1, 1)


def _flash_events(what: str, key: Any, entry: Any) -> tuple[list[float], list[str]]:
    """(times in seconds, states) of one device, in the file's order (FLASH's Timer reads them so,
    whether or not time goes back)."""
    where = f"{what}: device {key!r}"
    if not isinstance(entry, dict) or not isinstance(entry.get("messages"), str):
        raise DataError(f"{where} must be an object whose 'messages' is a string of 'time<TAB>state' lines")
    times, states = [], []
    for number, line in enumerate(entry["messages"].split("\n"), start=1):
        if not line.strip():
            continue
        parts = line.strip().split("\t")
        if len(parts) != 2:
            raise DataError(f"{where} line {number} is not 'YYYY-mm-dd HH:MM:SS<TAB>state': {line[:60]!r}")
        stamp, state = parts[0].strip(), parts[1].strip().lower()
        try:
            seconds = (datetime.strptime(stamp, TIME_FORMAT) - EPOCH).total_seconds()
        except ValueError:
            raise DataError(f"{where} line {number}: {stamp[:30]!r} is not a time YYYY-mm-dd HH:MM:SS") from None
        if state not in FLASH_EVENTS and not BATTERY_LEVEL.fullmatch(state):
            raise DataError(f"{where} line {number}: unknown state {state[:30]!r}")
        times.append(seconds)
        states.append(state)
    return times, states


def _flash_device(times: list[float], states: list[str], options: ImportOptions) -> Availability:
    """The device's ready spells as FLASH's Timer finds them (models/timer.py): a spell opens at
    the first event after which every condition of ``ready`` holds and closes at the first event
    after which one does not; a spell still open at the last event is not kept (the Timer only
    appends closed spells). The clock wraps around the device's own span, first to last event in
    the file's order, and reads whole seconds (the Timer's int()). Where time goes back, a spell
    may close before it opens: merged() keeps it apart and no time is inside it, as in FLASH's
    merge and its start <= now <= end; a last event before the first gives a negative span,
    which FLASH's modulo (Python's, the sign of the divisor) reads backwards from the first
    event (:func:`_covered`)."""
    if len(times) < 2 or times[-1] == times[0]:  # the Timer's int(trace_end - trace_start) == 0: never ready
        return Availability(np.zeros(0), np.zeros(0), origin=times[0] if times else 0.0, span=0.0)
    need = [options.idle if c == "idle" else c for c in options.ready]
    held = {"charging": False, "wifi": False, "screen_off": False, "locked": False}
    spells, opened = [], None
    for seconds, state in zip(times, states):
        event = FLASH_EVENTS.get(state)
        if event is not None:
            held[event[0]] = event[1]
        ready = all(held[c] for c in need)
        if ready and opened is None:
            opened = seconds
        elif not ready and opened is not None:
            spells.append((opened, seconds))
            opened = None
    starts, ends = merged(spells)
    return Availability(starts, ends, origin=times[0], span=times[-1] - times[0], truncate=True)


def _when(seconds: float) -> str:
    return (EPOCH + timedelta(seconds=seconds)).strftime(TIME_FORMAT)


def read_ready(path: Path, options: ImportOptions) -> ImportedTrace:
    """FLASH's ready windows (lh-ycx/leaf ``data/ready_strict.json``, written by
    models/utils/plot.py ``static_ready``): ``{uid: [[start, end], ...]}``, each device's
    charging spells in seconds from the file's reference time. A device is available in its
    spells (closed: FLASH's ``item[0] <= now <= item[1]``); the clock does not wrap (the file has
    no recording span): round r covers [start + r S, start + (r + 1) S), start = --start seconds
    (default 0, the file's reference time)."""
    what = f"FLASH ready windows {path.name!r}"
    data = read_json(path, what, READY_JSON_BYTES_PER_BYTE)
    if not isinstance(data, dict) or not data:
        raise DataError(f"{what} must hold a non-empty JSON object of devices (uid -> its [start, end] spells), "
                        f"got {type(data).__name__}")
    start = ready_start(options.start)
    ids = first_clients(options, ordered_ids(list(data)))
    ids, devices, skipped = parse_devices(what, ids, [data[key] for key in ids],
                                     lambda key, entry: _ready_device(what, key, entry), options)
    last = max((float(d.ends[-1]) for d in devices if d.ends.size), default=start)
    rounds = rounds_for(options, last - start)
    check_mask_size(rounds, len(devices), what)
    mask = availability_mask(devices, options.round_seconds, rounds, options.rule, start=start + options.window)
    source = (f"ready {path.name!r}, {options.round_seconds:g} s rounds from {start:g} s, "
              f"available in its spells {_checked_when(options)}")
    impossible = {str(k): d.impossible for k, d in zip(ids, devices) if d.impossible}
    return ImportedTrace(mask, [str(k) for k in ids], source=source, skipped=skipped, offered=len(data),
                         impossible=impossible)


def ready_start(start: str | None) -> float:
    if start is None:
        return 0.0
    try:
        value = float(start)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise ConfigError(f"--start of a ready trace is a number of seconds, got {start[:40]!r}")
    return value


def _ready_device(what: str, key: Any, entry: Any) -> Availability:
    where = f"{what}: device {key!r}"
    if not isinstance(entry, list):
        raise DataError(f"{where} must be a list of [start, end] spells in seconds, got {type(entry).__name__}")
    spells, impossible = [], 0
    for k, spell in enumerate(entry):
        if not isinstance(spell, list) or len(spell) != 2:
            raise DataError(f"{where}: spell {k} must be [start, end], got {str(spell)[:40]!r}")
        a, b = (_signed_seconds(where, f"spell {k}", v) for v in spell)
        if b < a:  # FLASH's start <= now <= end never matches it; the device's other spells stand
            impossible += 1
            continue
        spells.append((a, b))
    starts, ends = merged(spells)
    return Availability(starts, ends, origin=0.0, span=0.0, wraps=False, impossible=impossible)


def _signed_seconds(where: str, name: str, value: Any) -> float:
    number = as_float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
    if not math.isfinite(number):
        raise DataError(f"{where}: {name} must hold finite numbers of seconds, got {str(value)[:30]!r}")
    return number

"""Recorded availability traces in other formats, converted to focusfl's participation trace.

``focusfl participation import FORMAT PATH --round-seconds S --out trace.csv`` reads one of

- ``fedscale``: FedScale's client behaviour trace (``client_behave_trace``), a pickle of
  ``{client_id: {"active": [t, ...], "inactive": [t, ...], "finish_time": T, ...}}``: client i is
  available from active[k] to inactive[k] (seconds), and its trace repeats with period
  finish_time (FedScale's ``Client.isActive`` tests ``cur_time % finish_time``). Other keys
  (``duration``, ``model``) are ignored.
- ``flash``: FLASH's state traces (PKU-Chengxu/FLASH, ``data/state_traces.json``), a JSON object
  ``{uid: {"messages": "YYYY-mm-dd HH:MM:SS\\tstate\\n...", ...}}`` of timestamped device events:
  ``battery_charged_on/off``, ``wifi`` and ``2g/3g/4g/5g/unknown`` (not WiFi), ``screen_on/off``,
  ``screen_lock/unlock``, a battery level ``NN%``, and ``battery_low/okay``, ``phone_on/off``
  (read, no effect). A device is **ready** while every condition of ``ready`` holds (default
  all three, FLASH's rule after Google's FL system: charging, on WiFi and idle; ``idle`` means
  screen locked, as FLASH defines it, or screen off). All conditions are false before a
  device's first event, and a ready spell still open at its last event ends there. Every device
  replays its own recording on a common clock that starts at the earliest event of the file,
  wrapping around its own span as FLASH's ``Timer`` does.
- ``matrix``: an availability matrix, clients x rounds (as FedStale's participation matrix),
  0/1, in a .csv (an optional header line; ``#`` lines are comments) or an .npy file; every
  column is a round, so ``--round-seconds`` does not apply.

Round r of a time-based trace covers [r S, (r + 1) S) seconds (FLASH: from the common start).
``rule`` says when a client takes part in it: ``start`` (default) if it is available at the
round's start (FedScale's check when it selects clients), ``whole`` if it stays available
until the round's end. ``rounds`` defaults to the span of the recording (FedScale: the longest
finish_time; FLASH: the common clock's span); ``clients`` keeps the first N devices (in the
order of their ids). Devices never available in the imported rounds are dropped (the trace
participation refuses a client that never takes part; they are named in the result).

Every input is untrusted: its size is checked before it is read and before the memory for
the parse and for the mask is allocated; a pickle is read by an unpickler that knows no class
or function (any global, extension or persistent reference is refused in one line, so a pickle
never runs code) and holds only dicts, lists, tuples, strings, numbers, booleans and None.
Bad files end in one line (DataError). Nothing here writes a file: :func:`trace_text` gives the
text that the command writes through focusfl.io.
"""
from __future__ import annotations

import io
import json
import math
import pickle
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..errors import ConfigError, DataError
from ..limits import check_allocation, human_bytes
from .statistics import ParticipationStats, summarize
from .trace import MAX_CSV_BYTES, TAG, read_matrix

RULES = ("start", "whole")
CONDITIONS = ("charging", "wifi", "idle")
IDLE = ("locked", "screen_off")
# Input caps: FedScale's whole client_behave_trace (107,749 clients) is tens of MiB; a FLASH
# JSON of every recorded device is larger, hence its cap.
MAX_PICKLE_BYTES = 256 << 20
MAX_JSON_BYTES = 512 << 20
# Memory of the parsed objects per byte of input: small ints and floats cost 24-32 bytes and a
# list slot 8 against 2-9 bytes of pickle; JSON strings and dicts cost about as much per byte.
PICKLE_BYTES_PER_BYTE = 24
JSON_BYTES_PER_BYTE = 12
# The mask (1 byte a cell) and its statistics' per-round tables (int64 delays and more).
MASK_BYTES_PER_CELL = 17
TIME_FORMAT = "%Y-%m-%d %H:%M:%S"
SHOWN_CLIENTS = 50  # rows of the per-client table the command prints


@dataclass(frozen=True)
class ImportOptions:
    """How a recording becomes rounds: see the module docstring."""

    round_seconds: float | None = None
    rounds: int | None = None
    clients: int | None = None
    rule: str = "start"
    ready: tuple[str, ...] = CONDITIONS  # flash
    idle: str = "locked"  # flash


@dataclass
class ImportedTrace:
    """A trace ``mask`` [rounds, clients] of the devices ``names`` (the dropped ones never took part)."""

    mask: np.ndarray
    names: list[str]
    dropped: list[str] = field(default_factory=list)
    source: str = ""

    def statistics(self) -> ParticipationStats:
        return summarize(self.mask)


@dataclass(frozen=True)
class Availability:
    """One device's availability: merged closed intervals [starts[k], ends[k]] (seconds), read on
    a clock that wraps around [origin, origin + span)."""

    starts: np.ndarray
    ends: np.ndarray
    origin: float
    span: float


# -- the command's entry point ---------------------------------------------------------------------
def import_trace(fmt: str, path: str | Path, options: ImportOptions) -> ImportedTrace:
    """The trace of the recording ``path`` in format ``fmt``; ConfigError for bad options,
    DataError (one line) for a bad file."""
    if fmt not in FORMATS:
        raise ConfigError(f"unknown trace format {fmt!r} (known: {', '.join(FORMATS)})")
    check_options(fmt, options)
    path = Path(path).expanduser()
    if not path.is_file():
        raise DataError(f"{fmt} trace: file {str(path)!r} not found")
    trace = FORMATS[fmt](path, options)
    return drop_never_available(trace)


def check_options(fmt: str, options: ImportOptions) -> None:
    seconds = options.round_seconds
    if fmt == "matrix":
        if seconds is not None:
            raise ConfigError("--round-seconds applies to fedscale and flash traces; a matrix's columns are rounds")
    elif seconds is None:
        raise ConfigError(f"a {fmt} trace is timed: give the length of a round with --round-seconds S")
    elif not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds > 0):
        raise ConfigError(f"--round-seconds must be a positive number, got {seconds!r}")
    for name in ("rounds", "clients"):
        value = getattr(options, name)
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ConfigError(f"--{name} must be an integer >= 1, got {value!r}")
    if options.rule not in RULES:
        raise ConfigError(f"--rule must be one of {', '.join(RULES)}, got {options.rule!r}")
    if fmt != "flash" and (options.ready != CONDITIONS or options.idle != "locked"):
        raise ConfigError("--ready and --idle apply to flash traces only")
    unknown = [c for c in options.ready if c not in CONDITIONS]
    if unknown or not options.ready:
        raise ConfigError(f"--ready takes a comma list of {', '.join(CONDITIONS)}, got {','.join(options.ready)!r}")
    if options.idle not in IDLE:
        raise ConfigError(f"--idle must be one of {', '.join(IDLE)}, got {options.idle!r}")


def drop_never_available(trace: ImportedTrace) -> ImportedTrace:
    seen = trace.mask.any(axis=0)
    if seen.all():
        return trace
    if not seen.any():
        raise DataError(f"{trace.source}: no device is available in any of the {trace.mask.shape[0]} rounds imported")
    keep = np.flatnonzero(seen)
    dropped = [name for name, ok in zip(trace.names, seen) if not ok]
    return ImportedTrace(trace.mask[:, keep], [trace.names[k] for k in keep], trace.dropped + dropped, trace.source)


def trace_text(trace: ImportedTrace) -> str:
    """The trace file: the tag line saying where it came from, a header naming the devices, and one
    0/1 row per round (focusfl's trace format, participation/trace.py)."""
    rounds, clients = trace.mask.shape
    source = re.sub(r"[\r\n]", " ", trace.source)  # one comment line whatever a file name holds
    lines = [f"{TAG}: {source}, {rounds} rounds x {clients} clients",
             ",".join(_column_name(name) for name in trace.names)]
    lines += [",".join("1" if v else "0" for v in row) for row in trace.mask]
    return "\n".join(lines) + "\n"


def statistics_lines(trace: ImportedTrace, shown: int = SHOWN_CLIENTS) -> list[str]:
    """What the command prints: the trace's size, the devices dropped, and its statistics (p_i, q_i
    and the delays tau_max, tau_avg as FedSUM defines them; participation/statistics.py)."""
    stats = trace.statistics()
    rounds, clients = trace.mask.shape
    lines = [trace.source, f"{rounds} rounds x {clients} clients"]
    if trace.dropped:
        names = ", ".join(trace.dropped[:10]) + (f" and {len(trace.dropped) - 10} more" if len(trace.dropped) > 10 else "")
        lines.append(f"dropped {len(trace.dropped)} device(s) never available in these rounds: {names}")
    lines += [f"mean active per round {stats.mean_active:.3f}, empty rounds {stats.empty_rounds}",
              f"tau_max {stats.tau_max}, tau_avg {stats.tau_avg:.3f}",
              f"p_i: min {stats.p.min():.4f}, mean {stats.p.mean():.4f}, max {stats.p.max():.4f}; "
              f"q_i: min {stats.q.min():.4f}, mean {stats.q.mean():.4f}, max {stats.q.max():.4f}",
              f"{'client':>6} {'device':>16} {'p (empirical)':>14} {'q (empirical)':>14}"]
    for i in range(min(clients, shown)):
        lines.append(f"{i:>6} {trace.names[i][:16]:>16} {stats.p[i]:>14.4f} {stats.q[i]:>14.4f}")
    if clients > shown:
        lines.append(f"... and {clients - shown} more clients")
    return lines


def check_trace_size(trace: ImportedTrace) -> None:
    """ConfigError when the trace would be more CSV than focusfl reads back as a trace."""
    rounds, clients = trace.mask.shape
    nbytes = rounds * 2 * clients
    if nbytes > MAX_CSV_BYTES:
        raise ConfigError(f"the trace would be {human_bytes(nbytes)} of CSV ({rounds:,} rounds x {clients:,} clients), "
                          f"more than the {human_bytes(MAX_CSV_BYTES)} a trace may hold; import fewer --rounds or --clients")


def _column_name(name: str) -> str:
    """A device id as a CSV header cell: ``client_ID`` (never numeric, so the trace reader takes the
    line as a header), with commas, quotes and line breaks replaced."""
    return "client_" + re.sub(r"[,\"\r\n]", "_", name)


# -- time-based traces -----------------------------------------------------------------------------
def availability_mask(devices: list[Availability], round_seconds: float, rounds: int, rule: str,
                      start: float = 0.0) -> np.ndarray:
    """[rounds, devices] bool: round r (covering [start + r S, start + (r + 1) S)) by ``rule``."""
    begin = start + round_seconds * np.arange(rounds, dtype=np.float64)
    mask = np.zeros((rounds, len(devices)), dtype=bool)
    for k, device in enumerate(devices):
        mask[:, k] = _covered(device, begin, round_seconds if rule == "whole" else 0.0)
    return mask


def _covered(device: Availability, begin: np.ndarray, length: float) -> np.ndarray:
    """Whether the device is available throughout [t, t + length] for each t of ``begin``."""
    if device.starts.size == 0 or device.span <= 0:
        return np.zeros(begin.shape, dtype=bool)
    if length >= device.span:  # the window sees every time of the recording
        whole = _cover(device, np.array([device.origin]), np.array([device.origin + device.span]))
        return np.full(begin.shape, bool(whole[0]))
    a = device.origin + np.mod(begin - device.origin, device.span)
    b = a + length
    end = device.origin + device.span
    inside = b <= end
    ok = _cover(device, a, np.minimum(b, end))
    # A window that crosses the end of the recording continues at its start.
    wrapped = _cover(device, np.full(a.shape, device.origin), device.origin + (b - end))
    return ok & (inside | wrapped)


def _cover(device: Availability, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Whether one merged interval holds [a, b], elementwise."""
    k = np.searchsorted(device.starts, a, side="right") - 1
    found = k >= 0
    k = np.clip(k, 0, None)
    return found & (device.ends[k] >= b)


def merged(intervals: list[tuple[float, float]]) -> tuple[np.ndarray, np.ndarray]:
    """Sorted, merged closed intervals (touching ones joined) as (starts, ends)."""
    ordered = sorted(intervals)
    starts: list[float] = []
    ends: list[float] = []
    for a, b in ordered:
        if starts and a <= ends[-1]:
            ends[-1] = max(ends[-1], b)
        else:
            starts.append(a)
            ends.append(b)
    return np.array(starts, dtype=np.float64), np.array(ends, dtype=np.float64)


def _rounds_for(options: ImportOptions, span: float) -> int:
    """``--rounds``, else the rounds that cover the recording's span (at least one)."""
    return options.rounds if options.rounds is not None else max(1, math.ceil(span / options.round_seconds))


def _check_mask_size(rounds: int, clients: int, what: str) -> None:
    check_allocation(rounds * clients * MASK_BYTES_PER_CELL,
                     f"{what}: {rounds:,} rounds x {clients:,} clients", error=ConfigError)


def _ordered_ids(keys: list) -> list:
    """Device ids in a stable order: numerically when every id is an integer, else as text."""
    if all(isinstance(k, int) and not isinstance(k, bool) or (isinstance(k, str) and re.fullmatch(r"-?\d+", k))
           for k in keys):
        return sorted(keys, key=lambda k: (int(k), str(k)))
    return sorted(keys, key=str)


def _first(options: ImportOptions, ids: list) -> list:
    return ids if options.clients is None else ids[: options.clients]


# -- FedScale ----------------------------------------------------------------------------------
class _PlainUnpickler(pickle.Unpickler):
    """Knows no class and no function: a pickle that names one (the only way a pickle runs code:
    GLOBAL, STACK_GLOBAL, INST, EXT*) is refused before anything is called."""

    def __init__(self, data: bytes, what: str) -> None:
        super().__init__(io.BytesIO(data))
        self.what = what

    def find_class(self, module: str, name: str):
        raise DataError(f"{self.what} refers to {module}.{name}; only plain dicts, lists, strings and numbers "
                        "are read from a pickle (a reference to a class or function could run code)")

    def persistent_load(self, pid):
        raise DataError(f"{self.what} holds a persistent reference; only plain dicts, lists, strings and numbers "
                        "are read from a pickle")


PLAIN = (dict, list, tuple, str, int, float, bool, type(None))


def read_plain_pickle(path: Path, what: str) -> Any:
    """The plain data in the pickle ``path`` (size-checked first), never running code; DataError
    with one line for anything else."""
    size = path.stat().st_size
    if size > MAX_PICKLE_BYTES:
        raise DataError(f"{what} is {human_bytes(size)}, more than the {human_bytes(MAX_PICKLE_BYTES)} read from a pickle")
    check_allocation(size * PICKLE_BYTES_PER_BYTE, f"{what} ({human_bytes(size)} of pickle)")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DataError(f"{what}: cannot read it ({_first_line(exc)})") from None
    try:
        value = _PlainUnpickler(data, what).load()
    except DataError:
        raise
    except EOFError:
        raise DataError(f"{what} is truncated (the pickle ends before its STOP)") from None
    except (pickle.UnpicklingError, ValueError, TypeError, AttributeError, IndexError, KeyError, OverflowError,
            RecursionError, UnicodeDecodeError, MemoryError) as exc:
        raise DataError(f"{what} is not a readable pickle ({type(exc).__name__}: {_first_line(exc)})") from None
    _check_plain(value, what)
    return value


def _check_plain(value: Any, what: str) -> None:
    """Refuse any object but the plain ones, walking the structure without recursion (a pickle may
    nest deeply or refer to itself)."""
    stack, seen = [value], set()
    while stack:
        item = stack.pop()
        if type(item) not in PLAIN:
            raise DataError(f"{what} holds a {type(item).__name__}; only dicts, lists, tuples, strings, numbers, "
                            "booleans and None are read from a pickle")
        if isinstance(item, (dict, list, tuple)) and id(item) not in seen:
            seen.add(id(item))
            stack.extend(item.keys() if isinstance(item, dict) else ())
            stack.extend(item.values() if isinstance(item, dict) else item)


def read_fedscale(path: Path, options: ImportOptions) -> ImportedTrace:
    what = f"FedScale trace {path.name!r}"
    data = read_plain_pickle(path, what)
    if not isinstance(data, dict) or not data:
        raise DataError(f"{what} must hold a non-empty dict of clients (client id -> its behaviour), "
                        f"got {type(data).__name__}")
    ids = _first(options, _ordered_ids(list(data)))
    devices = [_fedscale_client(what, key, data[key]) for key in ids]
    rounds = _rounds_for(options, max(d.span for d in devices))
    _check_mask_size(rounds, len(devices), what)
    mask = availability_mask(devices, options.round_seconds, rounds, options.rule)
    source = f"fedscale {path.name!r}, {options.round_seconds:g} s rounds, availability at the round's " + \
        ("start" if options.rule == "start" else "start and throughout")
    return ImportedTrace(mask, [str(k) for k in ids], source=source)


def _fedscale_client(what: str, key: Any, entry: Any) -> Availability:
    where = f"{what}: client {key!r}"
    if not isinstance(entry, dict):
        raise DataError(f"{where} must be a dict with active, inactive and finish_time, got {type(entry).__name__}")
    missing = [k for k in ("active", "inactive", "finish_time") if k not in entry]
    if missing:
        raise DataError(f"{where} has no {missing[0]!r}")
    period = _seconds(where, "finish_time", entry["finish_time"])
    if period <= 0:
        raise DataError(f"{where}: finish_time must be positive, got {entry['finish_time']!r}")
    active, inactive = (_times(where, name, entry[name]) for name in ("active", "inactive"))
    if len(active) != len(inactive):
        raise DataError(f"{where}: {len(active)} active times and {len(inactive)} inactive times (one of each per spell)")
    for a, b in zip(active, inactive):
        if b < a:
            raise DataError(f"{where}: a spell becomes inactive at {b:g} s before it becomes active at {a:g} s")
    starts, ends = merged(list(zip(active, inactive)))
    return Availability(starts, ends, origin=0.0, span=period)


def _seconds(where: str, name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DataError(f"{where}: {name} must be a number of seconds, got {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number):
        raise DataError(f"{where}: {name} must be finite, got {value!r}")
    if number < 0:
        raise DataError(f"{where}: {name} must not be negative, got {value!r}")
    return number


def _times(where: str, name: str, value: Any) -> list[float]:
    if not isinstance(value, (list, tuple)):
        raise DataError(f"{where}: {name} must be a list of times in seconds, got {type(value).__name__}")
    return [_seconds(where, f"{name}[{k}]", v) for k, v in enumerate(value)]


# -- FLASH -------------------------------------------------------------------------------------
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
    data = _read_json(path, what)
    if not isinstance(data, dict) or not data:
        raise DataError(f"{what} must hold a non-empty JSON object of devices (uid -> its messages), "
                        f"got {type(data).__name__}")
    ids = _first(options, _ordered_ids(list(data)))
    events = [_flash_events(what, key, data[key]) for key in ids]
    if not any(times for times, _ in events):
        raise DataError(f"{what}: no device has any event")
    origin = min(times[0] for times, _ in events if times)
    devices = [_flash_device(times, states, options) for times, states in events]
    last = max((d.origin + d.span for d in devices), default=origin)
    rounds = _rounds_for(options, last - origin)
    _check_mask_size(rounds, len(devices), what)
    mask = availability_mask(devices, options.round_seconds, rounds, options.rule, start=origin)
    ready = " and ".join({"idle": f"idle ({options.idle.replace('_', ' ')})"}.get(c, c) for c in options.ready)
    source = (f"flash {path.name!r}, {options.round_seconds:g} s rounds from {_when(origin)}, ready = {ready}, "
              f"at the round's " + ("start" if options.rule == "start" else "start and throughout"))
    return ImportedTrace(mask, [str(k) for k in ids], source=source)


def _read_json(path: Path, what: str) -> Any:
    size = path.stat().st_size
    if size > MAX_JSON_BYTES:
        raise DataError(f"{what} is {human_bytes(size)}, more than the {human_bytes(MAX_JSON_BYTES)} read as JSON")
    check_allocation(size * JSON_BYTES_PER_BYTE, f"{what} ({human_bytes(size)} of JSON)")
    try:
        return json.loads(path.read_bytes())
    except OSError as exc:
        raise DataError(f"{what}: cannot read it ({_first_line(exc)})") from None
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and bad UTF-8 are ValueErrors
        raise DataError(f"{what} is not valid JSON ({_first_line(exc)})") from None


EPOCH = datetime(1970, 1, 1)


def _flash_events(what: str, key: Any, entry: Any) -> tuple[list[float], list[str]]:
    """(times in seconds, states) of one device, in the file's order; timestamps never go back."""
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
        if times and seconds < times[-1]:
            raise DataError(f"{where} line {number}: time {stamp} is before the previous event's")
        times.append(seconds)
        states.append(state)
    return times, states


def _flash_device(times: list[float], states: list[str], options: ImportOptions) -> Availability:
    """The device's ready spells (FLASH's Timer): ready while every condition of ``ready`` holds."""
    if len(times) < 2 or times[-1] == times[0]:
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
    if opened is not None:
        spells.append((opened, times[-1]))
    starts, ends = merged(spells)
    return Availability(starts, ends, origin=times[0], span=times[-1] - times[0])


def _when(seconds: float) -> str:
    return (EPOCH + timedelta(seconds=seconds)).strftime(TIME_FORMAT)


# -- availability matrices ------------------------------------------------------------------------
def read_availability_matrix(path: Path, options: ImportOptions) -> ImportedTrace:
    """A clients x rounds 0/1 matrix (.csv or .npy) as a rounds x clients trace."""
    kind = "availability matrix"
    data = read_matrix(path, kind)  # size-checked before it is read
    clients, recorded = data.shape
    if options.rounds is not None and options.rounds > recorded:
        raise ConfigError(f"--rounds {options.rounds} is more than the {recorded} rounds (columns) of {path.name!r}; "
                          "a trace wraps around when replayed")
    if data.dtype != bool:
        bad = ~np.isin(data, (0, 1))
        if bad.any():
            client, column = (int(v) for v in np.argwhere(bad)[0])
            raise DataError(f"{kind}: {path.name!r} must contain only 0 and 1, found {data[client, column].item():g} "
                            f"for client {client} (row {client + 1}) in round {column}")
    keep = clients if options.clients is None else min(options.clients, clients)
    rounds = recorded if options.rounds is None else options.rounds
    mask = np.ascontiguousarray(data[:keep, :rounds].astype(bool).T)
    return ImportedTrace(mask, [str(k) for k in range(keep)], source=f"availability matrix {path.name!r} (clients x rounds)")


FORMATS: dict[str, Callable[[Path, ImportOptions], ImportedTrace]] = {
    "fedscale": read_fedscale,
    "flash": read_flash,
    "matrix": read_availability_matrix,
}


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0] if text else type(exc).__name__

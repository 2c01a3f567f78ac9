"""Recorded availability traces in other formats, converted to focusfl's participation trace.

``focusfl participation import FORMAT PATH --round-seconds S --out trace.csv`` reads one of

- ``fedscale``: FedScale's client behaviour trace (``client_behave_trace``), a pickle of
  ``{client_id: {"active": [t, ...], "inactive": [t, ...], "finish_time": T, ...}}``: client i is
  available from active[k] to inactive[k] (seconds), and its trace repeats with period
  finish_time (FedScale's ``Client.isActive`` tests ``cur_time % finish_time``); ``semantics``
  ``fedscale`` walks the spells as FedScale's ``ClientMetadata.is_active`` does instead
  (:func:`fedscale_walk_mask`). Other keys
  (``duration``, ``model``) are ignored. ``assign``: ``sorted`` (client k replays the k-th id in
  order) or ``fedscale`` (FedScale's own: client c = k + 1 replays ``keys[c % len]`` in the
  pickle's order). With FedScale's device capacity file (``client_device_capacity``) each device's
  local steps per round come from its speeds under a round deadline (work/capacity.py), written
  as a work trace beside the participation trace.
- ``flash``: FLASH's state traces (PKU-Chengxu/FLASH, ``data/state_traces.json``), a JSON object
  ``{uid: {"messages": "YYYY-mm-dd HH:MM:SS\\tstate\\n...", ...}}`` of timestamped device events:
  ``battery_charged_on/off``, ``wifi`` and ``2g/3g/4g/5g/unknown`` (not WiFi), ``screen_on/off``,
  ``screen_lock/unlock``, a battery level ``NN%``, and ``battery_low/okay``, ``phone_on/off``
  (read, no effect). A device is **ready** while every condition of ``ready`` holds (default
  all three, FLASH's rule after Google's FL system: charging, on WiFi and idle; ``idle`` means
  screen locked, as FLASH defines it, or screen off), with spells found as FLASH's Timer finds
  them (models/timer.py). Every device replays its own recording (first to last event), wrapped,
  on a common clock whose time 0 is FLASH's ``refer_time`` 2020-01-02 00:00:00 (``start``: another
  time, or ``earliest``, the file's first event), readiness checked ``window`` seconds into a
  round (FLASH's selection checks ``cur_time + time_window``).
- ``ready``: FLASH's ready windows (lh-ycx/leaf ``data/ready_strict.json``): ``{uid: [[start, end],
  ...]}`` in seconds from the file's reference time; no wrap.
- ``matrix``: an availability matrix, clients x rounds (FedStale's availability matrices), 0/1 or
  True/False, in a .csv (an optional header of round labels, an optional first column of client
  names as pandas writes a DataFrame; ``#`` lines are comments) or an .npy file; every column is
  a round, so ``--round-seconds`` does not apply.

Round r of a time-based trace covers [r S, (r + 1) S) seconds from the clock's start. ``rule``
says when a client takes part in it: ``start`` (default) if it is available at the round's start
(FedScale's check when it selects clients), ``whole`` if it stays available until the round's
end. ``rounds`` defaults to the span of the recording (FedScale: the longest finish_time; FLASH:
from the start to the last event; ready: to the last spell's end); ``clients`` keeps the first N
devices (in the order of their ids); a recording with fewer devices is imported whole, and the
command says so. Devices never available in the imported rounds are kept as empty columns
(``absent``: by default for a matrix) or dropped, and named; ``skip_bad_devices`` skips (and
names) devices whose records are malformed, as FLASH does.

Every input is untrusted: its size is checked before it is read and before the memory for
the parse and for the mask is allocated; a pickle is read by an unpickler that knows no class
or function (any global, extension or persistent reference is refused in one line, so a pickle
never runs code) and holds only dicts, lists, tuples, strings, numbers, booleans and None.
Bad files end in one line (DataError). Nothing here writes a file: :func:`trace_text` gives the
text that the command writes through focusfl.io.
"""
from __future__ import annotations

import csv
import io
import json
import math
import pickle
import re
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..errors import ConfigError, DataError
from ..limits import check_allocation, human_bytes
from ..participation.statistics import ParticipationStats, summarize
from ..participation.trace import CSV_BYTES_PER_BYTE, MAX_CSV_BYTES, TAG, read_matrix
from ..participation.trace import MAX_CSV_BYTES as MAX_MATRIX_CSV_BYTES  # what is read; MAX_CSV_BYTES: what is written

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
# A ready spell "[a, b]," of 6 or more bytes parses to a list of two floats (about 130 bytes).
READY_JSON_BYTES_PER_BYTE = 32
# A matrix CSV line costs its string and a row array (about 170 bytes) besides its text.
CSV_BYTES_PER_LINE = 192
# The mask (1 byte a cell) and its statistics' per-round tables (int64 delays and more).
MASK_BYTES_PER_CELL = 17
TIME_FORMAT = "%Y-%m-%d %H:%M:%S"
SHOWN_CLIENTS = 50  # rows of the per-client table the command prints


ASSIGNMENTS = ("sorted", "fedscale", "flash")
# What becomes of a device never available in the imported rounds: kept as an empty column (its
# index stays the recording's) or dropped; default: kept for a matrix (its rows are the
# experiment's clients, as FedStale reads them), dropped for a timed recording (a population
# sample, whose devices outside the imported rounds are no experiment's clients).
ABSENT = ("keep", "drop")
# How a FedScale trace is read each round: ``replay`` (every spell of every cycle, the recording
# as recorded) or ``fedscale`` (ClientMetadata.is_active's own walk through the spell list).
SEMANTICS = ("replay", "fedscale")
# FLASH's time 0 (models/timer.py, Timer.refer_time): its rounds' clock starts there.
FLASH_REFER_TIME = "2020-01-02 00:00:00"
EARLIEST = "earliest"


@dataclass(frozen=True)
class ImportOptions:
    """How a recording becomes rounds: see the module docstring."""

    round_seconds: float | None = None
    rounds: int | None = None
    clients: int | None = None
    rule: str = "start"
    ready: tuple[str, ...] = CONDITIONS  # flash
    idle: str = "locked"  # flash
    start: str | None = None  # flash: a time or "earliest" (default FLASH's refer_time); ready: seconds (default 0)
    window: float = 0.0  # flash, ready: readiness is checked this many seconds into the round
    skip_bad_devices: bool = False  # fedscale, flash, ready: import the rest, naming what was skipped
    assign: str = "sorted"  # fedscale, flash: which recording client k replays
    seed: int = 0  # --assign flash: the draw of each client's recording
    index_column: str = "auto"  # matrix: whether the first column names the clients
    absent: str | None = None  # keep or drop the devices never available (None: keep for matrix, else drop)
    semantics: str = "replay"  # fedscale: replay every spell, or FedScale's is_active walk


@dataclass
class ImportedTrace:
    """A trace ``mask`` [rounds, clients] of the devices ``names`` (the dropped ones never took part).

    ``offered``: the devices the recording holds; ``asked``: the --clients asked for (both for
    the command's note when fewer exist); ``skipped``: devices whose records were malformed and
    skipped (with the reason); ``steps``: each column's local steps per round, when the devices'
    speeds were imported too (a work trace); ``too_slow``: devices dropped because they cannot
    finish one local step before the round's deadline."""

    mask: np.ndarray
    names: list[str]
    dropped: list[str] = field(default_factory=list)
    source: str = ""
    offered: int | None = None
    asked: int | None = None
    skipped: list[str] = field(default_factory=list)
    steps: np.ndarray | None = None
    too_slow: list[str] = field(default_factory=list)
    absent: list[str] = field(default_factory=list)  # devices kept as columns that never take part
    impossible: dict[str, int] = field(default_factory=dict)  # device -> its spells skipped (end before start)
    backward: list[str] = field(default_factory=list)  # flash: devices whose time goes back, read in file order

    def statistics(self) -> ParticipationStats:
        return summarize(self.mask)


@dataclass(frozen=True)
class Availability:
    """One device's availability: merged closed intervals [starts[k], ends[k]] (seconds), read on
    a clock that wraps around [origin, origin + span) (``wraps``), the offset into it truncated
    to whole seconds as FLASH's ``int(...)`` does (``truncate``)."""

    starts: np.ndarray
    ends: np.ndarray
    origin: float
    span: float
    wraps: bool = True
    truncate: bool = False
    impossible: int = 0  # spells read and skipped: they end before they start (no time is inside one)
    listed: tuple[np.ndarray, np.ndarray] | None = None  # fedscale: (active, inactive) in the file's order


# -- the command's entry point ---------------------------------------------------------------------
def import_trace(fmt: str, path: str | Path, options: ImportOptions,
                 capacity: CapacityOptions | None = None) -> ImportedTrace:
    """The trace of the recording ``path`` in format ``fmt``; ConfigError for bad options,
    DataError (one line) for a bad file. ``capacity`` (fedscale only): the devices' speeds,
    which give each column its local steps per round (``steps``)."""
    if fmt not in FORMATS:
        raise ConfigError(f"unknown trace format {fmt!r} (known: {', '.join(FORMATS)})")
    check_options(fmt, options)
    if capacity is not None and fmt != "fedscale":
        raise ConfigError("--capacity applies to fedscale traces (FedScale's client_device_capacity)")
    path = Path(path).expanduser()
    if not path.is_file():
        raise DataError(f"{fmt} trace: file {str(path)!r} not found")
    trace = read_fedscale(path, options, capacity) if fmt == "fedscale" else FORMATS[fmt](path, options)
    trace.asked = options.clients
    return drop_never_available(trace, keep=keeps_absent(fmt, options))


def keeps_absent(fmt: str, options: ImportOptions) -> bool:
    """Whether devices never available stay as columns (see ABSENT)."""
    return options.absent == "keep" if options.absent is not None else fmt == "matrix"


def check_options(fmt: str, options: ImportOptions) -> None:
    seconds = options.round_seconds
    if fmt == "matrix":
        if seconds is not None:
            raise ConfigError("--round-seconds applies to fedscale, flash and ready traces; a matrix's columns are rounds")
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
    _only(fmt, ("flash",), "--ready and --idle", options.ready != CONDITIONS or options.idle != "locked")
    unknown = [c for c in options.ready if c not in CONDITIONS]
    if unknown or not options.ready:
        raise ConfigError(f"--ready takes a comma list of {', '.join(CONDITIONS)}, got {','.join(options.ready)!r}")
    if options.idle not in IDLE:
        raise ConfigError(f"--idle must be one of {', '.join(IDLE)}, got {options.idle!r}")
    _only(fmt, ("flash", "ready"), "--start", options.start is not None)
    _only(fmt, ("flash", "ready"), "--window", options.window != 0.0)
    window = options.window
    if isinstance(window, bool) or not isinstance(window, (int, float)) or not math.isfinite(window) or window < 0:
        raise ConfigError(f"--window must be a number of seconds >= 0, got {window!r}")
    _only(fmt, ("fedscale", "flash", "ready"), "--skip-bad-devices", options.skip_bad_devices)
    if options.assign not in ASSIGNMENTS:
        raise ConfigError(f"--assign must be one of {', '.join(ASSIGNMENTS)}, got {options.assign!r}")
    _only(fmt, ("fedscale",), "--assign fedscale", options.assign == "fedscale")
    _only(fmt, ("flash",), "--assign flash", options.assign == "flash")
    if isinstance(options.seed, bool) or not isinstance(options.seed, int) or options.seed < 0:
        raise ConfigError(f"--seed must be an integer >= 0, got {options.seed!r}")
    _only(fmt, ("flash",), "--seed (with --assign flash)", options.seed != 0)
    if options.seed != 0 and options.assign != "flash":
        raise ConfigError("--seed draws FLASH's assignment: it applies with --assign flash")
    if options.index_column not in INDEX_CHOICES:
        raise ConfigError(f"--index-column must be one of {', '.join(INDEX_CHOICES)}, got {options.index_column!r}")
    _only(fmt, ("matrix",), "--index-column", options.index_column != "auto")
    if options.semantics not in SEMANTICS:
        raise ConfigError(f"--semantics must be one of {', '.join(SEMANTICS)}, got {options.semantics!r}")
    _only(fmt, ("fedscale",), "--semantics", options.semantics != "replay")
    if options.semantics == "fedscale" and options.rule != "start":
        raise ConfigError("--semantics fedscale checks a client at the round's start (FedScale's is_active(cur_time)); "
                          "it takes --rule start only")
    if options.absent is not None and options.absent not in ABSENT:
        raise ConfigError(f"--absent must be one of {', '.join(ABSENT)}, got {options.absent!r}")


def _only(fmt: str, formats: tuple[str, ...], option: str, given: bool) -> None:
    if given and fmt not in formats:
        raise ConfigError(f"{option} applies to {' and '.join(formats)} traces only, not {fmt}")


def drop_never_available(trace: ImportedTrace, keep: bool = False) -> ImportedTrace:
    """The trace without the devices never available in it, or with them named in ``absent``
    (``keep``: their columns stay, so every later device keeps its index)."""
    seen = trace.mask.any(axis=0)
    if seen.all():
        return trace
    if not seen.any():
        raise DataError(f"{trace.source}: no device is available in any of the {trace.mask.shape[0]} rounds imported")
    slow = set(trace.too_slow)
    if keep:
        return replace(trace, absent=[name for name, ok in zip(trace.names, seen) if not ok and name not in slow])
    keep = np.flatnonzero(seen)
    dropped = [name for name, ok in zip(trace.names, seen) if not ok and name not in slow]
    return replace(trace, mask=trace.mask[:, keep], names=[trace.names[k] for k in keep],
                   dropped=trace.dropped + dropped, steps=None if trace.steps is None else trace.steps[keep])


def replay_spec(trace: ImportedTrace, path: Path | str) -> str:
    """The participation SPEC that replays the trace written to ``path``."""
    return f"trace:path={path}" + (",absent=true" if not trace.mask.any(axis=0).all() else "")


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
    """What the command prints: the trace's size, what was asked and skipped, the devices dropped,
    and its statistics (p_i, q_i and the delays tau_max, tau_avg as FedSUM defines them;
    participation/statistics.py)."""
    stats = trace.statistics()
    rounds, clients = trace.mask.shape
    lines = [trace.source, f"{rounds} rounds x {clients} clients"]
    if trace.asked is not None and trace.offered is not None and trace.asked > trace.offered:
        lines.append(f"--clients {trace.asked} asked, but the recording holds only {trace.offered} devices: "
                     f"all {trace.offered} imported")
    if trace.skipped:
        lines.append(f"skipped {len(trace.skipped)} device(s) with malformed records: {_listed(trace.skipped)}")
    if trace.backward:
        lines.append(f"read {len(trace.backward)} device(s) whose time goes back in the file's order, as FLASH's "
                     f"Timer reads them: {_listed(trace.backward)}")
    if trace.impossible:
        lines.append(f"skipped {sum(trace.impossible.values())} spell(s) that end before they start (never matched "
                     f"by start <= t <= end) in {len(trace.impossible)} device(s), their other spells kept: "
                     + _listed([f"{name} ({count})" for name, count in trace.impossible.items()]))
    if trace.too_slow:
        lines.append(f"dropped {len(trace.too_slow)} device(s) that cannot finish one local step before the deadline: "
                     f"{_listed(trace.too_slow)}")
    if trace.dropped:
        lines.append(f"dropped {len(trace.dropped)} device(s) never available in these rounds: {_listed(trace.dropped)}")
    if trace.absent:
        lines.append(f"kept {len(trace.absent)} device(s) never available in these rounds (empty columns; "
                     f"replay with absent=true): {_listed(trace.absent)}")
    lines += [f"mean active per round {stats.mean_active:.3f}, empty rounds {stats.empty_rounds}",
              f"tau_max {stats.tau_max}, tau_avg {stats.tau_avg:.3f}",
              f"p_i: min {stats.p.min():.4f}, mean {stats.p.mean():.4f}, max {stats.p.max():.4f}; "
              f"q_i: min {stats.q.min():.4f}, mean {stats.q.mean():.4f}, max {stats.q.max():.4f}"]
    if trace.steps is not None:
        lines.append(f"local steps per round: min {int(trace.steps.min())}, mean {trace.steps.mean():.3f}, "
                     f"max {int(trace.steps.max())}")
    steps = trace.steps is not None
    lines.append(f"{'client':>6} {'device':>16} {'p (empirical)':>14} {'q (empirical)':>14}" + (" steps" if steps else ""))
    for i in range(min(clients, shown)):
        lines.append(f"{i:>6} {trace.names[i][:16]:>16} {stats.p[i]:>14.4f} {stats.q[i]:>14.4f}"
                     + (f" {int(trace.steps[i]):>5}" if steps else ""))
    if clients > shown:
        lines.append(f"... and {clients - shown} more clients")
    return lines


def _listed(names: list[str], shown: int = 10) -> str:
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


def work_trace_text(trace: ImportedTrace) -> str:
    """The work trace (work/trace.py: ``round,client,steps``) of a trace imported with its devices'
    speeds: one row per active client of every imported round, each client its steps; ConfigError
    when it would be more CSV than a work trace may hold."""
    # focusfl.work imports torch: only a trace imported with --capacity reaches it
    from ..work.trace import MAX_CSV_BYTES as WORK_MAX_CSV_BYTES
    from ..work.trace import trace_text as rows_text

    if trace.steps is None:
        raise ConfigError("--work-out needs the devices' speeds: give --capacity FILE")
    rounds, clients = np.nonzero(trace.mask)
    longest = sum(len(str(n)) for n in (trace.mask.shape[0], trace.mask.shape[1], int(trace.steps.max()))) + 3
    if rounds.size * longest > WORK_MAX_CSV_BYTES:
        raise ConfigError(f"the work trace would be up to {human_bytes(rounds.size * longest)} of CSV "
                          f"({rounds.size:,} client rounds), more than the {human_bytes(WORK_MAX_CSV_BYTES)} a work "
                          "trace may hold; import fewer --rounds or --clients")
    steps = trace.steps[clients]
    return rows_text(list(zip(rounds.tolist(), clients.tolist(), steps.tolist())))


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
    if device.starts.size == 0 or (device.wraps and device.span == 0):
        return np.zeros(begin.shape, dtype=bool)
    if not device.wraps:
        return _cover(device, begin, begin + length)
    if device.span < 0:  # FLASH: a last event before the first; the time point of its modulo only
        if length:
            return np.zeros(begin.shape, dtype=bool)
        a = device.origin + np.mod(np.trunc(begin - device.origin), device.span)
        return _cover(device, a, a)
    if length >= device.span:  # the window sees every time of the recording
        whole = _cover(device, np.array([device.origin]), np.array([device.origin + device.span]))
        return np.full(begin.shape, bool(whole[0]))
    offset = begin - device.origin
    if device.truncate:  # FLASH: int(t - trace_start) % int(trace_end - trace_start) + trace_start
        offset = np.trunc(offset)
    a = device.origin + np.mod(offset, device.span)
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


def _devices(what: str, ids: list, entries: list, parse: Callable[[Any, Any], Any],
             options: ImportOptions) -> tuple[list, list, list[str]]:
    """(ids, parsed devices, skipped) of the entries that ``parse(key, entry)`` reads; with
    --skip-bad-devices a device whose record is malformed (a DataError) is skipped and named
    with its reason, as FLASH's Timer leaves such a device out; otherwise it ends the import."""
    kept_ids, parsed, skipped = [], [], []
    for key, entry in zip(ids, entries):
        try:
            parsed.append(parse(key, entry))
        except DataError as exc:
            if not options.skip_bad_devices:
                raise DataError(f"{exc} (--skip-bad-devices imports the other devices)") from None
            skipped.append(f"{key} ({str(exc).removeprefix(what + ': ')[:80]})")
            continue
        kept_ids.append(key)
    if not parsed:
        raise DataError(f"{what}: every device's record is malformed ({len(skipped)} skipped)")
    return kept_ids, parsed, skipped


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


def read_fedscale(path: Path, options: ImportOptions, capacity: CapacityOptions | None = None) -> ImportedTrace:
    what = f"FedScale trace {path.name!r}"
    data = read_plain_pickle(path, what)
    if not isinstance(data, dict) or not data:
        raise DataError(f"{what} must hold a non-empty dict of clients (client id -> its behaviour), "
                        f"got {type(data).__name__}")
    keys = fedscale_keys(list(data), options)
    names = [str(k) if options.assign == "sorted" else f"{c}:{k}" for c, k in keys]
    parse = {name: (c, k) for name, (c, k) in zip(names, keys)}
    names, devices, skipped = _devices(what, names, [data[k] for _, k in keys],
                                       lambda name, entry: _fedscale_client(what, parse[name][1], entry), options)
    rounds = _rounds_for(options, max(d.span for d in devices))
    _check_mask_size(rounds, len(devices), what)
    if options.semantics == "fedscale":
        mask = fedscale_walk_mask(devices, options.round_seconds, rounds)
        source = (f"fedscale {path.name!r}, {options.round_seconds:g} s rounds, FedScale's is_active at the round's "
                  "start (its spell index walked once a round)")
    else:
        mask = availability_mask(devices, options.round_seconds, rounds, options.rule)
        source = f"fedscale {path.name!r}, {options.round_seconds:g} s rounds, availability at the round's " + \
            ("start" if options.rule == "start" else "start and throughout")
    if options.assign == "fedscale":
        source += ", FedScale's assignment (client c = k + 1 replays the recording keys[c % len] in the pickle's order)"
    trace = ImportedTrace(mask, names, source=source, skipped=skipped,
                          offered=len(data) if options.assign == "sorted" else None)
    if capacity is not None:
        trace = with_capacity(trace, [parse[name] for name in names], capacity, options)
    return trace


def fedscale_keys(keys: list, options: ImportOptions) -> list[tuple[int, Any]]:
    """(FedScale client id, recording key) of each imported client. ``sorted``: the ids in order
    (numerically when all are integers), the first --clients of them; ``fedscale``: FedScale's
    own assignment, client c = k + 1 (FedScale numbers its clients from 1, aggregator.py
    client_register_handler) replays ``keys[c % len(keys)]`` in the pickle's insertion order
    (client_manager.py register_client), so asking more clients than recordings reuses them."""
    if options.assign == "sorted":
        return [(k + 1, key) for k, key in enumerate(_first(options, _ordered_ids(keys)))]
    count = len(keys) if options.clients is None else options.clients
    return [(k + 1, keys[(k + 1) % len(keys)]) for k in range(count)]


def with_capacity(trace: ImportedTrace, clients: list[tuple[int, Any]], capacity: CapacityOptions,
                  options: ImportOptions) -> ImportedTrace:
    """The trace with each column's local steps per round from FedScale's device capacity file
    (work/capacity.py); devices that cannot finish one step before the deadline never report
    (FedScale drops such stragglers), so their columns are emptied and they are named."""
    from .capacity import deadline_steps  # focusfl.work imports torch: only --capacity needs it

    speeds = read_capacity(capacity.path)
    # FedScale looks a client's speed up by key, (c % len) under its own assignment
    # (aggregator.py client_register_handler), with {1.0, 1.0} for a key it lacks.
    lookup = [c % len(speeds) if options.assign == "fedscale" else key for c, key in clients]
    missing = [str(key) for key in lookup if key not in speeds]
    computation = np.array([speeds.get(key, FEDSCALE_DEFAULT_SPEED)[0] for key in lookup], dtype=np.float64)
    bandwidth = np.array([speeds.get(key, FEDSCALE_DEFAULT_SPEED)[1] for key in lookup], dtype=np.float64)
    steps = deadline_steps(computation, bandwidth, capacity.deadline, capacity.batch_size, capacity.model_kbits,
                           capacity.local_steps)
    slow = steps < 1
    mask = trace.mask.copy()
    mask[:, slow] = False
    source = (f"{trace.source}; local steps from {capacity.path.name!r}: {capacity.deadline:g} s deadline, "
              f"{capacity.batch_size} samples a step, {capacity.model_kbits:g} kbit model, at most {capacity.local_steps}")
    if missing:
        source += f", FedScale's default speed for {len(missing)} device(s) not in it"
    return replace(trace, mask=mask, steps=steps, source=source,
                   too_slow=[name for name, s in zip(trace.names, slow) if s])


@dataclass(frozen=True)
class CapacityOptions:
    """FedScale's device capacity file and the round it prices (work/capacity.py)."""

    path: Path
    deadline: float
    batch_size: int
    model_kbits: float
    local_steps: int


# FedScale's speed for a client its capacity file lacks (aggregator.py client_register_handler).
FEDSCALE_DEFAULT_SPEED = (1.0, 1.0)


def read_capacity(path: Path) -> dict[Any, tuple[float, float]]:
    """FedScale's ``client_device_capacity``: a pickle of ``{client_id: {"computation": ms per
    sample, "communication": kbit/s}}``, read by the plain unpickler (never runs code), each
    speed checked: computation >= 0, communication > 0, both finite."""
    what = f"FedScale device capacity {path.name!r}"
    if not path.is_file():
        raise DataError(f"{what}: file {str(path)!r} not found")
    data = read_plain_pickle(path, what)
    if not isinstance(data, dict) or not data:
        raise DataError(f"{what} must hold a non-empty dict of clients (client id -> its speeds), "
                        f"got {type(data).__name__}")
    return {key: _capacity(what, key, entry) for key, entry in data.items()}


def _capacity(what: str, key: Any, entry: Any) -> tuple[float, float]:
    where = f"{what}: client {key!r}"
    if not isinstance(entry, dict) or "computation" not in entry or "communication" not in entry:
        raise DataError(f"{where} must be a dict with computation and communication")
    computation = _seconds(where, "computation", entry["computation"], "milliseconds per sample")
    bandwidth = _seconds(where, "communication", entry["communication"], "kbit/s")
    if bandwidth <= 0:
        raise DataError(f"{where}: communication must be positive (kbit/s), got {entry['communication']!r}")
    return computation, bandwidth


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
    return Availability(starts, ends, origin=0.0, span=period,
                        listed=(np.array(active, dtype=np.float64), np.array(inactive, dtype=np.float64)))


def fedscale_walk_mask(devices: list[Availability], round_seconds: float, rounds: int) -> np.ndarray:
    """[rounds, devices] bool: FedScale's ``ClientMetadata.is_active(cur_time)`` called once a round
    at cur_time = r S, each device keeping its own spell index k (from 0): norm = cur_time %
    finish_time; k advances by one when norm > inactive[k], wrapping to 0 past the last spell;
    available when active[k] <= norm <= inactive[k]. The index moves at most one spell a call, so
    a call that passes several spells lags behind the recording, and a last spell that ends at
    finish_time is never passed (norm < finish_time): from the second cycle on, the device is
    available only in that spell. A device with no spell is never available. Rounds are a
    Python loop, every device at once."""
    count = np.array([0 if d.listed is None else d.listed[0].size for d in devices], dtype=np.int64)
    offset = np.concatenate([[0], np.cumsum(count)[:-1]]).astype(np.int64)
    active = np.concatenate([d.listed[0] for d in devices if d.listed is not None] + [np.zeros(0)])
    inactive = np.concatenate([d.listed[1] for d in devices if d.listed is not None] + [np.zeros(0)])
    period = np.array([d.span for d in devices], dtype=np.float64)
    spelled = count > 0
    index = np.zeros(len(devices), dtype=np.int64)
    safe = np.where(spelled, count, 1)
    mask = np.zeros((rounds, len(devices)), dtype=bool)
    if not spelled.any():
        return mask
    for r in range(rounds):
        norm = np.mod(r * round_seconds, period)
        at = np.where(spelled, offset + index, 0)
        index = np.where(norm > inactive[at], index + 1, index) % safe
        at = np.where(spelled, offset + index, 0)
        mask[r] = spelled & (active[at] <= norm) & (norm <= inactive[at])
    return mask


def _seconds(where: str, name: str, value: Any, unit: str = "seconds") -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DataError(f"{where}: {name} must be a number of {unit}, got {type(value).__name__}")
    number = _as_float(value)
    if not math.isfinite(number):
        raise DataError(f"{where}: {name} must be finite, got {str(value)[:30]!r}")
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
    ids = _ordered_ids(list(data)) if options.assign == "flash" else _first(options, _ordered_ids(list(data)))
    ids, events, skipped = _devices(what, ids, [data[key] for key in ids],
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
    rounds = _rounds_for(options, span)
    _check_mask_size(rounds, len(devices), what)
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


def _read_json(path: Path, what: str, bytes_per_byte: int = JSON_BYTES_PER_BYTE) -> Any:
    size = path.stat().st_size
    if size > MAX_JSON_BYTES:
        raise DataError(f"{what} is {human_bytes(size)}, more than the {human_bytes(MAX_JSON_BYTES)} read as JSON")
    check_allocation(size * bytes_per_byte, f"{what} ({human_bytes(size)} of JSON)")
    try:
        return json.loads(path.read_bytes())
    except OSError as exc:
        raise DataError(f"{what}: cannot read it ({_first_line(exc)})") from None
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and bad UTF-8 are ValueErrors
        raise DataError(f"{what} is not valid JSON ({_first_line(exc)})") from None


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


# -- FLASH's ready windows ------------------------------------------------------------------------
def read_ready(path: Path, options: ImportOptions) -> ImportedTrace:
    """FLASH's ready windows (lh-ycx/leaf ``data/ready_strict.json``, written by
    models/utils/plot.py ``static_ready``): ``{uid: [[start, end], ...]}``, each device's
    charging spells in seconds from the file's reference time. A device is available in its
    spells (closed: FLASH's ``item[0] <= now <= item[1]``); the clock does not wrap (the file has
    no recording span): round r covers [start + r S, start + (r + 1) S), start = --start seconds
    (default 0, the file's reference time)."""
    what = f"FLASH ready windows {path.name!r}"
    data = _read_json(path, what, READY_JSON_BYTES_PER_BYTE)
    if not isinstance(data, dict) or not data:
        raise DataError(f"{what} must hold a non-empty JSON object of devices (uid -> its [start, end] spells), "
                        f"got {type(data).__name__}")
    start = ready_start(options.start)
    ids = _first(options, _ordered_ids(list(data)))
    ids, devices, skipped = _devices(what, ids, [data[key] for key in ids],
                                     lambda key, entry: _ready_device(what, key, entry), options)
    last = max((float(d.ends[-1]) for d in devices if d.ends.size), default=start)
    rounds = _rounds_for(options, last - start)
    _check_mask_size(rounds, len(devices), what)
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
    number = _as_float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
    if not math.isfinite(number):
        raise DataError(f"{where}: {name} must hold finite numbers of seconds, got {str(value)[:30]!r}")
    return number


def _as_float(value: int | float) -> float:
    """``float(value)``, inf for an integer too large for a float (its sign kept)."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


# -- availability matrices ------------------------------------------------------------------------
# Cells a matrix may hold: 0/1 as numbers, and the booleans pandas writes and reads by default
# (FedStale's carbon-budget matrices hold True/False).
TRUE_WORDS = ("True", "true", "TRUE")
FALSE_WORDS = ("False", "false", "FALSE")
CELL_VALUES = {**{w: 1 for w in TRUE_WORDS}, **{w: 0 for w in FALSE_WORDS}, "1": 1, "0": 0, "1.0": 1, "0.0": 0}
INDEX_CHOICES = ("auto", "yes", "no")


@dataclass(frozen=True)
class LabelledMatrix:
    """A clients x rounds 0/1 matrix (uint8) with the clients' names and the rounds' labels ("" if none)."""

    data: np.ndarray
    names: list[str] | None
    round_labels: list[str]


def read_availability_matrix(path: Path, options: ImportOptions) -> ImportedTrace:
    """A clients x rounds 0/1 matrix (.csv or .npy) as a rounds x clients trace. A CSV may name its
    clients in a first column and its rounds in a header, as pandas writes a DataFrame
    (FedStale's availability matrices, read there with ``pd.read_csv(path, index_col=[0])``)."""
    kind = "availability matrix"
    if path.suffix.lower() == ".csv":
        matrix = read_labelled_matrix(path, options.index_column, kind)
    else:
        if options.index_column == "yes":
            raise ConfigError(f"--index-column yes applies to a .csv matrix; {path.name!r} is a bare array")
        matrix = LabelledMatrix(_checked_binary(read_matrix(path, kind), path, kind), None, [])
    clients, recorded = matrix.data.shape
    if options.rounds is not None and options.rounds > recorded:
        raise ConfigError(f"--rounds {options.rounds} is more than the {recorded} rounds (columns) of {path.name!r}; "
                          "a trace wraps around when replayed")
    keep = clients if options.clients is None else min(options.clients, clients)
    rounds = recorded if options.rounds is None else options.rounds  # FedStale: df.iloc[:, :n_rounds]
    mask = np.ascontiguousarray(matrix.data[:keep, :rounds].astype(bool).T)
    names = [str(k) for k in range(keep)] if matrix.names is None else matrix.names[:keep]
    source = f"availability matrix {path.name!r} (clients x rounds"
    if matrix.names is not None:
        source += ", clients named in its first column"
    labels = [label for label in matrix.round_labels[:rounds] if label]
    if labels:
        source += f", rounds {labels[0]} .. {labels[-1]}"
    return ImportedTrace(mask, names, source=source + ")", offered=clients)


def _checked_binary(data: np.ndarray, path: Path, kind: str) -> np.ndarray:
    if data.dtype != bool:
        bad = ~np.isin(data, (0, 1))
        if bad.any():
            client, column = (int(v) for v in np.argwhere(bad)[0])
            raise DataError(f"{kind}: {path.name!r} must contain only 0 and 1, found {data[client, column].item():g} "
                            f"for client {client} (row {client + 1}) in round {column}")
    return data.astype(np.uint8)


def read_labelled_matrix(path: Path, index_column: str, kind: str) -> LabelledMatrix:
    """The 0/1 matrix of a CSV (size-checked before it is read), its optional header of round
    labels and its optional first column of client names (see :func:`has_index_column`)."""
    size = path.stat().st_size
    if size > MAX_MATRIX_CSV_BYTES:
        raise DataError(f"{kind} {path.name!r} is {human_bytes(size)} of CSV, more than the "
                        f"{human_bytes(MAX_MATRIX_CSV_BYTES)} read as text; save it as a 0/1 .npy matrix instead")
    check_allocation(size * CSV_BYTES_PER_BYTE, f"{kind} {path.name!r} ({human_bytes(size)} of CSV)")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{kind}: cannot read {path.name!r} ({_first_line(exc)})") from None
    lines = text.count("\n") + 1  # before the lines are split: many short lines cost more than their bytes
    check_allocation(size * CSV_BYTES_PER_BYTE + lines * CSV_BYTES_PER_LINE,
                     f"{kind} {path.name!r} ({human_bytes(size)} of CSV, {lines:,} lines)")
    rows = ((k, next(csv.reader([line]))) for k, line in enumerate(text.splitlines(), start=1)
            if line.strip() and not line.lstrip().startswith("#"))
    first = next(rows, None)
    if first is None:
        raise DataError(f"{kind}: {path.name!r} must be a non-empty 2-D matrix, got no data line")
    header = None if all(_is_cell(c) for c in first[1]) else first[1]
    data_rows = rows if header is not None else _chain(first, rows)
    first_row = next(data_rows, None)
    if first_row is None:
        raise DataError(f"{kind}: {path.name!r} must be a non-empty 2-D matrix, got a header and no data line")
    indexed = has_index_column(index_column, header, first_row[1])
    names: list[str] | None = [] if indexed else None
    values, widths = [], set()
    for number, cells in _chain(first_row, data_rows):
        if indexed:
            names.append(cells[0].strip())
            cells = cells[1:]
        values.append(_cell_row(cells, path, kind, number, len(values), indexed))
        widths.add(len(cells))
    if len(widths) > 1:
        raise DataError(f"{kind}: {path.name!r} has rows of different lengths {sorted(widths)}")
    width = widths.pop()
    if width == 0:
        raise DataError(f"{kind}: {path.name!r} must be a non-empty 2-D matrix, got rows with no rounds")
    if header is not None and len(header) != width + (1 if indexed else 0):
        raise DataError(f"{kind}: {path.name!r} has {len(header)} header cells for rows of {width + indexed} cells")
    labels = [c.strip() for c in header[1 if indexed else 0:]] if header is not None else []
    return LabelledMatrix(np.stack(values), names, labels)


def _chain(first, rest):
    yield first
    yield from rest


def _is_cell(text: str) -> bool:
    """Whether ``text`` reads as a matrix value (a number or a boolean word), not a label."""
    text = text.strip()
    if text in CELL_VALUES:
        return True
    try:
        float(text)
    except ValueError:
        return False
    return True


def has_index_column(choice: str, header: list[str] | None, first_row: list[str]) -> bool:
    """Whether the first column names the clients (pandas' index, FedStale's ``index_col=[0]``):
    ``yes``/``no`` as asked; ``auto``: when the first data row's first cell is not a value (a
    name), when the header's first cell is empty (the unnamed index pandas writes), or when the
    other header cells are all round labels of one kind (integers, numbers or datetimes) and the
    first is not (``client,0,1,2``): a first column of 0/1 under such a header is an index, not
    a round."""
    if choice != "auto":
        return choice == "yes"
    if not _is_cell(first_row[0]):
        return True
    if header is None or len(header) < 2:
        return False
    if not header[0].strip():
        return True
    kinds = {_label_kind(c) for c in header[1:]}
    return len(kinds) == 1 and kinds != {"text"} and _label_kind(header[0]) not in kinds


def _label_kind(text: str) -> str:
    text = text.strip()
    if re.fullmatch(r"[+-]?\d+", text):
        return "integer"
    try:
        float(text)
        return "number"
    except ValueError:
        pass
    try:
        datetime.fromisoformat(text)
        return "datetime"
    except ValueError:
        return "text"


def _cell_row(cells: list[str], path: Path, kind: str, number: int, client: int, indexed: bool) -> np.ndarray:
    """One client's row as uint8 0/1; DataError naming the line for anything else."""
    row = np.empty(len(cells), dtype=np.uint8)
    for k, cell in enumerate(cells):
        value = CELL_VALUES.get(cell.strip())
        if value is None:
            try:
                number_value = float(cell)
            except ValueError:
                raise DataError(f"{kind}: {path.name!r} data line {number}, column {k + 1 + indexed} is not numeric "
                                f"(0/1 or True/False): {cell.strip()[:30]!r}") from None
            if number_value not in (0.0, 1.0):
                raise DataError(f"{kind}: {path.name!r} must contain only 0 and 1, found {number_value:g} "
                                f"for client {client} (row {client + 1}) in round {k}")
            value = int(number_value)
        row[k] = value
    return row


FORMATS: dict[str, Callable[[Path, ImportOptions], ImportedTrace]] = {
    "fedscale": read_fedscale,
    "flash": read_flash,
    "ready": read_ready,
    "matrix": read_availability_matrix,
}


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0] if text else type(exc).__name__

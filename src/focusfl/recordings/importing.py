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
  local steps per round come from its speeds under a round deadline (capacity.py), written
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

import math
import re
from dataclasses import replace
from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import ConfigError, DataError
from ..limits import human_bytes
from ..participation.trace import MAX_CSV_BYTES, TAG
from .capacity import CapacityOptions
from .fedscale import read_fedscale
from .flash import read_flash, read_ready
from .matrix import INDEX_CHOICES, read_availability_matrix
from .parsing import ABSENT, ASSIGNMENTS, CONDITIONS, IDLE, RULES, SEMANTICS, ImportedTrace, ImportOptions

SHOWN_CLIENTS = 50  # rows of the per-client table the command prints


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
    # focusfl.work imports torch: only a trace written with --work-out reaches it
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
FORMATS: dict[str, Callable[[Path, ImportOptions], ImportedTrace]] = {
    "fedscale": read_fedscale,
    "flash": read_flash,
    "ready": read_ready,
    "matrix": read_availability_matrix,
}

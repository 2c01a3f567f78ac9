"""What every importer of a recording shares: the options (:class:`ImportOptions`), the imported
trace (:class:`ImportedTrace`), a device's availability spells and the rounds they cover
(:func:`availability_mask`), the list of devices with malformed ones skipped, and the readers of
untrusted pickles and JSON (size-checked first; a pickle is read by an unpickler that knows no
class or function, so it never runs code). Bad files end in one line (DataError)."""
from __future__ import annotations

import io
import json
import math
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..errors import ConfigError, DataError
from ..limits import check_allocation, human_bytes
from ..participation.statistics import ParticipationStats, summarize


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
ASSIGNMENTS = ("sorted", "fedscale", "flash")
# What becomes of a device never available in the imported rounds: kept as an empty column (its
# index stays the recording's) or dropped; default: kept for a matrix (its rows are the
# experiment's clients, as FedStale reads them), dropped for a timed recording (a population
# sample, whose devices outside the imported rounds are no experiment's clients).
ABSENT = ("keep", "drop")
# How a FedScale trace is read each round: ``replay`` (every spell of every cycle, the recording
# as recorded) or ``fedscale`` (ClientMetadata.is_active's own walk through the spell list).
SEMANTICS = ("replay", "fedscale")


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


def rounds_for(options: ImportOptions, span: float) -> int:
    """``--rounds``, else the rounds that cover the recording's span (at least one)."""
    return options.rounds if options.rounds is not None else max(1, math.ceil(span / options.round_seconds))


def check_mask_size(rounds: int, clients: int, what: str) -> None:
    check_allocation(rounds * clients * MASK_BYTES_PER_CELL,
                     f"{what}: {rounds:,} rounds x {clients:,} clients", error=ConfigError)


def ordered_ids(keys: list) -> list:
    """Device ids in a stable order: numerically when every id is an integer, else as text."""
    if all(isinstance(k, int) and not isinstance(k, bool) or (isinstance(k, str) and re.fullmatch(r"-?\d+", k))
           for k in keys):
        return sorted(keys, key=lambda k: (int(k), str(k)))
    return sorted(keys, key=str)


def first_clients(options: ImportOptions, ids: list) -> list:
    return ids if options.clients is None else ids[: options.clients]


def parse_devices(what: str, ids: list, entries: list, parse: Callable[[Any, Any], Any],
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
        raise DataError(f"{what}: cannot read it ({first_line(exc)})") from None
    try:
        value = _PlainUnpickler(data, what).load()
    except DataError:
        raise
    except EOFError:
        raise DataError(f"{what} is truncated (the pickle ends before its STOP)") from None
    except (pickle.UnpicklingError, ValueError, TypeError, AttributeError, IndexError, KeyError, OverflowError,
            RecursionError, UnicodeDecodeError, MemoryError) as exc:
        raise DataError(f"{what} is not a readable pickle ({type(exc).__name__}: {first_line(exc)})") from None
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


def checked_seconds(where: str, name: str, value: Any, unit: str = "seconds") -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DataError(f"{where}: {name} must be a number of {unit}, got {type(value).__name__}")
    number = as_float(value)
    if not math.isfinite(number):
        raise DataError(f"{where}: {name} must be finite, got {str(value)[:30]!r}")
    if number < 0:
        raise DataError(f"{where}: {name} must not be negative, got {value!r}")
    return number


def read_json(path: Path, what: str, bytes_per_byte: int = JSON_BYTES_PER_BYTE) -> Any:
    size = path.stat().st_size
    if size > MAX_JSON_BYTES:
        raise DataError(f"{what} is {human_bytes(size)}, more than the {human_bytes(MAX_JSON_BYTES)} read as JSON")
    check_allocation(size * bytes_per_byte, f"{what} ({human_bytes(size)} of JSON)")
    try:
        return json.loads(path.read_bytes())
    except OSError as exc:
        raise DataError(f"{what}: cannot read it ({first_line(exc)})") from None
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and bad UTF-8 are ValueErrors
        raise DataError(f"{what} is not valid JSON ({first_line(exc)})") from None


def as_float(value: int | float) -> float:
    """``float(value)``, inf for an integer too large for a float (its sign kept)."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0] if text else type(exc).__name__

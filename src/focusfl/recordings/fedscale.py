"""FedScale's client behaviour trace (``client_behave_trace``): a pickle of ``{client_id: {"active":
[t, ...], "inactive": [t, ...], "finish_time": T, ...}}``, read by the plain unpickler (never runs
code). Client i is available from active[k] to inactive[k] (seconds), and its trace repeats with
period finish_time (FedScale's ``Client.isActive`` tests ``cur_time % finish_time``); semantics
``fedscale`` walks the spells as FedScale's ``ClientMetadata.is_active`` does instead
(:func:`fedscale_walk_mask`). With the device capacity file, each device's local steps per round
too (capacity.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DataError
from .capacity import CapacityOptions, with_capacity
from .parsing import (Availability, ImportedTrace, ImportOptions, availability_mask, check_mask_size, checked_seconds,
                      first_clients, merged, ordered_ids, parse_devices, read_plain_pickle, rounds_for)


def read_fedscale(path: Path, options: ImportOptions, capacity: CapacityOptions | None = None) -> ImportedTrace:
    what = f"FedScale trace {path.name!r}"
    data = read_plain_pickle(path, what)
    if not isinstance(data, dict) or not data:
        raise DataError(f"{what} must hold a non-empty dict of clients (client id -> its behaviour), "
                        f"got {type(data).__name__}")
    keys = fedscale_keys(list(data), options)
    names = [str(k) if options.assign == "sorted" else f"{c}:{k}" for c, k in keys]
    parse = {name: (c, k) for name, (c, k) in zip(names, keys)}
    names, devices, skipped = parse_devices(what, names, [data[k] for _, k in keys],
                                       lambda name, entry: _fedscale_client(what, parse[name][1], entry), options)
    rounds = rounds_for(options, max(d.span for d in devices))
    check_mask_size(rounds, len(devices), what)
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
        return [(k + 1, key) for k, key in enumerate(first_clients(options, ordered_ids(keys)))]
    count = len(keys) if options.clients is None else options.clients
    return [(k + 1, keys[(k + 1) % len(keys)]) for k in range(count)]


def _fedscale_client(what: str, key: Any, entry: Any) -> Availability:
    where = f"{what}: client {key!r}"
    if not isinstance(entry, dict):
        raise DataError(f"{where} must be a dict with active, inactive and finish_time, got {type(entry).__name__}")
    missing = [k for k in ("active", "inactive", "finish_time") if k not in entry]
    if missing:
        raise DataError(f"{where} has no {missing[0]!r}")
    period = checked_seconds(where, "finish_time", entry["finish_time"])
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


def _times(where: str, name: str, value: Any) -> list[float]:
    if not isinstance(value, (list, tuple)):
        raise DataError(f"{where}: {name} must be a list of times in seconds, got {type(value).__name__}")
    return [checked_seconds(where, f"{name}[{k}]", v) for k, v in enumerate(value)]

"""What focusfl puts on Flower's wire: NamedTuples of tensors as ArrayRecords, contexts and run
descriptions as ConfigRecords, and the checks every received record passes.

A message's records travel packed (:func:`pack`, :func:`unpack`): Flower moves a message as a
tree of objects, one request per object and hop (Message, RecordDict, every record, every Array
and every chunk; a FOCUS round message was 9 objects, each crossing 3 hops), and the SuperLink
spends milliseconds of CPU on each request. So every record of a message goes into one
ConfigRecord (arrays as their ``.npy`` bytes) while the arrays fit one of Flower's chunks; larger
arrays keep their ArrayRecords, which Flower chunks.

A record from the network is untrusted: :func:`decode_tree` accepts it only if it holds exactly
the template's fields, each with the template's dtype and shape and (for floating point) only
finite values; anything else raises :class:`Malformed` with a short reason, which the strategy
counts as non-participation. Arrays travel as NumPy ``.npy`` bytes (Flower's own ``Array``),
which round-trip float64 bit for bit.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict
from flwr.common.constant import FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE

from ..algorithms.base import RoundContext
from ..errors import ConfigError
from ..privacy.config import DPConfig, parse_dp

# Keys of the records in a message's RecordDict.
SERVER = "focusfl.server"  # ArrayRecord: the server state fields a node needs
MESSAGE = "focusfl.message"  # ArrayRecord: a client's message (rows [1, ...])
ROWS = "focusfl.rows"  # ArrayRecord: a client's committed rows (audit only)
CTX = "focusfl.ctx"  # ConfigRecord: round, client, protocol fields
RUN = "focusfl.run"  # ConfigRecord: algorithm, problem, seed, dtype, run token, local DP (JSON)
STATUS = "focusfl.status"  # ConfigRecord: a node's answer to the handshake
PACKED = "focusfl"  # ConfigRecord: the records above, packed (pack/unpack)
INDEX = "index"  # the packed record's entry naming its records (JSON)
# Arrays of a message up to this many bytes in all travel inside the packed ConfigRecord: no
# more than one of Flower's array chunks, so no object grows beyond what Flower sends anyway.
INLINE_BYTES = FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE


class Malformed(ValueError):
    """A received record that does not match what the protocol expects."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason  # "malformed" or "non_finite": the rejection counters' names
        self.detail = detail  # what was wrong, without the reason (an error reply names that once)


def encode_tree(tree: Any, fields: tuple[str, ...] | None = None) -> ArrayRecord:
    """The named fields (default: all) of a NamedTuple of tensors as an ArrayRecord."""
    names = tree._fields if fields is None else fields
    record = ArrayRecord()
    for name in names:
        tensor = getattr(tree, name).detach().cpu().contiguous()
        record[name] = Array(tensor.numpy())
    return record


def pack(records: Mapping[str, ConfigRecord | ArrayRecord]) -> RecordDict:
    """A message's content: ``records`` in one ConfigRecord (PACKED), the ArrayRecords with them
    while their arrays fit INLINE_BYTES together, else as ArrayRecords of their own.

    The packed record holds INDEX (JSON: each record's kind and, for arrays, each array's dtype,
    shape and stype, in order) and an entry ``key/name`` per config value or array (its bytes)."""
    arrays = [record for record in records.values() if isinstance(record, ArrayRecord)]
    inline = sum(len(array.data) for record in arrays for array in record.values()) <= INLINE_BYTES
    index: dict[str, Any] = {}
    flat: dict[str, Any] = {}
    content = RecordDict()
    for key, record in records.items():
        if isinstance(record, ConfigRecord):
            index[key] = {"kind": "config", "names": list(record.keys())}
            flat.update({f"{key}/{name}": value for name, value in record.items()})
        elif inline:
            described = [[name, array.dtype, list(array.shape), array.stype] for name, array in record.items()]
            index[key] = {"kind": "arrays", "arrays": described}
            flat.update({f"{key}/{name}": array.data for name, array in record.items()})
        else:
            content[key] = record
    content[PACKED] = ConfigRecord({INDEX: json.dumps(index), **flat})
    return content


def unpack(content: Any) -> dict[str, ConfigRecord | ArrayRecord]:
    """The records :func:`pack` packed into ``content`` (a RecordDict from the network), each
    rebuilt as Flower's record; raises :class:`Malformed` for anything pack would not write."""
    if not isinstance(content, RecordDict):
        raise Malformed("malformed", "no content")
    records = {key: record for key, record in content.items() if key != PACKED}
    packed = content.get(PACKED)
    if not isinstance(packed, ConfigRecord):
        # e.g. records one by one, as focusfl wrote them before they were packed: both ends of a
        # federation must run the same focusfl
        raise Malformed("malformed", "missing packed record (does the other end run another focusfl version?)")
    try:
        index = json.loads(packed[INDEX])
    except (KeyError, TypeError, ValueError, RecursionError):  # RecursionError: JSON nested too deep
        raise Malformed("malformed", "packed record without a readable index") from None
    if not isinstance(index, dict):
        raise Malformed("malformed", "packed index is not a mapping")
    used = {INDEX}
    for key, entry in index.items():
        if key in records or not isinstance(entry, dict):
            raise Malformed("malformed", f"packed record {key!r} is duplicated or not described")
        names = entry.get("names") if entry.get("kind") == "config" else entry.get("arrays")
        if entry.get("kind") not in ("config", "arrays") or not isinstance(names, list):
            raise Malformed("malformed", f"packed record {key!r} has no kind or names")
        if entry["kind"] == "config":
            if not all(isinstance(name, str) and f"{key}/{name}" in packed for name in names):
                raise Malformed("malformed", f"packed record {key!r} lacks a value")
            records[key] = ConfigRecord({name: packed[f"{key}/{name}"] for name in names})
        else:
            records[key] = _arrays(key, names, packed)
        used.update(f"{key}/{name}" for name in records[key].keys())
    extra = sorted(set(packed.keys()) - used)
    if extra:
        raise Malformed("malformed", f"packed record holds an unindexed entry {extra[0]!r}")
    return records


def _arrays(key: str, described: list, packed: ConfigRecord) -> ArrayRecord:
    record = ArrayRecord()
    for item in described:
        if not (isinstance(item, list) and len(item) == 4 and isinstance(item[0], str) and isinstance(item[1], str)
                and isinstance(item[2], list) and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                                                      for n in item[2]) and isinstance(item[3], str)):
            raise Malformed("malformed", f"packed record {key!r} describes an array badly")
        name, dtype, shape, stype = item
        data = packed.get(f"{key}/{name}")
        if not isinstance(data, bytes) or name in record:
            raise Malformed("malformed", f"packed array {key}/{name} is missing or repeated")
        record[name] = Array(dtype=dtype, shape=tuple(shape), stype=stype, data=data)
    return record


def decode_tree(record: Any, template: Any, fields: tuple[str, ...] | None = None,
                device: torch.device | str = "cpu") -> Any:
    """Rebuild a NamedTuple of type ``type(template)`` from ``record``.

    Each field must be in ``record`` with the template field's dtype and shape and be finite;
    fields not in ``fields`` are set to None (a node gets only what it reads)."""
    if not isinstance(record, ArrayRecord):
        raise Malformed("malformed", "missing array record")
    names = template._fields if fields is None else fields
    unknown = sorted(set(names) - set(template._fields))
    if unknown:
        raise Malformed("malformed", f"unknown field {unknown[0]!r}")
    extra = sorted(set(record.keys()) - set(names))
    if extra:
        raise Malformed("malformed", f"unexpected field {extra[0]!r}")
    values = {}
    for name in names:
        if name not in record:
            raise Malformed("malformed", f"missing field {name!r}")
        expected = getattr(template, name)
        array = record[name]
        want_dtype = str(expected.dtype).removeprefix("torch.")
        if array.dtype != want_dtype:
            raise Malformed("malformed", f"field {name!r} has dtype {array.dtype}, expected {want_dtype}")
        if tuple(array.shape) != tuple(expected.shape):
            raise Malformed("malformed", f"field {name!r} has shape {tuple(array.shape)}, "
                                         f"expected {tuple(expected.shape)}")
        try:
            data = array.numpy()
        except (ValueError, TypeError, OSError) as exc:
            raise Malformed("malformed", f"field {name!r} cannot be read ({exc})") from None
        if data.dtype != np.dtype(want_dtype) or data.shape != tuple(expected.shape):
            raise Malformed("malformed", f"field {name!r} bytes disagree with its header")
        tensor = torch.from_numpy(np.ascontiguousarray(data)).to(device)
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise Malformed("non_finite", f"field {name!r} holds NaN or inf")
        values[name] = tensor
    return type(template)(**{name: values.get(name) for name in template._fields})


class WireContext(NamedTuple):
    """The per-client part of a round on the wire."""

    round: int
    client: int
    num_clients: int
    lr_scale: float
    ack: int  # the server's record of this client's last committed round (-1: initial state)
    phase: str  # "train" or "finish"
    # Local steps the server asks for (tau_i,r of the run's work process); 0: the algorithm's
    # local_steps with no per-client count (RoundContext.steps None), the classical round.
    steps: int = 0


def encode_ctx(ctx: WireContext) -> ConfigRecord:
    return ConfigRecord(dict(ctx._asdict()))


def decode_ctx(record: Any) -> WireContext:
    if not isinstance(record, ConfigRecord):
        raise Malformed("malformed", "missing context record")
    try:
        ctx = WireContext(**{name: record[name] for name in WireContext._fields})
    except KeyError as exc:
        raise Malformed("malformed", f"context lacks {exc.args[0]!r}") from None
    for name in ("round", "client", "num_clients", "ack", "steps"):
        if isinstance(getattr(ctx, name), bool) or not isinstance(getattr(ctx, name), int):
            raise Malformed("malformed", f"context {name!r} is not an integer")
    if not isinstance(ctx.lr_scale, float) or not np.isfinite(ctx.lr_scale):
        raise Malformed("malformed", "context lr_scale is not a finite float")
    if ctx.steps < 0:
        raise Malformed("malformed", f"context steps={ctx.steps} is negative")
    return ctx


def round_context(ctx: WireContext, device: torch.device | str = "cpu") -> RoundContext:
    """The one-client RoundContext of the reference engine for this client and round (with the
    step count the server asked for, if any)."""
    return RoundContext(round=ctx.round, active=torch.tensor([ctx.client], device=device),
                        num_clients=ctx.num_clients, lr_scale=ctx.lr_scale,
                        steps=torch.tensor([ctx.steps], device=device) if ctx.steps else None)


class RunSpec(NamedTuple):
    """What a node needs to build its client: resolved algorithm and problem, seed, dtype, and
    the local-DP record its messages are clipped and noised by before they leave (None: none;
    central DP is the server's alone and never travels)."""

    algorithm: dict
    problem: dict
    seed: int
    dtype: str
    token: str  # identifies one federation run (durable node state is keyed by it)
    dp: dict | None = None

    def key(self) -> str:
        return json.dumps(self._asdict(), sort_keys=True)


def encode_run(run: RunSpec) -> ConfigRecord:
    return ConfigRecord({"algorithm": json.dumps(run.algorithm, sort_keys=True),
                         "problem": json.dumps(run.problem, sort_keys=True),
                         "seed": run.seed, "dtype": run.dtype, "token": run.token,
                         "dp": json.dumps(run.dp, sort_keys=True)})


def decode_run(record: Any) -> RunSpec:
    if not isinstance(record, ConfigRecord):
        raise Malformed("malformed", "missing run record")
    try:
        run = RunSpec(algorithm=json.loads(record["algorithm"]), problem=json.loads(record["problem"]),
                      seed=int(record["seed"]), dtype=str(record["dtype"]), token=str(record["token"]),
                      dp=json.loads(record["dp"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise Malformed("malformed", f"bad run record ({exc})") from None
    node_dp(run)  # a record the node cannot noise by is refused before any work
    return run


def node_dp(run: RunSpec) -> DPConfig | None:
    """The local-DP record a node clips and noises its messages by (None: it sends them as they
    are); Malformed for a record that is not one (central mode is the server's, never a node's)."""
    try:
        dp = parse_dp(run.dp) if run.dp is not None else None
    except ConfigError as exc:
        raise Malformed("malformed", f"bad dp record ({exc})") from None
    if dp is not None and dp.mode != "local":
        raise Malformed("malformed", f"a node noises only in local mode, the run record says mode={dp.mode}")
    return dp

"""The node's half of the commit protocol: one client's state, pending and committed.

A node runs ``algorithm.client_round`` on its own row (n = 1) and keeps the result as
*pending*; it replaces the *committed* row only when a later message from the server
acknowledges that round (``ack``, the server's record of the client's last accepted round).
Without this, a node whose reply is lost has moved on while the server has not, and gradient
tracking (FOCUS: y = sum_i g_prev_i) is broken for good. The rules, on every message:

- pending round == ack: the server accepted it; it becomes committed (an algorithm with a
  ``client_finish`` must also have received that round's finish, else the state is lost);
- pending round != ack: the server rejected or never got it; it is dropped;
- then committed round must equal ack, else the node's state is lost (a SuperNode restarted
  without durable state, a finish that never arrived): it answers ``lost_state`` and the
  server excludes it from then on. It is never silently mixed in.

State lives in ``context.state`` (per node and run) and, when the node is given a
``state-dir`` in its node config, in a file there as well, written before each reply, so
that a SuperNode killed with SIGKILL and restarted continues exactly.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, NamedTuple

import torch
from flwr.app import ConfigRecord, RecordDict

from ..algorithms import make_algorithm
from ..algorithms.importing import algorithm_imports
from ..engine.tree import gather_rows
from ..io.atomic import open_atomic
from ..problems import make_problem
from .codec import Malformed, RunSpec, decode_tree, encode_tree

NO_ROUND = -2  # pending_round when nothing is pending
META, COMMITTED, PENDING = "focusfl.meta", "focusfl.committed", "focusfl.pending"
DTYPES = {"float32": torch.float32, "float64": torch.float64}


class LostState(Exception):
    """The node's state does not match the server's record of it."""


class Built(NamedTuple):
    algorithm: Any
    problem: Any
    initial: Any  # State from algorithm.init: templates for server fields and client rows


# A node's own permission (its node config, the operator's word) to import the algorithm code a
# run names: ``allow-algorithm-import=true``; `federation local --allow-algorithm-import` sets it.
ALLOW_IMPORT = "allow-algorithm-import"


@functools.lru_cache(maxsize=4)
def _build(run_key: str, data_path: str | None, allow_import: bool = False) -> Built:
    spec = RunSpec(**json.loads(run_key))
    if spec.dtype not in DTYPES:
        raise Malformed("malformed", f"unknown dtype {spec.dtype!r}")
    problem = make_problem(node_problem(spec.problem, data_path), dtype=DTYPES[spec.dtype])
    # The record carries the code's SHA-256: a node whose copy differs from the server's refuses.
    with algorithm_imports(allow_import):
        algorithm = make_algorithm(spec.algorithm)
    return Built(algorithm, problem, algorithm.init(problem.initial_point(), problem.num_clients))


def node_problem(spec: dict, data_path: str | None) -> dict:
    """The run's problem SPEC with this node's copy of the data (``data-path`` in its node
    config; nn problems only): an .npz file replaces ``data``; a folder replaces ``data_dir``,
    where a named data set (``data=mnist``) or a relative .npz name is then looked for.

    Hugging Face problems (``data=hf:PATH``, problems/hf.py) name up to three folders: the
    dataset, the tokenizer and the model. A folder ``data-path`` holds the node's copies of
    them under their own names: ``data=hf:/srv/sst2``, ``tokenizer=/srv/bert`` and
    ``model=hf:/srv/bert`` are read from DATA-PATH/sst2, DATA-PATH/bert and DATA-PATH/bert
    (the last component of each path, absolute or relative); a file ``data-path`` replaces the
    dataset alone (a .parquet, .csv or .json file)."""
    spec = dict(spec)
    if data_path is None or spec.get("name") != "nn":
        return spec
    path = Path(data_path).expanduser()
    if str(spec.get("data", "")).startswith("hf:"):
        return hf_node_problem(spec, path)
    if path.is_dir():
        spec["data_dir"] = str(path)
    else:
        spec["data"] = str(path)
    return spec


def hf_node_problem(spec: dict, path: Path) -> dict:
    """``node_problem`` of a ``data=hf:...`` SPEC: its folders rebased into ``path``."""
    if not path.is_dir():
        return {**spec, "data": f"hf:{path}"}

    def mine(name: str) -> str:
        return str(path / Path(name).expanduser().name)

    spec["data"] = "hf:" + mine(spec["data"][3:])
    if spec.get("tokenizer"):
        spec["tokenizer"] = mine(str(spec["tokenizer"]))
    kind, _, folder = str(spec.get("model", "")).partition(":")
    if kind in ("hf", "hf-config") and folder:
        spec["model"] = f"{kind}:{mine(folder)}"
    return spec


def data_fingerprint(problem: Any) -> str:
    """The digest of a problem's client data ("" for problems built from the seed alone)."""
    fingerprint = getattr(problem, "data_fingerprint", None)
    return fingerprint() if callable(fingerprint) else ""


def build(run: RunSpec, node_config: dict | None = None) -> Built:
    """Algorithm, problem and initial state of a run (cached: building a problem can be slow)."""
    data_path = (node_config or {}).get("data-path")
    allow_import = (node_config or {}).get(ALLOW_IMPORT) in (True, "true")
    return _build(run.key(), None if data_path is None else str(data_path), allow_import)


def has_memory(clients: Any) -> bool:
    """Whether an algorithm keeps anything per client (NoClientState has zero-width rows)."""
    return any(field[0].numel() > 0 for field in clients)


class Memory(NamedTuple):
    """One node's record of its client."""

    client: int
    committed_round: int
    committed: Any  # client rows [1, ...]
    pending_round: int
    pending: Any | None
    pending_finished: bool


def fresh(built: Built, client: int) -> Memory:
    rows = gather_rows(built.initial.clients, torch.tensor([client]))
    return Memory(client, -1, rows, NO_ROUND, None, False)


def sync(memory: Memory, ack: int, *, tracked: bool) -> Memory:
    """Apply the server's acknowledgement ``ack``; LostState if the node cannot follow it.

    ``tracked`` False (an algorithm without client memory): nothing to lose, always in sync."""
    if memory.pending is not None and memory.pending_round == ack:
        if not memory.pending_finished:
            if tracked:
                raise LostState(f"round {ack} was accepted but its finish never reached this node")
        memory = memory._replace(committed_round=ack, committed=memory.pending)
    memory = memory._replace(pending_round=NO_ROUND, pending=None, pending_finished=False)
    if tracked and memory.committed_round != ack:
        raise LostState(f"the node holds the state of round {memory.committed_round}, "
                        f"the server recorded round {ack}")
    return memory._replace(committed_round=ack)


# -- where the memory is kept ----------------------------------------------------------------
def load(state: RecordDict, built: Built, run: RunSpec, node_config: dict) -> Memory | None:
    """The node's memory for this run: from context.state, else from its durable file."""
    meta = state.get(META) if hasattr(state, "get") else None
    if isinstance(meta, ConfigRecord) and meta.get("token") == run.token:
        template = gather_rows(built.initial.clients, torch.tensor([int(meta["client"])]))
        committed = decode_tree(state[COMMITTED], template)
        pending = decode_tree(state[PENDING], template) if PENDING in state else None
        return Memory(int(meta["client"]), int(meta["committed_round"]), committed,
                      int(meta["pending_round"]), pending, bool(meta["pending_finished"]))
    path = durable_path(node_config, run)
    if path is not None and path.is_file():
        saved = torch.load(path, weights_only=True)
        cls = type(built.initial.clients)
        pending = None if saved["pending"] is None else cls(**saved["pending"])
        return Memory(saved["client"], saved["committed_round"], cls(**saved["committed"]),
                      saved["pending_round"], pending, saved["pending_finished"])
    return None


def store(state: RecordDict, memory: Memory, run: RunSpec, node_config: dict) -> None:
    state[META] = ConfigRecord({"token": run.token, "client": memory.client,
                                "committed_round": memory.committed_round,
                                "pending_round": memory.pending_round,
                                "pending_finished": memory.pending_finished})
    state[COMMITTED] = encode_tree(memory.committed)
    if memory.pending is not None:
        state[PENDING] = encode_tree(memory.pending)
    elif PENDING in state:
        del state[PENDING]
    path = durable_path(node_config, run)
    if path is not None:
        saved = {"client": memory.client, "committed_round": memory.committed_round,
                 "committed": {k: v.clone() for k, v in memory.committed._asdict().items()},
                 "pending_round": memory.pending_round, "pending_finished": memory.pending_finished,
                 "pending": None if memory.pending is None else
                 {k: v.clone() for k, v in memory.pending._asdict().items()}}
        path.parent.mkdir(parents=True, exist_ok=True)
        # A scratch name of its own (a user may give several nodes one state-dir); mode 0600.
        with open_atomic(path, "wb", durable=True, unique=True, private=True) as handle:
            torch.save(saved, handle)


def durable_path(node_config: dict, run: RunSpec) -> Path | None:
    folder = (node_config or {}).get("state-dir")
    if not folder:
        return None
    token = "".join(c for c in run.token if c.isalnum() or c in "-_")[:64]
    return Path(str(folder)) / f"focusfl-{token}.pt"

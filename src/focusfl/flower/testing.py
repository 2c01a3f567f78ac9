"""An in-process Grid that runs the real ClientApp on simulated nodes and injects faults.

No Ray, no processes, no network: ``FakeGrid.send_and_receive`` hands each message to the
ClientApp of its node (with that node's own persistent Context) and returns the replies,
after passing them through a :class:`Faults` plan that loses, duplicates, corrupts, delays or
misaddresses them, keyed by (seed, round, node) so a test replays exactly. Nodes can be
killed (replies then come from the "SuperLink" as errors, as in Flower) and restarted (a new
node id and an empty Context, as a restarted SuperNode gets).
"""
from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Error, Message, RecordDict
from flwr.serverapp import Grid

from .codec import CTX, MESSAGE, pack, unpack

FAULTS = ("drop_request", "drop_reply", "superlink_error", "nan", "inf", "shape", "dtype", "duplicate",
          "stale", "late", "foreign", "extra_field")


@dataclass
class Faults:
    """Probability of each fault per train reply (others are exact); ``finish`` for finishes."""

    rates: dict[str, float] = field(default_factory=dict)
    finish_drop: float = 0.0
    seed: int = 0

    def draw(self, kind: str, round_: int, node: int) -> str | None:
        rng = np.random.default_rng([self.seed, round_ + 1, node, 1 if kind == "train" else 2])
        if kind == "train.finish":
            u = rng.random()  # half the lost finishes never reach the node, half lose the reply
            return None if u >= self.finish_drop else "drop_request" if u < self.finish_drop / 2 else "drop_reply"
        if kind != "train":
            return None
        u = rng.random()
        for name in FAULTS:
            u -= self.rates.get(name, 0.0)
            if u < 0:
                return name
        return None


class FakeNode:
    def __init__(self, node_id: int, node_config: dict) -> None:
        self.node_id = node_id
        self.context = Context(run_id=1, node_id=node_id, node_config=dict(node_config), state=RecordDict(),
                               run_config={})
        self.alive = True


class FakeGrid(Grid):
    """A Grid over in-process nodes; ``partitions``: the partition id of each node."""

    def __init__(self, app, partitions: Iterable[int], *, faults: Faults | None = None,
                 node_config: dict | None = None) -> None:
        from flwr.supercore.task_identity import TaskIdentity

        # Flower's ServerApp runtime sets the sender's identity before any Message is made.
        TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
        self.app = app
        self.faults = faults or Faults()
        self.extra_config = dict(node_config or {})
        self._ids = itertools.count(1001)
        self.nodes: dict[int, FakeNode] = {}
        self.held: list[Message] = []  # late replies, delivered with the next exchange
        self.exchanges = 0
        for partition in partitions:
            self.add_node(partition)

    # -- node life ---------------------------------------------------------------------------
    def add_node(self, partition: int, **config) -> int:
        node = FakeNode(next(self._ids), {"partition-id": partition, **self.extra_config, **config})
        self.nodes[node.node_id] = node
        return node.node_id

    def kill(self, node_id: int) -> None:
        self.nodes[node_id].alive = False

    def restart(self, node_id: int) -> int:
        """The node's process restarts: a new node id, an empty context (durable files stay)."""
        old = self.nodes.pop(node_id)
        new = FakeNode(next(self._ids), old.context.node_config)
        self.nodes[new.node_id] = new
        return new.node_id

    def node_of(self, partition: int) -> int:
        return next(n for n, node in self.nodes.items() if node.alive and node.context.node_config["partition-id"] == partition)

    # -- Grid --------------------------------------------------------------------------------
    def set_run(self, run) -> None:
        self._run = run

    @property
    def run(self):
        return getattr(self, "_run", None)

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> list[int]:
        return [n for n, node in self.nodes.items() if node.alive]

    def push_messages(self, messages):
        raise NotImplementedError("FakeGrid answers in send_and_receive only")

    def pull_messages(self, message_ids):
        raise NotImplementedError("FakeGrid answers in send_and_receive only")

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        self.exchanges += 1
        replies, self.held = list(self.held), []
        for message in messages:
            message.metadata.__dict__["_message_id"] = uuid.uuid4().hex
            replies.extend(self._deliver(message))
        return replies

    def _deliver(self, message: Message) -> list[Message]:
        node = self.nodes.get(message.metadata.dst_node_id)
        if node is None or not node.alive:
            return [_superlink_error(message)]
        kind = message.metadata.message_type
        round_ = int(message.metadata.group_id) if message.metadata.group_id.isdigit() else -1
        fault = self.faults.draw(kind, round_, node.node_id)
        if fault in ("drop_request", "superlink_error"):
            return [_superlink_error(message)] if fault == "superlink_error" else []
        reply = self.app(message, node.context)
        if fault is None or reply.has_error():
            return [reply] if fault != "drop_reply" else []
        if fault == "drop_reply":
            return []
        if fault == "duplicate":
            return [reply, reply]
        if fault == "late":
            self.held.append(reply)
            return []
        if fault == "foreign":
            reply.metadata.__dict__["_src_node_id"] = 999_999
            return [reply]
        records = unpack(reply.content)  # faults change what the node sent, then pack it again
        if fault == "stale":
            ctx = records[CTX]
            records[CTX] = ConfigRecord({"round": int(ctx["round"]) - 1, "client": ctx["client"]})
            reply.content = pack(records)
            return [reply]
        record = records[MESSAGE]
        name = next(iter(record.keys()))
        data = record[name].numpy()
        if fault == "nan":
            data = data.copy()
            data.flat[0] = np.nan
        elif fault == "inf":
            data = data.copy()
            data.flat[-1] = np.inf
        elif fault == "shape":
            data = np.concatenate([data, data], axis=0)
        elif fault == "dtype":
            data = data.astype(np.float32)
        elif fault == "extra_field":
            record["bogus"] = Array(np.zeros(1))
            reply.content = pack(records)
            return [reply]
        corrupted = ArrayRecord()
        for key in record.keys():
            corrupted[key] = Array(data) if key == name else record[key]
        records[MESSAGE] = corrupted
        reply.content = pack(records)
        return [reply]


def _superlink_error(message: Message) -> Message:
    """What Flower returns for a message to a node that is gone: an error from the SuperLink."""
    reply = Message(Error(code=3, reason="Node is unavailable"), reply_to=message)
    reply.metadata.__dict__["_src_node_id"] = 0
    return reply

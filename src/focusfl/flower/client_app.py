"""The ClientApp: a Flower node runs one focusfl client.

Message types (all carry the run's RunSpec, so a node needs nothing but its partition id):

- ``query``: handshake; the node answers with its client index (``partition-id`` from its
  node config), the round its memory holds for this run and the digest of its client data
  (nn problems: the server refuses a node whose copy of the data set differs from its own).
- ``train``: one client round. The node applies the server's acknowledgement (node.py),
  runs ``algorithm.client_round`` on its row with the problem's oracle bound to its index,
  (exactly the reference engine's call for one client, with the step count the server asks
  for, if any), keeps the new rows as pending and answers with the message (under local DP,
  ``--dp mode=local``, clipped and noised on the node first; a node whose config sets
  ``dp-min-noise`` refuses every message of a run with less local noise: dp_floor.py), the number
  of local steps it took and the minibatch losses of those steps (nn problems): fewer than asked when its ``deadline`` (node config, seconds)
  cut the round short (deadline.py).
- ``train.finish``: ``client_finish`` on the pending rows, with the new server state
  (algorithms that have one: FedAWE, ProxSkip).
- ``query.state``: the node's committed rows, for the audit at the end of a run.

Every failure is answered with an error reply whose reason starts with ``focusfl:<reason>``;
the node never raises into Flower.
"""
from __future__ import annotations

import torch
from flwr.app import ConfigRecord, Context, Error, Message
from flwr.clientapp import ClientApp

from ..algorithms.base import Algorithm
from ..privacy.mechanism import privatize
from ..threads import fixed_threads
from .codec import (
    CTX,
    MESSAGE,
    ROWS,
    RUN,
    SERVER,
    STATUS,
    Malformed,
    decode_ctx,
    decode_run,
    decode_tree,
    encode_tree,
    node_dp,
    pack,
    round_context,
    unpack,
)
from .deadline import local_work, node_deadline
from .dp_floor import check_floor, node_floor
from .node import NO_ROUND, LostState, Memory, build, data_fingerprint, fresh, has_memory, load, store, sync

ERROR_CODE = 4100  # every focusfl error reply; the reason names what went wrong


def error_reply(message: Message, reason: str, detail: str) -> Message:
    return Message(Error(code=ERROR_CODE, reason=f"focusfl:{reason} {detail}"[:500]), reply_to=message)


def partition_id(context: Context, num_clients: int) -> int:
    value = context.node_config.get("partition-id")
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < num_clients:
        raise Malformed("malformed", f"node config partition-id={value!r} is not a client index "
                                     f"in 0..{num_clients - 1}")
    return value


def _node(records: dict, context: Context):
    run = decode_run(records.get(RUN))
    # The owner's floor on local noise, before any work: a run below it is refused at the handshake.
    check_floor(node_dp(run), node_floor(dict(context.node_config)))
    built = build(run, dict(context.node_config))
    client = partition_id(context, built.problem.num_clients)
    memory = load(context.state, built, run, dict(context.node_config))
    if memory is not None and memory.client != client:
        raise Malformed("malformed", f"node memory is client {memory.client}, partition-id is {client}")
    return run, built, client, memory


def handle(message: Message, context: Context) -> Message:
    """Answer one message (every type), computing with one torch thread as the reference replay
    does (the thread count changes float results: focusfl/threads.py)."""
    with fixed_threads():
        return _handle(message, context)


def _handle(message: Message, context: Context) -> Message:
    """Answer one message (every type); errors become error replies."""
    kind = message.metadata.message_type
    try:
        records = unpack(message.content)
        run, built, client, memory = _node(records, context)
        if kind == "query":
            status = {"client": client, "num_clients": built.problem.num_clients,
                      "committed_round": -1 if memory is None else memory.committed_round,
                      "token": run.token, "data": data_fingerprint(built.problem)}
            return Message(pack({STATUS: ConfigRecord(status)}), reply_to=message)
        ctx = decode_ctx(records.get(CTX))
        if ctx.client != client:
            raise Malformed("malformed", f"message for client {ctx.client} reached client {client}")
        if ctx.num_clients != built.problem.num_clients:
            raise Malformed("malformed", f"num_clients {ctx.num_clients} != {built.problem.num_clients}")
        if kind == "query.state":  # the audit: commit what the server acknowledges, then report
            memory = sync(fresh(built, client) if memory is None else memory, ctx.ack,
                          tracked=has_memory(built.initial.clients))
            store(context.state, memory, run, dict(context.node_config))
            content = pack({ROWS: encode_tree(memory.committed),
                            STATUS: ConfigRecord({"client": client, "committed_round": memory.committed_round})})
            return Message(content, reply_to=message)
        if kind == "train":
            return _train(message, records, context, run, built, ctx, memory)
        if kind == "train.finish":
            return _finish(message, records, context, run, built, ctx, memory)
        raise Malformed("malformed", f"unknown message type {kind!r}")
    except LostState as exc:
        return error_reply(message, "lost_state", str(exc))
    except Malformed as exc:
        return error_reply(message, exc.reason, exc.detail or str(exc))
    except Exception as exc:  # a node answers; it does not crash its SuperNode
        return error_reply(message, "client_failure", f"{type(exc).__name__}: {exc}")


def _train(message, records, context, run, built, ctx, memory: Memory | None) -> Message:
    algorithm, problem = built.algorithm, built.problem
    tracked = has_memory(built.initial.clients)
    if memory is None:
        memory = fresh(built, ctx.client)
    memory = sync(memory, ctx.ack, tracked=tracked)
    if ctx.steps > algorithm.local_steps:
        raise Malformed("malformed", f"asked for {ctx.steps} steps, local_steps is {algorithm.local_steps}")
    deadline = node_deadline(dict(context.node_config))
    server = decode_tree(records.get(SERVER), built.initial.server, _fields(records))
    one = round_context(ctx)
    rows, out, steps, losses = local_work(algorithm, problem, server, memory.committed, one, run.seed, deadline)
    out = _noised(run, one, out)
    finished = not has_finish(algorithm)
    memory = memory._replace(pending_round=ctx.round, pending=_own(rows), pending_finished=finished)
    # Stored (and written to disk) before the reply leaves: a node killed after answering
    # still has the rows the server may accept.
    store(context.state, memory, run, dict(context.node_config))
    reply = {"round": ctx.round, "client": ctx.client, "steps": steps}
    if losses:  # the minibatch losses of its steps: the server's rows report them as train_loss
        reply["losses"] = losses
    if deadline is not None:
        reply["deadline"] = deadline
    content = pack({MESSAGE: encode_tree(out), CTX: ConfigRecord(reply)})
    return Message(content, reply_to=message)


def _noised(run, one, message):
    """Local DP: the message clipped and noised here, before it leaves the node, so the server
    never holds it bare. The noise is the simulation's for this client's row (keyed by seed,
    the nonce of the dp record the server sends, round, client, field and coordinate, mechanism.py), so the federation computes what
    ``focusfl run`` does. The node's own rows (its state) stay exact, as in a simulation."""
    dp = node_dp(run)
    return message if dp is None else privatize(dp, message, one.active, one.round, run.seed)


def _finish(message, records, context, run, built, ctx, memory: Memory | None) -> Message:
    if memory is None or memory.pending is None or memory.pending_round != ctx.round:
        held = NO_ROUND if memory is None else memory.pending_round
        raise LostState(f"finish of round {ctx.round}, but the node holds pending round {held}")
    server = decode_tree(records.get(SERVER), built.initial.server, _fields(records))
    rows = built.algorithm.client_finish(server, memory.pending, round_context(ctx))
    memory = memory._replace(pending=_own(rows), pending_finished=True)
    store(context.state, memory, run, dict(context.node_config))
    return Message(pack({CTX: ConfigRecord({"round": ctx.round, "client": ctx.client})}), reply_to=message)


def _fields(records: dict) -> tuple[str, ...]:
    return tuple(records[SERVER].keys()) if SERVER in records else ()


def _own(rows):
    """Rows as tensors of their own (views of the server's broadcast are not stored)."""
    return type(rows)(*(torch.as_tensor(field).clone() for field in rows))


def has_finish(algorithm) -> bool:
    return type(algorithm).client_finish is not Algorithm.client_finish


def make_client_app() -> ClientApp:
    app = ClientApp()
    app.train()(handle)
    app.train("finish")(handle)
    app.query()(handle)
    app.query("state")(handle)
    return app


app = make_client_app()

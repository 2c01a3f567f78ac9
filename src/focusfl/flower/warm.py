"""A warm SuperNode for loopback federations: no process and no imports per message.

Flower 1.42's ``flower-supernode`` (default ``--isolation subprocess``) starts a
``flower-superexec`` that launches a fresh ``flwr-clientapp`` process for every message
(importing flwr, torch and focusfl each time), and its loops poll with fixed sleeps: the
SuperNode asks the SuperLink for a message every 3 s when idle and checks for a reply every
0.5 s (``flwr/supernode/start_client_internal.py``), SuperExec asks for a task every 1 s.

``python -m focusfl.flower.warm ARGS`` runs ``flower-supernode ARGS --isolation process``
(the SuperNode starts no SuperExec) and, in a thread of the same process, an executor that
acquires the node's ClientApp tasks from the SuperNode's Runtime API and runs each one the
way ``flwr-clientapp`` does (pull the message and context, call the ClientApp, push the reply
and the new context), but in this already warm process. Being in the SuperNode's process, it
calls the Runtime API's own handlers on the node's state (:class:`InProcessRuntime`) rather
than through HTTP: the same requests and responses, each a function call, not a loopback
round trip of a few milliseconds (a task took about 20 such requests). Its sleeps end early on
events (a message stored wakes the executor; a reply pushed wakes the SuperNode's loop), its
polls start at FIRST_POLL seconds after the node last had work and double up to POLL while
nothing comes, and the backoff of pulls of a message's objects (Flower: 1 s, doubling) does the
same. Only
focusfl's own Flower app runs in process: a task of any other app is answered with an error.
The messages, contexts and the ClientApp's computation are the same (one torch thread:
focusfl/threads.py), so results are unchanged. benchmarks/flower_latency.py measures it.
"""
from __future__ import annotations

import functools
import importlib
import sys
import threading
import time

from .client_app import app

# The SuperNode's polls (Flower: 3 s idle, 0.5 s for a reply, 1 s for a task) start at FIRST_POLL
# seconds after the node last had work and double while nothing comes, up to POLL: the next
# round's message comes within a fraction of a second of the last reply, and a node polling
# every few milliseconds all the time would spend the CPU the federation's processes share
# (each poll is signed and verified: on 2 cores, idle polls at 20 Hz took a third of a core
# per node and slowed every exchange; starting at 5 ms rather than 20 ms saved nothing measurable).
FIRST_POLL = 0.02
POLL = 0.2
IDLE = 0.5  # seconds between the executor's asks for a task when TASK_STORED does not wake it first
APP_ID = "focusfl/focusfl-federation"  # publisher/name of the app local.py writes


# Events that end the warm node's sleeps as soon as there is something to do: the SuperNode's
# loop stored a message (the executor stops waiting for a task), and the executor pushed the
# ClientApp's reply (the SuperNode's loop stops waiting for it). The loops still check their
# state after every wake-up, so a missed event costs one poll, never a result.
TASK_STORED = threading.Event()
REPLY_PUSHED = threading.Event()


def _nap(wake: threading.Event, seconds: float) -> None:
    """Sleep ``seconds``, or less if ``wake`` is set meanwhile (then cleared for the next nap)."""
    if wake.wait(seconds):
        wake.clear()


class Pacer:
    """``time`` for Flower's SuperNode loop: every sleep is at most the current pause, which
    starts at ``first`` after activity (``active``) and doubles with each sleep up to ``cap``;
    REPLY_PUSHED ends a sleep early."""

    def __init__(self, first: float = FIRST_POLL, cap: float = POLL) -> None:
        self.first, self.cap, self.pause = first, cap, first
        for name in dir(time):
            if not name.startswith("_") and name != "sleep":
                setattr(self, name, getattr(time, name))

    def active(self) -> None:
        self.pause = self.first

    def sleep(self, seconds: float) -> None:
        pause, self.pause = min(seconds, self.pause), min(2 * self.pause, self.cap)
        _nap(REPLY_PUSHED, pause)


def _announcing(pull_and_store, pacer: Pacer):
    """The SuperNode's ``_pull_and_store_message``, setting TASK_STORED (and the pacer back to
    short polls) when it stored a message."""
    @functools.wraps(pull_and_store)
    def pulled(*args, **kwargs):
        run_id = pull_and_store(*args, **kwargs)
        if run_id is not None:
            pacer.active()
            TASK_STORED.set()
        return run_id
    return pulled


def _then_active(push, pacer: Pacer):
    """The SuperNode's ``_push_messages``, setting the pacer back to short polls once a reply is
    sent: the next round's message is on its way."""
    @functools.wraps(push)
    def pushed(*args, **kwargs):
        push(*args, **kwargs)
        pacer.active()
    return pushed


class InProcessRuntime:
    """The SuperNode's Runtime API for an executor in the SuperNode's own process.

    Each method of Flower's ``RuntimeHttpClient`` that a ClientApp task uses calls the handler
    Flower's Runtime router would call for it (flwr.supernode.servicer.runtime, and the shared
    heartbeat handler) on the node's state, with the task its token names, as the router's
    authentication does. Requests and responses are the same protobuf messages; a handler's
    FlowerError reaches the caller as an exception, as an HTTP error would."""

    def __init__(self, state, token: str | None = None) -> None:
        from flwr.supercore.servicer.runtime import runtime_handlers as shared
        from flwr.supernode.servicer.runtime import runtime_handlers as node

        self.state, self.token = state, token
        self._calls = {"PullTaskInput": node.pull_task_input, "PushTaskOutput": node.push_task_output,
                       "PullMessages": node.pull_messages, "PushMessages": node.push_messages,
                       "PullObject": node.pull_object, "PushObject": node.push_object,
                       "ConfirmMessageReceived": node.confirm_message_received,
                       "SendTaskHeartbeat": shared.send_task_heartbeat}
        self._acquire = node.acquire_task

    def AcquireTask(self, request):
        return self._acquire(request, self.state)

    def __getattr__(self, name: str):
        handler = self.__dict__.get("_calls", {}).get(name)
        if handler is None:
            raise AttributeError(name)
        return lambda request: handler(request, self.state, self._task())

    def _task(self):
        task = self.state.get_task_by_token(self.token) if self.token else None
        if task is None:
            raise RuntimeError("Runtime task-token authentication failed")
        return task



def run_task(runtime: InProcessRuntime, app) -> None:
    """One ClientApp task, as ``flwr.supernode.runtime.run_clientapp`` runs it, in this process
    (``runtime``: the node's Runtime API for the task's token)."""
    from flwr.app import Message
    from flwr.app.error import Error
    from flwr.common.constant import ErrorCode, SubStatus
    from flwr.supercore.heartbeat import HeartbeatSender, make_task_heartbeat_fn_http
    from flwr.supernode.runtime.run_clientapp import push_message, push_task_output

    heartbeat = HeartbeatSender(make_task_heartbeat_fn_http(runtime))
    message = reply = context = None
    status, details = SubStatus.FAILED, "ClientApp task failed"
    try:
        heartbeat.start()
        message, context, run, _fab = pull_task_input(runtime)
        if run.fab_id != APP_ID:
            raise RuntimeError(f"warm executor runs only {APP_ID}, not {run.fab_id}")
        reply = app(message=message, context=context)
        status, details = SubStatus.COMPLETED, ""
    except Exception as exc:  # as flwr-clientapp: an error reply, the task marked failed
        details = f"{type(exc)}:<'{exc}'>"
        if message is not None:
            reply = Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=details), reply_to=message)
    finally:
        try:
            if reply is not None and context is not None:
                push_message(runtime, reply, context)
                REPLY_PUSHED.set()
        finally:
            push_task_output(client=runtime, context=context, sub_status=status, details=details)
            if heartbeat.is_running:
                heartbeat.stop()


def pull_task_input(client):
    """``flwr.supernode.runtime.run_clientapp.pull_task_input`` with a short backoff: the
    SuperNode offers the task before it holds the message's objects, and Flower's pull waits
    1 s, then 2 s, ... for an object that is not there yet (supercore/inflatable)."""
    from flwr.app import Message
    from flwr.common.serde import context_from_proto, fab_from_proto, run_from_proto
    from flwr.proto.node_pb2 import Node  # pylint: disable=E0611
    from flwr.proto.runtime_pb2 import PullAppMessagesRequest, PullTaskInputRequest  # pylint: disable=E0611
    from flwr.supercore.inflatable.inflatable_protobuf_utils import (
        make_confirm_message_received_fn_protobuf,
        make_pull_object_fn_protobuf,
    )
    from flwr.supercore.inflatable.inflatable_utils import pull_and_inflate_object_from_tree
    from flwr.supercore.task_identity import TaskIdentity

    res = client.PullTaskInput(PullTaskInputRequest())
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = res.task_id, res.run.run_id, res.context.node_id
    context, run, fab = context_from_proto(res.context), run_from_proto(res.run), fab_from_proto(res.fab)
    pulled = client.PullMessages(PullAppMessagesRequest())
    if not pulled.messages_list:
        raise RuntimeError("No messages received from Runtime API")
    node, tree = Node(node_id=context.node_id), pulled.message_object_trees[0]
    message = pull_and_inflate_object_from_tree(
        tree, make_pull_object_fn_protobuf(client.PullObject, node, context.run_id),
        make_confirm_message_received_fn_protobuf(client.ConfirmMessageReceived, node, context.run_id),
        return_type=Message, initial_backoff=FIRST_POLL, backoff_cap=POLL)
    message.metadata.__dict__["_message_id"] = tree.object_id
    return message, context, run, fab


def serve(state) -> None:
    """Acquire this SuperNode's tasks (from its NodeState ``state``) forever; run focusfl's
    ClientApp tasks in process."""
    from flwr.proto.runtime_pb2 import AcquireTaskRequest  # pylint: disable=E0611
    from flwr.supercore.constant import TaskType

    executor = InProcessRuntime(state)
    while True:
        try:
            res = executor.AcquireTask(AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP],
                                                          agentapp_fab_hashes=[]))
        except Exception:  # the node's state not ready yet (or going down)
            time.sleep(0.2)
            continue
        if res.HasField("task") and res.token:
            try:
                run_task(InProcessRuntime(state, res.token), app)
            except Exception as exc:  # a handler's error reaches us as an exception, not over HTTP:
                # the task is lost (the server counts a timeout), the executor goes on
                print(f"focusfl warm executor: task {res.task.task_id} failed: {exc}", file=sys.stderr, flush=True)
        else:
            _nap(TASK_STORED, IDLE)


def _serving(start_client_internal):
    """flower-supernode's ``start_client_internal``, which first starts the executor's thread on
    the node's state (the one its Runtime API serves)."""
    @functools.wraps(start_client_internal)
    def started(*args, state_factory, **kwargs):
        threading.Thread(target=serve, args=(state_factory.state(),), name="focusfl-warm-executor",
                         daemon=True).start()
        return start_client_internal(*args, state_factory=state_factory, **kwargs)
    return started


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--port" not in argv:
        raise SystemExit("focusfl.flower.warm needs the SuperNode's --port (its Runtime API)")
    import flwr.supernode.start_client_internal as internal

    # the module (flwr.supernode.cli exports a function of the same name)
    cli = importlib.import_module("flwr.supernode.cli.flower_supernode")

    internal.time = pacer = Pacer()
    internal._pull_and_store_message = _announcing(internal._pull_and_store_message, pacer)
    internal._push_messages = _then_active(internal._push_messages, pacer)
    # the SuperNode's pulls of a message's objects from the SuperLink: the same short backoff
    internal.pull_objects = functools.partial(internal.pull_objects, initial_backoff=FIRST_POLL, backoff_cap=POLL)
    cli.start_client_internal = _serving(cli.start_client_internal)
    sys.argv = ["flower-supernode", *argv, "--isolation", "process"]
    cli.flower_supernode()


if __name__ == "__main__":
    main()

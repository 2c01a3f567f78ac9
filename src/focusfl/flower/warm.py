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
and the new context), but in this already warm process. It also shortens those sleeps to
``POLL`` seconds, and the backoff of pulls of a message's objects (1 s, then doubling) to
``POLL`` seconds, doubling up to 0.5 s. Only focusfl's own Flower app runs in process: a task of any other app is
answered with an error. The messages, contexts and the ClientApp's
computation are the same (one torch thread: focusfl/threads.py), so results are unchanged.
"""
from __future__ import annotations

import functools
import sys
import threading
import time
from types import SimpleNamespace

from .client_app import app

POLL = 0.05  # seconds between polls (Flower: 3 s idle, 0.5 s for replies, 1 s for tasks)
APP_ID = "focusfl/focusfl-federation"  # publisher/name of the app local.py writes


def _fast_time(poll: float) -> SimpleNamespace:
    """``time`` with every sleep capped at ``poll`` seconds (for Flower's polling loops)."""
    names = {name: getattr(time, name) for name in dir(time) if not name.startswith("_")}
    return SimpleNamespace(**{**names, "sleep": lambda seconds: time.sleep(min(seconds, poll))})


def run_task(address: str, token: str, app) -> None:
    """One ClientApp task, as ``flwr.supernode.runtime.run_clientapp`` runs it, in this process."""
    from flwr.app import Message
    from flwr.app.error import Error
    from flwr.common.constant import ErrorCode, SubStatus
    from flwr.supercore.heartbeat import HeartbeatSender, make_task_heartbeat_fn_http
    from flwr.supercore.interceptors import RuntimeTokenHttpInterceptor, RuntimeVersionHttpInterceptor
    from flwr.supercore.retry import make_simple_http_retry_invoker
    from flwr.supercore.runtime import RuntimeHttpClient
    from flwr.supernode.runtime.run_clientapp import push_message, push_task_output

    retry = make_simple_http_retry_invoker()
    client = RuntimeHttpClient.from_server_address(
        server_address=address, insecure=True, root_certificates=None, retry_invoker=retry,
        interceptors=[RuntimeVersionHttpInterceptor(component_name="flwr-clientapp"),
                      RuntimeTokenHttpInterceptor(token)])
    heartbeat = HeartbeatSender(make_task_heartbeat_fn_http(client))
    message = reply = context = None
    status, details = SubStatus.FAILED, "ClientApp task failed"
    try:
        heartbeat.start()
        message, context, run, _fab = pull_task_input(client)
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
                push_message(client, reply, context)
        finally:
            retry.max_tries = 1
            push_task_output(client=client, context=context, sub_status=status, details=details)
            if heartbeat.is_running:
                heartbeat.stop()
            client.close()


def pull_task_input(client, poll: float = POLL):
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
        return_type=Message, initial_backoff=poll, backoff_cap=0.5)
    message.metadata.__dict__["_message_id"] = tree.object_id
    return message, context, run, fab


def serve(address: str, poll: float = POLL) -> None:
    """Acquire this SuperNode's tasks forever; run focusfl's ClientApp tasks in process."""
    from flwr.proto.runtime_pb2 import AcquireTaskRequest  # pylint: disable=E0611
    from flwr.supercore.constant import TaskType
    from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor
    from flwr.supercore.retry import make_simple_http_retry_invoker
    from flwr.supercore.runtime import RuntimeHttpClient

    client = RuntimeHttpClient.from_server_address(
        server_address=address, insecure=True, root_certificates=None,
        interceptors=[RuntimeVersionHttpInterceptor(component_name="SuperExec")],
        retry_invoker=make_simple_http_retry_invoker())
    while True:
        try:
            res = client.AcquireTask(AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP],
                                                        agentapp_fab_hashes=[]))
        except Exception:  # the SuperNode's API not up yet (or going down)
            time.sleep(0.2)
            continue
        if res.HasField("task") and res.token:
            run_task(address, res.token, app)
        else:
            time.sleep(poll)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--port" not in argv:
        raise SystemExit("focusfl.flower.warm needs the SuperNode's --port (its Runtime API)")
    address = f"127.0.0.1:{argv[argv.index('--port') + 1]}"
    import flwr.supernode.start_client_internal as internal
    from flwr.supernode.cli.flower_supernode import flower_supernode

    internal.time = _fast_time(POLL)
    # the SuperNode's pulls of a message's objects from the SuperLink: the same short backoff
    internal.pull_objects = functools.partial(internal.pull_objects, initial_backoff=POLL, backoff_cap=0.5)
    threading.Thread(target=serve, args=(address,), name="focusfl-warm-executor", daemon=True).start()
    sys.argv = ["flower-supernode", *argv, "--isolation", "process"]
    flower_supernode()


if __name__ == "__main__":
    main()

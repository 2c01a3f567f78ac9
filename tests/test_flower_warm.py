"""The warm SuperNode of `federation local` (focusfl.flower.warm): its pieces without processes.

The deployment tests (test_flower_deployment.py) run it for real: LocalFederation is warm by
default, and their federations must equal the reference replay bit for bit."""
import functools
import time

import pytest

pytest.importorskip("flwr")

from focusfl.flower import warm  # noqa: E402
from focusfl.flower.local import SUPEREXEC_POLL, LocalFederation  # noqa: E402


def test_pacer_caps_sleeps_doubles_them_while_idle_and_restarts_short_after_activity():
    pacer = warm.Pacer(first=0.001, cap=0.004)
    started = time.monotonic()
    pacer.sleep(3)  # Flower's idle sleep: capped
    assert time.monotonic() - started < 1
    assert [pacer.pause for _ in range(4) if pacer.sleep(3) is None] == [0.004, 0.004, 0.004, 0.004]
    pacer.active()
    assert pacer.pause == 0.001
    assert pacer.time is time.time and pacer.monotonic is time.monotonic


def test_a_pushed_reply_ends_the_nodes_sleep_and_a_stored_message_wakes_the_executor():
    pacer = warm.Pacer(first=30, cap=30)
    warm.REPLY_PUSHED.set()
    started = time.monotonic()
    pacer.sleep(30)
    assert time.monotonic() - started < 5 and not warm.REPLY_PUSHED.is_set()
    pacer = warm.Pacer(first=0.001, cap=30)
    pacer.pause = 30
    assert warm._announcing(lambda: 7, pacer)() == 7 and warm.TASK_STORED.is_set() and pacer.pause == 0.001
    pacer.pause = 30
    warm._then_active(lambda: None, pacer)()
    assert pacer.pause == 0.001
    warm.TASK_STORED.clear()
    assert warm._announcing(lambda: None, pacer)() is None and not warm.TASK_STORED.is_set()


def test_the_server_polls_short_after_news_and_doubles_while_waiting(monkeypatch):
    from flwr.superlink.grid.http_grid import HttpGrid

    from focusfl.flower import strategy

    class Reply:
        def __init__(self, to):
            self.metadata = type("M", (), {"reply_to_message_id": to})()

    class Grid(HttpGrid):
        def __init__(self):
            self.pulls = 0

        def push_messages(self, messages):
            return ["a", "b"]

        def pull_messages(self, ids):
            self.pulls += 1
            return [Reply("a")] if self.pulls == 4 else [Reply("b")] if self.pulls == 6 else []

    pauses = []
    monkeypatch.setattr(strategy.time, "sleep", pauses.append)
    replies = strategy.send_and_receive(Grid(), [], timeout=60)
    assert sorted(r.metadata.reply_to_message_id for r in replies) == ["a", "b"]
    first = strategy.FIRST_POLL
    assert pauses == [first, 2 * first, 4 * first, first, 2 * first]
    assert isinstance(strategy.http_grid.pull_objects, functools.partial)
    assert strategy.http_grid.pull_objects.keywords == {"initial_backoff": first, "backoff_cap": strategy.POLL}


def test_warm_needs_the_runtime_port():
    with pytest.raises(SystemExit, match="--port"):
        warm.main(["--superlink", "127.0.0.1:1"])


def test_local_federation_starts_warm_nodes_by_default(tmp_path):
    fed = LocalFederation(tmp_path, nodes=2)
    fed.port = 1
    assert fed.node_args(0)[1:3] == ["-m", "focusfl.flower.warm"]
    assert fed.env()["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] == SUPEREXEC_POLL
    cold = LocalFederation(tmp_path, nodes=2, warm=False)
    cold.port = 1
    assert cold.node_args(0)[0].endswith("flower-supernode")
    assert "FLWR_SUPEREXEC_TASK_POLL_INTERVAL" not in cold.env() or cold.env()["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] != SUPEREXEC_POLL


def test_the_in_process_runtime_calls_flowers_handlers_with_the_task_its_token_names():
    """The executor's Runtime API without HTTP: Flower's own handler, on the node's state, for
    the task the token authenticates; no task for the token, no call."""
    from flwr.proto.message_pb2 import PullObjectRequest  # pylint: disable=E0611
    from flwr.proto.task_pb2 import Task  # pylint: disable=E0611

    class State:
        def get_task_by_token(self, token):
            return Task(task_id=5, run_id=7) if token == "good" else None

        def get_object(self, run_id, object_id):
            return b"content" if (run_id, object_id) == (7, "abc") else None

    response = warm.InProcessRuntime(State(), "good").PullObject(PullObjectRequest(object_id="abc"))
    assert response.object_found and response.object_available and response.object_content == b"content"
    assert not warm.InProcessRuntime(State(), "good").PullObject(PullObjectRequest(object_id="x")).object_found
    with pytest.raises(RuntimeError, match="authentication"):
        warm.InProcessRuntime(State(), "forged").PullObject(PullObjectRequest(object_id="abc"))
    with pytest.raises(AttributeError):
        warm.InProcessRuntime(State(), "good").GetNodes


def test_the_executor_survives_a_task_whose_runtime_calls_fail(monkeypatch, capsys):
    """A handler's error reaches the in-process executor as an exception: that task is lost (the
    server times it out), the executor goes on to the next one."""
    from flwr.proto.runtime_pb2 import AcquireTaskResponse  # pylint: disable=E0611
    from flwr.proto.task_pb2 import Task  # pylint: disable=E0611

    asked = []

    class Stop(BaseException):
        pass

    def acquire(self, request):
        asked.append(1)
        if len(asked) > 2:
            raise Stop
        return AcquireTaskResponse(task=Task(task_id=len(asked)), token="t")

    def failing(runtime, app):
        raise RuntimeError("Runtime task-token authentication failed")

    monkeypatch.setattr(warm.InProcessRuntime, "AcquireTask", acquire)
    monkeypatch.setattr(warm, "run_task", failing)
    with pytest.raises(Stop):
        warm.serve(object())
    assert len(asked) == 3  # two failed tasks, then the next ask
    assert capsys.readouterr().err.count("failed: Runtime task-token authentication failed") == 2

"""The warm SuperNode of `federation local` (focusfl.flower.warm): its pieces without processes.

The deployment tests (test_flower_deployment.py) run it for real: LocalFederation is warm by
default, and their federations must equal the reference replay bit for bit."""
import time

import pytest

pytest.importorskip("flwr")

from focusfl.flower import warm  # noqa: E402
from focusfl.flower.local import LocalFederation  # noqa: E402


def test_fast_time_caps_sleeps_only():
    fast = warm._fast_time(0.01)
    started = time.monotonic()
    fast.sleep(3)
    assert time.monotonic() - started < 1
    assert fast.time is time.time and fast.monotonic is time.monotonic


def test_warm_needs_the_runtime_port():
    with pytest.raises(SystemExit, match="--port"):
        warm.main(["--superlink", "127.0.0.1:1"])


def test_local_federation_starts_warm_nodes_by_default(tmp_path):
    fed = LocalFederation(tmp_path, nodes=2)
    fed.port = 1
    assert fed.node_args(0)[1:3] == ["-m", "focusfl.flower.warm"]
    assert fed.env()["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] == "0.05"
    cold = LocalFederation(tmp_path, nodes=2, warm=False)
    cold.port = 1
    assert cold.node_args(0)[0].endswith("flower-supernode")
    assert "FLWR_SUPEREXEC_TASK_POLL_INTERVAL" not in cold.env() or cold.env()["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] != "0.05"

"""client_workers: the vectorized engine's chunks of clients computed side by side by worker
threads on a CPU (focusfl/threads.py). Each chunk is computed as it is alone, so the bytes are
those of one worker whatever their number: through the library and the CLI as a user types it."""
from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import pytest
import torch

from cli_harness import assert_one_line_error, run_cli, run_main
from focusfl.errors import ConfigError
from focusfl.runs.config import RunConfig
from focusfl.runs.driver import build, execute

MNIST = Path(__file__).resolve().parent / "fixtures" / "mnist1500.npz"
# 6 clients in chunks of 2: three chunks a round for the workers to share.
PROBLEM = f"nn:data={MNIST},test_fraction=0.2,clients=6,batch=16,client_chunk=2"


def _run(algorithm: str, workers: int, participation: str = "bernoulli"):
    config = RunConfig(algorithm=algorithm, problem=PROBLEM, participation=participation, rounds=3, local_steps=2,
                       lr=0.01, eval_every=3, client_workers=workers)
    return execute(build(config))


@pytest.mark.parametrize("algorithm", ["focus", "scaffold", "fedavg"])
def test_the_bytes_do_not_depend_on_the_number_of_workers(algorithm):
    alone = _run(algorithm, 1)
    for workers in (2, 3):
        side_by_side = _run(algorithm, workers)
        for name, x, y in zip(alone.state.server._fields, alone.state.server, side_by_side.state.server):
            assert torch.equal(x, y), (algorithm, workers, name)
        for x, y in zip(alone.state.clients, side_by_side.state.clients):
            assert torch.equal(x, y), (algorithm, workers)
        assert alone.rows == side_by_side.rows


def test_workers_start_as_the_chunks_need_them():
    """No more threads than a round has chunks, however many workers are allowed."""
    from focusfl.threads import ChunkPool

    pool = ChunkPool(1024, 1)
    try:
        assert pool.map(lambda a, b: a + b, [1, 2, 3], [10, 20, 30]) == [11, 22, 33]
        assert len(pool.threads) == 3
    finally:
        pool.close(wait=True)


def test_the_chunks_are_computed_by_the_worker_threads(monkeypatch):
    """Not silently in the calling thread: the chunks' client rounds run in the pool's threads."""
    import focusfl.engine.vectorized as vectorized

    seen: set[str] = set()
    real = vectorized.gather_rows

    def watching(table, rows):
        seen.add(threading.current_thread().name)
        return real(table, rows)

    monkeypatch.setattr(vectorized, "gather_rows", watching)
    _run("fedavg", 2, participation="full")
    assert seen and all(name.startswith("focusfl-clients") for name in seen), seen
    seen.clear()
    _run("fedavg", 1, participation="full")
    assert seen == {threading.main_thread().name}


@pytest.mark.parametrize("value", [0, -1, True, 1.5, "2"])
def test_a_client_workers_that_is_not_a_count_is_refused(value):
    with pytest.raises(ConfigError, match="client_workers must be an integer >= 1"):
        RunConfig(client_workers=value)


def test_run_with_client_workers_as_a_user_types_it(tmp_path):
    base = ["run", "--algorithm", "scaffold", "--problem", PROBLEM, "--rounds", "3", "--local-steps", "2",
            "--lr", "0.01", "--eval-every", "3"]
    one, two = tmp_path / "one", tmp_path / "two"
    proc = run_cli(*base, "--out", str(one))
    assert proc.returncode == 0, proc.stderr
    proc = run_cli(*base, "--client-workers", "2", "--out", str(two))
    assert proc.returncode == 0, proc.stderr
    assert (one / "model.pt").read_bytes() == (two / "model.pt").read_bytes()
    assert (one / "metrics.csv").read_bytes() == (two / "metrics.csv").read_bytes()
    assert json.loads((two / "config.json").read_text())["client_workers"] == 2
    for bad in ("0", "-2", "two"):
        assert_one_line_error(run_main(*base, "--client-workers", bad, "--out", str(tmp_path / "bad")), 2,
                              "--client-workers")
    assert_one_line_error(run_main(*base, "--client-workers", "1000000", "--out", str(tmp_path / "bad")), 2,
                          "client_workers must be at most 1024")
    assert not (tmp_path / "bad").exists()


# -- a user's client round in a worker thread -------------------------------------------------------
# ridge with 40 x 2,000 float64 samples a client: its cache budget makes chunks of one client.
CHUNKED_RIDGE = ("--problem", "ridge:clients=4,samples=40,dim=2000")


def test_an_error_in_a_workers_chunk_is_the_users_line(tmp_path):
    from test_user_algorithm_faults import ERRORS, RAISING, _line_of, _one_line
    from test_your_algorithm import FLAG, planted, write_algorithm

    source = planted(*RAISING["client_round"])
    write_algorithm(tmp_path, "my_prox.py", source)
    line = _line_of(source, RAISING["client_round"][1])
    proc = run_main("run", "--algorithm", "my_prox.py:MyProx", FLAG, *CHUNKED_RIDGE, "--rounds", "2",
                    "--client-workers", "2", "--out", "runs/a", cwd=tmp_path)
    _one_line(proc, re.escape(f"my_prox.py:{line} in client_round: {ERRORS['client_round']}"))


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="counts processes through /proc")
def test_a_client_round_that_never_ends_in_a_worker_stops_on_the_second_sigterm(tmp_path):
    import signal
    import time

    from cli_harness import popen_cli
    from test_user_algorithm_faults import _wait_for
    from test_your_algorithm import FLAG, planted, write_algorithm

    hang = ("update = z - server.x",
            "update = z - server.x\n        while ctx.round >= 2:  # a round that never ends\n            time.sleep(0.05)")
    source = planted(*hang).replace("import torch\n", "import time\n\nimport torch\n", 1)
    write_algorithm(tmp_path, "hang.py", source)
    proc = popen_cli("run", "--algorithm", "hang.py:MyProx", FLAG, *CHUNKED_RIDGE, "--rounds", "5",
                     "--checkpoint-every", "1", "--client-workers", "2", "--out", "runs/h", cwd=tmp_path)
    checkpoint = lambda: any(tmp_path.glob("runs/.h.*/checkpoint.pt"))  # noqa: E731
    assert _wait_for(lambda: checkpoint() or proc.poll() is not None, 240), "no checkpoint"
    assert proc.poll() is None, proc.communicate()
    time.sleep(0.5)  # the workers are inside the round that never ends
    proc.send_signal(signal.SIGTERM)
    time.sleep(1.0)
    assert proc.poll() is None  # the first asks for the end of the round, which never comes
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)  # the hanging worker threads do not hold the exit
    assert proc.returncode == 143, stderr
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) <= 2, stderr
    assert checkpoint()

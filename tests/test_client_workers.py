"""client_workers: the vectorized engine's chunks of clients computed side by side by worker
threads on a CPU (focusfl/threads.py). Each chunk is computed as it is alone, so the bytes are
those of one worker whatever their number: through the library and the CLI as a user types it."""
from __future__ import annotations

import json
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
    assert not (tmp_path / "bad").exists()

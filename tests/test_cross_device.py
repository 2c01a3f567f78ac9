"""Cross-device scale: client tables mapped in the run folder, active sets drawn directly, clients
made on demand. Everything here runs at tiny N; benchmarks/cross_device.py measures 10^6."""
from __future__ import annotations

import json
import math
import random
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

from cli_harness import assert_one_line_error, cli_env, killer_script, run_cli, run_main
from focusfl.algorithms import ALGORITHMS, make_algorithm
from focusfl.engine import Resume, simulate
from focusfl.engine.tree import gather_rows, scatter_rows
from focusfl.participation import PARTICIPATION, make_participation
from focusfl.problems import make_problem
from focusfl.runs.checkpoint import load_model
from focusfl.runs.config import RunConfig, configuration_key, run_key
from focusfl.runs.folder import read_config
from focusfl.runs.store import TABLE, MappedClients, initial_state, row_template

KILLER = killer_script()


def _algorithm(name: str):
    extra = {"local_steps": 2} if name not in ("proxskip",) else {}
    return make_algorithm(name, lr=1e-3, **extra)


# -- the mapped table ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_algorithm_computes_the_same_bytes_with_its_table_mapped(tmp_path, name):
    problem = make_problem("ridge:clients=9,dim=3,samples=6,batch=2,hetero=1")
    participation = make_participation("bernoulli", 9, seed=1)
    algorithm = _algorithm(name)
    prepared = algorithm.prepare(problem, participation, seed=0)
    mapped = initial_state(prepared, problem.initial_point(), 9, tmp_path, budget=0)
    # Algorithms whose clients keep nothing ([N, 0] rows) have nothing to map.
    template, _ = row_template(prepared, problem.initial_point())
    assert isinstance(mapped.clients, MappedClients) == (template[0].shape[1:].numel() > 0)
    in_memory = simulate(algorithm, problem, participation, 15, seed=0)
    on_disk = simulate(algorithm, problem, make_participation("bernoulli", 9, seed=1), 15, seed=0,
                       resume=Resume(mapped, 0))
    assert in_memory.rows == on_disk.rows
    for ours, theirs in zip(in_memory.state.server, on_disk.state.server):
        assert torch.equal(ours, theirs)
    table = on_disk.state.clients
    for ours, theirs in zip(in_memory.state.clients, table.to_memory() if isinstance(table, MappedClients) else table):
        assert torch.equal(ours, theirs)


def test_rows_a_checkpoint_points_at_are_never_written_again(tmp_path):
    problem = make_problem("ridge:clients=6,dim=4")
    template, _ = row_template(make_algorithm("focus"), problem.initial_point())
    table = MappedClients.create(tmp_path / TABLE, template, 6, budget=0)
    rows = lambda *values: type(template)(torch.tensor([[v] * 4 for v in values], dtype=torch.float64))
    table.scatter(torch.tensor([1, 4]), rows(1.0, 4.0))
    table.scatter(torch.tensor([1]), rows(1.5))  # the same slot again before any checkpoint
    slots = table.flush()
    table.checkpointed(slots)
    saved = (tmp_path / TABLE).read_bytes()
    table.scatter(torch.tensor([1, 2, 4]), rows(10.0, 20.0, 40.0))
    table.scatter(torch.tensor([4]), rows(41.0))
    table.flush()
    # Reopened at the checkpoint's slot map, the table is the checkpoint's, whatever came after.
    again = MappedClients.open(tmp_path / TABLE, template, 6, slots, budget=0)
    assert again.gather(torch.arange(6)).g_prev[:, 0].tolist() == [0.0, 1.5, 0.0, 0.0, 4.0, 0.0]
    assert table.gather(torch.tensor([1, 2, 4])).g_prev[:, 0].tolist() == [10.0, 20.0, 41.0]
    # Only slots other than the checkpoint's changed on disk.
    after = (tmp_path / TABLE).read_bytes()
    row = 4 * 8
    for client, slot in enumerate(slots.tolist()):
        if slot:
            at = (2 * client + slot - 1) * row
            assert after[at:at + row] == saved[at:at + row]


def test_the_engines_gather_and_scatter_through_the_store(tmp_path):
    problem = make_problem("ridge:clients=5,dim=2")
    template, _ = row_template(make_algorithm("scaffold"), problem.initial_point())
    table = MappedClients.create(tmp_path / TABLE, template, 5, budget=0)
    index = torch.tensor([0, 3])
    assert scatter_rows(table, index, type(template)(torch.ones(2, 2, dtype=torch.float64))) is table
    assert gather_rows(table, torch.tensor([3, 4])).c.tolist() == [[1.0, 1.0], [0.0, 0.0]]


COMMON = ["--algorithm", "focus", "--problem", "ridge:clients=12,dim=4,samples=6,batch=3,hetero=1",
          "--participation", "markov", "--rounds", "60", "--eval-every", "4"]


def test_a_run_mapped_on_disk_writes_the_bytes_of_the_run_in_memory(tmp_path):
    memory, disk = tmp_path / "memory", tmp_path / "disk"
    assert run_main("run", *COMMON, "--out", str(memory)).returncode == 0
    done = run_main("run", *COMMON, "--state-memory", "0", "--checkpoint-every", "7", "--out", str(disk))
    assert done.returncode == 0, done.stderr
    assert (disk / TABLE).is_file() and not (memory / TABLE).exists()
    for name in ("metrics.csv", "model.pt"):
        assert (disk / name).read_bytes() == (memory / name).read_bytes()
    info_memory, info_disk = read_config(memory), read_config(disk)
    assert info_disk["state_memory"] == "0" and info_memory["state_memory"] == "2GiB"
    # Where the table lives is no part of the run's identity.
    assert run_key(info_disk) == run_key(info_memory)
    assert configuration_key(info_disk) == configuration_key(info_memory)
    # Extended past its end from the published folder (the table copied, its holes kept).
    longer = run_main("run", "--resume", str(disk), "--rounds", "90")
    assert longer.returncode == 0, longer.stderr
    whole = tmp_path / "whole"
    assert run_main("run", *COMMON[:-4], "--rounds", "90", "--eval-every", "4", "--out", str(whole)).returncode == 0
    assert (disk / "metrics.csv").read_bytes() == (whole / "metrics.csv").read_bytes()
    assert torch.equal(load_model(disk / "model.pt"), load_model(whole / "model.pt"))


def _killed_at(round_: int, args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", KILLER, str(round_), *args], env=cli_env(),
                          capture_output=True, text=True, timeout=120)


def test_sigkill_of_a_mapped_run_then_resume_gives_the_same_bytes(tmp_path):
    whole = tmp_path / "whole"
    assert run_main("run", *COMMON, "--out", str(whole)).returncode == 0
    out = tmp_path / "killed"
    kills = sorted(random.Random(28).sample(range(9, 55), 4))
    first = _killed_at(kills[0], ["run", *COMMON, "--state-memory", "0", "--checkpoint-every", "5",
                                  "--out", str(out)])
    assert first.returncode == -signal.SIGKILL, first.stderr
    for round_ in kills[1:]:
        proc = _killed_at(round_, ["run", "--resume", str(out), "--checkpoint-every", "5"])
        assert proc.returncode == -signal.SIGKILL, proc.stderr
    done = run_main("run", "--resume", str(out))
    assert done.returncode == 0, done.stderr
    assert (out / TABLE).is_file()
    assert (out / "metrics.csv").read_bytes() == (whole / "metrics.csv").read_bytes()
    assert (out / "model.pt").read_bytes() == (whole / "model.pt").read_bytes()


def test_a_resumed_extension_never_writes_the_published_table(tmp_path):
    """Resume reads a published folder in place: the run goes on in a copy of its table, so a
    kill -9 of the extension leaves the published table's bytes as they were, and resuming again
    still gives the uninterrupted run's bytes."""
    out = tmp_path / "run"
    assert run_main("run", *COMMON, "--state-memory", "0", "--out", str(out)).returncode == 0
    published = (out / TABLE).read_bytes()
    killed = _killed_at(70, ["run", "--resume", str(out), "--rounds", "90", "--checkpoint-every", "5"])
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert (out / TABLE).read_bytes() == published
    assert run_main("run", "--resume", str(out)).returncode == 0
    whole = tmp_path / "whole"
    assert run_main("run", *COMMON[:-4], "--rounds", "90", "--eval-every", "4", "--out", str(whole)).returncode == 0
    assert (out / "metrics.csv").read_bytes() == (whole / "metrics.csv").read_bytes()


def test_a_table_mapped_on_disk_is_not_counted_against_memory():
    """build() refuses a state beyond the memory available, but a client table beyond
    state_memory lives on disk: 10^8 clients x 100 floats (80 GB) build at the default budget
    and are refused when the budget would keep them in memory."""
    from focusfl.errors import ConfigError
    from focusfl.runs.driver import build

    config = RunConfig(algorithm="focus", problem="ondemand_logistic:clients=100000000,dim=100,samples=2",
                       participation="uniform:m=10", rounds=1)
    built = build(config)
    assert built.problem.num_clients == 10**8
    with pytest.raises(ConfigError, match="state"):
        build(config.replace(state_memory="1000TB"))


def test_a_neural_networks_client_table_mapped_on_disk_is_not_counted_by_its_model_check(tmp_path, monkeypatch):
    """A neural network checks its model and the algorithm's state before it builds the model;
    the clients' table it counts is the one memory will hold: none where state_memory maps it.
    Here SCAFFOLD's table (64 clients x the 51,480-parameter digits CNN in float64, 26 MB) is
    beyond a 10 MB memory but builds mapped, and is refused when the budget keeps it in memory."""
    from focusfl import limits
    from focusfl.errors import DataError
    from focusfl.runs.driver import build

    rng = np.random.default_rng(0)
    digits = tmp_path / "digits.npz"
    np.savez(digits, images=rng.integers(0, 255, (1280, 28, 28), dtype=np.uint8),
             labels=(np.arange(1280) % 10).astype(np.uint8))
    config = RunConfig(algorithm="scaffold", problem=f"nn:data={digits},test_fraction=0.2,clients=64,partition=iid",
                       participation="uniform:m=2", rounds=1, lr=0.01, state_memory="1MB")
    monkeypatch.setattr(limits, "available_bytes", lambda: 10 * 2**20)
    built = build(config)
    assert built.problem.dim == 51_480
    with pytest.raises(DataError, match="scaffold's state for 64 clients x 51,480 parameters"):
        build(config.replace(state_memory="1GB"))


def test_a_mapped_run_with_a_damaged_table_is_refused_in_one_line(tmp_path):
    out = tmp_path / "run"
    assert run_main("run", *COMMON, "--state-memory", "0", "--out", str(out)).returncode == 0
    with open(out / TABLE, "ab") as handle:
        handle.write(b"x")
    assert_one_line_error(run_main("run", "--resume", str(out), "--rounds", "70"), 2, contains="state table")
    (out / TABLE).unlink()
    assert_one_line_error(run_main("run", "--resume", str(out), "--rounds", "70"), 2, contains="state table")


@pytest.mark.parametrize("value", ["lots", "-1GB", "2XB", "1e400"])
def test_a_bad_state_memory_is_refused_before_anything_is_written(tmp_path, value):
    proc = run_main("run", *COMMON, f"--state-memory={value}", "--out", str(tmp_path / "run"))
    assert_one_line_error(proc, 2, contains="state_memory")
    assert not list(tmp_path.iterdir())


def test_a_state_memory_from_code_is_checked_like_the_option():
    with pytest.raises(Exception, match="state_memory"):
        RunConfig(state_memory="a lot")
    assert RunConfig(state_memory=1 << 20).state_memory == 1 << 20


# -- active sets ---------------------------------------------------------------------------------
SPECS = {"full": "full", "uniform": "uniform:m=3", "bernoulli": "bernoulli", "weighted": "weighted:m=4",
         "markov": "markov", "cyclic": "cyclic:groups=3", "reshuffled_cyclic": "reshuffled_cyclic:groups=3",
         "sine": "sine", "banded": "banded:width=4"}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_active_sets_are_the_sets_of_the_rows_in_any_chunks(name):
    for n in (7, 20):
        rows = make_participation(SPECS[name], n, seed=5).rows(0, 40)
        process = make_participation(SPECS[name], n, seed=5)
        sets = process.active_sets(0, 13) + process.active_sets(13, 40)
        assert [s.tolist() for s in sets] == [np.flatnonzero(row).tolist() for row in rows]
        assert all(s.dtype == np.int64 for s in sets)


def test_the_processes_that_draw_sets_directly_say_so():
    direct = {name for name, cls in PARTICIPATION.items() if cls.direct}
    assert direct == {"full", "uniform", "cyclic", "reshuffled_cyclic"}
    assert make_participation("bernoulli:p=0.1,draw=sparse", 10).direct
    assert not make_participation("bernoulli:p=0.1", 10).direct


def test_sparse_bernoulli_draws_each_client_at_its_rate_and_records_one_rate_compactly():
    process = make_participation("bernoulli:p=0.2,draw=sparse", 400, seed=2)
    mask = process.mask(1500)
    rates = mask.mean(0)
    # Each client's rate: within 5 standard errors of 0.2; all of them: within 1 of their mean.
    assert np.abs(rates - 0.2).max() < 5 * math.sqrt(0.2 * 0.8 / 1500)
    assert abs(mask.mean() - 0.2) < 3 * math.sqrt(0.2 * 0.8 / mask.size) + 1e-3
    # Independence across clients: the counts per round are binomial(400, 0.2).
    assert abs(mask.sum(1).var() / (400 * 0.2 * 0.8) - 1) < 0.2
    described = process.describe()
    assert described == {"name": "bernoulli", "p": 0.2, "redraw": False, "draw": "sparse"}
    again = make_participation(described, 400, seed=2)
    assert np.array_equal(again.mask(50), mask[:50])
    # Per-client rates are thinned from the largest.
    varied = make_participation("bernoulli:draw=sparse", 300, seed=1)
    counts = varied.mask(2000).mean(0)
    assert np.abs(counts - varied.p).max() < 5 * math.sqrt(0.25 / 2000)
    # The dense draw is unchanged: its record has no draw key.
    assert "draw" not in make_participation("bernoulli:p=0.2", 5).describe()


def test_sparse_bernoulli_redraws_empty_rounds_and_refuses_bad_draws():
    process = make_participation("bernoulli:p=0.01,draw=sparse,redraw=true", 20, seed=0)
    assert all(len(s) > 0 for s in process.active_sets(0, 200))
    with pytest.raises(Exception, match="dense or sparse"):
        make_participation("bernoulli:draw=fast", 10)


# -- clients made on demand ------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["ondemand_ridge", "ondemand_logistic"])
def test_the_planted_optimum_is_the_exact_minimizer_of_all_clients(name):
    problem = make_problem(f"{name}:clients=40,dim=6,samples=8,eval_clients=40")
    x_star = problem.x_star
    assert float(torch.linalg.vector_norm(problem.gradient(x_star))) < 1e-13
    point = x_star + 0.1 * torch.ones_like(x_star)
    assert float(problem.loss(point)) > float(problem.loss(x_star))
    # The clients differ: none of them alone is at its optimum at x*.
    own = problem.oracle(torch.arange(40), seed=0, round=0)(x_star.expand(40, -1), 0)
    assert float(own.norm(dim=1).min()) > 1e-3
    if name == "ondemand_ridge":
        assert float(problem.loss(x_star)) == 0.0


@pytest.mark.parametrize("name", ["ondemand_ridge", "ondemand_logistic"])
def test_gradients_match_the_loss_and_do_not_depend_on_the_chunk(name):
    problem = make_problem(f"{name}:clients=30,dim=5,samples=7,eval_clients=30")
    x = torch.linspace(-1, 1, 5, dtype=torch.float64)
    e = 1e-6 * torch.tensor([0.3, -1.0, 0.7, 0.2, -0.4], dtype=torch.float64)
    numeric = float(problem.loss(x + e) - problem.loss(x - e)) / 2
    assert abs(numeric - float(problem.gradient(x) @ e)) < 1e-12
    clients = torch.arange(30)
    together = problem.oracle(clients, seed=3, round=4)(x.expand(30, -1), 1)
    apart = torch.cat([problem.oracle(part, seed=3, round=4)(x.expand(part.numel(), -1), 1)
                       for part in clients.split(4)])
    assert torch.allclose(together, apart, rtol=0, atol=1e-15)


def test_a_billion_clients_cost_nothing_until_they_are_asked_for():
    problem = make_problem("ondemand_logistic:clients=2000000000,dim=4,samples=3")
    clients = torch.tensor([5, 1_999_999_999])
    grads = problem.oracle(clients, seed=0, round=0)(torch.zeros(2, 4, dtype=torch.float64), 0)
    assert grads.shape == (2, 4) and bool(torch.isfinite(grads).all())
    again = problem.oracle(clients[1:], seed=0, round=0)(torch.zeros(1, 4, dtype=torch.float64), 0)
    assert torch.equal(again[0], grads[1])
    assert set(problem.metrics(problem.x_star)) == {"loss", "grad_norm", "rel_error"}


def test_the_smoothness_bound_holds_for_every_client_and_minibatch():
    for name, curvature in (("ondemand_ridge", 2.0), ("ondemand_logistic", 0.25)):
        problem = make_problem(f"{name}:clients=50,dim=5,samples=6,hetero=1")
        features = problem.features(torch.arange(50))
        largest_row = float(features.square().sum(-1).max())
        assert curvature * largest_row + 2 * problem.reg <= problem.smoothness()


@pytest.mark.parametrize("spec, reason", [
    ("ondemand_ridge:reg=0", "reg must be > 0"),
    ("ondemand_ridge:batch=9,samples=8", "batch"),
    ("ondemand_logistic:clients=0", "clients"),
    ("ondemand_logistic:noise=-1", "noise"),
])
def test_bad_on_demand_problems_are_refused_in_one_line(tmp_path, spec, reason):
    proc = run_main("run", "--algorithm", "focus", "--problem", spec, "--rounds", "2", "--out", str(tmp_path / "run"))
    assert_one_line_error(proc, 2, contains=reason)
    assert not list(tmp_path.iterdir())


def test_a_cross_device_run_as_a_user_types_it(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("run", "--algorithm", "scaffold", "--problem", "ondemand_logistic:clients=100000,dim=8,samples=4",
                   "--participation", "uniform:m=20", "--rounds", "6", "--eval-every", "3", "--local-steps", "2",
                   "--state-memory", "1MB", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    info = json.loads((out / "config.json").read_text())
    assert info["problem"]["name"] == "ondemand_logistic" and (out / TABLE).is_file()
    assert (out / TABLE).stat().st_blocks * 512 < 1 << 20  # 100,000 clients' table: only 120 rows written


def test_a_negative_loss_is_explained_where_it_is_printed(tmp_path):
    """ondemand_logistic's objective has a linear tilt (it plants x*): its loss goes below 0, and
    the run says why under the line that shows it; a positive loss gets no note."""
    problem = "ondemand_logistic:clients=20,dim=10,hetero=2,noise=0,reg=0.1"
    negative = run_main("run", "--algorithm", "focus", "--problem", problem, "--participation", "full",
                        "--rounds", "60", "--eval-every", "60", "--out", str(tmp_path / "tilted"))
    assert negative.returncode == 0, negative.stderr
    assert "loss=-" in negative.stdout and "not a distance to the optimum (rel_error is" in negative.stdout
    positive = run_main("run", "--algorithm", "focus", "--problem", "ridge:clients=4,samples=8,dim=3",
                        "--rounds", "3", "--out", str(tmp_path / "ridge"))
    assert positive.returncode == 0 and "not a distance" not in positive.stdout

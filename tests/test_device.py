"""The device policy (device.py): every rule read back on a CPU by naming the device type,
the switches applied (and applied before CUDA starts), and the record of the choice."""
from __future__ import annotations

import os

import pytest
import torch

from focusfl import device as device_module
from focusfl.device import (CHUNK_BUDGET_ACCELERATOR, CHUNK_BUDGET_CPU, CUBLAS_WORKSPACE, apply_policy,
                                   device_policy, policy_applied, torch_settings)
from focusfl.errors import ConfigError
from focusfl.work import make_work


@pytest.fixture
def restored(monkeypatch):
    """The process's switches and CUBLAS_WORKSPACE_CONFIG as they were, after the test; during it,
    a process whose CUDA has not started (also where a GPU test started it before)."""
    before = torch_settings()
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    yield
    device_module._set(before)


@pytest.mark.parametrize("kind,layout,budget,eval_batch", [
    ("cpu", "channels_last", CHUNK_BUDGET_CPU, 256),
    ("cuda", "nchw", CHUNK_BUDGET_ACCELERATOR, 2048),
    ("cuda:1", "nchw", CHUNK_BUDGET_ACCELERATOR, 2048),
    ("mps", "nchw", CHUNK_BUDGET_ACCELERATOR, 2048),
])
def test_each_rule_is_the_device_types(kind, layout, budget, eval_batch):
    policy = device_policy(kind)
    assert (policy.layout, policy.chunk_budget, policy.eval_batch) == (layout, budget, eval_batch)
    assert policy.deterministic  # by default, on every device
    assert policy.torch_settings() == {"deterministic_algorithms": True, "cudnn_deterministic": True,
                                       "cudnn_benchmark": False}
    assert policy.cublas_workspace == (CUBLAS_WORKSPACE if kind.startswith("cuda") else None)


def test_the_opt_out_leaves_torchs_defaults():
    policy = device_policy("cuda", deterministic=False)
    assert policy.cublas_workspace is None
    assert policy.torch_settings() == {"deterministic_algorithms": False, "cudnn_deterministic": False,
                                       "cudnn_benchmark": False}


def test_the_cuda_policy_is_applied_and_read_back_on_a_cpu(restored):
    apply_policy(device_policy("cuda"))
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert torch_settings() == device_policy("cuda").torch_settings()


def test_a_users_deterministic_workspace_is_kept(restored, monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    apply_policy(device_policy("cuda"))
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"


def test_cuda_started_without_the_workspace_is_refused_in_one_line(restored, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(ConfigError, match="before CUDA starts") as caught:
        apply_policy(device_policy("cuda"))
    assert "\n" not in str(caught.value)
    apply_policy(device_policy("cpu"))  # a CPU run needs no workspace
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    apply_policy(device_policy("cuda"))  # set in time (an earlier run of this process did)


def test_policy_applied_restores_the_switches_after_the_block(restored):
    device_module._set({"deterministic_algorithms": False, "cudnn_deterministic": False, "cudnn_benchmark": True})
    with policy_applied(device_policy("cpu")):
        assert torch.are_deterministic_algorithms_enabled() and not torch.backends.cudnn.benchmark
    assert torch_settings() == {"deterministic_algorithms": False, "cudnn_deterministic": False,
                                "cudnn_benchmark": True}


# -- the run record and the driver --------------------------------------------------------------
SMALL = "ridge:dim=5,clients=4"


def test_the_driver_applies_the_policy_before_the_problem_touches_the_device(restored, monkeypatch):
    """The problem is the first thing of a run that makes a tensor on its device (CUDA starts
    there): by then the deterministic switches and cuBLAS's workspace are set."""
    from focusfl.runs import driver
    from focusfl.runs.config import RunConfig

    seen = {}

    def make_problem(*args, **kwargs):
        seen.update(torch_settings(), workspace=os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
                    cuda_started=torch.cuda.is_initialized(), device=kwargs["device"])
        raise ConfigError("stop here")

    monkeypatch.setattr(driver, "resolve_device", lambda name: torch.device(name))  # cuda, named only
    monkeypatch.setattr(driver, "make_problem", make_problem)
    device_module._set({"deterministic_algorithms": False, "cudnn_deterministic": False, "cudnn_benchmark": True})
    with pytest.raises(ConfigError, match="stop here"):
        driver.build(RunConfig(problem=SMALL, device="cuda"))
    assert seen == {"deterministic_algorithms": True, "cudnn_deterministic": True, "cudnn_benchmark": False,
                    "workspace": ":4096:8", "cuda_started": False, "device": "cuda"}
    assert torch_settings()["cudnn_benchmark"]  # the process's own switches back after the build


@pytest.mark.parametrize("deterministic", [True, False])
def test_a_run_computes_under_its_policy_and_records_it(restored, deterministic):
    from focusfl.runs.config import RunConfig
    from focusfl.runs.driver import build, execute

    built = build(RunConfig(problem=SMALL, rounds=2, deterministic=deterministic))
    during = []
    execute(built, on_row=lambda row: during.append(torch.are_deterministic_algorithms_enabled()))
    assert during and set(during) == {deterministic}
    assert built.resolved["deterministic"] is deterministic


def test_the_opt_out_is_part_of_the_run_key_and_the_default_is_not():
    from focusfl.runs.config import RunConfig, record, run_key

    def key(**fields):
        config = RunConfig(problem=SMALL, **fields)
        parts = {"algorithm": {"name": "focus"}, "problem": {"name": "ridge"}, "participation": {"name": "full"}}
        return run_key(record(config, **parts))

    resolved = record(RunConfig(problem=SMALL), algorithm={}, problem={}, participation={})
    assert resolved["deterministic"] is True  # recorded on every device, the CPU's included
    without_field = {k: v for k, v in resolved.items() if k != "deterministic"}
    assert run_key(resolved) == run_key(without_field)  # runs recorded before the field keep their key
    assert key() != key(deterministic=False)
    with pytest.raises(ConfigError, match="deterministic must be true or false"):
        RunConfig(problem=SMALL, deterministic="yes")


def test_the_option_as_a_user_types_it(tmp_path):
    import json

    from cli_harness import run_cli, run_main

    out = tmp_path / "fast"
    proc = run_cli("run", "--algorithm", "focus", "--problem", SMALL, "--rounds", "2", "--deterministic", "false", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "config.json").read_text())["deterministic"] is False
    resumed = run_main("run", "--resume", str(out), "--rounds", "3")  # a resume says what it is
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((out / "config.json").read_text())["deterministic"] is False
    bad = run_main("run", "--algorithm", "focus", "--problem", SMALL, "--deterministic", "maybe", "--out", str(tmp_path / "bad"))
    assert bad.returncode == 2 and "must be true or false, got 'maybe'" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) <= 2 and "Traceback" not in bad.stderr
    changed = run_main("run", "--resume", str(out), "--deterministic", "true")
    assert changed.returncode == 2 and "--deterministic cannot change it" in changed.stderr
    config = json.loads((out / "config.json").read_text())
    config["deterministic"] = "yes"
    (tmp_path / "bad.json").write_text(json.dumps(config))
    replay = run_main("run", "--config", str(tmp_path / "bad.json"), "--out", str(tmp_path / "replay"))
    assert replay.returncode == 2 and "deterministic must be true or false" in replay.stderr
    assert "Traceback" not in replay.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_cuda_runs_folder_is_refused_on_a_machine_without_cuda_and_left_as_it_was(tmp_path):
    """A run resumes on the device it recorded; its folder moved to a CPU-only machine is refused
    in one line before anything is written (docs/runs.md)."""
    import json

    from cli_harness import run_cli, run_main

    out = tmp_path / "run"
    assert run_main("run", "--algorithm", "focus", "--problem", SMALL, "--rounds", "3", "--out", str(out)).returncode == 0
    config = json.loads((out / "config.json").read_text())
    config["device"] = "cuda"  # as a CUDA run would have recorded it
    (out / "config.json").write_text(json.dumps(config))
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    proc = run_cli("run", "--resume", str(out), "--rounds", "5")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "focusfl: error: device 'cuda' asked for, but torch sees no CUDA device"
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no partial folder


# -- no host-device synchronisation a round ---------------------------------------------------------
def test_train_losses_stay_on_the_device_until_a_row_reads_them(monkeypatch):
    """A round hands its minibatch losses on as PendingLosses; only the row (or a checkpoint)
    reads them, summed exactly per round and in round order, as the numbers were before."""
    import math

    from focusfl.engine.loop import TrainLoss
    from focusfl.problems.base import PendingLosses

    reads = []
    real = PendingLosses.values
    monkeypatch.setattr(PendingLosses, "values", lambda self: reads.append(1) or real(self))
    rounds = [torch.tensor([[0.5, 1.25], [0.75, 2.0]], dtype=torch.float64),
              torch.tensor([[3.0, 0.1]], dtype=torch.float64)]
    keeps = [torch.tensor([[True, True], [True, False]]), torch.tensor([[False, True]])]
    loss = TrainLoss()
    for values, keep in zip(rounds, keeps):
        loss.add([PendingLosses(values, keep), None])  # None: a chunk that measured nothing
    loss.add([0.25])  # numbers, as a federation's nodes send them
    assert not reads
    expected = (math.fsum([0.5, 1.25, 0.75]) + math.fsum([0.1])) + 0.25
    assert loss.row() == {"train_loss": expected / 5} and len(reads) == 2
    assert loss.state() == {"train_loss_sum": expected, "train_loss_count": 5}


def test_active_sets_go_to_the_device_a_chunk_of_rounds_at_a_time(monkeypatch):
    from focusfl.engine import loop
    from focusfl.participation import make_participation

    participation = make_participation("bernoulli:p=0.3", 12, seed=4)
    copies = []
    real = torch.as_tensor
    monkeypatch.setattr(loop.torch, "as_tensor", lambda *a, **k: copies.append(1) or real(*a, **k))
    drawn = list(loop.round_actives(participation, 0, 50, torch.device("cpu")))
    assert len(copies) == 1 and [r for r, _, _ in drawn] == list(range(50))
    expected = participation.active_sets(0, 50)
    assert all(torch.equal(active, torch.as_tensor(want)) and steps is None
               for (_, active, steps), want in zip(drawn, expected))


# What reads a tensor's values on the host. Tensor.numpy() is not among them: it refuses a CUDA
# tensor, so it runs on CPU paths alone (rng.hash_bits mixes CPU coordinates in NumPy).
HOST_READS = ("item", "tolist", "cpu", "__int__", "__float__", "__bool__", "__index__")


def count_host_reads(monkeypatch) -> list[str]:
    """Every read of a tensor's values on the host (int(t), t.item(), bool(t), t.tolist(), ...),
    from now on, as the line of focusfl that made it: on CUDA each waits for every kernel queued."""
    import traceback

    reads: list[str] = []
    for name in HOST_READS:
        real = getattr(torch.Tensor, name)

        def counted(self, *args, _real=real, _name=name, **kwargs):
            caller = next((f"{f.filename.rsplit('/src/', 1)[-1]}:{f.lineno} {_name}"
                           for f in reversed(traceback.extract_stack()[:-1]) if "/focusfl/" in f.filename), _name)
            reads.append(caller)
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return reads


@pytest.mark.parametrize("work", [None, "uniform"])
@pytest.mark.parametrize("engine,chunk", [("vectorized", 0), ("vectorized", 2), ("reference", 0), ("batch", 0)])
def test_the_nn_round_loop_reads_nothing_back_from_the_device(monkeypatch, engine, chunk, work):
    """Issue 44: the round loop, the engine and the nn oracle read no tensor on the host a round
    (the most samples an active client holds, which shapes the minibatch draw, comes from the host
    copy of the active set: device.host_values). Counted on a CPU; without rows (eval_every=None),
    a run's rounds are the hot path alone."""
    from nn_formulation_cases import _dataset

    from focusfl.algorithms import make_algorithm
    from focusfl.engine import simulate
    from focusfl.participation import make_participation
    from focusfl.problems.nn import NeuralNetwork

    problem = NeuralNetwork(dataset=_dataset(), clients=8, batch=32, alpha=0.5, model="mlp", client_chunk=chunk)
    sizes = problem.client_data.host_sizes
    assert sizes.min() < 32 <= sizes.max()  # calls of small clients only, and calls with a full batch
    participation = make_participation("bernoulli:p=0.5", problem.num_clients, seed=1)
    algorithm = make_algorithm("sg_focus", lr=0.05, local_steps=3)
    # A work process: the counts go to the device with the active sets, and the rounds' largest
    # count (how many steps a batched round runs) is read from the host copy (algorithms.base.max_steps).
    processes = [None if work is None else make_work(work, problem.num_clients, 3, seed=seed) for seed in (7, 8)]
    reads = count_host_reads(monkeypatch)
    if engine == "batch":  # two runs stepped together (engine/batched.py), each its own active sets
        from focusfl.engine.batched import BatchMember, run_batch

        run_batch(problem, [BatchMember(algorithm, participation, 6, seed=seed, eval_every=None, work=process)
                            for seed, process in zip((7, 8), processes)])
    else:
        simulate(algorithm, problem, participation, 6, seed=7, engine=engine, eval_every=None, work=processes[0])
    assert reads == [], sorted(set(reads))


def test_step_counts_go_to_the_device_with_the_active_sets_and_a_trace_refuses_at_its_round(tmp_path):
    from focusfl.engine import loop
    from focusfl.errors import DataError
    from focusfl.participation import make_participation

    participation = make_participation("bernoulli:p=0.5", 6, seed=2)
    work = make_work("uniform", 6, 4, seed=3)
    drawn = list(loop.round_actives(participation, 0, 20, torch.device("cpu"), work))
    assert [r for r, _, _ in drawn] == list(range(20))
    for r, active, steps in drawn:
        assert torch.equal(steps, work.steps(r, active.clone()))  # as a round at a time draws them
        assert steps.untyped_storage().data_ptr() == drawn[0][2].untyped_storage().data_ptr()  # one copy
    # A trace without round 3's rows: rounds 0..2 come, then the refusal, as a round at a time.
    trace = tmp_path / "work.csv"
    trace.write_text("round,client,steps\n" + "".join(f"{r},{c},2\n" for r in range(3) for c in range(6)))
    traced = make_work(f"trace:path={trace}", 6, 4)
    seen = []
    with pytest.raises(DataError, match="no row for round 3"):
        for r, _, _ in loop.round_actives(make_participation("full", 6), 0, 10, torch.device("cpu"), traced):
            seen.append(r)
    assert seen == [0, 1, 2]


def test_host_values_read_views_of_a_mirrored_copy_on_the_host():
    import gc

    import numpy as np

    from focusfl import device
    from focusfl.device import host_values, mirrored_copy

    values = np.array([3, 1, 4, 1, 5, 9, 2, 6], dtype=np.int64)
    flat = mirrored_copy(values, "cpu")
    for view in (flat, flat[2:5], flat[1::3], flat[5:6], flat[4:4], *flat.split([3, 0, 5])):
        host = host_values(view)
        assert host is not None and np.array_equal(host, view.numpy())
    # tensors the host did not copy, or a 2-D view, are read on their device
    assert host_values(flat.clone()) is None and host_values(flat.view(2, 4)) is None
    assert host_values(flat.index_select(0, torch.tensor([0, 1]))) is None
    # the host array is kept while the copy or a view of it lives, and no longer
    # (its own entry, by address: other tests' copies in this process may be collected meanwhile)
    address = flat.untyped_storage().data_ptr()
    views = list(flat.split([3, 5]))
    del view
    del flat
    gc.collect()
    assert np.array_equal(host_values(views[1]), values[3:]) and address in device._mirrors
    del views
    gc.collect()
    assert address not in device._mirrors
    assert mirrored_copy(np.zeros(0, dtype=np.int64), "cpu").numel() == 0


def test_the_numerical_environment_in_force_is_named(monkeypatch):
    """numerics(): native unless every portable variable is in force and ATen computes with its
    scalar kernels (ATen reads its variable at import: this process's capability stays)."""
    from focusfl.device import PORTABLE_ENVIRONMENT, kernel_fingerprint, numerics, portable_environment

    assert portable_environment({"PATH": "/bin", "MKL_CBWR": "AVX2"}) == {"PATH": "/bin", **PORTABLE_ENVIRONMENT}
    for name, value in PORTABLE_ENVIRONMENT.items():
        monkeypatch.setenv(name, value)
    here = numerics()
    assert here["aten_capability"] == torch.backends.cpu.get_cpu_capability()
    assert here["mode"] == ("portable" if here["aten_capability"] == "DEFAULT" else "native")
    assert {name: here[name] for name in PORTABLE_ENVIRONMENT} == PORTABLE_ENVIRONMENT
    monkeypatch.setenv("MKL_CBWR", "AVX2")
    assert numerics()["mode"] == "native" and numerics()["MKL_CBWR"] == "AVX2"
    fingerprint = kernel_fingerprint()
    assert {"cpu_vendor", "cpu_model", "cpu_flags", "torch", "mkl", "onednn", "numerics", "threads"} <= set(fingerprint)
    assert fingerprint["numerics"] == numerics() and fingerprint["threads"] == torch.get_num_threads()

"""`focusfl sweep --executor ray` on a cluster of several nodes (Ray's multi-node test cluster,
``ray.cluster_utils.Cluster``, in this machine): tasks placed by their GPU request, batches of
runs per task, a node lost mid-sweep costing nothing, and the status file.

The nodes declare GPUs that the runs do not use (they compute on the CPU), so this runs on CPU
CI. One cluster serves the whole module (each Ray node is several processes; the machine may
have two cores): every test here runs on one xdist worker, one after another."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from cli_harness import assert_one_line_error, run_cli
from focusfl.experiments.sweep import expand, load_experiment, run_sweep

ray = pytest.importorskip("ray", reason="Ray is an optional extra (pip install 'focusfl[ray]')")
pytestmark = pytest.mark.xdist_group("ray")  # with test_sweep's Ray tests: one Ray at a time

SMALL = "ridge:clients=4,dim=5,samples=10"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "experiment.toml"
    path.write_text(text)
    return path


def tables(folder: Path) -> dict[str, bytes]:
    """The sweep's tables and every run's metrics and model: the bytes a cluster must not change
    (config.json records the batch size asked for, and so may differ)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.suffix in (".csv", ".pt")}


@pytest.fixture(scope="module")
def cluster():
    """A head without CPUs (it schedules only) and one worker node declaring 4 CPUs and 1 GPU."""
    from ray.cluster_utils import Cluster

    from focusfl.experiments.executors import ray_runtime_env

    made = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "num_gpus": 0, "include_dashboard": False})
    try:
        made.add_node(num_cpus=4, num_gpus=1)
        made.wait_for_nodes()
        ray.init(address=made.address, log_to_driver=False, runtime_env=ray_runtime_env())
        yield made
    finally:
        ray.shutdown()
        made.shutdown()


def test_tasks_are_placed_by_their_gpu_request(cluster, tmp_path):
    """Five runs at 0.25 GPU (and 0.5 CPU) on a node of 4 CPUs and 1 GPU: each task gets the GPU
    Ray assigned as its CUDA_VISIBLE_DEVICES, with a quarter of it, and at most four run at once
    (their CPUs alone would let eight): the fifth waits for one to end."""
    from focusfl.experiments.executors import RayExecutor, RunTask

    experiment = load_experiment(write(tmp_path, f'algorithms = ["focus"]\nproblems = ["{SMALL}"]\n'
                                                 'seeds = 5\nrounds = 30\n'))
    folder = tmp_path / "sweep" / "runs"
    folder.mkdir(parents=True)
    tasks = [RunTask(key=run.key, config=run.config.to_dict(), out=str(folder / run.key))
             for run in expand(experiment, threads=1)]
    executor = RayExecutor(None, 1, gpus_per_task=0.25, cpus_per_task=0.5)
    outcomes = list(executor.run(tasks))
    assert [outcome["status"] for _, outcome in outcomes] == ["complete"] * 5
    placed = executor.placements
    assert len(placed) == 5
    for placement in placed:
        assert placement["gpus"] == ["0"] and placement["visible"] == "0"
        assert placement["assigned"] == {"GPU": 0.25, "CPU": 0.5}
    events = sorted([(p["started"], 1) for p in placed] + [(p["ended"], -1) for p in placed],
                    key=lambda event: (event[0], event[1]))
    at_once = most = 0
    for _, step in events:
        at_once += step
        most = max(most, at_once)
    assert most <= 4
    assert any(b["started"] >= a["ended"] for a in placed for b in placed)  # one waited for another


def test_batched_tasks_give_the_same_files_as_one_run_per_task(cluster, tmp_path):
    grid = (f'algorithms = ["focus", "fedavg"]\nproblems = ["{SMALL}"]\nparticipation = ["bernoulli"]\n'
            'seeds = 3\nrounds = 12\nlocal_steps = 2\n')
    experiment = load_experiment(write(tmp_path, grid))
    alone, batched = tmp_path / "alone", tmp_path / "batched"
    assert not run_sweep(experiment, alone, threads=1, batch_runs=1).failed  # here, one run at a time
    report = run_sweep(experiment, batched, executor="ray", threads=1, batch_runs="auto")
    assert report.ran == 6 and not report.failed
    assert tables(batched) == tables(alone)
    configs = [json.loads(p.read_text()) for p in sorted((batched / "runs").glob("*/config.json"))]
    assert {config["batch_runs"] for config in configs} != {1}  # the tasks ran batches


def test_a_batch_shipped_back_from_a_node_without_the_folder_is_the_same_runs(tmp_path):
    """Where the sweep folder is not visible, a task steps its batch in a temporary folder and
    returns the files; published by the driver, they are the runs a batch in place writes."""
    from focusfl.experiments.executors import BatchTask, RunTask, _shipped_batch, publish_shipped
    from focusfl.experiments.sweep import expand

    experiment = load_experiment(write(tmp_path, f'algorithms = ["focus"]\nproblems = ["{SMALL}"]\n'
                                                 'seeds = 3\nrounds = 10\n'))
    alone = tmp_path / "alone"
    assert not run_sweep(experiment, alone, threads=1, batch_runs=1).failed
    runs = expand(experiment, threads=1)
    tasks = tuple(RunTask(key=run.key, config=run.config.to_dict(), out=str(tmp_path / "runs" / run.key),
                          batch_runs=3) for run in runs)
    outcomes = _shipped_batch(BatchTask(tasks, 3))
    for task, outcome in zip(tasks, outcomes):
        assert outcome["status"] == "complete"
        publish_shipped(task, outcome.pop("files"))
        assert tables(Path(task.out)) == tables(alone / "runs" / task.key)
        assert json.loads((Path(task.out) / "config.json").read_text())["batch_runs"] == 3


def test_a_node_lost_mid_sweep_costs_nothing(cluster, tmp_path):
    """The only node with two GPUs dies while its run is half way (hard: its processes killed);
    another joins; Ray runs the task again there, which resumes the run from the checkpoint the
    lost one left in the shared folder; the tables are a sweep's that lost no node."""
    grid = f'algorithms = ["focus"]\nproblems = ["{SMALL}"]\nseeds = 2\nrounds = 1000\nlocal_steps = 2\n'
    experiment = load_experiment(write(tmp_path, grid))
    quiet = tmp_path / "quiet"
    assert not run_sweep(experiment, quiet, threads=1, batch_runs=1).failed
    doomed = cluster.add_node(num_cpus=1, num_gpus=2)
    cluster.wait_for_nodes()
    out = tmp_path / "lost"
    result: dict = {}

    def sweep():
        try:  # two GPUs per task: only the doomed node (and later its replacement) can run it
            result["report"] = run_sweep(experiment, out, executor="ray", threads=1, gpus_per_task=2,
                                         batch_runs=1, checkpoint_every=1, retries=2)
        except BaseException as exc:  # seen by the assertions below
            result["error"] = exc

    thread = threading.Thread(target=sweep)
    thread.start()
    replacement = None
    try:
        deadline = time.monotonic() + 240
        while True:  # status.json (refreshed every 2 s) says a run is running, on the doomed node
            seen = json.loads((out / "status.json").read_text()) if (out / "status.json").is_file() else {}
            if seen.get("running_on"):
                result["seen_running"] = seen["running_on"]
                break
            assert time.monotonic() < deadline and thread.is_alive(), result
            time.sleep(0.1)
        while not list((out / "runs").glob(".*partial/checkpoint.pt")):  # a run is half way on it
            assert time.monotonic() < deadline and thread.is_alive(), result
            time.sleep(0.05)
        cluster.remove_node(doomed, allow_graceful=False)
        replacement = cluster.add_node(num_cpus=1, num_gpus=2)
        thread.join(300)
    finally:
        thread.join()
    assert "error" not in result, result
    report = result["report"]
    assert report.ran == 2 and not report.failed
    for name in ("results.csv", "summary.csv"):
        assert (out / name).read_bytes() == (quiet / name).read_bytes()
    assert tables(out) == tables(quiet)
    status = json.loads((out / "status.json").read_text())
    assert status["retried"] >= 1 and status["done"] == 2 and status["failed"] == 0
    assert status["state"] == "finished" and status["running"] == status["queued"] == 0
    assert sum(status["nodes"].values()) == 2 and result["seen_running"] == {doomed.node_id: 1}
    cluster.remove_node(replacement)


def test_gpu_requests_a_cluster_cannot_meet_are_one_line_and_no_folder(cluster, tmp_path):
    from focusfl.errors import ConfigError

    experiment = load_experiment(write(tmp_path, f'algorithms = ["focus"]\nproblems = ["{SMALL}"]\nrounds = 2\n'))
    with pytest.raises(ConfigError, match="no node of the Ray cluster .* has 3 GPUs"):
        run_sweep(experiment, tmp_path / "out", executor="ray", gpus_per_task=3)
    assert not (tmp_path / "out").exists()


BAD = [
    (["--gpus-per-task", "0"], "--gpus-per-task: must be a positive number"),
    (["--gpus-per-task", "two"], "--gpus-per-task: not a number"),
    (["--gpus-per-task", "1.5"], "--gpus-per-task above 1 must be a whole number"),
    (["--cpus-per-task", "2.5"], "--cpus-per-task above 1 must be a whole number"),
    (["--retries", "-1"], "--retries: must be >= 0"),
    (["--executor", "local", "--gpus-per-task", "0.5"], "--gpus-per-task is for the tasks of a Ray cluster"),
    # No GPU on this machine for a local Ray: said before Ray starts or a folder is made.
    (["--gpus-per-task", "0.25"], "this machine has no GPU for a local Ray"),
]


@pytest.mark.parametrize("given,message", [
    ({"gpus_per_task": -1.0}, "--gpus-per-task must be a positive number"),
    ({"gpus_per_task": float("nan")}, "--gpus-per-task must be a positive number"),
    ({"gpus_per_task": "1"}, "--gpus-per-task must be a positive number"),
    ({"cpus_per_task": 0}, "--cpus-per-task must be a positive number"),
    ({"retries": -2}, "--retries must be a whole number >= 0"),
])
def test_bad_resource_requests_from_the_library_are_one_line(given, message):
    from focusfl.errors import ConfigError
    from focusfl.experiments.executors import make_executor

    with pytest.raises(ConfigError, match=message):
        make_executor("ray", **given)
    if "retries" in given:
        with pytest.raises(ConfigError, match="--retries is for the tasks of a Ray cluster"):
            make_executor("local", **given)


@pytest.mark.parametrize("args,message", BAD, ids=[" ".join(args) for args, _ in BAD])
def test_bad_resource_options_are_one_line_through_the_entry_point(tmp_path, args, message):
    import torch

    if "no GPU" in message and torch.cuda.device_count():
        pytest.skip("this machine has a GPU")
    experiment = write(tmp_path, f'algorithms = ["focus"]\nproblems = ["{SMALL}"]\nrounds = 2\n')
    command = ["sweep", str(experiment), "--out", str(tmp_path / "out")]
    if "--executor" not in args:
        command += ["--executor", "ray"]
    proc = run_cli(*command, *args)
    assert_one_line_error(proc, 2, contains=message)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("device,gpus,message", [
    ("cuda", None, "device 'cuda' on Ray needs --gpus-per-task"),
    ("cuda:0", None, "device 'cuda:0' on Ray needs --gpus-per-task"),
    ("cuda:1", 0.25, "a Ray task sees only the GPU\\(s\\) Ray assigned it"),
    ("cuda:2", 2, "a Ray task sees only the GPU\\(s\\) Ray assigned it"),
])
def test_runs_on_a_gpu_need_a_gpu_request_and_the_gpu_ray_assigns(device, gpus, message):
    from focusfl.errors import ConfigError
    from focusfl.experiments.executors import make_executor

    executor = make_executor("ray", gpus_per_task=gpus)
    with pytest.raises(ConfigError, match=message):
        executor.check_devices(["cpu", device])
    executor.check_devices(["cpu"])
    if gpus:
        executor.check_devices(["cuda", "cuda:0", f"cuda:{max(0, int(gpus) - 1)}"])

"""`focusfl sweep --executor ray` on a cluster of several nodes (Ray's multi-node test cluster,
``ray.cluster_utils.Cluster``, in this machine): tasks placed by their GPU request, batches of
runs per task, a node lost mid-sweep costing nothing, and the status file.

The nodes declare GPUs that the runs do not use (they compute on the CPU), so this runs on CPU
CI. One cluster serves the whole module (each Ray node is several processes; the machine may
have two cores): every test here runs on one xdist worker, one after another."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from cli_harness import assert_one_line_error, run_cli
from focusfl.sweeps.sweep import expand, load_experiment, run_sweep

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

    from focusfl.sweeps.executors import ray_runtime_env

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
    from focusfl.sweeps.executors import RayExecutor, RunTask

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
    from focusfl.sweeps.executors import BatchTask, RunTask, _shipped, publish_shipped
    from focusfl.sweeps.sweep import expand

    experiment = load_experiment(write(tmp_path, f'algorithms = ["focus"]\nproblems = ["{SMALL}"]\n'
                                                 'seeds = 3\nrounds = 10\n'))
    alone = tmp_path / "alone"
    assert not run_sweep(experiment, alone, threads=1, batch_runs=1).failed
    runs = expand(experiment, threads=1)
    tasks = tuple(RunTask(key=run.key, config=run.config.to_dict(), out=str(tmp_path / "runs" / run.key),
                          batch_runs=3) for run in runs)
    outcomes, resumed = _shipped(BatchTask(tasks, 3), {}, None)
    assert resumed == []
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
    from focusfl.sweeps.executors import make_executor

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
    from focusfl.sweeps.executors import make_executor

    executor = make_executor("ray", gpus_per_task=gpus)
    with pytest.raises(ConfigError, match=message):
        executor.check_devices(["cpu", device])
    executor.check_devices(["cpu"])
    if gpus:
        executor.check_devices(["cuda", "cuda:0", f"cuda:{max(0, int(gpus) - 1)}"])


SHIPPING = {"FOCUSFL_SHIP_RUNS": "1"}  # a node that does not see the sweep folder: it ships its runs back


def _sweep_in_thread(experiment, out: Path, result: dict, **options) -> threading.Thread:
    def sweep():
        try:  # two GPUs per task: only the doomed node (and later its replacement) can run it
            result["report"] = run_sweep(experiment, out, executor="ray", threads=1, gpus_per_task=2,
                                         batch_runs=1, checkpoint_every=1, **options)
        except BaseException as exc:  # seen by the assertions below
            result["error"] = exc

    thread = threading.Thread(target=sweep)
    thread.start()
    return thread


def ship_folders(known: frozenset = frozenset()) -> list[Path]:
    """The temporary folders of shipped runs on this machine, but those in ``known`` (a killed
    worker leaves its own behind)."""
    import tempfile

    return [folder for folder in Path(tempfile.gettempdir()).glob("focusfl-ship-*") if folder not in known]


def remove_left_behind(known: frozenset) -> None:
    """The temporary folders the killed node's worker left (a worker that ends removes its own)."""
    import shutil

    for folder in ship_folders(known):
        shutil.rmtree(folder, ignore_errors=True)


def partial_checkpoints(folders) -> int:
    return sum(len(list(folder.glob(".*.focusfl-partial/checkpoint.pt"))) for folder in folders)


def _shipped_checkpoint_written(out: Path, thread: threading.Thread, result: dict, known: frozenset) -> None:
    """Wait until a run is running on the doomed node, in a temporary folder there (never in the
    sweep folder), and has written (and so handed to the tracker) a few checkpoints."""
    deadline = time.monotonic() + 240
    while not (out / "status.json").is_file() or not json.loads((out / "status.json").read_text()).get("running_on"):
        assert time.monotonic() < deadline and thread.is_alive(), result
        time.sleep(0.1)
    # A run hands each checkpoint over before it writes the next: three seen, one is with the tracker.
    versions: set[tuple[int, int]] = set()
    while len(versions) < 3:
        assert time.monotonic() < deadline and thread.is_alive(), result
        for path in (p for folder in ship_folders(known) for p in folder.glob(".*.focusfl-partial/checkpoint.pt")):
            with contextlib.suppress(FileNotFoundError):
                versions.add((path.stat().st_ino, path.stat().st_mtime_ns))
        time.sleep(0.01)
    assert not list((out / "runs").glob(".*partial/checkpoint.pt"))  # the node writes nothing in the folder


def _lose_a_shipping_node(cluster, tmp_path, seeds: int, retries: int, replace_it: bool):
    """A sweep of ``seeds`` FOCUS runs on a node that ships its runs, that node removed once the
    tracker holds a checkpoint (and, with ``replace_it``, another such node added). Returns the
    experiment, the sweep's folder, a sweep's folder that lost no node, what the sweep returned and
    the replacement node."""
    grid = f'algorithms = ["focus"]\nproblems = ["{SMALL}"]\nseeds = {seeds}\nrounds = 1000\nlocal_steps = 2\n'
    experiment = load_experiment(write(tmp_path, grid))
    quiet = tmp_path / "quiet"
    assert not run_sweep(experiment, quiet, threads=1, batch_runs=1).failed
    doomed = cluster.add_node(num_cpus=1, num_gpus=2, env_vars=SHIPPING)
    cluster.wait_for_nodes()
    out, result, known = tmp_path / "lost", {}, frozenset(ship_folders())
    thread = _sweep_in_thread(experiment, out, result, retries=retries)
    replacement = None
    try:
        _shipped_checkpoint_written(out, thread, result, known)
        cluster.remove_node(doomed, allow_graceful=False)
        if replace_it:
            replacement = cluster.add_node(num_cpus=1, num_gpus=2, env_vars=SHIPPING)
        thread.join(300)
    finally:
        thread.join()
        remove_left_behind(known)
    assert "error" not in result, result
    return experiment, out, quiet, result["report"], replacement


def test_a_node_lost_mid_sweep_without_the_folder_resumes_from_its_shipped_checkpoint(cluster, tmp_path):
    """Nodes that do not see the sweep folder run their runs in a temporary folder and hand each
    checkpoint to the sweep's tracker on the driver's node; the node running a run dies half way;
    Ray runs the task again on another such node, which resumes from the latest checkpoint (its
    files checked), and the tables are a sweep's that lost no node."""
    _, out, quiet, report, replacement = _lose_a_shipping_node(cluster, tmp_path, seeds=2, retries=2, replace_it=True)
    assert report.ran == 2 and not report.failed and not report.restarted
    for name in ("results.csv", "summary.csv"):
        assert (out / name).read_bytes() == (quiet / name).read_bytes()
    assert tables(out) == tables(quiet)
    status = json.loads((out / "status.json").read_text())
    assert status["retried"] >= 1 and status["resumed_after_loss"] == 1  # resumed, not run from round 0
    assert status["done"] == 2 and status["failed"] == 0 and status["state"] == "finished"
    cluster.remove_node(replacement)


def test_a_shipped_run_whose_retries_are_spent_keeps_its_checkpoint_for_the_same_command(cluster, tmp_path):
    """With no retries, a run lost with its node fails; the driver puts the latest checkpoint the
    tracker holds into the sweep folder (a partial run folder, as a killed run leaves it), and the
    same command hands it to a node without the folder, which resumes from it."""
    experiment, out, quiet, report, _ = _lose_a_shipping_node(cluster, tmp_path, seeds=1, retries=0,
                                                              replace_it=False)
    assert len(report.failed) == 1
    kept = list((out / "runs").glob(".*.focusfl-partial/checkpoint.pt"))
    assert len(kept) == 1
    replacement = cluster.add_node(num_cpus=1, num_gpus=2, env_vars=SHIPPING)
    cluster.wait_for_nodes()
    again = run_sweep(experiment, out, executor="ray", threads=1, gpus_per_task=2, batch_runs=1, retries=0)
    assert again.resumed == 1 and again.ran == 1 and not again.failed and not again.restarted
    assert tables(out) == tables(quiet)
    cluster.remove_node(replacement)


@pytest.mark.parametrize("signum,code,ship", [(signal.SIGINT, 130, False), (signal.SIGTERM, 143, False),
                                              (signal.SIGINT, 130, True)],
                         ids=["ctrl-c", "sigterm", "ctrl-c-shipped"])
def test_ctrl_c_stops_a_ray_sweep_as_it_stops_a_sweep_on_one_machine(tmp_path, signum, code, ship):
    """Ctrl-C (or SIGTERM) to `focusfl sweep --executor ray`: Ray's cancel stops each run in flight
    at the end of its round with a checkpoint; the sweep says so in the line a sweep on one
    machine prints (tests/test_sweep.py), exits with the signal's status, and the same command
    finds every run resumable. Shipped runs (the local Ray's nodes told FOCUSFL_SHIP_RUNS=1) come
    back stopped, and the driver publishes them so."""
    from cli_harness import cli_env, popen_cli

    from focusfl.runs.folder import run_state

    path = write(tmp_path, f"algorithms = ['focus']\nproblems = ['{SMALL}']\nrounds = 10000000\nseeds = 2\n")
    out = tmp_path / "sweep"
    env = cli_env()
    known = frozenset(ship_folders())
    # A local Ray of its own, as a user's first sweep on Ray starts (Ray would join the module's
    # cluster, which is running on this machine).
    env["RAY_ADDRESS"] = "local"
    if ship:
        env["FOCUSFL_SHIP_RUNS"] = "1"  # the local Ray's node inherits the driver's environment
    # A session of its own, as a terminal's job: Ctrl-C goes to its whole process group.
    proc = popen_cli("sweep", str(path), "--out", str(out), "--executor", "ray", "--checkpoint-every", "1000",
                     env=env, start_new_session=True)
    deadline = time.monotonic() + 180
    while partial_checkpoints(ship_folders(known) if ship else [out / "runs"]) < 2:
        if proc.poll() is not None or time.monotonic() >= deadline:  # say why (CI once saw exit 1 here)
            proc.kill()
            stdout, stderr = proc.communicate(timeout=60)
            pytest.fail(f"the sweep ended ({proc.returncode}) or took 180 s before 2 checkpoints:\n"
                        f"{stdout[-3000:]}\n{stderr[-3000:]}")
        time.sleep(0.05)
    assert partial_checkpoints([out / "runs"]) == (0 if ship else 2)  # shipped runs write nothing in the folder
    if signum == signal.SIGINT:
        os.killpg(proc.pid, signum)  # the local Ray's processes too, as a terminal's Ctrl-C
    else:
        proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=180)
    assert proc.returncode == code, stderr
    assert stderr.strip().splitlines()[-1] == (
        "focusfl: sweep interrupted: 2 run(s) stopped with a checkpoint; run the same command again to continue")
    status = json.loads((out / "status.json").read_text())
    assert status["state"] == "stopped" and status["interrupted"] == 2 and status["failed"] == 0
    runs = [folder for folder in (out / "runs").iterdir() if not folder.name.startswith(".")]
    assert len(runs) == 2
    for folder in runs:
        assert json.loads((folder / "config.json").read_text())["status"] == "interrupted"
        assert run_state(folder, folder.name) == "resume"


def _snapshot_of_a_stopped_run(tmp_path: Path) -> dict:
    """folder_snapshot of a run's partial folder after its checkpoint of round 4 (of 8)."""
    from focusfl.sweeps.executors import folder_snapshot
    from focusfl.runs.config import RunConfig
    from focusfl.runs.folder import run_to_folder

    taken: list[dict] = []

    def ship(out, work, checkpoint):
        if checkpoint.round == 4:
            taken.append(folder_snapshot(work, checkpoint.round, checkpoint.metrics_bytes))

    config = RunConfig(algorithm="focus", problem=SMALL, rounds=8, lr=1e-3)
    run_to_folder(config, tmp_path / "alone", checkpoint_every=2, curve=False, on_checkpoint=ship)
    return taken[0]


def test_a_shipped_checkpoint_resumes_to_the_bytes_of_the_run_alone(tmp_path):
    """A checkpoint taken as bytes (folder_snapshot), checked and installed in another folder,
    resumes there to the files of the run that was never stopped."""
    from focusfl.sweeps.executors import checked_files, install_checkpoint
    from focusfl.runs.folder import resume_folder, run_state

    snapshot = _snapshot_of_a_stopped_run(tmp_path)
    assert snapshot["round"] == 4 and sorted(snapshot["files"]) == ["checkpoint.pt", "config.json", "metrics.csv"]
    elsewhere = tmp_path / "elsewhere" / "run"
    install_checkpoint(elsewhere, checked_files(snapshot, "k"))
    assert run_state(elsewhere, "k") == "resume"
    resume_folder(elsewhere, curve=False)
    assert tables(elsewhere) == tables(tmp_path / "alone")


@pytest.mark.parametrize("damage,message", [
    (lambda s: s["files"].update({"checkpoint.pt": s["files"]["checkpoint.pt"][:-1]}),
     r"checkpoint.pt is \d+ bytes, \d+ were written"),
    (lambda s: s["files"].update({"metrics.csv": s["files"]["metrics.csv"].replace(b"0", b"1", 1)}),
     "metrics.csv has changed since it was written"),
    (lambda s: (s["files"].pop("checkpoint.pt"), s["digests"].pop("checkpoint.pt")), "holds no checkpoint.pt"),
    (lambda s: (s["files"].update({"../x": b""}), s["digests"].update({"../x": [0, ""]})), "holds a file named '../x'"),
    (lambda s: s["digests"].pop("config.json"), "is not a checkpoint focusfl shipped"),
    (lambda s: s.update({"files": None}), "is not a checkpoint focusfl shipped"),
    (lambda s: s["digests"].update({"config.json": "0"}), "is not a checkpoint focusfl shipped"),
])
def test_a_shipped_checkpoint_that_does_not_check_out_is_one_line_and_never_used(tmp_path, damage, message):
    from focusfl.errors import DataError
    from focusfl.sweeps.executors import RunTask, _shipped, checked_files

    snapshot = _snapshot_of_a_stopped_run(tmp_path)
    damage(snapshot)
    with pytest.raises(DataError, match=message) as caught:
        checked_files(snapshot, "0123456789abcdef")
    assert "\n" not in str(caught.value) and "the shipped checkpoint of run 0123456789ab" in str(caught.value)
    # A run handed such a checkpoint runs from round 0, to the same files, and says why.
    from focusfl.runs.config import RunConfig

    task = RunTask(key="0123456789abcdef", out=str(tmp_path / "x"),
                   config=RunConfig(algorithm="focus", problem=SMALL, rounds=8, lr=1e-3).to_dict())
    (outcome,), resumed = _shipped(task, {task.key: snapshot}, None)
    assert outcome["status"] == "complete" and resumed == [] and outcome["restarted"] == str(caught.value)
    for name in ("metrics.csv", "model.pt"):
        assert outcome["files"][name] == (tmp_path / "alone" / name).read_bytes()


@pytest.mark.parametrize("value,ships", [("", False), ("0", False), ("1", True)])
def test_a_node_ships_its_runs_back_where_it_does_not_see_the_folder_or_is_told_to(tmp_path, monkeypatch, value, ships):
    from focusfl.sweeps.executors import sees_sweep_folder
    from focusfl.io.folders import MARKER

    monkeypatch.setenv("FOCUSFL_SHIP_RUNS", value)
    assert not sees_sweep_folder(tmp_path)  # no marker: not the sweep folder, wherever it is
    (tmp_path / MARKER).write_text("{}")
    assert sees_sweep_folder(tmp_path) is not ships


@pytest.mark.parametrize("value", ["yes", "2", " 1"])
def test_a_bad_ship_runs_value_is_one_line(tmp_path, monkeypatch, value):
    from focusfl.errors import ConfigError
    from focusfl.sweeps.executors import sees_sweep_folder

    monkeypatch.setenv("FOCUSFL_SHIP_RUNS", value)
    with pytest.raises(ConfigError, match=f"FOCUSFL_SHIP_RUNS must be 0 or 1 on node .*, got {value!r}"):
        sees_sweep_folder(tmp_path)

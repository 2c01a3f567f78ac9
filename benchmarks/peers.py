"""focusfl side by side with its peers, pfl-research and Flower's simulation, on one FedAvg workload.

Workload (the same for every framework): FedAvg on the FOCUS paper's CIFAR-10 CNN (541,094
parameters, built as benchmarks/paper_cifar.py builds it, with identical initial weights),
synthetic CIFAR-shaped uint8 images (fixed seed), 500 images per client, the same client split
and the same standardisation; every active client takes 5 local SGD steps of batch 32 at lr 0.05
and the server averages the active clients' models (server step 1). CPU, float32. Two settings:

- ``full``: 10 clients, all active every round;
- ``sampled``: 50 clients, 10 drawn uniformly every round.

So every round processes 10 x 5 x 32 = 1,600 samples; each runner counts the samples its local
steps actually passed through the model and prints them beside its seconds per round and the
final loss (mean cross-entropy of the final server model on a fixed set of 2,048 of the
training images, computed the same way for all), so that equal work is visible.

Runners (each in its own subprocess, with its own interpreter where the framework needs one):

- ``focusfl``: focusfl's vectorized engine (``simulate``) at its defaults with ``T`` torch
  threads, and with every layout (channels-last, NCHW), client chunk (the rule's, 1, all) and
  thread count it offers, and (``focusfl-workers``) with ``T`` client workers of one thread
  each, the active clients in ``T`` even chunks (``--client-workers``: the same bytes as one);
- ``pfl``: pfl-research (``FederatedAveraging`` over a ``SimulatedBackend``) as its examples set
  it up (one process, NCHW, ``T`` threads) and at its best: channels-last, and its multi-process
  mode (``torchrun``, one process per core with one thread each);
- ``flower``: Flower's simulation runtime (``run_simulation`` with a ``ServerApp`` running the
  ``FedAvg`` strategy and a ``ClientApp``, Ray backend) with its default resources (one actor of
  ``T`` CPUs) and at its best: channels-last, one Ray actor per core with one thread each;
- ``loop``: a plain per-client PyTorch loop (one module, clients in turn, channels-last);
- ``floor``: only the forward and backward passes a round needs (one per client and local
  step on 32 ready inputs, channels-last, one module): what any engine must at least do; with
  ``T`` threads, and (``floor-1thread``) with one.

Before the last line, a ``limit`` line per setting where both floors ran: no engine's round can
take less than the smaller of the ``T``-thread floor and the one-thread floor split perfectly
over ``T`` cores, so the fastest peer's seconds over that bound is the most any engine could be
faster than it on this machine.

Seconds per round: every runner times each round from the end of the previous one (the
framework's own per-round hook: focusfl's ``on_round``, pfl's ``after_central_iteration``,
Flower's ``aggregate_train``); 3 warm-up rounds, then ``--rounds`` timed rounds; start-up (Ray,
torchrun, imports) is excluded. The runners are interleaved (A B C ... A B C ...) for ``--passes``
passes; the table gives the median of all timed rounds and the range of the per-pass medians.
The last line compares focusfl's default with each peer's best configuration on the slower of
the two settings: ``peers: focusfl/pfl=X focusfl/flower=Y (setting S, threads T)``, where X and Y
are the peer's seconds per round over focusfl's (above 1: focusfl is faster).

Installing the peers (benchmark-only; never dependencies of focusfl). Flower 1.42 with Ray is in
focusfl's own environment (``pip install 'flwr[simulation]'``). pfl-research pins its own
dependencies, so it goes in a virtual environment of its own::

    python -m venv /tmp/pflvenv && /tmp/pflvenv/bin/pip install torch==2.13.0 pfl==0.6.0

Running::

    PYTHONPATH=src python benchmarks/peers.py --pfl-python /tmp/pflvenv/bin/python
    PYTHONPATH=src python benchmarks/peers.py --small            # a few rounds, quick check
    PYTHONPATH=src python benchmarks/peers.py --settings full --runners focusfl pfl-best

A runner that cannot run (its framework not installed, or failing) is reported with the exact
reason, and the others go on.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

PER_CLIENT, STEPS, BATCH, LR, CLASSES = 500, 5, 32, 0.05, 10
SHAPE = (3, 32, 32)
SETTINGS = {"full": (10, 10), "sampled": (50, 10)}  # name: (clients, active per round)
EVAL_IMAGES = 2048
HERE = Path(__file__).resolve()


# -- the shared workload ---------------------------------------------------------------------------
def synthetic_images(clients: int) -> tuple[np.ndarray, np.ndarray]:
    """The uint8 images [clients x 500, 3, 32, 32] and labels, the same in every process."""
    rng = np.random.default_rng(0)
    total = clients * PER_CLIENT
    return rng.integers(0, 256, (total, *SHAPE), dtype=np.uint8), rng.integers(0, CLASSES, total)


def write_workload(folder: Path, clients: int) -> None:
    """What the peers need from focusfl's problem, as plain files: the model (an nn.Sequential of
    torch layers only, so no focusfl import is needed to load it) with focusfl's initial weights,
    the client split, and the per-channel standardisation."""
    import torch

    problem = focusfl_problem(clients, "auto", "auto")
    model = problem.grouped.eval_model
    model = type(model)(*[m for m in model])  # a fresh Sequential of the same layers
    torch.nn.utils.vector_to_parameters(problem.initial_point(), model.parameters())
    torch.save(model, folder / "model.pt")
    order = problem.client_order.cpu().numpy()
    starts, sizes = problem.client_starts.cpu().numpy(), problem.sizes.cpu().numpy()
    owned = np.stack([order[s : s + n] for s, n in zip(starts, sizes)])
    np.savez(folder / "workload.npz", owned=owned, scale=problem.client_data.scale.cpu().numpy().reshape(-1),
             shift=problem.client_data.shift.cpu().numpy().reshape(-1))


def load_workload(folder: Path, clients: int, channels_last: bool):
    """(model, inputs per client, labels per client, eval inputs, eval labels) in this process."""
    import torch

    torch.manual_seed(0)
    model = torch.load(folder / "model.pt", weights_only=False)
    saved = np.load(folder / "workload.npz")
    images, labels = synthetic_images(clients)
    scale = torch.from_numpy(saved["scale"]).view(1, -1, 1, 1)
    shift = torch.from_numpy(saved["shift"]).view(1, -1, 1, 1)
    layout = torch.channels_last if channels_last else torch.contiguous_format

    def inputs(rows):
        return (torch.from_numpy(images[rows]).float() * scale + shift).contiguous(memory_format=layout)

    owned = saved["owned"]
    xs = [inputs(rows) for rows in owned]
    ys = [torch.from_numpy(labels[rows]).long() for rows in owned]
    rows = np.arange(EVAL_IMAGES)
    model = model.to(memory_format=layout)
    return model, xs, ys, inputs(rows), torch.from_numpy(labels[rows]).long()


def eval_loss(model, inputs, labels) -> float:
    import torch
    import torch.nn.functional as F

    with torch.no_grad():
        return float(F.cross_entropy(model(inputs), labels))


def flat(params) -> "torch.Tensor":
    """The parameters as one vector (any memory layout)."""
    import torch

    return torch.cat([p.detach().reshape(-1) for p in params])


def assign(vector, params) -> None:
    """Copy ``vector`` into the parameters (any memory layout)."""
    import torch

    with torch.no_grad():
        offset = 0
        for p in params:
            p.copy_(vector[offset : offset + p.numel()].view(p.shape))
            offset += p.numel()


def per_round(stamps: list[float], warm: int) -> list[float]:
    """Seconds of each round after the warm-up ones, from consecutive end-of-round stamps."""
    return [b - a for a, b in zip(stamps[warm - 1 :], stamps[warm:])]


# -- focusfl ----------------------------------------------------------------------------------------
def focusfl_problem(clients: int, layout: str, chunk):
    import torch

    from focusfl.data import Dataset, ImageData
    from focusfl.problems.nn import NeuralNetwork

    images, labels = synthetic_images(clients)
    test = ImageData(images[:64], labels[:64])
    return NeuralNetwork(dataset=Dataset("synthetic-cifar10", ImageData(images, labels), test, CLASSES),
                         model="focus-cnn", clients=clients, partition="iid", batch=BATCH, dtype=torch.float32,
                         layout=layout, client_chunk=chunk)


def run_focusfl(args, config: dict) -> dict:
    import torch

    from focusfl.algorithms import make_algorithm
    from focusfl.engine import simulate
    from focusfl.participation import make_participation
    from focusfl.threads import client_workers

    torch.set_num_threads(config["threads"])
    clients, active = SETTINGS[args.setting]
    workers = config.get("client_workers", 1)
    chunk = config.get("client_chunk", "auto")
    if chunk == "split":  # the active clients split evenly among the workers
        chunk = -(-active // workers)
    problem = focusfl_problem(clients, config.get("layout", "auto"), chunk)
    chunk, layout = problem.formulation()
    algorithm = make_algorithm("fedavg", lr=LR, local_steps=STEPS)
    spec = "full" if active == clients else f"uniform:m={active}"
    participation = make_participation(spec, clients, seed=0)
    stamps: list[float] = []
    total = args.warmup + args.rounds
    start = time.perf_counter()
    with client_workers(workers, config["threads"]):
        result = simulate(algorithm, problem, participation, rounds=total, eval_every=total + 1, keep_rows=False,
                          on_round=lambda _: stamps.append(time.perf_counter()))
    stamps.insert(0, start)
    model, _, _, eval_x, eval_y = load_workload(Path(args.workload), clients, False)
    assign(result.state.server.x.float(), list(model.parameters()))
    import focusfl

    # Samples: every active client's local steps over minibatches of BATCH (its 500 samples > BATCH).
    return {"seconds": per_round(stamps, args.warmup), "samples_per_round": active * STEPS * BATCH,
            "final_loss": eval_loss(model, eval_x, eval_y), "version": f"focusfl {focusfl.__version__}",
            "chose": f"client_chunk={chunk or 'all'}, layout={layout}"
                     + (f", client_workers={workers}" if workers > 1 else "")}


# -- plain loop and floor ---------------------------------------------------------------------------
def run_loop(args, config: dict, floor: bool = False) -> dict:
    """FedAvg as a plain PyTorch user writes it: one module, clients in turn (floor: only the
    forward and backward passes of every client step, on one fixed batch)."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(config["threads"])
    clients, active = SETTINGS[args.setting]
    channels_last = config.get("channels_last", True)
    model, xs, ys, eval_x, eval_y = load_workload(Path(args.workload), clients, channels_last)
    params = list(model.parameters())
    x = flat(params).clone()
    generator = torch.Generator().manual_seed(0)
    optimizer = torch.optim.SGD(params, lr=LR)
    samples = 0
    stamps = [time.perf_counter()]
    for _ in range(args.warmup + args.rounds):
        chosen = torch.randperm(clients, generator=generator)[:active].tolist()
        total = torch.zeros_like(x)
        for c in chosen:
            if not floor:
                assign(x, params)
            for _ in range(STEPS):
                if floor:
                    picks = slice(0, BATCH)
                else:
                    picks = torch.randint(PER_CLIENT, (BATCH,), generator=generator)
                optimizer.zero_grad(set_to_none=True)
                F.cross_entropy(model(xs[c][picks]), ys[c][picks]).backward()
                if not floor:
                    optimizer.step()
                samples += BATCH
            if not floor:
                total += flat(params)
        if not floor:
            x = total / len(chosen)
        stamps.append(time.perf_counter())
    assign(x, params)
    return {"seconds": per_round(stamps, args.warmup), "samples_per_round": samples / (args.warmup + args.rounds),
            "final_loss": float("nan") if floor else eval_loss(model, eval_x, eval_y),
            "version": f"torch {torch.__version__}"}


# -- pfl-research -----------------------------------------------------------------------------------
def run_pfl(args, config: dict) -> dict:
    import torch
    import torch.nn.functional as F
    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.callback.base import TrainingProcessCallback
    from pfl.data.dataset import Dataset
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.data.sampling import get_user_sampler
    from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
    from pfl.metrics import Metrics, Weighted
    from pfl.model.pytorch import PyTorchModel
    from pfl.version import __version__ as pfl_version

    torch.set_num_threads(config["threads"])
    clients, active = SETTINGS[args.setting]
    channels_last = config.get("channels_last", False)
    net, xs, ys, eval_x, eval_y = load_workload(Path(args.workload), clients, channels_last)
    counted = [0]

    class Module(torch.nn.Module):
        """pfl's model contract: the network with ``loss`` and ``metrics``."""

        def __init__(self, net):
            super().__init__()
            self.net = net

        def forward(self, x):
            return self.net(x)

        def loss(self, x, y, eval=False):
            self.train(not eval)
            if not eval:
                counted[0] += len(y)
            return F.cross_entropy(self(x), y)

        @torch.no_grad()
        def metrics(self, x, y, eval=False):
            self.train(not eval)
            return {"loss": Weighted(float(F.cross_entropy(self(x), y, reduction="sum")), len(y))}

    module = Module(net)
    model = PyTorchModel(module, local_optimizer_create=torch.optim.SGD,
                         central_optimizer=torch.optim.SGD(module.parameters(), lr=1.0))
    users = list(range(clients))
    sampler = "minimize_reuse" if active == clients else "random"
    data = FederatedDataset(lambda u: Dataset(raw_data=[xs[u], ys[u]], user_id=u),
                            get_user_sampler(sampler, users))
    stamps = [time.perf_counter()]

    class Stamp(TrainingProcessCallback):
        def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
            stamps.append(time.perf_counter())
            return False, Metrics()

    total = args.warmup + args.rounds
    FederatedAveraging().run(
        algorithm_params=NNAlgorithmParams(central_num_iterations=total, evaluation_frequency=total + 1,
                                           train_cohort_size=active, val_cohort_size=0),
        backend=SimulatedBackend(training_data=data, val_data=data),
        model=model,
        model_train_params=NNTrainHyperParams(local_learning_rate=LR, local_num_epochs=None, local_num_steps=STEPS,
                                              local_batch_size=BATCH),
        model_eval_params=NNEvalHyperParams(local_batch_size=256),
        callbacks=[Stamp()], send_metrics_to_platform=False)
    samples = torch.tensor([float(counted[0])])
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(samples)  # the other processes' clients
    return {"seconds": per_round(stamps, args.warmup), "samples_per_round": float(samples) / total,
            "final_loss": eval_loss(module, eval_x, eval_y), "version": f"pfl {pfl_version}"}


# -- Flower -----------------------------------------------------------------------------------------
def run_flower(args, config: dict) -> dict:
    import flwr
    import torch
    from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg
    from flwr.simulation import run_simulation

    clients, active = SETTINGS[args.setting]
    channels_last = config.get("channels_last", False)
    actor_threads = config["threads"] // config["actors"]
    workload = Path(args.workload)

    def client_data():
        # Kept per actor process: Ray may unpickle the ClientApp afresh for a call, so a closure's
        # dict would be empty again; a module in sys.modules lives as long as the actor.
        import types

        cache = sys.modules.setdefault("_peers_flower_cache", types.ModuleType("_peers_flower_cache")).__dict__
        if "data" not in cache:
            torch.set_num_threads(actor_threads)
            cache["data"] = load_workload(workload, clients, channels_last)
            cache["generator"] = torch.Generator().manual_seed(os.getpid())
        return cache["data"], cache["generator"]

    client_app = ClientApp()

    @client_app.train()
    def train(msg: Message, context: Context) -> Message:
        import torch.nn.functional as F

        (model, xs, ys, _, _), generator = client_data()
        c = int(context.node_config["partition-id"])
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        optimizer = torch.optim.SGD(model.parameters(), lr=LR)
        for _ in range(STEPS):
            picks = torch.randint(PER_CLIENT, (BATCH,), generator=generator)
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(xs[c][picks]), ys[c][picks]).backward()
            optimizer.step()
        metrics = MetricRecord({"num-examples": PER_CLIENT, "samples": STEPS * BATCH})
        return Message(content=RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics}),
                       reply_to=msg)

    stamps: list[float] = []
    samples: list[float] = []
    final: dict = {}

    class Timed(FedAvg):
        def aggregate_train(self, server_round, replies):
            replies = list(replies)
            arrays, metrics = super().aggregate_train(server_round, replies)
            samples.append(sum(float(m.content["metrics"]["samples"]) for m in replies if m.has_content()))
            stamps.append(time.perf_counter())
            return arrays, metrics

    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        model = torch.load(workload / "model.pt", weights_only=False)
        strategy = Timed(fraction_train=active / clients, fraction_evaluate=0.0, min_train_nodes=active,
                         min_available_nodes=clients)
        result = strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()),
                                num_rounds=args.warmup + args.rounds)
        final["state"] = result.arrays.to_torch_state_dict()

    resources = {"num_cpus": config["threads"] // config["actors"], "num_gpus": 0.0}
    # A Ray cluster of this run's own (its own folder), never one another process started.
    ray_dir = tempfile.mkdtemp(prefix="peers-ray-", dir="/tmp")
    try:
        run_simulation(server_app, client_app, num_supernodes=clients,
                       backend_config={"client_resources": resources,
                                       "init_args": {"num_cpus": config["threads"], "object_store_memory": 400 * 2**20,
                                                     "_temp_dir": ray_dir}})
    finally:
        shutil.rmtree(ray_dir, ignore_errors=True)
    if len(stamps) != args.warmup + args.rounds or "state" not in final:
        raise RuntimeError(f"the Flower simulation ran {len(stamps)} of {args.warmup + args.rounds} rounds")
    model, _, _, eval_x, eval_y = load_workload(workload, clients, False)
    model.load_state_dict(final["state"])
    # The first stamp closes round 1 (its start is Ray's start-up): per-round times from round 2.
    return {"seconds": per_round(stamps, args.warmup), "samples_per_round": statistics.mean(samples),
            "final_loss": eval_loss(model, eval_x, eval_y), "version": f"flwr {flwr.__version__}"}


# -- the runners ------------------------------------------------------------------------------------
def runner_table(threads: int) -> dict[str, tuple[str, dict, str]]:
    """name: (framework, configuration, description). ``T`` threads in all; the peers' best
    configurations split them into one single-threaded process or actor per core."""
    t = threads
    table = {
        "focusfl": ("focusfl", {"threads": t}, f"defaults (layout=auto, client_chunk=auto), {t} threads"),
        "focusfl-nchw": ("focusfl", {"threads": t, "layout": "nchw"}, f"layout=nchw, {t} threads"),
        "focusfl-chunk1": ("focusfl", {"threads": t, "client_chunk": 1}, f"client_chunk=1, {t} threads"),
        "focusfl-all": ("focusfl", {"threads": t, "client_chunk": 0}, f"client_chunk=0 (all), {t} threads"),
        "focusfl-workers": ("focusfl", {"threads": 1, "client_workers": t, "client_chunk": "split"},
                            f"client_workers={t} x 1 thread, the active clients in {t} even chunks"),
        "pfl": ("pfl", {"threads": t, "processes": 1}, f"as in its examples: 1 process, NCHW, {t} threads"),
        "pfl-best": ("pfl", {"threads": 1, "processes": t, "channels_last": True},
                     f"torchrun {t} processes x 1 thread, channels-last"),
        "flower": ("flower", {"threads": t, "actors": 1}, f"1 Ray actor of {t} CPUs, NCHW"),
        "flower-best": ("flower", {"threads": t, "actors": t, "channels_last": True},
                        f"{t} Ray actors x 1 thread, channels-last"),
        "loop": ("loop", {"threads": t}, f"plain per-client torch loop, channels-last, {t} threads"),
        "floor": ("floor", {"threads": t}, f"forward+backward passes only, channels-last, {t} threads"),
    }
    if t > 1:
        table["focusfl-1thread"] = ("focusfl", {"threads": 1}, "defaults, 1 thread (focusfl's run default)")
        table["pfl-1proc-cl"] = ("pfl", {"threads": t, "processes": 1, "channels_last": True},
                                 f"1 process, channels-last, {t} threads")
        table["floor-1thread"] = ("floor", {"threads": 1}, "forward+backward passes only, channels-last, 1 thread")
    return table


def limit(results: dict[str, list[dict]], threads: int) -> dict | None:
    """The fastest round any engine could take on ``threads`` cores, from the floors measured in
    the same passes: the bare passes with ``threads`` intra-op threads, or one thread's floor
    split perfectly over the cores (clients side by side, as pfl's processes compute them);
    and the most any engine could gain over the best peer measured. None without the floors."""
    floors = {name: summary(results.get(name, [])) for name in ("floor", "floor-1thread")}
    if not all(floors.values()):
        return None
    split = floors["floor-1thread"]["median"] / threads
    bound = min(floors["floor"]["median"], split)
    peers = {name: summary(results.get(name, [])) for name in ("pfl-best", "pfl", "flower-best", "flower")}
    best = min((s["median"], name) for name, s in peers.items() if s) if any(peers.values()) else None
    return {"bound": bound, "floor": floors["floor"]["median"], "split": split,
            "peer": None if best is None else best[1], "peer_seconds": None if best is None else best[0],
            "most": None if best is None else best[0] / bound}


def limit_line(setting: str, found: dict, threads: int) -> str:
    line = (f"limit ({setting}): no engine's round below {found['bound']:.3f} s on {threads} cores "
            f"(floor {found['floor']:.3f} s with {threads} threads; one thread's floor / {threads} = "
            f"{found['split']:.3f} s)")
    if found["peer"] is not None:
        line += (f"; the fastest peer, {found['peer']}, {found['peer_seconds']:.3f} s: no engine can be more than "
                 f"{found['most']:.2f}x faster than it here")
    return line


WORKERS = {"focusfl": run_focusfl, "loop": run_loop, "floor": lambda a, c: run_loop(a, c, floor=True),
           "pfl": run_pfl, "flower": run_flower}


def worker_main(args) -> None:
    config = json.loads(args.config)
    result = WORKERS[args.framework](args, config)
    rank = os.environ.get("RANK", "0")
    if rank == "0":
        Path(args.result).write_text(json.dumps(result))


def launch(args, framework: str, config: dict, setting: str, workload: Path) -> dict:
    """One runner in its own subprocess; its result, or {"error": the exact reason}."""
    python = args.pfl_python if framework == "pfl" else sys.executable
    if framework == "pfl" and not python:
        return {"error": "pfl-research: no interpreter given (--pfl-python; see the install line in this file)"}
    if not Path(python).exists():
        return {"error": f"{framework}: interpreter {python} not found"}
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as handle:
        out = Path(handle.name)
    common = [str(HERE), "--worker", framework, "--config", json.dumps(config), "--setting", setting,
              "--workload", str(workload), "--result", str(out), "--rounds", str(args.rounds),
              "--warmup", str(args.warmup)]
    if framework == "pfl" and config.get("processes", 1) > 1:
        command = [python, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={config['processes']}",
                   *common]
    else:
        command = [python, *common]
    env = dict(os.environ, FLWR_TELEMETRY_ENABLED="0", OMP_NUM_THREADS=str(config["threads"]),
               PYTHONPATH=os.pathsep.join(p for p in [str(HERE.parents[1] / "src"), os.environ.get("PYTHONPATH")]
                                          if p))
    if framework == "pfl":
        # pfl's environment has no focusfl (the runner loads the model and data from plain files).
        env["PYTHONPATH"] = os.environ.get("PFL_PYTHONPATH", "")
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.timeout)
        if done.returncode != 0 or not out.stat().st_size:
            lines = (done.stderr or done.stdout).strip().splitlines()
            errors = [line.strip() for line in lines if "Error" in line and "errors.html" not in line]
            return {"error": f"{framework} exited {done.returncode}: " + " | ".join(errors[-2:] or lines[-3:])}
        return json.loads(out.read_text())
    except subprocess.TimeoutExpired:
        return {"error": f"{framework}: more than {args.timeout} s"}
    finally:
        out.unlink(missing_ok=True)


def summary(results: list[dict]) -> dict | None:
    ok = [r for r in results if "error" not in r]
    if not ok:
        return None
    rounds = [s for r in ok for s in r["seconds"]]
    passes = [statistics.median(r["seconds"]) for r in ok]
    return {"median": statistics.median(rounds), "low": min(passes), "high": max(passes),
            "samples": statistics.mean(r["samples_per_round"] for r in ok),
            "loss": ok[-1]["final_loss"], "version": ok[-1]["version"], "chose": ok[-1].get("chose", "")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--runners", nargs="+", default=None, help="default: all (see runner_table)")
    parser.add_argument("--rounds", type=int, default=30, help="timed rounds, after --warmup")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--passes", type=int, default=2, help="interleaved passes over the runners")
    parser.add_argument("--threads", type=int, default=2, help="threads (or processes, actors) for every runner")
    parser.add_argument("--pfl-python", default=None, help="the interpreter of pfl-research's environment")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds one runner may take")
    parser.add_argument("--small", action="store_true", help="quick check: 2 timed rounds after 1, one pass")
    parser.add_argument("--json", default=None, help="also write every result here")
    # worker mode (internal)
    parser.add_argument("--worker", dest="framework", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--config", default="{}", help=argparse.SUPPRESS)
    parser.add_argument("--setting", default="full", help=argparse.SUPPRESS)
    parser.add_argument("--workload", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.framework:
        worker_main(args)
        return
    if args.small:
        args.rounds, args.warmup, args.passes = 2, 1, 1
    table = runner_table(args.threads)
    names = args.runners or list(table)
    unknown = [n for n in names if n not in table]
    if unknown:
        raise SystemExit(f"unknown runners {unknown} (known: {', '.join(table)})")

    print(f"load before: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f} (1, 5, 15 min); "
          f"{os.cpu_count()} CPUs; threads {args.threads}; {args.warmup} warm-up + {args.rounds} timed rounds, "
          f"{args.passes} interleaved passes", flush=True)
    every: dict = {}
    with tempfile.TemporaryDirectory() as scratch:
        for setting in args.settings:
            clients, active = SETTINGS[setting]
            workload = Path(scratch) / setting
            workload.mkdir()
            write_workload(workload, clients)
            results: dict[str, list[dict]] = {name: [] for name in names}
            for p in range(args.passes):
                for name in names:
                    framework, config, _ = table[name]
                    result = launch(args, framework, config, setting, workload)
                    results[name].append(result)
                    shown = result.get("error") or (f"{statistics.median(result['seconds']):.3f} s/round, "
                                                    f"{result['samples_per_round']:.0f} samples/round, "
                                                    f"final loss {result['final_loss']:.4f}")
                    print(f"  [{setting} pass {p + 1}] {name}: {shown}", flush=True)
            every[setting] = results
            print(f"\n{setting}: {clients} clients, {active} active a round, {STEPS} steps of batch {BATCH}, "
                  f"lr {LR}; s/round: median of all timed rounds, range of the pass medians")
            print(f"{'runner':<16} {'version':<16} {'s/round':>8} {'range':>13} {'samples':>8} {'final loss':>11}  "
                  "configuration")
            for name in names:
                s = summary(results[name])
                if s is None:
                    print(f"{name:<16} failed: {results[name][-1]['error']}")
                    continue
                chose = f" (chose {s['chose']})" if s["chose"] else ""
                print(f"{name:<16} {s['version']:<16} {s['median']:>8.3f} {s['low']:>6.3f}-{s['high']:<6.3f} "
                      f"{s['samples']:>8.0f} {s['loss']:>11.4f}  {table[name][2]}{chose}")
            print(flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(every, indent=1))
    print(f"load after: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    for setting, results in every.items():
        found = limit(results, args.threads)
        if found is not None:
            print(limit_line(setting, found, args.threads))
    verdicts = []
    for setting, results in every.items():
        ours = summary(results.get("focusfl", []))
        if ours is None:
            continue
        ratios = {}
        for peer in ("pfl", "flower"):
            best = [summary(results.get(n, [])) for n in (peer, f"{peer}-best") if n in results]
            best = [b["median"] for b in best if b]
            ratios[peer] = min(best) / ours["median"] if best else float("nan")
        verdicts.append((ours["median"], setting, ratios))
    if verdicts:
        _, setting, ratios = max(verdicts)
        shown = {peer: "n/a" if ratio != ratio else f"{ratio:.2f}" for peer, ratio in ratios.items()}
        print(f"peers: focusfl/pfl={shown['pfl']} focusfl/flower={shown['flower']} "
              f"(setting {setting}, threads {args.threads})")


if __name__ == "__main__":
    main()

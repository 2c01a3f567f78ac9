"""One command for a lent GPU: focusfl's device promises checked, and the CIFAR round timed.

    PYTHONPATH=src python benchmarks/gpu_check.py                 # CUDA, about 3-5 minutes
    PYTHONPATH=src python benchmarks/gpu_check.py --device cpu --small   # the same checks, tiny (a test runs it)

Checks (each passes or fails by the criterion printed beside it):

- policy: the device policy (device.py) is applied and reads back, CUBLAS_WORKSPACE_CONFIG
  set on CUDA before CUDA started;
- engines: the vectorized engine and the one-client reference loop agree in float64 (SG-FOCUS,
  the MNIST CNN with dropout, crop-flip);
- same bytes: the same `focusfl run` twice, in two processes, writes identical metrics.csv and
  model.pt (float32, the nn problem, deterministic kernels by default);
- resume: that run stopped by SIGTERM between two evaluations and resumed writes the
  uninterrupted run's bytes;
- cpu vs device: float64 runs on the CPU and on the device agree to rounding (nn and ridge);
- preset: `focusfl reproduce mnist-demo` end to end at a small size on the device;
- batched runs: focus-cifar10's final runs (5 algorithms x 2 processes x 3 seeds, 40 rounds) one
  at a time and as one batch of runs (benchmarks/batched_nn.py) give the same rows; the batch's
  throughput against one at a time is printed beside it (issue 41's GPU figure).
- ray sweep packed: runs of the MNIST CNN on a local Ray at `--gpus-per-task 0.25` (four runs
  share the GPU; on a CPU the GPU is declared to Ray only) give the tables of one run at a time in
  this process (benchmarks/ray_sweep.py); the throughput ratio is printed beside it. Left out,
  with a line that says so, where Ray is not installed.

Figures (not pass/fail): the appendix-G CIFAR round (benchmarks/paper_cifar.py's workload) in
seconds, with deterministic kernels and without, the grouped floor (every active client's
forward and backward passes as the grouped calls on ready inputs: what any engine of this
formulation must do), the engine's share of it, kernel launches and host-device
synchronisations per round (CUDA only), and 10,000 rounds extrapolated.

Prints a Markdown table for docs/performance.md; exits 1 if a check failed; the last line is
``gpu_check: N passed, M failed on DEVICE``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Callable

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from focusfl.algorithms import make_algorithm  # noqa: E402
from focusfl.data import Dataset, ImageData  # noqa: E402
from focusfl.engine import simulate  # noqa: E402
from focusfl.device import apply_policy, device_policy, torch_settings  # noqa: E402
from focusfl.engine.simulate import active_sets  # noqa: E402
from focusfl.engine.vectorized import vectorized_round  # noqa: E402
from focusfl.participation import make_participation  # noqa: E402
from focusfl.problems import make_problem  # noqa: E402
from focusfl.problems.nn import NeuralNetwork  # noqa: E402

MNIST = ROOT / "tests" / "fixtures" / "mnist1500.npz"  # 1,500 real digits committed with the tests
# float64 on one device: the engines differ only in how clients are batched (1e-6 is the suite's
# bound for the small CNN over 5 rounds); CPU against a GPU: other kernels, rounding-level.
ENGINES_TOLERANCE = 1e-6
CROSS_DEVICE_TOLERANCE = 1e-6
# Runs `focusfl ARGV[2:]` and sends itself SIGTERM at the end of round ARGV[1] (a preemption).
STOP_AFTER = """
import os, signal, sys
import focusfl.runs.driver as runner
from focusfl.cli import main
stop_at, real = int(sys.argv[1]), runner.simulate

def simulate(*args, on_round, **kwargs):
    def then_stop(result):
        on_round(result)
        if result.rounds_done == stop_at:
            os.kill(os.getpid(), signal.SIGTERM)
    return real(*args, on_round=then_stop, **kwargs)

runner.simulate = simulate
sys.exit(main(sys.argv[2:]))
"""
CLI = "import sys\nfrom focusfl.cli import main\nsys.exit(main(sys.argv[1:]))\n"


class Sizes:
    """How large each check runs: the GPU's, or --small's (a CPU test's)."""

    def __init__(self, small: bool) -> None:
        self.small = small
        self.nn_rounds = 6 if small else 30
        self.stop_at = 3 if small else 17  # between two evaluations (every 5 rounds, every 2 small)
        self.eval_every = 2 if small else 5
        self.cifar_train = 600 if small else 50_000
        self.cifar_test = 200 if small else 10_000
        self.cifar_rounds = 1 if small else 20
        self.cifar_clients = 4 if small else 32
        self.batch_rounds = 2 if small else 40  # focus-cifar10's final runs, one at a time and batched
        self.batch_seeds = 1 if small else 3


# -- checks ------------------------------------------------------------------------------------------
def apply_device_policy(device: str) -> bool:
    """The policy applied as a run applies it, first thing (before anything starts CUDA); whether
    CUDA had started before it was."""
    started = torch.cuda.is_initialized()
    apply_policy(device_policy(device))
    return started


def check_policy(device: str, sizes: Sizes, cuda_started_before: bool = False) -> tuple[bool, str]:
    policy = device_policy(device)
    apply_policy(policy)
    settings = torch_settings()
    workspace = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    ok = settings == policy.torch_settings() and not cuda_started_before and (
        policy.cublas_workspace is None or workspace is not None)
    on = ", ".join(name for name, value in settings.items() if value) or "none"
    return ok, f"switches on: {on}; CUBLAS_WORKSPACE_CONFIG={workspace}; CUDA started before: {cuda_started_before}"


def toy_images(shape=(3, 16, 16), count=320, seed=5) -> Dataset:
    """Random images with a class-specific bright row (what the engines' test trains on)."""
    rng = np.random.default_rng(seed)

    def split(n):
        labels = rng.integers(0, 10, n)
        images = rng.integers(0, 160, (n, *shape))
        images[np.arange(n), :, labels % shape[1], :] += 90
        return ImageData(images.astype(np.uint8), labels)

    return Dataset("toy", split(count), split(count // 5), 10)


def _nn_run(device: str, engine: str, rounds: int = 4) -> torch.Tensor:
    problem = NeuralNetwork(dataset=toy_images(), model="fedsum-mnist-cnn", clients=8, batch=16, augment="crop-flip",
                            dtype=torch.float64, device=device)
    participation = make_participation("bernoulli:p=0.5", problem.num_clients, seed=1)
    result = simulate(make_algorithm("sg_focus", lr=0.05, local_steps=2), problem, participation, rounds, seed=7,
                      engine=engine)
    return result.state.server.x.detach().cpu()


def check_engines(device: str, sizes: Sizes) -> tuple[bool, str]:
    gap = float((_nn_run(device, "vectorized") - _nn_run(device, "reference")).abs().max())
    return gap <= ENGINES_TOLERANCE, f"max abs(vectorized - reference) = {gap:.2e} (<= {ENGINES_TOLERANCE:g})"


def _cli(args: list[str], script: str = CLI, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", script, *extra, *args], env=env, capture_output=True, text=True,
                          timeout=300)


def _nn_command(device: str, sizes: Sizes, rounds: int, out: Path) -> list[str]:
    problem = f"nn:data={MNIST},test_fraction=0.2,clients=8,alpha=0.5,batch=16,augment=crop-flip"
    return ["run", "--algorithm", "sg_focus", "--lr", "0.01", "--local-steps", "3", "--participation", "bernoulli",
            "--problem", problem, "--device", device, "--rounds", str(rounds), "--eval-every",
            str(sizes.eval_every), "--out", str(out)]


def _same_files(a: Path, b: Path) -> bool:
    return all((a / name).read_bytes() == (b / name).read_bytes() for name in ("metrics.csv", "model.pt"))


def check_same_bytes(device: str, sizes: Sizes, work: Path) -> tuple[bool, str]:
    for name in ("first", "second"):
        proc = _cli(_nn_command(device, sizes, sizes.nn_rounds, work / name))
        if proc.returncode != 0:
            return False, f"{name} run failed: {proc.stderr.strip().splitlines()[-1:]}"
    recorded = json.loads((work / "first" / "config.json").read_text()).get("deterministic")
    same = _same_files(work / "first", work / "second")
    return same and recorded is True, f"metrics.csv and model.pt identical: {same}; config.json deterministic={recorded}"


def check_resume(device: str, sizes: Sizes, work: Path) -> tuple[bool, str]:
    out = work / "stopped"
    stopped = _cli(_nn_command(device, sizes, sizes.nn_rounds, out), STOP_AFTER, str(sizes.stop_at))
    if stopped.returncode != 143:
        return False, f"the stopped run exited {stopped.returncode}: {stopped.stderr.strip().splitlines()[-1:]}"
    resumed = _cli(["run", "--resume", str(out)])
    if resumed.returncode != 0:
        return False, f"resume failed: {resumed.stderr.strip().splitlines()[-1:]}"
    same = _same_files(out, work / "first")
    return same, f"stopped after round {sizes.stop_at}, resumed: the uninterrupted bytes: {same}"


def check_cross_device(device: str, sizes: Sizes) -> tuple[bool, str]:
    nn_gap = float((_nn_run("cpu", "vectorized") - _nn_run(device, "vectorized")).abs().max())
    ridge = {}
    for where in ("cpu", device):
        problem = make_problem("ridge:dim=20,clients=16", dtype=torch.float64, device=where)
        participation = make_participation("bernoulli:p=0.5", problem.num_clients, seed=1)
        rows = simulate(make_algorithm("focus", lr=0.01, local_steps=3), problem, participation, 30, seed=2).rows
        ridge[where] = np.array([row["loss"] for row in rows if "loss" in row] or [0.0])
    ridge_gap = float(np.max(np.abs(ridge["cpu"] - ridge[device]) / np.maximum(np.abs(ridge["cpu"]), 1e-300)))
    ok = nn_gap <= CROSS_DEVICE_TOLERANCE and ridge_gap <= CROSS_DEVICE_TOLERANCE
    return ok, f"float64: nn model max gap {nn_gap:.1e}, ridge loss rows max relative gap {ridge_gap:.1e} " \
               f"(<= {CROSS_DEVICE_TOLERANCE:g})"


def check_preset(device: str, sizes: Sizes, work: Path) -> tuple[bool, str]:
    proc = _cli(["reproduce", "mnist-demo", "--data", str(MNIST), "--rounds", "2", "--eval-every", "1", "--steps",
                 "fixed", "--seeds", "1", "--algorithms", "sg_focus", "--workers", "1", "--device", device,
                 "--out", str(work / "preset")])
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:]
    return proc.returncode == 0 and "final acc" in proc.stdout, f"reproduce mnist-demo: exit {proc.returncode} {tail}"


def check_batched_runs(device: str, sizes: Sizes) -> tuple[bool, str]:
    """focus-cifar10's final runs (benchmarks/batched_nn.py) one at a time and as one batch of
    runs: the same rows (the criterion), and the batch's throughput (issue 41's GPU figure)."""
    from batched_nn import measure

    speedup, same = measure(device, sizes.batch_rounds, sizes.batch_seeds, sizes.small)
    return same, (f"{10 * sizes.batch_seeds} runs (5 algorithms x 2 processes x {sizes.batch_seeds} seeds) x "
                  f"{sizes.batch_rounds} rounds: rows "
                  f"{'identical' if same else 'DIFFERENT'}; one batch {speedup:.2f}x the throughput of one at a time")


def check_ray_sweep(device: str, sizes: Sizes) -> tuple[bool, str]:
    """A sweep on a local Ray at --gpus-per-task 0.25 against one run at a time (benchmarks/ray_sweep.py)."""
    from ray_sweep import packing

    ratio, same, runs = packing(device, sizes.small)
    return same, (f"{runs} runs at --gpus-per-task 0.25: results.csv and summary.csv "
                  f"{'identical' if same else 'DIFFERENT'}; {ratio:.2f}x the throughput of one at a time")


# -- the CIFAR round ---------------------------------------------------------------------------------
def _seconds(fn: Callable[[], None], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def cifar_figures(device_name: str, sizes: Sizes) -> dict[str, str]:
    """Seconds per appendix-G round, deterministic and not; the grouped floor; launches and syncs."""
    from paper_cifar import ALPHA, BATCH, LR, TAU, GroupedFloor, synthetic_cifar

    device = torch.device(device_name)
    dataset = synthetic_cifar(sizes.cifar_train, sizes.cifar_test)
    problem = NeuralNetwork(dataset=dataset, model="focus-cnn", clients=sizes.cifar_clients, alpha=ALPHA,
                            batch=BATCH, augment="crop-flip", device=device)
    mask = make_participation("bernoulli", sizes.cifar_clients, seed=0).mask(2 + sizes.cifar_rounds)
    actives = active_sets(mask, device)
    algorithm = make_algorithm("sg_focus", lr=LR, local_steps=TAU)
    timed = range(2, 2 + sizes.cifar_rounds)

    def engine_seconds(deterministic: bool) -> float:
        apply_policy(device_policy(device, deterministic))
        state = algorithm.init(problem.initial_point(), problem.num_clients)

        def rounds(span):
            nonlocal state
            for r in span:
                state = vectorized_round(algorithm, state, problem, actives[r], r, 0, donate=r > 0)

        rounds(range(2))  # warm-up: kernels chosen, memory allocated
        return _seconds(lambda: rounds(timed), device) / len(timed)

    figures = {"nondeterministic s/round": engine_seconds(False), "deterministic s/round": engine_seconds(True)}
    floor = GroupedFloor(problem, actives)
    floor.run(range(2))
    figures["grouped floor s/round"] = _seconds(lambda: floor.run(timed), device) / len(timed)
    figures["engine / floor"] = figures["grouped floor s/round"] / figures["deterministic s/round"]
    figures["10,000 rounds (min)"] = 10_000 * figures["deterministic s/round"] / 60
    figures.update(_launches_and_syncs(algorithm, problem, actives, timed, device))
    return {name: (f"{value:.4f}" if isinstance(value, float) else str(value)) for name, value in figures.items()}


def _launches_and_syncs(algorithm, problem, actives, timed, device: torch.device) -> dict[str, object]:
    """CUDA kernel launches and synchronising calls per round (torch's profiler and sync debug mode)."""
    if device.type != "cuda":
        return {"kernel launches/round": "n/a (CUDA only)", "host syncs/round": "n/a (CUDA only)"}
    from torch.profiler import ProfilerActivity, profile

    state = algorithm.init(problem.initial_point(), problem.num_clients)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for r in timed:
            state = vectorized_round(algorithm, state, problem, actives[r], r, 0, donate=True)
    launches = sum(e.count for e in prof.key_averages() if "LaunchKernel" in e.key)
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for r in timed:
                state = vectorized_round(algorithm, state, problem, actives[r], r, 0, donate=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    syncs = sum(1 for w in caught if "synchroniz" in str(w.message).lower())
    return {"kernel launches/round": launches / len(timed), "host syncs/round": syncs / len(timed)}


# -- the command -------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--small", action="store_true", help="tiny sizes (a CPU test runs the checks this way)")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"gpu_check: torch {torch.__version__} sees no CUDA device; run with --device cpu --small")
        print(f"gpu_check: 0 passed, 1 failed on {args.device}")
        return 1
    cuda_started_before = apply_device_policy(args.device)
    torch.set_num_threads(1)
    sizes = Sizes(args.small)
    name = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else f"cpu ({os.cpu_count()} cores)"
    print(f"device: {name}; torch {torch.__version__}, numpy {np.__version__}, Python {sys.version.split()[0]}")
    results: list[tuple[str, bool, str, float]] = []
    with tempfile.TemporaryDirectory(prefix="gpu_check-") as folder:
        work = Path(folder)
        checks = {
            "policy": lambda: check_policy(args.device, sizes, cuda_started_before),
            "engines equal (float64)": lambda: check_engines(args.device, sizes),
            "same bytes twice": lambda: check_same_bytes(args.device, sizes, work),
            "resume exact": lambda: check_resume(args.device, sizes, work),
            "cpu vs device": lambda: check_cross_device(args.device, sizes),
            "preset end to end": lambda: check_preset(args.device, sizes, work),
            "batched runs = runs alone": lambda: check_batched_runs(args.device, sizes),
        }
        try:
            import ray  # noqa: F401

            checks["ray sweep packed = runs alone"] = lambda: check_ray_sweep(args.device, sizes)
        except ImportError:
            print("skip ray sweep packed: Ray is not installed (pip install ray)")
        for check, run in checks.items():
            start = time.perf_counter()
            try:
                ok, detail = run()
            except Exception as exc:  # a check that raises has failed; the others still run
                ok, detail = False, f"{type(exc).__name__}: {str(exc).strip().splitlines()[:1]}"
            results.append((check, ok, detail, time.perf_counter() - start))
            print(f"{'PASS' if ok else 'FAIL'} {check} ({results[-1][3]:.1f} s): {detail}", flush=True)
    figures = cifar_figures(args.device, sizes)
    print(f"\n| check | result | detail |\n|---|---|---|")
    for check, ok, detail, _ in results:
        print(f"| {check} | {'pass' if ok else 'FAIL'} | {detail} |")
    print(f"\n| appendix-G CIFAR round on {name} ({sizes.cifar_clients} clients) | value |\n|---|---|")
    for figure, value in figures.items():
        print(f"| {figure} | {value} |")
    passed = sum(ok for _, ok, _, _ in results)
    print(f"gpu_check: {passed} passed, {len(results) - passed} failed on {name}")
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())

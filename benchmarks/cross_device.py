"""Cross-device scale: FOCUS and SCAFFOLD with a million stateful clients on one machine.

Workload: ``ondemand_logistic`` (clients made from (seed, client) when they are active; d = 1000,
16 samples a client, float64), uniform participation of 1,000 clients a round, tau = 2, at
N = 10^4, 10^5 and 10^6, each run as ``focusfl run`` runs it (runs.folder.run_to_folder: the
run folder, config.json, metrics.csv, checkpoints, the state table) in a fresh process of its
own, so that its peak resident memory is its own. The clients' state table (FOCUS's last
gradients, SCAFFOLD's control variates) is N x d floats: 80 MB at 10^4, 800 MB at 10^5 (in
memory under the default state_memory of 2 GiB), 8 GB at 10^6 (memory-mapped in the run folder).

Per run: set-up seconds (from the command to the loop's first round: problem, participation,
algorithm, state table, folder), seconds per round (the median of the rounds between the first
and the last, which evaluate), peak RSS. Then N = 10^4 again with its table memory-mapped
(``state_memory=0``): its metrics.csv must equal the in-memory run's, byte for byte.

The touched set. A mapped table's rows are touched as the run goes (after R rounds of m of N
clients, a fraction 1 - (1 - m/N)^R of them: 63 % after 1,000 rounds of 1,000 of 10^6), so its
dirty pages grow with the run, and a short run cannot show what that costs. Each run therefore
also reports its mean round over the whole run (every round but the first and the last, which
evaluate) and over its last tenth, and the mean of each tenth of the run; ``--rounds 1000``
(``--long``) shows the effect at 10^6. The mapped file's allocated size (the rows ever written)
and the kernel's dirty and writeback memory at the end of the run say what bounds it.

The last line, for scripts: ``N=1000000 peak_rss_gb=X setup_s=Y round_ratio_vs_1e4=Z
run_ratio_vs_1e4=W`` (the largest of the algorithms' figures; round: medians, run: means over
the whole run, each against the smallest N's).

    python benchmarks/cross_device.py                      # about 5 minutes on 2 cores
    python benchmarks/cross_device.py --sizes 10000 100000 --rounds 10
    python benchmarks/cross_device.py --long               # FOCUS, 10^4 and 10^6, 1,000 rounds each
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def child(args: argparse.Namespace) -> None:
    """One run in this process; prints one JSON line."""
    started = time.perf_counter()
    import focusfl.runs.driver as driver
    from focusfl.runs.config import RunConfig
    from focusfl.runs.folder import run_to_folder

    stamps: list[float] = []
    real = driver.simulate

    def timed_simulate(*positional, on_round, **keywords):
        stamps.append(time.perf_counter())  # the loop starts: set-up is over

        def stamp(result):
            stamps.append(time.perf_counter())
            on_round(result)
        return real(*positional, on_round=stamp, **keywords)

    driver.simulate = timed_simulate
    config = RunConfig(algorithm=args.algorithm, lr=args.lr if args.lr == "auto" else float(args.lr), local_steps=2,
                       problem=f"ondemand_logistic:clients={args.n},dim={args.dim},samples={args.samples}",
                       participation=f"uniform:m={args.active}", rounds=args.rounds, eval_every=args.rounds,
                       state_memory=args.state_memory)
    run_to_folder(config, Path(args.out), curve=False)
    rounds = [b - a for a, b in zip(stamps[1:], stamps[2:])]  # round 2 .. the last but one
    from focusfl.runs.store import TABLE

    inner = rounds[:-1] if len(rounds) > 1 else rounds  # the last round evaluates
    tenth = max(1, len(inner) // 10)
    table = Path(args.out) / TABLE
    print(json.dumps({
        "setup_s": stamps[0] - started,
        "round_s": statistics.median(inner),
        "run_mean_s": statistics.fmean(inner),
        "last_tenth_s": statistics.fmean(inner[-tenth:]),
        "tenths_s": [statistics.fmean(inner[k:k + tenth]) for k in range(0, len(inner) - tenth + 1, tenth)][:10],
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "mapped": table.is_file(),
        # The rows ever written (a sparse file's allocated blocks) and the kernel's dirty pages.
        "table_written_gb": table.stat().st_blocks * 512 / 1e9 if table.is_file() else 0.0,
        **kernel_dirty_gb(),
    }))


def kernel_dirty_gb() -> dict:
    """Dirty and Writeback of /proc/meminfo, GB (empty where there is no such file)."""
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
    except OSError:
        return {}
    fields = {line.split(":")[0]: line.split()[1] for line in lines if ":" in line}
    return {f"{name.lower()}_gb": int(fields[name]) * 1024 / 1e9 for name in ("Dirty", "Writeback") if name in fields}


def run(n: int, algorithm: str, out: Path, args: argparse.Namespace, state_memory: str | None = None) -> dict:
    command = [sys.executable, __file__, "--child", "--n", str(n), "--algorithm", algorithm, "--out", str(out),
               "--rounds", str(args.rounds), "--active", str(args.active), "--dim", str(args.dim),
               "--samples", str(args.samples), "--lr", str(args.lr),
               "--state-memory", state_memory or args.state_memory]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the run of {algorithm} at N={n} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--algorithms", nargs="+", default=["focus", "scaffold"])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--active", type=int, default=1000, help="clients a round (uniform participation)")
    parser.add_argument("--dim", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--lr", default="auto", help="step size, or auto (from the problem's smoothness bound)")
    parser.add_argument("--state-memory", default="2GiB")
    parser.add_argument("--folder", help="where the run folders go (default: a temporary folder)")
    parser.add_argument("--long", action="store_true",
                        help="the touched-set run: FOCUS at 10^4 and 10^6, 1,000 rounds each (sizes, algorithms and "
                        "rounds given beside it win); no mapped-table identity check")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--algorithm", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    if args.long:
        given = sys.argv[1:]
        args.sizes = args.sizes if "--sizes" in given else [10_000, 1_000_000]
        args.algorithms = args.algorithms if "--algorithms" in given else ["focus"]
        args.rounds = args.rounds if "--rounds" in given else 1000
    with tempfile.TemporaryDirectory(dir=args.folder) as scratch:
        folder = Path(scratch)
        print(f"ondemand_logistic d={args.dim}, {args.samples} samples a client, float64; uniform participation of "
              f"{args.active}; tau=2; {args.rounds} rounds (evaluated at 0 and at the end); state_memory="
              f"{args.state_memory}")
        print(f"{'algorithm':<10} {'N':>9} {'table':>8} {'set-up s':>9} {'s/round':>8} {'run mean':>9} "
              f"{'last 10%':>9} {'peak RSS GB':>12} {'written GB':>11} {'dirty GB':>9}")
        results: dict[tuple[str, int], dict] = {}
        for n in args.sizes:
            for algorithm in args.algorithms:
                figures = results[algorithm, n] = run(n, algorithm, folder / f"{algorithm}-{n}", args)
                table = "mapped" if figures["mapped"] else "memory"
                print(f"{algorithm:<10} {n:>9,} {table:>8} {figures['setup_s']:>9.2f} {figures['round_s']:>8.3f} "
                      f"{figures['run_mean_s']:>9.3f} {figures['last_tenth_s']:>9.3f} {figures['peak_rss_gb']:>12.2f} "
                      f"{figures['table_written_gb']:>11.2f} {figures.get('dirty_gb', 0.0):>9.2f}", flush=True)
                print("    mean s/round per tenth of the run: "
                      + " ".join(f"{t:.3f}" for t in figures["tenths_s"]), flush=True)
        smallest = min(args.sizes)
        for algorithm in ([] if args.long else args.algorithms):
            mapped = folder / f"{algorithm}-{smallest}-mapped"
            run(smallest, algorithm, mapped, args, state_memory="0")
            same = (mapped / "metrics.csv").read_bytes() == (folder / f"{algorithm}-{smallest}" / "metrics.csv").read_bytes()
            print(f"{algorithm} at N={smallest:,}, table in memory and memory-mapped: metrics.csv identical: {same}")
        largest = max(args.sizes)
        ratio = max(results[a, largest]["round_s"] / results[a, smallest]["round_s"] for a in args.algorithms)
        rss = max(results[a, largest]["peak_rss_gb"] for a in args.algorithms)
        setup = max(results[a, largest]["setup_s"] for a in args.algorithms)
        whole = max(results[a, largest]["run_mean_s"] / results[a, smallest]["run_mean_s"] for a in args.algorithms)
        power = len(str(smallest)) - 1
        print(f"N={largest} peak_rss_gb={rss:.2f} setup_s={setup:.1f} round_ratio_vs_1e{power}={ratio:.2f} "
              f"run_ratio_vs_1e{power}={whole:.2f}")


if __name__ == "__main__":
    main()

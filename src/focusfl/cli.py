"""The ``focusfl`` command line.

Every command validates its input before it runs or writes anything; a domain error prints
one line (``focusfl: error: ...``) and exits with status 2, without a traceback.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import __version__
from .argtypes import positive_float, positive_int
from .errors import DivergenceError, FocusflError


# -- run ---------------------------------------------------------------------------------------
def _add_run(sub) -> None:
    p = sub.add_parser("run", help="run one algorithm on one problem under one participation process")
    p.add_argument("--algorithm", help="algorithm NAME or NAME:key=value,... (see `focusfl algorithms`)")
    p.add_argument("--problem", default="ridge",
                   help="problem SPEC, e.g. ridge:dim=50,clients=16 or nn:data=mnist,alpha=0.1 (default ridge; "
                   "neural networks: docs/neural-networks.md)")
    p.add_argument("--participation", default="full", help="participation SPEC, e.g. weighted:m=4 (default full)")
    p.add_argument("--rounds", type=positive_int, default=100)
    p.add_argument("--local-steps", type=positive_int, default=None, help="local steps tau per round")
    p.add_argument("--lr", type=positive_float, default=None, help="(local) step size eta")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=["float32", "float64"], default=None,
                   help="default: float32 for neural networks, float64 otherwise")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--engine", choices=["vectorized", "reference"], default="vectorized")
    p.add_argument("--eval-every", type=positive_int, default=1, help="evaluate every E rounds")
    p.add_argument("--schedule", choices=["constant", "sqrt"], default="constant",
                   help="step-size schedule: constant, or sqrt = eta/sqrt(r/10+1)")
    p.add_argument("--data-dir", help="folder with the dataset files of an nn problem "
                   "(default $FOCUSFL_DATA or ~/.cache/focusfl)")
    p.add_argument("--download", action="store_true",
                   help="fetch a missing dataset of an nn problem from its canonical source (checksum-verified)")
    p.add_argument("--config", help="rerun from a config.json written by an earlier run")
    p.add_argument("--out", help="output folder (default runs/ALGORITHM)")
    p.set_defaults(handler=_cmd_run)


def _cmd_run(args) -> int:
    from .errors import ConfigError
    from .experiments.runner import RunConfig, config_from_json, run_to_folder

    if args.config:
        try:
            data = json.loads(Path(args.config).read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read config {args.config!r}: {exc}") from None
        config = config_from_json(data)
    else:
        if not args.algorithm:
            raise ConfigError("run needs --algorithm NAME (or --config FILE)")
        from .problems import default_dtype
        from .problems.nn import with_data_options

        problem = with_data_options(args.problem, args.data_dir, args.download)
        config = RunConfig(
            algorithm=args.algorithm, problem=problem, participation=args.participation,
            rounds=args.rounds, local_steps=args.local_steps, lr=args.lr, seed=args.seed,
            dtype=args.dtype or default_dtype(problem), device=args.device, engine=args.engine,
            eval_every=args.eval_every, schedule=args.schedule,
        )
    out = args.out or f"runs/{str(config.algorithm).split(':')[0] if isinstance(config.algorithm, str) else config.algorithm['name']}"
    result = run_to_folder(config, out, progress=True)
    last = result.rows[-1]
    shown = ", ".join(f"{k}={v:.6g}" for k, v in last.items() if k not in ("round", "active"))
    print(f"round {last['round']}: {shown}")
    print(f"wrote {out}/metrics.csv, config.json, curve.png")
    if result.diverged_at is not None:
        raise DivergenceError(
            f"diverged (non-finite model) at round {result.diverged_at}; what was computed is in {out}"
        )
    return 0


# -- reproduce -----------------------------------------------------------------------------------
def _add_reproduce(sub) -> None:
    from .experiments.reproduce import load_presets

    p = sub.add_parser("reproduce", help="reproduce a figure of the papers")
    presets = p.add_subparsers(dest="preset", metavar="PRESET", required=True)
    for preset in load_presets().values():
        pp = presets.add_parser(preset.name, help=preset.help, description=preset.help)
        preset.add_arguments(pp)
        pp.set_defaults(handler=preset.run)


# -- participation -------------------------------------------------------------------------------
def _add_participation(sub) -> None:
    p = sub.add_parser("participation", help="statistics (p_i, q_i, delays) of a participation process")
    p.add_argument("spec", help="participation SPEC, e.g. bernoulli or markov:rho=0.8")
    p.add_argument("--clients", type=positive_int, default=16)
    p.add_argument("--rounds", type=positive_int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", help="write an availability raster to this PNG/PDF file")
    p.set_defaults(handler=_cmd_participation)


def _cmd_participation(args) -> int:
    from .participation import make_participation
    from .participation.statistics import summarize

    process = make_participation(args.spec, args.clients, seed=args.seed)
    if args.plot and Path(args.plot).suffix.lower() not in (".png", ".pdf"):
        from .errors import ConfigError

        raise ConfigError(f"--plot must end in .png or .pdf, got {args.plot!r}")
    mask = process.mask(args.rounds)
    stats = summarize(mask)
    nominal = process.nominal_p()
    print(f"{process.describe()['name']}: {args.clients} clients, {args.rounds} rounds, seed {args.seed}")
    print(f"mean active per round {stats.mean_active:.3f}, empty rounds {stats.empty_rounds}")
    print(f"tau_max {stats.tau_max}, tau_avg {stats.tau_avg:.3f}")
    header = f"{'client':>6} {'p (empirical)':>14} {'p (nominal)':>12} {'q (empirical)':>14}"
    print(header)
    for i in range(args.clients):
        nom = "" if nominal is None else f"{nominal[i]:.4f}"
        print(f"{i:>6} {stats.p[i]:>14.4f} {nom:>12} {stats.q[i]:>14.4f}")
    if args.plot:
        from .participation.plots import plot_raster

        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        plot_raster(mask, args.plot, title=args.spec)
        print(f"wrote {args.plot}")
    return 0


# -- algorithms ----------------------------------------------------------------------------------
def _add_algorithms(sub) -> None:
    p = sub.add_parser("algorithms", help="list the registered algorithms")
    p.set_defaults(handler=_cmd_algorithms)


def _cmd_algorithms(args) -> int:
    from .algorithms import ALGORITHMS

    width = max(len("name"), *(len(name) for name in ALGORITHMS))  # names never push the columns
    print(f"{'name':<{width}} {'down':>5} {'up':>5} {'server mem':>11} {'client mem':>11}  what it is")
    for name, cls in ALGORITHMS.items():
        comm = cls().communication()
        server = f"{comm.server_memory:g}"
        if comm.server_memory_per_client:  # N-row tables (MIFA, FedVARP)
            server += f"+{comm.server_memory_per_client:g}N".replace("+1N", "+N")
        print(
            f"{name:<{width}} {comm.down:>5g} {comm.up:>5g} {server:>11} {comm.client_memory:>11g}  {cls.summary}"
        )
    print("\ndown/up: vectors of d floats per participating client per round; memory in vectors (server: N d")
    print("tables count as N vectors); client memory is kept by every client between rounds.")
    return 0


# -- tune ----------------------------------------------------------------------------------------
def _add_tune(sub) -> None:
    from .experiments.tune import add_arguments, run

    p = sub.add_parser("tune", help="grid-search the step size of one or more algorithms")
    add_arguments(p)
    p.set_defaults(handler=run)


# -- bias and matrices (focusfl.matrix) ----------------------------------------------------------
def _add_bias(sub) -> None:
    from .matrix.commands import add_bias_arguments, run_bias

    p = sub.add_parser("bias", help="participation bias: q_i, delta_q^2, FedAvg's and FOCUS's limit points")
    add_bias_arguments(p)
    p.set_defaults(handler=run_bias)


def _add_matrices(sub) -> None:
    from .matrix.commands import add_matrices_arguments, run_matrices

    p = sub.add_parser("matrices", help="draw the paper's Figures 1-3: stochastic matrices and round patterns")
    add_matrices_arguments(p)
    p.set_defaults(handler=run_matrices)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="focusfl", description="Federated optimization under arbitrary client participation."
    )
    parser.add_argument("--version", action="version", version=f"focusfl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_run(sub)
    _add_reproduce(sub)
    _add_participation(sub)
    _add_algorithms(sub)
    _add_tune(sub)
    _add_bias(sub)
    _add_matrices(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except DivergenceError as exc:
        print(f"focusfl: {exc}", file=sys.stderr)
        return 1
    except FocusflError as exc:
        print(f"focusfl: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        print(f"focusfl: {str(exc) or 'interrupted'}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

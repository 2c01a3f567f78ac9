"""The ``focusfl`` command line.

Every command validates its input before it runs or writes anything; a domain error prints
one line (``focusfl: error: ...``) and exits with status 2, without a traceback.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import Any, Callable

from . import __version__
from .argtypes import BATCH_RUNS_HELP, batch_runs_value, non_negative_int, positive_float, positive_int
from .errors import DivergenceError, FocusflError, NumericsError
from .io.atomic import disk_full, full_disk, no_space


# -- run ---------------------------------------------------------------------------------------
RUN_EXAMPLES = """examples:
  focusfl run --algorithm focus --participation bernoulli --rounds 800 --out runs/focus
  focusfl run --algorithm fedavg --problem ridge:hetero=1 --participation markov:rho=0.8 --lr 2e-4
  focusfl run --algorithm sg_focus --lr 0.01 --eval-every 25 --problem nn:data=mnist.npz,clients=32
  focusfl run --resume runs/focus               # continue a stopped or killed run
  focusfl run --resume runs/focus --rounds 2000 # run a finished one further
  focusfl run --config runs/focus/config.json --seed 1 --out runs/focus-seed1
  focusfl run --algorithm focus --out runs/focus --tensorboard runs/tb   # then: tensorboard --logdir runs/tb

A run writes metrics.csv (as rounds are evaluated), config.json, curve.png, checkpoint.pt and
model.pt into --out. SIGINT/SIGTERM/SIGHUP stop it at the end of the round with a checkpoint
(exit 130/143/129); kill -9 leaves the last checkpoint: both continue with --resume. A diverged
run exits 1. docs/runs.md: outputs, checkpoints and resuming."""


def _run_fields() -> tuple[str, ...]:
    """Options of `run` that a --config file also sets (every field of the run configuration):
    given on the command line they override it."""
    from .runs.cli import options

    return tuple(options())


def _add_run(sub) -> None:
    from .algorithms import ALGORITHMS
    from .participation import available_participation
    from .problems import available_problems

    p = sub.add_parser(
        "run", help="run one algorithm on one problem under one participation process",
        description="Run one algorithm on one problem under one participation process, with "
        f"checkpoints. Algorithms: {', '.join(ALGORITHMS)}. Problems: {', '.join(available_problems())}. "
        f"Participation processes: {', '.join(available_participation())}.",
        epilog=RUN_EXAMPLES,
    )
    from .runs.cli import add_algorithm_import_option, add_run_options

    # Defaults are None here and filled in later (runs.config.defaults_for), so that a flag given
    # next to --config or --resume can be told apart from one left at its default.
    add_run_options(p, _run_fields(), deferred=True, helps={
        "rounds": "rounds to run in all; with --resume, a larger number runs a finished run further"})
    p.add_argument("--data-dir", help="folder with the dataset files of an nn problem "
                   "(default $FOCUSFL_DATA or ~/.cache/focusfl)")
    p.add_argument("--download", action="store_true",
                   help="fetch a missing dataset of an nn problem from its canonical source (checksum-verified)")
    p.add_argument("--config", help="rerun from a config.json written by an earlier run; flags given beside it "
                   "override its values")
    p.add_argument("--out", help="output folder (default runs/ALGORITHM); an existing one is replaced only if "
                   "focusfl wrote it")
    p.add_argument("--allow-model-import", action="store_true",
                   help="let --problem nn:model=package.module:factory import and run that code (never from --config); "
                   "with --resume, the model the run's config.json names")
    add_algorithm_import_option(p, recorded=True)
    p.add_argument("--checkpoint-every", type=non_negative_int, metavar="R",
                   help="save a checkpoint every R rounds (default: once a minute; 0: only when stopped and at the end)")
    p.add_argument("--resume", metavar="DIR", help="continue the stopped or killed run in DIR")
    p.add_argument("--restart", action="store_true", help="discard an interrupted run in --out and start over")
    p.add_argument("--accept-changed-inputs", action="store_true",
                   help="with --resume or --config: go on although a file the run read (its dataset, tokenizer, "
                   "model folder, a trace) has changed since it was recorded; config.json records the change "
                   "(docs/runs.md)")
    p.add_argument("--tensorboard", metavar="DIR",
                   help="also log every evaluated round to TensorBoard, in DIR/NAME (NAME: the --out folder's "
                   "name, NAME-2... if taken), and the config as hparams when the run ends; --resume keeps "
                   "logging there (pip install tensorboard; docs/runs.md)")
    p.set_defaults(handler=_cmd_run)


def _given(args) -> list[str]:
    from .runs.cli import given_options

    return list(given_options(args, _run_fields()))


def _cmd_run(args) -> int:
    from .errors import ConfigError
    from .runs.folder import BUDGET_EXHAUSTED, resume_folder, run_to_folder
    from .runs.config import RunConfig, config_from_json

    if args.resume:
        refused = [f"--{k.replace('_', '-')}" for k in _given(args) if k != "rounds"]
        refused += [flag for flag, on in (("--config", args.config), ("--out", args.out), ("--restart", args.restart),
                                          ("--data-dir", args.data_dir), ("--download", args.download)) if on]
        if refused:
            raise ConfigError(f"--resume continues a run as it was configured; {refused[0]} cannot change it "
                              "(only --rounds and --checkpoint-every can)")
        out = args.resume
        # --allow-model-import: this command line's permission to import the model the run's
        # config.json names (the run of a user's own model can then be resumed).
        result = resume_folder(out, rounds=args.rounds, progress=True, checkpoint_every=args.checkpoint_every,
                               tensorboard=args.tensorboard, allow_model_import=args.allow_model_import,
                               accept_changed_inputs=args.accept_changed_inputs)
    else:
        config = _run_config(args, RunConfig, config_from_json)
        out = args.out or f"runs/{_algorithm_name(config.algorithm)}"
        # Importing a user's model runs their code: only on this command line's say-so.
        allow_import = args.allow_model_import and not args.config
        result = run_to_folder(config, out, progress=True, checkpoint_every=args.checkpoint_every,
                               restart=args.restart, allow_model_import=allow_import, tensorboard=args.tensorboard,
                               expected_inputs=_replayed_inputs(args),
                               accept_changed_inputs=args.accept_changed_inputs)
    last = result.last_row
    if last is None:  # a resumed run whose rounds were all done: its last files were written
        print(f"round {result.rounds_done}: every round was done already (the rows are in metrics.csv)")
    else:
        shown = ", ".join(f"{k}={v:.6g}" for k, v in last.items() if k not in ("round", "active"))
        print(f"round {last['round']}: {shown}")
        _explain_negative_loss(last, Path(out))
    print(f"wrote {out}/metrics.csv, config.json, curve.png")
    _print_log_dir(Path(out))
    if last is not None and "epsilon_client" in last:
        if _secret_schedule(Path(out)):  # the schedule is the secret: name no client
            print(f"privacy: the largest epsilon {last['epsilon_max']:.4g} (median {last['epsilon_median']:.4g})")
        else:
            print(f"privacy: client {last['epsilon_client']} has spent the most, epsilon {last['epsilon_max']:.4g} "
                  f"(median {last['epsilon_median']:.4g})")
    if result.stopped is not None:
        print(f"stopped: {result.stopped} (status {BUDGET_EXHAUSTED} in config.json)")
    if result.diverged_at is not None:
        from .engine.divergence import BlowUpDetector

        detector = result.blow_up or BlowUpDetector()
        raise DivergenceError(
            f"diverged at round {result.diverged_at} ({detector.reason(last)}); what was computed is in {out}"
        )
    return 0


def _explain_negative_loss(last: dict, out: Path) -> None:
    """A note under a negative loss, from the run's problem (an objective with a linear term)."""
    from .problems import PROBLEMS
    from .runs.folder import CONFIG, read_config

    if not (isinstance(last.get("loss"), float) and last["loss"] < 0) or not (out / CONFIG).is_file():
        return
    problem = read_config(out / CONFIG).get("problem")
    note = getattr(PROBLEMS.get(problem.get("name") if isinstance(problem, dict) else problem), "negative_loss", "")
    if note:
        print(f"({note})")


def _replayed_inputs(args):
    """The inputs a ``--config`` replay expects (runs/inputs.py), the parts given anew left out."""
    from .errors import ConfigError

    if not args.config:
        if args.accept_changed_inputs:
            raise ConfigError("--accept-changed-inputs goes with --resume DIR or --config FILE: "
                              "a new run has no recorded inputs")
        return None
    from .runs.folder import expected_inputs_of, read_config

    given = set(_given(args))
    return expected_inputs_of(read_config(Path(args.config)), f"config {args.config!r}",
                              skip=tuple(part for part in ("algorithm", "problem", "participation", "work")
                                         if part in given))


def _secret_schedule(folder: Path) -> bool:
    """Whether the run in ``folder`` (its config.json, written by this command) declared its
    participation schedule secret (--dp secret_schedule=true)."""
    from .privacy import parse_dp
    from .runs.folder import read_config

    dp = parse_dp(read_config(folder).get("dp"))
    return dp is not None and dp.secret_schedule


def _print_log_dir(out: Path) -> None:
    """Where the run logs to TensorBoard, if it does (config.json says)."""
    from .runs.folder import TENSORBOARD, read_config

    try:
        log_dir = read_config(out).get(TENSORBOARD)
    except FocusflError:
        return
    if isinstance(log_dir, str):
        print(f"logged to TensorBoard in {log_dir} (tensorboard --logdir {Path(log_dir).parent})")


def _algorithm_name(spec) -> str:
    from .spec import parse_spec

    return parse_spec(spec)[0]


def _run_config(args, RunConfig, config_from_json):
    """The RunConfig of `run`: from --config with the flags given beside it, or from the flags."""
    from .errors import ConfigError
    from .problems.nn import with_data_options
    from .runs.cli import run_config_of

    if args.config:
        from .problems.models import refuse_model_import
        from .runs.folder import read_config

        config = config_from_json(read_config(Path(args.config)), where=f"config {args.config!r}")
        refuse_model_import(config.problem, f"config {args.config!r}")
        overrides = {k: getattr(args, k) for k in _given(args)}
        if "lr" in overrides or "local_steps" in overrides:
            # The file's algorithm carries its resolved lr and local_steps: the flags replace them.
            from .spec import parse_spec

            name, params = parse_spec(config.algorithm if "algorithm" not in overrides else overrides["algorithm"])
            for key in ("lr", "local_steps"):
                if key in overrides:
                    params.pop(key, None)
            overrides.setdefault("algorithm", {"name": name, **params})
        config = config.replace(**overrides)
        if args.data_dir or args.download:
            config = config.replace(problem=with_data_options(config.problem, args.data_dir, args.download))
        return config
    if not args.algorithm:
        raise ConfigError("run needs --algorithm NAME (or --config FILE, or --resume DIR)")
    problem = with_data_options(args.problem or "ridge", args.data_dir, args.download)
    return run_config_of(args, _run_fields(), problem=problem)


# -- reproduce -----------------------------------------------------------------------------------
def _add_reproduce(sub) -> None:
    from .reproduce.cli import add_preset_arguments, preset_command, presets

    p = sub.add_parser("reproduce", help="reproduce a figure of the papers")
    chosen = p.add_subparsers(dest="preset", metavar="PRESET", required=True)
    for preset in presets().values():
        pp = chosen.add_parser(preset.name, help=preset.help, description=preset.help)
        add_preset_arguments(pp, preset)
        pp.set_defaults(handler=preset_command(preset))


# -- participation -------------------------------------------------------------------------------
def _add_participation(sub) -> None:
    p = sub.add_parser("participation", help="statistics (p_i, q_i, delays) of a participation process; "
                       "`participation import` converts recorded availability traces")
    own = _Parser(prog=p.prog, add_help=False)  # the options after SPEC (see _SpecOrSubcommand)
    for parser in (p, own):
        parser.add_argument("--clients", type=positive_int, default=16)
        parser.add_argument("--rounds", type=positive_int, default=1000)
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--plot", help="write an availability raster to this PNG, PDF or SVG file")
    commands = p.add_subparsers(dest="spec", metavar="SPEC", required=True, action=_SpecOrSubcommand,
                                help="participation SPEC, e.g. bernoulli or markov:rho=0.8; or `import` (below)")
    commands.own = own
    _add_participation_import(commands)
    p.set_defaults(handler=_cmd_participation)


class _SpecOrSubcommand(argparse._SubParsersAction):
    """The first word of `focusfl participation`: a subcommand's name (`import`), or else the
    process SPEC, whose options after it are the command's own."""

    def __call__(self, parser, namespace, values, option_string=None):
        if values[0] in self._name_parser_map:
            return super().__call__(parser, namespace, values, option_string)
        if {"-h", "--help"} & set(values[1:]):
            parser.print_help()
            parser.exit()
        setattr(namespace, self.dest, values[0])
        self.own.parse_args(values[1:], namespace)


def _add_participation_import(commands) -> None:
    from .recordings.importing import ABSENT, ASSIGNMENTS, CONDITIONS, FORMATS, IDLE, INDEX_CHOICES, RULES, SEMANTICS

    p = commands.add_parser("import", help="convert a FedScale, FLASH or clients x rounds availability file into "
                            "a participation trace, with its statistics")
    p.add_argument("format", choices=list(FORMATS), help="fedscale (behaviour pickle), flash (state JSON), ready "
                   "(FLASH's ready windows JSON) or matrix (clients x rounds 0/1 or True/False, .csv or .npy)")
    p.add_argument("path", help="the recording")
    p.add_argument("--round-seconds", type=float, metavar="S", help="seconds a round lasts (fedscale, flash, ready)")
    p.add_argument("--out", help="write the trace to this .csv (replaced only if focusfl wrote it); "
                   "without it only the statistics are printed")
    p.add_argument("--rounds", type=positive_int, help="rounds to import (default: the recording's span)")
    p.add_argument("--clients", type=positive_int, help="import the first N devices only (in the order of their ids); "
                   "a recording with fewer is imported whole, and the command says so")
    p.add_argument("--rule", choices=RULES, default="start", help="a client takes part in a round if available at "
                   "its start, or throughout it (whole)")
    p.add_argument("--ready", default=",".join(CONDITIONS), help="flash: the conditions of readiness, a comma list "
                   f"of {', '.join(CONDITIONS)}")
    p.add_argument("--idle", choices=IDLE, default="locked", help="flash: idle means screen locked or screen off")
    p.add_argument("--start", metavar="TIME", help="flash: the clock's time 0, YYYY-mm-dd HH:MM:SS (default FLASH's "
                   "refer_time 2020-01-02 00:00:00) or 'earliest' (the file's first event); ready: seconds (default 0)")
    p.add_argument("--window", type=float, default=0.0, metavar="W", help="flash, ready: readiness is checked W "
                   "seconds into the round (FLASH's selection window; its default configuration uses 20)")
    p.add_argument("--skip-bad-devices", action="store_true", help="fedscale, flash, ready: skip (and name) devices "
                   "whose records are malformed instead of refusing the file")
    p.add_argument("--assign", choices=ASSIGNMENTS, default="sorted", help="client k replays the k-th id in order "
                   "(sorted); fedscale: FedScale's keys[(k + 1) %% len] in the pickle's order (fedscale); flash: a "
                   "recording drawn at random with replacement for each client, as FLASH does, from --seed (flash)")
    p.add_argument("--seed", type=int, default=0, help="with --assign flash: the seed of the draw (default 0)")
    p.add_argument("--semantics", choices=SEMANTICS, default="replay", help="fedscale: replay every spell of every "
                   "cycle of a client's trace (replay, the recording as recorded), or walk its spells as FedScale's "
                   "ClientMetadata.is_active does, once a round at its start (fedscale, to compare with FedScale's "
                   "own runs)")
    p.add_argument("--index-column", choices=INDEX_CHOICES, default="auto", help="matrix (.csv): whether the first "
                   "column names the clients (auto: a non-numeric first column, or a header that names it)")
    p.add_argument("--absent", choices=ABSENT, help="devices never available in the imported rounds: keep them as "
                   "empty columns (every device keeps its index; replay with absent=true) or drop them (default: keep "
                   "for matrix, drop for fedscale, flash and ready)")
    p.add_argument("--capacity", metavar="FILE", help="fedscale: FedScale's device capacity pickle "
                   "(client_device_capacity); each device's local steps per round then come from its speeds")
    p.add_argument("--deadline", type=float, metavar="D", help="with --capacity: a round's deadline in seconds")
    p.add_argument("--batch-size", type=positive_int, metavar="B", help="with --capacity: samples per local step")
    p.add_argument("--model-kbits", type=float, default=0.0, metavar="M", help="with --capacity: the model update's "
                   "size in kbit, sent up and down (default 0)")
    p.add_argument("--local-steps", type=positive_int, metavar="TAU", help="with --capacity: the most steps a device "
                   "does (the algorithm's local_steps)")
    p.add_argument("--plot", help="write the imported trace's availability raster to this PNG, PDF or SVG file")
    p.add_argument("--work-out", help="with --capacity: write the work trace (round,client,steps) to this new .csv; "
                   "`--work trace:path=FILE` replays it for the imported rounds (it does not wrap around)")
    p.set_defaults(handler=_cmd_participation_import)


def _capacity_options(args):
    """The capacity file's options, or None; one line for an option given without --capacity."""
    from .errors import ConfigError
    from .recordings.importing import CapacityOptions

    priced = {"--deadline": args.deadline, "--batch-size": args.batch_size, "--local-steps": args.local_steps,
              "--work-out": args.work_out}
    if args.capacity is None:
        given = [name for name, value in priced.items() if value is not None] + (["--model-kbits"] if args.model_kbits
                                                                                 else [])
        if given:
            raise ConfigError(f"{given[0]} applies with --capacity FILE (FedScale's device capacity)")
        return None
    missing = [name for name, value in priced.items() if value is None and name != "--work-out"]
    if missing:
        raise ConfigError(f"--capacity needs {', '.join(missing)} (the round it prices)")
    from .recordings.capacity import check_round_prices

    check_round_prices(args.deadline, args.batch_size, args.model_kbits, args.local_steps)
    return CapacityOptions(Path(args.capacity).expanduser(), args.deadline, args.batch_size, args.model_kbits,
                           args.local_steps)


def _cmd_participation_import(args) -> int:
    from .errors import ConfigError
    from .io.atomic import write_text
    from .recordings.importing import (ImportOptions, check_trace_size, import_trace, replay_spec, statistics_lines,
                                       trace_text, work_trace_text)
    from .participation.trace import is_focusfl_trace

    out = Path(args.out) if args.out else None
    if out is not None:  # before the work: never over a user's file
        if out.suffix.lower() != ".csv":
            raise ConfigError(f"--out must end in .csv, got {args.out!r}")
        if out.is_dir() or ((out.exists() or out.is_symlink()) and not is_focusfl_trace(out)):
            raise ConfigError(f"--out {args.out!r} exists and is not a trace focusfl wrote; choose another name")
    work_out = Path(args.work_out) if args.work_out else None
    if work_out is not None:  # a work trace carries no mark of its own: focusfl writes only a new file
        if work_out.suffix.lower() != ".csv":
            raise ConfigError(f"--work-out must end in .csv, got {args.work_out!r}")
        if work_out.exists() or work_out.is_symlink():
            raise ConfigError(f"--work-out {args.work_out!r} exists; focusfl writes a work trace only as a new file")
        if out is not None and work_out.resolve() == out.resolve():
            raise ConfigError("--work-out and --out name the same file")
    if args.plot:
        _check_raster_target(args.plot)
    capacity = _capacity_options(args)
    options = ImportOptions(round_seconds=args.round_seconds, rounds=args.rounds, clients=args.clients,
                            rule=args.rule, ready=tuple(c.strip() for c in args.ready.split(",")), idle=args.idle,
                            start=args.start, window=args.window, skip_bad_devices=args.skip_bad_devices,
                            assign=args.assign, index_column=args.index_column, absent=args.absent,
                            semantics=args.semantics, seed=args.seed)
    trace = import_trace(args.format, args.path, options, capacity)
    lines = statistics_lines(trace)
    texts = []
    if out is not None:
        check_trace_size(trace)
        texts.append((out, trace_text(trace), f"--participation {replay_spec(trace, out)}"))
    if work_out is not None:
        texts.append((work_out, work_trace_text(trace), f"--work trace:path={work_out}"))
    # Every file is written before a line is printed: a reader that has gone (`| head -1`) ends
    # the printing, never an output.
    for path, text, replay in texts:  # every check passed before anything is written
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text(path, text)
        lines.append(f"wrote {path} (replay it with {replay})")
    if args.plot:
        _write_raster(trace.mask, args.plot, f"{args.format} {Path(args.path).name}")
        lines.append(f"wrote {args.plot}")
    print("\n".join(lines))
    return 0


def _cmd_participation(args) -> int:
    from .errors import ConfigError
    from .participation import make_participation
    from .participation.statistics import summarize

    process = make_participation(args.spec, args.clients, seed=args.seed)
    if args.plot:
        _check_raster_target(args.plot)  # before the work: never over a user's file
    from .limits import check_allocation

    # The mask (1 byte an entry) and the statistics' per-round tables (int64 delays and more).
    check_allocation(args.rounds * args.clients * 17,
                     f"participation statistics of {args.rounds:,} rounds x {args.clients:,} clients",
                     error=ConfigError)
    mask = process.mask(args.rounds)
    stats = summarize(mask)
    nominal = process.nominal_p()
    lines = [f"{process.describe()['name']}: {args.clients} clients, {args.rounds} rounds, seed {args.seed}",
             f"mean active per round {stats.mean_active:.3f}, empty rounds {stats.empty_rounds}",
             f"tau_max {stats.tau_max}, tau_avg {stats.tau_avg:.3f}",
             f"{'client':>6} {'p (empirical)':>14} {'p (nominal)':>12} {'q (empirical)':>14}"]
    for i in range(args.clients):
        nom = "" if nominal is None else f"{nominal[i]:.4f}"
        lines.append(f"{i:>6} {stats.p[i]:>14.4f} {nom:>12} {stats.q[i]:>14.4f}")
    # The figure is in place before a line is printed (as `participation import` does): a reader
    # that has gone (`| head -1`) ends the printing, never the figure, and "wrote" is never early.
    if args.plot:
        _write_raster(mask, args.plot, args.spec)
        lines.append(f"wrote {args.plot}")
    print("\n".join(lines))
    return 0


def _check_raster_target(plot: str) -> None:
    """Before the work: a .png/.pdf/.svg that is not a user's file, where a file can be written
    (io.figures)."""
    from .errors import ConfigError
    from .io.figures import check_figure_targets

    if Path(plot).suffix.lower() not in (".png", ".pdf", ".svg"):
        raise ConfigError(f"--plot must end in .png, .pdf or .svg, got {plot!r}")
    check_figure_targets([plot], "--plot")


def _write_figure(plot: str, draw) -> None:
    """``draw(path)`` into the figure ``plot``, put in place atomically (io.figures); a write the
    filesystem refuses is one line naming ``plot`` (not the scratch file beside it)."""
    from .errors import ConfigError
    from .io.atomic import full_disk
    from .io.figures import figure_files

    try:
        Path(plot).parent.mkdir(parents=True, exist_ok=True)
        with figure_files([plot], "--plot") as (scratch,):
            draw(scratch)
    except OSError as exc:
        if full_disk(exc):
            raise  # main's one line for a full disk
        raise ConfigError(f"--plot {plot!r} cannot be written: {exc.strerror or exc}") from None


def _write_raster(mask, plot: str, title: str) -> None:
    from .participation.plots import plot_raster

    _write_figure(plot, lambda path: plot_raster(mask, path, title=title))


# -- work ----------------------------------------------------------------------------------------
def _add_work(sub) -> None:
    p = sub.add_parser("work", help="statistics (mean, min, max steps, short rounds) of a work process")
    p.add_argument("spec", help="work SPEC, e.g. uniform, markov:p=0.3,slow=0.25 or 'rates:r=0.25;1;1;1'")
    p.add_argument("--clients", type=positive_int, default=16)
    p.add_argument("--local-steps", type=positive_int, default=5, help="local steps tau asked of every client")
    p.add_argument("--rounds", type=positive_int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", help="write a step-count raster to this PNG, PDF or SVG file")
    p.set_defaults(handler=_cmd_work)


def _cmd_work(args) -> int:
    from .errors import ConfigError
    from .limits import check_allocation
    from .work import make_work
    from .work.statistics import summarize_work

    process = make_work(args.spec, args.clients, args.local_steps, seed=args.seed)
    if args.plot:
        _check_raster_target(args.plot)  # before the work: never over a user's file
    # The int64 table and its float64 copy.
    check_allocation(args.rounds * args.clients * 16,
                     f"work statistics of {args.rounds:,} rounds x {args.clients:,} clients", error=ConfigError)
    table = process.table(args.rounds)
    stats = summarize_work(table, args.local_steps)
    lines = [f"{process.describe()['name']}: {args.clients} clients, tau {args.local_steps}, {args.rounds} rounds, "
             f"seed {args.seed}",
             f"mean steps {stats.mean_steps:.3f} of {args.local_steps}, short rounds {stats.mean_short:.3f}"]
    if min(stats.counted) < args.rounds:  # a trace: only the client-rounds it records count
        lines.append(f"counted: the {sum(stats.counted):,} client-rounds the trace records in rounds "
                     f"0..{args.rounds - 1} (of {args.rounds * args.clients:,}); '-': a client it never names there")
    lines.append(f"{'client':>6} {'mean steps':>11} {'min':>4} {'max':>4} {'short':>7}")
    for i in range(args.clients):
        if not stats.counted[i]:
            lines.append(f"{i:>6} {'-':>11} {'-':>4} {'-':>4} {'-':>7}")
            continue
        lines.append(f"{i:>6} {stats.mean[i]:>11.3f} {stats.min[i]:>4} {stats.max[i]:>4} {stats.short[i]:>7.3f}")
    lines.append(f"{'mean':>6} {stats.mean_steps:>11.3f} {stats.mean_min:>4.1f} {stats.mean_max:>4.1f} "
                 f"{stats.mean_short:>7.3f}")
    if args.plot:  # in place before a line is printed (see _cmd_participation)
        from .work.plots import plot_work

        _write_figure(args.plot, lambda path: plot_work(table, args.local_steps, path, title=args.spec))
        lines.append(f"wrote {args.plot}")
    print("\n".join(lines))
    return 0


# -- algorithms ----------------------------------------------------------------------------------
def _add_algorithms(sub) -> None:
    p = sub.add_parser("algorithms", help="list the registered algorithms")
    p.set_defaults(handler=_cmd_algorithms)


def _cmd_algorithms(args) -> int:
    from .algorithms import ALGORITHMS
    from .algorithms.base import Algorithm

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
    print("\nhyperparameters (SPEC keys with their defaults, e.g. fedavg:server_lr=0.5; every algorithm also takes")
    print("lr and local_steps, given by --lr and --local-steps):")
    for name, cls in ALGORITHMS.items():
        defaults = cls()
        keys = [f"{key}={_shown(getattr(defaults, key))}" for key in cls.__dataclass_fields__
                if key not in Algorithm.__dataclass_fields__]
        print(f"  {name:<{width}} {', '.join(keys) or '(none)'}")
    return 0


def _shown(value) -> str:
    """A default as a user types it in a SPEC; None (no value unless given) is '(unset)', which no SPEC takes."""
    if value is None:
        return "(unset)"
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


# -- check ---------------------------------------------------------------------------------------
def _add_check(sub) -> None:
    from .runs.cli import add_algorithm_import_option

    p = sub.add_parser("check", help="the conformance kit: check that an algorithm (registered or your own) "
                       "is exact, resumable and says what it keeps")
    p.add_argument("algorithm", metavar="ALGORITHM", help="NAME or NAME:key=value,... (see `focusfl algorithms`), "
                   "or your own class path/to/file.py:Class[:key=value,...] or package.module:Class with "
                   "--allow-algorithm-import")
    add_algorithm_import_option(p, "ALGORITHM")
    p.set_defaults(handler=_cmd_check)


def _cmd_check(args) -> int:
    from .algorithms import make_algorithm
    from .algorithms.importing import algorithm_source
    from .sweeps.conformance import run_checks

    try:
        algorithm = make_algorithm(args.algorithm)  # bad input (a name, a key, the permission) ends here, exit 2
    except FocusflError:
        raise
    except Exception:  # the class's own code failed to construct: the kit's first check says how
        algorithm = None
    source = None if algorithm is None else algorithm_source(algorithm)
    origin = "" if source is None else f" from {source.path} (SHA-256 {source.sha256[:12]}...)"
    print(f"checking {args.algorithm}{origin}")
    checks = run_checks(args.algorithm)
    for check in checks:
        print(check.line())
    failed = sum(check.passed is False for check in checks)
    skipped = sum(check.passed is None for check in checks)
    print(f"{len(checks) - failed - skipped} passed, {failed} failed, {skipped} not applicable")
    return 1 if failed else 0


# -- tune ----------------------------------------------------------------------------------------
def _add_tune(sub) -> None:
    from .sweeps.cli import add_tune_arguments, run_tune

    p = sub.add_parser("tune", help="grid-search the step size of one or more algorithms")
    add_tune_arguments(p)
    p.set_defaults(handler=run_tune)


# -- sweep and plot ------------------------------------------------------------------------------
def _add_sweep(sub) -> None:
    p = sub.add_parser("sweep", help="run a grid of runs declared in a TOML file: seeds, step sizes, "
                       "algorithms; parallel and resumable")
    p.add_argument("experiment", help="experiment file (TOML; docs/experiments.md)")
    p.add_argument("--out", help="sweep folder (default runs/NAME, NAME the experiment file's stem); a rerun "
                   "skips the runs finished there")
    p.add_argument("--workers", type=positive_int, default=1, help="runs at a time on this machine")
    p.add_argument("--batch-runs", type=batch_runs_value, default="auto", metavar="auto|K", help=BATCH_RUNS_HELP)
    from .runs.cli import add_algorithm_import_option, add_run_options

    # The run fields come from the experiment file (sweeps/sweep.py's DEFAULTS); threads is
    # how each worker computes, recorded in every run's config.json.
    add_run_options(p, ("threads", "work", "dp", "numerics"), defaults={"work": None, "dp": None, "numerics": None},
                    helps={
        "threads": "torch threads per worker (small runs are fastest so, and the results do not depend on "
                   "--workers; a thread count changes float rounding)",
        "work": "work SPEC of every run, replacing the file's 'work' axis: each active client's local steps per "
                "round (fixed, uniform, 'rates:r=0.25;1;...', markov; docs/algorithms.md) (default: the file's "
                "'work', else fixed)",
        "dp": "client-level DP of every run, replacing the file's 'dp': clip=C,noise=SIGMA,mode=central|local"
              "[,delta=D][,target_epsilon=E] (docs/privacy.md) (default: the file's 'dp', else none)",
        "numerics": "the numerical environment of every run, replacing the file's 'numerics': native (the CPU's "
                    "own fastest kernels) or portable (the kernels every x86-64 CPU has: the same bytes on any of "
                    "them, slower); the command starts itself again in it, and its workers inherit it (recorded "
                    "in every run's config.json; docs/runs.md) (default: the file's 'numerics', else native)"})
    add_algorithm_import_option(p, "the experiment file's algorithms")
    p.add_argument("--executor", choices=["local", "ray"], default="local",
                   help="local: this machine; ray: tasks on a Ray cluster (pip install '.[ray]' in a clone)")
    p.add_argument("--address", help="with --executor ray: the cluster's address (default: a Ray already running on this machine, else a new local one; RAY_ADDRESS=local: always a new one)")
    p.add_argument("--gpus-per-task", type=positive_float, metavar="G",
                   help="with --executor ray: GPUs each task asks Ray for (0.25: four tasks share a GPU; above 1 a "
                   "whole number); Ray places the task on a GPU it assigns, where runs on device 'cuda' compute "
                   "(default: none)")
    p.add_argument("--cpus-per-task", type=positive_float, metavar="C",
                   help="with --executor ray: CPUs each task asks Ray for (fractional up to 1; default: --threads)")
    p.add_argument("--retries", type=non_negative_int, metavar="N",
                   help="with --executor ray: times Ray runs a task again when its node or worker is lost; a run "
                   "resumes from its last checkpoint, in the shared sweep folder or shipped to the driver's node "
                   "(default: 3)")
    p.add_argument("--checkpoint-every", type=non_negative_int, metavar="R",
                   help="each run saves a checkpoint every R rounds (default: once a minute)")
    p.add_argument("--band", choices=["std", "minmax"],
                   help="band around the mean in the figures (default: the file's 'band', else std)")
    p.add_argument("--tensorboard", metavar="TB",
                   help="also log every finished run to TensorBoard, in TB/ALGORITHM-lrLR-seedS-HASH8 with the "
                   "sweep's axes as hparams; runs finished earlier are logged if their log is missing "
                   "(pip install tensorboard)")
    p.set_defaults(handler=_cmd_sweep)


def _cmd_sweep(args) -> int:
    from .sweeps.sweep import counts_line, load_experiment, restart_note, run_sweep

    experiment = load_experiment(args.experiment, work=args.work, dp=args.dp, numerics=args.numerics)
    out = Path(args.out or f"runs/{Path(args.experiment).stem}")
    report = run_sweep(experiment, out, workers=args.workers, threads=args.threads, executor=args.executor,
                       address=args.address, checkpoint_every=args.checkpoint_every, band=args.band,
                       progress=True, tensorboard=args.tensorboard, batch_runs=args.batch_runs,
                       gpus_per_task=args.gpus_per_task, cpus_per_task=args.cpus_per_task, retries=args.retries)
    print(counts_line(report, _print_summary(out / "summary.csv")))
    if report.restarted:
        print(restart_note(report))
    print(f"wrote {out}/results.csv, " + ", ".join(n for n in report.written if n != "results.csv"))
    if args.tensorboard:
        print(f"TensorBoard: logged {report.logged} run(s) in {args.tensorboard} (tensorboard --logdir {args.tensorboard})")
    if report.failed:
        first = report.failed[0]
        return _fail(f"focusfl: {len(report.failed)} of {report.total} runs failed (the first, "
                     f"{first['algorithm']} seed {first['seed']}: {first['error']}); they are listed in "
                     f"{out}/failures.csv; run the same command again to retry them", 1)
    return 0


def _print_summary(path: Path, limit: int = 24) -> list[dict]:
    """The first ``limit`` configurations of summary.csv (its rows returned); a configuration
    with a diverged seed says so instead of a mean and range of infinities."""
    from .io.atomic import read_csv

    if not path.is_file():
        return []
    rows = read_csv(path)
    if not rows:
        return rows
    metric = rows[0]["metric"]
    final = f"final {metric} mean (min-max)"
    work = "work" in rows[0]  # a sweep with a work axis: its column beside participation
    print(f"{'participation':<22} " + (f"{'work':<16} " if work else "")
          + f"{'algorithm':<24} {'lr':>9} {'seeds':>5} {final:>34}")
    for row in rows[:limit]:
        diverged = int(row["diverged"])
        span = f"{float(row[f'final_{metric}_mean']):.3e} ({float(row[f'final_{metric}_min']):.2e}-" \
               f"{float(row[f'final_{metric}_max']):.2e})" if not diverged else \
            f"{diverged} of {row['seeds']} diverged"
        print(f"{row['participation'][:22]:<22} " + (f"{row['work'][:16]:<16} " if work else "")
              + f"{row['algorithm'][:24]:<24} {float(row['lr']):>9.3g} {row['seeds']:>5} {span:>34}")
    if len(rows) > limit:
        print(f"... {len(rows) - limit} more configurations in {path}")
    return rows


def _add_plot(sub) -> None:
    p = sub.add_parser("plot", help="overlay finished runs and sweeps (seeds grouped into mean and band)")
    p.add_argument("folders", nargs="+", metavar="RUN_OR_SWEEP_DIR", help="run folders and sweep folders")
    p.add_argument("--x", choices=["round", "comm_up", "comm_total"], default="round",
                   help="x axis: rounds, floats sent up, or floats sent down + up")
    p.add_argument("--y", metavar="METRIC", help="a column of metrics.csv (default rel_error, else loss)")
    p.add_argument("--band", choices=["std", "minmax"], default="std", help="band around the mean over seeds")
    p.add_argument("--title", help="figure title")
    p.add_argument("--out", default="plot.png", help="figure file; PNG and PDF are both written, beside each other "
                   "(default: plot.png and plot.pdf in the current folder; a file there that focusfl did not "
                   "write is never replaced)")
    p.set_defaults(handler=_cmd_plot)


def _cmd_plot(args) -> int:
    from .sweeps.aggregate import iter_groups, write_plot

    written, series = write_plot(args.folders, Path(args.out), x=args.x, metric=args.y, band=args.band,
                                 title=args.title)
    # The full path: a default name lands in the current folder, which the user may not expect.
    print(f"{len(series)} runs in {len(iter_groups(series))} configurations; wrote {written[0].absolute()} and "
          f"{written[1].name}")
    return 0


# -- bias and matrices (focusfl.matrix) ----------------------------------------------------------
def _add_bias(sub) -> None:
    from .matrix.cli import BiasOptions, add_bias_arguments, run_bias
    from .runs.cli import record_of

    p = sub.add_parser("bias", help="participation bias: q_i, delta_q^2, FedAvg's and FOCUS's limit points")
    add_bias_arguments(p)
    p.set_defaults(handler=lambda args: run_bias(record_of(BiasOptions, args)))


def _add_matrices(sub) -> None:
    from .matrix.cli import MatricesOptions, add_matrices_arguments, run_matrices
    from .runs.cli import record_of

    p = sub.add_parser("matrices", help="draw the paper's Figures 1-3: stochastic matrices and round patterns")
    add_matrices_arguments(p)
    p.set_defaults(handler=lambda args: run_matrices(record_of(MatricesOptions, args)))


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line, like every other error (subcommand parsers inherit the class)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def _check_value(self, action: argparse.Action, value) -> None:
        if not isinstance(action, _SpecOrSubcommand):  # its word is a SPEC unless it names a subcommand
            super()._check_value(action, value)


class _HelpFormatter(argparse.HelpFormatter):
    """Wraps descriptions, keeps example blocks as written, and appends each option's default."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith("examples:"):
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        shown = default is not None and default is not argparse.SUPPRESS and not isinstance(default, bool)
        if action.option_strings and "default" not in text and shown:
            text += f" (default: {default})"
        return text


# Help of options that several commands share, where a command gives none.
_COMMON_HELP = {
    "seed": "seed of the data, participation and minibatches",
    "dtype": "floating-point type of models and data",
    "device": "cpu or cuda",
    "clients": "number of clients N",
    "rounds": "number of rounds",
    "schedule": "step-size schedule: constant, or sqrt = eta/sqrt(r/10+1)",
    "out": "output folder (replaced only if focusfl wrote it)",
    "algorithm": "algorithm NAME or NAME:key=value,... (see `focusfl algorithms`)",
    "local_steps": "local steps tau per round (default: the algorithm's, 1)",
    "lr": "(local) step size, or 'auto': a stable step from the problem's smoothness constant",
    "eval_every": "evaluate every E rounds",
}


def _examples(*lines: str) -> str:
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


def _registry_names() -> str:
    """The problems and participation processes, as the commands that take them list them (the
    problems' registry imports torch: read only where a command built needs it)."""
    from .participation import available_participation
    from .problems import available_problems

    return (f"Problems: {', '.join(available_problems())}. "
            f"Participation processes: {', '.join(available_participation())}.")


def _command_texts(command: str | None = None) -> dict[str, tuple[str, str]]:
    """(description, epilog) of each command without its own; ``command``: the one command
    built (build_parser), None: all."""
    from .participation import available_participation

    names = _registry_names() if command in (None, "tune", "bias") else ""
    return {
        "reproduce": ("Reproduce a figure or table of the papers; each preset writes its figures and a "
                      "summary.csv into --out, and a rerun after a crash skips the runs already finished.",
                      _examples("focusfl reproduce ridge --out runs/fig4", "focusfl reproduce delays",
                                "focusfl reproduce mnist-demo --data PATH/mnist.npz")),
        "reproduce ridge": (None, _examples("focusfl reproduce ridge", "focusfl reproduce ridge --seeds 5 --workers 2",
                                            "focusfl reproduce ridge --setting notebook --out runs/fig4-notebook",
                                            "focusfl reproduce ridge --export experiment.toml   # then: focusfl sweep "
                                            "experiment.toml")),
        "reproduce delays": (None, _examples("focusfl reproduce delays --out runs/delays")),
        "reproduce report": (None, _examples("focusfl reproduce report --out runs/report",
                                             "focusfl reproduce report --data PATH/mnist.npz  # with the mnist-demo",
                                             "focusfl reproduce report --quick")),
        "reproduce mnist-demo": (None, _examples("focusfl reproduce mnist-demo --data PATH/mnist.npz")),
        "reproduce nn-study": (None, _examples("focusfl reproduce nn-study --data PATH/mnist.npz --workers 2",
                                               "focusfl reproduce nn-study --data PATH/mnist.npz --quick")),
        "reproduce fedsum-mnist": (None, _examples("focusfl reproduce fedsum-mnist --data-dir DATA --download")),
        "reproduce focus-cifar10": (None, _examples("focusfl reproduce focus-cifar10 --data-dir DATA --download")),
        "reproduce fedsum-resnet18": (None, _examples(
            "focusfl reproduce fedsum-resnet18 --data-dir DATA --download --device cuda",
            "focusfl reproduce fedsum-resnet18 --dataset cifar100 --data-dir DATA --device cuda")),
        "reproduce fedsum-biased": (None, _examples("focusfl reproduce fedsum-biased --data-dir DATA --download")),
        "reproduce fedsum-sst2": (None, _examples(
            "focusfl reproduce fedsum-sst2 --data sst2 --model bert-base-uncased --device cuda",
            "focusfl reproduce fedsum-sst2 --data sst2 --model bert-base-uncased --steps fixed --rounds 300")),
        "participation": ("Draw a participation process and print its statistics: per-client rates p_i "
                          "(empirical and nominal), q_i = E[1{i in S}/|S|], delays tau. Participation "
                          f"processes: {', '.join(available_participation())} (docs/participation.md).",
                          _examples("focusfl participation bernoulli", "focusfl participation markov:rho=0.9 --clients 8",
                                    "focusfl participation weighted:m=4 --rounds 2000 --plot raster.png",
                                    "focusfl participation 'bernoulli:p=0.1;0.5;0.9;0.2' --clients 4   "
                                    "# a list: quoted, a shell ends the command at ;",
                                    "focusfl participation import fedscale client_behave_trace --round-seconds 60 "
                                    "--out trace.csv")),
        "participation import": (
            "Convert a recorded availability trace into focusfl's participation trace (rounds x clients, 0/1; "
            "`--participation trace:path=FILE` replays it) and print its statistics: p_i, q_i and the delays "
            "tau_max, tau_avg. Formats: fedscale (FedScale's client behaviour pickle, read without running code; "
            "--capacity adds its device speeds as a work trace), flash (FLASH's state-trace JSON: a device is ready "
            "while charging, on WiFi and idle, or the --ready conditions, on FLASH's clock), ready (FLASH's ready "
            "windows JSON) and matrix (clients x rounds, 0/1 or True/False, FedStale's layouts). Devices never "
            "available stay as empty columns in a matrix and are dropped from a timed recording (--absent; "
            "docs/participation.md).",
            _examples("focusfl participation import fedscale client_behave_trace --round-seconds 60 --rounds 1440 "
                      "--clients 100 --out trace.csv",
                      "focusfl participation import flash state_traces.json --round-seconds 300 --ready charging,wifi "
                      "--out flash.csv",
                      "focusfl participation import matrix availability.csv --out trace.csv",
                      "focusfl participation import fedscale client_behave_trace --round-seconds 60 --assign fedscale "
                      "--capacity client_device_capacity --deadline 60 --batch-size 20 --local-steps 10 "
                      "--out trace.csv --work-out work.csv")),
        "work": ("Draw a work process and print each client's local steps per round: mean, min, max and the "
                 "fraction of rounds cut short (fewer than --local-steps); the last row is the mean over the "
                 "clients (docs/algorithms.md).",
                 _examples("focusfl work uniform --clients 8 --local-steps 5",
                           "focusfl work markov:p=0.3,rho=0.9,slow=0.2 --rounds 2000 --plot steps.png",
                           "focusfl work 'rates:r=0.25;0.5;1;1' --clients 4   # quoted: a shell ends the command at ;")),
        "algorithms": ("List the registered algorithms with the vectors each sends per round and the memory "
                       "it keeps (docs/algorithms.md).", _examples("focusfl algorithms")),
        "check": ("The conformance kit (docs/your-algorithm.md): construction and the describe() round trip, "
                  "state_size against init (small N, and N = 10^5 on the meta device), the vectorized engine against "
                  "the per-client reference loop in float64 under several participation and work processes, "
                  "round_steps, empty rounds, the server step's independence of the message order, a declared "
                  "tracking invariant, lr_scale, float32, checkpoint and resume bit for bit, the communication "
                  "figures, and convergence under full participation (exact if the class sets exact_at_full). One "
                  "line per check with the figure it measured; exit status 1 if any fails.",
                  _examples("focusfl check fedavg", "focusfl check scaffold:server_lr=0.5",
                            "focusfl check my_prox.py:MyProx --allow-algorithm-import")),
        "tune": ("Grid-search the step size of one or more algorithms on one problem and participation "
                 "process; prints the best step of each and writes grid.csv and summary.csv. " + names,
                 _examples("focusfl tune --algorithm focus,fedavg --problem ridge --participation bernoulli",
                           "focusfl tune --algorithm all --local-steps 5 --out runs/tune")),
        "sweep": ("Run every combination of the axes an experiment file declares (algorithms and their "
                  "hyperparameters, problems, participation processes, step sizes, seeds, rounds, local steps) "
                  "and write results.csv (one row per run and round), summary.csv (mean, std, min, max over "
                  "seeds) and figures of the mean with a band. Each run is a run folder under DIR/runs/; "
                  "the same command again skips finished runs and resumes killed ones (docs/experiments.md).",
                  _examples("focusfl sweep experiment.toml --out runs/sweep --workers 2",
                            "focusfl sweep experiment.toml --out runs/sweep --executor ray --address auto",
                            "focusfl sweep experiment.toml --out runs/sweep --tensorboard runs/tb",
                            "focusfl reproduce ridge --export experiment.toml   # a file to start from")),
        "plot": ("Overlay finished runs and sweeps: runs that differ only in their seed are drawn as their "
                 "mean with a band; one panel per participation process. Writes PNG and PDF.",
                 _examples("focusfl plot runs/sweep --x comm_total", "focusfl plot runs/focus runs/fedavg --y loss",
                           "focusfl plot runs/sweep-a runs/sweep-b --band minmax --out compare.png")),
        "bias": ("Participation bias: q_i, delta_q^2, and the limit points of FedAvg (biased towards "
                 "frequent clients) and FOCUS (exact) on a problem (docs/framework.md). A diverged run exits 1. "
                 + names, _examples("focusfl bias", "focusfl bias --problem ridge:dim=10,samples=50,hetero=1 "
                                    "--participation bernoulli")),
        "federation": ("Run an algorithm on a real Flower federation: a loopback one for trying it out, or "
                       "an app to start with `flwr run` against your own SuperLink (docs/federation.md).",
                       _examples("focusfl federation local --nodes 3 --algorithm focus --rounds 50",
                                 "focusfl federation app runs/app")),
        "federation local": ("Start a SuperLink and N SuperNodes on loopback as subprocesses, run the algorithm, "
                             "write metrics.csv, config.json, curve.png and the realized trace, and stop them all.",
                             _examples("focusfl federation local --nodes 3 --algorithm focus --rounds 50",
                                             "focusfl federation local --nodes 4 --algorithm scaffold --participation bernoulli")),
        "federation app": ("Write a Flower app folder for `flwr run` against your own SuperLink on real machines.",
                           _examples("focusfl federation app runs/app", "cd runs/app && flwr run . my-superlink")),
        "matrices": ("Draw the FOCUS paper's Figures 1-3: the stochastic matrices of one round and the "
                     "round patterns of FedAvg and FOCUS (docs/framework.md).",
                     _examples("focusfl matrices --clients 4 --active 1,3 --out runs/matrices")),
        "audit": ("Check the DP accountant by an attack (docs/privacy.md, \"Audit\"): canary clients, each in the "
                  "federation with probability 1/2, a private training through the run's mechanism under the run's "
                  "participation process, a membership test on the released output (central: the final model; "
                  "local: the messages) and the empirical lower bound on epsilon it proves, beside the accounted "
                  "epsilon; exit status 1 if the lower bound exceeds it.",
                  _examples("focusfl audit --dp clip=1,noise=1,mode=central,delta=1e-2",
                            "focusfl audit --dp clip=1,noise=1,mode=local,delta=1e-2 --participation bernoulli:p=0.5",
                            "focusfl audit --dp clip=1,noise=1,mode=central,delta=1e-5 --form one-run")),
    }


def _finish_help(parser: argparse.ArgumentParser, name: str, texts: dict) -> None:
    """Every command: a description, an example, every option a help text and its default."""
    parser.formatter_class = _HelpFormatter
    description, epilog = texts.get(name, (None, None))
    parser.description = parser.description or description
    parser.epilog = parser.epilog or epilog
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub_parser in action.choices.items():
                _finish_help(sub_parser, f"{name} {sub_name}".strip(), texts)
        elif action.option_strings and not action.help:
            action.help = _COMMON_HELP.get(action.dest)


# -- audit ---------------------------------------------------------------------------------------
def _add_audit(sub) -> None:
    p = sub.add_parser("audit", help="check the DP accountant by an attack: canary clients, a membership test on "
                       "the released output, an empirical lower bound on epsilon")
    p.add_argument("--dp", required=True, metavar="DP",
                   help="the mechanism audited: clip=C,noise=SIGMA,mode=central|local,delta=D[,secret_schedule=true] "
                   "(docs/privacy.md)")
    p.add_argument("--participation", default="full", metavar="SPEC",
                   help="the participation process, as focusfl run takes it (built with the run's seed; default full); "
                   "under a public schedule the attacker knows which rounds each canary joined")
    p.add_argument("--form", choices=("trials", "one-run"), default="trials",
                   help="trials (the default): canaries of independent runs pooled, the tighter bound where runs are "
                   "as cheap as here; one-run: Steinke, Nasr and Jagielski (2023), every canary in one run, guesses "
                   "on the top and bottom scores, for a training too costly to repeat")
    p.add_argument("--canaries", type=int, default=None, metavar="K",
                   help="canary clients a run, each in the federation with probability 1/2 (default: 25 for trials, "
                   "1000 for one-run)")
    p.add_argument("--clients", type=int, default=None, metavar="N",
                   help="clients a run, the canaries among them (default: the canaries and one other)")
    p.add_argument("--rounds", type=int, default=1, metavar="R", help="rounds of private training (default 1)")
    p.add_argument("--runs", type=int, default=None, metavar="B",
                   help="trials form: independent runs whose canaries are pooled (default 1200)")
    p.add_argument("--seed", type=int, default=0, help="the first run's seed (default 0)")
    p.set_defaults(handler=_cmd_audit)


def _cmd_audit(args) -> int:
    from .errors import ConfigError
    from .privacy import parse_dp
    from .privacy.audit import CRITERION, run_audit

    dp = parse_dp(args.dp)
    if dp is None:
        raise ConfigError("audit: --dp none has nothing to audit")
    result = run_audit(dp, canaries=args.canaries, clients=args.clients, rounds=args.rounds, seed=args.seed,
                       runs=args.runs, participation=args.participation, form=args.form)
    print(f"audit ({args.form}, participation {args.participation}, {dp.mode} mode, {result.schedule} schedule): "
          f"accounted epsilon {result.accounted:.4g}, audited lower bound {result.audited:.4g} "
          f"(delta {dp.delta:g}; {result.evidence()})")
    print(f"{'holds' if result.holds else 'FLAGGED'}: {CRITERION}")
    return 0 if result.holds else 1


def _commands() -> dict[str, Callable[[Any], None]]:
    """Each command's name and the function that adds its parser, in the order --help lists them."""
    return {"run": _add_run, "reproduce": _add_reproduce, "participation": _add_participation, "work": _add_work,
            "algorithms": _add_algorithms, "check": _add_check, "tune": _add_tune, "sweep": _add_sweep,
            "plot": _add_plot, "bias": _add_bias, "matrices": _add_matrices, "federation": _add_federation,
            "audit": _add_audit}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of ``command`` alone: a command imports what its options
    need (the run options torch and every registry), and one command typed need not import the
    others' (`focusfl participation import` reads a trace without torch)."""
    parser = _Parser(
        prog="focusfl", description="Federated optimization under arbitrary client participation.",
        epilog=_examples("focusfl run --algorithm focus --participation bernoulli --out runs/focus",
                         "focusfl reproduce ridge", "focusfl COMMAND --help"),
    )
    parser.add_argument("--version", action="version", version=VERSION)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, add in _commands().items():
        if command in (None, name):
            add(sub)
    _finish_help(parser, "", _command_texts(command))
    return parser


VERSION = f"focusfl {__version__}"  # what ``focusfl --version`` prints


def _command_of(argv: list[str] | None) -> str | None:
    """The command ``argv`` names first, when it is one (else None: the parser of every command
    says what is wrong, or prints the top-level help)."""
    words = sys.argv[1:] if argv is None else argv
    return words[0] if words and words[0] in _commands() else None


def _add_federation(sub) -> None:
    """``focusfl federation``: needs Flower (``pip install ".[flower]"`` in a clone)."""
    import importlib.util

    if importlib.util.find_spec("flwr") is None:
        p = sub.add_parser("federation", help="run on a Flower deployment (needs Flower: pip install '.[flower]' in a clone)")
        p.set_defaults(handler=_no_flower)
        p.add_argument("rest", nargs=argparse.REMAINDER)  # whatever follows: the error is the same
        return
    from .flower.cli import add_parser  # imports no Flower module until a command runs

    add_parser(sub)


def _no_flower(args) -> int:
    from .errors import ConfigError

    raise ConfigError('focusfl federation needs Flower: pip install ".[flower]" in a clone of focusfl '
                      '(or "focusfl[flower]" from a package index)')


# Set in a command started again in the numerical environment its run asks for: it is started
# once, never again (a process whose kernels still differ says so in one line).
NUMERICS_RESTART = "FOCUSFL_NUMERICS_RESTARTED"


def _start_again_in(wanted: str) -> None:
    """Replace this process by the same command in the numerical environment ``wanted`` (a run's
    ``numerics``): its variables are read when torch loads, so only a new process can have them.
    Called before the run wrote anything (runs/driver.build checks the environment first)."""
    from .device import PORTABLE_ENVIRONMENT

    env = dict(os.environ)
    if wanted == "portable":
        env.update(PORTABLE_ENVIRONMENT)
    else:
        for name in PORTABLE_ENVIRONMENT:
            env.pop(name, None)
    env[NUMERICS_RESTART] = wanted
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "focusfl.cli", *sys.argv[1:]], env)


def main(argv: list[str] | None = None) -> int:
    """Parse and run a command; every failure is one line on stderr and an exit status:
    2 for bad input or an environment problem, 1 for a diverged run, 128+N for signal N; an error
    raised in a user's algorithm code too (their file and line; algorithms/importing.py)."""
    try:
        if (sys.argv[1:] if argv is None else argv) == ["--version"]:
            print(VERSION)  # what argparse prints, without building every command's parser first
            return 0
        with _interrupts_deferred():
            parser = build_parser(_command_of(argv))  # the command's modules (most import torch)
        args = parser.parse_args(argv)
        if not getattr(args, "allow_algorithm_import", False):
            return args.handler(args)  # no permission given: the process's own (none) holds
        from .algorithms.importing import algorithm_imports, user_code_error, user_tracebacks

        # --allow-algorithm-import: the command's permission to import the user's algorithm code,
        # wherever the command resolves an algorithm SPEC (algorithms/importing.py); --debug: the
        # traceback of an error that code raises, printed where it is turned into its one line.
        with algorithm_imports(True), user_tracebacks(getattr(args, "debug", False)):
            try:
                return args.handler(args)
            except Exception as exc:  # the user's code raised where no layer below said so
                error = user_code_error(exc)
                if error is None:
                    raise
                raise error from None
    except DivergenceError as exc:
        return _fail(f"focusfl: {exc}", 1)
    except NumericsError as exc:
        if argv is None and NUMERICS_RESTART not in os.environ:
            _start_again_in(exc.wanted)  # does not return
        return _fail(f"focusfl: error: {exc}", 2)
    except FocusflError as exc:
        return _fail(f"focusfl: error: {exc}", 2)
    except KeyboardInterrupt as exc:
        return _fail(f"focusfl: {str(exc) or 'interrupted'}", getattr(exc, "exit_code", 130))
    except BrokenPipeError:
        # The reader went away (`focusfl ... | head`): nothing left to say, and no one to say it to.
        _silence_stdout()
        return 0
    except MemoryError:
        return _fail("focusfl: error: out of memory (try fewer clients, rounds or a smaller problem)", 2)
    except RuntimeError as exc:  # torch's allocators raise RuntimeError (OutOfMemoryError on a GPU)
        from .limits import allocation_failure

        reason = allocation_failure(exc)
        if reason is None:
            raise
        return _fail(f"focusfl: error: out of memory: {reason} (try fewer clients, rounds or a smaller problem)", 2)
    except OSError as exc:
        if full_disk(exc):
            return _fail(f"focusfl: error: {_disk_full(exc)}", 2)
        where = f" {exc.filename!r}" if getattr(exc, "filename", None) else ""
        return _fail(f"focusfl: error: cannot access{where}: {exc.strerror or exc}", 2)
    except Exception as exc:
        if full_disk(exc):  # a library's error raised while the disk was full (a figure, a log)
            return _fail(f"focusfl: error: {_disk_full(exc)}", 2)
        raise


def _disk_full(exc: BaseException) -> str:
    """A full disk's one line, naming the folder of the file being written where it is known."""
    cause = no_space(exc)
    filename = getattr(cause, "filename", None)
    where = Path(os.fsdecode(filename)).parent if filename else "a file focusfl was writing"
    return str(disk_full(where, exc))


@contextlib.contextmanager
def _interrupts_deferred():
    """Hold Ctrl-C while the heavy modules import, then act on it.

    A KeyboardInterrupt raised inside torch's or numpy's own import code can be swallowed there,
    leaving a half-imported module (a later AttributeError) or a run that ignores the Ctrl-C.
    An ignored SIGINT (a background job) stays ignored."""
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    pending: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: pending.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if pending:
        raise KeyboardInterrupt


def _fail(message: str, code: int) -> int:
    try:
        print(message.splitlines()[0] if message else "focusfl: error", file=sys.stderr)
    except (BrokenPipeError, OSError):
        pass
    return code


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's final flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())

"""The command line of ``focusfl tune``: its options, and the parsed options made into the records
the library takes (a TuneSetup and a TuneSearch). A ``cli`` module (tests/test_layers.py puts it
with the commands): nothing in sweeps/ imports it, and nothing here computes.
"""
from __future__ import annotations

import argparse

from ..argtypes import BATCH_RUNS_HELP, batch_runs_value
from ..runs.cli import add_algorithm_import_option, add_run_options, run_config_of
from .tune import DEFAULT_TARGET, DEFAULT_VALIDATION, RUN_OPTIONS, TUNE_DEFAULTS, TuneSearch, TuneSetup, make_setup, tune


# -- tune ----------------------------------------------------------------------------------------
def add_tune_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--algorithm", action="append", required=True,
                        help="algorithm NAME or NAME:key=value,...; several as a comma-separated list "
                        "(focus,fedavg) or by repeating the option; 'all' = every non-alias")
    add_run_options(parser, RUN_OPTIONS, defaults=TUNE_DEFAULTS, helps={
        "rounds": "rounds per trial", "local_steps": "local steps tau for every algorithm",
        "seed": "the first seed", "threads": "torch threads per worker (recorded in every trial's config.json)"})
    parser.add_argument("--lr-min", type=float, default=1e-5, help="smallest step size")
    parser.add_argument("--lr-max", type=float, default=1e-1, help="largest step size")
    parser.add_argument("--points", type=int, default=9, help="grid points, log-spaced")
    parser.add_argument("--target", type=float, default=None,
                        help=f"success level of the tracked metric (default {DEFAULT_TARGET:g}; neural networks: none, "
                        "they are ranked by their validation loss)")
    parser.add_argument("--validation", type=float, default=None,
                        help=f"neural networks: the share of each client's data held out to score the steps on "
                        f"(default {DEFAULT_VALIDATION:g}, or the problem SPEC's validation=)")
    parser.add_argument("--seeds", type=int, default=1,
                        help="seeds per step size (--seed, --seed + 1, ...); the best step is the best on average")
    parser.add_argument("--workers", type=int, default=1, help="trials at a time on this machine")
    parser.add_argument("--batch-runs", type=batch_runs_value, default="auto", metavar="auto|K", help=BATCH_RUNS_HELP)
    parser.add_argument("--out", default="runs/tune", help="output folder")
    add_algorithm_import_option(parser)


def setup_from_args(args: argparse.Namespace) -> TuneSetup:
    """The command line's TuneSetup: its run options as a RunConfig (the problem's defaults where
    left unset), the target and the validation share."""
    return make_setup(run_config_of(args, RUN_OPTIONS), target=args.target, validation=args.validation)


def search_from_args(args: argparse.Namespace) -> TuneSearch:
    return TuneSearch(algorithms=tuple(args.algorithm), lr_min=args.lr_min, lr_max=args.lr_max, points=args.points,
                      seeds=args.seeds, workers=args.workers, out=args.out, batch_runs=args.batch_runs)


def run_tune(args: argparse.Namespace) -> int:
    """``focusfl tune``: the command line made into records, then :func:`~focusfl.sweeps.tune.tune`."""
    return tune(setup_from_args(args), search_from_args(args))

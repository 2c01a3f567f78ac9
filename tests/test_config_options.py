"""The run configuration is declared once (runs/config.py): every command that takes a run field
has exactly one option for it, generated from the field, with the field's default (or the
command's own, declared beside it); and every command that reads a run folder reads its
config.json through the one guarded reader (one line, exit 2, for a file too large or not JSON)."""
from __future__ import annotations

import argparse
import importlib.util
import shutil

import pytest

from cli_harness import assert_one_line_error, run_cli, run_main
from focusfl.cli import _run_config, build_parser
from focusfl.runs.cli import options
from focusfl.runs.config import RunConfig, defaults_for, field_defaults

SMALL = "ridge:clients=4,dim=3,samples=5"


def subparser(parser: argparse.ArgumentParser, *names: str) -> argparse.ArgumentParser:
    for name in names:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[name]
    return parser


# Options named after a field that take a list of values to search, not one run's value.
AXES = {(("tune",), "algorithm")}


def commands() -> dict[tuple[str, ...], tuple[tuple[str, ...], dict]]:
    """Each command that takes run fields: (the fields, its own defaults over the fields')."""
    from focusfl.reproduce import reproduce_nn
    from focusfl.sweeps import tune

    found = {("run",): (tuple(options()), {}), ("tune",): (tune.RUN_OPTIONS, tune.TUNE_DEFAULTS),
             ("sweep",): (("threads", "work", "dp", "numerics"), {"work": None, "dp": None, "numerics": None})}
    for preset, setup in (("mnist-demo", reproduce_nn.MNIST_DEMO), ("fedsum-mnist", reproduce_nn.FEDSUM_MNIST),
                          ("focus-cifar10", reproduce_nn.FOCUS_CIFAR10),
                          ("fedsum-resnet18", reproduce_nn.FEDSUM_RESNET18["cifar10"]),
                          ("fedsum-biased", reproduce_nn.FEDSUM_BIASED),
                          ("fedsum-sst2", reproduce_nn.FEDSUM_SST2)):
        found[("reproduce", preset)] = (reproduce_nn.RUN_OPTIONS,
                                        {"rounds": setup.rounds, "eval_every": setup.eval_every})
    if importlib.util.find_spec("flwr") is None:  # no Flower: `federation` is a stub that takes no options
        return found
    from focusfl.flower import cli as flower_cli
    from focusfl.flower.server_app import FEDERATION_DEFAULTS
    for kind in ("local", "app"):
        found[("federation", kind)] = (flower_cli.RUN_OPTIONS, FEDERATION_DEFAULTS)
    return found


@pytest.mark.parametrize("command", list(commands()), ids=" ".join)
def test_every_run_field_is_one_generated_option_with_the_fields_default(command):
    fields, own = commands()[command]
    parser = subparser(build_parser(), *command)
    table = options()
    for name in table:
        generated = [a for a in parser._actions if getattr(a, "run_field", None) == name]
        by_hand = [a for a in parser._actions if a.dest == name and getattr(a, "run_field", None) is None
                   and (command, name) not in AXES]
        assert not by_hand, f"{' '.join(command)}: --{name} written by hand"
        assert len(generated) == (name in fields), f"{' '.join(command)}: {len(generated)} options for {name}"
        if not generated:
            continue
        action = generated[0]
        assert action.option_strings == ["--" + name.replace("_", "-")]
        assert action.type is table[name].type and action.choices == (list(table[name].choices or []) or None)
        if command == ("run",):  # deferred: a flag beside --config or --resume is told from a default
            assert action.default is None
        elif table[name].problem_default and name not in own:
            assert action.default is None and table[name].problem_default in action.help
        else:
            assert action.default == own.get(name, field_defaults().get(name)), name


@pytest.mark.parametrize("problem", [SMALL, "nn:data=mnist,clients=4"])
def test_run_sweep_tune_and_federation_fill_the_same_problem_defaults(problem):
    from focusfl.sweeps.sweep import DEFAULTS, parse_experiment

    expected = defaults_for(problem)
    assert expected["dtype"] == ("float32" if problem.startswith("nn") else "float64")
    assert expected["eval_every"] == (50 if problem.startswith("nn") else 1)
    args = build_parser().parse_args(["run", "--algorithm", "focus", "--problem", problem])
    assert _run_config(args, RunConfig, None) == RunConfig(algorithm="focus", **expected)
    experiment = parse_experiment({"algorithms": ["focus"], "problems": [problem]})
    assert {k: experiment.axes[k][0] for k in ("lr", "local_steps", "rounds", "schedule")} == \
        {k: expected[k] for k in ("lr", "local_steps", "rounds", "schedule")}
    assert DEFAULTS["dtype"] is None and DEFAULTS["eval_every"] is None  # the problem's, in expand
    tune_args = build_parser().parse_args(["tune", "--algorithm", "focus", "--problem", problem])
    from focusfl.sweeps.cli import setup_from_args

    setup = setup_from_args(tune_args)
    assert (setup.dtype, setup.eval_every) == (expected["dtype"], expected["eval_every"])
    pytest.importorskip("flwr")
    from focusfl.flower.server_app import FederationConfig

    resolved = FederationConfig(problem=problem, dtype=None, eval_every=None).resolved()  # as the CLI leaves them
    assert (resolved.dtype, resolved.eval_every) == (expected["dtype"], expected["eval_every"])


def test_config_json_keys_and_run_key_come_from_the_fields():
    from focusfl.runs.config import _KEYED, _RECORDED, _REQUIRED

    assert _REQUIRED == ("algorithm", "problem", "participation", "rounds", "seed", "dtype", "device", "engine",
                         "eval_every")
    # threads is part of the run key (issue 27): the thread count changes an nn run's bytes; 1, the
    # default, is key-neutral, so the keys of runs recorded before stay what they were.
    assert {"schedule", "threads"} <= set(_RECORDED) and "threads" in _KEYED and "schedule" in _KEYED


# -- one guarded reader of config.json -----------------------------------------------------------
BAD_CONFIGS = {"oversized": "{" + " " * (1 << 20) + "}", "malformed": '{"algorithm": "focus", '}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A finished run folder and a finished sweep folder, made once."""
    root = tmp_path_factory.mktemp("readers")
    proc = run_main("run", "--algorithm", "focus", "--problem", SMALL, "--rounds", "3", "--out", str(root / "run"))
    assert proc.returncode == 0, proc.stderr
    (root / "sweep.toml").write_text(f"algorithms = ['focus']\nproblems = ['{SMALL}']\nrounds = 3\n")
    proc = run_main("sweep", str(root / "sweep.toml"), "--out", str(root / "sweep"))
    assert proc.returncode == 0, proc.stderr
    return root


@pytest.mark.parametrize("bad", list(BAD_CONFIGS))
@pytest.mark.parametrize("command", ["run --resume", "run --config", "plot", "sweep rerun"])
def test_every_reader_of_a_run_folder_refuses_a_bad_config_in_one_line(folders, tmp_path, command, bad):
    run = tmp_path / "run"
    shutil.copytree(folders / "run", run)
    (run / "config.json").write_text(BAD_CONFIGS[bad])
    if command == "run --resume":
        argv = ["run", "--resume", str(run), "--rounds", "6"]
    elif command == "run --config":
        argv = ["run", "--config", str(run / "config.json"), "--out", str(tmp_path / "again")]
    elif command == "plot":
        argv = ["plot", str(run), "--out", str(tmp_path / "plot.png")]
    else:
        sweep = tmp_path / "sweep"
        shutil.copytree(folders / "sweep", sweep)
        (next((sweep / "runs").iterdir()) / "config.json").write_text(BAD_CONFIGS[bad])
        argv = ["sweep", str(folders / "sweep.toml"), "--out", str(sweep)]
    # each reader's oversized file through the console script (its memory limit); the rest in this process
    line = assert_one_line_error((run_cli if bad == "oversized" else run_main)(*argv), 2, "config.json")
    assert ("larger than 1 MiB" in line) == (bad == "oversized")

"""A run's numerical environment as the user asks for it: ``--numerics portable`` gives the same
bytes on every emulated x86-64 CPU, is recorded in config.json, replays and resumes to the same
bytes; a library caller outside the environment its run asks for gets one line (docs/runs.md,
"On any machine"). A sweep and a tune compute every run in one environment (``--numerics`` or
the experiment file's ``numerics``), started again in it with their workers inheriting it."""
from __future__ import annotations

import json
import platform

import pytest

from cli_harness import assert_one_line_error, cli_env, run_cli

pytestmark = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                                reason="the portable environment pins x86-64 kernels; this is another architecture")

RUN = ("run", "--algorithm", "focus", "--problem", "ridge:clients=8,dim=5,samples=20", "--participation",
       "bernoulli", "--local-steps", "2")
# Another CPU, as far as variables can make one: ATen's AVX2 kernels and MKL's AVX2 code path.
OTHER_CPU = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"}


def _bare_env(**extra: str) -> dict[str, str]:
    from focusfl.device import NUMERICS_VARIABLES

    env = {k: v for k, v in cli_env().items() if k not in NUMERICS_VARIABLES}
    return {**env, **extra}


def test_a_portable_run_has_one_set_of_bytes_on_emulated_cpus_and_replays_and_resumes_to_them(tmp_path):
    for name, extra in (("here", {}), ("other", OTHER_CPU)):
        done = run_cli(*RUN, "--rounds", "20", "--numerics", "portable", "--out", str(tmp_path / name),
                       env=_bare_env(**extra))
        assert done.returncode == 0, done.stderr
    here, other = (tmp_path / name for name in ("here", "other"))
    assert (here / "metrics.csv").read_bytes() == (other / "metrics.csv").read_bytes()
    assert json.loads((here / "config.json").read_text())["numerics"] == "portable"
    # A replay from config.json starts in the portable environment by itself.
    done = run_cli("run", "--config", str(here / "config.json"), "--out", str(tmp_path / "replay"), env=_bare_env())
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "replay" / "metrics.csv").read_bytes() == (here / "metrics.csv").read_bytes()
    # A resume continues in it: 20 rounds, then 10 more, equal 30 in one go.
    done = run_cli("run", "--resume", str(here), "--rounds", "30", env=_bare_env(**OTHER_CPU))
    assert done.returncode == 0, done.stderr
    done = run_cli(*RUN, "--rounds", "30", "--numerics", "portable", "--out", str(tmp_path / "whole"),
                   env=_bare_env())
    assert done.returncode == 0, done.stderr
    assert (here / "metrics.csv").read_bytes() == (tmp_path / "whole" / "metrics.csv").read_bytes()


def test_a_native_run_started_in_the_portable_environment_computes_natively(tmp_path):
    from focusfl.device import PORTABLE_ENVIRONMENT

    native = run_cli(*RUN, "--rounds", "5", "--out", str(tmp_path / "native"), env=_bare_env())
    inside = run_cli(*RUN, "--rounds", "5", "--out", str(tmp_path / "inside"), env=_bare_env(**PORTABLE_ENVIRONMENT))
    assert native.returncode == 0 and inside.returncode == 0, native.stderr + inside.stderr
    assert (tmp_path / "native" / "metrics.csv").read_bytes() == (tmp_path / "inside" / "metrics.csv").read_bytes()
    assert json.loads((tmp_path / "inside" / "config.json").read_text())["numerics"] == "native"


def test_numerics_refusals_are_one_line_and_write_nothing(tmp_path):
    bad = run_cli(*RUN, "--rounds", "2", "--numerics", "fast", "--out", str(tmp_path / "bad"), env=_bare_env())
    assert_one_line_error(bad, contains="numerics")
    # A process already started again that still computes natively stops: it never loops.
    again = run_cli(*RUN, "--rounds", "2", "--numerics", "portable", "--out", str(tmp_path / "again"),
                    env=_bare_env(FOCUSFL_NUMERICS_RESTARTED="portable"))
    assert_one_line_error(again, contains="numerics=portable")
    assert not (tmp_path / "bad").exists() and not (tmp_path / "again").exists()


def test_the_library_refuses_a_run_outside_the_environment_it_asks_for(tmp_path):
    from focusfl.device import numerics
    from focusfl.errors import NumericsError
    from focusfl.runs.config import RunConfig
    from focusfl.runs.folder import run_to_folder

    if numerics()["mode"] == "portable":
        pytest.skip("this test process computes in the portable environment")
    with pytest.raises(NumericsError, match="ATEN_CPU_CAPABILITY=default"):
        run_to_folder(RunConfig(rounds=2, numerics="portable"), tmp_path / "lib")
    assert not (tmp_path / "lib").exists()


# -- sweep and tune: one environment for every run ---------------------------------------------------
EXPERIMENT = """algorithms = ["fedavg", "focus"]
problems = ["ridge:clients=4,dim=3,samples=5"]
participation = ["bernoulli"]
rounds = 4
lr = 0.01
seeds = 2
"""


def _experiment(folder, extra: str = ""):
    path = folder / "grid.toml"
    path.write_text(EXPERIMENT + extra)
    return path


def _numerics_of_runs(folder) -> set[str]:
    return {json.loads(path.read_text())["numerics"] for path in (folder / "runs").glob("*/config.json")}


def test_a_portable_sweep_starts_again_its_workers_inherit_it_and_it_has_one_set_of_bytes(tmp_path):
    grid = _experiment(tmp_path)
    for name, extra, workers in (("here", {}, "2"), ("other", OTHER_CPU, "1")):
        done = run_cli("sweep", str(grid), "--numerics", "portable", "--workers", workers, "--out",
                       str(tmp_path / name), env=_bare_env(**extra))
        assert done.returncode == 0, done.stderr
        assert _numerics_of_runs(tmp_path / name) == {"portable"}  # 4 runs, each in a worker that refuses otherwise
    here, other = (tmp_path / name for name in ("here", "other"))
    assert (here / "results.csv").read_bytes() == (other / "results.csv").read_bytes()
    assert 'numerics = "portable"' in (here / "experiment.toml").read_text()  # its copy reruns the same grid


def test_a_sweep_started_in_the_portable_environment_computes_as_its_file_asks(tmp_path):
    from focusfl.device import PORTABLE_ENVIRONMENT

    grid = _experiment(tmp_path)
    done = run_cli("sweep", str(grid), "--out", str(tmp_path / "native"), env=_bare_env(**PORTABLE_ENVIRONMENT))
    assert done.returncode == 0, done.stderr
    assert _numerics_of_runs(tmp_path / "native") == {"native"}
    (tmp_path / "files").mkdir()
    portable = _experiment(tmp_path / "files", 'numerics = "portable"\n')  # the file's own key
    done = run_cli("sweep", str(portable), "--out", str(tmp_path / "portable"), env=_bare_env())
    assert done.returncode == 0, done.stderr
    assert _numerics_of_runs(tmp_path / "portable") == {"portable"}


def test_tune_trials_compute_in_the_environment_it_asks_for(tmp_path):
    out = tmp_path / "tune"
    done = run_cli("tune", "--algorithm", "fedavg", "--problem", "ridge:clients=4,dim=3,samples=5", "--participation",
                   "full", "--rounds", "5", "--points", "3", "--numerics", "portable", "--out", str(out),
                   env=_bare_env())
    assert done.returncode == 0, done.stderr
    assert _numerics_of_runs(out) == {"portable"}
    assert json.loads((out / "config.json").read_text())["tune"]["numerics"] == "portable"


@pytest.mark.parametrize("extra,says", [
    ('numerics = ["native", "portable"]\n', "numerics: one value for the whole sweep"),
    ('numerics = "fast"\n', "numerics: expected one of native, portable"),
])
def test_a_sweep_that_varies_or_misnames_numerics_is_one_line(tmp_path, extra, says):
    grid = _experiment(tmp_path, extra)
    proc = run_cli("sweep", str(grid), "--out", str(tmp_path / "out"), env=_bare_env())
    assert_one_line_error(proc, contains=says)
    assert not (tmp_path / "out").exists()


def test_the_library_refuses_a_sweep_outside_the_environment_it_asks_for(tmp_path):
    from focusfl.device import numerics
    from focusfl.errors import NumericsError
    from focusfl.sweeps.sweep import load_experiment, run_sweep

    if numerics()["mode"] == "portable":
        pytest.skip("this test process computes in the portable environment")
    experiment = load_experiment(_experiment(tmp_path), numerics="portable")
    assert experiment.numerics == "portable"
    with pytest.raises(NumericsError, match="numerics=portable"):
        run_sweep(experiment, tmp_path / "lib")
    assert not (tmp_path / "lib").exists()

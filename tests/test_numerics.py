"""A run's numerical environment as the user asks for it: ``--numerics portable`` gives the same
bytes on every emulated x86-64 CPU, is recorded in config.json, replays and resumes to the same
bytes; a library caller outside the environment its run asks for gets one line (docs/runs.md,
"On any machine")."""
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

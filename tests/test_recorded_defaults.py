"""config.json holds every default a run resolved, the ones an algorithm derives from the run
(Algorithm.prepare: a period from the participation's cycle, known rates, a coin seed) included,
while the run's key stays the one asked for."""
from __future__ import annotations

import json

import pytest

from cli_harness import run_cli_together
from focusfl.algorithms import ALGORITHMS, make_algorithm
from focusfl.runs.config import RunConfig
from focusfl.runs.driver import build, prepared_algorithm
from focusfl.runs.folder import run_state, run_to_folder

PROBLEM = "ridge:clients=8,dim=5,samples=10"
SPECS = [*ALGORITHMS, "fedavg:weighting=known_p", "fedstale:weighting=known_p"]


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("participation", ["cyclic:groups=4", "bernoulli"])
def test_the_recorded_algorithm_is_the_one_the_run_uses(spec, participation):
    built = build(RunConfig(algorithm=spec, problem=PROBLEM, participation=participation, rounds=3, lr=0.01))
    recorded = built.resolved["algorithm"]
    used = prepared_algorithm(built)
    assert recorded == used.describe()
    # Rebuilt from the record, the algorithm derives nothing more: the record is the whole of it.
    again = make_algorithm(recorded).prepare(built.problem, built.participation, seed=built.config.seed)
    assert again == used


def test_amplified_scaffold_records_the_period_it_took_from_cyclic_participation(tmp_path):
    common = ["run", "--problem", PROBLEM, "--participation", "cyclic:groups=4", "--rounds", "12", "--lr", "0.01"]
    runs = {name: tmp_path / name for name in ("default", "period4", "period1")}
    procs = run_cli_together([
        (*common, "--algorithm", "amplified_scaffold", "--out", str(runs["default"])),
        (*common, "--algorithm", "amplified_scaffold:period=4", "--out", str(runs["period4"])),
        (*common, "--algorithm", "amplified_scaffold:period=1", "--out", str(runs["period1"])),
    ])
    assert all(proc.returncode == 0 for proc in procs), [proc.stderr for proc in procs]
    config = json.loads((runs["default"] / "config.json").read_text())
    assert config["algorithm"]["period"] == 4 and config["asked"]["algorithm"] == {"name": "amplified_scaffold"}
    metrics = {name: (folder / "metrics.csv").read_bytes() for name, folder in runs.items()}
    assert metrics["default"] == metrics["period4"] != metrics["period1"]


def test_a_run_that_derived_a_default_keeps_its_key(tmp_path):
    """A sweep finds the runs it finished: the key of a run is its record with the derived values
    as asked (None), the same before and after they were recorded."""
    config = RunConfig(algorithm="amplified_scaffold", problem=PROBLEM, participation="cyclic:groups=4", rounds=3,
                       lr=0.01)
    built = build(config)
    assert built.requested["algorithm"]["period"] is None and built.resolved["algorithm"]["period"] == 4
    run_to_folder(config, tmp_path / "run", curve=False)
    assert run_state(tmp_path / "run", built.key, built.requested) == "done"

"""Vectorized engine == per-client reference loop, for every registered algorithm.

Both engines run the same algorithm object on the same draws; the vectorized one batches all
active clients, the reference one calls the client round once per client. They must agree to
rounding error in float64, including rounds with no participant and clients that stay away.
The comparisons are the conformance kit's (focusfl.sweeps.conformance: `focusfl check`).
"""
import os
import subprocess
import sys

import pytest
import torch

from focusfl.algorithms import ALGORITHMS, make_algorithm
from focusfl.engine import Resume, simulate
from focusfl.engine.simulate import ENGINES, active_sets
from focusfl.sweeps import conformance as kit
from focusfl.sweeps.conformance import PROCESSES, SMALL_RIDGE, SMALL_RIDGE_SGD, WORKS, maker_of
from focusfl.participation import make_participation
from focusfl.problems import make_problem


def passes(check: kit.Check) -> None:
    assert check.passed, check.line()


@pytest.mark.parametrize("name", list(ALGORITHMS))
@pytest.mark.parametrize("process_spec", PROCESSES)
def test_vectorized_matches_reference(name, process_spec):
    passes(kit.check_engines(maker_of(name), SMALL_RIDGE, process_spec))


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_vectorized_matches_reference_with_minibatches(name):
    # bernoulli:p=0.2 on 6 clients has empty rounds (test_bernoulli_small_p_has_empty_rounds)
    passes(kit.check_engines(maker_of(name), SMALL_RIDGE_SGD, "bernoulli:p=0.2", rounds=6))


@pytest.mark.parametrize("name", [n for n in ALGORITHMS if ALGORITHMS[n].partial_work])
@pytest.mark.parametrize("work", WORKS)
def test_vectorized_matches_reference_under_work_processes(name, work):
    passes(kit.check_engines(maker_of(name), SMALL_RIDGE_SGD, "bernoulli:p=0.5", work=work, rounds=6))


def test_the_engine_check_can_fail():
    """A rounding-level tolerance, not a formality: states 1e-9 apart are told apart."""
    fast, _ = kit.engine_runs(maker_of("focus"), SMALL_RIDGE, "full")
    nudged = fast.state._replace(server=fast.state.server._replace(x=fast.state.server.x + 1e-9))
    assert kit.state_gap(fast.state, fast.state) == (0.0, True)
    assert not kit.state_gap(nudged, fast.state)[1]


def test_bernoulli_small_p_has_empty_rounds():
    # The equivalence above must cover rounds with nobody in them.
    mask = make_participation("bernoulli:p=0.2", 6, seed=3).mask(8)
    assert (~mask.any(1)).any()


@pytest.mark.parametrize("name", list(ALGORITHMS))
@pytest.mark.parametrize("participation", ["bernoulli:p=0.5", "markov"])
def test_resume_continues_exactly(name, participation):
    """4 rounds, a checkpoint written and read back, 6 more = 10 rounds, bit for bit."""
    passes(kit.check_resume(maker_of(name), participation=participation))


@pytest.mark.parametrize("engine", ["vectorized", "reference"])
@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_donated_rounds_equal_out_of_place_rounds(name, engine):
    # In-place client tables (donate=True) must be a pure speed-up: the same states bit for
    # bit, and the donated state is the only one touched.
    problem = make_problem(SMALL_RIDGE_SGD)
    process = make_participation("bernoulli:p=0.5", problem.num_clients, seed=4)
    algorithm = make_algorithm(name, lr=2e-3, local_steps=2).prepare(problem, process)
    step_round = ENGINES[engine]
    kept = donated = algorithm.init(problem.initial_point(), problem.num_clients)
    for r, active in enumerate(active_sets(process.mask(6), problem.device)):
        kept_before = [field.clone() for field in kept.clients]
        kept_next = step_round(algorithm, kept, problem, active, r, 5)
        for before, field in zip(kept_before, kept.clients):
            assert torch.equal(before, field)  # out of place: the old state is untouched
        donated = step_round(algorithm, donated, problem, active, r, 5, donate=r > 0)
        kept = kept_next
    for part_kept, part_donated in zip(kept, donated):
        for field_kept, field_donated in zip(part_kept, part_donated):
            assert torch.equal(field_kept, field_donated)


def test_simulate_never_modifies_the_callers_state():
    problem = make_problem(SMALL_RIDGE)
    process = make_participation("full", problem.num_clients, seed=4)
    algorithm = make_algorithm("focus", lr=2e-3, local_steps=2)
    start = simulate(algorithm, problem, process, 2, seed=5).state
    saved = [field.clone() for field in start.clients]
    simulate(algorithm, problem, process, 3, seed=5, resume=Resume(start, 2))
    for before, field in zip(saved, start.clients):
        assert torch.equal(before, field)


# -- the heap rounds allocate from ------------------------------------------------------------------
_HEAP_PROBE = (
    "import ctypes, resource, torch\n"
    "from focusfl.engine.heap import retain_freed_memory\n"
    "from focusfl.engine.simulate import simulate\n"
    "from focusfl.algorithms import make_algorithm\n"
    "from focusfl.participation import make_participation\n"
    "from focusfl.problems import make_problem\n"
    "problem = make_problem('ridge:clients=4,samples=8,dim=3')\n"
    "simulate(make_algorithm('focus', lr=1e-3), problem, make_participation('full', 4), 2, seed=0)\n"
    "def step():\n"  # what a local step does: frees and re-allocates the same large blocks
    "    for _ in range(8):\n"
    "        blocks = [torch.ones(2 << 20) for _ in range(6)]\n"
    "        del blocks\n"
    "step()\n"
    "before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
    "step()\n"
    "faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before\n"
    "print(retain_freed_memory(), faults)\n"
)


def _heap_probe(**env):
    out = subprocess.run([sys.executable, "-c", _HEAP_PROBE], env={**os.environ, **env}, capture_output=True,
                         text=True, check=True).stdout.split()
    return out[0] == "True", int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc settings")
def test_a_simulation_keeps_its_freed_heap_and_leaves_the_users_malloc_settings_alone():
    """Once a round has run, steps that free and re-allocate 48 MB of blocks no longer
    page-fault on fresh memory; a user's own malloc setting stands (and the faults with it)."""
    kept, faults = _heap_probe()
    assert kept and faults < 100, faults
    left_alone, user_faults = _heap_probe(MALLOC_MMAP_THRESHOLD_="131072")
    assert not left_alone and user_faults > 1000, user_faults
    tuned, _ = _heap_probe(GLIBC_TUNABLES="glibc.malloc.trim_threshold=131072")
    assert not tuned

"""Vectorized engine == per-client reference loop, for every registered algorithm.

Both engines run the same algorithm object on the same draws; the vectorized one batches all
active clients, the reference one calls the client round once per client. They must agree to
rounding error in float64, including rounds with no participant and clients that stay away.
"""
import os
import subprocess
import sys

import pytest
import torch

from focusfl.algorithms import ALGORITHMS, make_algorithm
from focusfl.engine import Resume, simulate
from focusfl.engine.simulate import ENGINES, active_sets
from focusfl.participation import make_participation
from focusfl.problems import make_problem

PROCESSES = ["full", "uniform:m=2", "bernoulli:p=0.2", "markov", "cyclic:groups=3"]
SMALL_RIDGE = "ridge:clients=6,samples=12,dim=5,hetero=0.5"
SMALL_RIDGE_SGD = SMALL_RIDGE + ",batch=4"


def _states_close(a, b):
    for part_a, part_b in zip(a, b):
        for field_a, field_b in zip(part_a, part_b):
            torch.testing.assert_close(field_a, field_b, rtol=1e-12, atol=1e-12)


def _run(name, problem, process, engine, rounds=8):
    algorithm = make_algorithm(name, lr=2e-3, local_steps=3)
    return simulate(algorithm, problem, process, rounds, seed=3, engine=engine)


@pytest.mark.parametrize("name", list(ALGORITHMS))
@pytest.mark.parametrize("process_spec", PROCESSES)
def test_vectorized_matches_reference(name, process_spec):
    problem = make_problem(SMALL_RIDGE)
    process = make_participation(process_spec, problem.num_clients, seed=3)
    fast = _run(name, problem, process, "vectorized")
    slow = _run(name, problem, process, "reference")
    _states_close(fast.state, slow.state)
    assert [r["rel_error"] for r in fast.rows] == pytest.approx([r["rel_error"] for r in slow.rows], rel=1e-10)


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_vectorized_matches_reference_with_minibatches(name):
    problem = make_problem(SMALL_RIDGE_SGD)
    process = make_participation("bernoulli:p=0.2", problem.num_clients, seed=3)  # has empty rounds
    fast = _run(name, problem, process, "vectorized", rounds=6)
    slow = _run(name, problem, process, "reference", rounds=6)
    _states_close(fast.state, slow.state)


def test_bernoulli_small_p_has_empty_rounds():
    # The equivalence above must cover rounds with nobody in them.
    mask = make_participation("bernoulli:p=0.2", 6, seed=3).mask(8)
    assert (~mask.any(1)).any()


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_resume_continues_exactly(name):
    problem = make_problem(SMALL_RIDGE_SGD)
    process = make_participation("bernoulli:p=0.5", problem.num_clients, seed=4)
    algorithm = make_algorithm(name, lr=2e-3, local_steps=2)
    straight = simulate(algorithm, problem, process, 10, seed=5)
    first = simulate(algorithm, problem, process, 4, seed=5)
    rest = simulate(algorithm, problem, process, 6, seed=5, resume=Resume(first.state, 4))
    _states_close(straight.state, rest.state)
    assert straight.rows[-1] == rest.rows[-1]


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

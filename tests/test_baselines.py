"""The baselines a reviewer asks for first (FedProx, FedAvgM, FedAdam / FedYogi / FedAdagrad, FedDyn,
Wang and Ji's amplified FedAvg, FedLaAvg): each against the algorithm it reduces to, its server
rule computed by hand, and the fixed point its paper's claim rests on. The shared checks (engines
in float64, state size, step counts, resume) run over the registry in test_algorithm_suite.py,
test_engines.py and test_work.py."""
import pytest
import torch

from focusfl.algorithms import ALGORITHMS, RoundContext, State, make_algorithm
from focusfl.algorithms.fedavg import ModelDelta
from focusfl.algorithms.feddyn import DynClients, DynServer
from focusfl.engine import Resume, simulate
from focusfl.errors import ConfigError
from focusfl.matrix.bias import server_trajectory
from focusfl.participation import make_participation
from focusfl.problems import make_problem

RIDGE = "ridge:clients=6,samples=12,dim=5,hetero=0.5"
RATES = "bernoulli:p=0.2;0.3;0.5;0.6;0.8;0.9"
NEW = ("fedprox", "fedavgm", "fedadam", "fedyogi", "fedadagrad", "feddyn", "amplified_fedavg", "fedlaavg")


@pytest.fixture(scope="module")
def ridge():
    return make_problem(RIDGE)


def _trajectory(spec: str, problem, process_spec: str = RATES, rounds: int = 40, **hyper):
    mask = make_participation(process_spec, problem.num_clients, seed=1).mask(rounds)
    return server_trajectory(make_algorithm(spec, **{"lr": 2e-3, "local_steps": 3, **hyper}), problem, mask)


def test_the_new_names_are_registered_with_their_costs():
    costs = {name: ALGORITHMS[name]().communication() for name in NEW}
    assert all((c.down, c.up) == (1, 1) for c in costs.values())
    assert {n for n, c in costs.items() if c.client_memory} == {"feddyn", "fedlaavg"}
    assert not any(c.server_memory_per_client for c in costs.values())  # FedLaAvg's table lives on the clients
    assert {n: costs[n].server_memory for n in ("fedavgm", "fedadam", "feddyn")} == {
        "fedavgm": 2, "fedadam": 3, "feddyn": 2}


@pytest.mark.parametrize("spec", [
    "fedprox:mu=-1", "fedprox:mu=nan", "fedavgm:beta=1", "fedavgm:beta=-0.1", "fedavgm:server_lr=0",
    "fedadam:beta1=1", "fedadam:beta2=1.5", "fedyogi:tau=0", "fedadagrad:server_lr=-1", "fedadagrad:beta2=0.9",
    "feddyn:alpha=0", "amplified_fedavg:amplification=0", "amplified_fedavg:period=0", "amplified_fedavg:period=1.5",
    "fedlaavg:server_lr=0"])
def test_bad_hyperparameters_are_one_line_config_errors(spec):
    with pytest.raises(ConfigError) as info:
        make_algorithm(spec)
    assert "\n" not in str(info.value)


# -- what each reduces to ---------------------------------------------------------------------------
@pytest.mark.parametrize("spec,hyper", [
    ("fedprox", {"mu": 0.0}), ("fedavgm", {"beta": 0.0, "server_lr": 1.0}),
    ("amplified_fedavg", {"amplification": 1.0, "period": 4})])
def test_reduces_to_fedavg(ridge, spec, hyper):
    torch.testing.assert_close(_trajectory(spec, ridge, **hyper), _trajectory("fedavg", ridge), rtol=1e-13, atol=1e-13)


def test_fedprox_shortens_the_local_trip(ridge):
    plain, prox = _trajectory("fedavg", ridge), _trajectory("fedprox", ridge, mu=50.0)
    assert not torch.allclose(plain, prox)
    assert (prox[1] - prox[0]).norm() < (plain[1] - plain[0]).norm()  # each step pulled back towards x_r


def test_fedlaavg_is_mifa_with_the_table_on_the_clients(ridge):
    torch.testing.assert_close(_trajectory("fedlaavg", ridge, server_lr=0.7), _trajectory("mifa", ridge, server_lr=0.7),
                               rtol=1e-12, atol=1e-12)


def test_fedlaavg_with_one_step_is_focus_with_step_over_n(ridge):
    n = ridge.num_clients
    laavg = _trajectory("fedlaavg", ridge, local_steps=1, lr=6e-3)
    focus = _trajectory("focus", ridge, local_steps=1, lr=6e-3 / n)
    torch.testing.assert_close(laavg, focus, rtol=1e-12, atol=1e-12)


def test_amplification_multiplies_each_periods_move(ridge):
    """At every period end x = x_a + eta_g (x_FedAvg - x_a); in between rounds are FedAvg's."""
    process = make_participation("cyclic:groups=3", ridge.num_clients)
    algorithm = make_algorithm("amplified_fedavg", lr=2e-3, local_steps=2, amplification=2.5)
    prepared = algorithm.prepare(ridge, process)
    assert prepared.period == 3  # the cycle
    fedavg = make_algorithm("fedavg", lr=2e-3, local_steps=2)
    start = simulate(prepared, ridge, process, 3, seed=0).state.server
    plain = simulate(fedavg, ridge, process, 3, seed=0).state.server.x
    x0 = ridge.initial_point()
    torch.testing.assert_close(start.x, x0 + 2.5 * (plain - x0), rtol=1e-13, atol=1e-13)
    assert torch.equal(start.anchor, start.x)


# -- the adaptive server optimizers, by hand --------------------------------------------------------
@pytest.mark.parametrize("name", ["fedadam", "fedyogi", "fedadagrad"])
def test_adaptive_server_round_by_hand(name):
    algorithm = make_algorithm(name, server_lr=0.2, beta1=0.5, tau=0.1, **({} if name == "fedadagrad" else
                                                                            {"beta2": 0.75}))
    x0 = torch.tensor([1.0, -2.0], dtype=torch.float64)
    state = algorithm.init(x0, 3)
    assert torch.equal(state.server.v, torch.full_like(x0, 0.1 ** 2))  # v_{-1} = tau^2
    deltas = torch.tensor([[0.3, 0.0], [0.1, -0.6]], dtype=torch.float64)
    ctx = RoundContext(round=0, active=torch.tensor([0, 2]), num_clients=3)
    after = algorithm.server_round(state.server, ModelDelta(delta=deltas), ctx)
    delta = torch.tensor([0.2, -0.3], dtype=torch.float64)
    m = 0.5 * delta
    v0, sq = torch.full_like(x0, 0.1 ** 2), delta * delta
    v = {"fedadam": 0.75 * v0 + 0.25 * sq, "fedyogi": v0 - 0.25 * sq * torch.sign(v0 - sq),
         "fedadagrad": v0 + sq}[name]
    torch.testing.assert_close(after.v, v)
    torch.testing.assert_close(after.m, m)
    torch.testing.assert_close(after.x, x0 + 0.2 * m / (v.sqrt() + 0.1))
    nobody = ctx._replace(active=torch.zeros(0, dtype=torch.int64))
    assert algorithm.server_round(after, ModelDelta(delta=deltas[:0]), nobody) is after  # an empty round


def test_fedavgm_momentum_by_hand(ridge):
    algorithm = make_algorithm("fedavgm", lr=2e-3, local_steps=2, beta=0.5, server_lr=0.4)
    fedavg = make_algorithm("fedavg", lr=2e-3, local_steps=2)
    process = make_participation("full", ridge.num_clients)
    first = simulate(algorithm, ridge, process, 1).state.server
    delta = simulate(fedavg, ridge, process, 1).state.server.x - ridge.initial_point()
    torch.testing.assert_close(first.v, delta, rtol=1e-13, atol=1e-15)
    torch.testing.assert_close(first.x, ridge.initial_point() + 0.4 * delta, rtol=1e-13, atol=1e-15)


# -- FedDyn's fixed point ---------------------------------------------------------------------------
def _feddyn_from_optimum(problem, offset: float, rounds: int = 60) -> float:
    """max_r ||x_r - x*|| / ||x*|| of FedDyn started at x* with g_i = grad f_i(x*) (+ ``offset``)."""
    n, x_star = problem.num_clients, problem.x_star
    grads = problem.client_gradients(x_star.expand(n, -1), torch.arange(n), seed=0, round=0, step=0) + offset
    state = State(DynServer(x=x_star.clone(), h=grads.sum(0)), DynClients(g=grads.clone()))
    gaps = [0.0]
    simulate(make_algorithm("feddyn", lr=5e-3, local_steps=3, alpha=1.0), problem,
             make_participation(RATES, n, seed=2), rounds, resume=Resume(state, 0), eval_every=None, keep_rows=False,
             on_round=lambda r: gaps.append(float((r.state.server.x - x_star).norm() / x_star.norm())))
    return max(gaps)


def test_feddyn_optimum_is_a_fixed_point_under_partial_participation(ridge):
    assert _feddyn_from_optimum(ridge, 0.0) < 1e-13
    assert _feddyn_from_optimum(ridge, 0.05) > 1e-4  # g_i off their optimum values: x leaves x*


# -- as a user types them -----------------------------------------------------------------------------
def test_the_baselines_run_and_refuse_bad_keys_on_the_command_line(tmp_path):
    """The runs through the console script; the refusals and the listing in this process (run_main)."""
    from cli_harness import run_cli_together, run_main

    good = [("run", "--algorithm", spec, "--problem", "ridge:clients=4,samples=8,dim=3", "--participation",
             "cyclic:groups=2", "--lr", "1e-3", "--local-steps", "2", "--rounds", "4", "--work", "uniform",
             "--out", str(tmp_path / spec.split(":")[0])) for spec in ("fedadam", "amplified_fedavg", "fedlaavg:server_lr=0.5")]
    bad = [("run", "--algorithm", spec, "--problem", "ridge:clients=4,samples=8,dim=3", "--rounds", "2",
            "--out", str(tmp_path / f"bad{k}")) for k, spec in enumerate(
                ("fedprox:mu=-1", "fedavgm:beta=1", "feddyn:alpha=x", "fedyogi:gamma=1"))]
    for args, proc in zip(good, run_cli_together(good)):
        assert proc.returncode == 0, (args[2], proc.stderr)
    listed = run_main("algorithms").stdout
    assert all(name in listed for name in NEW)
    for args, proc in zip(bad, [run_main(*args) for args in bad]):
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, (args[2], proc.stderr)
        assert "Traceback" not in proc.stderr
        assert not (tmp_path / args[-1]).exists()


# -- the report's claims -----------------------------------------------------------------------------
def test_the_quick_section_states_three_computed_verdicts():
    from focusfl.reproduce import baselines_study

    section = baselines_study.baselines_section(baselines_study.QUICK, quick=True)
    assert [c.verdict.name for c in section.claims] == [
        "amplified-fedavg-lower-error", "feddyn-exact-partial", "fedlaavg-unbiased-intermittent"]
    assert all(c.verdict.outcome == "inconclusive (quick)" for c in section.claims)  # one seed decides nothing
    assert "None" not in "\n".join(section.text) and "| process | algorithm |" in section.text[1]


@pytest.fixture(scope="module")
def measured():
    """The section's runs at its full length and seeds, on every third step of the grid."""
    from focusfl.reproduce import baselines_study as study

    sizes = study.SuiteSizes(rounds=study.DECISIVE_ROUNDS, seeds=3, grid_every=3)
    return sizes, study.measure(sizes)


@pytest.mark.parametrize("criterion,candidate,contrast,numbers", [
    ("amplified-fedavg-lower-error", "amplified", "plain", ("amplified_final", "plain_final")),
    ("feddyn-exact-partial", "feddyn", "fedavg_partial", ("candidate_rounds", "fedavg_rounds")),
    ("fedlaavg-unbiased-intermittent", "fedlaavg", "fedavg_intermittent", ("candidate_rounds", "fedavg_rounds"))])
def test_each_claim_flips_with_what_was_measured(measured, criterion, candidate, contrast, numbers):
    """Measured at the section's length and seeds, each claim holds; the same criterion fed the
    roles swapped (FedAvg as the candidate) says "not reproduced"."""
    from focusfl.reproduce.verdicts import CRITERIA

    sizes, runs = measured
    key = "final" if numbers[0] == "amplified_final" else "rounds"

    def judge(first: str, second: str) -> str:
        values = {numbers[0]: runs[first][key], numbers[1]: runs[second][key], "rounds": sizes.rounds,
                  "step_at_grid_edge": runs[first]["edge"] or runs[second]["edge"]}
        return CRITERIA[criterion].judge(values).outcome

    assert judge(candidate, contrast) == "reproduced"
    assert judge(contrast, candidate) == "not reproduced"

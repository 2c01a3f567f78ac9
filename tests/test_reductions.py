"""Reductions and invariants of the FedSUM family and the baselines, in float64.

ALGORITHMS.md section 3.4: FedSUM == FedSUM-CR == SCAFFOLD (option II, global step) under full
participation; FedSUM-B (K = 1) == FOCUS (tau = 1) with gamma_B = N * eta; FedSUM (K = 1) ==
FedSUM-B (K = 1). Section 4: which baselines coincide with FedAvg under full participation
(all four of MIFA, FedVARP, FedAU, FedAWE do, and none does under partial participation), and
ProxSkip == SCAFFOLD under full participation, as the FOCUS paper's Figure 4 states. The newer
algorithms: FedStale between FedAvg (beta = 0) and FedVARP / MIFA (beta = 1), Amplified SCAFFOLD
with P = 1 and gamma = 1 is SCAFFOLD, and the lazy forms of Amplified SCAFFOLD's period-end
refresh and FedPBC's training of unlinked clients against plain loops written as the authors do.
"""
import pytest
import torch

from focusfl.algorithms import RoundContext, make_algorithm
from focusfl.engine import simulate
from focusfl.engine.vectorized import vectorized_round
from focusfl.participation import make_participation
from focusfl.problems import make_problem

ROUNDS = 25


@pytest.fixture(scope="module")
def problems():
    return {
        "ridge": make_problem("ridge:clients=6,samples=12,dim=5,hetero=0.5"),
        "logistic": make_problem("logistic:clients=6,samples=12,dim=4"),
        "ridge_sgd": make_problem("ridge:clients=6,samples=12,dim=5,hetero=0.5,batch=4"),
    }


def final_model(problem, spec, participation="full", rounds=ROUNDS, **overrides):
    algorithm = make_algorithm(spec, **overrides)
    process = make_participation(participation, problem.num_clients, seed=1)
    result = simulate(algorithm, problem, process, rounds, seed=2, eval_every=rounds)
    return algorithm.model(result.state)


def assert_same(a, b):
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-13)


def relative_gap(a, b) -> float:
    return float((a - b).norm() / b.norm())


# -- section 3.4 -------------------------------------------------------------------------------
@pytest.mark.parametrize("problem_name", ["ridge", "logistic", "ridge_sgd"])
def test_fedsum_equals_fedsum_cr_equals_scaffold_under_full_participation(problems, problem_name):
    problem = problems[problem_name]
    lr = 0.3 if problem_name == "logistic" else 2e-3
    fedsum = final_model(problem, "fedsum:server_lr=0.8", lr=lr, local_steps=3)
    assert_same(final_model(problem, "fedsum_cr:server_lr=0.8", lr=lr, local_steps=3), fedsum)
    assert_same(final_model(problem, "scaffold:server_lr=0.8", lr=lr, local_steps=3), fedsum)


@pytest.mark.parametrize("participation", ["full", "bernoulli:p=0.3", "cyclic:groups=3"])
@pytest.mark.parametrize("problem_name", ["ridge", "logistic"])
def test_fedsum_b_with_one_batch_is_focus_with_one_step(problems, participation, problem_name):
    """gamma_B = server_lr * lr * K = N * eta_focus; holds under any participation, empty
    rounds included (both step with the stale sum then)."""
    problem = problems[problem_name]
    eta = 0.05 if problem_name == "logistic" else 3e-4
    focus = final_model(problem, "focus", participation, lr=eta, local_steps=1)
    fedsum_b = final_model(problem, f"fedsum_b:server_lr={problem.num_clients}", participation, lr=eta, local_steps=1)
    assert_same(fedsum_b, focus)


def test_fedsum_b_with_one_batch_is_focus_with_stochastic_gradients(problems):
    # Both draw batch (seed, round, client, step=0) at x_r: SG-FOCUS and FedSUM-B stay equal.
    problem = problems["ridge_sgd"]
    focus = final_model(problem, "sg_focus", "uniform:m=2", lr=3e-4, local_steps=1)
    fedsum_b = final_model(problem, "fedsum_b:server_lr=6", "uniform:m=2", lr=3e-4, local_steps=1)
    assert_same(fedsum_b, focus)


@pytest.mark.parametrize("participation", ["full", "bernoulli:p=0.3", "markov"])
def test_fedsum_with_one_step_is_fedsum_b_with_one_batch(problems, participation):
    problem = problems["ridge"]
    fedsum = final_model(problem, "fedsum:server_lr=0.7", participation, lr=2e-3, local_steps=1)
    fedsum_b = final_model(problem, "fedsum_b:server_lr=0.7", participation, lr=2e-3, local_steps=1)
    assert_same(fedsum_b, fedsum)


def test_fedsum_family_differs_under_partial_participation(problems):
    problem = problems["ridge"]
    fedsum = final_model(problem, "fedsum", "bernoulli:p=0.3", lr=2e-3, local_steps=3)
    assert relative_gap(final_model(problem, "fedsum_cr", "bernoulli:p=0.3", lr=2e-3, local_steps=3), fedsum) > 1e-6
    assert relative_gap(final_model(problem, "scaffold", "bernoulli:p=0.3", lr=2e-3, local_steps=3), fedsum) > 1e-6


# -- section 4: the baselines against FedAvg ---------------------------------------------------
COINCIDE_WITH_FEDAVG = ["mifa", "fedvarp", "fedau", "fedawe", "fedstale", "fedpbc", "debiasing_fedavg"]


@pytest.mark.parametrize("name", COINCIDE_WITH_FEDAVG)
@pytest.mark.parametrize("problem_name", ["ridge", "logistic", "ridge_sgd"])
def test_baseline_is_fedavg_under_full_participation(problems, name, problem_name):
    problem = problems[problem_name]
    lr = 0.3 if problem_name == "logistic" else 2e-3
    fedavg = final_model(problem, "fedavg:server_lr=0.9", lr=lr, local_steps=3)
    assert_same(final_model(problem, f"{name}:server_lr=0.9", lr=lr, local_steps=3), fedavg)


@pytest.mark.parametrize("name", COINCIDE_WITH_FEDAVG)
def test_baseline_differs_from_fedavg_under_partial_participation(problems, name):
    problem = problems["ridge"]
    fedavg = final_model(problem, "fedavg", "bernoulli:p=0.3", lr=2e-3, local_steps=3)
    assert relative_gap(final_model(problem, name, "bernoulli:p=0.3", lr=2e-3, local_steps=3), fedavg) > 1e-3


@pytest.mark.parametrize("name", ["fedsum", "scaffold", "proxskip", "focus"])
def test_drift_corrected_methods_are_not_fedavg_under_full_participation(problems, name):
    problem = problems["ridge"]
    fedavg = final_model(problem, "fedavg", lr=2e-3, local_steps=3)
    assert relative_gap(final_model(problem, name, lr=2e-3, local_steps=3), fedavg) > 1e-3


@pytest.mark.parametrize("problem_name", ["ridge", "logistic"])
def test_proxskip_is_scaffold_under_full_participation(problems, problem_name):
    """Scaffnew communicating every tau = 1/p steps is SCAFFOLD (option II, gamma = 1):
    h_i = c_i - c, and the -(gamma/p) h_i shifts cancel in the average (sum_i h_i = 0)."""
    problem = problems[problem_name]
    lr = 0.3 if problem_name == "logistic" else 2e-3
    scaffold = final_model(problem, "scaffold", lr=lr, local_steps=4)
    assert_same(final_model(problem, "proxskip", lr=lr, local_steps=4), scaffold)


def test_fedavg_weightings_coincide_under_full_participation(problems):
    problem = problems["ridge"]
    fedavg = final_model(problem, "fedavg", lr=2e-3, local_steps=3)
    assert_same(final_model(problem, "fedavg_all", lr=2e-3, local_steps=3), fedavg)
    assert_same(final_model(problem, "fedavg_known_p", lr=2e-3, local_steps=3), fedavg)


# -- invariants --------------------------------------------------------------------------------
def run_rounds(algorithm, problem, participation, rounds, check):
    process = make_participation(participation, problem.num_clients, seed=0)
    state = algorithm.init(problem.initial_point(), problem.num_clients)
    for r in range(rounds):
        active = torch.as_tensor(process.active(r))
        before = state
        state = vectorized_round(algorithm, state, problem, active, r, seed=0)
        check(r, active, before, state)
    return state


@pytest.mark.parametrize("name", ["fedsum_b", "fedsum", "fedsum_cr"])
def test_fedsum_server_sum_tracks_every_clients_latest_gradient(problems, name):
    """Stochastic Uplink-Merge: v = sum_j c_j after every round, with O(d) server memory."""
    problem = problems["ridge"]

    def check(r, active, before, state):
        torch.testing.assert_close(state.server.v, state.clients.c.sum(0), rtol=1e-12, atol=1e-12)

    run_rounds(make_algorithm(name, lr=2e-3, local_steps=2), problem, "bernoulli:p=0.3", 30, check)


def test_scaffold_server_control_variate_is_the_mean_of_the_clients(problems):
    problem = problems["ridge"]

    def check(r, active, before, state):
        torch.testing.assert_close(state.server.c, state.clients.c.mean(0), rtol=1e-12, atol=1e-12)

    run_rounds(make_algorithm("scaffold", lr=2e-3, local_steps=2), problem, "bernoulli:p=0.3", 30, check)


def test_fedsum_cr_correction_is_the_mean_of_the_missed_aggregates(problems):
    """chat_i = mean of v_t / N over t = s_i+1..r (ALGORITHMS.md 3.3), checked against the
    history of v, for every active client of every round."""
    problem = problems["ridge"]
    algorithm = make_algorithm("fedsum_cr:server_lr=0.7", lr=2e-3, local_steps=2)
    history = [None]  # history[t] = v_t, the sum after round t-1 (v_0 = 0 at index 0 below)
    state0 = algorithm.init(problem.initial_point(), problem.num_clients)
    history[0] = state0.server.v
    checked = 0

    def check(r, active, before, state):
        nonlocal checked
        rows = type(before.clients)(*(f.index_select(0, active) for f in before.clients))
        ctx = RoundContext(round=r, active=active, num_clients=problem.num_clients)
        chat = algorithm.estimated_direction(before.server, rows, ctx)
        for k, last in enumerate(rows.last_round.tolist()):
            expected = (
                torch.stack(history[last + 1 : r + 1]).mean(0) / problem.num_clients
                if r > last else torch.zeros_like(before.server.v)
            )
            torch.testing.assert_close(chat[k], expected, rtol=1e-9, atol=1e-12)
            checked += 1
        history.append(state.server.v)

    run_rounds(algorithm, problem, "bernoulli:p=0.3", 30, check)
    assert checked > 20


def reference_fedau_weights(mask_rows, cutoff):
    """The FedAU authors' per-client interval bookkeeping, client by client in plain Python."""
    n = len(mask_rows[0])
    waiting, intervals, used = [0] * n, [[] for _ in range(n)], []
    for row in mask_rows:
        weights = {}
        for i, present in enumerate(row):
            if present:
                weights[i] = sum(intervals[i]) / len(intervals[i]) if intervals[i] else 1.0
                intervals[i].append(waiting[i] + 1)
                waiting[i] = 0
            else:
                waiting[i] += 1
                if waiting[i] >= cutoff:
                    intervals[i].append(waiting[i])
                    waiting[i] = 0
        used.append(weights)
    return used


def test_fedau_weights_follow_the_authors_interval_estimates(problems):
    problem = problems["ridge"]
    algorithm = make_algorithm("fedau:cutoff=4", lr=1e-3)
    process = make_participation("bernoulli:p=0.25", problem.num_clients, seed=0)
    mask = process.mask(60)
    expected = reference_fedau_weights(mask.tolist(), cutoff=4)
    seen = []

    def check(r, active, before, state):
        omega = algorithm.weights(before.server)
        seen.append({int(i): float(omega[i]) for i in active})

    run_rounds(algorithm, problem, "bernoulli:p=0.25", 60, check)
    assert len(seen) == len(expected)
    for got, want in zip(seen, expected):
        assert got == pytest.approx(want)
    assert any(w != 1.0 for weights in expected for w in weights.values())


def test_fedau_weights_estimate_the_cycle_length(problems):
    # Cyclic participation with E groups: every interval after the first is E rounds.
    problem = problems["ridge"]
    algorithm = make_algorithm("fedau", lr=1e-3)
    state = run_rounds(algorithm, problem, "cyclic:groups=3", 300, lambda *args: None)
    assert algorithm.weights(state.server).tolist() == pytest.approx([3.0] * problem.num_clients, rel=0.01)


# -- the newer algorithms ------------------------------------------------------------------------
@pytest.mark.parametrize("participation", ["full", "bernoulli:p=0.3", "markov", "cyclic:groups=3"])
@pytest.mark.parametrize("weighting,fedavg", [("active", "fedavg"), ("all", "fedavg_all"),
                                              ("known_p", "fedavg_known_p")])
def test_fedstale_without_stale_updates_is_fedavg(problems, participation, weighting, fedavg):
    problem = problems["ridge_sgd"]
    stale = final_model(problem, f"fedstale:beta=0,weighting={weighting},server_lr=0.8", participation, lr=2e-3,
                        local_steps=3)
    assert_same(stale, final_model(problem, f"{fedavg}:server_lr=0.8", participation, lr=2e-3, local_steps=3))


@pytest.mark.parametrize("participation", ["bernoulli:p=0.3", "markov", "cyclic:groups=3"])
def test_fedstale_with_estimated_weights_and_no_stale_updates_is_fedau(problems, participation):
    # Both weigh client i by omega_i / N, FedAU's mean completed interval (with the same cutoff).
    problem = problems["ridge"]
    stale = final_model(problem, "fedstale:beta=0,cutoff=5", participation, lr=2e-3, local_steps=3)
    assert_same(stale, final_model(problem, "fedau:cutoff=5", participation, lr=2e-3, local_steps=3))


@pytest.mark.parametrize("participation", ["bernoulli:p=0.3", "markov", "cyclic:groups=3"])
def test_fedstale_with_only_stale_weight_is_fedvarp(problems, participation):
    problem = problems["ridge_sgd"]
    stale = final_model(problem, "fedstale:beta=1,weighting=active,server_lr=0.8", participation, lr=2e-3,
                        local_steps=3)
    assert_same(stale, final_model(problem, "fedvarp:server_lr=0.8", participation, lr=2e-3, local_steps=3))


@pytest.mark.parametrize("participation", ["uniform:m=2", "cyclic:groups=3", "full"])
def test_fedstale_with_only_stale_weight_and_weights_1_over_n_is_mifa(problems, participation):
    # MIFA's stored-update form: x moves along the mean of the refreshed table (no empty rounds
    # here: MIFA steps in those with its stale table, FedStale does not).
    problem = problems["ridge"]
    stale = final_model(problem, "fedstale:beta=1,weighting=all,server_lr=0.8", participation, lr=2e-3,
                        local_steps=3)
    assert_same(stale, final_model(problem, "mifa:server_lr=0.8", participation, lr=2e-3, local_steps=3))


def test_fedstale_in_between_is_neither(problems):
    problem = problems["ridge"]
    mixed = final_model(problem, "fedstale:weighting=active", "bernoulli:p=0.3", lr=2e-3, local_steps=3)
    for other in ("fedavg", "fedvarp"):
        assert relative_gap(final_model(problem, other, "bernoulli:p=0.3", lr=2e-3, local_steps=3), mixed) > 1e-4


@pytest.mark.parametrize("participation", ["full", "bernoulli:p=0.3", "markov", "cyclic:groups=3"])
@pytest.mark.parametrize("problem_name", ["ridge", "logistic", "ridge_sgd"])
def test_amplified_scaffold_with_period_1_and_no_amplification_is_scaffold(problems, participation, problem_name):
    problem = problems[problem_name]
    lr = 0.3 if problem_name == "logistic" else 2e-3
    amplified = final_model(problem, "amplified_scaffold:period=1,amplification=1", participation, lr=lr,
                            local_steps=3)
    assert_same(amplified, final_model(problem, "scaffold", participation, lr=lr, local_steps=3))


def test_amplified_scaffold_is_not_scaffold_with_a_period_or_an_amplification(problems):
    problem = problems["ridge"]
    scaffold = final_model(problem, "scaffold", "cyclic:groups=3", lr=2e-3, local_steps=3)
    for spec in ("amplified_scaffold:amplification=1", "amplified_scaffold:period=1"):
        gap = relative_gap(final_model(problem, spec, "cyclic:groups=3", lr=2e-3, local_steps=3), scaffold)
        assert gap > 1e-4, spec


def eager_amplified_scaffold(problem, mask, *, lr, tau, gamma, period, seed=0):
    """The authors' synthetic/train.py loop, client by client: every client that computed in a
    period sets c_i to the mean of its period's gradients at the period's end; c = mean c_i."""
    n = problem.num_clients
    x = problem.initial_point().clone()
    anchor, c = x.clone(), torch.zeros_like(x)
    c_i = torch.zeros(n, x.numel(), dtype=x.dtype)
    acc, count = torch.zeros_like(c_i), [0] * n
    for r, row in enumerate(mask):
        models = []
        for i in map(int, torch.as_tensor(row).nonzero().flatten()):
            one = torch.tensor([i])
            oracle = problem.oracle(one, seed=seed, round=r)
            z = x[None].clone()
            for step in range(tau):
                g = oracle(z, step)
                acc[i] += g[0]
                count[i] += 1
                z = z - lr * (g - c_i[i] + c)
            models.append(z[0])
        if models:
            x = torch.stack(models).mean(0)
        if (r + 1) % period == 0:
            x = anchor + gamma * (x - anchor)
            anchor = x.clone()
            for i in range(n):
                if count[i]:
                    c_i[i], acc[i], count[i] = acc[i] / count[i], 0.0, 0
            c = c_i.mean(0)
    return x


@pytest.mark.parametrize("participation", ["cyclic:groups=3", "bernoulli:p=0.3", "markov"])
def test_amplified_scaffold_lazy_refresh_is_the_authors_period_end_refresh(problems, participation):
    problem = problems["ridge_sgd"]
    process = make_participation(participation, problem.num_clients, seed=1)
    mask = process.mask(20)
    spec = "amplified_scaffold:amplification=1.5,period=3"
    ours = final_model(problem, spec, participation, rounds=20, lr=2e-3, local_steps=2)
    theirs = eager_amplified_scaffold(problem, mask, lr=2e-3, tau=2, gamma=1.5, period=3, seed=2)
    torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-13)


def test_amplified_scaffold_period_comes_from_the_cycle(problems):
    problem = problems["ridge"]
    algorithm = make_algorithm("amplified_scaffold")
    assert algorithm.prepare(problem, make_participation("cyclic:groups=3", 6)).period == 3
    assert algorithm.prepare(problem, make_participation("reshuffled_cyclic:groups=2", 6)).period == 2
    assert algorithm.prepare(problem, make_participation("sine:period=7", 6)).period == 7
    assert algorithm.prepare(problem, make_participation("bernoulli", 6)).period == 1
    assert make_algorithm("amplified_scaffold:period=5").prepare(problem, make_participation("cyclic", 6)).period == 5


def test_amplified_scaffold_c_is_the_mean_of_the_refreshed_c_i_after_every_period(problems):
    problem = problems["ridge"]
    algorithm = make_algorithm("amplified_scaffold:period=3", lr=2e-3, local_steps=2)

    def check(r, active, before, state):
        if (r + 1) % 3:
            return
        # At a period's end every client's gathered gradients (of this period or an earlier one it
        # has not come back since) are its refreshed c_i; the others keep theirs.
        clients = state.clients
        gathered = (clients.count > 0)[:, None]
        refreshed = torch.where(gathered, clients.acc / clients.count.clamp(min=1)[:, None], clients.c)
        torch.testing.assert_close(state.server.c, refreshed.mean(0), rtol=1e-12, atol=1e-12)
        assert float(state.server.pending.abs().max()) == 0.0

    run_rounds(algorithm, problem, "bernoulli:p=0.3", 30, check)


def eager_fedpbc(problem, mask, *, lr, tau, gamma):
    """The authors' loop (varying_pbc.py): every client trains every round; the linked ones are
    averaged and receive the average at the end of the round. Full gradients."""
    n = problem.num_clients
    x = problem.initial_point().clone()
    local = x.expand(n, -1).clone()
    everyone = torch.arange(n)
    for r, row in enumerate(mask):
        oracle = problem.oracle(everyone, seed=0, round=r)
        z = local.clone()
        for step in range(tau):
            z = z - lr * oracle(z, step)
        local = local + gamma * (z - local)
        linked = torch.as_tensor(row)
        if linked.any():
            x = local[linked].mean(0)
            local[linked] = x
    return x


@pytest.mark.parametrize("participation", ["bernoulli:p=0.3", "markov", "cyclic:groups=3"])
@pytest.mark.parametrize("gamma", [1.0, 1.5])
def test_fedpbc_catch_up_is_every_client_training_every_round(problems, participation, gamma):
    problem = problems["ridge"]
    process = make_participation(participation, problem.num_clients, seed=1)
    ours = final_model(problem, f"fedpbc:server_lr={gamma}", participation, rounds=20, lr=2e-3, local_steps=2)
    theirs = eager_fedpbc(problem, process.mask(20), lr=2e-3, tau=2, gamma=gamma)
    torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-13)


def eager_debiasing_fedavg(problem, mask, *, lr, tau):
    """Debiasing FedAvg in plain Python: p_i = (participations in rounds 0..r) / (r + 1), and
    x += sum_{S_r} Delta_i / (N p_i)."""
    n = problem.num_clients
    x = problem.initial_point().clone()
    taken = [0] * n
    for r, row in enumerate(mask):
        active = [i for i in range(n) if row[i]]
        for i in active:
            taken[i] += 1
        step = torch.zeros_like(x)
        for i in active:
            oracle = problem.oracle(torch.tensor([i]), seed=2, round=r)
            z = x[None].clone()
            for k in range(tau):
                z = z - lr * oracle(z, k)
            step += (z[0] - x) / (n * taken[i] / (r + 1))
        x = x + step
    return x


@pytest.mark.parametrize("participation", ["bernoulli:p=0.25", "markov", "cyclic:groups=3"])
def test_debiasing_fedavg_weights_are_the_participation_frequencies(problems, participation):
    problem = problems["ridge_sgd"]
    mask = make_participation(participation, problem.num_clients, seed=1).mask(30).tolist()
    ours = final_model(problem, "debiasing_fedavg", participation, rounds=30, lr=2e-3, local_steps=2)
    torch.testing.assert_close(ours, eager_debiasing_fedavg(problem, mask, lr=2e-3, tau=2), rtol=1e-10, atol=1e-13)

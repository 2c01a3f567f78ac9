"""The convex problem bank: exact optima, gradients against autograd, unbiased minibatches."""
import pytest
import torch

from focusfl.errors import ConfigError
from focusfl.problems import make_problem

SPECS = ["ridge", "ridge:hetero=1,dim=20,samples=30", "logistic", "logistic:hetero=0,dim=8,reg=0.1"]


def _autograd_client_loss(problem, i, x):
    a, b = problem.features[i], problem.targets[i]
    if problem.name == "ridge":
        return ((a @ x - b) ** 2).sum() + problem.reg * (x @ x)
    return torch.nn.functional.softplus(-b * (a @ x)).mean() + problem.reg * (x @ x)


@pytest.mark.parametrize("spec", SPECS)
def test_x_star_is_a_stationary_point(spec):
    problem = make_problem(spec)
    assert float(problem.gradient(problem.x_star).norm()) < 1e-10
    assert problem.metrics(problem.x_star)["rel_error"] == 0.0


@pytest.mark.parametrize("spec", SPECS)
def test_client_gradients_match_autograd(spec):
    problem = make_problem(spec)
    clients = torch.tensor([0, 2, 5])
    x = torch.randn(3, problem.dim, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    grads = problem.client_gradients(x, clients, seed=0, round=0, step=0)
    for row, i in enumerate(clients.tolist()):
        point = x[row].clone().requires_grad_(True)
        (expected,) = torch.autograd.grad(_autograd_client_loss(problem, i, point), point)
        torch.testing.assert_close(grads[row], expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("spec", SPECS)
def test_global_gradient_and_loss_are_client_averages(spec):
    problem = make_problem(spec)
    x = torch.full((problem.dim,), 0.1, dtype=torch.float64, requires_grad=True)
    loss = sum(_autograd_client_loss(problem, i, x) for i in range(problem.num_clients)) / problem.num_clients
    (expected,) = torch.autograd.grad(loss, x)
    torch.testing.assert_close(problem.loss(x.detach()), loss.detach())
    torch.testing.assert_close(problem.gradient(x.detach()), expected)


@pytest.mark.parametrize("spec", SPECS)
def test_a_row_is_the_loss_and_gradient_it_names(spec):
    """A row computes the samples' products once for both (its main cost): the same bits as
    loss(x) and gradient(x), one definition each; and the gradient is the clients' own
    (their oracles' mean) to rounding."""
    problem = make_problem(spec)
    x = torch.randn(problem.dim, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    row = problem.metrics(x)
    assert row["loss"] == float(problem.loss(x))
    assert row["grad_norm"] == float(torch.linalg.vector_norm(problem.gradient(x)))
    clients = torch.arange(problem.num_clients)
    own = problem.client_gradients(x.expand(problem.num_clients, -1), clients, seed=0, round=0, step=0).mean(0)
    torch.testing.assert_close(problem.gradient(x), own, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["ridge", "logistic"])
def test_minibatch_gradients_are_unbiased(name):
    exact = make_problem(f"{name}:clients=4,samples=10,dim=3")
    sampled = make_problem(f"{name}:clients=4,samples=10,dim=3,batch=3")
    clients = torch.arange(4)
    x = torch.ones(4, 3, dtype=torch.float64)
    target = exact.client_gradients(x, clients, seed=0, round=0, step=0)
    draws = torch.stack([sampled.client_gradients(x, clients, seed=0, round=r, step=0) for r in range(4000)])
    spread = draws.std(0) / 4000**0.5
    assert bool(((draws.mean(0) - target).abs() <= 5 * spread + 1e-12).all())


def test_minibatches_depend_on_seed_round_and_step():
    problem = make_problem("ridge:batch=5")
    clients = torch.arange(3)
    x = torch.ones(3, problem.dim, dtype=torch.float64)
    base = problem.client_gradients(x, clients, seed=0, round=0, step=0)
    assert torch.equal(base, problem.client_gradients(x, clients, seed=0, round=0, step=0))
    for kwargs in ({"seed": 1, "round": 0, "step": 0}, {"seed": 0, "round": 1, "step": 0}, {"seed": 0, "round": 0, "step": 1}):
        assert not torch.equal(base, problem.client_gradients(x, clients, **kwargs))


def test_data_depends_on_problem_seed_only():
    assert torch.equal(make_problem("ridge").features, make_problem("ridge").features)
    assert not torch.equal(make_problem("ridge").features, make_problem("ridge:seed=1").features)


def test_hetero_moves_client_optima_apart():
    def spread(problem):
        optima = [torch.linalg.lstsq(problem.features[i], problem.targets[i]).solution for i in range(problem.num_clients)]
        return float(torch.stack(optima).std(0).norm())

    assert spread(make_problem("ridge:samples=200,dim=10,hetero=1")) > 5 * spread(make_problem("ridge:samples=200,dim=10"))


@pytest.mark.parametrize(
    "spec,message",
    [
        ("lasso", "unknown problem"),
        ("ridge:dims=3", "unknown key 'dims'"),
        ("ridge:clients=0", "clients must be >= 1"),
        ("ridge:batch=101", "batch must be in"),
        ("ridge:reg=-1", "reg must be >= 0"),
        ("ridge:dim=abc", "not a valid int"),
    ],
)
def test_bad_problem_specs(spec, message):
    with pytest.raises(ConfigError, match=message):
        make_problem(spec)

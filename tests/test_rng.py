import torch

from focusfl import rng


def test_uniform_is_roughly_uniform_and_deterministic():
    u = rng.uniform(7, 3, torch.arange(200_000), 1)
    assert torch.equal(u, rng.uniform(7, 3, torch.arange(200_000), 1))
    counts = torch.histc(u.float(), bins=10, min=0, max=1)
    assert float((counts / 20_000 - 1).abs().max()) < 0.03
    assert 0 <= float(u.min()) and float(u.max()) < 1


def test_coordinates_do_not_commute():
    assert not torch.equal(rng.hash_bits(1, 2, torch.arange(5)), rng.hash_bits(2, 1, torch.arange(5)))


def test_minibatch_of_a_client_does_not_depend_on_the_other_clients():
    sizes = torch.tensor([10, 7, 12])
    together = rng.minibatch_indices(0, 4, torch.tensor([2, 5, 9]), 1, 5, sizes)
    alone = rng.minibatch_indices(0, 4, torch.tensor([5]), 1, 5, sizes[1:2])
    assert torch.equal(together[1], alone[0])


def test_minibatch_indices_are_distinct_and_in_range():
    sizes = torch.tensor([6, 9, 20])
    picks = rng.minibatch_indices(1, 2, torch.tensor([0, 1, 2]), 0, 6, sizes)
    for row, size in zip(picks, sizes):
        assert len(set(row.tolist())) == 6
        assert int(row.max()) < int(size)


def test_empty_client_set_draws_nothing():
    picks = rng.minibatch_indices(0, 0, torch.tensor([], dtype=torch.int64), 0, 4, torch.tensor([], dtype=torch.int64))
    assert picks.shape == (0, 4)

import pytest
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


def _tensor_only_hash(*coords, device=None):
    """The hash as every coordinate a tensor (how hash_bits computed it before Python ints
    were mixed as ints): the bits must not have changed."""
    from focusfl.rng import _MASK32, _SALTS, _mix

    state = None
    for position, coord in enumerate(coords):
        value = torch.as_tensor(coord, dtype=torch.int64, device=device) & _MASK32
        salt = _SALTS[position % len(_SALTS)]
        state = _mix(value ^ salt) if state is None else _mix(state ^ _mix(value ^ salt))
    return state


@pytest.mark.parametrize("coords", [
    (7,), (0, 3), (2**40 + 5, -1, 2**31), (3, 1, torch.arange(5)[:, None], 2, torch.arange(9)[None, :]),
    (torch.arange(4), 11, 12), (-7, torch.tensor(5), 8, 2**32 - 1, 6, 13),
    (123456789, 42, torch.randint(0, 2**31, (6, 1)), 0, 999, torch.arange(3)),
])
def test_python_int_coordinates_hash_as_tensors_do(coords):
    mine = rng.hash_bits(*coords)
    assert mine.dtype == torch.int64
    assert torch.equal(mine, _tensor_only_hash(*coords))


def test_the_hash_under_vmap_takes_the_tensor_path_and_gives_the_same_bits():
    keys = torch.arange(6) * 977
    inside = torch.func.vmap(lambda key: rng.hash_bits(key, 3, torch.arange(4)))(keys)
    assert torch.equal(inside, rng.hash_bits(keys[:, None], 3, torch.arange(4)[None, :]))
    assert torch.equal(inside, _tensor_only_hash(keys[:, None], 3, torch.arange(4)[None, :]))

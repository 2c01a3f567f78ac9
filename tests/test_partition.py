"""Partitions (iid, shards, Dirichlet label skew), label histograms, their plot, and the
label-correlated participation process."""
from __future__ import annotations

import json

import numpy as np
import pytest

from focusfl.data import label_histograms, make_partition
from focusfl.data.partition import ClientRows, natural_partition
from focusfl.data.plots import plot_label_histograms
from focusfl.errors import ConfigError
from focusfl.participation import make_participation
from focusfl.participation.label import LabelParticipation
from focusfl.problems.nn import carve_validation

LABELS = np.repeat(np.arange(10), 200)  # 2,000 samples, 200 per class


def check_is_partition(parts, total):
    joined = np.concatenate(parts)
    assert len(joined) == total and len(np.unique(joined)) == total  # disjoint and complete


def classes_held(parts, labels, share=0.05):
    """Mean number of classes making up more than ``share`` of a client's data."""
    hist = label_histograms(labels, parts, 10)
    return float(np.mean((hist / hist.sum(1, keepdims=True) > share).sum(1)))


def test_iid_is_balanced():
    parts = make_partition("iid", LABELS, 16, seed=0)
    check_is_partition(parts, len(LABELS))
    assert {len(p) for p in parts} == {125}
    assert classes_held(parts, LABELS) > 9


def test_shards_give_few_classes_per_client():
    parts = make_partition("shards", LABELS, 20, seed=0, shards=2)
    check_is_partition(parts, len(LABELS))
    assert {len(p) for p in parts} == {100}
    assert max(len(np.unique(LABELS[p])) for p in parts) <= 3  # two shards, each within 1-2 labels


def test_dirichlet_skew_grows_as_alpha_shrinks():
    skewed = make_partition("dirichlet", LABELS, 20, seed=1, alpha=0.05, min_size=5)
    mild = make_partition("dirichlet", LABELS, 20, seed=1, alpha=100.0, min_size=5)
    for parts in (skewed, mild):
        check_is_partition(parts, len(LABELS))
        assert min(len(p) for p in parts) >= 5
    assert classes_held(skewed, LABELS) < 3 < 8 < classes_held(mild, LABELS)


def test_partitions_are_deterministic_per_seed():
    a = make_partition("dirichlet", LABELS, 8, seed=3, alpha=0.5)
    b = make_partition("dirichlet", LABELS, 8, seed=3, alpha=0.5)
    c = make_partition("dirichlet", LABELS, 8, seed=4, alpha=0.5)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_partition_errors():
    with pytest.raises(ConfigError, match="unknown partition"):
        make_partition("random", LABELS, 4, seed=0)
    with pytest.raises(ConfigError, match="min_size"):
        make_partition("dirichlet", LABELS, 4, seed=0, min_size=1000)
    with pytest.raises(ConfigError, match="alpha"):
        make_partition("dirichlet", LABELS, 4, seed=0, alpha=0.0)


def test_dirichlet_tops_up_when_no_draw_gives_every_client_min_size():
    # CIFAR-10's shape: 50,000 labels in 10 classes; N = 100 at alpha = 0.05 leaves about 8
    # clients empty in every draw, so the closest draw is topped up.
    labels = np.random.default_rng(0).permutation(np.repeat(np.arange(10), 5000))
    parts = make_partition("dirichlet", labels, 100, seed=0, alpha=0.05)
    sizes = [len(p) for p in parts]
    assert min(sizes) >= 10 and sum(sizes) == len(labels)
    assert len(np.unique(np.concatenate(parts))) == len(labels)  # disjoint, nothing lost
    assert classes_held(parts, labels) < 2.5  # the skew stays extreme (N = 32 here: 2.0)
    again = make_partition("dirichlet", labels, 100, seed=0, alpha=0.05)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    tiny = make_partition("dirichlet", LABELS[:400], 4, seed=0, alpha=0.001, min_size=20)  # 2 classes, 4 clients
    assert min(len(p) for p in tiny) >= 20


def test_label_histograms_count_each_class():
    parts = [np.array([0, 1, 200]), np.array([201, 1999])]
    hist = label_histograms(LABELS, parts, 10)
    assert hist.tolist() == [[2, 1, 0, 0, 0, 0, 0, 0, 0, 0], [0, 1, 0, 0, 0, 0, 0, 0, 0, 1]]


def test_histogram_plot_is_written(tmp_path):
    hist = label_histograms(LABELS, make_partition("dirichlet", LABELS, 12, seed=0, alpha=0.1), 10)
    plot_label_histograms(hist, tmp_path / "h.png")
    assert (tmp_path / "h.png").stat().st_size > 5000


# -- label-correlated participation ---------------------------------------------------------------
HIST = np.array([[10, 0, 0], [0, 5, 5], [2, 2, 4], [0, 0, 3]])


def test_label_rates_are_histogram_weighted_phi():
    proc = LabelParticipation(4, seed=0, phi=[0.9, 0.1, 0.5], histograms=HIST)
    expected = np.array([0.9, 0.3, (0.2 * 0.9 + 0.2 * 0.1 + 0.4 * 0.5) / 0.8, 0.5])
    assert np.allclose(proc.nominal_p(), expected)
    mask = proc.mask(20000)
    assert np.allclose(mask.mean(0), expected, atol=0.015)


def test_label_rates_are_clipped():
    proc = LabelParticipation(4, seed=0, phi=[1.0, 0.0, 0.0], low=0.05, high=0.8, histograms=HIST)
    assert proc.nominal_p().tolist() == [0.8, 0.05, 0.25, 0.05]


class HistogramProblem:
    def label_histograms(self):
        return HIST


def test_label_process_is_built_from_the_problem_and_rebuilds():
    proc = make_participation("label", 4, seed=2, problem=HistogramProblem())
    assert len(proc.phi) == 3 and np.all((proc.phi >= 0.05) & (proc.phi <= 0.5))  # default phi
    desc = json.loads(json.dumps(proc.describe()))
    again = make_participation(desc, 4, seed=2, problem=HistogramProblem())
    assert np.array_equal(again.mask(300), proc.mask(300))
    other = make_participation("label", 4, seed=3, problem=HistogramProblem())
    assert not np.array_equal(other.phi, proc.phi)


def test_label_process_errors():
    with pytest.raises(ConfigError, match="needs a problem"):
        make_participation("label", 4, seed=0)
    with pytest.raises(ConfigError, match="one per class"):
        make_participation("label:phi=0.1;0.2", 4, seed=0, problem=HistogramProblem())
    with pytest.raises(ConfigError, match="low <= high"):
        make_participation("label:low=0.5,high=0.2", 4, seed=0, problem=HistogramProblem())
    with pytest.raises(ConfigError, match="histograms"):
        LabelParticipation(3, histograms=HIST)


# -- natural partitions as compressed client rows -----------------------------------------------------
def _natural_by_definition(ids: np.ndarray, clients: int) -> list[np.ndarray]:
    """Client k: the rows holding the k-th smallest distinct id (one array per client)."""
    values = np.unique(ids)
    return [np.flatnonzero(ids == values[k]) for k in range(clients)]


@pytest.mark.parametrize("kind", ["integers", "strings"])
def test_a_natural_partition_is_the_rows_of_each_id_without_a_copy_per_client(kind):
    rng = np.random.default_rng(28)
    ids = rng.integers(0, 40, size=500)
    if kind == "strings":
        ids = np.array([f"writer-{v}" for v in ids])
    table = natural_partition(ids, 30, "writer")  # 40 ids, 30 clients: the last ids are left out
    assert isinstance(table, ClientRows) and len(table) == 30
    expected = _natural_by_definition(ids, 30)
    assert [part.tolist() for part in table] == [part.tolist() for part in expected]
    assert table[7].tolist() == expected[7].tolist() and table.sizes.tolist() == [len(p) for p in expected]
    assert table.rows.size == sum(len(p) for p in expected)  # the rows once, and N + 1 offsets
    assert table.owners().tolist() == np.repeat(np.arange(30), table.sizes).tolist()


def test_a_hundred_thousand_ids_make_two_arrays():
    ids = np.arange(300_000) % 100_000
    table = natural_partition(ids, 100_000, "writer")
    assert table.starts.shape == (100_001,) and table.rows.shape == (300_000,)
    assert table[99_999].tolist() == [99_999, 199_999, 299_999]
    with pytest.raises(ConfigError, match="fewer than"):
        natural_partition(ids, 100_001, "writer")


def test_label_histograms_and_validation_read_client_rows_as_the_list_they_replace():
    rng = np.random.default_rng(5)
    labels = rng.integers(0, 4, size=300)
    ids = rng.integers(0, 25, size=300)
    table = natural_partition(ids, 20, "writer")
    parts = list(table)
    assert np.array_equal(label_histograms(labels, table, 4), label_histograms(labels, parts, 4))
    assert np.array_equal(label_histograms(labels, table, 4),
                          np.stack([np.bincount(labels[p], minlength=4) for p in parts]))
    kept, held = carve_validation(table, 0.3, 9)
    kept_list, held_list = carve_validation(parts, 0.3, 9)
    assert isinstance(kept, ClientRows) and np.array_equal(held, held_list)
    assert [k.tolist() for k in kept] == [k.tolist() for k in kept_list]

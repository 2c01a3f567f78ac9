"""Tests of focusfl.participation: determinism, prefix consistency, marginals, statistics, errors."""
from __future__ import annotations

import json

import numpy as np
import pytest

from focusfl.errors import ConfigError, DataError
from focusfl.participation import (
    PARTICIPATION,
    available_participation,
    delays,
    empirical_p,
    empirical_q,
    make_participation,
    summarize,
)
from focusfl.participation.plots import plot_raster
from focusfl.participation.statistics import last_seen

N = 16
LONG = 20_000

# Every process except trace (which needs a file), with non-default keys where they exist.
SPECS = [
    "full",
    "uniform",
    "uniform:m=5",
    "bernoulli",
    "bernoulli:p=0.05,redraw=true",
    "weighted",
    "weighted:m=3",
    "markov",
    "markov:rho=0.8",
    "cyclic",
    "cyclic:groups=3",
    "reshuffled_cyclic",
    "sine",
    "sine:a=0.8,period=7",
    "banded",
    "banded:width=3,top=0.9,step=0.1",
    "separated",
    "separated:gap=3,p=0.5",
]
DETERMINISTIC = {"full", "cyclic", "cyclic:groups=3"}  # no randomness: every seed gives the same mask


@pytest.fixture(scope="module")
def long_masks():
    """20000-round masks of the random processes, shared by the convergence tests (each costs ~0.5 s)."""
    specs = ["bernoulli", "weighted", "markov", "markov:p=0.3,rho=0.8", "sine", "banded", "uniform"]
    out = {}
    for spec in specs:
        proc = make_participation(spec, N, seed=11)
        out[spec] = (proc, proc.mask(LONG))
    return out


@pytest.fixture
def trace_matrix():
    return (np.random.default_rng(0).random((13, 5)) < 0.4).astype(int)


# -- registry and construction ----------------------------------------------------------------
def test_registry_lists_every_process():
    expected = {
        "full", "uniform", "bernoulli", "weighted", "markov", "cyclic",
        "reshuffled_cyclic", "sine", "banded", "trace", "label", "separated",
    }
    assert set(available_participation()) == expected
    assert all(PARTICIPATION[name].name == name for name in expected)


@pytest.mark.parametrize("spec", SPECS)
def test_mask_shape_dtype_and_active(spec):
    proc = make_participation(spec, N, seed=1)
    mask = proc.mask(40)
    assert mask.shape == (40, N) and mask.dtype == bool
    for r in (0, 7, 39, 300):
        act = proc.active(r)
        assert act.dtype == np.int64
        assert np.array_equal(act, np.flatnonzero(proc.mask(r + 1)[r]))


@pytest.mark.parametrize("spec", SPECS)
def test_describe_is_json_and_rebuilds_the_same_process(spec):
    proc = make_participation(spec, N, seed=5)
    desc = proc.describe()
    assert desc["name"] == spec.split(":")[0]
    rebuilt = make_participation(json.loads(json.dumps(desc)), N, seed=5)
    assert rebuilt.describe() == desc
    assert np.array_equal(rebuilt.mask(200), proc.mask(200))
    nominal = proc.nominal_p()
    assert nominal.shape == (N,) and nominal.dtype == np.float64


# -- determinism and prefix consistency -------------------------------------------------------
@pytest.mark.parametrize("spec", SPECS)
def test_same_seed_same_mask_other_seed_other_mask(spec):
    a = make_participation(spec, N, seed=3).mask(100)
    b = make_participation(spec, N, seed=3).mask(100)
    assert np.array_equal(a, b)
    if spec not in DETERMINISTIC:
        assert not np.array_equal(a, make_participation(spec, N, seed=4).mask(100))


@pytest.mark.parametrize("spec", SPECS)
def test_prefix_consistent_whatever_the_query_order(spec):
    full = make_participation(spec, N, seed=2).mask(700)
    proc = make_participation(spec, N, seed=2)
    assert np.array_equal(proc.mask(30), full[:30])
    assert np.array_equal(proc.active(450), np.flatnonzero(full[450]))  # jumps ahead
    assert np.array_equal(proc.mask(700), full)
    assert np.array_equal(proc.mask(10), full[:10])
    fresh = make_participation(spec, N, seed=2)
    rows = np.array([np.isin(np.arange(N), fresh.active(r)) for r in range(300)])
    assert np.array_equal(rows, full[:300])


def test_mask_returns_a_copy():
    proc = make_participation("bernoulli", N, seed=0)
    m = proc.mask(10)
    m[:] = False
    assert proc.mask(10).any()


# -- marginals ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "spec,tol",
    [("bernoulli", 0.02), ("weighted", 0.02), ("markov", 0.04), ("markov:p=0.3,rho=0.8", 0.03),
     ("sine", 0.02), ("banded", 0.02), ("uniform", 0.02)],
)
def test_empirical_p_converges_to_nominal(long_masks, spec, tol):
    proc, mask = long_masks[spec]
    assert np.max(np.abs(empirical_p(mask) - proc.nominal_p())) < tol


def test_markov_lag_one_autocorrelation_is_rho(long_masks):
    for spec in ("markov", "markov:p=0.3,rho=0.8"):
        proc, mask = long_masks[spec]
        x = mask.astype(float)
        x -= x.mean(axis=0)
        corr = (x[1:] * x[:-1]).mean(axis=0) / x.var(axis=0)
        assert np.max(np.abs(corr - proc.rho)) < 0.06, spec
    assert len(set(np.round(long_masks["markov"][0].rho, 6))) == N  # heterogeneous by default


def test_default_preset_and_shared_rates():
    bern = make_participation("bernoulli", 100, seed=9)
    p = bern.nominal_p()
    assert np.all((p >= 0.1) & (p <= 0.9))
    assert 80 <= np.sum(p <= 0.3)  # 90 clients from U(0.1, 0.3), 10 from U(0.1, 0.9)
    assert np.array_equal(make_participation("markov", 100, seed=9).p, p)
    assert np.array_equal(make_participation("sine", 100, seed=9).p, p)
    rho = make_participation("markov", 100, seed=9).rho
    assert np.all((rho >= 0.5) & (rho <= 0.9))
    assert np.array_equal(make_participation("markov:p=0.5", 100, seed=9).rho, rho)


def test_p_as_scalar_or_list():
    assert np.allclose(make_participation("bernoulli:p=0.25", 4).nominal_p(), 0.25)
    proc = make_participation("bernoulli:p=0.1;0.2;0.3;1", 4)
    assert np.allclose(proc.nominal_p(), [0.1, 0.2, 0.3, 1.0])
    assert proc.mask(50)[:, 3].all()


def test_banded_rates():
    p = make_participation("banded", 60).nominal_p()
    assert np.allclose(p[:11], 0.5) and np.allclose(p[11:22], 0.45) and np.allclose(p[55:], 0.25)
    assert np.allclose(make_participation("banded:step=0.2", 60).nominal_p()[33:], 0.01)


def test_sine_nominal_is_mean_over_period():
    proc = make_participation("sine:p=0.5,a=0.3,period=20", 3)
    assert np.allclose(proc.nominal_p(), 0.5 * 0.7)  # the sine averages out over a full period


# -- set structure -----------------------------------------------------------------------------
@pytest.mark.parametrize("spec,m", [("uniform", N // 4), ("uniform:m=7", 7), ("weighted", N // 4),
                                    ("weighted:m=16", 16), ("weighted:m=1", 1)])
def test_fixed_size_processes_have_exactly_m_active(spec, m):
    assert np.all(make_participation(spec, N, seed=1).mask(500).sum(axis=1) == m)


def test_weighted_nominal_exact_cases():
    q = [1, 2, 3, 4]
    one = make_participation({"name": "weighted", "m": 1, "q": q}, 4)
    assert np.allclose(one.nominal_p(), np.array(q) / 10)
    assert np.allclose(make_participation({"name": "weighted", "m": 4, "q": q}, 4).nominal_p(), 1)
    assert np.allclose(make_participation({"name": "weighted", "m": 2, "q": [1] * 4}, 4).nominal_p(), 0.5)
    heavy = make_participation({"name": "weighted", "m": 2, "q": q}, 4).nominal_p()
    assert np.isclose(heavy.sum(), 2) and np.all(np.diff(heavy) > 0)


@pytest.mark.parametrize("spec,groups", [("cyclic", 4), ("cyclic:groups=5", 5), ("reshuffled_cyclic", 4),
                                         ("reshuffled_cyclic:groups=3", 3)])
def test_cyclic_covers_every_client_once_per_epoch(spec, groups):
    mask = make_participation(spec, N, seed=0).mask(groups * 30)
    per_epoch = mask.reshape(30, groups, N).sum(axis=1)
    assert np.all(per_epoch == 1)
    sizes = mask.sum(axis=1)
    assert sizes.max() - sizes.min() <= 1


def test_cyclic_groups_are_contiguous():
    mask = make_participation("cyclic:groups=3", 7).mask(3)
    assert mask.astype(int).tolist() == [[1, 1, 1, 0, 0, 0, 0], [0, 0, 0, 1, 1, 0, 0], [0, 0, 0, 0, 0, 1, 1]]


def test_reshuffled_cyclic_changes_order_between_epochs():
    mask = make_participation("reshuffled_cyclic", N, seed=0).mask(40).reshape(10, 4, N)
    assert any(not np.array_equal(mask[0], mask[e]) for e in range(1, 10))


def test_redraw_gives_no_empty_rounds():
    plain = make_participation("bernoulli:p=0.05", 8, seed=0).mask(3000)
    assert np.any(plain.sum(axis=1) == 0)
    proc = make_participation("bernoulli:p=0.05,redraw=true", 8, seed=0)
    mask = proc.mask(3000)
    assert np.all(mask.sum(axis=1) >= 1)
    # Non-empty rounds are kept as they were; only the empty ones are redrawn.
    keep = plain.any(axis=1)
    assert np.array_equal(mask[keep], plain[keep])
    assert np.allclose(proc.nominal_p(), 0.05 / (1 - 0.95**8))


# -- trace -------------------------------------------------------------------------------------
def test_trace_roundtrip_csv_and_npy(tmp_path, trace_matrix):
    csv = tmp_path / "avail.csv"
    lines = ["c0,c1,c2,c3,c4"] + [",".join(map(str, row)) for row in trace_matrix]
    csv.write_text("\n".join(lines) + "\n")
    npy = tmp_path / "avail.npy"
    np.save(npy, trace_matrix.astype(bool))
    for path in (csv, npy):
        proc = make_participation(f"trace:path={path}", 5)
        assert np.array_equal(proc.mask(13), trace_matrix.astype(bool))
        assert proc.nominal_p() is None
        wrapped = proc.mask(30)  # wraps around after the 13 recorded rounds
        assert np.array_equal(wrapped[13:26], wrapped[:13]) and np.array_equal(wrapped[26:], wrapped[:4])
        assert np.array_equal(make_participation(proc.describe(), 5).mask(30), wrapped)


def test_trace_csv_without_header(tmp_path, trace_matrix):
    csv = tmp_path / "t.csv"
    csv.write_text("\n".join(",".join(map(str, row)) for row in trace_matrix))
    assert np.array_equal(make_participation({"name": "trace", "path": str(csv)}, 5).mask(13), trace_matrix)


@pytest.mark.parametrize(
    "content,error",
    [
        ("0,1,0,1,0\n1,1,2,0,0\n", DataError),  # not 0/1
        ("0,1,0,1,0\n1,1,0\n", DataError),  # ragged
        ("0,1,0,1,0\n1,x,0,0,0\n", DataError),  # non-numeric data
        ("0,1,0\n1,1,0\n", DataError),  # wrong number of clients
        ("header\n", DataError),  # no data
    ],
)
def test_bad_trace_files(tmp_path, content, error):
    path = tmp_path / "bad.csv"
    path.write_text(content)
    with pytest.raises(error):
        make_participation(f"trace:path={path}", 5)


def test_bad_trace_paths(tmp_path):
    with pytest.raises(DataError):
        make_participation(f"trace:path={tmp_path / 'missing.csv'}", 5)
    with pytest.raises(ConfigError):
        make_participation("trace", 5)
    txt = tmp_path / "t.txt"
    txt.write_text("0,1\n")
    with pytest.raises(ConfigError):
        make_participation(f"trace:path={txt}", 2)
    bad_npy = tmp_path / "b.npy"
    np.save(bad_npy, np.zeros(5))
    with pytest.raises(DataError):
        make_participation(f"trace:path={bad_npy}", 5)
    garbage = tmp_path / "g.npy"
    garbage.write_bytes(b"not a numpy file")
    with pytest.raises(DataError):
        make_participation(f"trace:path={garbage}", 5)


# -- configuration errors ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "spec",
    [
        "nope",
        "bernoulli:bogus=1",
        "full:m=2",
        "uniform:m=17",
        "uniform:m=0",
        "weighted:m=20",
        "weighted:q=1;2",
        "weighted:q=0",
        "bernoulli:p=0",
        "bernoulli:p=1.5",
        "bernoulli:p=-0.1",
        "bernoulli:p=0.1;0.2",
        "bernoulli:p=abc",
        "bernoulli:redraw=maybe",
        "sine:p=2",
        "sine:a=1.5",
        "sine:period=0",
        "markov:p=0",
        "markov:rho=1",
        "markov:rho=-0.2",
        "cyclic:groups=17",
        "cyclic:groups=0",
        "reshuffled_cyclic:groups=40",
        "banded:floor=0,step=0.5",
        "banded:top=1.5",
        "banded:width=0",
        {"name": "uniform", "m": 2.5},
    ],
)
def test_invalid_specs_raise_config_error(spec):
    with pytest.raises(ConfigError) as info:
        make_participation(spec, N)
    assert "\n" not in str(info.value)


def test_invalid_arguments():
    with pytest.raises(ConfigError):
        make_participation("full", 0)
    with pytest.raises(ConfigError):
        make_participation("full", N, seed=-1)
    with pytest.raises(ConfigError):
        make_participation("full", N).mask(-1)


# -- statistics --------------------------------------------------------------------------------
def test_delays_full_participation_is_zero():
    assert np.all(delays(np.ones((50, 6), dtype=bool)) == 0)
    stats = summarize(make_participation("full", 6).mask(50))
    assert stats.tau_max == 0 and stats.tau_avg == 0 and stats.empty_rounds == 0 and stats.mean_active == 6


@pytest.mark.parametrize("groups", [1, 2, 4, 5])
def test_delays_cyclic_is_groups_minus_one(groups):
    tau = delays(make_participation(f"cyclic:groups={groups}", 10).mask(60))
    assert np.all(tau[groups - 1:] == groups - 1)
    assert np.array_equal(tau[: groups - 1], np.arange(1, groups))  # unseen clients count r + 1


def test_delays_hand_made_mask():
    mask = np.array(
        [[1, 0, 0],
         [0, 1, 0],
         [1, 0, 0],
         [0, 0, 0],
         [1, 1, 0]],
        dtype=bool,
    )
    # client 2 is never seen: tau(r) = r + 1
    assert delays(mask).tolist() == [1, 2, 3, 4, 5]
    mask[:, 2] = True
    # l_0 = 0,0,2,2,4 ; l_1 = -1,1,1,1,4
    assert delays(mask).tolist() == [1, 1, 1, 2, 0]
    assert last_seen(mask)[:, 1].tolist() == [-1, 1, 1, 1, 4]


def test_delays_blocked_equals_naive():
    mask = np.random.default_rng(1).random((9000, 7)) < 0.05  # crosses the 4096-round blocks
    last = np.full(7, -1)
    naive = []
    for r, row in enumerate(mask):
        last = np.where(row, r, last)
        naive.append(int(np.max(r - last)))
    assert delays(mask).tolist() == naive


def test_empirical_q_sums_to_non_empty_fraction():
    mask = make_participation("bernoulli:p=0.1", 8, seed=0).mask(2000)
    q = empirical_q(mask)
    empty = np.mean(mask.sum(axis=1) == 0)
    assert empty > 0
    assert np.isclose(q.sum(), 1 - empty)
    assert np.allclose(empirical_q(np.ones((10, 4), dtype=bool)), 0.25)
    assert np.allclose(empirical_q([[1, 0], [1, 1], [0, 0]]), [1.5 / 3, 0.5 / 3])


def test_summarize_fields_and_dict():
    mask = np.array([[1, 0], [0, 0], [1, 1]], dtype=bool)
    stats = summarize(mask)
    assert np.allclose(stats.p, [2 / 3, 1 / 3])
    assert stats.empty_rounds == 1 and np.isclose(stats.mean_active, 1.0)
    assert stats.tau.tolist() == [1, 2, 0] and stats.tau_max == 2 and np.isclose(stats.tau_avg, 1.0)
    d = json.loads(json.dumps(stats.to_dict(per_round=True)))
    assert d["tau"] == [1, 2, 0] and d["rounds"] == 3 and d["clients"] == 2
    empty = summarize(np.zeros((0, 3), dtype=bool))
    assert empty.tau_max == 0 and empty.tau.size == 0
    with pytest.raises(ConfigError):
        summarize(np.zeros(5))


# -- plots -------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["raster.png", "sub/raster.pdf"])
def test_plot_raster_writes_file(tmp_path, name):
    mask = make_participation("markov", 12, seed=0).mask(80)
    out = plot_raster(mask, tmp_path / name, title="markov")
    assert out.exists() and out.stat().st_size > 0


def test_plot_raster_rejects_unknown_extension(tmp_path):
    with pytest.raises(ConfigError):
        plot_raster(np.ones((3, 3), dtype=bool), tmp_path / "r.jpg2")

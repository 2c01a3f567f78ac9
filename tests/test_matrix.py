"""focusfl.matrix.stochastic and .sequences: the matrices of Figure 1, the checks, the sequences,
and the `focusfl matrices` pictures."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from focusfl.cli import main
from focusfl.errors import ConfigError
from focusfl.matrix import (
    A,
    C,
    D,
    R,
    W,
    fedavg_mixing_matrix,
    is_column_stochastic,
    is_doubly_stochastic,
    is_row_stochastic,
    nodes_from_mask,
    stochasticity,
)
from focusfl.matrix.sequences import fedavg_sequence, focus_sequence, pushsum_sequence
from focusfl.matrix.stochastic import pushsum_pull_matrix, pushsum_push_matrix

# The paper's Figure 1 (N = 4 clients, S = {1, 3}).
FIG1_R = [[1, 0, 0, 0, 0], [1, 0, 0, 0, 0], [0, 0, 1, 0, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 1]]
FIG1_A = [[0, .5, 0, .5, 0], [0, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 0, 1]]
FIG1_C = [[1, 1, 0, 1, 0], [0, 0, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 0, 0, 0], [0, 0, 0, 0, 1]]
T = 1 / 3
FIG1_W = [[T, T, 0, T, 0], [T, 2 * T, 0, 0, 0], [0, 0, 1, 0, 0], [T, 0, 0, 2 * T, 0], [0, 0, 0, 0, 1]]


def as_list(m: torch.Tensor) -> np.ndarray:
    return m.numpy()


def test_figure1_matrices_are_built_exactly():
    np.testing.assert_allclose(as_list(R([1, 3], 4)), FIG1_R)
    np.testing.assert_allclose(as_list(A([1, 3], 4)), FIG1_A)
    np.testing.assert_allclose(as_list(C([3, 1], 4)), FIG1_C)
    np.testing.assert_allclose(as_list(W([1, 3], 4, weight=1 / 3)), FIG1_W, atol=1e-15)


def test_text_formula_of_w_uses_one_over_the_set_size():
    w = as_list(W([1, 3], 4))
    assert w[0, 1] == w[1, 0] == 0.5 and w[0, 0] == 0.0 and w[1, 1] == 0.5
    assert is_doubly_stochastic(w)


@pytest.mark.parametrize("active", [[], [2], [1, 3], [1, 2, 3, 4, 5]])
def test_stochasticity_of_every_matrix(active):
    n = 5
    assert stochasticity(R(active, n)) in ("row", "doubly")
    assert is_row_stochastic(A(active, n))
    assert is_column_stochastic(C(active, n))
    assert stochasticity(W(active, n)) == "doubly"
    assert is_row_stochastic(fedavg_mixing_matrix(active, n))
    assert torch.equal(C(active, n), R(active, n).T)
    if active:
        assert stochasticity(R(active, n)) == "row" and stochasticity(C(active, n)) == "column"
        assert is_column_stochastic(pushsum_pull_matrix(active, n, 0.5 / n))
        assert is_column_stochastic(pushsum_push_matrix(active, n, 0.5))
        assert not is_row_stochastic(pushsum_push_matrix(active, n, 0.5))


def test_empty_set_keeps_everything():
    eye = torch.eye(4, dtype=torch.float64)
    for build in (R, A, C, W):
        assert torch.equal(build([], 3), eye)
    # FedAvg's condensed form: every node copies the unchanged server.
    np.testing.assert_allclose(as_list(fedavg_mixing_matrix([], 3)), np.tile([1.0, 0, 0, 0], (4, 1)))


def test_fedavg_mixing_is_pull_all_after_average():
    n, active = 5, [2, 5]
    pull_all = R(range(1, n + 1), n)
    torch.testing.assert_close(fedavg_mixing_matrix(active, n), pull_all @ A(active, n))


def test_average_with_server_lr_and_weights_keeps_row_sums():
    m = A([1, 2], 3, weights=[0.25, 0.25], server_lr=3.0)
    np.testing.assert_allclose(m.sum(1).numpy(), 1.0)
    assert not is_row_stochastic(m)  # a negative server entry
    assert stochasticity(np.array([[0.5, 0.6], [0.5, 0.4]])) == "column"
    assert stochasticity(np.array([[0.5, 0.6], [0.4, 0.4]])) == "none"


def test_d_switches_clients_and_optionally_the_server():
    assert torch.equal(torch.diagonal(D([2], 3)), torch.tensor([0.0, 0, 1, 0], dtype=torch.float64))
    assert torch.diagonal(D([2], 3, server=True))[0] == 1.0


@pytest.mark.parametrize("bad", [[0], [5], [1, 1]])
def test_invalid_active_sets_are_config_errors(bad):
    with pytest.raises(ConfigError):
        R(bad, 4)


def test_nodes_from_mask_shifts_to_paper_numbering():
    assert nodes_from_mask([True, False, True]) == [1, 3]


def test_fedavg_sequence_places_pull_and_average():
    mask = np.array([[1, 0, 1], [0, 0, 0]], dtype=bool)
    seq = list(fedavg_sequence(mask, 3))
    assert [it.k for it in seq] == list(range(6))
    eye = torch.eye(4, dtype=torch.float64)
    assert torch.equal(seq[0].R, R([1, 3], 3)) and torch.equal(seq[0].A, eye)
    assert torch.equal(seq[1].R, eye) and torch.equal(seq[1].A, eye)
    assert torch.equal(seq[2].A, A([1, 3], 3)) and torch.equal(seq[2].D, D([1, 3], 3))
    assert all(torch.equal(it.R, eye) and torch.equal(it.A, eye) for it in seq[3:])  # empty round


def test_focus_sequence_pull_first_push_last_and_server_step():
    mask = np.array([[1, 1], [0, 0], [0, 1]], dtype=bool)
    seq = list(focus_sequence(mask, 2))
    assert torch.equal(seq[0].R, R([1, 2], 2)) and torch.equal(seq[1].C, C([1, 2], 2))
    assert seq[0].D[0, 0] == 1 and seq[1].D[0, 0] == 0
    assert seq[2].D[0, 0] == 1  # Algorithm 1 steps the server after the empty round too
    skipping = list(focus_sequence(mask, 2, skip_empty=True))
    assert skipping[4].D[0, 0] == 0  # ... the authors' code does not
    single = list(focus_sequence(mask, 1))
    assert torch.equal(single[0].R, R([1, 2], 2)) and torch.equal(single[0].C, C([1, 2], 2))


def test_pushsum_sequence_has_tau_plus_one_iterations_per_round():
    mask = np.array([[1, 0], [0, 1]], dtype=bool)
    seq = list(pushsum_sequence(mask, 2, share=0.25, fraction=0.5))
    assert len(seq) == 6 and [it.t for it in seq[:3]] == [0, 1, 2]
    assert torch.equal(seq[0].C, pushsum_pull_matrix([1], 2, 0.25))
    assert torch.equal(seq[2].C, pushsum_push_matrix([1], 2, 0.5))
    assert all(is_column_stochastic(it.C) for it in seq)


def test_matrices_command_writes_figures_1_to_3(tmp_path, capsys):
    out = tmp_path / "pictures"
    assert main(["matrices", "--clients", "4", "--active", "1,3", "--out", str(out)]) == 0
    for stem in ("figure1_stochastic_matrices", "figure2_fedavg", "figure3_focus"):
        for suffix in (".png", ".pdf"):
            assert (out / f"{stem}{suffix}").stat().st_size > 1000
    saved = json.loads((out / "matrices.json").read_text())
    np.testing.assert_allclose(saved["R(S)"], FIG1_R)
    np.testing.assert_allclose(saved["A(S)"], FIG1_A)
    np.testing.assert_allclose(saved["C(S)"], FIG1_C)
    np.testing.assert_allclose(saved["W(S)"], FIG1_W, atol=1e-15)
    assert "figure3_focus.pdf" in capsys.readouterr().out


@pytest.mark.parametrize("active", ["1,9", "x", "0"])
def test_matrices_command_rejects_bad_sets_without_output(tmp_path, capsys, active):
    out = tmp_path / "pictures"
    assert main(["matrices", "--clients", "4", "--active", active, "--out", str(out)]) == 2
    assert "focusfl: error:" in capsys.readouterr().err
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_matrices_command_draws_short_clients_as_typed(tmp_path):
    """`focusfl matrices --steps`: one FedAvg round whose clients stop early; D_k switches the
    finished ones off, stretch by stretch; bad counts are one line and write nothing (in this process)."""
    from cli_harness import run_cli, run_main

    from focusfl.matrix.pictures import live_stretches

    assert live_stretches([4, 1, 2]) == [(0, 0, 3), (1, 1, 2), (2, 3, 1)]
    assert live_stretches([3, 3]) == [(0, 2, 2)]
    proc = run_cli("matrices", "--clients", "4", "--active", "1,3", "--steps", "3,1", "--out", "pictures", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "pictures"
    assert (out / "figure4_short_clients.png").stat().st_size > 1000
    stretches = json.loads((out / "matrices.json").read_text())["D_k per stretch"]
    assert [np.diag(d).tolist() for d in stretches] == [[0, 1, 0, 1, 0], [0, 1, 0, 0, 0]]
    assert json.loads((out / "config.json").read_text())["steps"] == [3, 1]
    for bad in ("3", "3,0", "3,x"):
        proc = run_main("matrices", "--active", "1,3", "--steps", bad, "--out", "bad", cwd=tmp_path)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--steps" in proc.stderr
        assert not (tmp_path / "bad").exists()

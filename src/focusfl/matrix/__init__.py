"""The stochastic-matrix framework of the FOCUS paper (sections 3-4, appendices C-D).

- :mod:`.stochastic`: R(S), A(S), C(S), W(S), D(S) over nodes 0..N (0 = server) and the
  row/column/doubly-stochastic checks.
- :mod:`.sequences`: the time-varying sequences R_k, A_k, C_k, D_k, W_k of FedAvg, FOCUS and
  push-sum for any participation mask (index conventions in its docstring).
- :mod:`.engines`: matrix-form FedAvg, FOCUS and push-sum: single-index recursions on
  (N+1) x d stacks that reproduce the per-client algorithms, also with per-client step counts.
- :mod:`.bias`: q_i, E[matrices], the participation-weighted target and delta_q^2.
- :mod:`.pictures`: the paper's Figures 1-3 (matplotlib, imported lazily).

See docs/framework.md.
"""
from .bias import (
    ExpectedMatrices,
    ParticipationWeights,
    client_quadratics,
    expected_matrices,
    participation_weights,
    sampling_bias,
    weighted_target,
)
from .engines import (
    IterationView,
    MatrixRun,
    fedavg_matrix,
    fedavg_mixing,
    focus_matrix,
    pushsum_matrix,
    pushsum_tracking_matrix,
    run_matrix_form,
    work_steps,
)
from .sequences import fedavg_mixing_sequence, fedavg_sequence, focus_sequence, pushsum_sequence
from .stochastic import (
    A,
    C,
    D,
    R,
    W,
    average_matrix,
    doubly_stochastic_matrix,
    fedavg_mixing_matrix,
    is_column_stochastic,
    is_doubly_stochastic,
    is_row_stochastic,
    local_update_mask,
    nodes_from_mask,
    pull_matrix,
    push_matrix,
    stochasticity,
)

__all__ = [
    "A", "C", "D", "R", "W",
    "ExpectedMatrices", "IterationView", "MatrixRun", "ParticipationWeights",
    "average_matrix", "client_quadratics", "doubly_stochastic_matrix", "expected_matrices",
    "fedavg_matrix", "fedavg_mixing", "fedavg_mixing_matrix", "fedavg_mixing_sequence",
    "fedavg_sequence", "focus_matrix", "focus_sequence", "is_column_stochastic",
    "is_doubly_stochastic", "is_row_stochastic", "local_update_mask", "nodes_from_mask",
    "participation_weights", "pull_matrix", "push_matrix", "pushsum_matrix", "pushsum_sequence",
    "pushsum_tracking_matrix", "run_matrix_form", "sampling_bias", "stochasticity", "weighted_target",
    "work_steps",
]

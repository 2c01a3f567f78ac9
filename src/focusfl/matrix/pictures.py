"""Figures 1-3 of the FOCUS paper: graphs and their stochastic matrices, drawn with matplotlib.

Each panel shows a communication graph (server 0 in the middle, clients on a circle; an arrow
j -> i for every non-zero M[i, j], i != j; self-loops not drawn, as in the paper) above its
matrix. The panel's label ("row stochastic", ...) is computed from the matrix by
:func:`focusfl.matrix.stochastic.stochasticity`, not typed in.

- Figure 1: pull R(S), average A(S), push C(S), doubly stochastic W(S) (with Figure 1's
  weight 1/(|S|+1)).
- Figure 2: one FedAvg round: pull R(S) at t = 0, local updates D(S) at every t, average A(S)
  at t = tau - 1.
- Figure 3: one FOCUS round: pull x with R(S) at t = 0 (the server steps: D[0, 0] = 1), local
  (x, y) updates D(S), push y with the column-stochastic C(S) at t = tau - 1.
- Per-client step counts (``focusfl matrices --steps``, docs/work.md): one FedAvg round whose
  clients take tau_i <= tau steps: R(S), then D_k = D(L_k) for each stretch of iterations with the
  same live set L_k = {i in S : t < tau_i} (finished clients grey: they wait), then A(S). FOCUS
  has the same D_k (with the server's step at t = 0) and C(S) closing the round.
"""
from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path
from typing import NamedTuple, Sequence

import numpy as np
import torch

from ..errors import ConfigError
from .stochastic import (
    active_nodes,
    average_matrix,
    doubly_stochastic_matrix,
    local_update_mask,
    pull_matrix,
    push_matrix,
    stochasticity,
)

MAX_CLIENTS = 12  # beyond this the matrix entries are no longer readable
ACTIVE_COLOR = "#d95f02"
IDLE_COLOR = "#bdbdbd"
SERVER_COLOR = "#1b9e77"
KIND_LABEL = {
    "row": "row stochastic",
    "column": "column stochastic",
    "doubly": "doubly stochastic",
    "none": "not stochastic",
}


class Panel(NamedTuple):
    title: str
    matrix: np.ndarray
    name: str  # the matrix's symbol, e.g. "R(S)"
    dashed: bool = False  # draw server-client links dashed (no communication)
    server_active: bool = False  # highlight the server as computing
    caption: str | None = None  # what the matrix is, when "stochastic or not" is not the point
    highlight: tuple[int, ...] | None = None  # nodes drawn as computing (None: the figure's S)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _positions(num_clients: int) -> np.ndarray:
    """Server at the origin, clients evenly on the unit circle starting at the top."""
    angles = math.pi / 2 - 2 * math.pi * np.arange(num_clients) / num_clients
    clients = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    return np.vstack([[0.0, 0.0], clients])


def _label(value: float) -> str:
    if abs(value) < 1e-15:
        return "0"
    frac = Fraction(value).limit_denominator(64)
    return str(frac) if abs(float(frac) - value) < 1e-12 else f"{value:.2g}"


def draw_graph(ax, matrix: np.ndarray, active: Sequence[int], *, dashed: bool = False, server_active: bool = False) -> None:
    """Nodes and arrows j -> i for the non-zero off-diagonal entries M[i, j]."""
    n = matrix.shape[0] - 1
    pos = _positions(n)
    if dashed:
        for i in range(1, n + 1):
            ax.plot(*zip(pos[0], pos[i]), linestyle="--", color=IDLE_COLOR, linewidth=0.8, zorder=1)
    for i in range(n + 1):
        for j in range(n + 1):
            if i != j and abs(matrix[i, j]) > 1e-15:
                ax.annotate(
                    "", xy=pos[i], xytext=pos[j],
                    arrowprops=dict(arrowstyle="-|>", color="black", shrinkA=11, shrinkB=11, linewidth=1.2,
                                    connectionstyle="arc3,rad=0.12"),
                    zorder=2,
                )
    for node in range(n + 1):
        if node == 0:
            color = ACTIVE_COLOR if server_active else SERVER_COLOR
        else:
            color = ACTIVE_COLOR if node in active else IDLE_COLOR
        ax.scatter(*pos[node], s=420, color=color, edgecolor="black", zorder=3)
        ax.text(*pos[node], str(node), ha="center", va="center", fontsize=10, zorder=4)
    ax.set_xlim(-1.35, 1.35)
    ax.set_ylim(-1.35, 1.35)
    ax.set_aspect("equal")
    ax.axis("off")


def draw_matrix(ax, matrix: np.ndarray, name: str, caption: str | None = None) -> None:
    """The matrix as a grid of exact fractions, non-zero cells shaded, rows/columns 0..N."""
    size = matrix.shape[0]
    ax.imshow(np.abs(matrix) > 1e-15, cmap="Greys", vmin=0, vmax=3.5)
    fontsize = 9 if size <= 6 else 7 if size <= 9 else 5
    for i in range(size):
        for j in range(size):
            ax.text(j, i, _label(matrix[i, j]), ha="center", va="center", fontsize=fontsize)
    ax.set_xticks(range(size))
    ax.set_yticks(range(size))
    ax.tick_params(length=0, labelsize=7)
    ax.xaxis.tick_top()
    ax.set_xlabel(f"{name}: {caption or KIND_LABEL[stochasticity(matrix)]}", fontsize=9)


def render(panels: Sequence[Panel], active: Sequence[int], suptitle: str, paths: Sequence[Path]) -> None:
    """One column per panel: graph on top, matrix below."""
    plt = _pyplot()
    fig, axes = plt.subplots(2, len(panels), figsize=(3.3 * len(panels), 6.6), squeeze=False)
    for col, panel in enumerate(panels):
        shown = active if panel.highlight is None else panel.highlight
        draw_graph(axes[0][col], panel.matrix, shown, dashed=panel.dashed, server_active=panel.server_active)
        axes[0][col].set_title(panel.title, fontsize=10)
        draw_matrix(axes[1][col], panel.matrix, panel.name, panel.caption)
    fig.suptitle(suptitle, fontsize=11)
    fig.tight_layout()
    for path in paths:
        fig.savefig(path)
    plt.close(fig)


def _np(m: torch.Tensor) -> np.ndarray:
    return m.numpy()


def figure1_panels(active: Sequence[int], num_clients: int) -> list[Panel]:
    nodes = active_nodes(active, num_clients)
    figure_weight = 1.0 / (len(nodes) + 1) if nodes else None
    return [
        Panel("Pull model", _np(pull_matrix(nodes, num_clients)), "R(S)"),
        Panel("Push model (row style)", _np(average_matrix(nodes, num_clients)), "A(S)"),
        Panel("Push model (column style)", _np(push_matrix(nodes, num_clients)), "C(S)"),
        Panel("Bi-directional", _np(doubly_stochastic_matrix(nodes, num_clients, weight=figure_weight)), "W(S)"),
    ]


def figure2_panels(active: Sequence[int], num_clients: int) -> list[Panel]:
    nodes = active_nodes(active, num_clients)
    return [
        Panel("Pull model\nk = r tau (t = 0)", _np(pull_matrix(nodes, num_clients)), "R_k = R(S)"),
        Panel("Local update, tau times\nevery t = 0..tau-1", _np(local_update_mask(nodes, num_clients)), "D_k", dashed=True,
              caption="local-update switch"),
        Panel("Push model (row style)\nk = r tau + tau - 1", _np(average_matrix(nodes, num_clients)), "A_k = A(S)"),
    ]


def figure3_panels(active: Sequence[int], num_clients: int) -> list[Panel]:
    nodes = active_nodes(active, num_clients)
    return [
        Panel("Pull model x\nk = r tau (server steps)", _np(pull_matrix(nodes, num_clients)), "R_k = R(S)",
              server_active=True),
        Panel("Local update (x, y) pair\ntau times", _np(local_update_mask(nodes, num_clients)), "D_k", dashed=True,
              caption="local-update switch"),
        Panel("Push gradients y (column style)\nk = r tau + tau - 1", _np(push_matrix(nodes, num_clients)),
              "C_k = C(S)"),
    ]


def live_stretches(steps: Sequence[int]) -> list[tuple[int, int, int]]:
    """(first t, last t, how many of the active clients still step) for each stretch of a round's
    iterations t = 0..tau-1 (tau = max(steps)) with the same live set."""
    tau = max(steps)
    bounds = sorted({0, *(c for c in steps if c < tau)})
    return [(lo, hi - 1, sum(c > lo for c in steps)) for lo, hi in zip(bounds, [*bounds[1:], tau])]


def work_panels(active: Sequence[int], num_clients: int, steps: Sequence[int]) -> list[Panel]:
    """One FedAvg round where active client k takes steps[k] of tau = max(steps) local steps."""
    nodes = active_nodes(active, num_clients)
    if len(steps) != len(nodes) or any(isinstance(c, bool) or int(c) != c or c < 1 for c in steps):
        raise ConfigError(f"--steps needs one count >= 1 per active client ({len(nodes)}), got {list(steps)}")
    tau = max(steps)
    panels = [Panel("Pull model\nk = r tau (t = 0)", _np(pull_matrix(nodes, num_clients)), "R_k = R(S)")]
    for lo, hi, _ in live_stretches(steps):
        live = tuple(i for i, c in zip(nodes, steps) if c > lo)
        when = f"t = {lo}" if lo == hi else f"t = {lo}..{hi}"
        waiting = [i for i in nodes if i not in live]
        title = f"Local update, {when}" + (f"\n{', '.join(map(str, waiting))} finished: waits" if waiting else "\nall of S")
        panels.append(Panel(title, _np(local_update_mask(live, num_clients)), "D_k = D(L_k)", dashed=True,
                            caption="live clients only", highlight=live))
    panels.append(Panel(f"Push model (row style)\nk = r tau + {tau - 1}", _np(average_matrix(nodes, num_clients)),
                        "A_k = A(S)"))
    return panels


WORK_FIGURE = "figure4_short_clients"


def render_work(folder: Path, active: Sequence[int], num_clients: int, steps: Sequence[int]) -> list[Path]:
    """The per-client step-count figure as PNG and PDF in ``folder``; returns the files written."""
    nodes = active_nodes(active, num_clients)
    counts = ", ".join(f"tau_{i} = {c}" for i, c in zip(nodes, steps))
    paths = [folder / f"{WORK_FIGURE}.png", folder / f"{WORK_FIGURE}.pdf"]
    render(work_panels(nodes, num_clients, steps), nodes,
           f"One FedAvg round with per-client step counts ({counts}); FOCUS: the same D_k, C(S) at the end", paths)
    return paths


FIGURES = {
    "figure1_stochastic_matrices": (figure1_panels, "Figure 1: pull, average, push and doubly stochastic matrices"),
    "figure2_fedavg": (figure2_panels, "Figure 2: one FedAvg round as time-varying matrices"),
    "figure3_focus": (figure3_panels, "Figure 3: one FOCUS round: pull x, push y"),
}


def render_all(folder: Path, active: Sequence[int], num_clients: int) -> list[Path]:
    """Figures 1-3 as PNG and PDF in ``folder``; returns the files written."""
    if num_clients > MAX_CLIENTS:
        raise ConfigError(f"pictures are drawn for at most {MAX_CLIENTS} clients, got {num_clients}")
    nodes = active_nodes(active, num_clients)
    label = "{" + ", ".join(map(str, nodes)) + "}"
    written = []
    for stem, (make_panels, title) in FIGURES.items():
        paths = [folder / f"{stem}.png", folder / f"{stem}.pdf"]
        render(make_panels(nodes, num_clients), nodes, f"{title}; S = {label}", paths)
        written.extend(paths)
    return written

"""Figures for image-classification runs.

- :func:`plot_label_histograms`: per-client label histograms as a bubble chart (as in the FOCUS
  paper, seed 002, figure 8).
- :func:`plot_training_curves`: test accuracy and losses against rounds, one line per run.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import numpy as np


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_label_histograms(
    histograms: np.ndarray, path: str | Path, *, title: str | None = None, class_names: list[str] | None = None
) -> None:
    """One bubble per (client, class); its area is proportional to that class's sample count.

    ``histograms`` is ``[N, C]`` (counts). Writes PNG or PDF depending on the suffix.
    """
    plt = _pyplot()
    counts = np.asarray(histograms, dtype=float)
    clients, classes = counts.shape
    cx, cy = np.meshgrid(np.arange(clients), np.arange(classes), indexing="ij")
    largest = counts.max() if counts.size and counts.max() > 0 else 1.0
    # The largest bubble gets about the area of a grid cell.
    cell = (6.0 * 72 / max(clients, classes)) ** 2
    sizes = counts / largest * cell
    width = min(max(6.0, 0.25 * clients + 2.0), 30.0)
    fig, ax = plt.subplots(figsize=(width, 0.35 * classes + 1.8))
    shown = counts.ravel() > 0
    ax.scatter(cx.ravel()[shown], cy.ravel()[shown], s=sizes.ravel()[shown], alpha=0.6, color="tab:blue")
    ax.set_xlabel("client")
    ax.set_ylabel("class")
    ax.set_xlim(-0.7, clients - 0.3)
    ax.set_ylim(-0.7, classes - 0.3)
    if classes <= 20:
        ax.set_yticks(range(classes))
        if class_names is not None:
            ax.set_yticklabels(class_names)
    ax.grid(True, alpha=0.2)
    ax.set_title(title or f"label distribution over {clients} clients (bubble area = samples)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _series(rows: Sequence[dict], key: str) -> tuple[list[float], list[float]]:
    """(rounds, values) of the rows that have a finite ``key`` (train_loss is absent at round 0)."""
    points = [(float(r["round"]), float(r[key])) for r in rows if r.get(key) not in (None, "")]
    points = [(x, y) for x, y in points if math.isfinite(y)]
    return [x for x, _ in points], [y for _, y in points]


def plot_training_curves(
    runs: dict[str, Sequence[dict]], paths: Sequence[str | Path] | str | Path, *, title: str | None = None
) -> None:
    """Two panels: test accuracy, and test/train loss (log scale); one colour per run."""
    plt = _pyplot()
    fig, (acc_ax, loss_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for k, (label, rows) in enumerate(runs.items()):
        colour = f"C{k % 10}"
        if rows and str(rows[-1].get("diverged", "")).lower() in ("true", "1"):  # engine/divergence.py
            label = f"{label} (diverged at round {rows[-1]['round']})"
            for ax, key in ((acc_ax, "test_accuracy"), (loss_ax, "test_loss")):
                xs, ys = _series(rows, key)
                if xs:
                    ax.plot(xs[-1:], ys[-1:], marker="X", markersize=9, color=colour, markeredgecolor="black")
        acc_ax.plot(*_series(rows, "test_accuracy"), color=colour, label=label)
        loss_ax.semilogy(*_series(rows, "test_loss"), color=colour, label=f"{label} (test)")
        loss_ax.semilogy(*_series(rows, "train_loss"), color=colour, linestyle=":", label=f"{label} (train)")
    acc_ax.set_ylabel("test accuracy")
    loss_ax.set_ylabel("loss (solid: test, dotted: participants' train)")
    for ax in (acc_ax, loss_ax):
        ax.set_xlabel("round")
        ax.grid(True, alpha=0.3)
    acc_ax.legend(fontsize="small")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    for path in [paths] if isinstance(paths, (str, Path)) else paths:
        fig.savefig(path)
    plt.close(fig)

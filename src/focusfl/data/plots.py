"""Figures for image-classification runs.

- :func:`plot_label_histograms`: per-client label histograms as a bubble chart (as in the FOCUS
  paper, seed 002, figure 8).
- :func:`plot_training_curves`: test accuracy and losses against rounds, one line per run;
  :func:`plot_training_bands`: the same over seeds, a mean and a min-max band per run.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import numpy as np

from ..plots import _wrap as wrap
from ..plots import chars_across, legend_below, save_figure


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
    # A key: what a bubble's area means, at the largest count and two fractions of it.
    for count in sorted({int(round(largest * f)) for f in (1.0, 0.5, 0.1)} - {0}, reverse=True):
        ax.scatter([], [], s=count / largest * cell, alpha=0.6, color="tab:blue", label=f"{count} samples")
    ax.legend(title="bubble area", loc="upper left", bbox_to_anchor=(1.01, 1.0), labelspacing=1.6, borderpad=1.0,
              frameon=False, fontsize="small")
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
    plot_training_bands({label: [rows] for label, rows in runs.items()}, paths, title=title)


def _seed_band(seeds: Sequence[Sequence[dict]], key: str):
    """(rounds, mean, min, max) of ``key`` over the seeds, at the rounds every seed has finite."""
    series = [dict(zip(*_series(rows, key))) for rows in seeds]
    common = sorted(set.intersection(*(set(s) for s in series))) if series else []
    values = np.array([[s[x] for s in series] for x in common]).reshape(len(common), len(series))
    return common, values.mean(axis=1), values.min(axis=1), values.max(axis=1)


def _diverged_round(seeds: Sequence[Sequence[dict]]) -> int | None:
    """The first round at which a seed's run stopped as diverged (engine/divergence.py), if any."""
    rounds = [int(float(rows[-1]["round"])) for rows in seeds
              if rows and str(rows[-1].get("diverged", "")).lower() in ("true", "1")]
    return min(rounds) if rounds else None


def plot_training_bands(
    runs: dict[str, Sequence[Sequence[dict]]], paths: Sequence[str | Path] | str | Path, *, title: str | None = None
) -> None:
    """Test accuracy, and test/train loss (log scale): per run (label -> one row list per seed)
    the mean over the seeds, with their min-max band when there are several. A run a seed of
    which diverged says so in its label and ends each of its own curves in a cross."""
    plt = _pyplot()
    fig, (acc_ax, loss_ax) = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
    handles, labels = [], []
    for k, (label, seeds) in enumerate(runs.items()):
        colour = f"C{k % 10}"
        diverged = _diverged_round(seeds)
        if diverged is not None:
            label = f"{label} (diverged at round {diverged})"
        if len(seeds) > 1:
            label = f"{label}, {len(seeds)} seeds"
        for ax, key, style, suffix in ((acc_ax, "test_accuracy", "-", ""), (loss_ax, "test_loss", "-", " (test)"),
                                       (loss_ax, "train_loss", ":", " (train)")):
            xs, mean, lo, hi = _seed_band(seeds, key)
            draw = ax.plot if ax is acc_ax else ax.semilogy
            (line,) = draw(xs, mean, color=colour, linestyle=style, label=label + suffix)
            if ax is acc_ax:
                handles.append(line)
                labels.append(label)
            if len(seeds) > 1 and key != "train_loss":
                ax.fill_between(xs, lo, hi, color=colour, alpha=0.2, linewidth=0)
            if diverged is not None and key != "train_loss":
                for rows in seeds:
                    sx, sy = _series(rows, key)
                    if sx and str(rows[-1].get("diverged", "")).lower() in ("true", "1"):
                        ax.plot(sx[-1:], sy[-1:], marker="X", markersize=9, color=colour, markeredgecolor="black")
    acc_ax.set_ylabel("test accuracy" + (" (mean, band: min to max over seeds)" if any(len(s) > 1 for s in runs.values())
                                         else ""))
    loss_ax.set_ylabel("loss (solid: test, dotted: participants' train)")
    for ax in (acc_ax, loss_ax):
        ax.set_xlabel("round")
        ax.grid(True, alpha=0.3)
    if title:
        fig.suptitle(wrap(title, chars_across(10.6, 12)))
    # One legend for both panels, below them: each run once, by its colour (the loss panel's line
    # styles are said in its axis label).
    legend_below(fig, handles, labels, fontsize=8)
    save_figure(fig, [Path(p) for p in ([paths] if isinstance(paths, (str, Path)) else paths)])

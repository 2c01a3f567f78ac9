"""Figures: convergence curves (one run, or panels of several algorithms)."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def curve_metric(rows: Sequence[dict]) -> str:
    """The metric a convergence plot shows: rel_error when x* is known, else loss."""
    return "rel_error" if rows and "rel_error" in rows[0] else "loss"


def _positive(values):
    # Log axes cannot show 0 or inf: clamp exact zeros and drop non-finite tails.
    return [max(v, 1e-300) if math.isfinite(v) else math.nan for v in values]


def plot_curve(rows: Sequence[dict], path: Path, title: str, x: str = "round") -> None:
    plt = _pyplot()
    metric = curve_metric(rows)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.semilogy([r[x] for r in rows], _positive([float(r[metric]) for r in rows]))
    ax.set_xlabel(x.replace("_", " "))
    ax.set_ylabel(metric.replace("_", " "))
    ax.set_title(title)
    ax.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_panels(
    panels: dict[str, dict[str, Sequence[dict]]],
    paths: Sequence[Path],
    *,
    metric: str = "rel_error",
    x: str = "round",
    suptitle: str | None = None,
    xlabel: str | None = None,
) -> None:
    """One panel per scenario, one line per algorithm: ``panels[scenario][algorithm] = rows``."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.2), squeeze=False)
    for ax, (scenario, curves) in zip(axes[0], panels.items()):
        for algorithm, rows in curves.items():
            ax.semilogy(
                [float(r[x]) for r in rows], _positive([float(r[metric]) for r in rows]), label=algorithm
            )
        ax.set_title(scenario)
        ax.set_xlabel(xlabel or x.replace("_", " "))
        ax.grid(True, which="major", alpha=0.3)
    axes[0][0].set_ylabel(r"$\|x - x^\star\| / \|x^\star\|$" if metric == "rel_error" else metric)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6), frameon=False)
    if suptitle:
        fig.suptitle(suptitle)
    fig.tight_layout(rect=(0, 0.12 if len(labels) > 6 else 0.08, 1, 1))
    for path in paths:
        fig.savefig(path)
    plt.close(fig)

"""Step-count raster of a work process: rounds on x, clients on y, shade = tau_{i,r}."""
from __future__ import annotations

from pathlib import Path

import torch

from ..errors import ConfigError
from ..io.figures import figure_metadata
from ..plots import integer_ticks

# Above this many rounds a pixel covers several rounds (as participation/plots.py).
_NEAREST_MAX_ROUNDS = 2000


def work_figure(table: torch.Tensor, local_steps: int, title: str | None = None):
    """A bare matplotlib ``Figure`` of the counts ``table`` [R, N] (dark = all tau steps)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    rounds, clients = table.shape
    if rounds == 0 or clients == 0:
        raise ConfigError(f"work plot: empty table of shape {tuple(table.shape)}")
    fig = Figure(figsize=(8.0, min(8.0, 2.0 + 0.12 * clients)), layout="constrained")
    ax = fig.add_subplot()
    image = ax.imshow(
        table.T.numpy(), aspect="auto", origin="lower", cmap="Greys", vmin=0, vmax=local_steps,
        interpolation="nearest" if rounds <= _NEAREST_MAX_ROUNDS else "antialiased",
        extent=(-0.5, rounds - 0.5, -0.5, clients - 0.5),
    )
    fig.colorbar(image, ax=ax, label="local steps")
    ax.set_xlabel("round")
    ax.set_ylabel("client")
    integer_ticks(ax.yaxis)
    ax.set_title(title if title is not None else f"work: {clients} clients, {rounds} rounds, tau = {local_steps}")
    return fig


def plot_work(table: torch.Tensor, local_steps: int, path: str | Path, title: str | None = None) -> Path:
    """Save :func:`work_figure` to ``path`` (.png, .pdf or .svg), tagged as focusfl's figure."""
    import matplotlib

    path = Path(path)
    fig = work_figure(table, local_steps, title)
    # A fixed salt for the SVG's element ids (random otherwise): the same figure, the same bytes.
    with matplotlib.rc_context({"svg.hashsalt": "focusfl"}):
        fig.savefig(path, dpi=150, metadata=figure_metadata(path))
    return path

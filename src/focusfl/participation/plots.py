"""Availability raster of a participation mask: a quick visual check of a process or a trace."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..io.figures import figure_metadata
from ..plots import integer_ticks
from .statistics import as_mask

_FORMATS = (".png", ".pdf", ".svg")
# Above this many rounds pixels cover several rounds: antialiasing then shows the local rate
# instead of an arbitrary subsample of rounds.
_NEAREST_MAX_ROUNDS = 2000


def raster_figure(mask: Any, title: str | None = None):
    """A matplotlib ``Figure`` of the raster (rounds on x, clients on y, dark = present).

    Drawing only: a bare ``Figure`` (no pyplot state, works headless); :func:`plot_raster` or the
    caller saves it.
    """
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    m = as_mask(mask)
    rounds, clients = m.shape
    if rounds == 0 or clients == 0:
        raise ConfigError(f"raster plot: empty mask of shape {m.shape}")
    height = min(8.0, 2.0 + 0.12 * clients)
    fig = Figure(figsize=(8.0, height), layout="constrained")
    ax = fig.add_subplot()
    ax.imshow(
        m.T,
        aspect="auto",
        origin="lower",
        cmap="Greys",
        vmin=0,
        vmax=1,
        interpolation="nearest" if rounds <= _NEAREST_MAX_ROUNDS else "antialiased",
        extent=(-0.5, rounds - 0.5, -0.5, clients - 0.5),
    )
    ax.set_xlabel("round")
    ax.set_ylabel("client")
    integer_ticks(ax.yaxis)
    ax.set_title(title if title is not None else f"participation: {clients} clients, {rounds} rounds")
    return fig


def plot_raster(mask: Any, path: str | Path, title: str | None = None) -> Path:
    """Save :func:`raster_figure` to ``path`` (.png, .pdf or .svg), tagged as focusfl's figure.

    Returns the path written. The command line gives it a scratch name from
    ``focusfl.io``'s ``figure_files``, which puts the file in place atomically.
    """
    import matplotlib

    path = Path(path)
    if path.suffix.lower() not in _FORMATS:
        raise ConfigError(f"raster plot: {path.name!r} must end in {', '.join(_FORMATS)}")
    fig = raster_figure(mask, title)
    path.parent.mkdir(parents=True, exist_ok=True)
    # A fixed salt for the SVG's element ids (random otherwise): the same figure, the same bytes.
    with matplotlib.rc_context({"svg.hashsalt": "focusfl"}):
        fig.savefig(path, dpi=150, metadata=figure_metadata(path))
    return path

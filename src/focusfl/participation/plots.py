"""Availability raster of a participation mask: a quick visual check of a process or a trace."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .statistics import as_mask

_FORMATS = (".png", ".pdf", ".svg")
# Above this many rounds pixels cover several rounds: antialiasing then shows the local rate
# instead of an arbitrary subsample of rounds.
_NEAREST_MAX_ROUNDS = 2000


def plot_raster(mask: Any, path: str | Path, title: str | None = None) -> Path:
    """Save a raster (rounds on x, clients on y, dark = present) to ``path`` (.png, .pdf or .svg).

    Uses a bare ``Figure`` on the Agg backend, so it works headless and leaves pyplot state alone.
    Returns the path written.
    """
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    m = as_mask(mask)
    path = Path(path)
    if path.suffix.lower() not in _FORMATS:
        raise ConfigError(f"raster plot: {path.name!r} must end in {', '.join(_FORMATS)}")
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
    ax.set_title(title if title is not None else f"participation: {clients} clients, {rounds} rounds")
    path.parent.mkdir(parents=True, exist_ok=True)
    from ..io.figures import figure_metadata

    # A fixed salt for the SVG's element ids (random otherwise): the same figure, the same bytes.
    with matplotlib.rc_context({"svg.hashsalt": "focusfl"}):
        fig.savefig(path, dpi=150, metadata=figure_metadata(path))
    return path

"""Figures: convergence curves (one run, or panels of several algorithms)."""
from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Sequence

from .io.figures import figure_metadata
from .io.figures import figure_metadata as metadata
from .metrics import primary_metric


def pyplot():
    """matplotlib.pyplot on the Agg backend (headless), imported on first use."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def curve_metric(rows: Sequence[dict]) -> str:
    """The metric a convergence plot shows: the rows' primary metric (focusfl/metrics.py),
    rel_error when x* is known, else loss."""
    return (primary_metric(rows[0]) if rows else None) or "loss"


def _positive(values):
    # Log axes cannot show 0 or inf: clamp exact zeros and drop non-finite tails.
    return [max(v, 1e-300) if math.isfinite(v) else math.nan for v in values]


def _values(rows: Sequence[dict], key: str) -> list[float]:
    """``key`` of every row as floats (a missing value, as in a non-finite model's last row, is nan)."""
    return [float(r[key]) if r.get(key) not in (None, "") else math.nan for r in rows]


def ended_early(rows: Sequence[dict]) -> bool:
    """A run whose last row says it diverged (non-finite model or blow-up: engine/divergence.py)."""
    return bool(rows) and str(rows[-1].get("diverged", "")).lower() in ("true", "1")


def _mark_end(ax, xs: list[float], ys: list[float], label: str, color=None, slot: int = 0) -> None:
    """A cross on the last finite point of a run that stopped, with a word saying why."""
    finite = [(x, y) for x, y in zip(xs, ys) if math.isfinite(y) and y > 0]
    if not finite:
        return
    x, y = finite[-1]
    ax.plot([x], [y], marker="X", markersize=9, color=color or "black", markeredgecolor="black", zorder=5)
    # Several runs may stop at the same place: their labels are stacked (slot) to stay legible.
    ax.annotate(label, (x, y), textcoords="offset points", xytext=(6, -10 - 9 * slot), fontsize=7,
                color=color or "black")


def plot_curve(
    rows: Sequence[dict], path: Path, title: str, x: str = "round", stopped: str | None = None
) -> None:
    """One run. A diverged run (its last row says so) is marked where it stopped; so is a run
    that ``stopped`` for another reason (e.g. ``"interrupted"``)."""
    plt = pyplot()
    metric = curve_metric(rows)
    fig, ax = plt.subplots(figsize=(6, 4))
    xs, ys = [float(r[x]) for r in rows], _positive(_values(rows, metric))
    ax.semilogy(xs, ys)
    if ended_early(rows) or stopped:
        _mark_end(ax, xs, ys, f"{stopped or 'diverged'} at round {rows[-1]['round']}")
    ax.set_xlabel(x.replace("_", " "))
    ax.set_ylabel(metric.replace("_", " "))
    ax.set_title(title)
    ax.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, metadata=figure_metadata(path))
    plt.close(fig)


# Distinct colours and markers for a dozen curves: tab10, then ten more that differ from all of
# them in hue or lightness (tab20's light partners put a light blue beside tab10's blue and cyan:
# FOCUS, FedAWE and ProxSkip were hard to tell apart in Figure 4).
MARKERS = "o^sDv<>pPh*X"
LINESTYLES = ["-", "--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1))]
EXTRA_COLORS = ("#000000", "#f032e6", "#469990", "#000075", "#e6b800", "#800000", "#7cb518", "#708090",
                "#ff7f50", "#4b0082")


def _colors() -> list:
    import matplotlib

    return list(matplotlib.colormaps["tab10"].colors) + [matplotlib.colors.to_rgb(c) for c in EXTRA_COLORS]


def palette(count: int) -> list:
    """``count`` distinct RGB colours: tab10, then EXTRA_COLORS, then around again."""
    colors = _colors()
    return [colors[k % len(colors)] for k in range(count)]


def curve_styles(names: Sequence[str], colors: dict | None = None) -> dict[str, tuple]:
    """(colour, marker, linestyle index) of each name, no two alike: the k-th name takes colour
    k of the palette, marker k of MARKERS and, once the colours have gone round, the next line
    style (so 42 curves in one panel are 42 looks, not 20 colours drawn twice). ``colors`` (a
    family's shades) replaces the palette's colour where it names one."""
    cycle = len(_colors())
    shades = palette(len(names))
    return {name: ((colors or {}).get(name, shades[k]), MARKERS[k % len(MARKERS)], (k // cycle) % len(LINESTYLES))
            for k, name in enumerate(names)}


LOG_TICKS = 9


def label_the_top(ax) -> None:
    """On a log y axis, raise the top to a labelled tick above the highest value drawn: without
    it a curve that climbs to 20 ends under an unlabelled stretch above 10^0 (the arbitrary panel
    of Figure 4), and the reader cannot tell how high it went."""
    from matplotlib.ticker import LogLocator

    high = ax.dataLim.y1
    if ax.get_yscale() != "log" or not math.isfinite(high) or high <= 0:
        return
    # A fixed number of ticks, not one fitted to the panel's size at drawing time (which the
    # layout changes later): the ticks checked here are the ticks drawn.
    ax.yaxis.set_major_locator(LogLocator(base=10, numticks=LOG_TICKS))
    for _ in range(3):  # a higher top may change the locator's stride: check the ticks again
        low, top = ax.get_ylim()
        ticks = ax.yaxis.get_major_locator().tick_values(low, top)
        if any(high <= t <= top * (1 + 1e-9) for t in ticks):
            return
        ax.set_ylim(low, min(t for t in ticks if t >= high))


def integer_ticks(axis) -> None:
    """Ticks at whole numbers only, on an axis that counts (clients: there is no client 2.5)."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def coinciding_groups(
    curves: dict[str, Sequence[dict]], metric: str = "rel_error", tolerance: float = 0.01,
    x: str | None = None, x_factor: dict[str, float] | None = None,
) -> list[list[str]]:
    """Groups (of two or more) of curves that coincide on a log axis: equal length and
    |log10 a - log10 b| <= ``tolerance`` (2.3%) at every evaluated point where either is above
    ``FLOOR`` (below it both sit at the float64 rounding floor, whose jitter means nothing).
    Non-finite values must match exactly. With ``x`` the curves must also share their x values
    (times ``x_factor[name]``): curves against floats communicated coincide only if they cost the same.
    """
    logs, xs = {}, {}
    for name, rows in curves.items():
        logs[name] = [math.log10(v) if math.isfinite(v) else v for v in _positive(_values(rows, metric))]
        factor = (x_factor or {}).get(name, 1.0)
        xs[name] = [factor * float(r[x]) for r in rows] if x else None
    def same(name: str, first: str) -> bool:
        mine, other = logs[name], logs[first]
        return len(other) == len(mine) and xs[name] == xs[first] and all(
            (a == b) if not (math.isfinite(a) and math.isfinite(b))
            else (abs(a - b) <= tolerance or max(a, b) <= LOG_FLOOR)
            for a, b in zip(mine, other)
        )

    return _groups(list(logs), same)


def _groups(names: Sequence[str], same) -> list[list[str]]:
    """Groups (of two or more) of ``names``: each joins the first group whose first member it is
    ``same(name, first)`` as, in order."""
    groups: list[list[str]] = []
    for name in names:
        for group in groups:
            if same(name, group[0]):
                group.append(name)
                break
        else:
            groups.append([name])
    return [group for group in groups if len(group) > 1]


FLOOR = 1e-12
LOG_FLOOR = math.log10(FLOOR)


def _wrap(text: str, width: int = 62) -> str:
    return "\n".join(line for part in text.split("\n") for line in (textwrap.wrap(part, width) or [""]))


def chars_across(inches: float, fontsize: float) -> int:
    """About how many characters of ``fontsize`` points fit ``inches`` (a wrapping width)."""
    return max(20, int(inches * 72 / (0.55 * fontsize)))


def legend_below(fig, handles: Sequence, labels: Sequence[str], *, fontsize: float = 8):
    """A legend below the panels that lists every label, in as many columns as the figure's width
    holds; the figure (constrained layout) grows by the legend's height, and by its width when a
    single entry is wider, so that the panels keep their size and nothing is cut.
    Returns the legend."""
    if not labels:
        return None
    renderer = fig.canvas.get_renderer()
    probe = fig.legend(handles, labels, ncol=1, fontsize=fontsize, frameon=False)
    entry = probe.get_window_extent(renderer).width / fig.dpi  # the widest entry, in inches
    probe.remove()
    width, height = fig.get_size_inches()
    # As many columns as the width holds; a long legend (more than LEGEND_ROWS rows) widens the
    # figure to up to four columns rather than growing into a tall strip.
    columns = max(int(width // max(entry, 1e-6)), min(math.ceil(len(labels) / LEGEND_ROWS), 4))
    columns = max(1, min(len(labels), columns))
    legend = fig.legend(handles, labels, loc="outside lower center", ncol=columns, fontsize=fontsize, frameon=False)
    box = legend.get_window_extent(renderer)
    fig.set_size_inches(max(width, box.width / fig.dpi + 0.3), height + box.height / fig.dpi + 0.15)
    return legend


LEGEND_ROWS = 16


def constrained(fig) -> None:
    """Lay the figure out with matplotlib's constrained layout (titles, labels and an outside
    legend get their room inside the canvas)."""
    fig.set_layout_engine("constrained")


def save_figure(fig, paths: Sequence[Path]) -> None:
    """Save ``fig`` at each path, tagged as focusfl's (io/figures.py), then close it."""
    for path in paths:
        fig.savefig(path, metadata=metadata(path))
    pyplot().close(fig)


def plot_panels(
    panels: dict[str, dict[str, Sequence[dict]]],
    paths: Sequence[Path],
    *,
    metric: str = "rel_error",
    x: str = "round",
    suptitle: str | None = None,
    xlabel: str | None = None,
    x_factor: dict[str, float] | None = None,
) -> None:
    """One panel per scenario, one line per algorithm: ``panels[scenario][algorithm] = rows``.

    Every algorithm keeps one colour and marker in every panel, and markers are staggered so
    that curves which coincide stay visible (a coinciding curve after the first of its group is
    also dashed); each panel's x label names the groups that coincide. A diverged run is marked
    with a cross where it stopped. ``x_factor`` multiplies an algorithm's x values (the FOCUS
    notebook's axis counts SCAFFOLD's and ProxSkip's rounds twice).
    """
    plt = pyplot()
    names = list(dict.fromkeys(name for curves in panels.values() for name in curves))
    styles = curve_styles(names)
    colors = {name: style[0] for name, style in styles.items()}
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.6), squeeze=False, layout="constrained")
    handles: dict[str, object] = {}
    for ax, (scenario, curves) in zip(axes[0], panels.items()):
        groups = coinciding_groups(curves, metric, x=x, x_factor=x_factor)
        rank = {name: k for group in groups for k, name in enumerate(group)}
        stopped = 0
        for algorithm, rows in curves.items():
            factor = (x_factor or {}).get(algorithm, 1.0)
            xs = [factor * float(r[x]) for r in rows]
            ys = _positive(_values(rows, metric))
            every = max(1, len(rows) // 8)
            offset = (names.index(algorithm) * every) // max(1, len(names))
            color, marker, style = styles[algorithm]
            (line,) = ax.semilogy(
                xs, ys, color=color, marker=marker, markersize=5,
                markevery=(offset, every), linestyle=LINESTYLES[(style + rank.get(algorithm, 0)) % len(LINESTYLES)],
                linewidth=1.4, label=algorithm,
            )
            handles.setdefault(algorithm, line)
            if ended_early(rows):
                _mark_end(ax, xs, ys, f"{algorithm} diverged", colors[algorithm], slot=stopped)
                stopped += 1
        label_the_top(ax)
        ax.set_title(_wrap(scenario, chars_across(4.8, 12)))
        label = xlabel or x.replace("_", " ")
        if groups:
            label += "\n" + _wrap("coincide: " + "; ".join(" = ".join(group) for group in groups))
        ax.set_xlabel(label, fontsize=9)
        ax.grid(True, which="major", alpha=0.3)
    axes[0][0].set_ylabel(r"$\|x - x^\star\| / \|x^\star\|$" if metric == "rel_error" else metric)
    if suptitle:
        fig.suptitle(_wrap(suptitle, chars_across(5 * len(panels) - 0.4, 12)))
    labels = list(handles)
    legend_below(fig, [handles[n] for n in labels], labels, fontsize=9)
    save_figure(fig, paths)


def plot_band_panels(
    panels: dict[str, dict[str, object]],
    paths: Sequence[Path],
    *,
    xlabel: str,
    ylabel: str,
    log: bool,
    suptitle: str | None = None,
    families: dict[str, str] | None = None,
) -> None:
    """One panel per scenario, one curve per configuration: ``panels[scenario][label]`` is a
    band (``xs``, ``center``, ``lo``, ``hi``, ``seeds``, ``diverged``: sweeps/aggregate.py).
    ``families[label]`` (the algorithm) gives configurations of one algorithm shades of one hue.

    Each configuration keeps its colour and marker in every panel; curves that coincide (on the
    same x values, within 2.3% on a log axis) are drawn dashed after the first of their group,
    with staggered markers. Which coincide is said where it holds: in the legend when there is
    one panel, else under each panel (curves that coincide in one panel may not in another). A
    configuration whose seeds diverged ends in a cross.
    """
    plt = pyplot()
    names = list(dict.fromkeys(name for curves in panels.values() for name in curves))
    styles = curve_styles(names, _family_colors(names, families) if families else None)
    colors = {name: style[0] for name, style in styles.items()}
    columns = min(len(panels), 3)
    rows = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(5.2 * columns, 4.2 * rows + 0.4), squeeze=False,
                             layout="constrained")
    handles: dict[str, object] = {}
    coincide: dict[str, set[str]] = {}
    for ax, (scenario, curves) in zip(axes.flat, panels.items()):
        as_rows = {name: [{"x": x, "y": y} for x, y in zip(b.xs, b.center)] for name, b in curves.items()}
        groups = coinciding_groups(as_rows, "y", x="x") if log else _equal_groups(as_rows)
        rank = {name: k for group in groups for k, name in enumerate(group)}
        for group in groups:
            for name in group:
                coincide.setdefault(name, set()).update(n for n in group if n != name)
        stopped = 0
        for name, b in curves.items():
            if not b.xs:
                continue
            every = max(1, len(b.xs) // 8)
            offset = (names.index(name) * every) // max(1, len(names))
            color, marker, style = styles[name]
            (line,) = ax.plot(b.xs, b.center, color=color, marker=marker, markersize=4.5, markevery=(offset, every),
                              linestyle=LINESTYLES[(style + rank.get(name, 0)) % len(LINESTYLES)], linewidth=1.3)
            if b.seeds > 1:
                ax.fill_between(b.xs, b.lo, b.hi, color=colors[name], alpha=0.15, linewidth=0)
            handles.setdefault(name, line)
            if b.diverged:
                _mark_end(ax, b.xs, b.center if log else [abs(v) + 1e-300 for v in b.center],
                          f"{name} diverged" if b.seeds == 1 else f"{name}: {b.diverged} of {b.seeds} diverged",
                          colors[name], slot=stopped)
                stopped += 1
        if log:
            ax.set_yscale("log")
            label_the_top(ax)
        ax.set_title(_wrap(scenario, chars_across(5.0, 10)), fontsize=10)
        label = xlabel
        if groups and len(panels) > 1:
            label += "\n" + _wrap("coincide: " + "; ".join(" = ".join(group) for group in groups))
        ax.set_xlabel(label, fontsize=9)
        ax.grid(True, which="major", alpha=0.3)
        ax.ticklabel_format(axis="x", style="sci", scilimits=(-3, 4))
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for row in axes:
        row[0].set_ylabel(ylabel, fontsize=9)
    labels = list(handles)
    shown = [label + (f"  (= {', '.join(sorted(coincide[label]))})" if label in coincide and len(panels) == 1 else "")
             for label in labels]
    if suptitle:
        fig.suptitle(_wrap(suptitle, chars_across(5.2 * columns - 0.4, 10)), fontsize=10)
    legend_below(fig, [handles[n] for n in labels], shown, fontsize=8)
    save_figure(fig, paths)


_HUES = ("Blues", "Oranges", "Greens", "Reds", "Purples", "Greys", "YlOrBr", "PuRd", "BuGn", "GnBu")


def _family_colors(names: Sequence[str], families: dict[str, str]) -> dict[str, tuple]:
    """One hue per family, its members from dark to light; with more families than hues (or one
    member each) the plain palette, which tells more curves apart."""
    import matplotlib

    order = list(dict.fromkeys(families.get(n, n) for n in names))
    if len(order) > len(_HUES) or len(order) == len(names):
        return dict(zip(names, palette(len(names))))
    members = {family: [n for n in names if families.get(n, n) == family] for family in order}
    colors = {}
    for family, hue in zip(order, _HUES):
        cmap = matplotlib.colormaps[hue]
        group = members[family]
        for k, name in enumerate(group):
            colors[name] = cmap(0.9 - 0.5 * k / max(1, len(group) - 1)) if len(group) > 1 else cmap(0.75)
    return colors


def _equal_groups(curves: dict[str, Sequence[dict]]) -> list[list[str]]:
    """Curves on a linear axis that coincide: the same x and y values to 1e-9 relative."""
    def same(name: str, first: str) -> bool:
        rows, other = curves[name], curves[first]
        return len(other) == len(rows) and all(
            a["x"] == b["x"] and math.isclose(a["y"], b["y"], rel_tol=1e-9, abs_tol=1e-12)
            for a, b in zip(rows, other)
        )

    return _groups(list(curves), same)

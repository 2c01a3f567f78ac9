"""Figures say what they are: every configuration in the legend and nothing cut, read from the
artists of the figures as they were saved (not by eye); titles name what was run."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest

from focusfl.cli import main

DOCS = Path(__file__).resolve().parents[1] / "docs"


@pytest.fixture
def saved(monkeypatch):
    """Every figure saved while the test runs, kept as it was at its last save."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    figures: list = []
    original = Figure.savefig

    def recording(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if self not in figures:
            figures.append(self)

    monkeypatch.setattr(Figure, "savefig", recording)
    return figures


def legend_texts(fig) -> list[str]:
    return [text.get_text() for legend in fig.legends for text in legend.get_texts()]


def outside(fig) -> list[str]:
    """What reaches beyond the canvas as drawn: each panel with its title, axis and tick labels
    (their tight box holds only what is drawn), the legends' entries and the figure's titles."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()  # a closed figure keeps a bare canvas
    fig.draw_without_rendering()
    width, height = fig.bbox.width, fig.bbox.height
    boxes = [(f"panel {ax.get_title()!r}", ax.get_tightbbox(renderer)) for ax in fig.axes if ax.get_visible()]
    texts = [t for legend in fig.legends for t in legend.get_texts()] + list(fig.texts)
    if fig._suptitle is not None:
        texts.append(fig._suptitle)
    boxes += [(t.get_text(), t.get_window_extent(renderer)) for t in texts if t.get_visible() and t.get_text().strip()]
    return [name for name, box in boxes
            if box is not None and (box.x0 < -1 or box.y0 < -1 or box.x1 > width + 1 or box.y1 > height + 1)]


def configurations(folder: Path) -> list[dict]:
    with open(folder / "summary.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def test_the_documented_work_sweep_lists_every_configuration_uncut(tmp_path, saved):
    out = tmp_path / "work"
    assert main(["sweep", str(DOCS / "examples" / "work.toml"), "--out", str(out)]) == 0
    rows = configurations(out)
    assert len(rows) == 42 and saved
    for fig in saved:
        labels = legend_texts(fig)
        assert len(labels) == len(rows) == len(set(labels)), "every configuration once in the legend"
        for row in rows:
            assert any(label.startswith(f"{row['algorithm']} work={row['work']}") for label in labels), row
        assert outside(fig) == [], "nothing cut"
        assert fig.get_size_inches()[0] * fig.dpi > 520  # sized to its legend, not the 520 pixels it had


def test_a_plot_of_two_sweeps_lists_every_configuration_uncut(tmp_path, saved):
    compare, work = tmp_path / "compare", tmp_path / "work"
    assert main(["sweep", str(DOCS / "examples" / "experiment.toml"), "--out", str(compare)]) == 0
    assert main(["sweep", str(DOCS / "examples" / "work.toml"), "--out", str(work)]) == 0
    saved.clear()
    assert main(["plot", str(compare), str(work), "--out", str(tmp_path / "both.png")]) == 0
    (fig,) = saved
    labels = legend_texts(fig)
    # The panels are the participation processes: a configuration is everything else of a row.
    axes = ("problem", "work", "algorithm", "lr", "local_steps", "rounds")
    curves = lambda folder: {tuple(row.get(k) for k in axes) for row in configurations(folder)}  # noqa: E731
    expected = len(curves(compare)) + len(curves(work))
    assert len(labels) == expected == len(set(labels)) and outside(fig) == []
    assert not any("None" in label for label in labels)  # a sweep without a work axis says nothing of it
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert len(panels) == 3 and all(ax.bbox.height > 150 for ax in panels)  # panels keep their size


def test_training_figures_list_every_run_uncut_and_say_what_ran(tmp_path, saved):
    from focusfl.data.plots import plot_training_bands
    from focusfl.experiments.reproduce_nn import ran_line

    rows = [{"round": 0.0, "test_accuracy": 0.1, "test_loss": 2.3}, {"round": 5.0, "test_accuracy": 0.8,
                                                                        "test_loss": 0.6, "train_loss": 0.7}]
    runs = {f"algorithm number {k} with a long label (lr 0.00123, tuned)": [rows, rows] for k in range(9)}
    problem = {"name": "nn", "model": "hf:/somewhere/my-bert", "data": "hf:/data/my-sentences", "clients": 8,
               "partition": "iid", "batch": 4}
    title = "FedSUM appendix H.7 setting (the paper: bert-base-uncased on SST-2)\n" + ran_line(
        problem, [{"rounds": 5, "seeds": 2}]) + "\nuniform, 2 of 8"
    plot_training_bands(runs, tmp_path / "figure.png", title=title)
    (fig,) = saved
    assert len(legend_texts(fig)) == 9 and outside(fig) == []
    assert "ran: my-bert on my-sentences, 8 clients" in fig._suptitle.get_text()


def test_ridge_figure_legend_lists_every_algorithm_uncut(tmp_path, saved):
    from focusfl.experiments import reproduce_ridge

    panels, _ = reproduce_ridge.run_figure4(rounds=3, setting="notebook")
    reproduce_ridge.plot_figures(panels, tmp_path, "notebook")
    names = {name for curves in panels.values() for name in curves}
    assert saved and all(set(legend_texts(fig)) == names and outside(fig) == [] for fig in saved)


def test_the_suite_figure_lists_every_algorithm_uncut(tmp_path, saved):
    from focusfl.experiments import suite_study

    curve = [(0, 1.0), (10, 1e-3), (20, 1e-9)]
    rows = [{"process": process, "algorithm": algorithm, "curve": curve}
            for process in suite_study.PROCESSES for algorithm in suite_study.ALGORITHMS]
    suite_study.plot_curves(rows, tmp_path / "suite.png", 20)
    (fig,) = saved
    assert legend_texts(fig) == list(suite_study.ALGORITHMS) and outside(fig) == []

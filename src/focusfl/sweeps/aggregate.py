"""A sweep's tables and figures from its run folders: results.csv, summary.csv, figures.

- ``results.csv`` is tidy: one row per run and evaluated round, every axis a column (``problem``,
  ``participation``, ``algorithm`` with its hyperparameters, ``lr``, ``local_steps``, ``rounds``,
  ``eval_every``, ``seed``), then ``run`` (its folder), ``status`` and the run's metrics.csv
  columns, copied as written (full precision): the same runs give the same bytes.
- ``summary.csv`` has one row per configuration (every axis but the seed): over its seeds, the
  mean, sample std, min and max of the final and of the best value of the metric, and of the
  rounds and floats communicated (down + up) to reach each target, over the seeds that reach it
  (``reached_T`` counts them). A diverged run's final value is inf.
- Figures: one panel per problem, participation and work process, one curve per configuration: the
  mean over seeds with a band (std or min-max) against rounds (``figure.*``) and against floats
  communicated (``figure_communication.*``). On a log axis (a positive metric spanning more than
  two decades) the mean and std are those of log10 of the metric: the geometric mean, and a band
  of one geometric standard deviation either side.

``focusfl plot`` draws the same figures from run and sweep folders given on its command line.
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from ..algorithms import ALGORITHMS
from ..errors import ConfigError
from ..io.atomic import open_atomic, write_csv
from ..io.figures import figure_files
from ..metrics import higher_is_better, primary_metric
from ..plots import plot_band_panels
from ..runs.config import configuration_key
from ..runs.folder import CONFIG, METRICS, is_run_folder, read_config, run_state
from ..spec import format_spec
from .layout import FAILURES, RESULTS, RUNS, SUMMARY, WORK_COLUMN, axis_columns

PLOT_POINTS = 600  # points per curve in a sweep's figures (a long run is thinned evenly)
X_AXES = {"round": "round", "comm_up": "floats sent up (clients to server)",
          "comm_total": "floats communicated (down + up)"}


@dataclass
class Series:
    """One run reduced to what tables and figures need. ``group``: the configuration it belongs
    to (runs.config.configuration_key of its record: runs that differ only in their seed share
    it); ``details``: its record's fields and SPEC parameters as text, which a label adds where
    two configurations would otherwise read alike."""

    axes: dict[str, Any]
    status: str
    points: list[tuple[float, float, float, float]] = field(default_factory=list)  # round, comm_up, comm_total, y
    final: float = math.nan
    best: float = math.nan
    reached: dict[float, tuple[float, float]] = field(default_factory=dict)  # target -> (round, floats)
    group: str = ""
    details: dict[str, str] = field(default_factory=dict)

    @property
    def key(self) -> Any:
        """What groups it with its seeds: its configuration (from the record), else its axes."""
        return self.group or tuple((k, v) for k, v in self.axes.items() if k != "seed")


def default_metric(columns: Sequence[str]) -> str:
    """The columns' primary metric (focusfl/metrics.py), or ConfigError when they have none."""
    metric = primary_metric(columns)
    if metric is not None:
        return metric
    raise ConfigError(f"no metric to summarize among the columns {', '.join(columns)}")


def _float(text: Any) -> float:
    try:
        return float(text) if text not in (None, "") else math.nan
    except ValueError:
        return math.nan


class _Reducer:
    """Consumes one run's rows (dicts of strings) in order and fills a Series."""

    def __init__(self, series: Series, metric: str, targets: Sequence[float], stride: int):
        self.series, self.metric, self.targets, self.stride = series, metric, targets, stride
        self.higher = higher_is_better(metric)
        self.count = 0
        self.last: tuple | None = None

    def add(self, row: dict) -> None:
        y = _float(row.get(self.metric))
        comm_up = _float(row.get("comm_up"))
        point = (_float(row.get("round")), comm_up, _float(row.get("comm_down")) + comm_up, y)
        if self.count % self.stride == 0:
            self.series.points.append(point)
        self.count += 1
        self.last = point
        series = self.series
        if math.isfinite(y):
            if math.isnan(series.best) or (y > series.best if self.higher else y < series.best):
                series.best = y
            for target in self.targets:
                if target not in series.reached and (y >= target if self.higher else y <= target):
                    series.reached[target] = (point[0], point[2])

    def finish(self) -> Series:
        series = self.series
        if self.last is not None:
            if series.points[-1] is not self.last:
                series.points.append(self.last)
            series.final = self.last[3]
        if series.status == "diverged":
            series.final = -math.inf if self.higher else math.inf
        return series


def _stride(rounds: Any, eval_every: Any) -> int:
    """Rows kept in a figure: every stride-th, the same for every seed of a configuration."""
    try:
        rows = int(rounds) // max(1, int(eval_every)) + 1
    except (TypeError, ValueError):
        return 1
    return max(1, math.ceil(rows / PLOT_POINTS))


# -- a sweep -------------------------------------------------------------------------------------
def aggregate(experiment, runs, folder: Path, *, band: str, failures: Sequence[dict],
              panel_titles: dict[str, str] | None = None) -> list[str]:
    """Write results.csv, summary.csv (and failures.csv, or remove a stale one) and the
    figures of ``runs`` into ``folder``; returns the names written."""
    axis_names = axis_columns(any(WORK_COLUMN in run.axes for run in runs))
    configuration = {run.key: configuration_key(run.resolved) for run in runs}
    finished = [run for run in runs if run_state(folder / RUNS / run.key, run.key, run.resolved) == "done"]
    columns: list[str] = []
    for run in finished:
        with open(folder / RUNS / run.key / METRICS, newline="") as handle:
            columns.extend(c for c in next(csv.reader(handle), []) if c not in columns)
    written = []
    metric = experiment.metric or (default_metric(columns) if columns else None)
    series = []
    with open_atomic(folder / RESULTS) as handle:
        writer = csv.writer(handle)
        writer.writerow([*axis_names, "run", "status", *columns])
        for run in finished:
            status = read_config(folder / RUNS / run.key).get("status")
            reducer = _Reducer(Series(dict(run.axes), status, group=configuration[run.key]), metric,
                               experiment.targets, _stride(run.axes["rounds"], run.axes["eval_every"])) if metric else None
            head = [_cell(run.axes[c]) for c in axis_names] + [run.key, status]
            with open(folder / RUNS / run.key / METRICS, newline="") as metrics:
                for row in csv.DictReader(metrics):
                    writer.writerow(head + [row.get(c, "") for c in columns])
                    if reducer is not None:
                        reducer.add(row)
            if reducer is not None:
                series.append(reducer.finish())
    written.append(RESULTS)
    failed_keys: dict[str, list] = {}
    for failure in failures:
        failed_keys.setdefault(configuration[failure["run"]], []).append(failure)
    if metric is not None:
        write_csv(folder / SUMMARY, summarize(series, metric, experiment.targets, failed_keys))
        written.append(SUMMARY)
    if failures:
        write_csv(folder / FAILURES, failures, [*axis_names, "run", "error"])
        written.append(FAILURES)
    else:
        (folder / FAILURES).unlink(missing_ok=True)
    if series:
        title = f"{experiment.name}: {_metric_label(metric)}"
        written += plot_series(series, folder, metric=metric, band=band, title=title, panel_titles=panel_titles)
    return written


def _cell(value: Any) -> Any:
    return repr(value) if isinstance(value, float) else ("" if value is None else value)


def _stats(values: Sequence[float], prefix: str) -> dict[str, float | None]:
    """Mean, sample standard deviation (0 for one value), min and max; empty: all None."""
    if not values:
        return {f"{prefix}_{k}": None for k in ("mean", "std", "min", "max")}
    n = len(values)
    mean = math.fsum(values) / n
    if n < 2:
        std = 0.0
    elif all(math.isfinite(v) for v in values):
        std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    else:
        std = math.nan
    return {f"{prefix}_mean": mean, f"{prefix}_std": std, f"{prefix}_min": min(values), f"{prefix}_max": max(values)}


def _target_name(target: float) -> str:
    return format(target, "g")


def summarize(series: Sequence[Series], metric: str, targets: Sequence[float],
              failed: dict[tuple, list] | None = None) -> list[dict]:
    """One row per configuration (axes but the seed), in the order the configurations come."""
    groups = iter_groups(series)
    rows = []
    for key, members in groups.items():
        row = {k: v for k, v in members[0].axes.items() if k != "seed"}
        stopped = sorted(int(m.points[-1][0]) for m in members if m.status == "diverged" and m.points)
        # Where seeds diverged, said as rounds: their final value is +-inf, never a number.
        row.update(seeds=len(members), diverged=len(stopped),
                   diverged_at=";".join(map(str, stopped)), failed=len((failed or {}).get(key, [])), metric=metric)
        row.update(_stats([m.final for m in members], f"final_{metric}"))
        row.update(_stats([m.best for m in members if not math.isnan(m.best)], f"best_{metric}"))
        for target in targets:
            hits = [m.reached[target] for m in members if target in m.reached]
            name = _target_name(target)
            row[f"reached_{name}"] = len(hits)
            row.update(_stats([h[0] for h in hits], f"rounds_to_{name}"))
            row.update(_stats([h[1] for h in hits], f"floats_to_{name}"))
        rows.append(row)
    return rows


# -- bands ---------------------------------------------------------------------------------------
@dataclass
class Band:
    xs: list[float]
    center: list[float]
    lo: list[float]
    hi: list[float]
    seeds: int
    diverged: int


def band_of(members: Sequence[Series], x: str, band: str, log: bool) -> Band:
    """Mean and band over the seeds at the rounds all of them evaluated (a diverged seed ends
    the curve where it stopped)."""
    column = {"round": 0, "comm_up": 1, "comm_total": 2}[x]
    by_round = [{p[0]: p for p in m.points} for m in members]
    common = sorted(set.intersection(*(set(r) for r in by_round)))
    xs, center, lo, hi = [], [], [], []
    for r in common:
        points = [seed[r] for seed in by_round]
        ys = [p[3] for p in points]
        if not all(math.isfinite(y) for y in ys) or (log and min(ys) <= 0):
            if log and all(math.isfinite(y) for y in ys):
                ys = [max(y, 1e-300) for y in ys]
            else:
                break
        xs.append(math.fsum(p[column] for p in points) / len(points))
        values = [math.log10(y) for y in ys] if log else ys
        mean = math.fsum(values) / len(values)
        if band == "minmax":
            low, high = min(values), max(values)
        else:
            std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
            low, high = mean - std, mean + std
        if log:
            mean, low, high = 10 ** mean, 10 ** low, 10 ** high
        center.append(mean)
        lo.append(low)
        hi.append(high)
    return Band(xs, center, lo, hi, len(members), sum(m.status == "diverged" for m in members))


def use_log(series: Sequence[Series]) -> bool:
    """A log axis when every value is positive and they span more than two decades."""
    values = [p[3] for s in series for p in s.points if math.isfinite(p[3])]
    return bool(values) and min(values) > 0 and max(values) / min(values) > 100


def curve_labels(series: Sequence[Series],
                 keys: Sequence[str] = ("work", "lr", "local_steps", "rounds", "eval_every")) -> dict:
    """A legend label per configuration: the algorithm and the axes that vary within a panel (an
    axis that changes only from panel to panel, such as a step size per participation process,
    is left out, so an algorithm keeps one label, colour and marker in every panel). Where two
    configurations of a panel would still read alike (runs that differ in a problem parameter or
    in per-client rates), each adds the fields of its record that tell them apart."""
    panels: dict[tuple, list[Series]] = {}
    shared = panel_axes(series)
    for s in series:
        panels.setdefault(tuple(_fmt(s.axes.get(k)) for k in shared), []).append(s)
    varying = [k for k in keys if any(len({_fmt(s.axes.get(k)) for s in members}) > 1 for members in panels.values())]
    labels = {}
    for s in series:
        # An axis a series does not have (a sweep without a work axis beside one with) is left out.
        parts = [str(s.axes.get("algorithm"))] + [f"{k}={_fmt(s.axes.get(k))}" for k in varying
                                                  if s.axes.get(k) is not None]
        if s.axes.get("source"):
            parts.insert(0, f"{s.axes['source']}:")
        labels[s.key] = " ".join(parts)
    for members in panels.values():
        alike: dict[str, dict[Any, Series]] = {}
        for s in members:
            alike.setdefault(labels[s.key], {}).setdefault(s.key, s)
        for label, groups in alike.items():
            if len(groups) < 2:
                continue
            names = sorted({name for s in groups.values() for name in s.details})
            telling = [n for n in names if len({s.details.get(n, "-") for s in groups.values()}) > 1]
            for key, s in groups.items():
                labels[key] = " ".join([label, *(f"{n}={s.details.get(n, '-')}" for n in telling)])
    return labels


# The axes a figure gives panels to, where their values differ among the runs plotted: each
# problem, participation process and work process is a panel, its configurations the curves (a
# sweep of 14 algorithms under 3 work processes draws 3 panels of 14 curves, not one of 42).
PANEL_AXES = ("problem", "participation", "work")
PANELS_SAY = {"problem": "problem", "participation": "participation process", "work": "work process"}


def panel_axes(series: Sequence[Series]) -> list[str]:
    """The PANEL_AXES that vary among ``series`` (participation always: it names a lone panel)."""
    return [k for k in PANEL_AXES if k == "participation" or len({_fmt(s.axes.get(k)) for s in series}) > 1]


def panel_title(s: Series, shared: Sequence[str], panel_titles: dict[str, str] | None = None) -> str:
    """A panel's title: its problem (when several), its participation process (or what
    ``panel_titles`` says it means) and its work process (when several; none for a sweep without
    a work axis)."""
    participation = str(s.axes.get("participation"))
    title = (panel_titles or {}).get(participation, participation)
    if "work" in shared and s.axes.get("work") is not None:
        title += f", work {s.axes['work']}"
    return f"{s.axes.get('problem')}\n{title}" if "problem" in shared else title


def _fmt(value: Any) -> str:
    return format(value, ".3g") if isinstance(value, float) else str(value)


def _metric_label(metric: str) -> str:
    return "relative error ||x - x*|| / ||x*||" if metric == "rel_error" else metric.replace("_", " ")


def plot_series(series: Sequence[Series], folder: Path, *, metric: str, band: str, title: str,
                xs: Sequence[str] = ("round", "comm_total"), stems: Sequence[str] = ("figure", "figure_communication"),
                formats: Sequence[str] = ("png", "pdf"), x_factor: dict[str, float] | None = None,
                xlabel: str | None = None, panel_titles: dict[str, str] | None = None) -> list[str]:
    """Band figures of ``series`` against each of ``xs``: one panel per problem, participation and
    work process (those of PANEL_AXES that vary).
    ``x_factor[algorithm]`` multiplies an algorithm's x values (the FOCUS notebook's axis counts
    SCAFFOLD's and ProxSkip's rounds twice); ``xlabel`` replaces the x axis's name;
    ``panel_titles[participation spec]`` says what a panel's participation means."""
    log = use_log(series)
    seeds = max(len(members) for members in iter_groups(series).values())
    labels = curve_labels(series)
    families = {labels[s.key]: f"{s.axes.get('source', '')}{s.axes.get('algorithm')}" for s in series}
    shared = panel_axes(series)
    panels: dict[str, dict[tuple, list[Series]]] = {}
    for s in series:
        panels.setdefault(panel_title(s, shared, panel_titles), {}).setdefault(s.key, []).append(s)
    band_name = "min-max over seeds" if band == "minmax" else (
        "±1 geometric std over seeds" if log else "±1 std over seeds")
    if seeds > 1:
        title = f"{title}, {'geometric ' if log else ''}mean over {seeds} seeds (band: {band_name})"
    written = []
    for x, stem in zip(xs, stems):
        curves = {panel: {labels[key]: _scaled(band_of(members, x, band, log),
                                               (x_factor or {}).get(members[0].axes.get("algorithm"), 1.0))
                          for key, members in groups.items()}
                  for panel, groups in panels.items()}
        paths = [folder / f"{stem}.{ext}" for ext in formats]
        plot_band_panels(curves, paths, xlabel=xlabel or X_AXES[x], ylabel=_metric_label(metric), log=log,
                         suptitle=title, families=families)
        written += [p.name for p in paths]
    return written


def _scaled(band: Band, factor: float) -> Band:
    return band if factor == 1.0 else Band([factor * x for x in band.xs], band.center, band.lo, band.hi,
                                           band.seeds, band.diverged)


# -- focusfl plot --------------------------------------------------------------------------------
def read_folders(paths: Sequence[str | Path], metric: str | None) -> tuple[list[Series], str]:
    """Series of every finished run in the given run and sweep folders (a sweep through its
    results.csv); seeds of one configuration are grouped by ``summarize`` and ``band_of``."""
    sources = []
    for given in paths:
        path = Path(given)
        if (path / RESULTS).is_file():
            sources.append(("sweep", path))
        elif is_run_folder(path):
            sources.append(("run", path))
        elif path.is_dir():
            raise ConfigError(f"{str(given)!r} holds neither a run (metrics.csv, config.json) nor a sweep (results.csv)")
        else:
            raise ConfigError(f"{str(given)!r} is not a folder")
    names = {path.name for _, path in sources}
    tag = len(sources) > 1 and len(names) == len(sources) and any(kind == "sweep" for kind, _ in sources)
    series: list[Series] = []
    chosen = metric
    for kind, path in sources:
        source = path.name if tag else None
        if kind == "sweep":
            with open(path / RESULTS, newline="") as handle:
                reader = csv.DictReader(handle)
                columns = reader.fieldnames or []
                axis_names = axis_columns(WORK_COLUMN in columns)
                chosen = chosen or default_metric([c for c in columns if c not in axis_names])
                _require(chosen, columns, path / RESULTS)
                current, reducer = None, None
                for row in reader:
                    if row["run"] != current:
                        if reducer is not None:
                            series.append(reducer.finish())
                        current = row["run"]
                        axes = {k: _axis_value(row[k]) for k in axis_names}
                        if source:
                            axes["source"] = source
                        group, details = _identity(_sweep_run_record(path, current), source)
                        reducer = _Reducer(Series(axes, row["status"], group=group, details=details), chosen, (),
                                           _stride(axes["rounds"], axes["eval_every"]))
                    reducer.add(row)
                if reducer is not None:
                    series.append(reducer.finish())
        else:
            info = read_config(path)
            with open(path / METRICS, newline="") as handle:
                reader = csv.DictReader(handle)
                chosen = chosen or default_metric(reader.fieldnames or [])
                _require(chosen, reader.fieldnames or [], path / METRICS)
                axes = _run_axes(info, path)
                group, details = _identity(info, None)  # run folders are not tagged by their folder
                reducer = _Reducer(Series(axes, str(info.get("status", "complete")), group=group, details=details),
                                   chosen, (), _stride(axes["rounds"], axes["eval_every"]))
                for row in reader:
                    reducer.add(row)
                series.append(reducer.finish())
    if not series:
        raise ConfigError("no finished runs to plot in " + ", ".join(map(str, paths)))
    return series, chosen


def _sweep_run_record(sweep: Path, run: str) -> dict | None:
    """The config.json of a sweep's run (None where the sweep folder no longer has it: the run
    is then told apart by its axes alone)."""
    path = sweep / RUNS / run / CONFIG
    if not run or "/" in run or not path.is_file():
        return None
    return read_config(path)


def _identity(info: dict | None, source: str | None) -> tuple[str, dict[str, str]]:
    """(the configuration a run belongs to, its record as label text) from its config.json: the
    one run identity of runs/config.py, never one re-derived from the columns of a table."""
    if info is None:
        return "", {}
    group = configuration_key(info)
    return (f"{source}:{group}" if source else group), _details(info)


def _details(info: dict) -> dict[str, str]:
    """A run record's fields and SPEC parameters as short text: ``problem.dim`` -> "50"."""
    shown = {}
    for part in ("problem", "participation", "work", "algorithm"):
        value = info.get(part)
        if isinstance(value, dict):
            shown[part] = str(value.get("name"))
            shown.update({f"{part}.{k}": _text(v) for k, v in value.items() if k != "name"})
        elif value is not None:
            shown[part] = _text(value)
    for name in ("rounds", "eval_every", "dtype", "device", "engine", "schedule", "threads"):
        if name in info:
            shown[name] = _text(info[name])
    return shown


def _text(value: Any, width: int = 28) -> str:
    """A value as a label shows it: lists as a;b;c (cut with ... past ``width`` characters)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        text = ";".join(_text(v) for v in value)
        return text if len(text) <= width else text[: width - 3] + "..."
    if isinstance(value, float):
        return format(value, ".4g")
    return str(value)


def _require(metric: str, columns: Sequence[str], where: Path) -> None:
    if metric not in columns:
        shown = [c for c in columns if c not in ("round", "active", "run", "status")]
        raise ConfigError(f"--y {metric}: {where} has no such column (it has {', '.join(shown)})")


def _axis_value(text: str) -> Any:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def _run_axes(info: dict, path: Path) -> dict:
    """The axes of a run folder, from its config.json. The algorithm's label is its name and the
    hyperparameters it ran with that differ from their defaults (``mifa:notebook=true``); its lr
    and local steps are axes of their own."""
    def spec(value: Any) -> str:
        if isinstance(value, dict):
            return format_spec(str(value.get("name")), {})
        return str(value)

    algorithm = info.get("algorithm") if isinstance(info.get("algorithm"), dict) else {}
    # A process is labelled as the user asked for it (``bernoulli``), not with every parameter it
    # resolved to (``bernoulli:redraw=false`` and per-client rates).
    asked = info.get("asked") if isinstance(info.get("asked"), dict) else {}
    return {
        "problem": spec(info.get("problem")),
        "participation": _participation_label(asked.get("participation") or info.get("participation")),
        "algorithm": _algorithm_label(algorithm) if algorithm else spec(info.get("algorithm")), "lr": algorithm.get("lr"),
        "local_steps": algorithm.get("local_steps"), "rounds": info.get("rounds"),
        "eval_every": info.get("eval_every"), "seed": info.get("seed"),
        # Runs under a work process other than fixed are configurations of their own.
        **({"work": _participation_label(asked.get("work") or info["work"])} if _has_work(info) else {}),
    }


def _has_work(info: dict) -> bool:
    work = info.get("work")
    name = work.get("name") if isinstance(work, dict) else work
    return work is not None and name != "fixed"


def _algorithm_label(described: dict) -> str:
    """``name:key=value`` of the hyperparameters that differ from the algorithm's defaults."""
    name = str(described.get("name"))
    defaults = ALGORITHMS[name]() if name in ALGORITHMS else None
    changed = {k: v for k, v in described.items() if k not in ("name", "lr", "local_steps")
               and not isinstance(v, (list, dict)) and (defaults is None or getattr(defaults, k, object()) != v)}
    return format_spec(name, changed)


def _participation_label(value: Any) -> str:
    if isinstance(value, dict):
        params = {k: _shared(v) for k, v in value.items() if k != "name" and not isinstance(v, dict)}
        # A per-client list with one value (markov's rho=0.8 for every client) is that value; one
        # that varies (the rate preset's p_i) is left out of the label.
        params = {k: v for k, v in params.items() if v is not None}
        return format_spec(str(value.get("name")), params)
    return str(value)


def _shared(value: Any) -> Any:
    """A list's one value when all its entries are equal; None when they differ; else the value."""
    if not isinstance(value, list):
        return value
    return value[0] if value and all(v == value[0] for v in value) else None


def write_plot(paths: Sequence[str | Path], out: Path, *, x: str, metric: str | None, band: str,
               title: str | None = None) -> tuple[list[Path], list[Series]]:
    """``focusfl plot``: the overlay of the given folders, written to ``out`` as PNG and PDF."""
    if x not in X_AXES:
        raise ConfigError(f"--x must be one of {', '.join(X_AXES)}, got {x!r}")
    series, chosen = read_folders(paths, metric)
    stem = out.name[: -len(out.suffix)] if out.suffix.lower() in (".png", ".pdf") else out.name
    folder = out.parent
    if not folder.is_dir():
        raise ConfigError(f"--out {str(out)!r}: folder {str(folder)!r} does not exist")
    targets = [folder / f"{stem}.png", folder / f"{stem}.pdf"]
    with figure_files(targets, "--out") as scratch:  # never over a file of the user's; atomically
        apart = [k for k in panel_axes(series) if len({_fmt(s.axes.get(k)) for s in series}) > 1]
        shown = title or _metric_label(chosen) + (
            f", one panel per {' and '.join(PANELS_SAY[k] for k in apart)}" if apart else "")
        plot_series(series, folder, metric=chosen, band=band, xs=(x,), stems=(scratch[0].stem,), title=shown)
    return targets, series


def iter_groups(series: Iterable[Series]) -> dict[Any, list[Series]]:
    """The series by configuration (Series.key), in the order the configurations come."""
    groups: dict[Any, list[Series]] = {}
    for item in series:
        groups.setdefault(item.key, []).append(item)
    return groups

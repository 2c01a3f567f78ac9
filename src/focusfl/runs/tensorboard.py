"""TensorBoard logs of runs (``--tensorboard DIR``): the optional ``focusfl[tensorboard]`` extra.

A run's log is one TensorBoard run folder, ``DIR/<name>``:

- every evaluated row of metrics.csv becomes one event at ``step = round``, holding each numeric
  metric (``round`` itself and flags such as ``diverged`` left out) as a scalar, as
  ``SummaryWriter.add_scalar`` writes them (``simple_value``: a float32, the one kind of scalar
  every TensorBoard loader reads), so a value read back is metrics.csv's rounded to float32; NaN
  and Inf are logged as they are;
- when the run ends (complete, diverged, or stopped by a signal) its configuration (config.json)
  is added as a text summary and as hparams: nested objects flattened to ``algorithm.lr``,
  ``problem.dim`` and so on. The HParams tab shows each metric's final value beside them (it reads
  the last value of each scalar of the run; no experiment summary is written, so TensorBoard
  takes the union of the hparams of all runs, which differ between algorithms).

Event files are only ever added, never rewritten. A resumed run writes a new event file that
starts with a ``SessionLog.START`` at the first round it recomputes (``purge_step``), so
TensorBoard drops the steps that the killed run logged after its checkpoint. The hparams of a
run live in their own small event file (suffix ``.focusfl-hparams``), written when the run ends;
the one written by an earlier end of the same run (an interrupted run, a run extended with
``--resume --rounds``) is then deleted, because TensorBoard keeps the first hparams it reads.
Nothing else in DIR is ever deleted.

``tensorboard`` and ``torch.utils.tensorboard`` are imported only when a log is written; without
the package, ``--tensorboard`` fails before anything is written (:func:`require`).
"""
from __future__ import annotations

import csv
import importlib
import json
import os
import re
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

from ..errors import ConfigError, DataError

MISSING = "--tensorboard needs the tensorboard package: pip install tensorboard"
EVENTS = "events.out.tfevents."
HPARAMS_SUFFIX = ".focusfl-hparams"
SKIPPED = ("round", "diverged")  # the step itself, and a flag (status is in the hparams)
FLUSH_SECONDS = 5
MAX_TEXT = 256  # characters of one hparam value (a participation's list of N rates, say)
_UNSAFE = re.compile(r"[^A-Za-z0-9._,=+-]+")


def require() -> None:
    """ConfigError (one line) unless tensorboard and torch.utils.tensorboard can be imported."""
    try:
        importlib.import_module("tensorboard")
        importlib.import_module("torch.utils.tensorboard")
    except ImportError:
        raise ConfigError(MISSING) from None


def check_root(root: str | Path, out: str | Path, *, what: str = "--out") -> Path:
    """The resolved ``--tensorboard`` folder; refused (one line) if it is ``out`` or inside it
    (focusfl replaces that folder as a whole), or cannot be a folder."""
    path = Path(root).expanduser().resolve()
    out_path = Path(out).expanduser().resolve()
    if path == out_path or out_path in path.parents:
        raise ConfigError(f"--tensorboard {str(root)!r} is inside {what} {str(out)!r}, which focusfl replaces "
                          "as a whole; give a folder outside it")
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--tensorboard {str(root)!r} exists and is not a folder")
    ancestor = path
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir() or not os.access(ancestor, os.W_OK | os.X_OK):
        raise ConfigError(f"--tensorboard {str(root)!r} cannot be written ({str(ancestor)!r} is not a writable folder)")
    return path


def safe_name(text: str) -> str:
    """``text`` as one folder name: runs of characters other than letters, digits and ``._,=+-``
    become ``_``."""
    return _UNSAFE.sub("_", text).strip("._") or "run"


def claim_log_dir(root: Path, name: str, *, avoid: Iterable[Path] = ()) -> Path:
    """A new folder ``root/name``, or ``root/name-2``, ``-3``, ... if that exists: a fresh run
    never mixes its steps into another run's log. Created with mkdir, so two runs starting
    together cannot take the same one."""
    root.mkdir(parents=True, exist_ok=True)
    avoid = {Path(p).resolve() for p in avoid}
    base = safe_name(name)
    for k in range(1, 100_000):
        candidate = root / (base if k == 1 else f"{base}-{k}")
        if candidate.resolve() in avoid:
            continue
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        return candidate
    raise ConfigError(f"--tensorboard {str(root)!r}: no free name for {base!r}")


def has_events(log_dir: Path) -> bool:
    return log_dir.is_dir() and any(p.name.startswith(EVENTS) for p in log_dir.iterdir())


def has_hparams(log_dir: Path) -> bool:
    """Whether a run's log was finished: its hparams file is written last."""
    return log_dir.is_dir() and any(p.name.startswith(EVENTS) and p.name.endswith(HPARAMS_SUFFIX)
                                    for p in log_dir.iterdir())


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """hparams from a nested config: ``{"algorithm": {"lr": 1e-3}}`` -> ``{"algorithm.lr": 1e-3}``;
    numbers, strings and booleans as they are, lists as compact JSON, None left out."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        elif value is None:
            continue
        elif isinstance(value, (bool, int, float, str)):
            flat[name] = value
        else:
            flat[name] = json.dumps(value, separators=(",", ":"), default=str)
        if isinstance(flat.get(name), str) and len(flat[name]) > MAX_TEXT:
            flat[name] = flat[name][:MAX_TEXT - 3] + "..."
    return flat


def _number(value: Any) -> float | None:
    """A metric value as a float, or None for what is not a number (flags, empty CSV cells)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value) if value else None
        except ValueError:
            return None
    try:  # numpy and torch scalars
        return float(value)
    except (TypeError, ValueError):
        return None


def _wait_for_a_later_second(log_dir: Path) -> None:
    """TensorBoard reads a folder's event files in name order, and the name starts with the
    second it was created in: a new file must sort after every file there, or its purge would
    apply to the wrong steps. Wait (at most a second) until that holds."""
    newest = 0
    for entry in log_dir.iterdir() if log_dir.is_dir() else ():
        if entry.name.startswith(EVENTS):
            stamp = entry.name[len(EVENTS):].split(".", 1)[0]
            if stamp.isdigit():
                newest = max(newest, int(stamp))
    while int(time.time()) <= newest:
        time.sleep(min(0.05, max(0.0, newest + 1 - time.time())) or 0.01)


class RunLogger:
    """One session of a run's log: rows as they are computed, then hparams when it ends.

    ``purge_step``: the first round this session logs (0 for a new log, checkpoint round + 1
    for a resumed run); TensorBoard hides what older event files hold from that step on.
    """

    def __init__(self, log_dir: str | Path, *, purge_step: int = 0) -> None:
        require()
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        _wait_for_a_later_second(self.log_dir)
        self.writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=purge_step, flush_secs=FLUSH_SECONDS)

    def log_row(self, row: Mapping[str, Any]) -> None:
        """One evaluated row (from the run, or read back from metrics.csv) at step ``round``."""
        from tensorboard.compat.proto.summary_pb2 import Summary

        step = _number(row.get("round"))
        if step is None:
            return
        # One event per row holding all its metrics: add_scalar's format, a fifth of its events.
        values = [Summary.Value(tag=key, simple_value=value) for key, value in
                  ((key, _number(raw)) for key, raw in row.items()) if key not in SKIPPED and value is not None]
        if values:
            self.writer.file_writer.add_summary(Summary(value=values), int(step))

    def flush(self) -> None:
        self.writer.flush()

    def finish(self, config: Mapping[str, Any], *, hparams: Mapping[str, Any] | None = None, status: str,
               step: int | None) -> None:
        """The run ended with ``status``: its config as text (at its last round) and hparams."""
        text = json.dumps(config, indent=2, default=str)
        self.writer.add_text("config", "    " + text.replace("\n", "\n    "), global_step=step or 0)
        self.close()
        write_hparams(self.log_dir, flatten(config) if hparams is None else dict(hparams), status)

    def close(self) -> None:
        self.writer.close()


def write_hparams(log_dir: Path, hparams: Mapping[str, Any], status: str) -> None:
    """The run's hparams and end status, in a file of their own; older such files of this run
    are deleted once it is written (TensorBoard keeps the first hparams it reads)."""
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.plugins.hparams import metadata
    from tensorboard.plugins.hparams.api_pb2 import Status
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData, SessionEndInfo, SessionStartInfo
    from torch.utils.tensorboard import SummaryWriter

    start = SessionStartInfo(start_time_secs=time.time())
    for key, value in hparams.items():
        if isinstance(value, bool):
            start.hparams[key].bool_value = value
        elif isinstance(value, (int, float)):
            start.hparams[key].number_value = float(value)
        elif value is not None:
            start.hparams[key].string_value = str(value)
    end = SessionEndInfo(end_time_secs=time.time(), status=Status.Value(
        {"complete": "STATUS_SUCCESS", "diverged": "STATUS_FAILURE", "interrupted": "STATUS_RUNNING"}
        .get(status, "STATUS_UNKNOWN")))
    summary = Summary(value=[
        Summary.Value(tag=metadata.SESSION_START_INFO_TAG,
                      metadata=metadata.create_summary_metadata(HParamsPluginData(session_start_info=start))),
        Summary.Value(tag=metadata.SESSION_END_INFO_TAG,
                      metadata=metadata.create_summary_metadata(HParamsPluginData(session_end_info=end))),
    ])
    before = [p for p in log_dir.iterdir() if p.name.startswith(EVENTS) and p.name.endswith(HPARAMS_SUFFIX)]
    writer = SummaryWriter(log_dir=str(log_dir), filename_suffix=HPARAMS_SUFFIX)
    writer.file_writer.add_summary(summary)
    writer.close()
    for old in before:
        old.unlink(missing_ok=True)


def iter_metrics(path: Path) -> Iterable[dict[str, str]]:
    """The rows of a metrics.csv, streamed."""
    with open(path, newline="") as handle:
        yield from csv.DictReader(handle)


def log_folder(folder: Path, log_dir: Path, *, hparams: Mapping[str, Any] | None = None) -> None:
    """Log a finished run folder (metrics.csv and config.json) in one go: a sweep's runs, on the
    driver. A log left half-written (the driver was killed) is written again over it: its new
    event file starts with a purge of step 0, so each step is there once."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise DataError(f"{folder}/config.json: cannot be read for TensorBoard: {exc}") from None
    logger = RunLogger(log_dir, purge_step=0)
    try:
        for row in iter_metrics(folder / "metrics.csv"):
            logger.log_row(row)
    except BaseException:
        logger.close()
        raise
    status = config.get("status", "complete") if isinstance(config, dict) else "complete"
    logger.finish(config, hparams=hparams, status=status, step=config.get("rounds_done"))

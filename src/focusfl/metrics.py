"""Which metric of an evaluation row matters, and which way is better: the one definition.

The progress bar, the blow-up detector (engine/divergence.py), tune, aggregation and the figures
all ask here. An evaluation row is the engine's ``round``, ``active``, ``comm_down``,
``comm_up`` and the problem's :meth:`~focusfl.problems.base.Problem.metrics`:

- ridge, logistic: ``loss`` = F(x), ``grad_norm`` = ||grad F(x)||, and ``rel_error`` =
  ||x - x*|| / ||x*|| when the minimizer x* is known;
- neural networks: ``test_loss``, ``test_accuracy`` (evaluated on the test set), ``val_loss``,
  ``val_accuracy`` (a validation split carved from the clients' data) and ``train_loss`` (the
  participants' mean minibatch loss since the previous row; absent from the round-0 row).

Each problem lists the names its rows may carry (:attr:`Problem.metric_names`). This module is
plain Python (no torch), so that reading results (``focusfl plot``) stays light.

Three questions, three orders over those names, each the first name a row carries:

- the PRIMARY metric, what a summary reports and a figure shows: rel_error, else loss (convex),
  else test_loss, else test_accuracy, else val_loss (a run that evaluates the validation split only);
- the SELECTION metric, what a step-size search ranks by: the primary metric of the columns
  that are not test-set metrics (a search never looks at the test set): rel_error, loss, val_loss;
- the WATCHED loss, what the blow-up rule follows: loss (convex: F itself), else train_loss,
  test_loss, val_loss (the round-0 row fixes the choice, and it has no train_loss).

Accuracies are better higher; every other metric (losses, errors, norms) lower.
"""
from __future__ import annotations

import math
from typing import Iterable, Sequence

PRIMARY = ("rel_error", "loss", "test_loss", "test_accuracy", "val_loss", "val_accuracy")
WATCHED_LOSSES = ("loss", "train_loss", "test_loss", "val_loss")
TEST_SET = ("test_loss", "test_accuracy")
HIGHER_IS_BETTER = ("test_accuracy", "val_accuracy", "accuracy")
# Shown beside a progress bar for a neural network: its accuracy, then its losses.
NN_PROGRESS = {"test_loss": ("test_accuracy", "test_loss", "train_loss"),
               "val_loss": ("val_accuracy", "val_loss", "train_loss")}


def _first(order: Sequence[str], columns: Iterable[str]) -> str | None:
    present = set(columns)
    return next((name for name in order if name in present), None)


def primary_metric(columns: Iterable[str]) -> str | None:
    """The metric that matters among ``columns`` (a row, or a metrics.csv header); None without one."""
    return _first(PRIMARY, columns)


def selection_metric(columns: Iterable[str]) -> str | None:
    """What a step-size search ranks by: the primary metric, never a test-set one; None without one."""
    return _first(PRIMARY, (c for c in columns if c not in TEST_SET))


def watched_loss(columns: Iterable[str]) -> str | None:
    """The loss the blow-up rule follows in rows with these columns (None: no loss to watch)."""
    return _first(WATCHED_LOSSES, columns)


def higher_is_better(metric: str) -> bool:
    return metric in HIGHER_IS_BETTER


def progress_metrics(row: dict) -> dict[str, str]:
    """The values a progress bar shows for this row, formatted: a neural network's accuracy and
    losses, else the primary metric (rel_error or loss) in scientific notation."""
    primary = primary_metric(row)
    if primary is None:
        return {}
    shown = NN_PROGRESS.get(primary)
    if shown is not None:
        return {name: f"{row[name]:.4g}" for name in shown if name in row}
    return {primary: f"{row[primary]:.3e}"}


def first_below(rows: Sequence[dict], threshold: float, metric: str = "rel_error") -> int | None:
    """The round of the first row whose ``metric`` is strictly below ``threshold`` (None: never);
    a row without the metric counts as not below."""
    return next((row["round"] for row in rows if float(row.get(metric, math.inf)) < threshold), None)

"""The files of a sweep folder (``focusfl sweep``, ``tune``, the presets): one home for their
names, which the sweep writes and aggregation reads (a run folder's own files: runs/folder.py)."""

RUNS = "runs"  # DIR/runs/<run key>/: one run folder per run of the grid
EXPERIMENT = "experiment.toml"
RESULTS = "results.csv"
SUMMARY = "summary.csv"
FAILURES = "failures.csv"
# Columns of results.csv that name a run's configuration, in this order; "seed" last.
AXIS_COLUMNS = ("problem", "participation", "algorithm", "lr", "local_steps", "rounds", "eval_every", "seed")
# The work process's column, after "participation", in sweeps that declare a work axis only.
WORK_COLUMN = "work"


def axis_columns(has_work: bool) -> tuple[str, ...]:
    """AXIS_COLUMNS, with the work column after participation when the sweep has a work axis."""
    if not has_work:
        return AXIS_COLUMNS
    at = AXIS_COLUMNS.index("participation") + 1
    return (*AXIS_COLUMNS[:at], WORK_COLUMN, *AXIS_COLUMNS[at:])
STATUS = "status.json"  # what a running sweep is doing, for another shell to read (sweep.SweepStatus)

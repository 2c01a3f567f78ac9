"""The files of a sweep folder (``focusfl sweep``, ``tune``, the presets): one home for their
names, which the sweep writes and aggregation reads (a run folder's own files: runs/folder.py)."""

RUNS = "runs"  # DIR/runs/<run key>/: one run folder per run of the grid
EXPERIMENT = "experiment.toml"
RESULTS = "results.csv"
SUMMARY = "summary.csv"
FAILURES = "failures.csv"
# Columns of results.csv that name a run's configuration, in this order; "seed" last.
AXIS_COLUMNS = ("problem", "participation", "algorithm", "lr", "local_steps", "rounds", "eval_every", "seed")

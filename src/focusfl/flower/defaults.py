"""What a federation's run fields default to where they differ from a run's (runs.config): a
federation takes whoever answers, and a loopback one is a short demonstration. Its own module,
free of Flower, so that building the command line (focusfl.flower.cli) imports no Flower
module: every ``focusfl`` command builds it, and flwr's server side takes 0.7 s to import."""
from __future__ import annotations

FEDERATION_DEFAULTS = {"algorithm": "focus", "participation": "available", "rounds": 20}

"""benchmarks/peers.py kept from rotting: its focusfl runner and the plain loop run at a tiny size
(1 warm-up and 2 timed rounds) with the work the table promises, and a peer that cannot run is
reported with its reason instead of stopping the others."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from cli_harness import cli_env

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "peers.py"


def test_peers_small_runs_focusfl_and_names_a_missing_peer(tmp_path):
    missing = tmp_path / "no-such-python"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--small", "--settings", "full", "--threads", "1",
                           "--runners", "focusfl", "loop", "pfl", "--pfl-python", str(missing)],
                          env=cli_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    rows = {line.split()[0]: line for line in lines if re.match(r"(focusfl|loop|pfl) ", line)}
    # focusfl and the loop: 10 clients x 5 steps x 32 samples a round, a finite final loss.
    for name in ("focusfl", "loop"):
        fields = rows[name].split()
        assert fields[1] == ("focusfl" if name == "focusfl" else "torch"), rows[name]
        assert re.fullmatch(r"\d+\.\d{3}", fields[3]) and fields[5] == "1600", rows[name]
        assert 2.0 < float(fields[6]) < 2.6, rows[name]  # ln(10) = 2.303 on random labels
    assert rows["pfl"] == f"pfl              failed: pfl: interpreter {missing} not found"
    assert lines[-1] == "peers: focusfl/pfl=n/a focusfl/flower=n/a (setting full, threads 1)"

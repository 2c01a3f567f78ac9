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


def test_the_limit_is_the_smaller_floor_and_bounds_any_speed_up():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import peers
    finally:
        sys.path.remove(str(SCRIPT.parent))

    def runs(*medians):
        return [{"seconds": [m], "samples_per_round": 1600, "final_loss": 2.3, "version": "v"} for m in medians]

    results = {"floor": runs(0.18), "floor-1thread": runs(0.30), "pfl-best": runs(0.165), "flower-best": runs(0.4)}
    found = peers.limit(results, 2)
    assert found["bound"] == 0.15 and found["peer"] == "pfl-best" and abs(found["most"] - 1.1) < 1e-12
    line = peers.limit_line("full", found, 2)
    assert line.startswith("limit (full): no engine's round below 0.150 s on 2 cores") and line.endswith("1.10x faster than it here")
    results["floor"] = runs(0.12)  # intra-op threads beating the split one-thread floor: the bound follows
    assert peers.limit(results, 2)["bound"] == 0.12
    assert peers.limit({"floor": runs(0.2)}, 2) is None  # without both floors, no bound is claimed

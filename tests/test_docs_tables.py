"""Tables of the docs that a command prints, checked against the command.

Which tables are checked, and how:

- docs/algorithms.md's work table: tests/test_figures.py reruns `focusfl sweep
  docs/examples/work.toml` (seconds) and compares, in the default suite.
- docs/algorithms.md's exactness table: tests/test_exactness.py reruns every cell, in the
  default suite.
- docs/neural-networks.md's mnist-demo table: the command takes about 10 minutes on two cores, too
  long for the default suite. Its rows are the command's table.md pasted as written, under the
  exact command; here the default suite checks that the page's table has the program's form
  (header and columns from reproduce_nn.docs_table) and tests/test_nn.py that table.md is made
  from the CSVs; the full comparison runs with FOCUSFL_DOC_TABLES=1.
"""
from __future__ import annotations

import os
import re
import shlex

import pytest

from cli_harness import run_cli
from test_docs import ROOT

NN_DOC = ROOT / "docs" / "neural-networks.md"
DEMO_HEADER = "| algorithm | preset's step |"


def documented_table(text: str, header: str) -> str:
    """The Markdown table of ``text`` that starts with ``header``: its lines, as a block."""
    lines = text.splitlines()
    start = next(k for k, line in enumerate(lines) if line.startswith(header))
    end = next((k for k in range(start, len(lines)) if not lines[k].startswith("|")), len(lines))
    return "\n".join(lines[start:end]) + "\n"


def documented_command(text: str, before: str) -> list[str]:
    """The last `focusfl ...` line of a code block above ``before`` (its words after focusfl)."""
    head = text[: text.index(before)]
    line = [ln for ln in head.splitlines() if re.match(r"^(\w+=\S+\s+)*focusfl\s", ln)][-1]
    words = shlex.split(line)
    return words[words.index("focusfl") + 1:]


def test_the_mnist_demo_table_has_the_programs_form():
    from focusfl.reproduce.reproduce_nn import MNIST_DEMO, docs_table

    table = documented_table(NN_DOC.read_text(), DEMO_HEADER)
    rows = [line for line in table.splitlines()[2:]]
    summary = [{"algorithm": name, "participation": "bernoulli", "lr": 0.1, "steps": "tuned", "seeds": 2,
                "status": "complete", "final_test_accuracy": 0.9, "final_test_accuracy_min": 0.9,
                "final_test_accuracy_max": 0.9, "best_test_accuracy": 0.9, "final_test_loss": 0.1}
               for name in MNIST_DEMO.algorithms]
    steps = [{"scenario": next(iter(MNIST_DEMO.scenarios)), "algorithm": name, "preset_lr": 0.1, "lr": 0.1,
              "grid": "0.1=1", "reason": "interior", "added_steps": ""} for name in MNIST_DEMO.algorithms]
    made = docs_table(summary, steps, MNIST_DEMO.scenarios).splitlines()
    assert table.splitlines()[:2] == made[:2], "docs/neural-networks.md's mnist-demo table has another form"
    assert [row.split(" | ")[0] for row in rows] == [line.split(" | ")[0] for line in made[2:]]
    assert all(row.count(" | ") == made[2].count(" | ") for row in rows)


@pytest.mark.skipif(os.environ.get("FOCUSFL_DOC_TABLES") != "1",
                    reason="runs the full mnist-demo command (about 10 minutes on 2 cores); FOCUSFL_DOC_TABLES=1 runs it")
def test_the_mnist_demo_table_is_the_commands_output(tmp_path):
    text = NN_DOC.read_text()
    words = documented_command(text, DEMO_HEADER)
    words[words.index("--out") + 1] = str(tmp_path / "mnist-demo")
    done = run_cli(*words, cwd=ROOT, timeout=3600, env=None)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "mnist-demo" / "table.md").read_text() == documented_table(text, DEMO_HEADER)

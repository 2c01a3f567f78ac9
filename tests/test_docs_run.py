"""Every command line of README.md and docs/cli.md, run end to end as a user runs it.

Each document's code-block commands run in order, through the installed ``focusfl`` console
script, in one temporary folder (a later command reads what an earlier one wrote:
``run --resume runs/focus``, ``plot runs/compare``). Only their sizes change, by the reviewed
tables below: an option the command gives is set to a small value (SMALL), options a command
leaves at a large default are added (ADDED), placeholders name test files (PLACEHOLDERS), and the
files a command reads are made from the repository's own (FILES). A command that needs what a
test cannot have, or that another test already runs end to end, is listed in SKIPPED with the
reason. Synopses (`[--lr ETA|auto]`) are not commands; tests/test_docs.py checks their options.
"""
from __future__ import annotations

import pickle
import re
import time

import pytest

from cli_harness import run_cli
from test_docs import ROOT, SYNOPSIS, _commands, _markdown_texts

RUN_DOCUMENTS = ["README.md", "docs/cli.md"]
MNIST = ROOT / "tests" / "fixtures" / "mnist1500.npz"

# A size option a command gives -> the value it runs with here.
SMALL = {
    "--rounds": "4",
    "--seeds": "1",
    "--points": "2",
    "--eval-every": "2",
}

# Options added where the command leaves them at a large default, by the (sub)command's words.
# run: 4 rounds unless it replays or resumes a run (whose rounds it reads).
ADDED = {
    ("run",): [("--rounds", "4")],
    ("reproduce", "ridge"): [("--rounds", "4")],
    ("reproduce", "delays"): [("--rounds", "200"), ("--seeds", "1")],
    ("reproduce", "report"): [("--quick",)],  # its documented smoke-test sizes
    ("reproduce", "mnist-demo"): [("--rounds", "2"), ("--eval-every", "1"), ("--tune-rounds", "2"),
                                  ("--tune-eval-every", "1"), ("--algorithms", "sg_focus,fedavg"), ("--seeds", "1")],
    ("tune",): [("--rounds", "4"), ("--points", "2")],
    ("bias",): [("--rounds", "200"), ("--mc-rounds", "500")],
}
KEEP_ROUNDS = ("--resume", "--config")

# Words of the docs that name the user's files -> files a test has; sizes inside a SPEC.
PLACEHOLDERS = {
    "PATH/mnist.npz": str(MNIST),  # MNIST in an .npz: the 1,500-digit fixture
    "clients=32": "clients=8",  # a size: 1,200 training digits give 8 clients of ~150, not 32 of ~37
    "DIR/config.json": "runs/focus/config.json",  # a run SETUP made
    "DIR2": "runs/rerun",
}

# Commands run before a document's own, for the folders its commands name but do not make.
SETUP = {
    "docs/cli.md": [["run", "--algorithm", "focus", "--problem", "ridge", "--rounds", "4", "--out", "runs/focus"]],
}

# Commands whose documented outcome at test size is not exit 0 -> (exit status, words of the message).
EXPECTED = {
    # The README resumes a run a user stopped; here the run before it finished its 4 rounds, and a
    # finished run is run further only with --rounds (docs/runs.md), else refused in one line.
    "run --resume runs/focus": (2, "give --rounds R"),
}

SKIPPED = {
    "reproduce report --out runs/report": "tests/test_report.py runs it end to end as a user types it (--quick, with "
                                          "the MNIST sample for its neural-network part): 17 s not spent twice",
    "sweep experiment.toml --out runs/big --executor ray --address auto": "needs a Ray cluster",
    "reproduce focus-cifar10 --data-dir DATA": "needs CIFAR-10 (a 170 MB download); the preset's 32-client "
                                                "alpha=0.05 split cannot be drawn from a small stand-in",
    "reproduce fedsum-mnist --data-dir DATA": "needs MNIST's IDX files (a download)",
    "reproduce fedsum-resnet18 --dataset cifar100 --data-dir DATA --device cuda":
        "needs CIFAR-100 and a GPU (50 clients of ResNet-18); tests/test_nn_fedsum_presets.py runs it shrunk",
    "reproduce fedsum-sst2 --data sst2 --model bert-base-uncased --device cuda":
        "needs SST-2 and bert-base-uncased in local folders (downloads) and a GPU; tests/test_hf_sst2.py runs it on "
        "a tiny BERT and an SST-2-shaped dataset",
    "reproduce fedsum-biased --data-dir DATA": "needs MNIST's IDX files (a download); "
                                               "tests/test_nn_fedsum_presets.py runs it on files made from the fixture",
}


def _small_experiment(text: str) -> str:
    """The docs' example experiment at test size: 4 rounds, evaluated every 2, one seed."""
    text = re.sub(r"(?m)^rounds = \d+", "rounds = 4", text)
    text = re.sub(r"(?m)^eval_every = \d+", "eval_every = 2", text)
    return re.sub(r"(?m)^seeds = \d+", "seeds = 1", text)


def _fedscale_behaviour() -> str:
    """A FedScale client behaviour pickle (protocol 0: text) of the report's synthetic devices."""
    from focusfl.reproduce.suite_study import synthetic_fedscale

    return pickle.dumps(synthetic_fedscale(), protocol=0).decode("ascii")


# Files the commands read, relative to the folder they run in -> their text.
FILES = {
    "docs/examples/experiment.toml": lambda: _small_experiment((ROOT / "docs/examples/experiment.toml").read_text()),
    "client_behave_trace": _fedscale_behaviour,
    "docs/examples/fedstale_layout.csv": lambda: (ROOT / "docs/examples/fedstale_layout.csv").read_text(),
}


def documented_commands(document: str) -> list[tuple[str, list[str]]]:
    """(where, words after ``focusfl``) of every command a code block of ``document`` shows."""
    found = []
    for where, text, whole in _markdown_texts(ROOT / document):
        for words in _commands(text) if whole else []:
            words = words[:next((i for i, w in enumerate(words) if w.startswith("#")), len(words))]
            if words and not SYNOPSIS.search(" ".join(words)):
                found.append((where, words))
    return found


def _subcommand(words: list[str]) -> tuple[str, ...]:
    for size in (2, 1):
        if tuple(words[:size]) in ADDED:
            return tuple(words[:size])
    return ()


def small(words: list[str]) -> list[str]:
    """``words`` at test size (SMALL, ADDED, PLACEHOLDERS)."""
    out = []
    for k, word in enumerate(words):
        previous = words[k - 1] if k else ""
        if previous in SMALL:
            word = SMALL[previous]
        for placeholder, value in PLACEHOLDERS.items():
            word = word.replace(placeholder, value)
        out.append(word)
    if not any(option in words for option in KEEP_ROUNDS):
        for option in ADDED.get(_subcommand(words), []):
            if option[0] not in out:
                out += option
    return out


def test_the_size_tables_are_used():
    """No stale entry: every skip names a documented command, every placeholder and added option
    a command it changes."""
    shown = [" ".join(words) for document in RUN_DOCUMENTS for _, words in documented_commands(document)]
    assert set(SKIPPED) | set(EXPECTED) <= set(shown), (set(SKIPPED) | set(EXPECTED)) - set(shown)
    assert all(any(p in command for command in shown) for p in PLACEHOLDERS), PLACEHOLDERS
    assert all(any(command.startswith(" ".join(key)) for command in shown) for key in ADDED), ADDED
    assert len(shown) >= 25  # the extraction found the README's and cli.md's commands


def test_small_rewrites_sizes_only():
    assert small(["run", "--resume", "runs/focus"]) == ["run", "--resume", "runs/focus"]
    assert small(["tune", "--rounds", "300", "--points", "9", "--out", "runs/tune"]) == \
        ["tune", "--rounds", "4", "--points", "2", "--out", "runs/tune"]
    assert small(["reproduce", "report", "--out", "runs/report"]) == ["reproduce", "report", "--out", "runs/report", "--quick"]


@pytest.mark.slow
@pytest.mark.parametrize("document", RUN_DOCUMENTS)
def test_every_documented_command_runs(document, tmp_path):
    for relative, text in FILES.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text())
    for words in SETUP.get(document, []):
        proc = run_cli(*words, cwd=tmp_path)
        assert proc.returncode == 0, f"setup focusfl {' '.join(words)}: {proc.stderr}"
    failed, ran, started = [], [], time.monotonic()
    for where, words in documented_commands(document):
        if " ".join(words) in SKIPPED:
            continue
        argv = small(words)
        before = time.monotonic()
        proc = run_cli(*argv, cwd=tmp_path, timeout=180)
        ran.append(f"{time.monotonic() - before:5.1f}s focusfl {' '.join(argv)}")
        code, message = EXPECTED.get(" ".join(words), (0, ""))
        if proc.returncode != code or message not in proc.stderr or "Traceback" in proc.stderr:
            failed.append(f"{where}: focusfl {' '.join(argv)}\n    exit {proc.returncode}: {proc.stderr.strip()[-800:]}")
    print(f"{document}: {len(ran)} commands in {time.monotonic() - started:.0f}s\n" + "\n".join(ran))
    assert not failed, "documented commands that fail at test size:\n" + "\n".join(failed)

"""The README, docs/ and every --help say what the program does, checked mechanically.

Every `focusfl ...` command shown (in a code block, an inline code span or a help text's examples)
is parsed by the real CLI parser without running: its command exists and its options are accepted.
A usage synopsis (`[--threads N]`, `A|B`) is checked option by option. A SPEC list separated by `;`
is quoted wherever a shell would read it: a shell ends the command at an unquoted `;`.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from focusfl.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\s*$")
SPAN = re.compile(r"`([^`\n]+)`")
SHELL_OPERATORS = (";", "&&", "||", "|", "&")
# Words a synopsis uses for "one of" or "and so on": such a line shows options, not a command.
SYNOPSIS = re.compile(r"(^|\s)\[|\.\.\.|\S\|\S")


def _markdown_texts(path: Path) -> list[tuple[str, str, bool]]:
    """(where, text, whole) of every code-block line (backslash continuations joined) outside
    Python, TOML and data blocks (whole: a command shown to be typed), and of every inline code
    span outside code blocks (which may mention a command without all its arguments)."""
    texts, block, pending = [], None, ""
    for number, line in enumerate(path.read_text().splitlines(), 1):
        where = f"{path.relative_to(ROOT)}:{number}"
        fence = FENCE.match(line.strip())
        if fence:
            block = None if block is not None else fence.group(1) or "shell"
            continue
        if block is None:
            texts += [(where, span, False) for span in SPAN.findall(line)]
        elif block not in ("python", "toml", "json", "csv", "text"):
            continued = line.rstrip().endswith("\\")
            pending += line.rstrip().rstrip("\\") + " " if continued else line
            if not continued:
                texts.append((where, pending, True))
                pending = ""
    return texts


def _parsers(parser: argparse.ArgumentParser, name: str = ""):
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _parsers(sub, f"{name} {sub_name}".strip())


def _help_texts() -> list[tuple[str, str, bool]]:
    """(where, line, whole) of every line of every command's description, epilog and option
    help; an epilog's examples are whole commands."""
    texts = []
    for name, parser in _parsers(build_parser()):
        where = f"focusfl {name} --help".replace("  ", " ")
        examples = (parser.epilog or "").split("\n\n")[0] if (parser.epilog or "").startswith("examples:") else ""
        prose = [parser.description or "", (parser.epilog or "")[len(examples):]]
        prose += [action.help or "" for action in parser._actions if isinstance(action.help, str)]
        texts += [(where, line.strip(), True) for line in examples.splitlines()[1:] if line.strip()]
        texts += [(where, line.strip(), False) for piece in prose for line in piece.splitlines() if line.strip()]
    return texts


def _tokens(text: str) -> list[str]:
    """Shell words of ``text``; an unquoted ``;``, ``&&``, ``|``... is a word of its own."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    return list(lexer)


def _commands(text: str) -> list[list[str]]:
    """The arguments of each ``focusfl`` command in a shell line (after `&&`, `;`, `cd x &&`...)."""
    commands, current = [], []
    for token in _tokens(text) + [";"]:
        if token in SHELL_OPERATORS or set(token) <= set(";&|"):
            if current[:1] == ["focusfl"]:
                commands.append(current[1:])
            current = []
        else:
            current.append(token)
    return commands


def _shown_commands() -> list[tuple[str, str, bool]]:
    texts = [text for path in DOCUMENTS for text in _markdown_texts(path)] + _help_texts()
    return [(where, text, whole) for where, text, whole in texts
            if re.search(r"(^|[\s&;(])focusfl\s+\S", text) and _lexable(text)]


def _lexable(text: str) -> bool:
    try:
        _tokens(text)
    except ValueError:  # prose with an apostrophe that merely mentions focusfl
        return False
    return True


def _subcommand(words: list[str]) -> tuple[argparse.ArgumentParser, list[str]]:
    """The parser of the (sub)command ``words`` names, and the words after its name."""
    parser = build_parser()
    while True:
        actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not actions or not words or words[0] not in actions[0].choices:
            return parser, words
        parser, words = actions[0].choices[words[0]], words[1:]


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


# A span in prose may name a command without its required arguments (`focusfl sweep`, `--config`).
MENTION = ("the following arguments are required", "expected one argument")


def _refusal(parser: argparse.ArgumentParser, words: list[str]) -> str | None:
    """The parser's one-line refusal of ``words`` (None when it accepts them)."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(words)
    except SystemExit as exc:
        if exc.code != 0:  # --help and --version exit 0
            return stderr.getvalue().strip() or f"exit {exc.code}"
    return None


def test_every_shown_command_parses_with_the_cli_parser():
    parser = build_parser()
    checked, wrong = 0, []
    for where, text, whole in _shown_commands():
        for words in _commands(text):
            words = words[:next((i for i, w in enumerate(words) if w.startswith("#")), len(words))]
            if not words or words[0].isupper() or SYNOPSIS.search(" ".join(words)):
                continue  # `focusfl COMMAND --help`, or a synopsis (checked below)
            refusal = _refusal(parser, words)
            checked += 1
            if refusal is not None and (whole or not any(m in refusal for m in MENTION)):
                wrong.append(f"{where}: focusfl {' '.join(words)}\n    {refusal}")
    assert not wrong, "shown commands the parser refuses:\n" + "\n".join(wrong)
    assert checked > 50  # the README, docs/ and the help texts show many; the extraction found them


def test_every_option_in_a_synopsis_exists():
    wrong, checked = [], 0
    for where, text, _ in _shown_commands():
        for words in _commands(text):
            if not SYNOPSIS.search(" ".join(words)):
                continue
            parser, rest = _subcommand(words)
            known = _options(parser)
            for option in re.findall(r"(?<![\w-])--[a-z][\w-]*", " ".join(rest)):
                checked += 1
                if option not in known:
                    wrong.append(f"{where}: {option} is not an option of focusfl {' '.join(words[:len(words) - len(rest)])}")
    assert not wrong, "\n".join(wrong)
    assert checked > 10


def test_every_command_named_in_the_docs_exists():
    parser = build_parser()
    names = {name for name, _ in _parsers(parser) if name}
    wrong = []
    for path in DOCUMENTS:
        for match in re.finditer(r"`focusfl ((?:[a-z][\w-]*)(?: [a-z][\w-]*)?)", path.read_text()):
            first, _, second = match.group(1).partition(" ")
            if first not in names:
                wrong.append(f"{path.name}: focusfl {first}")
            elif f"{first} {second}" not in names and any(n.startswith(f"{first} ") for n in names) \
                    and second and not second.startswith("-"):
                wrong.append(f"{path.name}: focusfl {first} {second}")
    assert not wrong, "\n".join(sorted(set(wrong)))


SPEC_LIST = re.compile(r"[\w.]+=[^\s;,'\"`]+;[^\s;]")  # key=a;b... inside a SPEC


def _unquoted_list(text: str) -> bool:
    """A SPEC's `key=a;b` list that a shell would cut at the `;`: no quote opens before it in its
    shell word (the SPEC holds no spaces)."""
    for word in text.split():
        match = SPEC_LIST.search(word)
        if match and not any(quote in word[:match.start()] for quote in "'\""):
            return True
    return False


@pytest.mark.parametrize("source", ["docs", "help"])
def test_spec_lists_are_quoted_where_a_shell_would_read_them(source):
    texts = [t for path in DOCUMENTS for t in _markdown_texts(path)] if source == "docs" else _help_texts()
    wrong = [f"{where}: {text}" for where, text, _ in texts if _unquoted_list(text)]
    assert not wrong, "quote these (a shell ends a command at ';'):\n" + "\n".join(wrong)


def test_the_quoting_check_sees_an_unquoted_list():
    assert _unquoted_list("focusfl participation bernoulli:p=0.1;0.5 --clients 2")
    assert _unquoted_list("bernoulli:p=0.1;0.5;0.9;0.2")
    assert _unquoted_list("(phi=0.1;0.5;...)")
    assert not _unquoted_list("focusfl participation 'bernoulli:p=0.1;0.5' --clients 2")
    assert not _unquoted_list("--participation 'bernoulli:p=0.1;0.5;0.9;0.2'")
    assert not _unquoted_list("--participation=\"label:phi=0.1;0.5\" (default full; see docs)")


def _documented_metrics_columns() -> set[str]:
    """The columns docs/runs.md's table of run files names for metrics.csv."""
    lines = (ROOT / "docs" / "runs.md").read_text().splitlines()
    row = next(line for line in lines if line.startswith("| `metrics.csv` |"))
    return set(re.findall(r"`(\w+)`", row)) - {"metrics"}


def test_metrics_columns_written_are_the_documented_ones(tmp_path):
    import numpy as np

    from cli_harness import run_cli

    rng = np.random.default_rng(0)
    data = tmp_path / "toy.npz"
    np.savez(data, images=rng.random((60, 6, 6)).astype("float32"), labels=rng.integers(0, 3, 60))
    small = "ridge:clients=4,dim=3,samples=5"
    runs = {
        "ridge": ["--algorithm", "focus", "--problem", small, "--rounds", "3"],
        "diverged": ["--algorithm", "focus", "--problem", small, "--rounds", "3", "--lr", "1e308"],
        "nn": ["--algorithm", "fedavg", "--problem",
               f"nn:data={data},test_fraction=0.2,validation=0.2,clients=3,batch=4,model=logreg",
               "--lr", "0.1", "--rounds", "2", "--eval-every", "1"],
    }
    written = set()
    for name, args in runs.items():
        proc = run_cli("run", *args, "--out", str(tmp_path / name))
        assert proc.returncode == (1 if name == "diverged" else 0), proc.stderr
        columns = (tmp_path / name / "metrics.csv").read_text().splitlines()[0].split(",")
        assert columns[-1] == "diverged", name
        written |= set(columns)
    assert written == _documented_metrics_columns()


def test_the_work_example_sweeps_every_registered_algorithm():
    """docs/examples/work.toml is the table of docs/algorithms.md's work section (tests/test_figures.py
    compares them): it leaves no registered algorithm out."""
    import tomllib

    from focusfl.algorithms import ALGORITHMS

    listed = tomllib.loads((ROOT / "docs" / "examples" / "work.toml").read_text())["algorithms"]
    names = [entry if isinstance(entry, str) else entry["name"] for entry in listed]
    assert sorted(set(ALGORITHMS) - set(names)) == [], "left out of docs/examples/work.toml"

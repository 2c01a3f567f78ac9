"""docs/cli.md is the reference of every command and option: each (sub)command of focusfl's
parser has a section that names it, and that section names each of its options.

Read from the parser object (focusfl.cli.build_parser), not from --help text. A (sub)command
counts as documented in every section of docs/cli.md that shows it as `focusfl WORDS` (in a
heading, a code block or an inline span); its options must appear in one of those sections.
The failure lists exactly what is missing, command by command.
"""
from __future__ import annotations

import argparse
import re

from focusfl.cli import build_parser
from test_docs import ROOT, _parsers

CLI_DOC = ROOT / "docs" / "cli.md"
HELP = {"-h", "--help"}


def sections(text: str) -> list[str]:
    """docs/cli.md cut at its second-level headings (the text before the first is one too)."""
    return re.split(r"\n(?=## )", text)


def naming(path: str, text: str) -> bool:
    """Whether ``text`` shows the command ``focusfl PATH`` (not a longer command name)."""
    words = r"\s+".join(map(re.escape, ["focusfl", *path.split()]))
    return re.search(rf"`{words}(?![\w-])", text) is not None or re.search(
        rf"^{words}(?![\w-])", text, re.MULTILINE) is not None


def option_named(option: str, text: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text) is not None


def missing_from(text: str, parser: argparse.ArgumentParser) -> list[str]:
    """'focusfl WORDS' for each undocumented command, 'focusfl WORDS: --a, --b' for each
    command whose sections leave options out."""
    parts = sections(text)
    missing = []
    for path, sub in _parsers(parser):
        options = sorted({o for action in sub._actions for o in action.option_strings} - HELP)
        if not path:
            absent = [o for o in options if not option_named(o, text)]
            if absent:
                missing.append(f"focusfl: {', '.join(absent)}")
            continue
        where = [part for part in parts if naming(path, part)]
        if not where:
            missing.append(f"focusfl {path}")
            continue
        absent = [o for o in options if not any(option_named(o, part) for part in where)]
        if absent:
            missing.append(f"focusfl {path}: {', '.join(absent)}")
    return missing


def test_every_command_and_option_is_in_cli_md():
    missing = missing_from(CLI_DOC.read_text(), build_parser())
    assert not missing, "docs/cli.md leaves out:\n" + "\n".join(missing)


def test_the_check_names_what_is_missing():
    parser = argparse.ArgumentParser(prog="focusfl")
    sub = parser.add_subparsers()
    run = sub.add_parser("run")
    run.add_argument("--rounds")
    run.add_argument("--lr")
    sub.add_parser("runner")
    doc = "# focusfl\n\n## `focusfl run`\n\n`--rounds` R\n\n## other\n\n`--lr` is elsewhere\n"
    assert missing_from(doc, parser) == ["focusfl run: --lr", "focusfl runner"]

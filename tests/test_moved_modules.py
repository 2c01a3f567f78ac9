"""Code written against focusfl.experiments keeps working after the room became sweeps/ and
reproduce/: an old path imports the moved module itself (one object, not a copy) and warns once,
naming the new path (src/focusfl/experiments/__init__.py)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from focusfl.experiments import MOVED


def _python(code: str) -> subprocess.CompletedProcess:
    # A fresh interpreter: the first import of an old path is the one that warns.
    return subprocess.run([sys.executable, "-W", "always::FutureWarning", "-c", code], capture_output=True,
                          text=True, timeout=120)


def test_an_old_path_imports_the_moved_module_and_names_it():
    proc = _python(
        "from focusfl.experiments.privacy_study import privacy_section\n"
        "from focusfl.experiments import sweep\n"
        "import focusfl.reproduce.privacy_study as study, focusfl.sweeps.sweep as moved\n"
        "assert privacy_section is study.privacy_section and sweep is moved\n"
        "assert moved.__spec__.name == 'focusfl.sweeps.sweep'  # the module keeps its own spec\n"
        "import pickle; assert pickle.loads(pickle.dumps(moved.make_experiment)) is moved.make_experiment\n")
    assert proc.returncode == 0, proc.stderr
    warned = [line for line in proc.stderr.splitlines() if "FutureWarning" in line]
    assert warned == [
        "<string>:1: FutureWarning: focusfl.experiments.privacy_study moved to focusfl.reproduce.privacy_study: "
        "import it from there",
        "<string>:2: FutureWarning: focusfl.experiments.sweep moved to focusfl.sweeps.sweep: import it from there"]


def test_every_old_module_has_a_home_and_an_unknown_one_fails_as_usual():
    import importlib

    for name, new in MOVED.items():
        assert importlib.util.find_spec(new) is not None, name
    proc = _python("import focusfl.experiments.no_such_module")
    assert proc.returncode == 1 and "ModuleNotFoundError: No module named 'focusfl.experiments.no_such_module'" in proc.stderr


@pytest.mark.parametrize("old, new", [("reproduce", "focusfl.reproduce.registry"),
                                      ("matrix_commands", "focusfl.matrix.cli")])
def test_a_renamed_module_is_found_under_its_old_name(old, new):
    proc = _python(f"import importlib, {new} as moved\n"
                   f"assert importlib.import_module('focusfl.experiments.{old}') is moved\n")
    assert proc.returncode == 0, proc.stderr

"""Where ``focusfl.experiments`` went: the room held two things and is now two rooms.

- ``focusfl.sweeps``: the machinery any study runs on (sweep, tune, executors, aggregate, cache,
  layout, the conformance kit of ``focusfl check``);
- ``focusfl.reproduce``: the papers' claims (the presets, listed by ``registry``; the studies,
  the report and its verdicts);
- ``focusfl.matrix.cli``: the ``bias`` and ``matrices`` commands (was ``matrix_commands``).

Code written against the old paths keeps working: ``from focusfl.experiments.sweep import
make_experiment`` imports ``focusfl.sweeps.sweep`` itself (the same module object, not a copy, so a
registry or a cache inside it is shared) and warns once, naming the new path. Nothing in focusfl
imports this package; it goes when the old paths have had a release to move.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

# old module -> where it lives now (the command lines' module, experiments.cli, was split between
# sweeps/cli.py and reproduce/cli.py: it is no library name and has no alias)
MOVED = {
    **{name: f"focusfl.sweeps.{name}" for name in (
        "sweep", "tune", "executors", "ray_tracker", "aggregate", "cache", "layout", "conformance")},
    **{name: f"focusfl.reproduce.{name}" for name in (
        "preset", "reproduce_delays", "reproduce_nn", "reproduce_report", "reproduce_ridge", "studies", "suite_study",
        "baselines_study", "privacy_study", "nn_study", "exactness", "verdicts", "authors_loop")},
    "reproduce": "focusfl.reproduce.registry",
    "matrix_commands": "focusfl.matrix.cli",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports ``focusfl.experiments.NAME`` as the module it moved to."""

    def __init__(self) -> None:
        self.specs: dict[str, importlib.machinery.ModuleSpec] = {}

    def find_spec(self, fullname, path=None, target=None):
        package, _, name = fullname.rpartition(".")
        if package != __name__ or name not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        new = MOVED[spec.name.rpartition(".")[2]]
        warnings.warn(f"{spec.name} moved to {new}: import it from there", FutureWarning, stacklevel=2)
        module = importlib.import_module(new)
        self.specs[module.__name__] = module.__spec__
        return module

    def exec_module(self, module) -> None:
        # The import system gave the module the alias's spec; it keeps its own (pickling, reload).
        module.__spec__ = self.specs.pop(module.__name__)


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModules())

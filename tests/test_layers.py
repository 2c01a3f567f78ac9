"""The package's layering, checked from the source: no import cycle between files, no upward arrow.

Every import of every module under src/focusfl is read with ``ast`` (at module level and inside
functions: a lazy import is still a dependency) and resolved to the file it loads. Importing a
package (``from ..participation import make_participation``) loads its ``__init__.py``;
``from . import bias`` loads ``bias.py`` when such a module exists. The rooms, bottom-up (a room
imports itself and the rooms listed before it, never one after; docs/architecture.md):

    base         errors spec limits rng argtypes threads signals device words __init__ (the version)
    io/          atomic writes, marked folders, figures: imports errors and the version only
    core         metrics.py plots.py data/ problems/ algorithms/ engine/ participation/ work/
                 privacy/ matrix/, in this order: pure computation and drawing
    recordings/  other projects' recordings parsed into availability and work traces
    runs/        the run's configuration, folder format, driver, checkpoints, TensorBoard
    sweeps/      grids of runs, tune, executors, aggregation, the result cache, the conformance kit
    reproduce/   the papers' claims: presets, studies, the report and its verdicts
    experiments/ the old paths of sweeps/ and reproduce/ modules, imported as the moved modules
    flower/      the Flower adapter
    cli          every module named cli (focusfl/cli.py, flower/cli.py, runs/cli.py, ...)
"""
from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "focusfl"

BASE = ("__init__", "errors", "spec", "limits", "rng", "argtypes", "threads", "signals", "device", "words")
CORE = ("metrics", "plots", "data", "problems", "algorithms", "engine", "participation", "work", "privacy", "matrix")
# Bottom-up: a room imports itself and the rooms before it. A base module is one room with the rest of base.
ROOMS = ("base", "io", *CORE, "recordings", "runs", "sweeps", "reproduce", "experiments", "flower", "cli")
# The layers of the rooms (the core's rooms are pure: no options, no folders of their own).
LAYERS = {"base": "base", "io": "io", **{name: "core" for name in CORE}, "recordings": "recordings", "runs": "runs",
          "sweeps": "sweeps", "reproduce": "reproduce", "experiments": "experiments", "flower": "flower", "cli": "cli"}
# io/ sits below the rest of base too: it may name focusfl's errors and version, nothing else.
IO_MAY_IMPORT = {"focusfl", "focusfl.errors"}
# No room holds more than this share of the package's lines (a room that grows past it is two).
MAX_ROOM_SHARE = 0.20


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_file(name: str) -> Path | None:
    """The file that importing ``name`` executes last: NAME.py or NAME/__init__.py."""
    base = SRC.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def is_package(name: str) -> bool:
    return SRC.joinpath(*name.split(".")).is_dir()


def room(name: str) -> str:
    """The room of module ``name``: its top-level package, base for a base module, cli for a cli module."""
    parts = name.split(".")
    if parts[-1] == "cli":
        return "cli"
    top = parts[1] if len(parts) > 1 else "__init__"
    if top in BASE:
        return "base"
    if top in ROOMS:
        return top
    raise AssertionError(f"{name} is in no room: add it to tests/test_layers.py and docs/architecture.md")


def layer(name: str) -> str:
    return LAYERS[room(name)]


def _absolute(path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    anchor = package[: len(package) - node.level + 1]
    return ".".join(anchor + ([node.module] if node.module else []))


def imports(path: Path) -> dict[str, int]:
    """focusfl modules that ``path`` imports (module level or not), each with a line doing it."""
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(path, node)
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                # `from PKG import x` loads PKG/x.py when x is a module, else PKG's __init__.py.
                targets.append(submodule if is_package(source) and module_file(submodule) else source)
        for target in targets:
            if target.split(".")[0] == "focusfl" and module_file(target) is not None:
                found.setdefault(target, node.lineno)
    return found


def import_graph() -> dict[str, dict[str, int]]:
    graph = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        graph[module_name(path)] = {t: line for t, line in imports(path).items() if t != module_name(path)}
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle through each strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for succ in graph.get(node, ()):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_cycle_within(graph, set(component)) for component in components]


def _cycle_within(graph: dict[str, dict[str, int]], component: set[str]) -> list[str]:
    """A shortest path from the component's first module back to itself, inside the component."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for succ in sorted(graph[node]):
                if succ == start:
                    return paths[node] + [start]
                if succ in component and succ not in paths:
                    paths[succ] = paths[node] + [succ]
                    following.append(succ)
        frontier = following
    raise AssertionError(f"no cycle through {start}")  # unreachable in a strongly connected component


def upward_arrows(graph: dict[str, dict[str, int]]) -> list[str]:
    wrong = []
    for source, targets in sorted(graph.items()):
        level = ROOMS.index(room(source))
        for target, line in sorted(targets.items()):
            if room(source) == "io" and room(target) != "io" and target not in IO_MAY_IMPORT:
                wrong.append(f"{source}:{line} (io) imports {target}: io imports only errors and the version")
            elif ROOMS.index(room(target)) > level:
                wrong.append(f"{source}:{line} ({room(source)}) imports {target} ({room(target)})")
    return wrong


def room_lines() -> dict[str, int]:
    """Lines of the package's modules, by room."""
    lines: dict[str, int] = {}
    for path in PACKAGE.rglob("*.py"):
        name = room(module_name(path))
        lines[name] = lines.get(name, 0) + len(path.read_text().splitlines())
    return lines


def _where(graph: dict[str, dict[str, int]], cycle: list[str]) -> str:
    return " -> ".join(f"{a} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:])) + f" -> {cycle[-1]}"


def test_no_import_cycle_between_files():
    graph = import_graph()
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(_where(graph, cycle) for cycle in found)


def test_no_module_imports_a_room_above_its_own():
    wrong = upward_arrows(import_graph())
    assert not wrong, "upward imports (a room imports only itself and the rooms below):\n" + "\n".join(wrong)


def test_no_room_holds_more_than_a_fifth_of_the_package():
    lines = room_lines()
    total = sum(lines.values())
    crowded = {name: f"{count / total:.1%}" for name, count in lines.items() if count > MAX_ROOM_SHARE * total}
    assert not crowded, f"rooms above {MAX_ROOM_SHARE:.0%} of the package's {total:,} lines: {crowded}"
    assert set(lines) == set(ROOMS)  # every room holds modules, and every module is in a room


def test_the_checker_resolves_imports_as_python_does():
    graph = import_graph()
    assert len(graph) > 60 and all(layer(name) for name in graph)  # every module has a layer
    # A package import loads the package's __init__; `from . import x` loads x.py.
    assert "focusfl.participation" in graph["focusfl.matrix.bias"]
    assert "focusfl.engine.simulate" in graph["focusfl.matrix.bias"]
    assert "focusfl.errors" in graph["focusfl.cli"]
    # In-function imports count: the CLI loads its command modules lazily.
    assert any(target.startswith("focusfl.sweeps") for target in graph["focusfl.cli"])
    assert room("focusfl.flower.cli") == "cli" and room("focusfl.io") == "io" and room("focusfl") == "base"
    assert room("focusfl.matrix.cli") == "cli" and room("focusfl.recordings.fedscale") == "recordings"
    assert layer("focusfl.participation.trace") == "core" and layer("focusfl.reproduce.studies") == "reproduce"


def test_the_checker_finds_a_cycle_and_an_upward_arrow():
    graph = {"focusfl.a": {"focusfl.b": 1}, "focusfl.b": {"focusfl.c": 2}, "focusfl.c": {"focusfl.a": 3},
             "focusfl.d": {"focusfl.a": 4}}
    assert cycles(graph) == [["focusfl.a", "focusfl.b", "focusfl.c", "focusfl.a"]]
    arrows = upward_arrows({"focusfl.matrix.bias": {"focusfl.runs.config": 7},
                            "focusfl.io.outputs": {"focusfl.spec": 3, "focusfl.errors": 4},
                            "focusfl.runs.folder": {"focusfl.io.outputs": 5}})
    assert arrows == ["focusfl.io.outputs:3 (io) imports focusfl.spec: io imports only errors and the version",
                      "focusfl.matrix.bias:7 (matrix) imports focusfl.runs.config (runs)"]
    # Inside the core too: participation sits below work, so it never imports it.
    assert upward_arrows({"focusfl.participation.trace": {"focusfl.work.capacity": 9}}) == [
        "focusfl.participation.trace:9 (participation) imports focusfl.work.capacity (work)"]
    assert upward_arrows({"focusfl.reproduce.studies": {"focusfl.sweeps.tune": 1}}) == []
    assert upward_arrows({"focusfl.sweeps.tune": {"focusfl.reproduce.verdicts": 2}}) == [
        "focusfl.sweeps.tune:2 (sweeps) imports focusfl.reproduce.verdicts (reproduce)"]


def test_the_size_check_counts_every_line_of_every_room():
    lines = room_lines()
    assert sum(lines.values()) == sum(len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py"))
    assert lines["cli"] >= len((PACKAGE / "cli.py").read_text().splitlines())  # cli.py and every */cli.py


# -- imports at module top ------------------------------------------------------------------------
# An import inside a function is a dependency found only when that function runs (a missing module
# fails mid-run, after hours). It is allowed only for a measured reason:
LAZY_LIBRARIES = {  # optional extras, or slow to import for commands that never use them
    "flwr", "ray", "transformers", "datasets", "flwr_datasets", "safetensors", "tokenizers", "pyarrow",
    "tensorboard", "matplotlib", "PIL", "scipy", "cryptography", "grpc", "huggingface_hub", "psutil",
    "dp_accounting",  # the privacy extra: only runs with --dp ...,delta=D import it
}
LAZY_MODULES = {
    # Every command's modules are imported inside `_interrupts_deferred()` so that a Ctrl-C during
    # start-up (torch alone took about 5 s under load) exits 130 in one line (test_cli_failures).
    "cli.py": None,
    # `focusfl --help` builds this parser: it must import no Flower module.
    "flower/cli.py": None,
    "flower/local.py": {".tls", "focusfl"},  # .tls needs cryptography; the package path of a child's PATH
    "limits.py": {"resource"},  # Unix only
    "sweeps/executors.py": {"ctypes"},  # prctl, Linux only
    "runs/tensorboard.py": {"torch.utils.tensorboard"},  # needs the tensorboard extra
    # focusfl.work imports torch; a trace imported without --work-out never needs it, and
    # `focusfl participation import` then starts without torch (test_participation_import).
    "recordings/importing.py": {"..work.trace"},
}


def function_level_imports() -> list[tuple[str, int, str]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = str(path.relative_to(PACKAGE))
        seen: set[int] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for inner in ast.walk(node):
                if isinstance(inner, (ast.Import, ast.ImportFrom)) and id(inner) not in seen:
                    seen.add(id(inner))
                    if isinstance(inner, ast.ImportFrom):
                        found.append((relative, inner.lineno, "." * inner.level + (inner.module or "")))
                    else:
                        found.extend((relative, inner.lineno, alias.name) for alias in inner.names)
    return found


def lazy_allowed(relative: str, module: str) -> bool:
    if module.split(".")[0] in LAZY_LIBRARIES:
        return True
    if relative in LAZY_MODULES:
        allowed = LAZY_MODULES[relative]
        return allowed is None or module in allowed
    return False


def test_imports_sit_at_module_top_unless_a_reason_is_listed():
    wrong = [f"{relative}:{line} imports {module} inside a function"
             for relative, line, module in function_level_imports() if not lazy_allowed(relative, module)]
    assert not wrong, "\n".join(wrong)


def test_the_import_check_finds_an_import_inside_a_function():
    assert not lazy_allowed("engine/loop.py", "..algorithms")
    assert lazy_allowed("engine/loop.py", "matplotlib.pyplot") and lazy_allowed("cli.py", ".sweeps.sweep")
    assert not lazy_allowed("limits.py", "torch")

"""The package's import graph has no cycles, by module and by folder; importing the public API never loads the AWS
SDK.

Taken by folder (each sub-package of ``picoflow/`` one unit, each top-level module one unit), the units stand in
the order of ``FOLDER_ORDER``, lowest first (docs/concepts/layout.md explains it): an import that runs, at module
level or inside a function, only reaches a unit listed before its own. Type-checking-only imports never run, so
they may name a type from anywhere.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "picoflow"


def module_files() -> dict[str, Path]:
    """Every module under ``picoflow/`` by dotted name (a package by its own name)."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _type_checking_only(tree: ast.AST) -> set[int]:
    """Ids of the nodes under ``if TYPE_CHECKING:``: imports there never run, so they close no loop."""
    hidden: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            hidden.update(id(inner) for statement in node.body for inner in ast.walk(statement))
    return hidden


def imported_modules(name: str, path: Path, modules: dict[str, Path], *, type_checking: bool = False) -> set[str]:
    """Modules of the package that ``name`` imports when it runs: at the top or inside functions (with
    ``type_checking``, also those it names only for the type checker)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    hidden = set() if type_checking else _type_checking_only(tree)
    for node in ast.walk(tree):
        if id(node) in hidden:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            # ``from package import module`` depends on the module; ``from module import name`` on the module.
            targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source
                       for alias in node.names]
        else:
            continue
        found.update(target for target in targets if target in modules)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def import_layers() -> dict[str, int]:
    """Each module's layer: how deep it sits in the import graph that runs (a module importing nothing is 0)."""
    graph = import_graph()
    layer: dict[str, int] = {}

    def depth(module: str) -> int:
        if module not in layer:
            layer[module] = 1 + max((depth(target) for target in graph[module]), default=-1)
        return layer[module]

    return {module: depth(module) for module in graph}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module, and modules that import themselves."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph[node]:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


#: Every unit of ``picoflow/``, lowest layer first; a unit imports (when it runs) only units listed before it.
FOLDER_ORDER = [
    # leaves: errors, wire formats, checks, the deadline
    "errors", "wire", "validation", "parsing", "deadline",
    # the stored document and the stores that keep it
    "session/", "stores",
    # what the document is made of and written with
    "logger", "usage", "messages", "files/", "results", "events",
    # model providers, and the spans of their calls
    "models/", "telemetry/",
    # the conversation's state and memory, with the rolling summaries
    "conversation/",
    # tools from MCP servers, and batches of sessions
    "mcp/", "batch",
    # the authoring surface: flows, steps, tools, transitions, decisions, and the running turn's context
    "authoring/",
    # the session's life over a store, the turn, the engine
    "lifecycle", "turn/", "engine",
    # open protocols over the engine (AG-UI, MCP, A2A), below the adapters that give them routes
    "protocols/",
    # adapters
    "aws/", "local/",
]


def unit_of(module: str) -> str:
    """The folder-scale unit of a module: its sub-package (``session/``) or, at the top level, its own name."""
    parts = module.split(".")
    if len(parts) == 1:
        return module
    return f"{parts[1]}/" if (PACKAGE / parts[1]).is_dir() else parts[1]


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph taken by folder: one edge per pair of distinct units, the package root left out."""
    units: dict[str, set[str]] = {}
    for module, targets in graph.items():
        if module == "picoflow":
            continue
        edges = units.setdefault(unit_of(module), set())
        edges.update(unit_of(target) for target in targets if target != "picoflow")
    for unit, edges in units.items():
        edges.discard(unit)
    return units


def test_the_graph_is_read_from_every_kind_of_import():
    graph = import_graph()
    assert len(graph) > 40
    # A top-level import and an import inside a function each count as an edge; a type-checking-only one does not.
    assert "picoflow.authoring.step" in graph["picoflow.authoring.flow"]
    assert {"picoflow.session.memory_store", "picoflow.session.dynamodb_store"} <= graph["picoflow.session.factory"]
    assert "picoflow.authoring.flow" not in graph["picoflow.authoring.step"]


def test_the_cycle_finder_reports_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"d"}, "e": {"a"}}
    assert cycles(graph) == [["a", "b", "c"], ["d"]]


def test_no_module_takes_part_in_an_import_cycle():
    found = cycles(import_graph())
    assert not found, "Import cycles inside picoflow/:\n" + "\n".join(" <-> ".join(cycle) for cycle in found)


def test_the_folder_graph_takes_each_sub_package_as_one_unit():
    units = folder_graph(import_graph())
    assert {"session/", "turn/", "models/", "engine", "authoring/"} <= set(units)
    assert "session/" in units["lifecycle"] and "picoflow" not in units
    assert cycles({"a/": {"b"}, "b": {"a/"}}) == [["a/", "b"]]


def test_no_folder_takes_part_in_an_import_cycle():
    found = cycles(folder_graph(import_graph()))
    assert not found, "Import cycles between folders of picoflow/:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_every_import_points_down_the_folder_order():
    units = folder_graph(import_graph())
    assert sorted(units) == sorted(FOLDER_ORDER), "place each new unit of picoflow/ in FOLDER_ORDER"
    rank = {unit: index for index, unit in enumerate(FOLDER_ORDER)}
    upward = sorted(f"{unit} -> {target}" for unit, targets in units.items() for target in targets
                    if rank[target] >= rank[unit])
    assert not upward, "Imports that run back up the folder order:\n" + "\n".join(upward)


@pytest.mark.parametrize(
    "statement",
    [
        "import picoflow",
        "from picoflow import Flow, Step, FlowEngine\n"
        "from picoflow.stores import MemorySessionStore, SQLiteSessionStore",
    ],
)
def test_the_public_api_does_not_load_the_aws_sdk(statement):
    check = f"import sys\n{statement}\nprint(sorted(m for m in ('boto3', 'botocore') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_importing_the_package_loads_no_submodule():
    check = "import sys\nimport picoflow\nprint(sorted(m for m in sys.modules if m.startswith('picoflow.')))"
    result = subprocess.run([sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_make_test_runs_mypy_strict_on_the_package_handlers_and_flows():
    import tomllib

    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    prerequisites = next(line for line in makefile.splitlines() if line.startswith("test:")).split(":", 1)[1].split()
    assert "typecheck" in prerequisites
    recipe = makefile.split("\ntypecheck:", 1)[1].split("\n\n", 1)[0]
    assert "/mypy" in recipe
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]
    assert config["strict"] is True and set(config["files"]) == {"picoflow", "handlers", "flows"}
    # Relaxations are per module, for untyped third-party packages only.
    for override in config.get("overrides", []):
        modules = override["module"] if isinstance(override["module"], list) else [override["module"]]
        assert not any(module.split(".")[0] in {"picoflow", "handlers", "flows"} for module in modules), override

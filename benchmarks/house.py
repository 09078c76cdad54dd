"""The shape of the package: how many modules sit directly under ``picoflow/``, the largest modules, the
``ContextVar``s, and the circle that type-checking imports close.

Run: .venv/bin/python benchmarks/house.py [--write]

The runtime import graph has no cycle (``tests/test_architecture.py`` holds that). This counts what that test
lets pass: imports under ``if TYPE_CHECKING:`` name a type from anywhere, so they can tie modules into a circle
that a reader still has to hold in mind. Here every import counts, runtime or type-checking:

- circle: the largest strongly connected set of modules of that graph;
- arrows back up: imports (of either kind) from a module into one of a higher runtime layer, the layer being
  how deep a module sits in the runtime import graph (a leaf is 0), so only type-checking imports can be these.

``--write`` rewrites this benchmark's RESULTS.md section.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.results import write_section  # noqa: E402
from tests.test_architecture import cycles, import_layers, module_files  # noqa: E402

PACKAGE = ROOT / "picoflow"


def every_import(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Modules of the package that ``name`` names in any import, type-checking ones included."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source
                       for alias in node.names]
        else:
            continue
        found.update(target for target in targets if target in modules and target != name)
    return found


def figures() -> dict[str, str]:
    modules = module_files()
    lines = {name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in modules.items()}
    graph = {name: every_import(name, path, modules) for name, path in modules.items()}
    graph.pop("picoflow", None)
    for targets in graph.values():
        targets.discard("picoflow")
    layers = import_layers()
    back_up = sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets if layers[b] > layers[a])
    circles = cycles(graph)
    largest = max(circles, key=len, default=[])
    context_vars = sum(path.read_text(encoding="utf-8").count("ContextVar(") for path in modules.values())
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    biggest = sorted(lines.items(), key=lambda item: -item[1])[:3]
    return {
        "modules directly under picoflow/": str(len(top)),
        "largest modules (lines)": ", ".join(f"{name.removeprefix('picoflow.')} {count}" for name, count in biggest),
        "modules over 500 lines": str(sum(1 for count in lines.values() if count > 500)),
        "ContextVars": str(context_vars),
        "imports running back up a layer (type-checking ones)": str(len(back_up)),
        "largest circle, type-checking imports included (modules)": str(len(largest)),
        "modules of that circle": ", ".join(name.removeprefix("picoflow.") for name in largest) or "none",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite this benchmark's RESULTS.md section")
    args = parser.parse_args()
    rows = figures()
    table = "| measure | value |\n|---|---|\n" + "\n".join(f"| {key} | {value} |" for key, value in rows.items())
    print(table)
    if args.write:
        write_section("The shape of the package (house.py)", "python benchmarks/house.py --write", table)


if __name__ == "__main__":
    main()

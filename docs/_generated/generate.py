"""Write the Markdown files the pages include that are read from the repository, so they cannot drift.

``template-parameters.md`` beside this script is the table of ``template.yaml``'s parameters, each with its default
and description; ``docs/reference/configuration.md`` includes it. Run ``python docs/_generated/generate.py`` (``make
docs`` does) after changing the template and commit the result; ``--check`` writes nothing and exits 1 when a
committed file differs from what the repository gives (tests/test_reference_pages.py asserts the same).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TEMPLATE_PARAMETERS = HERE / "template-parameters.md"


class TemplateLoader(yaml.SafeLoader):
    """A YAML loader that reads CloudFormation's short-form functions (``!Ref`` ...) as plain values."""


def _any_tag(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
    if isinstance(node, yaml.ScalarNode):
        return loader.construct_scalar(node)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node)
    return loader.construct_mapping(node)  # type: ignore[arg-type]


TemplateLoader.add_multi_constructor("!", _any_tag)


def template_parameters(template: Path = ROOT / "template.yaml") -> list[tuple[str, str, str]]:
    """Each parameter of ``template``: its name, its default as the table shows it, and its description."""
    parameters = yaml.load(template.read_text(encoding="utf-8"), Loader=TemplateLoader)["Parameters"]
    rows = []
    for name, spec in parameters.items():
        default = spec.get("Default")
        shown = "(empty)" if default in ("", None) else f"`{default}`"
        rows.append((name, shown, " ".join(str(spec.get("Description", "")).split())))
    return rows


def parameters_table(template: Path = ROOT / "template.yaml") -> str:
    """The Markdown table of ``template``'s parameters, as ``template-parameters.md`` holds it."""
    lines = ["| Parameter | Default | What it sets |", "| --- | --- | --- |"]
    for name, default, text in template_parameters(template):
        # A pipe in a description would end its cell.
        cell = text.replace("|", "\\|")
        lines.append(f"| `{name}` | {default} | {cell} |")
    return "\n".join(lines) + "\n"


#: Each generated file and the function that gives its text.
GENERATED = {TEMPLATE_PARAMETERS: parameters_table}


def main(argv: list[str]) -> int:
    """Write every generated file; with ``--check``, only name those that differ and exit 1 if any does."""
    check = "--check" in argv
    stale = []
    for path, text in GENERATED.items():
        wanted = text()
        if path.is_file() and path.read_text(encoding="utf-8") == wanted:
            continue
        stale.append(path)
        if not check:
            path.write_text(wanted, encoding="utf-8")
    for path in stale:
        print(f"{path.relative_to(ROOT)} {'differs from the repository' if check else 'written'}")
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

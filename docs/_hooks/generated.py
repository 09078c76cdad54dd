"""MkDocs hook: tables the pages show that are read from the repository when the site is built, so they cannot drift.

``<!-- generated:template-parameters -->`` in a page becomes the table of ``template.yaml``'s parameters, each with
its default and description.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- generated:template-parameters -->"


class _TemplateLoader(yaml.SafeLoader):
    """A YAML loader that reads CloudFormation's short-form functions (``!Ref`` ...) as plain values."""


def _any_tag(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
    if isinstance(node, yaml.ScalarNode):
        return loader.construct_scalar(node)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node)
    return loader.construct_mapping(node)  # type: ignore[arg-type]


_TemplateLoader.add_multi_constructor("!", _any_tag)


def template_parameters(template: Path = ROOT / "template.yaml") -> list[tuple[str, str, str]]:
    """Each parameter of ``template``: its name, its default as the table shows it, and its description."""
    parameters = yaml.load(template.read_text(encoding="utf-8"), Loader=_TemplateLoader)["Parameters"]
    rows = []
    for name, spec in parameters.items():
        default = spec.get("Default")
        shown = "(empty)" if default in ("", None) else f"`{default}`"
        rows.append((name, shown, " ".join(str(spec.get("Description", "")).split())))
    return rows


def parameters_table() -> str:
    lines = ["| Parameter | Default | What it sets |", "| --- | --- | --- |"]
    for name, default, text in template_parameters():
        cell = text.replace("|", "\\|")
        lines.append(f"| `{name}` | {default} | {cell} |")
    return "\n".join(lines)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """Replace the page's markers with the generated tables."""
    return markdown.replace(MARKER, parameters_table()) if MARKER in markdown else markdown

"""``picoflow new NAME``: a new project with one flow, its tests, the Lambda handler and a SAM template.

The files come from ``project_template/`` beside this module. Every file there is stored with a ``.tmpl``
suffix, so no tool mistakes a template for part of this package (a ``pyproject.toml``, a test, a module with
placeholders), and is written without it; ``{{key}}`` placeholders are filled in and a ``__package__``
directory takes the flow's package name. ``picoflow new`` then puts the running PicoFlow's wheel in the project's
``wheels/`` folder (``picoflow.local.library_wheel``), which the generated Makefile hands to pip with
``--find-links``, so the project installs without a package index that has PicoFlow.
"""

from __future__ import annotations

import argparse
import keyword
import re
import shlex
import sys
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from picoflow import __version__
from picoflow.local.library_wheel import DISTRIBUTION, WheelError, write_library_wheel

#: The project folder holding PicoFlow's wheel, which the generated Makefile installs the library from.
WHEELS_FOLDER = "wheels"
TEMPLATE_SUFFIX = ".tmpl"
PACKAGE_PLACEHOLDER = "__package__"
# setuptools leaves dotfiles out of package data, so they are stored under a plain name.
_DOTFILES = {"gitignore": ".gitignore"}
MAX_NAME_LENGTH = 40
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:[-_][A-Za-z0-9]+)*")
_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")


class ScaffoldError(ValueError):
    """The project cannot be created: an invalid name, or a directory that is already in use."""


def project_values(name: str) -> dict[str, str]:
    """The placeholder values for a project called ``name``, which is validated first."""
    if not _NAME.fullmatch(name) or len(name) > MAX_NAME_LENGTH:
        raise ScaffoldError(
            f"'{name}' is not a valid project name: use up to {MAX_NAME_LENGTH} letters and digits, starting "
            "with a letter, with single '-' or '_' between words (e.g. travel-desk)."
        )
    package = name.lower().replace("-", "_")
    if keyword.iskeyword(package):
        raise ScaffoldError(f"'{name}' would make the flow package '{package}', a Python keyword: pick another name.")
    if package in ("picoflow_aws", "picoflow"):
        raise ScaffoldError(f"'{name}' is the name of the PicoFlow library itself: pick another name.")
    words = re.split(r"[-_]", name)
    title = "".join(word[:1].upper() + word[1:] for word in words)
    return {
        "project": name,
        "package": package,
        # "travel-desk" -> TravelDeskFlow, and "ticket-flow" -> TicketFlow rather than TicketFlowFlow.
        "flow": title if title.endswith("Flow") and title != "Flow" else f"{title}Flow",
        # CloudFormation stack names allow letters, digits and hyphens only.
        "stack": name.replace("_", "-"),
        # A local version label (1.2.0+dev) is not allowed in a >= requirement.
        "picoflow_version": __version__.split("+")[0],
    }


def create_project(name: str, directory: Path) -> Path:
    """Write the project ``name`` into ``directory / name`` and return that path.

    ``directory`` is created when missing. The project directory may exist only if it is empty: nothing
    is ever overwritten.
    """
    values = project_values(name)
    target = Path(directory) / name
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ScaffoldError(f"{target} already exists and is not an empty directory; nothing was written.")
    files = dict(_template_files(resources.files("picoflow.local") / "project_template", Path(), values))
    target.mkdir(parents=True, exist_ok=True)
    for relative, text in files.items():
        path = target / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("x", encoding="utf-8") as handle:
            handle.write(text)
    return target


def _template_files(folder: Traversable, relative: Path, values: dict[str, str]) -> list[tuple[Path, str]]:
    found: list[tuple[Path, str]] = []
    for entry in sorted(folder.iterdir(), key=lambda item: item.name):
        if entry.is_dir():
            name = values["package"] if entry.name == PACKAGE_PLACEHOLDER else entry.name
            found += _template_files(entry, relative / name, values)
        elif entry.name.endswith(TEMPLATE_SUFFIX):
            name = entry.name.removesuffix(TEMPLATE_SUFFIX)
            found.append((relative / _DOTFILES.get(name, name), _render(entry.read_text(encoding="utf-8"), values)))
    return found


def _render(text: str, values: dict[str, str]) -> str:
    def fill(match: re.Match[str]) -> str:
        key = match.group(1)
        if key not in values:
            raise KeyError(f"The project template uses an unknown placeholder {{{{{key}}}}}.")
        return values[key]

    return _PLACEHOLDER.sub(fill, text)


DESCRIPTION = (
    "Create a PicoFlow project: one flow with its scripted conversation and tests, the Lambda handler, a SAM "
    "template and a Makefile with `make run` and `make test`."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``picoflow new``: ``NAME`` and ``--dir PARENT``."""
    parser.add_argument("name", metavar="NAME", help="project name and directory, e.g. travel-desk")
    parser.add_argument(
        "--dir", metavar="PARENT", type=Path, default=None, help="where to create it (default: the working directory)"
    )


def run(args: argparse.Namespace) -> int:
    """Create the project ``args`` describe, give it this PicoFlow's wheel and print the next steps.

    Returns the exit code.
    """
    try:
        values = project_values(args.name)
        target = create_project(args.name, args.dir if args.dir is not None else Path.cwd())
    except ScaffoldError as error:
        print(f"picoflow new: error: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"picoflow new: error: {error}", file=sys.stderr)
        return 1
    try:
        wheel: Path | None = write_library_wheel(target / WHEELS_FOLDER)
    except (WheelError, OSError) as error:
        wheel = None
        print(f"picoflow new: warning: {error}", file=sys.stderr)
    here = Path.cwd().resolve()
    shown = target.resolve().relative_to(here) if target.resolve().is_relative_to(here) else target
    requirement = f"{DISTRIBUTION}>={values['picoflow_version']}"
    print(f"Created {values['flow']} in {target}\n")
    print(f"  cd {shlex.quote(str(shown))}")
    print("  make run     # the offline demo: a scripted conversation through the Lambda handler")
    print("  make test    # ruff and pytest")
    print()
    if wheel is not None:
        print(f"make installs {requirement} from {WHEELS_FOLDER}/{wheel.name},")
        print("the library you ran this command with, and its dependencies from your package index.")
        print(f"Delete {WHEELS_FOLDER}/ once the index has the PicoFlow version you want.")
    else:
        print(f"make installs {requirement} from your package index.")
    print("\nDeploy with `sam build && sam deploy --guided` (see README.md).")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m picoflow.local.scaffold NAME [--dir PARENT]``, the same as ``picoflow new``."""
    parser = argparse.ArgumentParser(prog="picoflow new", description=DESCRIPTION)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

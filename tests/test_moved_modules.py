"""The layers are packages: few modules sit directly under ``picoflow/``, and a moved module's old path still works."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import picoflow

ROOT = Path(__file__).resolve().parent.parent
OLD_PATHS = sorted(picoflow._MOVED.items())


def test_at_most_sixteen_modules_sit_directly_under_the_package():
    top = sorted(path.name for path in (ROOT / "picoflow").glob("*.py"))
    assert len(top) <= 16, top


def test_every_layer_package_says_what_it_holds():
    for name in ("authoring", "conversation", "turn", "session", "mcp", "models", "files", "aws", "local"):
        package = __import__(f"picoflow.{name}", fromlist=["__doc__"])
        assert package.__doc__ and len(package.__doc__.split()) > 4, name


@pytest.mark.parametrize(("old", "new"), OLD_PATHS, ids=[old for old, _ in OLD_PATHS])
def test_an_old_module_path_is_the_new_module_with_a_warning(old, new):
    check = (
        "import importlib, warnings\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        f"    old = importlib.import_module({old!r})\n"
        f"new = importlib.import_module({new!r})\n"
        "print(old is new, new.__spec__.name, [str(w.message) for w in caught if w.category is DeprecationWarning])\n"
    )
    result = subprocess.run([sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True, check=True)
    same, spec_name, messages = result.stdout.split(" ", 2)
    assert same == "True" and spec_name == new
    assert f"'{old}' is deprecated" in messages and f"use '{new}'" in messages


def test_an_old_module_path_that_became_a_package_answers_its_old_names_with_a_warning():
    from picoflow.conversation.requests import read_conversation

    with pytest.warns(DeprecationWarning, match="picoflow.conversation.requests"):
        from picoflow.conversation import read_conversation as old

    assert old is read_conversation


def test_an_unknown_name_of_the_conversation_package_is_an_attribute_error():
    import picoflow.conversation

    with pytest.raises(AttributeError):
        picoflow.conversation.no_such_name  # noqa: B018

"""The authoring and engine API's docstrings document every parameter, what comes back and an example, and they
stay in step with the signatures (a parameter renamed, added or removed fails here)."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any

import pytest

from picoflow import Flow, FlowEngine, Step, direct, finish, go, stay

#: The calls a newcomer writes first; each docstring has Args (when it takes any), Returns (when it gives
#: something back) and an Example, in the Google style mkdocstrings renders on the reference pages.
DOCUMENTED: dict[str, Callable[..., Any]] = {
    "FlowEngine.run": FlowEngine.run,
    "Flow.config_model": Flow.config_model,
    "Flow.define_steps": Flow.define_steps,
    "Flow.initial_step": Flow.initial_step,
    "Flow.get_context": Flow.get_context,
    "Flow.get_step_state": Flow.get_step_state,
    "Step.get_prompt": Step.get_prompt,
    "Step.use_memory": Step.use_memory,
    "Step.use_model": Step.use_model,
    "Step.save_state": Step.save_state,
    "Step.get_state": Step.get_state,
    "Step.run_step": Step.run_step,
    "go": go,
    "stay": stay,
    "direct": direct,
    "finish": finish,
}
_SECTION = re.compile(r"^(Args|Returns|Raises|Example):\n((?:(?: {4}.*)?\n)*)", re.MULTILINE)


def sections(function: Callable[..., Any]) -> dict[str, str]:
    doc = inspect.getdoc(function) or ""
    return {match[1]: match[2] for match in _SECTION.finditer(doc + "\n")}


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_the_docstring_documents_the_signature_and_shows_an_example(name: str) -> None:
    function = DOCUMENTED[name]
    found = sections(function)
    signature = inspect.signature(function)
    parameters = [p for p in signature.parameters if p not in ("self", "cls")]
    documented = re.findall(r"^    (\w+):", found.get("Args", ""), re.MULTILINE)
    assert documented == parameters, f"{name}: Args lists {documented}, the signature has {parameters}"
    returns_something = signature.return_annotation not in (None, "None", inspect.Signature.empty)
    assert ("Returns" in found) == returns_something, name
    assert "```python" in found.get("Example", ""), f"{name} has no example"


def test_the_sections_are_read_from_the_docstrings() -> None:
    # A pattern that matched nothing would let every docstring pass.
    assert set(sections(FlowEngine.run)) == {"Args", "Returns", "Example"}
    assert "PicoFlowError" in sections(go)["Raises"]

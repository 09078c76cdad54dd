"""The README is a landing page whose example runs; the facts it used to hold are checked in the docs pages.

The docs pages' own examples run in tests/test_docs_examples.py; this module checks what those conventions
cannot: the README's example, its links into the site, and the measured figures the pages quote.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

from picoflow.authoring.decision import ChatDecisionProvider, Choice, DecisionRequest, Noul
from picoflow.models.calls import model_call_for
from picoflow.models.registry import ModelSelection, ProviderRegistry
from picoflow.models.scripted import ScriptedProvider

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
#: A landing page, not a manual: what it is, the two commands, a taste of a flow, links into the site.
MAX_README_LINES = 150


def test_the_readme_example_runs_and_prints_the_scripted_replies(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", README, re.DOTALL)
    example = next(block for block in blocks if "GreetingFlow" in block)
    script = tmp_path / "example.py"
    script.write_text(example, encoding="utf-8")
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["Hello! What is your full name?", "Lovely to meet you, Ada Lovelace!"]


def test_the_readme_is_a_landing_page_with_the_two_commands_and_links_that_resolve():
    assert len(README.splitlines()) <= MAX_README_LINES
    assert "make run" in README and "make test" in README
    links = re.findall(r"\]\(((?:docs/)[^)#]+)\)", README)
    assert len(links) >= 10
    assert [link for link in links if not (ROOT / link).is_file()] == []


def test_the_install_instructions_say_how_to_get_the_package_today():
    # No index has picoflow-aws yet: the pages give the wheel route, never a bare `pip install picoflow-aws`.
    install = (ROOT / "docs/get-started/install.md").read_text(encoding="utf-8")
    for text in (README, install):
        # pip alone builds it, so the .venv of `make run` can.
        assert "python -m pip wheel --no-deps -w dist ." in text and "dist/picoflow_aws-" in text
        assert not re.search(r"^\s*pip install picoflow-aws\b", text, re.MULTILINE)
    assert (ROOT / ".github/workflows/release.yml").is_file()


async def test_the_scripted_replies_of_the_testing_guide_answer_the_calls_they_name():
    guide = (ROOT / "docs/how-to/testing.md").read_text(encoding="utf-8")
    (block,) = re.findall(r'```json title="Scripted replies"\n(.*?)```', guide, re.DOTALL)
    provider = ScriptedProvider(json.loads(block))
    model = provider.chat_model(ModelSelection(provider="scripted", name="m"))

    # Asked in another order than scripted: each call still gets the reply written for it.
    with model_call_for("summary", None):
        assert "Portland" in (await model.ainvoke("fold")).content
    decision = await ChatDecisionProvider(ProviderRegistry(override=provider)).decide(DecisionRequest(
        step_id="RouterStep",
        selection=ModelSelection(provider="openai", name="gpt-4o-mini"),
        questions={"route": Choice(criteria={"search": "search hotels", "book": "book one"}),
                   "ready": Noul(instructions="Is the user ready?")},
        state={"request": "Find me a hotel in Portland", "priorRequests": []},
    ))
    assert decision.answers["route"]["choice"] == "search" and decision.answers["ready"] == {"noul": 0.8}
    with model_call_for("chat", "AskStep"):
        assert (await model.ainvoke("hi")).content.startswith("Hello!")
        assert (await model.ainvoke("Portland")).tool_calls[0]["name"] == "save_city"
    assert provider.purposes == ["summary", "decision", "chat", "chat"] and provider.remaining == 0


def _measured(text: str) -> set[Decimal]:
    return {Decimal(number.replace(",", "")) for number in re.findall(r"\d[\d,]*(?:\.\d+)?", text)}


def _quoted(figure: str, measured: set[Decimal]) -> bool:
    """Whether ``figure`` is one of the measured numbers, rounded to as many decimals as the page shows."""
    value = Decimal(figure.replace(",", ""))
    step = Decimal(1).scaleb(value.as_tuple().exponent)
    return any(number.quantize(step, rounding=ROUND_HALF_UP) == value for number in measured)


def test_the_figures_the_pages_quote_are_those_in_the_benchmark_results():
    measured = _measured((ROOT / "benchmarks/RESULTS.md").read_text(encoding="utf-8"))
    benchmarks = (ROOT / "docs/benchmarks.md").read_text(encoding="utf-8")
    tables = "\n".join(line for line in benchmarks.splitlines() if line.startswith("|") and "---" not in line)
    # Decimal figures and the units that only measurements carry (ms, MB, $): counts like "20 turns" are setup.
    figures = re.findall(r"\d[\d,]*\.\d+|\d[\d,]*(?= ?(?:ms|MB)\b)", tables)
    cold_starts = (ROOT / "docs/operating/cold-starts.md").read_text(encoding="utf-8")
    figures += re.findall(r"\d[\d,]*\.\d+(?= ms)|\d[\d,]*(?= MB)", cold_starts)
    assert len(figures) > 40
    assert [figure for figure in figures if not _quoted(figure, measured)] == []

"""The README's example runs as written."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from picoflow.decision import ChatDecisionProvider, Choice, DecisionRequest, Noul
from picoflow.models.calls import model_call_for
from picoflow.models.registry import ModelSelection, ProviderRegistry
from picoflow.models.scripted import ScriptedProvider

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_example_runs_and_prints_the_scripted_replies(tmp_path):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", readme, re.DOTALL)
    example = next(block for block in blocks if "GreetingFlow" in block)
    script = tmp_path / "example.py"
    script.write_text(example, encoding="utf-8")
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["Hello! What is your full name?", "Lovely to meet you, Ada Lovelace!"]


async def test_the_scripted_replies_of_the_testing_section_answer_the_calls_they_name():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Testing with a scripted model", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```json\n(.*?)```", section, re.DOTALL)
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

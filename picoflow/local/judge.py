"""The judge of ``picoflow eval``: a model of the provider registry that scores one reply against a scenario turn.

The judge is asked for a structured verdict (``Verdict``: a score from 0 to 1 and a one-sentence reason) through
LangChain's structured output, with the instructions of ``judge_prompt.md`` beside this module (or a file of the
team's own) as the system message and the case as a JSON user message. Its calls are ``judge`` calls, so a
scripted model answers them only from replies marked ``"for": "judge"``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from langchain_core.messages import HumanMessage, SystemMessage
from pydantic import BaseModel, Field, field_validator

from picoflow.errors import PicoFlowError
from picoflow.messages import usage_from_message
from picoflow.models.calls import model_call_for
from picoflow.models.registry import ModelSelection, ProviderRegistry

#: The instructions a judge gets unless ``--judge-prompt`` names another file.
DEFAULT_PROMPT_PATH = Path(__file__).with_name("judge_prompt.md")
#: The provider of a judge model named without one (``"judgeModel": "gpt-4o"``).
DEFAULT_PROVIDER = "openai"
#: The provider name that selects a scripted judge.
SCRIPTED = "scripted"


class Verdict(BaseModel):
    """What the judge answers about one reply."""

    score: float = Field(description="From 0 to 1: how well the reply does what was expected.")
    reason: str = Field(description="One sentence saying what decided the score.")

    # Checked here rather than in the schema: some providers' structured output refuses numeric bounds.
    @field_validator("score")
    @classmethod
    def _within_bounds(cls, value: float) -> float:
        if not 0 <= value <= 1:
            raise ValueError("the score must lie between 0 and 1")
        return value


@dataclass(frozen=True)
class JudgeCase:
    """One reply to judge, with what it should have done."""

    flow_name: str
    turn: str
    user_message: str
    expected: str
    reply: str
    config: dict[str, Any] | None = None

    def as_message(self) -> str:
        """The case as the JSON document the judge's user message holds (see ``judge_prompt.md``)."""
        case: dict[str, Any] = {"flowName": self.flow_name, "turn": self.turn}
        if self.config:
            case["sessionConfig"] = self.config
        case.update(userMessage=self.user_message, expectedBehaviour=self.expected, actualReply=self.reply)
        return json.dumps(case, ensure_ascii=False, indent=2)


@dataclass(frozen=True)
class Judgement:
    """The verdict on one reply, or why there is none; ``tokens`` counts the judge's own call."""

    verdict: Verdict | None
    error: str | None = None
    tokens: int = 0


def judge_selection(spec: str, registry: ProviderRegistry) -> ModelSelection:
    """The model ``spec`` names: ``provider:model`` for a registered provider (or ``scripted``), else an OpenAI
    model (``gpt-4o``); a model name may itself hold colons (``bedrock:amazon.nova-lite-v1:0``)."""
    provider, colon, name = spec.partition(":")
    if provider == SCRIPTED:
        return ModelSelection(provider=SCRIPTED, name=name or "judge")
    if not colon or provider not in registry.names():
        provider, name = DEFAULT_PROVIDER, spec
    selection = ModelSelection(provider=provider, name=name, params={"temperature": 0})
    try:
        registry.validate(selection)
    except PicoFlowError:
        # Reasoning models refuse a temperature: those judges take the provider's default.
        return ModelSelection(provider=provider, name=name)
    return selection


class Judge:
    """Scores replies with the model ``selection`` of ``registry``, following the instructions ``prompt``."""

    def __init__(self, registry: ProviderRegistry, selection: ModelSelection, prompt: str) -> None:
        self.selection = selection
        # Built now so a missing key or an unknown model stops the evaluation before its first turn.
        self._model = registry.chat_model(selection)
        self._prompt = prompt
        #: The provider that answers whatever the selection names (a judge script), if any.
        self._answered_by = registry.override.name if registry.override is not None else None

    @property
    def name(self) -> str:
        """The judge as reports show it: ``provider:model``, or the provider that answers in its place (a script)."""
        selected = f"{self.selection.provider}:{self.selection.name}"
        if self._answered_by is None or self._answered_by == self.selection.provider:
            return selected
        return f"{self._answered_by} (in place of {selected})"

    async def judge(self, case: JudgeCase) -> Judgement:
        """The verdict on ``case``; a failed call or an unusable answer is a ``Judgement`` with an ``error``."""
        runnable = self._model.with_structured_output(Verdict, include_raw=True)
        messages = [SystemMessage(content=self._prompt), HumanMessage(content=case.as_message())]
        try:
            with model_call_for("judge", None):
                result = await runnable.ainvoke(messages)
        except Exception as error:  # noqa: BLE001 - a failed judge call fails its turn, not the evaluation
            return Judgement(None, f"the judge call failed ({type(error).__name__}: {error})")
        # include_raw=True: LangChain answers {"raw", "parsed", "parsing_error"}.
        assert isinstance(result, dict)
        tokens = usage_from_message(result.get("raw")).total_tokens if result.get("raw") is not None else 0
        parsed = result.get("parsed")
        if result.get("parsing_error") is not None or not isinstance(parsed, Verdict):
            return Judgement(None, f"the judge's answer is not a verdict ({result.get('parsing_error')})", tokens)
        return Judgement(parsed, None, tokens)


def read_prompt(path: str | Path | None = None) -> str:
    """The judge's instructions: the file at ``path``, else the bundled ``judge_prompt.md``."""
    source = Path(path) if path else DEFAULT_PROMPT_PATH
    try:
        text = source.read_text(encoding="utf-8").strip()
    except OSError as error:
        raise PicoFlowError(f"Cannot read the judge prompt {source}: {error}") from error
    if not text:
        raise PicoFlowError(f"The judge prompt {source} is empty.")
    return text

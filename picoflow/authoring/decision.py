"""Typed, non-generative decisions: the provider contract, the hooks' contexts, the call configuration and the
built-in providers. The questions and answers (``picoflow.authoring.decision_questions``) are importable from here too.

A ``DecisionStep`` (``picoflow.authoring.decision_step``) asks a provider these questions about the conversation
``picoflow.conversation.requests`` reads; the turn runs the call.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator

from picoflow.authoring.decision_questions import PROBABILITY_TOLERANCE as PROBABILITY_TOLERANCE
from picoflow.authoring.decision_questions import Answer as Answer
from picoflow.authoring.decision_questions import Choice as Choice
from picoflow.authoring.decision_questions import ChoiceAnswer as ChoiceAnswer
from picoflow.authoring.decision_questions import Noul as Noul
from picoflow.authoring.decision_questions import NoulAnswer as NoulAnswer
from picoflow.authoring.decision_questions import Question as Question
from picoflow.authoring.decision_questions import Score as Score
from picoflow.authoring.decision_questions import ScoreAnswer as ScoreAnswer
from picoflow.authoring.decision_questions import nearest_level as nearest_level
from picoflow.authoring.decision_questions import validate_answers as validate_answers
from picoflow.authoring.recovery import CallSite
from picoflow.errors import DecisionValidationError, PicoFlowError
from picoflow.messages import usage_from_message
from picoflow.models.calls import model_call_for
from picoflow.models.registry import ModelSelection
from picoflow.session.document import TokenUsage
from picoflow.validation import validation_problems

if TYPE_CHECKING:
    from picoflow.models.registry import ProviderRegistry

#: Fact keys the framework fills in from the conversation.
RESERVED_FACT_KEYS = frozenset({"request", "priorRequests"})
#: Attempts after the first one when a decision call fails transiently (0: a single attempt).
DEFAULT_DECISION_MAX_RETRIES = 0
#: Wall-clock limit of one decision attempt, in milliseconds.
DEFAULT_DECISION_TIMEOUT_MS = 30_000


# -- provider contract -------------------------------------------------------------------------


@dataclass(frozen=True)
class DecisionRequest:
    """Everything a provider needs for one decision: questions (guidance already prepended) and input state."""

    step_id: str
    selection: ModelSelection
    questions: Mapping[str, Question]
    state: Mapping[str, Any]
    timeout_ms: int | None = None


@dataclass(frozen=True)
class DecisionResult:
    """A provider's raw answers (validated by the step afterwards) and what the call cost."""

    answers: Mapping[str, Any]
    usage: TokenUsage | None = None
    request_id: str | None = None


@runtime_checkable
class DecisionProvider(Protocol):
    """Answers decision requests. Register instances with ``FlowEngine(decision_providers={name: provider})``, or
    name them in ``PICOFLOW_DECISION_PROVIDERS`` where the engine is built from the environment.

    A provider may also define ``should_retry(error) -> bool`` to say which of its failures are transient;
    without it ``picoflow.authoring.recovery.is_transient_error`` decides, as for model calls (a timeout is retried,
    a ``KeyError`` is not).
    """

    async def decide(self, request: DecisionRequest) -> DecisionResult: ...


@dataclass(frozen=True, kw_only=True)
class DecisionContext(CallSite):
    """What ``on_decision`` receives next to the answers: the evaluated input and how the call went."""

    request: str
    prior_requests: tuple[str, ...]
    facts: Mapping[str, Any]
    attempts: int
    duration_ms: int
    usage: TokenUsage | None = None
    request_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class DecisionErrorContext(CallSite):
    """What ``on_decision_error`` receives next to the error."""

    attempts: int
    request: str
    prior_requests: tuple[str, ...]


class DecisionConfig(BaseModel):
    """Decision call policy, apart from the chat model's: ``provider``, ``model``, ``timeout_ms``, ``max_retries``.

    The documented camelCase keys (``timeoutMs``, ``maxRetries``) are accepted beside the snake_case names.
    ``provider`` names a registered decision provider, or a chat provider whose model then answers through the
    built-in ``ChatDecisionProvider``; ``model`` is that provider's model name, or a whole chat ``ModelSelection``.
    Without either, the flow's chat model decides. ``max_retries`` counts attempts after the first (unlike a chat
    selection's ``retry_attempts``, which is the total); ``timeout_ms`` limits each attempt, and ``None`` leaves
    only the turn's own deadline. A resolved configuration (``DecisionStep.decision_config()``) always carries
    the ``ModelSelection`` in ``model`` and its provider in ``provider``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True, defer_build=True)

    provider: str | None = Field(default=None, min_length=1)
    model: ModelSelection | str | None = None
    max_retries: int = Field(default=DEFAULT_DECISION_MAX_RETRIES, ge=0, strict=True, alias="maxRetries")
    timeout_ms: int | None = Field(default=DEFAULT_DECISION_TIMEOUT_MS, gt=0, strict=True, alias="timeoutMs")

    @field_validator("model")
    @classmethod
    def _model_named(cls, model: ModelSelection | str | None) -> ModelSelection | str | None:
        if isinstance(model, str) and not model.strip():
            raise ValueError("model must name a model")
        return model

    @property
    def selection(self) -> ModelSelection:
        """The provider and model a resolved configuration asks."""
        if not isinstance(self.model, ModelSelection):
            raise PicoFlowError("This decision configuration is not resolved: use DecisionStep.decision_config().")
        return self.model


#: The option names ``use_decision()`` and ``config_decision()`` accept, snake_case and camelCase.
DECISION_OPTION_NAMES = frozenset(
    name for field, info in DecisionConfig.model_fields.items() for name in (field, info.alias) if name
)
_FIX = "accepted: provider, model, timeoutMs (milliseconds > 0, or None), maxRetries (0 or more)"


def resolve_decision_config(layers: Sequence[tuple[str, Any]], default_model: ModelSelection) -> DecisionConfig:
    """Merge ``(owner, options)`` layers (dicts or ``DecisionConfig``), later ones winning, into a resolved config.

    A layer's ``ModelSelection`` also sets its provider; a model name alone is a model of the layers' provider,
    or of ``default_model``'s; neither gives ``default_model`` itself.
    """
    merged: dict[str, Any] = {}
    for owner, options in layers:
        if options is None:
            continue
        layer = _decision_layer(owner, options)
        values = {name: getattr(layer, name) for name in layer.model_fields_set}
        if isinstance(values.get("model"), ModelSelection):
            values.setdefault("provider", values["model"].provider)
        merged.update(values)
    provider, model = merged.pop("provider", None), merged.pop("model", None)
    if isinstance(model, ModelSelection):
        if provider != model.provider:
            raise PicoFlowError(
                f"The decision provider '{provider}' differs from the provider of model "
                f"{model.provider}:{model.name}; name the model as a string with the provider, "
                "or give a ModelSelection alone."
            )
        selection = model
    elif isinstance(model, str):
        selection = ModelSelection(provider=provider or default_model.provider, name=model)
    elif provider is None or provider == default_model.provider:
        selection = default_model
    else:
        raise PicoFlowError(
            f"The decision provider '{provider}' needs a model name: add model='...' next to provider='{provider}'."
        )
    return DecisionConfig(provider=selection.provider, model=selection, **merged)


def _decision_layer(owner: str, options: Any) -> DecisionConfig:
    if isinstance(options, DecisionConfig):
        return options
    if not isinstance(options, Mapping):
        raise PicoFlowError(f"{owner} must give a dict or a DecisionConfig, not {type(options).__name__}.")
    unknown = sorted(str(name) for name in options if name not in DECISION_OPTION_NAMES)
    if unknown:
        raise PicoFlowError(f"{owner} has unknown decision option(s) {', '.join(unknown)} ({_FIX}).")
    try:
        return DecisionConfig.model_validate(options)
    except ValidationError as exc:
        problem = validation_problems(exc, "", first_only=True)
        raise PicoFlowError(f"{owner} has an invalid decision option ({problem}; {_FIX}).") from exc


# -- providers ---------------------------------------------------------------------------------

_CLASSIFIER_PROMPT = (
    "You are a careful classifier. The user message is a JSON object: the application's facts plus "
    "'request' (the newest user message) and 'priorRequests' (earlier ones, oldest first). "
    "Answer every question below independently, giving for each option the probability (0 to 1) that it "
    "is right; the probabilities of one question sum to 1. Output only the requested structure.\n\nQuestions:\n"
)


class ChatDecisionProvider:
    """The built-in provider: the engine's chat model estimates a probability for every option.

    The step's choice, confidence, score and legend are derived from those estimates, so the model never
    has to produce them consistently itself.
    """

    def __init__(self, models: ProviderRegistry) -> None:
        self._models = models

    async def decide(self, request: DecisionRequest) -> DecisionResult:
        schema = _estimate_schema(request.questions)
        model = self._models.chat_model(request.selection)
        runnable = model.with_structured_output(schema, include_raw=True)
        with model_call_for("decision", request.step_id):
            output = await runnable.ainvoke(_classifier_messages(request))
        # include_raw=True: LangChain answers {"raw", "parsed", "parsing_error"}.
        assert isinstance(output, dict)
        usage = usage_from_message(output)
        parsed = output.get("parsed")
        if not isinstance(parsed, BaseModel):
            problem = output.get("parsing_error") or "no structured output"
            raise DecisionValidationError(f"The model's decision could not be read: {problem}", usage=usage)
        estimates = parsed.model_dump(by_alias=True)
        answers = {name: _answer_from(question, estimates[name]) for name, question in request.questions.items()}
        return DecisionResult(answers=answers, usage=usage)


def _classifier_messages(request: DecisionRequest) -> list[BaseMessage]:
    described = {name: question.model_dump(exclude_none=True) for name, question in request.questions.items()}
    return [
        SystemMessage(content=_CLASSIFIER_PROMPT + json.dumps(described, ensure_ascii=False, indent=1)),
        HumanMessage(content=json.dumps(dict(request.state), ensure_ascii=False)),
    ]


def _estimate_schema(questions: Mapping[str, Question]) -> type[BaseModel]:
    """A pydantic model asking one probability per option; option and question names travel as aliases."""
    fields: dict[str, Any] = {}
    for index, (name, question) in enumerate(questions.items()):
        if isinstance(question, Choice):
            options = {label: f"Probability that '{label}' applies: {json.dumps(text)}"
                       for label, text in question.criteria.items()}
        elif isinstance(question, Score):
            options = {str(level): f"Probability that level {level} fits: {json.dumps(text)}"
                       for level, text in enumerate(question.criteria)}
        else:
            options = {"probability": "Probability (0 to 1) that the answer is yes"}
        inner = create_model(  # type: ignore[call-overload]
            f"Question{index}",
            **{f"o{i}": (float, Field(alias=key, description=text)) for i, (key, text) in enumerate(options.items())},
        )
        fields[f"q{index}"] = (inner, Field(alias=name, description=question.instructions or question.type))
    return create_model("DecisionEstimates", **fields)


def _normalised(values: list[float]) -> list[float]:
    # Language models estimate probabilities loosely; rescale so they form a distribution.
    total = sum(values)
    return [value / total for value in values] if total > 0 else values


def _answer_from(question: Question, estimate: Mapping[str, float]) -> dict[str, Any]:
    if isinstance(question, Noul):
        return {"noul": estimate["probability"]}
    if isinstance(question, Choice):
        labels = list(question.criteria)
        probabilities = dict(zip(labels, _normalised([estimate[label] for label in labels]), strict=True))
        choice = max(labels, key=probabilities.__getitem__)
        return {"choice": choice, "probabilities": probabilities, "confidence": probabilities[choice]}
    levels = _normalised([estimate[str(level)] for level in range(len(question.criteria))])
    score = sum(level * p for level, p in enumerate(levels))
    return {
        "score": score,
        "probabilities": levels,
        "confidence": max(levels),
        "legend": question.criteria[nearest_level(score, len(levels) - 1)],
    }


class ScriptedDecisionProvider:
    """Serves each decision with the next scripted entry, for tests that bypass any model.

    An entry is an answers mapping, a ``DecisionResult``, or an exception instance to raise. ``requests``
    records every request received, failed attempts included.
    """

    def __init__(self, script: Iterable[Mapping[str, Any] | DecisionResult | Exception],
                 usage: TokenUsage | None = None) -> None:
        self._script = list(script)
        self._usage = usage
        self.requests: list[DecisionRequest] = []

    async def decide(self, request: DecisionRequest) -> DecisionResult:
        self.requests.append(request)
        index = len(self.requests) - 1
        if index >= len(self._script):
            raise PicoFlowError(f"The scripted decision provider has no entry for decision call {index + 1}.")
        entry = self._script[index]
        if isinstance(entry, Exception):
            raise entry
        if isinstance(entry, DecisionResult):
            return entry
        return DecisionResult(answers=entry, usage=self._usage.model_copy() if self._usage else None)

"""Typed, non-generative decisions: questions (choice, score, noul), answers and their validation,
the provider contract, the hooks' contexts and the built-in providers.

A ``DecisionStep`` (``picoflow.decision_step``) asks a provider these questions about the conversation
``picoflow.conversation`` reads; the turn runs the call.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage
from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError, create_model, field_validator

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
# Probability distributions may be rounded by the provider; this much drift from 1 is accepted.
PROBABILITY_TOLERANCE = 0.01
#: Attempts after the first one when a decision call fails transiently (0: a single attempt).
DEFAULT_DECISION_MAX_RETRIES = 0
#: Wall-clock limit of one decision attempt, in milliseconds.
DEFAULT_DECISION_TIMEOUT_MS = 30_000


# -- questions ---------------------------------------------------------------------------------


class _Question(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    instructions: str | None = None


class Choice(_Question):
    """Pick one label; ``criteria`` maps each label to a description of when it applies."""

    type: Literal["choice"] = "choice"
    criteria: dict[str, JsonValue]

    @field_validator("criteria")
    @classmethod
    def _two_labels(cls, criteria: dict[str, JsonValue]) -> dict[str, JsonValue]:
        if len(criteria) < 2:
            raise ValueError("a Choice needs at least two labels")
        if any(not label.strip() for label in criteria):
            raise ValueError("Choice labels must be non-empty")
        return criteria


class Score(_Question):
    """Place the subject on an ordered scale; ``criteria[i]`` describes level ``i``."""

    type: Literal["score"] = "score"
    criteria: list[JsonValue]

    @field_validator("criteria")
    @classmethod
    def _two_levels(cls, criteria: list[JsonValue]) -> list[JsonValue]:
        if len(criteria) < 2:
            raise ValueError("a Score needs at least two levels")
        return criteria


class Noul(_Question):
    """A yes/no question answered with the probability that the answer is yes."""

    type: Literal["noul"] = "noul"
    criteria: dict[Literal["true", "false"], JsonValue] | None = None


Question = Choice | Score | Noul


# -- answers -----------------------------------------------------------------------------------


class _Answer(BaseModel):
    # Strict, so that a provider's "0.7" or true is reported instead of silently coerced.
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, defer_build=True)


class ChoiceAnswer(_Answer):
    """The chosen label, a probability for every label, and the confidence in the choice."""

    type: Literal["choice"] = "choice"
    choice: str
    probabilities: dict[str, float]
    confidence: float


class ScoreAnswer(_Answer):
    """A position from 0 to the last level (possibly fractional), its nearest level's criterion as ``legend``,
    a probability per level and the confidence.

    A provider may leave ``legend`` out (the nearest level's criterion is filled in), or answer in the documented
    shape: ``probabilities`` keyed by level and ``legend`` a mapping from level to criterion. Either way the
    step receives this shape.
    """

    type: Literal["score"] = "score"
    score: float
    probabilities: list[float]
    confidence: float
    legend: JsonValue = None


class NoulAnswer(_Answer):
    """The probability, in [0, 1], that the answer is yes."""

    type: Literal["noul"] = "noul"
    noul: float


Answer = ChoiceAnswer | ScoreAnswer | NoulAnswer
_ANSWER_TYPES: dict[str, type[Answer]] = {"choice": ChoiceAnswer, "score": ScoreAnswer, "noul": NoulAnswer}


def validate_answers(questions: Mapping[str, Question], answers: Any) -> dict[str, Answer]:
    """Check ``answers`` against ``questions`` and return them typed; raise ``DecisionValidationError``."""
    if not isinstance(answers, Mapping):
        raise DecisionValidationError(f"Decision answers must be a mapping, not {type(answers).__name__}.")
    missing = [name for name in questions if name not in answers]
    unknown = sorted(str(name) for name in answers if name not in questions)
    if missing or unknown:
        found = (("missing", missing), ("unknown", unknown))
        problems = [f"{kind} {', '.join(names)}" for kind, names in found if names]
        raise DecisionValidationError(f"Decision answers do not match the questions: {'; '.join(problems)}.")
    return {name: _validate_answer(name, question, answers[name]) for name, question in questions.items()}


def _validate_answer(name: str, question: Question, raw: Any) -> Answer:
    def fail(problem: str) -> DecisionValidationError:
        return DecisionValidationError(f"Answer '{name}' ({question.type}): {problem}.")

    if isinstance(raw, BaseModel):
        # Only what the provider set: a ScoreAnswer built without a legend gets the nearest level's criterion.
        raw = raw.model_dump(exclude_unset=True)
    if isinstance(question, Score) and isinstance(raw, Mapping):
        raw = _score_in_our_shape(raw, question, fail)
    try:
        answer = _ANSWER_TYPES[question.type].model_validate(raw)
    except ValidationError as exc:
        problem = validation_problems(exc, "answer", first_only=True)
        raise DecisionValidationError(f"Answer '{name}' is not a {question.type} answer ({problem}).") from exc

    if isinstance(answer, NoulAnswer):
        if not _is_probability(answer.noul):
            raise fail(f"noul {answer.noul} is outside [0, 1]")
        return answer
    if not _is_probability(answer.confidence):
        raise fail(f"confidence {answer.confidence} is outside [0, 1]")
    if isinstance(answer, ChoiceAnswer):
        assert isinstance(question, Choice)
        if answer.choice not in question.criteria:
            raise fail(f"choice {answer.choice!r} is not one of {', '.join(map(repr, question.criteria))}")
        if set(answer.probabilities) != set(question.criteria):
            raise fail("probabilities must cover exactly the declared labels")
        _check_distribution(answer.probabilities.values(), fail)
        return answer
    assert isinstance(question, Score)
    last = len(question.criteria) - 1
    if not 0 <= answer.score <= last:
        raise fail(f"score {answer.score} is outside [0, {last}]")
    if len(answer.probabilities) != len(question.criteria):
        raise fail(f"probabilities must have one entry per level ({len(question.criteria)})")
    _check_distribution(answer.probabilities, fail)
    legend = question.criteria[nearest_level(answer.score, last)]
    if "legend" not in answer.model_fields_set or answer.legend is None:
        return answer.model_copy(update={"legend": legend})
    if answer.legend != legend:
        raise fail(f"legend {answer.legend!r} is not the criterion of the nearest level, {legend!r}")
    return answer


def _score_in_our_shape(raw: Mapping[str, Any], question: Score, fail: Any) -> dict[str, Any]:
    """Accept the documented score answer too: probabilities keyed by level, a legend from level to criterion.

    Levels may be ints or their decimal strings (JSON object keys). The legend mapping must agree with the
    criteria and name the nearest level; it becomes that level's criterion, as in every ``ScoreAnswer``.
    """
    answer = dict(raw)
    probabilities = answer.get("probabilities")
    if isinstance(probabilities, Mapping):
        by_level = _by_level(probabilities, len(question.criteria), "probabilities", fail)
        if set(by_level) != set(range(len(question.criteria))):
            raise fail(f"probabilities must have one entry per level ({len(question.criteria)})")
        answer["probabilities"] = [by_level[level] for level in range(len(question.criteria))]
    legend = answer.get("legend")
    score = answer.get("score")
    if isinstance(legend, Mapping) and isinstance(score, int | float) and not isinstance(score, bool):
        levels = _by_level(legend, len(question.criteria), "legend", fail)
        wrong = sorted(level for level, text in levels.items() if text != question.criteria[level])
        if wrong:
            raise fail(f"legend level {wrong[0]} is not that level's criterion, {question.criteria[wrong[0]]!r}")
        last = len(question.criteria) - 1
        if not 0 <= score <= last:
            answer.pop("legend")  # the score's own range check reports this answer
            return answer
        nearest = nearest_level(score, last)
        if nearest not in levels:
            raise fail(f"legend must name level {nearest}, the level nearest to the score")
        answer["legend"] = question.criteria[nearest]
    return answer


def _by_level(values: Mapping[Any, Any], count: int, field: str, fail: Any) -> dict[int, Any]:
    by_level: dict[int, Any] = {}
    for key, value in values.items():
        level = key if isinstance(key, int) and not isinstance(key, bool) else None
        if isinstance(key, str) and key.isdecimal():
            level = int(key)
        if level is None or not 0 <= level < count:
            raise fail(f"{field} key {key!r} is not a level from 0 to {count - 1}")
        if level in by_level:
            raise fail(f"{field} names level {level} twice")
        by_level[level] = value
    return by_level


def nearest_level(score: float, last: int) -> int:
    """The level a (possibly fractional) score rounds to, halves rounding up."""
    return min(int(math.floor(score + 0.5)), last)


def _is_probability(value: float) -> bool:
    return 0.0 <= value <= 1.0


def _check_distribution(values: Iterable[float], fail: Any) -> None:
    values = list(values)
    if not all(_is_probability(value) for value in values):
        raise fail("every probability must lie in [0, 1]")
    if abs(sum(values) - 1.0) > PROBABILITY_TOLERANCE:
        raise fail(f"probabilities sum to {sum(values):.4f}, not 1")


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
    without it ``picoflow.recovery.is_transient_error`` decides, as for model calls (a timeout is retried,
    a ``KeyError`` is not).
    """

    async def decide(self, request: DecisionRequest) -> DecisionResult: ...


@dataclass(frozen=True)
class DecisionContext:
    """What ``on_decision`` receives next to the answers: the evaluated input and how the call went."""

    step_id: str
    provider: str
    model: str
    request: str
    prior_requests: tuple[str, ...]
    facts: Mapping[str, Any]
    attempts: int
    duration_ms: int
    usage: TokenUsage | None = None
    request_id: str | None = None


@dataclass(frozen=True)
class DecisionErrorContext:
    """What ``on_decision_error`` receives next to the error."""

    step_id: str
    provider: str
    model: str
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

"""The questions a decision asks (choice, score, noul), the answers a provider gives, and their validation."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, JsonValue, ValidationError, field_validator

from picoflow.errors import DecisionValidationError
from picoflow.validation import validation_problems

# Probability distributions may be rounded by the provider; this much drift from 1 is accepted.
PROBABILITY_TOLERANCE = 0.01


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

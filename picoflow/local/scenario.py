"""Scenario files for ``picoflow eval``: one conversation with a flow, each turn judged against plain language.

The format is the original framework's, accepted unchanged::

    {"flowName": "HotelFlow", "judgeModel": "gpt-4o", "judgeMinScore": 0.75,
     "turns": [{"label": "greeting", "input": "Hi", "expectedResponse": "The assistant ...", "completed": false,
                "minScore": 0.8}]}

``label`` and ``minScore`` are optional on a turn; a turn's minimum is its ``minScore``, else the file's
``judgeMinScore`` (0.75 when the file has none). Checks that need no model may be added to a turn: ``step`` (the
flow's current step after the turn), ``state`` (``{"StepName.dotted.path": expected value}`` read from the
step's stored state) and ``contentType`` (the reply's media type); the file may carry ``config``, sent with the
first turn of every run. A turn may carry ``decision`` (``{"approved": true}``) instead of or beside its input: the
user's decision on every tool call the previous reply left waiting for them. A file without these is judged exactly
as the original judges it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

#: The minimum score of a file that sets no ``judgeMinScore``, as in the original's runner.
DEFAULT_MIN_SCORE = 0.75
#: The judge model of a file that names none.
DEFAULT_JUDGE_MODEL = "gpt-4o"


class ScenarioError(ValueError):
    """A scenario file cannot be read or does not follow the format."""


class Decision(BaseModel):
    """The user's decision on the tool calls the previous turn left waiting for them (an addition of ours)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    approved: bool
    reason: str | None = None


class ScenarioTurn(BaseModel):
    """One user message (or decision) and what the reply to it must do."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    label: str | None = None
    input: str | None = Field(default=None, min_length=1)
    #: Decide every call the previous reply left waiting for the user (``input`` is then optional).
    decision: Decision | None = None
    expected_response: str = Field(alias="expectedResponse")
    completed: bool
    min_score: float | None = Field(default=None, alias="minScore", ge=0, le=1)
    step: str | None = Field(default=None, min_length=1)
    state: dict[str, Any] | None = None
    content_type: str | None = Field(default=None, alias="contentType", min_length=1)

    @model_validator(mode="after")
    def _says_something(self) -> ScenarioTurn:
        if self.input is None and self.decision is None:
            raise ValueError("a turn needs an input or a decision")
        return self

    def shown(self) -> str:
        """What the user did, for reports: the input, else the decision."""
        if self.input is not None:
            return self.input
        verdict = "approves" if self.decision is not None and self.decision.approved else "declines"
        return f"({verdict} the waiting calls)"


class Scenario(BaseModel):
    """A scenario file: the flow to talk to, the judge, its minimum score and the turns in order."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    flow_name: str = Field(alias="flowName", min_length=1)
    judge_model: str | None = Field(default=None, alias="judgeModel", min_length=1)
    judge_min_score: float | None = Field(default=None, alias="judgeMinScore", ge=0, le=1)
    config: dict[str, Any] | None = None
    turns: list[ScenarioTurn] = Field(min_length=1)

    def min_score(self, turn: ScenarioTurn) -> float:
        """The score ``turn``'s verdict must reach: its own ``minScore``, else the file's, else 0.75."""
        if turn.min_score is not None:
            return turn.min_score
        return self.judge_min_score if self.judge_min_score is not None else DEFAULT_MIN_SCORE

    def label(self, index: int) -> str:
        """The name of the turn at ``index`` (0-based) in reports: its ``label``, else ``turn N``."""
        return self.turns[index].label or f"turn {index + 1}"


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate the scenario file at ``path``; ``ScenarioError`` says what is wrong and where."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ScenarioError(f"Cannot read the scenario {path}: {error}") from error
    try:
        return Scenario.model_validate(data)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in problem['loc']) or 'file'}: {problem['msg']}"
            for problem in error.errors()
        )
        raise ScenarioError(f"The scenario {path} does not follow the format: {problems}") from error

"""What ``POST /ai/run`` and ``POST /ai/end`` accept: the JSON body, the body model and the session header.

Powertools validates every request against these before a route runs (``picoflow.aws.refusals`` says why one
was refused).
"""

from __future__ import annotations

import json
import os
from typing import Annotated, Any

from aws_lambda_powertools.event_handler.openapi.params import Header
from pydantic import AfterValidator, BaseModel, BeforeValidator, Field, StringConstraints, model_validator
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import PydanticCustomError

from picoflow.files.intake import InlineFile
from picoflow.lifecycle import SESSION_ID_PATTERN
from picoflow.session.approvals import MAX_REASON_CHARS
from picoflow.wire import SESSION_HEADER, SESSION_HEADER_SPELLINGS

DEFAULT_MAX_MESSAGE_CHARS = 100_000
# Deeper config objects are refused: the engine copies and serialises config recursively.
MAX_CONFIG_DEPTH = 32
MESSAGE_TOO_LONG = "message_too_long"
CONFIG_TOO_DEEP = "config_too_deep"
NOT_UNICODE = "not_unicode"
# A hard bound on the list itself; the per-turn limit (PICOFLOW_MAX_FILES_PER_TURN) is checked after.
MAX_LISTED_FILES = 32
# More decisions than calls a turn could leave waiting are refused outright.
MAX_DECISIONS = 64


def _blank_to_none(value: Any) -> Any:
    # An empty session header means no session, as if it were absent.
    return (value.strip() or None) if isinstance(value, str) else value


def _not_blank(value: str) -> str:
    if not value.strip():
        raise PydanticCustomError("blank_string", "must not be blank")
    return value


def message_limit() -> int:
    """The most characters a message may have (``PICOFLOW_MAX_MESSAGE_CHARS``), read per request."""
    return int(os.environ.get("PICOFLOW_MAX_MESSAGE_CHARS") or DEFAULT_MAX_MESSAGE_CHARS)


def _within_message_limit(value: str) -> str:
    if len(value) > message_limit():
        raise PydanticCustomError(MESSAGE_TOO_LONG, "message is too long")
    return value


def _shallow_enough(value: dict[str, Any]) -> dict[str, Any]:
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > MAX_CONFIG_DEPTH:
            raise PydanticCustomError(CONFIG_TOO_DEEP, "config is nested too deeply")
        pending.extend((child, depth + 1) for child in children)
    return value


SessionId = Annotated[str, StringConstraints(pattern=SESSION_ID_PATTERN.pattern)]

# A header is absent or a string, never null: its None stays out of the published schema.
NoHeader = SkipJsonSchema[None]


class ApprovalDecision(BaseModel):
    """A decision on a tool call waiting for one: the ``id`` a response's ``pendingApprovals`` gave."""

    id: str = Field(min_length=1, max_length=64, description="The waiting call's id.")
    approved: bool = Field(description="true runs the call (once), false declines it.")
    reason: str | None = Field(default=None, max_length=MAX_REASON_CHARS, description="Told to the model.")

    def as_decision(self) -> dict[str, Any]:
        """The decision as ``FlowEngine.run(approvals=...)`` takes it."""
        return self.model_dump(exclude_none=True)


class RunRequest(BaseModel):
    """The body of ``POST /ai/run``: one turn of the flow ``flowName``."""

    flow_name: Annotated[str, AfterValidator(_not_blank)] = Field(
        alias="flowName", min_length=1, description="A registered flow, see GET /ai/flows."
    )
    message: Annotated[str, AfterValidator(_within_message_limit)] | None = Field(
        default=None, description=f"The user's message (at most {DEFAULT_MAX_MESSAGE_CHARS} characters by default)."
    )
    config: Annotated[dict[str, Any], AfterValidator(_shallow_enough)] | None = Field(
        default=None, description="Session configuration, read by the flow as get_context('config.<key>')."
    )
    files: list[Annotated[str, StringConstraints(min_length=1, max_length=128)] | InlineFile] | None = Field(
        default=None, max_length=MAX_LISTED_FILES,
        description="Files for this turn's message: ids from POST /ai/files, or small inline files "
        "{name, contentType, data (base64)}.",
    )
    approvals: list[ApprovalDecision] | None = Field(
        default=None, max_length=MAX_DECISIONS,
        description="The user's decisions on tool calls waiting for them (the message is then optional).",
    )

    def decisions(self) -> list[dict[str, Any]] | None:
        """The decisions as ``FlowEngine.run(approvals=...)`` takes them; None when the request has none."""
        return None if self.approvals is None else [item.as_decision() for item in self.approvals]

    def file_ids(self) -> list[str]:
        """The uploaded files' ids, in order."""
        return [item for item in self.files or () if isinstance(item, str)]

    def inline_files(self) -> list[InlineFile]:
        """The inline files, in order."""
        return [item for item in self.files or () if isinstance(item, InlineFile)]

    @model_validator(mode="after")
    def _encodable(self) -> RunRequest:
        # JSON may escape lone surrogates; they decode into text that no store or model can encode.
        try:
            json.dumps([self.flow_name, self.message, self.config], ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise PydanticCustomError(NOT_UNICODE, "text is not valid Unicode") from None
        return self


class ReviewRequest(BaseModel):
    """The body of ``POST /ai/approvals``: a reviewer's decision on a call waiting in a session."""

    session: SessionId = Field(description="The session the call waits in.")
    id: str = Field(min_length=1, max_length=64, description="The waiting call's id.")
    approved: bool = Field(description="true runs the call (once), false declines it.")
    reason: str | None = Field(default=None, max_length=MAX_REASON_CHARS, description="Told to the model.")


class FileUploadRequest(BaseModel):
    """The body of ``POST /ai/files``: the file a client is about to upload."""

    name: Annotated[str, AfterValidator(_not_blank)] = Field(
        min_length=1, description="The file's name, shown to the model; a long one is cut to 255 UTF-8 bytes."
    )
    content_type: str = Field(alias="contentType", min_length=1, max_length=255, description="e.g. image/png.")
    size: int = Field(ge=1, description="The exact size in bytes.")


#: The session a turn continues: omitted (or blank) starts a new one; a malformed id is refused.
SessionHeader = Annotated[
    SessionId | NoHeader,
    BeforeValidator(_blank_to_none),
    Header(alias=SESSION_HEADER, description="The session to continue; omit it to start a new one."),
]
#: The same header as some proxies spell it; undocumented, it only stands in for the other.
SessionHeaderHyphenated = Annotated[
    SessionId | NoHeader,
    BeforeValidator(_blank_to_none),
    Header(alias=SESSION_HEADER_SPELLINGS[1], include_in_schema=False),
]
#: The session ``POST /ai/end`` deletes; the engine answers a malformed one (the route's documented 400).
EndedSessionHeader = Annotated[
    str | NoHeader, BeforeValidator(_blank_to_none), Header(alias=SESSION_HEADER, description="The session to delete.")
]
EndedSessionHeaderHyphenated = Annotated[
    str | NoHeader, BeforeValidator(_blank_to_none), Header(alias=SESSION_HEADER_SPELLINGS[1], include_in_schema=False)
]


def parse_json_body(text: str) -> Any:
    """The request body as JSON; NaN, Infinity, huge numbers and runaway nesting are malformed too."""
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:
        raise json.JSONDecodeError("The request body is not valid JSON", text, 0) from exc


def _refuse_constant(name: str) -> Any:
    # Stored, NaN and Infinity would silently become null.
    raise ValueError(f"{name} is not a JSON value")

"""The persisted session document: one envelope holding exactly one flow.

The JSON produced by ``SessionDoc.model_dump(by_alias=True, mode="json")`` uses the camelCase
keys of the portable session schema. Only ``createdOn`` and ``saveOn`` are parsed as datetimes;
context, state and messages are kept as plain JSON values.
"""

from __future__ import annotations

import json
import re
import secrets
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import from_json

from picoflow.errors import SessionFlowInvariantError
from picoflow.session.legacy import legacy_envelope, legacy_flow, normalise_sequence
from picoflow.session.receipts import TurnReceipt

SESSION_DOC_VERSION = 1.5

NAMESPACE_PATTERN = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,127}$")
RESERVED_NAMESPACES = frozenset({"__proto__", "constructor", "prototype"})

RunStatus = Literal["running", "completed", "aborted"]


def utc_now() -> datetime:
    return datetime.now(UTC)


def format_timestamp(value: datetime) -> str:
    """ISO-8601 UTC with milliseconds and a ``Z`` suffix, the form every document uses."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def validate_namespace(name: str) -> str:
    """Return ``name`` if it is a legal memory namespace key, else raise ``ValueError``."""
    if not isinstance(name, str) or name in RESERVED_NAMESPACES or not NAMESPACE_PATTERN.fullmatch(name):
        raise ValueError(
            f"Invalid memory namespace {name!r}: use a letter followed by up to 127 letters, "
            "digits, '_' or '-'."
        )
    return name


Timestamp = Annotated[datetime, PlainSerializer(format_timestamp, return_type=str, when_used="json")]


def _omit_none(value: Any) -> bool:
    return value is None


class _Doc(BaseModel):
    model_config = ConfigDict(populate_by_name=True, validate_assignment=False)


class ModelSelectionDoc(_Doc):
    """A persisted model selection (provider, model name, parameters, retry budget)."""

    provider: str
    name: str
    params: dict[str, Any] = Field(default_factory=dict)
    retry_attempts: int | None = Field(default=None, alias="retryAttempts", exclude_if=_omit_none)


class ToolCallDoc(_Doc):
    name: str
    args: dict[str, Any] = Field(default_factory=dict)
    id: str | None = None


def _object_as_json(content: dict[Any, Any]) -> str:
    return json.dumps(content, ensure_ascii=False)


# Structured output was stored by the original runtime as the object itself: it is kept as its JSON text. Only
# an object reaches this validator, so string and list content are checked without a Python call per message.
_ObjectContent = Annotated[dict[Any, Any], AfterValidator(_object_as_json)]


class MessageDoc(_Doc):
    """One persisted chat message."""

    model_config = ConfigDict(populate_by_name=True, extra="allow")

    type: Literal["system", "human", "ai", "tool"]
    content: str | list[Any] | _ObjectContent = ""
    id: str | None = Field(default=None, exclude_if=_omit_none)
    timestamp: str | None = Field(default=None, exclude_if=_omit_none)
    name: str | None = Field(default=None, exclude_if=_omit_none)
    tool_call_id: str | None = Field(default=None, exclude_if=_omit_none)
    status: Literal["success", "error"] | None = Field(default=None, exclude_if=_omit_none)
    tool_calls: list[ToolCallDoc] | None = Field(default=None, exclude_if=lambda v: not v)
    additional_kwargs: dict[str, Any] | None = Field(default=None, exclude_if=lambda v: not v)

    @model_validator(mode="after")
    def _tool_messages_need_call_id(self) -> MessageDoc:
        if self.type == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs a tool_call_id")
        return self


class NamespaceDoc(_Doc):
    """The history of one memory namespace, with its rolling summary when compaction is on."""

    messages: list[MessageDoc] = Field(default_factory=list)
    summary: str | None = Field(default=None, exclude_if=_omit_none)
    summarized_through_id: str | None = Field(
        default=None, alias="summarizedThroughId", exclude_if=_omit_none
    )


class StepDoc(_Doc):
    name: str = Field(min_length=1)
    state: dict[str, Any] = Field(default_factory=dict)
    model: ModelSelectionDoc | None = Field(default=None, exclude_if=_omit_none)


class SequenceItem(_Doc):
    level: int = Field(ge=1, strict=True)
    step_name: str = Field(alias="stepName", min_length=1)


class TokenUsage(_Doc):
    """Cumulative token usage; the last four fields are breakdowns of the first three."""

    input_tokens: int = Field(default=0, alias="inputTokens")
    output_tokens: int = Field(default=0, alias="outputTokens")
    total_tokens: int = Field(default=0, alias="totalTokens")
    reasoning_tokens: int = Field(default=0, alias="reasoningTokens")
    visible_output_tokens: int = Field(default=0, alias="visibleOutputTokens")
    cached_input_tokens: int = Field(default=0, alias="cachedInputTokens")
    cache_creation_input_tokens: int = Field(default=0, alias="cacheCreationInputTokens")

    def add(self, other: TokenUsage) -> None:
        # Straight onto the field values: what setattr does for a model without assignment validation.
        mine, theirs = self.__dict__, other.__dict__
        for field in _TOKEN_FIELDS:
            mine[field] = mine[field] + theirs[field]
        self.__pydantic_fields_set__.update(_TOKEN_FIELDS)


_TOKEN_FIELDS = tuple(TokenUsage.model_fields)


class DecisionUsage(TokenUsage):
    """Usage of DecisionStep provider calls: the responses observed (``calls``) and their tokens.

    Documents written before calls were counted load with ``calls`` 0.
    """

    calls: int = Field(default=0, ge=0)


class LogEntry(_Doc):
    model_config = ConfigDict(populate_by_name=True, extra="allow")

    timestamp: str
    level: str
    message: str


class FlowDoc(_Doc):
    """The single flow object of a session document."""

    name: str
    model: ModelSelectionDoc | None = Field(default=None, exclude_if=_omit_none)
    context: dict[str, Any] = Field(default_factory=dict)
    memory: dict[str, NamespaceDoc] = Field(default_factory=dict)
    steps: list[StepDoc] = Field(default_factory=list)
    current_step: str | None = Field(default=None, alias="currentStep")
    sequence: list[SequenceItem] = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _name_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("flow.name must be a non-empty string")
        return value

    @field_validator("memory")
    @classmethod
    def _namespace_keys(cls, value: dict[str, NamespaceDoc]) -> dict[str, NamespaceDoc]:
        for key in value:
            validate_namespace(key)
        return value

    @model_validator(mode="before")
    @classmethod
    def _normalise_legacy(cls, data: Any) -> Any:
        return legacy_flow(data)


ApprovalStatus = Literal["pending", "approved", "denied", "expired"]


class ApprovalCall(_Doc):
    """One tool call waiting for (or given) a decision: its tool and the arguments its schema validated."""

    name: str
    args: Any = Field(default_factory=dict)


class ApprovalDoc(_Doc):
    """A tool call a person decides before it runs, kept in the session document under its conditional write.

    ``digest`` binds the decision to the stored arguments: the call that runs is the one stored here, whatever a
    client sends. ``settled`` is set once the outcome (the handler's result, or the fixed declined result) has
    joined the step's memory; a decided call not yet settled is finished by the next request on the session.
    """

    id: str = Field(min_length=1)
    step: str
    namespace: str
    calls: list[ApprovalCall] = Field(min_length=1)
    #: ``@tools`` group handlers decide their whole batch at once.
    group: bool = False
    digest: str
    approver: Literal["user", "reviewer"]
    status: ApprovalStatus = "pending"
    created_at: Timestamp = Field(alias="createdAt")
    expires_at: Timestamp = Field(alias="expiresAt")
    decided_at: Timestamp | None = Field(default=None, alias="decidedAt", exclude_if=_omit_none)
    decided_by: str | None = Field(default=None, alias="decidedBy", exclude_if=_omit_none)
    reason: str | None = Field(default=None, exclude_if=_omit_none)
    #: Until when the request that decided (or took over) this call may be settling it; others leave it alone.
    claimed_until: Timestamp | None = Field(default=None, alias="claimedUntil", exclude_if=_omit_none)
    settled: bool = False

    @property
    def tool(self) -> str:
        """The tool's name ("a+b" for a group's batch)."""
        return "+".join(call.name for call in self.calls) if self.group else self.calls[0].name

    @property
    def arguments(self) -> Any:
        """The validated arguments (for a group, a list of ``{"tool", "arguments"}``)."""
        if self.group:
            return [{"tool": call.name, "arguments": call.args} for call in self.calls]
        return self.calls[0].args


class SessionDoc(_Doc):
    """A whole session document: envelope, one flow, token totals and diagnostic logs."""

    id: str = Field(min_length=1)
    revision: int = Field(default=0, ge=0)
    version: float = SESSION_DOC_VERSION
    run_status: RunStatus = Field(default="running", alias="runStatus")
    created_on: Timestamp = Field(default_factory=utc_now, alias="createdOn")
    save_on: Timestamp = Field(default_factory=utc_now, alias="saveOn")
    flow: FlowDoc
    tokens: TokenUsage = Field(default_factory=TokenUsage)
    #: Usage of DecisionStep provider calls, apart from the chat ``tokens``; absent until the first decision.
    decision_usage: DecisionUsage | None = Field(default=None, alias="decisionUsage", exclude_if=_omit_none)
    #: Tool calls a person decides (pending, and the recent decided ones); absent while there are none.
    approvals: list[ApprovalDoc] = Field(default_factory=list, exclude_if=lambda v: not v)
    log: list[LogEntry] = Field(default_factory=list)
    error: list[LogEntry] = Field(default_factory=list)
    warn: list[LogEntry] = Field(default_factory=list)
    debug: list[LogEntry] = Field(default_factory=list)
    verbose: list[LogEntry] = Field(default_factory=list)

    # Stored beside the portable document, never in its JSON: receipts of applied keyed turns and the
    # id of the write that produced this copy (how a turn learns whether its timed-out write landed).
    _receipts: list[TurnReceipt] = PrivateAttr(default_factory=list)
    _write_id: str | None = PrivateAttr(default=None)
    _owner: str | None = PrivateAttr(default=None)
    # Whether a store holds this document: False only for a new session before its first turn's write.
    _stored: bool = PrivateAttr(default=True)

    @property
    def owner(self) -> str | None:
        """The authenticated principal that created this session; None when it was created anonymously."""
        return self._owner

    @owner.setter
    def owner(self, value: str | None) -> None:
        self._owner = value or None

    @property
    def receipts(self) -> list[TurnReceipt]:
        """Receipts of the keyed turns applied to this session (newest last)."""
        return self._receipts

    @receipts.setter
    def receipts(self, value: list[TurnReceipt]) -> None:
        self._receipts = list(value)

    @property
    def write_id(self) -> str | None:
        """The id of the write that stored this copy, if any."""
        return self._write_id

    @write_id.setter
    def write_id(self, value: str | None) -> None:
        self._write_id = value

    @property
    def stored(self) -> bool:
        """False for a new session that no store holds yet (its first turn's save inserts it)."""
        return self._stored

    @stored.setter
    def stored(self, value: bool) -> None:
        self._stored = value

    def item_data(self) -> dict[str, Any]:
        """The non-document part of the stored item (empty when there is none)."""
        data: dict[str, Any] = {}
        if self._receipts:
            data["receipts"] = [receipt.model_dump() for receipt in self._receipts]
        if self._write_id:
            data["writeId"] = self._write_id
        if self._owner:
            data["owner"] = self._owner
        return data

    def load_item_data(self, data: Any) -> None:
        """Restore what :meth:`item_data` produced; unreadable parts are dropped rather than refused."""
        if not isinstance(data, dict):
            return
        receipts = []
        for raw in data.get("receipts") or ():
            try:
                receipts.append(TurnReceipt.model_validate(raw))
            except ValidationError:
                continue
        self._receipts = receipts
        write_id = data.get("writeId")
        self._write_id = write_id if isinstance(write_id, str) else None
        owner = data.get("owner")
        self._owner = owner if isinstance(owner, str) and owner else None

    @model_validator(mode="before")
    @classmethod
    def _normalise_envelope(cls, data: Any) -> Any:
        return legacy_envelope(data)

    @classmethod
    def from_stored(cls, data: Any) -> SessionDoc:
        """Validate a stored (or legacy) document, raising ``SessionFlowInvariantError`` if malformed."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            session_id = data.get("id") if isinstance(data, dict) else None
            raise SessionFlowInvariantError(
                f"Session '{session_id or ''}' is not a valid one-flow document: {_first_error(exc)}"
            ) from exc

    def to_json_dict(self) -> dict[str, Any]:
        """The portable camelCase JSON form of this document."""
        return self.model_dump(by_alias=True, mode="json")

    def normalise(self) -> None:
        """Bring shapes an older writer (or a restore hook) put into this loaded document to the current form."""
        if any(not isinstance(item, SequenceItem) for item in self.flow.sequence):
            items = normalise_sequence(list(self.flow.sequence))
            self.flow.sequence = [SequenceItem.model_validate(item) for item in items]

    def check_invariant(self) -> None:
        """Re-check the one-flow invariant on a document that may have been mutated in place."""
        flow = self.flow
        problems = []
        if not isinstance(flow, FlowDoc):
            problems.append("flow must be one flow object")
        else:
            if not isinstance(flow.name, str) or not flow.name.strip():
                problems.append("flow.name must be a non-empty string")
            if not isinstance(flow.memory, dict) or not isinstance(flow.context, dict):
                problems.append("flow.memory and flow.context must be mappings")
            if flow.current_step is not None and not isinstance(flow.current_step, str):
                problems.append("flow.currentStep must be a string or null")
            if not isinstance(flow.steps, list) or not isinstance(flow.sequence, list):
                problems.append("flow.steps and flow.sequence must be lists")
            if isinstance(flow.memory, dict):
                for key in flow.memory:
                    try:
                        validate_namespace(key)
                    except ValueError as exc:
                        problems.append(str(exc))
        if problems:
            raise SessionFlowInvariantError(f"Session '{self.id}' breaks the one-flow invariant: {problems[0]}")


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(part) for part in err.get("loc", ())) or "document"
    return f"{where}: {err.get('msg')}"


# -- encoding -----------------------------------------------------------------------------------

#: The key under which a stored item keeps what is not part of the portable document.
ITEM_KEY = "_item"


def new_session_id() -> str:
    """An unguessable session id: 128 random bits as 32 hex characters."""
    return secrets.token_hex(16)


def encode_document(doc: SessionDoc) -> bytes:
    """The compact UTF-8 JSON encoding of a document, with its item data under ``_item`` when it has any."""
    # ``model_dump_json(by_alias=True)`` as bytes, without its round trip through ``str``.
    encoded = doc.__pydantic_serializer__.to_json(doc, by_alias=True)
    extra = doc.item_data()
    if not extra:
        return encoded
    # Spliced rather than re-dumped: the document is encoded once, the small item part beside it.
    tail = json.dumps(extra, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return encoded[:-1] + b',"' + ITEM_KEY.encode("ascii") + b'":' + tail + b"}"


def decode_document(raw: bytes | str, revision: int) -> SessionDoc:
    """A stored document, at the revision its backend records (the backend's copy is authoritative)."""
    try:
        data = parse_json(raw)
    except ValueError as exc:
        raise SessionFlowInvariantError(f"Stored session is not valid JSON: {exc}") from exc
    extra = data.pop(ITEM_KEY, None) if isinstance(data, dict) else None
    doc = SessionDoc.from_stored(data)
    doc.revision = revision
    doc.load_item_data(extra)
    return doc


def parse_json(raw: bytes | str) -> Any:
    """``json.loads(raw)``, parsed by pydantic's faster parser whenever that one accepts the text.

    Where the two parsers accept a text they give the same values; for the few texts only ``json.loads``
    accepts (a byte order mark, a lone surrogate escape) or neither does, ``json.loads`` decides.
    """
    try:
        return from_json(raw)
    except ValueError:
        return json.loads(raw)


def new_document(flow: FlowDoc | dict[str, Any], session_id: str | None = None, owner: str | None = None) -> SessionDoc:
    """A fresh running document at revision 0 around ``flow``, checked against the one-flow invariant."""
    flow_doc = flow if isinstance(flow, FlowDoc) else _validate_flow(flow)
    now = utc_now()
    doc = SessionDoc(
        id=session_id or new_session_id(), revision=0, flow=flow_doc.model_copy(deep=True), created_on=now, save_on=now
    )
    doc.owner = owner
    doc.check_invariant()
    return doc


def prepare_write(doc: SessionDoc, expected_revision: int) -> SessionDoc:
    """Check the invariant and return the copy to persist at ``expected_revision + 1``.

    The copy is shallow: stores encode it at once, so it never outlives the caller's document.
    """
    doc.check_invariant()
    return doc.model_copy(update={"revision": expected_revision + 1, "save_on": utc_now()})


def _validate_flow(flow: dict[str, Any]) -> FlowDoc:
    try:
        return FlowDoc.model_validate(flow)
    except ValidationError as exc:
        raise SessionFlowInvariantError(f"Invalid flow object: {exc.errors()[0].get('msg')}") from exc

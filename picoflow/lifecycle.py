"""A session's life over a store, turn by turn: open it (replay a spent key, restore, or start it), save it
(rolling summaries of long histories by ``picoflow.conversation.compaction``, size, one conditional write),
settle a save whose outcome is unknown, abort it on a defect, and delete it.

A new session is written once, by its first turn's save (``SessionStore.insert``), never before the turn runs.
The flow is reached through its hooks and its ``run_context`` only.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import enum
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from picoflow.conversation import compaction
from picoflow.deadline import before_deadline, read_back_budget
from picoflow.errors import (
    ApprovalNotPendingError,
    BadRequestError,
    FlowSetupError,
    IdempotencyKeyMismatchError,
    IdempotencyKeyReusedError,
    IdempotencyKeyTooWeakError,
    PicoFlowError,
    RestoreFailedError,
    SessionConflictError,
    SessionFlowInvariantError,
    SessionFlowMismatchError,
    SessionNotFoundError,
    SessionOutcomeUnknownError,
    SessionStoreError,
    TurnDeadlineError,
)
from picoflow.files.refs import FileRef
from picoflow.files.store import FileRecord
from picoflow.logger import SessionLogger
from picoflow.logger import library_log as _log
from picoflow.results import RunResponse, client_message
from picoflow.session.approvals import Decision, decisions_from
from picoflow.session.document import FlowDoc, SequenceItem, SessionDoc, StepDoc, new_document
from picoflow.session.receipts import (
    MIN_ANONYMOUS_KEY_CHARS,
    TurnReceipt,
    add_receipt,
    find_receipt,
    first_turn_session_id,
    key_digest,
    request_digest,
)
from picoflow.session.store import SessionStore

if TYPE_CHECKING:
    from picoflow.authoring.flow import Flow
    from picoflow.models.registry import ProviderRegistry

SESSION_ID_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
# Compaction is forced once a document reaches this share of the store's size limit.
FORCE_COMPACTION_RATIO = 0.8


class _ReadBack(enum.Enum):
    # A read-back that could not tell what is stored (no time left, or the store failed again).
    UNREADABLE = "unreadable"


_UNREADABLE = _ReadBack.UNREADABLE


@dataclass(frozen=True)
class TurnRequest:
    """One turn's request, checked, with its ``Idempotency-Key`` reduced to digests."""

    flow_name: str
    message: str
    session_id: str | None
    config: dict[str, Any] | None
    request_id: str
    #: The authenticated principal making the request; None for an anonymous caller.
    caller: str | None = None
    #: Digest of the key scoped by caller (None without a key) and of the request body.
    key: str | None = None
    request: str = ""
    #: Where a keyed turn that starts a session creates it, so a retry of that turn finds it again.
    first_id: str | None = None
    #: An anonymous caller's key too short to derive a session id no other client could derive.
    weak_key: bool = False
    #: The files attached to the user's message, and the bytes already read for them (by file id).
    files: tuple[FileRef, ...] = ()
    file_data: Mapping[str, bytes] | None = None
    #: The records of the inline files among ``files``, stored once the session's checks have passed.
    inline_files: tuple[FileRecord, ...] = ()
    #: Decisions on tool calls waiting for one (``approvals=``).
    decisions: tuple[Decision, ...] = ()
    #: The reviewer deciding a waiting call (``FlowEngine.decide``): such a request sees the session whoever owns
    #: it, never creates one, and runs no model.
    reviewer: str | None = None


def turn_request(
    flow_name: str, user_message: Any, session_id: Any, config: Any, key: Any, caller: Any, request_id: str,
    files: Iterable[FileRef] = (), *, reserved_config: frozenset[str] = frozenset(), approvals: Any = None,
    reviewer: str | None = None,
) -> TurnRequest:
    """The checked request of one turn; ``BadRequestError`` for what no turn can run with.

    The HTTP adapters validate requests first; these are the engine's invariants for in-process callers too.
    """
    if user_message is not None and not isinstance(user_message, str):
        raise BadRequestError("message must be a string.")
    if config is not None and not isinstance(config, dict):
        raise BadRequestError("config must be a JSON object.")
    try:
        # The session document is UTF-8 JSON: refuse what it cannot hold (lone surrogates, cycles, NaN,
        # nesting deeper than the encoder goes) before anything is created.
        json.dumps([user_message, config], ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (TypeError, ValueError, RecursionError) as exc:
        raise BadRequestError("message and config must be valid JSON text (no NaN or Infinity).") from exc
    if config and any(str(name).startswith("_") and name not in reserved_config for name in config):
        raise BadRequestError("config keys starting with '_' are reserved for the flow's own use.")
    if session_id is not None and not (isinstance(session_id, str) and SESSION_ID_PATTERN.fullmatch(session_id)):
        raise BadRequestError("The session id must be 1-128 letters, digits, '_' or '-'.")
    if caller is not None and not isinstance(caller, str):
        raise BadRequestError("The caller must be a string.")
    attached = tuple(files)
    if not all(isinstance(ref, FileRef) for ref in attached):
        raise BadRequestError("files must be file references.")
    # Whitespace alone is no message: chat services refuse a user turn without text.
    message = user_message if user_message and user_message.strip() else ""
    decisions = decisions_from(approvals)
    if reviewer is not None and (not isinstance(reviewer, str) or not reviewer or not session_id):
        raise BadRequestError("A reviewer's decision needs the reviewer and the session.")
    turn = TurnRequest(flow_name, message, session_id or None, config, request_id, caller or None, files=attached,
                       decisions=decisions, reviewer=reviewer)
    if key is None:
        return turn
    if not isinstance(key, str) or not key:
        raise BadRequestError("The idempotency key must be a non-empty string.")
    return replace(
        turn,
        key=key_digest(key, caller or ""),
        # Files count by content, so a retried turn whose inline files were stored again still matches.
        request=request_digest(flow_name, user_message, config, [ref.digest for ref in attached],
                               [[d.id, d.approved, d.reason] for d in decisions] + ([reviewer] if reviewer else [])),
        first_id=first_turn_session_id(key, caller or ""),
        weak_key=not caller and len(key) < MIN_ANONYMOUS_KEY_CHARS,
    )


class SessionLocks:
    """Serialises the turns of one session within an event loop (across loops the store's CAS protects)."""

    def __init__(self) -> None:
        self._locks: dict[tuple[int, str], tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, session_id: str | None) -> AsyncIterator[None]:
        if not session_id:
            yield
            return
        # asyncio locks belong to one event loop; across loops (threads) the store's CAS still protects.
        key = (id(asyncio.get_running_loop()), session_id)
        lock, users = self._locks.get(key, (None, 0))
        if lock is None:
            lock = asyncio.Lock()
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users <= 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)


# -- opening ------------------------------------------------------------------------------------


async def open_session(store: SessionStore, flow: Flow, turn: TurnRequest) -> tuple[SessionDoc, int] | RunResponse:
    """The document this turn runs on with the revision found stored (0 when new), or a spent key's replay.

    A new session is not written here: its first turn's save inserts it.
    """
    for session_id in (turn.session_id, turn.first_id):
        if not session_id:
            continue
        loaded = await before_deadline(store.load(session_id))
        # A reviewer decides calls in sessions of others; everyone else sees only their own (or anonymous) ones.
        stored = loaded if turn.reviewer is not None else visible(loaded, turn.caller)
        if stored is None:
            continue
        answer = replay(stored, turn)
        if answer is not None:
            return answer
        found = stored.revision
        doc = await restore(store, flow, stored)
        if doc is not None:
            return doc, found
        if session_id == turn.first_id:
            # The key's own session ended: it cannot start another one.
            raise SessionConflictError(session_id)
    if turn.reviewer is not None or turn.decisions:
        # Decisions are taken only on a stored session's waiting calls: a new session has none.
        raise ApprovalNotPendingError("The call is not waiting for a decision.")
    if turn.weak_key:
        raise IdempotencyKeyTooWeakError("An anonymous first turn's key is too short.")
    doc = new_document(new_flow_doc(flow), turn.first_id, turn.caller)
    doc.stored = False
    return doc, 0


def new_flow_doc(flow: Flow) -> FlowDoc:
    """The flow object of a brand-new session, with the cursor on the initial step."""
    try:
        steps = flow.run_context.steps
        initial = flow.initial_step()
        name = next(iter(steps)) if initial is None else getattr(initial, "id", initial)
        if name not in steps:
            raise PicoFlowError(f"Initial step '{name}' is not defined in flow '{flow.id}'.")
        return FlowDoc(
            name=flow.id,
            model=flow.model_selection().to_doc(),
            context=copy.deepcopy(flow.run_context.values),
            steps=[StepDoc(name=step_id) for step_id in steps],
            current_step=name,
            sequence=[SequenceItem(level=1, step_name=name)],
        )
    except Exception as exc:  # noqa: BLE001 - e.g. an initial step the flow does not define
        raise defect(exc, "FLOW_SETUP_FAILED", FlowSetupError) from exc


async def restore(store: SessionStore, flow: Flow, stored: SessionDoc) -> SessionDoc | None:
    """``stored`` ready to continue, or None when this turn must start a new session instead."""
    if stored.run_status != "running":
        return None
    if stored.flow.name != flow.id:
        raise SessionFlowMismatchError(stored.id, stored.flow.name, flow.id)
    stored.check_invariant()
    if stored.revision == 0:
        # Created by a first turn that never landed: this turn runs as that session's first turn.
        return stored
    # The default hook never changes the document, so only an overriding flow pays for change detection.
    custom_hook = _overrides(flow, "on_restore_session_doc")
    before = stored.to_json_dict() if custom_hook else None
    try:
        restored = await flow.on_restore_session_doc(stored)
        if restored is not None:
            restored.normalise()
            restored.check_invariant()
    except Exception as exc:  # noqa: BLE001 - the stored document stays as it is, for a fixed flow to resume
        raise defect(exc, "RESTORE_FAILED", RestoreFailedError) from exc
    if restored is None:
        return None
    if not restored.flow.current_step or flow.get_step(restored.flow.current_step) is None:
        # No cursor, or one this flow cannot resolve (a renamed step): decline rather than fail every turn.
        _log.warning("Restored session declined: its current step is not defined", extra={"flow": flow.id})
        return None
    if restored is not stored:
        restored.receipts = stored.receipts
    if custom_hook and restored.to_json_dict() != before:
        # Only a migrated document is written before the turn; an unchanged one costs nothing.
        await write(store, restored)
    return restored


def _overrides(flow: Flow, hook: str) -> bool:
    """Whether ``flow``'s class defines ``hook`` below the framework's ``Flow``."""
    for cls in type(flow).__mro__:
        if hook in cls.__dict__:
            return cls.__module__ != "picoflow.authoring.flow"
    return False


def visible(doc: SessionDoc | None, caller: str | None) -> SessionDoc | None:
    """``doc`` when ``caller`` may use it: sessions created anonymously are open to anyone with the id."""
    if doc is None or (doc.owner is not None and doc.owner != caller):
        return None
    return doc


def replay(stored: SessionDoc, turn: TurnRequest) -> RunResponse | None:
    """The stored answer when ``turn``'s key is already spent on ``stored``; raises for a misused key."""
    if turn.key is None:
        return None
    receipt = find_receipt(stored.receipts, turn.key)
    if receipt is None:
        if stored.id == turn.first_id and stored.revision > 0:
            # The session this key started has moved on and no longer holds the key's receipt.
            raise IdempotencyKeyReusedError("The key's first turn is too old to replay.")
        return None
    if receipt.request != turn.request:
        raise IdempotencyKeyMismatchError("The key was applied to another request body.")
    return _replayed(receipt, turn)


def recorded_answer(stored: SessionDoc, turn: TurnRequest) -> RunResponse | None:
    """The answer ``stored`` keeps for this very ``turn`` (its key and its request), which tells that the turn's
    write landed; None otherwise, and never an error."""
    receipt = find_receipt(stored.receipts, turn.key) if turn.key is not None else None
    if receipt is None or receipt.request != turn.request:
        return None
    return _replayed(receipt, turn)


def _replayed(receipt: TurnReceipt, turn: TurnRequest) -> RunResponse:
    status = receipt.response.get("status_code")
    _log.info("Idempotent replay", extra={"requestId": turn.request_id, "statusCode": status})
    return RunResponse.model_validate({**receipt.response, "replayed": True})


# -- saving -------------------------------------------------------------------------------------


async def save(store: SessionStore, flow: Flow, providers: ProviderRegistry) -> None:
    """Compact what is due, keep the document under the store's size limit, and write it."""
    await compaction.compact(flow, providers, force=False)
    doc = flow.run_context.write_back(flow.id, flow.model_selection())
    limit = store.max_document_bytes
    memory = flow.run_context.memory
    # Measuring costs a second encoding, so only when forced compaction could shrink the document;
    # the store itself refuses an oversized document before writing anything.
    if limit and memory.summary_model is not None and memory.summary_namespaces:
        size = store.stored_size(doc)
        if size > limit * FORCE_COMPACTION_RATIO and await compaction.compact(flow, providers, force=True):
            doc = flow.run_context.write_back(flow.id, flow.model_selection())
    await write(store, doc)


async def write(store: SessionStore, doc: SessionDoc) -> None:
    """One conditional write of ``doc``: an insert for a session never stored, else a save at its revision."""
    # A fresh write id per write: reading it back tells whether a write whose answer was lost landed.
    doc.write_id = uuid.uuid4().hex
    new = doc.revision == 0 and not doc.stored
    saved = await before_deadline(store.insert(doc) if new else store.save(doc, doc.revision))
    doc.revision, doc.save_on, doc.stored = saved.revision, saved.save_on, True


async def commit(
    store: SessionStore, flow: Flow, providers: ProviderRegistry, turn: TurnRequest, response: RunResponse
) -> RunResponse:
    """Save the turn (with its receipt when keyed) and settle what a failed save really did."""
    doc = flow.run_context.require_doc()
    keep_receipt(doc, turn, response)
    try:
        await save(store, flow, providers)
    except (SessionConflictError, SessionStoreError, TurnDeadlineError) as exc:
        return await settle(store, doc, turn, response, exc)
    except PicoFlowError as exc:
        return RunResponse.failure(exc, doc.id, turn.request_id)
    return response


async def settle(
    store: SessionStore, doc: SessionDoc, turn: TurnRequest, response: RunResponse, exc: PicoFlowError
) -> RunResponse:
    """The answer for a save that failed: read back what is stored when the failure may hide a landed write."""
    if isinstance(exc, SessionStoreError) and not exc.ambiguous:
        return RunResponse.failure(exc, doc.id, turn.request_id)
    # A conflict, a write whose answer was lost or a save cut off by the deadline may hide a write that
    # landed (a retried write that had landed meets its own condition as a conflict): read back to know.
    stored = await read_back(store, doc.id)
    if stored is None:
        if not doc.stored and not isinstance(exc, SessionConflictError):
            # A first turn whose insert did not land: nothing was written.
            return RunResponse.failure(exc, doc.id, turn.request_id)
        # The session is gone (deleted while the turn ran): this write can never land.
        return RunResponse.failure(SessionConflictError(doc.id), doc.id, turn.request_id)
    if isinstance(stored, SessionDoc):
        if stored.write_id == doc.write_id:
            _log.info("Session write confirmed by reading it back", extra={"requestId": turn.request_id})
            return response
        answer = recorded_answer(stored, turn)
        if answer is not None:
            return answer
        if isinstance(exc, SessionConflictError) or stored.revision != doc.revision:
            return RunResponse.failure(SessionConflictError(doc.id), doc.id, turn.request_id)
    return RunResponse.failure(
        SessionOutcomeUnknownError(f"The save's outcome is unknown after {type(exc).__name__}: {exc}"),
        doc.id,
        turn.request_id,
    )


async def read_back(store: SessionStore, session_id: str) -> SessionDoc | _ReadBack | None:
    """The stored session, None when there is none, ``_UNREADABLE`` when it cannot be read in time."""
    budget = read_back_budget()
    if budget <= 0:
        return _UNREADABLE
    try:
        return await asyncio.wait_for(store.load(session_id), budget)
    except Exception as exc:  # noqa: BLE001 - an unreadable store leaves the outcome unknown
        _log.warning("Read-back after an unsettled save failed", extra={"errorType": type(exc).__name__})
        return _UNREADABLE


async def keep_unfinished(store: SessionStore, doc: SessionDoc) -> None:
    """Keep a first turn that failed without a write as its session at revision 0, holding only the flow it started
    with, so a retry (by session id or by key) runs as that session's first turn. A failure here is only logged."""
    if doc.stored:
        return
    try:
        await before_deadline(store.create(doc.flow, session_id=doc.id, owner=doc.owner))
        doc.stored = True
    except Exception as exc:  # noqa: BLE001 - the turn already failed; its retry then starts a new session
        _log.warning("A failed first turn's session could not be kept", extra={"errorType": type(exc).__name__})


def keep_receipt(doc: SessionDoc, turn: TurnRequest, response: RunResponse) -> None:
    """Record ``response`` under ``turn``'s key in ``doc``, written with the turn (keyed turns only)."""
    if turn.key is not None:
        response_kept = response.receipt_response()
        receipt = TurnReceipt(key=turn.key, request=turn.request, at=int(time.time()), response=response_kept)
        doc.receipts = add_receipt(doc.receipts, receipt)


async def abort(store: SessionStore, flow: Flow, doc: SessionDoc, exc: Exception, turn: TurnRequest) -> RunResponse:
    """A defect in flow code: end the session as ``aborted`` (unless the flow keeps it) and say so."""
    # Framework checks on flow code raise plain PicoFlowErrors: to a client they are the same defect.
    if isinstance(exc, PicoFlowError) and exc.code != PicoFlowError.code:
        failure = exc
    else:
        failure = PicoFlowError(str(exc), code="TURN_FAILED")
    response = RunResponse.failure(failure, doc.id, turn.request_id, cause=exc)
    if flow.keep_session_on_error:
        return response
    doc.run_status = "aborted"
    SessionLogger(doc).error(str(exc) or type(exc).__name__, errorType=type(exc).__name__, requestId=turn.request_id)
    keep_receipt(doc, turn, response)
    try:
        await write(store, doc)
    except Exception as save_exc:  # noqa: BLE001 - report in the logs, do not mask the original failure
        _log.error(
            "The aborted session could not be saved",
            extra={"requestId": turn.request_id, "errorType": type(save_exc).__name__},
        )
    return response


# -- deleting -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Deletion:
    """How a delete ended: the session it named and, when it failed, the error's code and the client's sentence."""

    session: str
    code: str | None = None
    message: str | None = None

    def envelope(self) -> dict[str, Any]:
        """The answer envelope of ``FlowEngine.delete_session``."""
        if self.code is None:
            return {"success": True, "session": self.session}
        return {"success": False, "message": self.message, "session": self.session, "code": self.code}


async def delete(store: SessionStore, locks: SessionLocks, session_id: str, caller: str | None) -> Deletion:
    """Remove ``session_id`` when ``caller`` may; how it ended, never an exception."""
    try:
        if not SESSION_ID_PATTERN.fullmatch(session_id):
            raise BadRequestError("The session id must be 1-128 letters, digits, '_' or '-'.")
        async with locks.hold(session_id):
            try:
                doc = await before_deadline(store.load(session_id))
            except SessionFlowInvariantError:
                # A corrupted document cannot be read, but ending it is exactly what its owner wants.
                await before_deadline(store.delete(session_id))
                return Deletion(session_id)
            owned = visible(doc, caller)
            if owned is None:
                raise SessionNotFoundError("No session with this id belongs to the caller.")
            await before_deadline(store.delete(session_id, owned.revision))
    except Exception as exc:  # noqa: BLE001 - deletion reports failures instead of raising
        failure = exc if isinstance(exc, PicoFlowError) else PicoFlowError(str(exc))
        _log.warning("Session delete failed", extra={"code": failure.code, "errorType": type(exc).__name__})
        return Deletion(session_id, failure.code, client_message(failure))
    return Deletion(session_id)


def defect(exc: BaseException, code: str, kind: type[PicoFlowError] = PicoFlowError) -> PicoFlowError:
    """``exc`` as a typed error carrying ``code``; a PicoFlow error keeps its own code unless it is a setup one."""
    if isinstance(exc, PicoFlowError) and kind is PicoFlowError:
        return exc
    error = kind(f"{type(exc).__name__}: {exc}")
    error.code = code
    error.__cause__ = exc
    return error

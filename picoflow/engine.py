"""FlowEngine: the registry of flows and providers, and the load -> run -> save cycle of a turn."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar

from picoflow.compaction import compact_history
from picoflow.errors import (
    RETRY_AFTER_SECONDS,
    BadRequestError,
    FileRefusedError,
    FileStoreError,
    FlowNotFoundError,
    FlowSetupError,
    IdempotencyKeyMismatchError,
    IdempotencyKeyReusedError,
    IdempotencyKeyTooWeakError,
    ModelUnavailableError,
    PicoFlowError,
    RestoreFailedError,
    SessionConflictError,
    SessionFlowInvariantError,
    SessionFlowMismatchError,
    SessionNotFoundError,
    SessionOutcomeUnknownError,
    SessionStoreError,
    SessionTooLargeError,
    TurnDeadlineError,
    public_message,
)
from picoflow.files.reader import TurnFiles
from picoflow.files.refs import FileRef
from picoflow.files.store import FileStore
from picoflow.flow import Flow
from picoflow.logger import SessionLogger
from picoflow.logger import library_log as _log
from picoflow.mcp import MCPUnavailableError
from picoflow.models.registry import ModelProvider, ProviderRegistry
from picoflow.registration import check_flow_configuration
from picoflow.results import RunResponse
from picoflow.session.document import FlowDoc, SessionDoc, TokenUsage
from picoflow.session.factory import store_from_env
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
from picoflow.tokens import add_usage
from picoflow.turn.deadline import READ_BACK_SECONDS, current_deadline, turn_deadline
from picoflow.turn.loop import run_turn
from picoflow.turn.runtime import TurnRuntime

if TYPE_CHECKING:
    from picoflow.decision import DecisionProvider

SESSION_ID_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
# Compaction is forced once a document reaches this share of the store's size limit.
FORCE_COMPACTION_RATIO = 0.8
# Time kept for the save when optional work (memory compaction) runs near the deadline.
SAVE_RESERVE_SECONDS = 1.0

_UNTOUCHED_ERRORS = (
    SessionConflictError,
    SessionFlowMismatchError,
    SessionFlowInvariantError,
    SessionTooLargeError,
    SessionStoreError,
    TurnDeadlineError,
    ModelUnavailableError,
    MCPUnavailableError,
    FileRefusedError,
    FileStoreError,
)

# A read-back that could not tell what is stored (no time left, or the store failed again).
_UNREADABLE: Any = object()
T = TypeVar("T")


@dataclass(frozen=True)
class _Turn:
    """One turn's request, with its ``Idempotency-Key`` reduced to digests."""

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


class FlowEngine:
    """Runs turns of registered flows against a session store and a set of model providers."""

    def __init__(
        self,
        flows: Iterable[type[Flow]] | Mapping[str, type[Flow]] = (),
        session_store: SessionStore | None = None,
        providers: ProviderRegistry | Iterable[ModelProvider] | None = None,
        *,
        retry_delay: float = 0.5,
        decision_providers: Mapping[str, DecisionProvider] | None = None,
        file_store: FileStore | None = None,
    ) -> None:
        self._flows: dict[str, type[Flow]] = {}
        #: Decision providers by the provider name a decision model selection gives; others use the chat model.
        self.decision_providers: dict[str, DecisionProvider] = dict(decision_providers or {})
        self.session_store = session_store if session_store is not None else store_from_env()
        if isinstance(providers, ProviderRegistry):
            self.providers = providers
        else:
            self.providers = ProviderRegistry()
            for provider in providers or ():
                self.providers.register(provider)
        self.retry_delay = retry_delay
        #: Where attached files are read from when a model is called; None: messages carry no files.
        self.file_store = file_store
        self._locks: dict[tuple[int, str], tuple[asyncio.Lock, int]] = {}
        self.register_flows(flows)

    # -- registration -------------------------------------------------------------------------

    def register_flows(self, flows: Iterable[type[Flow]] | Mapping[str, type[Flow]]) -> FlowEngine:
        """Register flows by list (named by ``Flow.id``) or by mapping; the batch is all-or-nothing.

        Each flow's configuration is checked against this engine's providers first (``check_flow_configuration``):
        a mistake no request could run with raises ``PicoFlowError`` here instead of failing users' turns.
        """
        pairs = list(flows.items()) if isinstance(flows, Mapping) else [(None, cls) for cls in flows]
        staged: dict[str, type[Flow]] = {}
        for key, cls in pairs:
            if not (isinstance(cls, type) and issubclass(cls, Flow)) or not getattr(cls, "id", "").strip():
                raise PicoFlowError("A registered flow must have a name and a Flow class.")
            name = cls.id if key is None else key
            if name != cls.id:
                raise PicoFlowError(f"Flow registration '{name}' must match Flow ID '{cls.id}'.")
            if name in self._flows or name in staged:
                raise PicoFlowError(f"Flow '{name}' is already registered.")
            staged[name] = cls
        for cls in staged.values():
            check_flow_configuration(cls, self)
        self._flows.update(staged)
        return self

    def register_flow(self, cls: type[Flow]) -> FlowEngine:
        return self.register_flows([cls])

    def get_flow(self, name: str) -> type[Flow] | None:
        return self._flows.get(name)

    def get_flow_names(self) -> list[str]:
        return list(self._flows)

    def current_deadline(self) -> float | None:
        """The ``time.monotonic()`` deadline of the turn running in this task, if any."""
        return current_deadline()

    # -- turns --------------------------------------------------------------------------------

    async def run(
        self,
        flow_name: str,
        user_message: str | None = None,
        session_id: str | None = None,
        config: dict[str, Any] | None = None,
        *,
        deadline: float | None = None,
        idempotency_key: str | None = None,
        caller: str | None = None,
        request_id: str | None = None,
        files: Iterable[FileRef] = (),
        file_data: Mapping[str, bytes] | None = None,
    ) -> RunResponse:
        """Run one turn; never raises — failures come back as a ``RunResponse`` with ``success=False``.

        ``files`` (already checked and stored, see ``picoflow.files.intake``) join the user's message as
        references; ``file_data`` holds bytes already read for them, so the turn does not read them again.

        With ``idempotency_key`` the turn is applied at most once: its receipt is written in the same
        conditional write as the session, and a retry with the same key (and ``caller``) gets the
        stored response back, marked ``replayed``, without running again.
        """
        request_id = request_id or uuid.uuid4().hex
        with turn_deadline(deadline):
            try:
                turn = self._check_input(
                    flow_name, user_message, session_id, config, idempotency_key, caller, request_id, files
                )
                turn = replace(turn, file_data=file_data)
                async with self._session_lock(turn.session_id or turn.first_id):
                    return await self._run_locked(turn)
            except PicoFlowError as exc:
                return _failure(exc, session_id if isinstance(session_id, str) else "", request_id)
            except Exception as exc:  # noqa: BLE001 - run() answers every failure with an envelope
                session = session_id if isinstance(session_id, str) else ""
                return _failure(_defect(exc, "TURN_FAILED"), session, request_id)

    def run_sync(self, flow_name: str, user_message: str | None = None, session_id: str | None = None,
                 config: dict[str, Any] | None = None) -> RunResponse:
        """Blocking convenience wrapper around :meth:`run`."""
        return asyncio.run(self.run(flow_name, user_message, session_id, config))

    def _check_input(
        self, flow_name: Any, user_message: Any, session_id: Any, config: Any, key: Any, caller: Any, request_id: str,
        files: Iterable[FileRef] = (),
    ) -> _Turn:
        if not isinstance(flow_name, str) or not flow_name.strip():
            raise BadRequestError("flowName must be a non-empty string.")
        if flow_name not in self._flows:
            raise FlowNotFoundError(f"Flow '{flow_name}' is not registered.")
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
        if config and any(str(name).startswith("_") for name in config):
            allowed = self._flows[flow_name].allowed_private_config
            if any(str(name).startswith("_") and name not in allowed for name in config):
                raise BadRequestError("config keys starting with '_' are reserved for the flow's own use.")
        if session_id is not None and not (isinstance(session_id, str) and SESSION_ID_PATTERN.fullmatch(session_id)):
            raise BadRequestError("The session id must be 1-128 letters, digits, '_' or '-'.")
        if caller is not None and not isinstance(caller, str):
            raise BadRequestError("The caller must be a string.")
        # Whitespace alone is no message: chat services refuse a user turn without text.
        message = user_message if user_message and user_message.strip() else ""
        attached = tuple(files)
        if not all(isinstance(ref, FileRef) for ref in attached):
            raise BadRequestError("files must be file references.")
        turn = _Turn(flow_name, message, session_id or None, config, request_id, caller or None, files=attached)
        if key is None:
            return turn
        if not isinstance(key, str) or not key:
            raise BadRequestError("The idempotency key must be a non-empty string.")
        return replace(
            turn,
            key=key_digest(key, caller or ""),
            # Files count by content, so a retried turn whose inline files were stored again still matches.
            request=request_digest(flow_name, user_message, config, [ref.digest for ref in attached]),
            first_id=first_turn_session_id(key, caller or ""),
            weak_key=not caller and len(key) < MIN_ANONYMOUS_KEY_CHARS,
        )

    async def _run_locked(self, turn: _Turn) -> RunResponse:
        deadline = current_deadline()
        if deadline is not None and deadline <= time.monotonic():
            # No time is left (a Lambda invoked with less than the handler's margin, or a long wait for the
            # session lock): refuse before any store call, so no session is created or read for nothing.
            raise TurnDeadlineError("The turn has no time left before its deadline; please retry.")
        flow = await self._build_flow(turn)
        opened = await self._open(flow, turn)
        if isinstance(opened, RunResponse):
            return opened
        doc, found_revision = opened
        tokens_before = doc.tokens.model_copy()
        try:
            flow._bind(doc, self._runtime(doc, turn))
            if doc.revision == 0:
                opener = await flow.get_current_step().on_start()
                if opener is not None:
                    flow.get_current_step().get_memory().append(opener)
            else:
                await flow.get_current_step().on_restore()
            if flow.is_batch():
                await self._save_session(flow)
            message = await _bounded_turn(run_turn(flow, turn.message))
            current = flow.get_current_step()
            response = RunResponse(
                success=True,
                completed=current.is_end(),
                message=message,
                session=doc.id,
                content_type=current.content_type,
                request_id=turn.request_id,
            )
        except _UNTOUCHED_ERRORS as exc:
            # Every save moves the revision: a restore hook's migration, a batch flow's or a checkpoint's save.
            return _failure(exc, doc.id, turn.request_id, saved=doc.revision != found_revision)
        except Exception as exc:  # noqa: BLE001 - any other failure is a defect in flow code
            return await self._abort(flow, doc, exc, turn)
        response = await self._commit(flow, turn, response)
        if response.success:
            response.tokens = _usage_since(tokens_before, doc.tokens)
        return response

    def _runtime(self, doc: SessionDoc, turn: _Turn) -> TurnRuntime:
        return TurnRuntime(
            files=TurnFiles(self.file_store, turn.files, turn.file_data),
            doc=doc,
            providers=self.providers,
            decision_providers=self.decision_providers,
            retry_delay=self.retry_delay,
            save=self._save_session,
            start=self._start_session,
        )

    async def _start_session(self, flow_name: str, message: str | None, config: dict[str, Any]) -> RunResponse:
        return await self.run(flow_name, message, None, config)

    async def _build_flow(self, turn: _Turn) -> Flow:
        try:
            flow = self._flows[turn.flow_name]()
            if turn.config is not None:
                flow.add_context({"config": turn.config})
            await flow.init()
            flow._collect_steps()
            self._validate_models(flow)
        except Exception as exc:  # noqa: BLE001 - a flow that cannot be built answers, it never raises
            raise _defect(exc, "FLOW_SETUP_FAILED", FlowSetupError) from exc
        return flow

    async def _open(self, flow: Flow, turn: _Turn) -> tuple[SessionDoc, int] | RunResponse:
        """The document this turn runs on (revision 0 when new) with the revision found stored, or a key's replay."""
        if turn.session_id:
            stored = _visible(await _before_deadline(self.session_store.load(turn.session_id)), turn.caller)
            if stored is not None:
                replay = _replay(stored, turn)
                if replay is not None:
                    return replay
                found = stored.revision
                doc = await self._restore(flow, stored)
                if doc is not None:
                    return doc, found
        if turn.weak_key:
            raise IdempotencyKeyTooWeakError("An anonymous first turn's key is too short.")
        try:
            created = await _before_deadline(
                self.session_store.create(_new_flow_doc(flow), session_id=turn.first_id, owner=turn.caller)
            )
            return created, created.revision
        except SessionConflictError:
            if turn.first_id is None:
                raise
        # Another attempt of the same keyed first turn created the session first: replay it or carry on there.
        stored = _visible(await _before_deadline(self.session_store.load(turn.first_id)), turn.caller)
        if stored is None:
            raise SessionConflictError(turn.first_id)
        replay = _replay(stored, turn)
        if replay is not None:
            return replay
        found = stored.revision
        doc = await self._restore(flow, stored)
        if doc is None:
            raise SessionConflictError(turn.first_id)
        return doc, found

    def _validate_models(self, flow: Flow) -> None:
        self.providers.validate(flow.model_selection())
        for step in flow.get_steps():
            if not step.is_logic():
                self.providers.validate(step.model_selection())

    async def _restore(self, flow: Flow, stored: SessionDoc) -> SessionDoc | None:
        """``stored`` ready to continue, or None when this turn must start a new session instead."""
        if stored.run_status != "running":
            return None
        if stored.flow.name != flow.id:
            raise SessionFlowMismatchError(stored.id, stored.flow.name, flow.id)
        stored.check_invariant()
        if stored.revision == 0:
            # Created by a first turn that never landed (its process died, or it failed and kept nothing):
            # this turn runs as that session's first turn.
            return stored
        # The default hook never changes the document, so only an overriding flow pays for change detection.
        custom_hook = type(flow).on_restore_session_doc is not Flow.on_restore_session_doc
        before = stored.to_json_dict() if custom_hook else None
        try:
            restored = await flow.on_restore_session_doc(stored)
            if restored is not None:
                restored.normalise()
                restored.check_invariant()
        except Exception as exc:  # noqa: BLE001 - the stored document stays as it is, for a fixed flow to resume
            raise _defect(exc, "RESTORE_FAILED", RestoreFailedError) from exc
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
            restored.write_id = uuid.uuid4().hex
            saved = await _before_deadline(self.session_store.save(restored, restored.revision))
            restored.revision, restored.save_on = saved.revision, saved.save_on
        return restored

    async def _save_session(self, flow: Flow) -> None:
        await self._compact(flow, force=False)
        doc = flow._write_back()
        limit = self.session_store.max_document_bytes
        memory = flow.get_memory()
        # Measuring costs a second encoding, so only when forced compaction could shrink the document;
        # the store itself refuses an oversized document before writing anything.
        if limit and memory.summary_model is not None and memory.summary_namespaces:
            size = self.session_store.stored_size(doc)
            if size > limit * FORCE_COMPACTION_RATIO and await self._compact(flow, force=True):
                doc = flow._write_back()
        await self._write(doc)

    async def _write(self, doc: SessionDoc) -> None:
        # A fresh write id per write: reading it back tells whether a write whose answer was lost landed.
        doc.write_id = uuid.uuid4().hex
        saved = await _before_deadline(self.session_store.save(doc, doc.revision))
        doc.revision, doc.save_on = saved.revision, saved.save_on

    async def _commit(self, flow: Flow, turn: _Turn, response: RunResponse) -> RunResponse:
        """Save the turn (with its receipt when keyed) and settle what a failed save really did."""
        doc = flow.get_session_doc()
        _add_receipt(doc, turn, response)
        try:
            await self._save_session(flow)
        except (SessionConflictError, SessionStoreError, TurnDeadlineError) as exc:
            return await self._settle(doc, turn, response, exc)
        except PicoFlowError as exc:
            return _failure(exc, doc.id, turn.request_id)
        return response

    async def _settle(self, doc: SessionDoc, turn: _Turn, response: RunResponse, exc: PicoFlowError) -> RunResponse:
        if isinstance(exc, SessionStoreError) and not exc.ambiguous:
            return _failure(exc, doc.id, turn.request_id)
        # A conflict, a write whose answer was lost or a save cut off by the deadline may hide a write that
        # landed (a retried write that had landed meets its own condition as a conflict): read back to know.
        stored = await self._read_back(doc.id)
        if stored is None:
            # The session is gone (deleted while the turn ran): this write can never land.
            return _failure(SessionConflictError(doc.id), doc.id, turn.request_id)
        if stored is not _UNREADABLE:
            if stored.write_id == doc.write_id:
                _log.info("Session write confirmed by reading it back", extra={"requestId": turn.request_id})
                return response
            replay = _replay(stored, turn, quiet=True)
            if replay is not None:
                return replay
            if isinstance(exc, SessionConflictError) or stored.revision != doc.revision:
                return _failure(SessionConflictError(doc.id), doc.id, turn.request_id)
        return _failure(
            SessionOutcomeUnknownError(f"The save's outcome is unknown after {type(exc).__name__}: {exc}"),
            doc.id,
            turn.request_id,
        )

    async def _read_back(self, session_id: str) -> SessionDoc | None:
        """The stored session, None when there is none, ``_UNREADABLE`` when it cannot be read in time."""
        deadline = current_deadline()
        budget = READ_BACK_SECONDS if deadline is None else deadline + READ_BACK_SECONDS - time.monotonic()
        if budget <= 0:
            return _UNREADABLE
        try:
            return await asyncio.wait_for(self.session_store.load(session_id), budget)
        except Exception as exc:  # noqa: BLE001 - an unreadable store leaves the outcome unknown
            _log.warning("Read-back after an unsettled save failed", extra={"errorType": type(exc).__name__})
            return _UNREADABLE

    async def _compact(self, flow: Flow, *, force: bool) -> bool:
        memory = flow.get_memory()
        if memory.summary_model is None or not memory.summary_namespaces:
            return False
        compacted = False
        for name in sorted(memory.summary_namespaces & set(memory.names())):
            space = memory.namespace(name)
            try:
                model = self.providers.chat_model(memory.summary_model)
                result = await _within_turn(
                    compact_history(
                        space.messages,
                        previous_summary=space.summary,
                        model=model,
                        config=memory.summary_config,
                        force=force,
                    ),
                    reserve=SAVE_RESERVE_SECONDS,
                )
            except Exception as exc:  # noqa: BLE001 - compaction must never fail the turn
                flow.logger.warn(f"Memory compaction skipped: {type(exc).__name__}: {exc}", namespace=name)
                continue
            if result is None:
                continue
            add_usage(flow.get_session_doc().tokens, result.response)
            space.messages[:] = result.messages
            space.summary = result.summary
            space.summarized_through_id = result.summarized_through_id
            compacted = True
        return compacted

    async def _abort(self, flow: Flow, doc: SessionDoc, exc: Exception, turn: _Turn) -> RunResponse:
        """A defect in flow code: end the session as ``aborted`` (unless the flow keeps it) and say so."""
        # Framework checks on flow code raise plain PicoFlowErrors: to a client they are the same defect.
        plain = not isinstance(exc, PicoFlowError) or exc.code == PicoFlowError.code
        failure = PicoFlowError(str(exc), code="TURN_FAILED") if plain else exc
        response = _failure(failure, doc.id, turn.request_id, cause=exc)
        if flow.keep_session_on_error:
            return response
        doc.run_status = "aborted"
        SessionLogger(doc).error(
            str(exc) or type(exc).__name__, errorType=type(exc).__name__, requestId=turn.request_id
        )
        _add_receipt(doc, turn, response)
        try:
            await self._write(doc)
        except Exception as save_exc:  # noqa: BLE001 - report in the logs, do not mask the original failure
            _log.error(
                "The aborted session could not be saved",
                extra={"requestId": turn.request_id, "errorType": type(save_exc).__name__},
            )
        return response

    # -- deletion and shutdown ------------------------------------------------------------------

    async def delete_session(
        self, session_id: str | None, *, deadline: float | None = None, caller: str | None = None
    ) -> dict[str, Any]:
        """Permanently remove a session document. Never raises.

        A session that does not exist, or that belongs to another principal than ``caller``, is answered
        alike with code ``SESSION_NOT_FOUND``, so the answer never tells that someone else's session exists.
        """
        if not session_id:
            return {"success": True, "session": ""}
        with turn_deadline(deadline):
            return await self._delete(session_id, caller or None)

    async def _delete(self, session_id: str, caller: str | None) -> dict[str, Any]:
        try:
            if not SESSION_ID_PATTERN.fullmatch(session_id):
                raise BadRequestError("The session id must be 1-128 letters, digits, '_' or '-'.")
            async with self._session_lock(session_id):
                try:
                    doc = await _before_deadline(self.session_store.load(session_id))
                except SessionFlowInvariantError:
                    # A corrupted document cannot be read, but ending it is exactly what its owner wants.
                    await _before_deadline(self.session_store.delete(session_id))
                    return {"success": True, "session": session_id}
                if _visible(doc, caller) is None:
                    raise SessionNotFoundError("No session with this id belongs to the caller.")
                await _before_deadline(self.session_store.delete(session_id, doc.revision))
        except Exception as exc:  # noqa: BLE001 - deletion reports failures instead of raising
            failure = exc if isinstance(exc, PicoFlowError) else PicoFlowError(str(exc))
            _log.warning("Session delete failed", extra={"code": failure.code, "errorType": type(exc).__name__})
            return {"success": False, "message": _public_message(failure), "session": session_id,
                    "code": failure.code}
        return {"success": True, "session": session_id}

    async def close(self) -> None:
        await self.session_store.close()

    @contextlib.asynccontextmanager
    async def _session_lock(self, session_id: str | None) -> AsyncIterator[None]:
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


def _new_flow_doc(flow: Flow) -> FlowDoc:
    try:
        return flow._new_flow_doc()
    except Exception as exc:  # noqa: BLE001 - e.g. an initial step the flow does not define
        raise _defect(exc, "FLOW_SETUP_FAILED", FlowSetupError) from exc


def _visible(doc: SessionDoc | None, caller: str | None) -> SessionDoc | None:
    """``doc`` when ``caller`` may use it: sessions created anonymously are open to anyone with the id."""
    if doc is None or (doc.owner is not None and doc.owner != caller):
        return None
    return doc


def _replay(stored: SessionDoc, turn: _Turn, *, quiet: bool = False) -> RunResponse | None:
    """The stored answer when ``turn``'s key is already spent on ``stored``; raises for a misused key."""
    if turn.key is None:
        return None
    receipt = find_receipt(stored.receipts, turn.key)
    if receipt is None:
        if stored.id == turn.first_id and stored.revision > 0 and not quiet:
            # The session this key started has moved on and no longer holds the key's receipt.
            raise IdempotencyKeyReusedError("The key's first turn is too old to replay.")
        return None
    if receipt.request != turn.request:
        if quiet:
            return None
        raise IdempotencyKeyMismatchError("The key was applied to another request body.")
    status = receipt.response.get("status_code")
    _log.info("Idempotent replay", extra={"requestId": turn.request_id, "statusCode": status})
    return RunResponse.model_validate({**receipt.response, "replayed": True})


def _add_receipt(doc: SessionDoc, turn: _Turn, response: RunResponse) -> None:
    if turn.key is not None:
        response_kept = response.receipt_response()
        receipt = TurnReceipt(key=turn.key, request=turn.request, at=int(time.time()), response=response_kept)
        doc.receipts = add_receipt(doc.receipts, receipt)


def _defect(exc: BaseException, code: str, kind: type[PicoFlowError] = PicoFlowError) -> PicoFlowError:
    """``exc`` as a typed error carrying ``code``; a PicoFlow error keeps its own code unless it is a setup one."""
    if isinstance(exc, PicoFlowError) and kind is PicoFlowError:
        return exc
    error = kind(f"{type(exc).__name__}: {exc}")
    error.code = code
    error.__cause__ = exc
    return error


async def _bounded_turn(call: Awaitable[T]) -> T:
    """Run the turn's steps, cut off at the deadline (flow code that never returns must not outlast it)."""
    try:
        return await _within_turn(call, reserve=0)
    except TimeoutError as exc:
        deadline = current_deadline()
        if deadline is not None and time.monotonic() >= deadline:
            raise TurnDeadlineError("The turn's steps did not finish before the deadline.") from exc
        raise


async def _within_turn(call: Awaitable[T], *, reserve: float) -> T:
    """Await optional work (a summary), giving up ``reserve`` seconds before the deadline to leave time for the save."""
    deadline = current_deadline()
    if deadline is None:
        return await call
    return await asyncio.wait_for(call, max(deadline - reserve - time.monotonic(), 0.01))


async def _before_deadline(call: Awaitable[T]) -> T:
    """Await a store call, giving up when the turn's deadline passes (a hung backend must not outlast it)."""
    deadline = current_deadline()
    if deadline is None:
        return await call
    try:
        return await asyncio.wait_for(call, max(deadline - time.monotonic(), 0.01))
    except TimeoutError as exc:
        raise TurnDeadlineError("The session store did not answer before the turn deadline; please retry.") from exc


def _public_message(exc: PicoFlowError, *, saved: bool = False) -> str:
    # Request checks speak in fixed sentences of their own; everything else gets its code's sentence.
    return exc.message if isinstance(exc, BadRequestError) else public_message(exc.code, saved=saved)


def _failure(
    exc: PicoFlowError, session: str, request_id: str, *, cause: BaseException | None = None, saved: bool = False
) -> RunResponse:
    """The failure answer for ``exc``; ``saved`` when this request saved the session before failing."""
    cause = cause or exc.__cause__ or exc
    extra: dict[str, Any] = {
        "requestId": request_id,
        "code": exc.code,
        "statusCode": exc.status_code,
        "errorType": type(cause).__name__,
        "where": _origin(cause),
    }
    if isinstance(exc, SessionStoreError | SessionOutcomeUnknownError):
        # Our own wording: operation, endpoint and backend code, never user text.
        extra["detail"] = exc.message
    (_log.error if exc.status_code >= 500 else _log.info)("Turn failed", extra=extra)
    return RunResponse(
        success=False,
        completed=False,
        message=_public_message(exc, saved=saved),
        session=session,
        error_code=exc.code,
        status_code=exc.status_code,
        request_id=request_id,
        retry_after=RETRY_AFTER_SECONDS.get(exc.code) if exc.status_code >= 409 else None,
        detail=exc.message,
    )


def _origin(exc: BaseException) -> str | None:
    """``file:line`` where ``exc`` was raised, for the logs (its message may quote user data)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}" if tb is not None else None


def _usage_since(before: TokenUsage, after: TokenUsage) -> TokenUsage:
    return TokenUsage(**{name: getattr(after, name) - getattr(before, name) for name in TokenUsage.model_fields})

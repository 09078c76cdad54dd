"""FlowEngine: the registry of flows and providers, and the load -> run -> save cycle of a turn."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Iterable, Mapping
from typing import Any, TypeVar

from pydantic import BaseModel

from picoflow.compaction import compact_history
from picoflow.decision import DecisionProvider
from picoflow.errors import (
    PicoFlowError,
    SessionConflictError,
    SessionFlowInvariantError,
    SessionFlowMismatchError,
    SessionStoreError,
    SessionTooLargeError,
)
from picoflow.flow import Flow
from picoflow.logger import SessionLogger
from picoflow.models.registry import ModelProvider, ProviderRegistry
from picoflow.runner import TurnDeadlineError, run_turn
from picoflow.session.document import SessionDoc, TokenUsage
from picoflow.session.store import SessionStore, store_from_env
from picoflow.transitions import PLAIN_TEXT

SESSION_ID_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
# Compaction is forced once a document reaches this share of the store's size limit.
FORCE_COMPACTION_RATIO = 0.8

_UNTOUCHED_ERRORS = (
    SessionConflictError,
    SessionFlowMismatchError,
    SessionFlowInvariantError,
    SessionTooLargeError,
    SessionStoreError,
    TurnDeadlineError,
)

_log = logging.getLogger("picoflow")
T = TypeVar("T")

_turn_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("picoflow_turn_deadline", default=None)


class RunResponse(BaseModel):
    """The result of one turn; failures carry ``error_code`` and ``status_code``."""

    success: bool
    completed: bool
    message: Any = ""
    session: str = ""
    content_type: str = PLAIN_TEXT
    error_code: str | None = None
    status_code: int = 200
    #: Tokens this turn used (model calls, retries and summaries), for metrics; not part of the envelope.
    tokens: TokenUsage | None = None

    def envelope(self) -> dict[str, Any]:
        """The JSON body returned over HTTP."""
        body: dict[str, Any] = {
            "success": self.success,
            "completed": self.completed,
            "message": self.message,
            "session": self.session,
        }
        if self.success:
            body["contentType"] = self.content_type
        else:
            body["code"] = self.error_code
        return body


class BadRequestError(PicoFlowError):
    code = "BAD_REQUEST"
    status_code = 400


class FlowNotFoundError(PicoFlowError):
    code = "FLOW_NOT_FOUND"
    status_code = 400


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
        self._locks: dict[tuple[int, str], tuple[asyncio.Lock, int]] = {}
        self.register_flows(flows)

    # -- registration -------------------------------------------------------------------------

    def register_flows(self, flows: Iterable[type[Flow]] | Mapping[str, type[Flow]]) -> FlowEngine:
        """Register flows by list (named by ``Flow.id``) or by mapping; the batch is all-or-nothing."""
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
        return _turn_deadline.get()

    # -- turns --------------------------------------------------------------------------------

    async def run(
        self,
        flow_name: str,
        user_message: str | None = None,
        session_id: str | None = None,
        config: dict[str, Any] | None = None,
        *,
        deadline: float | None = None,
    ) -> RunResponse:
        """Run one turn; never raises — failures come back as a ``RunResponse`` with ``success=False``."""
        token = _turn_deadline.set(deadline)
        try:
            self._check_input(flow_name, user_message, session_id, config)
            async with self._session_lock(session_id):
                return await self._run_locked(flow_name, user_message or "", session_id, config)
        except PicoFlowError as exc:
            return _failure(exc, session_id or "")
        finally:
            _turn_deadline.reset(token)

    def run_sync(self, flow_name: str, user_message: str | None = None, session_id: str | None = None,
                 config: dict[str, Any] | None = None) -> RunResponse:
        """Blocking convenience wrapper around :meth:`run`."""
        return asyncio.run(self.run(flow_name, user_message, session_id, config))

    def _check_input(self, flow_name: Any, user_message: Any, session_id: Any, config: Any) -> None:
        if not isinstance(flow_name, str) or not flow_name.strip():
            raise BadRequestError("flowName must be a non-empty string.")
        if flow_name not in self._flows:
            raise FlowNotFoundError(f"Flow '{flow_name}' is not registered.")
        if user_message is not None and not isinstance(user_message, str):
            raise BadRequestError("message must be a string.")
        if config is not None and not isinstance(config, dict):
            raise BadRequestError("config must be a JSON object.")
        try:
            # The session document is UTF-8 JSON: refuse what it cannot hold (lone surrogates, cycles,
            # nesting deeper than the encoder goes) before anything is created.
            json.dumps([user_message, config], ensure_ascii=False).encode("utf-8")
        except (TypeError, ValueError, RecursionError) as exc:
            raise BadRequestError("message and config must be valid JSON text.") from exc
        if session_id is not None and not (isinstance(session_id, str) and SESSION_ID_PATTERN.fullmatch(session_id)):
            raise BadRequestError("The session id must be 1-128 letters, digits, '_' or '-'.")

    async def _run_locked(
        self, flow_name: str, user_message: str, session_id: str | None, config: dict[str, Any] | None
    ) -> RunResponse:
        deadline = _turn_deadline.get()
        if deadline is not None and deadline <= time.monotonic():
            # No time is left (a Lambda invoked with less than the handler's margin, or a long wait for the
            # session lock): refuse before any store call, so no session is created or read for nothing.
            raise TurnDeadlineError("The turn has no time left before its deadline; please retry.")
        flow = self._flows[flow_name]()
        if config is not None:
            flow.add_context({"config": config})
        await flow.init()
        flow.collect_steps()
        self._validate_models(flow)

        doc = await self._restore(flow, session_id)
        is_new = doc is None
        if is_new:
            doc = await _before_deadline(self.session_store.create(flow.new_flow_doc()))
        tokens_before = doc.tokens.model_copy()
        try:
            flow.bind(self, doc)
            if is_new:
                opener = await flow.get_current_step().on_start()
                if opener is not None:
                    flow.get_current_step().get_memory().append(opener)
            else:
                await flow.get_current_step().on_restore()
            if flow.is_batch():
                await self._save_session(flow)
            message = await run_turn(flow, user_message)
            await self._save_session(flow)
        except _UNTOUCHED_ERRORS as exc:
            return _failure(exc, doc.id)
        except Exception as exc:  # noqa: BLE001 - every other failure aborts the session
            return await self._abort(doc, exc)
        current = flow.get_current_step()
        return RunResponse(
            success=True,
            completed=current.is_end(),
            message=message,
            session=doc.id,
            content_type=current.content_type,
            tokens=_usage_since(tokens_before, doc.tokens),
        )

    def _validate_models(self, flow: Flow) -> None:
        self.providers.validate(flow.model_selection())
        for step in flow.get_steps():
            if not step.is_logic():
                self.providers.validate(step.model_selection())

    async def _restore(self, flow: Flow, session_id: str | None) -> SessionDoc | None:
        if not session_id:
            return None
        doc = await _before_deadline(self.session_store.load(session_id))
        if doc is None or doc.run_status != "running":
            return None
        if doc.flow.name != flow.id:
            raise SessionFlowMismatchError(session_id, doc.flow.name, flow.id)
        doc.check_invariant()
        # The default hook never changes the document, so only an overriding flow pays for change detection.
        custom_hook = type(flow).on_restore_session_doc is not Flow.on_restore_session_doc
        before = doc.to_json_dict() if custom_hook else None
        restored = await flow.on_restore_session_doc(doc)
        if restored is None:
            return None
        restored.check_invariant()
        if custom_hook and restored.to_json_dict() != before:
            # Only a migrated document is written before the turn; an unchanged one costs nothing.
            saved = await _before_deadline(self.session_store.save(restored, restored.revision))
            restored.revision, restored.save_on = saved.revision, saved.save_on
        return restored

    async def _save_session(self, flow: Flow) -> None:
        await self._compact(flow, force=False)
        doc = flow.write_back()
        limit = self.session_store.max_document_bytes
        memory = flow.get_memory()
        # Measuring costs a second encoding, so only when forced compaction could shrink the document;
        # the store itself refuses an oversized document before writing anything.
        if limit and memory.summary_model is not None and memory.summary_namespaces:
            size = self.session_store.stored_size(doc)
            if size > limit * FORCE_COMPACTION_RATIO and await self._compact(flow, force=True):
                doc = flow.write_back()
        saved = await _before_deadline(self.session_store.save(doc, doc.revision))
        doc.revision, doc.save_on = saved.revision, saved.save_on

    async def _compact(self, flow: Flow, *, force: bool) -> bool:
        memory = flow.get_memory()
        if memory.summary_model is None or not memory.summary_namespaces:
            return False
        compacted = False
        for name in sorted(memory.summary_namespaces & set(memory.names())):
            space = memory.namespace(name)
            try:
                model = self.providers.chat_model(memory.summary_model)
                result = await compact_history(
                    space.messages,
                    previous_summary=space.summary,
                    model=model,
                    config=memory.summary_config,
                    force=force,
                )
            except Exception as exc:  # noqa: BLE001 - compaction must never fail the turn
                flow.logger.warn(f"Memory compaction skipped: {type(exc).__name__}: {exc}", namespace=name)
                continue
            if result is None:
                continue
            flow.tally(result.response)
            space.messages[:] = result.messages
            space.summary = result.summary
            space.summarized_through_id = result.summarized_through_id
            compacted = True
        return compacted

    async def _abort(self, doc: SessionDoc, exc: Exception) -> RunResponse:
        reason = str(exc) or type(exc).__name__
        doc.run_status = "aborted"
        SessionLogger(doc).error(reason, errorType=type(exc).__name__)
        message = reason
        try:
            await self.session_store.save(doc, doc.revision)
        except Exception as save_exc:  # noqa: BLE001 - report, do not mask the original failure
            message = f"{reason} (the aborted session could not be saved: {save_exc})"
        failure = exc if isinstance(exc, PicoFlowError) else PicoFlowError(message, code="TURN_FAILED")
        return RunResponse(
            success=False,
            completed=False,
            message=message,
            session=doc.id,
            error_code=failure.code,
            status_code=failure.status_code,
        )

    # -- deletion and shutdown ------------------------------------------------------------------

    async def delete_session(self, session_id: str | None) -> dict[str, Any]:
        """Permanently remove a session document; a missing one is a success."""
        if not session_id:
            return {"success": True, "session": ""}
        try:
            if not SESSION_ID_PATTERN.fullmatch(session_id):
                raise BadRequestError("The session id must be 1-128 letters, digits, '_' or '-'.")
            async with self._session_lock(session_id):
                try:
                    doc = await self.session_store.load(session_id)
                except SessionFlowInvariantError:
                    # A corrupted document cannot be read, but ending it is exactly what its owner wants.
                    await self.session_store.delete(session_id)
                    return {"success": True, "session": session_id}
                if doc is not None:
                    await self.session_store.delete(session_id, doc.revision)
        except Exception as exc:  # noqa: BLE001 - deletion reports failures instead of raising
            failure = exc if isinstance(exc, PicoFlowError) else PicoFlowError(str(exc))
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


async def _before_deadline(call: Awaitable[T]) -> T:
    """Await a store call, giving up when the turn's deadline passes (a hung backend must not outlast it)."""
    deadline = _turn_deadline.get()
    if deadline is None:
        return await call
    try:
        return await asyncio.wait_for(call, max(deadline - time.monotonic(), 0.01))
    except TimeoutError as exc:
        raise TurnDeadlineError("The session store did not answer before the turn deadline; please retry.") from exc


def _public_message(exc: PicoFlowError) -> str:
    if isinstance(exc, SessionStoreError):
        # Backend errors can name endpoints and tables: keep them in the logs, not in responses.
        _log.warning("Session store failure", extra={"operation": exc.operation, "detail": exc.message})
        return "The session store is unavailable right now; please retry."
    return exc.message


def _failure(exc: PicoFlowError, session: str) -> RunResponse:
    return RunResponse(
        success=False,
        completed=False,
        message=_public_message(exc),
        session=session,
        error_code=exc.code,
        status_code=exc.status_code,
    )


def _usage_since(before: TokenUsage, after: TokenUsage) -> TokenUsage:
    return TokenUsage(**{name: getattr(after, name) - getattr(before, name) for name in TokenUsage.model_fields})

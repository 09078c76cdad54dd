"""FlowEngine: the registry of flows, and one turn read as load -> restore -> run -> save -> answer."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from picoflow import lifecycle, telemetry
from picoflow.authoring.flow import Flow
from picoflow.authoring.registration import check_flow_configuration
from picoflow.authoring.run_context import TurnServices
from picoflow.deadline import bounded_turn, current_deadline, turn_deadline
from picoflow.errors import (
    ApprovalNotPendingError,
    BadRequestError,
    FileRefusedError,
    FileStoreError,
    FlowNotFoundError,
    FlowSetupError,
    ModelNotConfiguredError,
    ModelUnavailableError,
    NotApproverError,
    PicoFlowError,
    SessionConflictError,
    SessionFlowInvariantError,
    SessionFlowMismatchError,
    SessionStoreError,
    SessionTooLargeError,
    TurnDeadlineError,
)
from picoflow.events import EventSink, TurnEvent
from picoflow.files.intake import store_inline
from picoflow.files.policy import DEFAULT_REQUEST_FILE_BYTES
from picoflow.files.refs import FileRef
from picoflow.files.store import FileRecord, FileStore
from picoflow.files.turn_files import TurnFiles
from picoflow.lifecycle import TurnRequest
from picoflow.mcp import MCPSessions, MCPUnavailableError
from picoflow.models.registry import ModelProvider, ProviderRegistry
from picoflow.results import RunResponse
from picoflow.session.document import TokenUsage
from picoflow.session.journal import TurnJournal
from picoflow.session.memory_store import MemorySessionStore
from picoflow.session.store import SessionStore
from picoflow.turn import decide, loop, parallel

if TYPE_CHECKING:
    from picoflow.authoring.decision import DecisionProvider

@dataclass(frozen=True)
class TurnOptions:
    """One turn's request as ``FlowEngine.run``, ``stream`` and ``decide`` take it (the arguments of ``run``, and
    the reviewer of a decision), handed whole to the code that answers it."""

    flow_name: str
    user_message: str | None
    session_id: str | None
    config: dict[str, Any] | None
    deadline: float | None = None
    idempotency_key: str | None = None
    caller: str | None = None
    request_id: str | None = None
    files: tuple[FileRef, ...] = ()
    file_data: Mapping[str, bytes] | None = None
    inline_files: tuple[FileRecord, ...] = ()
    approvals: tuple[Mapping[str, Any], ...] | None = None
    reviewer: str | None = None


# Failures that leave the session as it was stored: the turn answers a retryable or client error.
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
    ApprovalNotPendingError,
    NotApproverError,
)


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
        file_budget: int = DEFAULT_REQUEST_FILE_BYTES,
    ) -> None:
        self._flows: dict[str, type[Flow]] = {}
        #: Decision providers by the provider name a decision model selection gives; others use the chat model.
        self.decision_providers: dict[str, DecisionProvider] = dict(decision_providers or {})
        # The library's default; the adapters (aws/, local/) choose theirs from the environment.
        self.session_store = session_store if session_store is not None else MemorySessionStore()
        self.providers = providers if isinstance(providers, ProviderRegistry) else ProviderRegistry(providers or ())
        self.retry_delay = retry_delay
        #: Where attached files are read from when a model is called; None: messages carry no files.
        self.file_store = file_store
        #: The file bytes one model request carries in full; older or further files go as references the
        #: model can open again (see ``picoflow.files.reader``).
        self.file_budget = file_budget
        self._locks = lifecycle.SessionLocks()
        #: The MCP sessions this engine's turns share; ``close`` ends them.
        self.mcp = MCPSessions()
        self.register_flows(flows)

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
            check_flow_configuration(cls, self.providers, self.decision_providers)
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
        inline_files: Iterable[FileRecord] = (),
        approvals: Iterable[Mapping[str, Any]] | None = None,
    ) -> RunResponse:
        """Run one turn; never raises — failures come back as a ``RunResponse`` with ``success=False``.

        ``files`` (already checked and stored, see ``picoflow.files.intake``) join the user's message as
        references; ``file_data`` holds bytes already read for them, so the turn does not read them again.
        ``inline_files`` (the records ``take_files`` made for inline files, their bytes in ``file_data``) are
        stored only once the request has passed every check, the session's included: a refused request or a
        replayed turn stores nothing.

        With ``idempotency_key`` the turn is applied at most once: its receipt is written in the same
        conditional write as the session, and a retry with the same key (and ``caller``) gets the
        stored response back, marked ``replayed``, without running again.

        ``approvals`` are the user's decisions on tool calls waiting for one (``[{"id", "approved", "reason"?}]``,
        the ids ``RunResponse.pending_approvals`` gave): an approved call runs once, a denied one never; the model
        reads each outcome and answers (the message is then optional). A call that is not waiting answers
        ``APPROVAL_NOT_PENDING``, a reviewer's call ``NOT_APPROVER``; either writes nothing.

        This is the turn's event stream (:meth:`stream`) drained: the response is the one its final event
        carries. With nobody reading the reply as it is written, models are called without streaming.

        Args:
            flow_name: A registered flow's id (its class name unless it sets ``id``).
            user_message: The user's message; None opens the session without one.
            session_id: The session to continue; None, or an unknown or finished one, starts a new session.
            config: The new session's context, under ``config``; ignored for a session that exists.
            deadline: The ``time.monotonic()`` value the turn must end by; None sets no limit.
            idempotency_key: Apply the turn at most once per key (with ``caller``).
            caller: Who is asking (e.g. a JWT subject); sessions and files are theirs.
            request_id: The id the turn's log lines and failure carry.
            files: Stored file references that join the user's message.
            file_data: Bytes already read for those files.
            inline_files: Inline files' records, stored once the request passed every check.
            approvals: The user's decisions on tool calls waiting for them.

        Returns:
            The turn's answer: ``success``, ``completed``, ``message``, ``session``, the calls left waiting in
            ``pending_approvals``, and on failure its ``error_code`` and ``status_code``.

        Example:
            ```python
            first = await engine.run("GreetingFlow", "Hi")
            second = await engine.run("GreetingFlow", "Ada Lovelace", session_id=first.session)
            ```
        """
        return await self._drained(TurnOptions(
            flow_name, user_message, session_id, config, deadline=deadline, idempotency_key=idempotency_key,
            caller=caller, request_id=request_id, files=tuple(files), file_data=file_data,
            inline_files=tuple(inline_files), approvals=None if approvals is None else tuple(approvals),
        ))

    async def decide(
        self,
        flow_name: str,
        session_id: str,
        approval_id: str,
        approved: bool,
        *,
        reason: str | None = None,
        reviewer: str,
        deadline: float | None = None,
        idempotency_key: str | None = None,
        request_id: str | None = None,
    ) -> RunResponse:
        """A reviewer's decision on a call waiting for one (``approval="reviewer"``); never raises.

        An approved call runs in this request, once (journaled as an effect), and its result joins the step's
        memory; a denied one never runs. No model is called: the user's next turn gets the model's follow-up.
        The reviewer must be authorised by the caller (the HTTP API checks the reviewer group) and may not decide a
        call of their own session (``NOT_APPROVER``); a call that is not waiting answers ``APPROVAL_NOT_PENDING``.
        """
        decision = {"id": approval_id, "approved": approved, **({"reason": reason} if reason is not None else {})}
        return await self._drained(TurnOptions(
            flow_name, None, session_id, None, deadline=deadline, idempotency_key=idempotency_key,
            caller=reviewer, request_id=request_id, approvals=(decision,), reviewer=reviewer,
        ))

    async def _drained(self, options: TurnOptions) -> RunResponse:
        # Nobody reads the turn as it happens: it runs in the caller's task, and only its final event is queued.
        sink = EventSink(live=False)
        await self._answer(sink, options)
        while not sink.queue.empty():
            event = sink.queue.get_nowait()
            if event.final and event.response is not None:
                return event.response
        raise PicoFlowError("The turn ended without a final event.")

    def stream(
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
        inline_files: Iterable[FileRecord] = (),
        approvals: Iterable[Mapping[str, Any]] | None = None,
        tool_details: bool = False,
    ) -> AsyncIterator[TurnEvent]:
        """Run one turn (the arguments of :meth:`run`) and yield its events as they happen.

        ``delta`` events carry the reply's text as the model writes it; ``reset`` says the text sent since the
        last reset is not the reply after all; ``step`` and ``tool`` name the step entered and the tool called;
        the last event is ``committed`` (the success envelope, once the session write landed) or ``aborted``
        (the failure envelope). A reader that stops reading does not stop the turn: it still commits.

        ``tool_details=True`` is for adapters that display tool calls: each ``tool`` event then carries its call
        (``TurnEvent.call``, outside the JSON), with the validated arguments when the flow shows that tool
        (``Flow.show_tool_calls``, ``@tool(show=...)``), and a ``tool_result`` event follows each shown call.
        """
        return self._events(EventSink(details=tool_details), TurnOptions(
            flow_name, user_message, session_id, config, deadline=deadline, idempotency_key=idempotency_key,
            caller=caller, request_id=request_id, files=tuple(files), file_data=file_data,
            inline_files=tuple(inline_files), approvals=None if approvals is None else tuple(approvals),
        ))

    async def _events(self, sink: EventSink, options: TurnOptions) -> AsyncIterator[TurnEvent]:
        turn = asyncio.ensure_future(self._answer(sink, options))
        # Only a cancelled turn ends without its final event: wake the reader so it does not wait forever.
        turn.add_done_callback(lambda done: sink.queue.put_nowait(_BROKEN) if _unanswered(done) else None)
        try:
            while True:
                try:
                    event = await sink.queue.get()
                except asyncio.CancelledError:
                    turn.cancel()
                    raise
                if event is _BROKEN:
                    turn.result()  # raises what ended the turn
                yield event
                if event.final:
                    return
        finally:
            if not turn.done():
                await asyncio.shield(turn)

    async def _answer(self, sink: EventSink, options: TurnOptions) -> None:
        flow_name = options.flow_name
        request_id = options.request_id or uuid.uuid4().hex
        session = options.session_id if isinstance(options.session_id, str) else ""
        with turn_deadline(options.deadline):
            try:
                if not isinstance(flow_name, str) or not flow_name.strip():
                    raise BadRequestError("flowName must be a non-empty string.")
                flow_cls = self._flows.get(flow_name)
                if flow_cls is None:
                    raise FlowNotFoundError(f"Flow '{flow_name}' is not registered.")
                turn = lifecycle.turn_request(
                    flow_name, options.user_message, options.session_id, options.config, options.idempotency_key,
                    options.caller, request_id, options.files, reserved_config=flow_cls.allowed_private_config,
                    approvals=None if options.approvals is None else list(options.approvals),
                    reviewer=options.reviewer,
                )
                async with self._locks.hold(turn.session_id or turn.first_id):
                    prepared = replace(turn, file_data=options.file_data, inline_files=options.inline_files)
                    with telemetry.turn(flow_name, turn.message) as traced:
                        response = traced.answered(await self._turn(prepared, sink))
            except PicoFlowError as exc:
                response = RunResponse.failure(exc, session, request_id)
            except Exception as exc:  # noqa: BLE001 - a turn answers every failure with an envelope
                response = RunResponse.failure(lifecycle.defect(exc, "TURN_FAILED"), session, request_id)
        sink.finish(response)

    def run_sync(self, flow_name: str, user_message: str | None = None, session_id: str | None = None,
                 config: dict[str, Any] | None = None) -> RunResponse:
        """Blocking convenience wrapper around :meth:`run`."""
        return asyncio.run(self.run(flow_name, user_message, session_id, config))

    async def _turn(self, turn: TurnRequest, sink: EventSink) -> RunResponse:
        deadline = current_deadline()
        if deadline is not None and deadline <= time.monotonic():
            # No time left (a late invocation, a long wait for the session lock): no store call for nothing.
            raise TurnDeadlineError("The turn has no time left before its deadline; please retry.")
        try:
            flow = await loop.prepare_flow(self._flows[turn.flow_name], turn.config, self.providers)
        except ModelNotConfiguredError:
            raise
        except Exception as exc:  # noqa: BLE001 - a flow that cannot be built answers, it never raises
            raise lifecycle.defect(exc, "FLOW_SETUP_FAILED", FlowSetupError) from exc
        opened = await lifecycle.open_session(self.session_store, flow, turn)
        if isinstance(opened, RunResponse):
            return opened
        doc, found_revision = opened
        telemetry.conversation(doc.id)
        if turn.inline_files:
            await store_inline(self.file_store, turn.inline_files, turn.file_data or {})
        tokens_before = doc.tokens.model_copy()
        try:
            services = self._services(flow, TurnJournal(self.session_store, doc.id, doc.revision, doc.owner))
            files = TurnFiles(self.file_store, turn.files, turn.file_data, self.file_budget)
            flow.run_context.bind(doc, services, files)
            # Progress and text are only worth reporting to someone reading them as they happen.
            flow.run_context.events = sink if sink.live else None
            if turn.reviewer is not None:
                answer = loop.answer_review(flow, turn.decisions, turn.reviewer, turn.request_id)
            else:
                answer = loop.answer_turn(flow, turn.message, turn.request_id, turn.decisions, turn.caller)
            response = await bounded_turn(answer)
        except ModelNotConfiguredError as exc:
            # The operator's to fix, not the user's: nothing is written, not even a first turn's empty session.
            saved = doc.stored and doc.revision != found_revision
            return RunResponse.failure(exc, doc.id if doc.stored else turn.session_id or "", turn.request_id,
                                       saved=saved)
        except _UNTOUCHED_ERRORS as exc:
            # Every save moves the revision: a restore hook's migration, a batch flow's or a checkpoint's save.
            saved = doc.stored and doc.revision != found_revision
            await lifecycle.keep_unfinished(self.session_store, doc)
            return RunResponse.failure(exc, doc.id, turn.request_id, saved=saved)
        except Exception as exc:  # noqa: BLE001 - any other failure is a defect in flow code
            return await lifecycle.abort(self.session_store, flow, doc, exc, turn)
        response = await lifecycle.commit(self.session_store, flow, self.providers, turn, response)
        if response.success:
            response.tokens = _usage_since(tokens_before, doc.tokens)
        return response

    def _services(self, flow: Flow, journal: TurnJournal) -> TurnServices:
        async def save() -> None:
            await lifecycle.save(self.session_store, flow, self.providers)

        async def start(flow_name: str, message: str | None, config: dict[str, Any]) -> RunResponse:
            return await self.run(flow_name, message, None, config)

        return TurnServices(
            providers=self.providers, decision_providers=self.decision_providers, retry_delay=self.retry_delay,
            model_loop=loop.run_model_loop, run_child=parallel.run_child, run_steps=parallel.run_batch,
            decide=decide.decide, save=save, start=start, mcp=self.mcp, journal=journal,
        )

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
            ended = await lifecycle.delete(self.session_store, self._locks, session_id, caller or None)
        return ended.envelope()

    async def close(self) -> None:
        """Close the session store and this event loop's MCP sessions."""
        await self.session_store.close()
        await self.mcp.close()


# Queued when a turn ended without answering (cancelled, or a BaseException escaped it).
_BROKEN = TurnEvent("aborted")


def _unanswered(turn: asyncio.Future[None]) -> bool:
    return turn.cancelled() or turn.exception() is not None


def _usage_since(before: TokenUsage, after: TokenUsage) -> TokenUsage:
    return TokenUsage(**{name: getattr(after, name) - getattr(before, name) for name in TokenUsage.model_fields})

"""Flow: the durable workflow boundary — one registered name, one step registry, one session envelope."""

from __future__ import annotations

import asyncio
import copy
import inspect
import os
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, overload

from pydantic import BaseModel

from picoflow.authoring.recovery_hooks import RecoveryHooks
from picoflow.authoring.run_context import RunContext, ensure_top_level, execution_frames
from picoflow.authoring.step import Step, TerminateSessionStep
from picoflow.authoring.step_tools import ToolSpec
from picoflow.authoring.transitions import step_name
from picoflow.conversation.requests import DEFAULT_MAX_PRIOR_REQUESTS, DecisionConversation, read_conversation
from picoflow.conversation.state import deep_merge, read_path
from picoflow.errors import PicoFlowError
from picoflow.files.held import read_held_file
from picoflow.files.refs import FileRef
from picoflow.logger import SessionLogger
from picoflow.mcp import M, MCPServerSpec, find_server
from picoflow.models.registry import ModelSelection
from picoflow.session.document import SESSION_DOC_VERSION, SequenceItem, SessionDoc

if TYPE_CHECKING:
    from picoflow.authoring.decision import DecisionConfig, DecisionErrorContext
    from picoflow.batch import BatchInvoker
    from picoflow.results import RunResponse


class Flow(RecoveryHooks):
    """Subclass this to declare a conversation: its model, steps, tools and restore policy.

    A fresh instance serves each request; only the session document survives between turns.
    """

    id: ClassVar[str] = ""
    #: Save the session on every top-level step crossing, not only at the end of the turn (one write each).
    checkpoint_on_crossing: ClassVar[bool] = False
    #: Keep the session as it was when flow code raises during a turn, instead of ending it as ``aborted``.
    keep_session_on_error: ClassVar[bool] = False
    #: Request ``config`` keys starting with ``_`` are reserved; a flow lists here the ones it accepts.
    allowed_private_config: ClassVar[frozenset[str]] = frozenset()
    #: Let clients that display tool calls (AG-UI) see the validated arguments and results of this flow's tools
    #: without effects; an effect tool's are shown only when its own ``show=True`` says so.
    show_tool_calls: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "id" not in cls.__dict__:
            cls.id = cls.__name__

    def __init__(self) -> None:
        #: The running session this instance serves: document, memory, step states, cursor and services.
        self.run_context = RunContext()
        self._mcp_servers: list[MCPServerSpec] | None = None

    # -- subclass hooks -----------------------------------------------------------------------

    def config_model(self) -> ModelSelection:
        """The flow's default model; every step without ``use_model`` inherits it. Every flow implements it.

        Returns:
            The provider, model name and parameters the flow's steps call by default.

        Raises:
            NotImplementedError: the flow does not implement it (such a class is not registered as a flow).

        Example:
            ```python
            def config_model(self) -> ModelSelection:
                return ModelSelection(provider="openai", name="gpt-4o-mini", params={"temperature": 0.2})
            ```
        """
        raise NotImplementedError(f"{type(self).__name__} must implement config_model().")

    async def init(self) -> None:
        """Per-request setup after the request config is in context, before steps are collected."""

    def define_steps(self) -> list[Step]:
        """The flow's steps, one instance of each bound to this flow; only these can be entered.

        Returns:
            The registered steps; by default a lone ``TerminateSessionStep`` in the ``temp`` namespace.

        Example:
            ```python
            def define_steps(self) -> list[Step]:
                return [AskNameStep(self).use_memory("chat"), GreetStep(self).use_memory("chat")]
            ```
        """
        return [TerminateSessionStep(self).use_memory("temp")]

    def initial_step(self) -> type[Step] | None:
        """The step a new session starts on; None means the first registered step.

        Returns:
            A registered step class, or None for the first of ``define_steps()``.

        Example:
            ```python
            def initial_step(self) -> type[Step] | None:
                return FavoritesStep if self.get_context("config.returning") else NameStep
            ```
        """
        return None

    def define_tools(self) -> list[ToolSpec]:
        """Tool definitions shared by several steps."""
        return []

    async def on_restore_session_doc(self, doc: SessionDoc) -> SessionDoc | None:
        """Accept, migrate (return the changed doc) or decline (return None) a stored session."""
        return doc if self.is_session_current(doc) else None

    def is_session_current(self, doc: SessionDoc) -> bool:
        return doc.version == SESSION_DOC_VERSION

    def session_idle_ms(self, doc: SessionDoc) -> int:
        """Milliseconds since the document was last saved."""
        return int((datetime.now(UTC) - doc.save_on).total_seconds() * 1000)

    def config_llm_call_policy(self) -> dict[str, Any]:
        """Code-owned model-call policy: ``timeout_ms`` per attempt (none by default) and ``stall_ms``, the longest
        wait for each chunk of a streamed reply (10 s by default), e.g. ``{"timeout_ms": 60_000}``; steps may
        override it."""
        return {}

    def config_decision(self) -> DecisionConfig | dict[str, Any]:
        """Decision options every ``DecisionStep`` inherits: ``provider``, ``model``, ``timeoutMs``, ``maxRetries``
        (a dict, snake_case keys too, or a ``DecisionConfig``); none means the flow's chat model decides."""
        return {}

    async def on_decision_error(self, error: Exception, context: DecisionErrorContext) -> Any:
        """Consulted when a decision step's ``on_decision_error`` returns None; None re-raises ``error``."""
        return None

    def is_batch(self) -> bool:
        """True asks the engine to save the session once before the turn runs."""
        return False

    def is_batch_coordinator(self) -> bool:
        """True runs :meth:`spawn_steps` instead of the current step (batch coordinator mode).

        Decided by flow code, never by a client: a flow that lets requests choose reads its own context here
        (listing any ``_`` key it reads in ``allowed_private_config``).
        """
        return False

    async def spawn_steps(self) -> str:
        """Runs instead of the current step when :meth:`is_batch_coordinator` is True."""
        return ""

    async def concurrent_steps(
        self,
        items: list[Any],
        batch_size: int,
        on_config: Callable[[Any], dict[str, Any]],
        on_bot_response: Callable[[Any, RunResponse], Any],
        message: str | None = None,
        invoke: BatchInvoker | None = None,
    ) -> None:
        """Run one new session of this flow per item, ``batch_size`` at a time; failures are logged and skipped.

        ``on_config(item)`` gives each session's config (it must not make the item a coordinator), and
        ``on_bot_response(item, response)`` receives each item's first response. Sessions start in this
        process, or through ``invoke`` (see ``picoflow.batch.http_invoker``; ``SELF_URL`` selects it by default).
        """
        if batch_size < 1:
            raise PicoFlowError("concurrent_steps() needs a batch_size of at least 1.")
        if invoke is None:
            self_url = os.environ.get("SELF_URL")
            if self_url:
                # Imported here: only a batch coordinator that starts its sessions over HTTP needs it.
                from picoflow.batch import http_invoker

                invoke = http_invoker(self_url)
            else:
                invoke = self.run_context.require_services().start
        for start in range(0, len(items), batch_size):
            batch = items[start : start + batch_size]
            responses = await asyncio.gather(*(invoke(self.id, message, on_config(item)) for item in batch))
            for offset, (item, response) in enumerate(zip(batch, responses, strict=True)):
                if not response.success:
                    self.logger.error("Batch item failed", index=start + offset, code=response.error_code)
                    continue
                result = on_bot_response(item, response)
                if inspect.isawaitable(result):
                    await result
            self.logger.log("Batch progress", done=min(start + batch_size, len(items)), total=len(items))

    def config_parallel_execution(self) -> dict[str, Any]:
        """Limits for nested execution: ``max_depth`` (8), ``max_invocations`` (256), ``cancellation_grace_ms``."""
        return {}

    # -- context ------------------------------------------------------------------------------

    def get_context(self, path: str | None = None) -> Any:
        """Read the session context, e.g. ``get_context("config.tenantId")``.

        Args:
            path: A dotted path into the context; None reads all of it. The first request's ``config`` is
                under ``config``.

        Returns:
            A copy of the value at ``path`` (None when it is missing): changing it changes nothing stored.

        Example:
            ```python
            brand = self.get_context("config.brand") or "PicoFlow"
            ```
        """
        return copy.deepcopy(read_path(self.run_context.values, path))

    def add_context(self, data: dict[str, Any]) -> None:
        self._refuse_in_worker("change the flow context")
        deep_merge(self.run_context.values, data)

    def set_context(self, context: dict[str, Any]) -> None:
        self._refuse_in_worker("change the flow context")
        self.run_context.values = copy.deepcopy(context)

    # -- steps and state ----------------------------------------------------------------------

    def get_step(self, name: str) -> Step | None:
        return self.run_context.steps.get(name)

    def require_step(self, target: type[Step] | str) -> Step:
        name = step_name(target)
        step = self.run_context.steps.get(name)
        if step is None:
            raise PicoFlowError(f"Step '{name}' is not defined in flow '{self.id}'.")
        return step

    def get_steps(self) -> list[Step]:
        return list(self.run_context.steps.values())

    def get_current_step(self) -> Step | None:
        context = self.run_context
        return context.steps.get(context.current) if context.current else None

    def get_executing_step(self) -> Step | None:
        """The innermost nested step running in this task, else the step under the cursor."""
        frames = execution_frames(self)
        return frames[-1] if frames else self.get_current_step()

    def get_step_state(self, step_cls: type[Step] | str, key: str | None = None) -> Any:
        """A step's state (or one dotted path in it); inside a parallel worker, a copy of its snapshot.

        Args:
            step_cls: The step class, or its registered name.
            key: A dotted path into that step's state; None reads all of it.

        Returns:
            The value at ``key`` (None when it is missing).

        Raises:
            PicoFlowError: the step is not registered in this flow.

        Example:
            ```python
            name = self.flow.get_step_state(AskNameStep, "name")
            ```
        """
        return self.run_context.view(self).step_state(self.require_step(step_cls), key)

    def save_step_state(self, step_cls: type[Step] | str, data: dict[str, Any]) -> None:
        self._state_owner(step_cls).save_state(data)

    def save_transient_step_state(self, step_cls: type[Step] | str, data: dict[str, Any]) -> None:
        self._state_owner(step_cls).save_transient_state(data)

    def get_transient_step_state(self, step_cls: type[Step] | str, path: str | None = None) -> Any:
        return self._state_owner(step_cls).get_transient_state(path)

    def _state_owner(self, step_cls: type[Step] | str) -> Step:
        return self.run_context.view(self).state_owner(self.require_step(step_cls))

    # -- memory -------------------------------------------------------------------------------

    def get_memory(self, namespace: str | None = None) -> Any:
        """The Memory container, or the live message list of one namespace (a private clone in a worker)."""
        memory = self.run_context.view(self).memory()
        if namespace is None:
            return memory
        return memory.messages(namespace)

    def get_conversation(
        self, namespace: str, max_prior_requests: int = DEFAULT_MAX_PRIOR_REQUESTS
    ) -> DecisionConversation:
        """The newest human request in ``namespace`` and up to ``max_prior_requests`` earlier ones.

        Navigation messages the framework writes between steps are left out.
        """
        memory = self.get_memory()
        steps = self.run_context.steps
        if namespace not in memory.names():
            return read_conversation([], steps, max_prior_requests)
        return read_conversation(memory.messages(namespace), steps, max_prior_requests)

    # -- tools --------------------------------------------------------------------------------

    def get_tool(self, name: str) -> ToolSpec | None:
        return self.run_context.tools.get(name)

    # -- MCP servers --------------------------------------------------------------------------

    def define_mcp_servers(self) -> list[MCPServerSpec]:
        """The MCP servers this flow's steps and handlers use, each declared once; none connects until needed."""
        return []

    def mcp_server(self, name: str) -> MCPServerSpec:
        """The declared MCP server ``name``."""
        if self._mcp_servers is None:
            self._mcp_servers = list(self.define_mcp_servers())
        return find_server(self._mcp_servers, name, self.id)

    @overload
    async def call_mcp_tool(
        self, server: str, tool: str, arguments: dict[str, Any] | BaseModel | None = None, *, result_model: type[M]
    ) -> M: ...

    @overload
    async def call_mcp_tool(
        self, server: str, tool: str, arguments: dict[str, Any] | BaseModel | None = None, *, result_model: None = None
    ) -> dict[str, Any] | str: ...

    async def call_mcp_tool(
        self,
        server: str,
        tool: str,
        arguments: dict[str, Any] | BaseModel | None = None,
        *,
        result_model: type[M] | None = None,
    ) -> M | dict[str, Any] | str:
        """Call ``tool`` of the declared MCP ``server`` as a backend: its structured result (else its text).

        With ``result_model`` the structured result comes back validated by it. Raises
        ``picoflow.mcp.MCPUnavailableError`` when the tool answers with an error, the server cannot be reached or
        does not answer within its timeout and the turn's deadline, or the result does not fit ``result_model``;
        uncaught, the turn fails as retryable with the session unchanged.
        """
        sessions = self.run_context.require_services().mcp
        result = await sessions.call_tool(self.mcp_server(server), tool, arguments)
        return result.value() if result_model is None else result.parse(result_model)

    # -- session ------------------------------------------------------------------------------

    def get_session_doc(self) -> SessionDoc:
        """The session document; inside a parallel worker, a read-only view of it."""
        return self.run_context.view(self).session_doc(self.run_context.require_doc())

    def get_session_id(self) -> str:
        return self.get_session_doc().id

    def get_attachments(self) -> list[FileRef]:
        """The files the user attached to this turn's message (references; the bytes stay in the file store)."""
        context = self.run_context
        context.require_services()
        return list(context.files.attached)

    def attach_server_file(self, path: str | os.PathLike[str], name: str | None = None) -> FileRef:
        """A reference to a file the server holds (a sample the flow ships with) that a message can carry.

        Put it in a message with ``with_files`` (``picoflow.files.refs``) as an uploaded file would be: the
        model of this turn gets its bytes, the session document only the reference. ``path`` must come from
        flow code (an allow-list of the flow's own files), never from a model or a client; ``name`` is what the
        model is shown (default: the file's name). The file must meet the upload policy's size and type limits.
        Its bytes are served for this turn only: a later turn that still shows the message gets a note that the
        file is no longer available, unless the flow attaches it again.
        """
        ref, data = read_held_file(Path(path), name)
        self.run_context.files.hold(ref, data)
        return ref

    def mark_completed(self) -> None:
        self._refuse_in_worker("complete the session")
        self.run_context.require_doc().run_status = "completed"

    async def checkpoint(self) -> None:
        """Save the session now, through the engine's normal save path (used by root-join checkpoints)."""
        self._refuse_in_worker("save the session")
        await self.run_context.require_services().save()

    @property
    def logger(self) -> SessionLogger:
        """Writes entries into the session document's log arrays (workers log here too)."""
        return SessionLogger(self.run_context.require_doc())

    def model_selection(self) -> ModelSelection:
        """The session's model: the one it started with, else ``config_model()``."""
        context = self.run_context
        if context.model is None:
            selection = self.config_model()
            context.model = selection if isinstance(selection, ModelSelection) else ModelSelection(**selection)
        return context.model

    # -- cursor -------------------------------------------------------------------------------

    async def goto(self, target: type[Step] | str) -> Step:
        """Move the durable cursor: ``on_exit`` on the old step, a sequence entry, ``on_enter`` on the new."""
        name = step_name(target)
        ensure_top_level(self, name)
        step = self.require_step(name)
        context = self.run_context
        if name == context.current:
            return step
        previous = self.get_current_step()
        if previous is not None:
            await previous.on_exit()
        context.sequence.append(SequenceItem(level=1, step_name=name))
        context.current = name
        await step.on_enter()
        return step

    def _refuse_in_worker(self, action: str) -> None:
        self.run_context.view(self).forbid(f"A run_steps() worker cannot {action}.")

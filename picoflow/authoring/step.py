"""Step: one stage of a flow, as its author writes it: the hooks a step overrides (prompt, tools, arrival,
response, recovery) and the accessors it reads and writes its state, memory and context with; what it is
registered with (its memory namespace, model and content type) is ``StepSettings``'."""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar

from langchain_core.messages import BaseMessage
from pydantic import BaseModel

from picoflow.authoring.recovery import LlmCallPolicy, resolve_call_policy
from picoflow.authoring.recovery_hooks import RecoveryHooks
from picoflow.authoring.step_settings import StepSettings
from picoflow.authoring.step_tools import (
    InvalidToolArguments,
    ToolSpec,
    class_of,
    tool,
    tools,
    typed_tool_specs,
)
from picoflow.authoring.transitions import (
    Transition,
    direct,
    direct_result,
    direct_to,
    finish,
    go,
    handled_tool_call,
    journaled_key,
    stay,
)
from picoflow.conversation.state import PROMPT_KEY, SAVE_ON_KEY, TRANSIENT_KEY, deep_merge, read_path
from picoflow.errors import PicoFlowError
from picoflow.messages import OPENER_TEXT, HumanMessageEx, as_text, gen_message_id, message_step
from picoflow.models.registry import ModelSelection
from picoflow.session.document import format_timestamp

if TYPE_CHECKING:
    from langchain_core.messages import AIMessage

    from picoflow.authoring.flow import Flow
    from picoflow.authoring.run_context import Worker
    from picoflow.authoring.step_runs import (
        CancellationSignal,
        Checkpoint,
        FailurePolicy,
        ParallelBatchResult,
        ParallelInvocation,
        RunStepRequest,
        StateChannel,
    )
    from picoflow.mcp import MCPTools

# What earlier releases taught to import from this module keeps resolving here.
__all__ = [
    "InvalidToolArguments", "LlmCallPolicy", "LogicStep", "Step", "TerminateSessionStep", "ToolSpec", "Transition",
    "direct", "direct_result", "direct_to", "finish", "go", "stay", "tool", "tools",
]


class Step(StepSettings, RecoveryHooks):
    """Subclass this for each conversational stage; register instances in ``Flow.define_steps``."""

    id: ClassVar[str] = ""
    #: False for steps that route without a chat model (``DecisionStep``): they may not offer tools.
    calls_chat_model: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "id" not in cls.__dict__:
            cls.id = cls.__name__

    def __init__(self, flow: Flow) -> None:
        super().__init__()
        self.flow = flow

    # -- registration -------------------------------------------------------------------------

    def model_selection(self) -> ModelSelection:
        """The effective selection: the flow's, or this step's override inheriting what it leaves unset."""
        context = self.flow.run_context
        base = context.model or self.flow.model_selection()
        # A session keeps the model a step started with, unless the code now chooses one.
        override = self._model_override or context.step_models.get(self.id)
        return base if override is None else override.inherit(base)

    # -- hooks --------------------------------------------------------------------------------

    def get_prompt(self) -> str | None:
        """The system prompt; by default whatever ``.with_prompt()`` stored.

        Returns:
            The text the model reads first on every call of this step; None sends an empty system message.

        Example:
            ```python
            def get_prompt(self) -> str:
                return "Ask for the user's full name, then save it with capture_name."
            ```
        """
        return self.flow.run_context.state_of(self).get(PROMPT_KEY)

    def get_turn_notes(self) -> str | None:
        """Data that changes between calls (saved state, the step's progress), sent after the conversation
        instead of in the system prompt, so that prompt and history stay a cacheable prefix; never stored."""
        return None

    def define_tools(self) -> list[ToolSpec]:
        """Tool definitions this step contributes to the flow-wide registry.

        By default, one per typed ``@tool`` handler (``async def book(self, args: BookArgs)``): its name, its
        docstring as the description and its annotation as the schema. An override that declares more
        ``ToolSpec``s keeps those with ``[*super().define_tools(), ...]``.
        """
        return list(typed_tool_specs(class_of(self)))

    def use_tools(self) -> list[str]:
        """Names of tools to expose without a decorated handler here."""
        return []

    async def on_invalid_tool_arguments(self, invalid: InvalidToolArguments) -> Any:
        """Answer a tool call whose arguments failed the tool's schema; the handler does not run.

        Return ``stay("what to fix")`` or a plain sentence (the tool result the model reads next; the step stays),
        any other transition a handler may return (``go``, ``direct``, ...), or None for the default feedback
        (``invalid.default_feedback()``: the tool, each problem and a request to call it again).
        """
        return None

    def use_mcp_tools(self) -> list[MCPTools]:
        """Tools of the flow's MCP servers this step offers the model, named per server (an allowlist).

        E.g. ``[MCPTools(server="hotel", tools=("search_hotels",))]``. A ``@tool`` handler of the same name
        receives the server's ``MCPToolResult`` instead of the model reading it.
        """
        return []

    async def on_start(self) -> BaseMessage | None:
        """Runs once, for the initial step of a new session."""
        await self.on_enter()
        return self.on_crossing(None)

    async def on_restore(self) -> None:
        """Runs on the current step when a stored session is resumed."""

    async def on_enter(self) -> None:
        """Runs every time this step becomes the current step."""

    async def on_exit(self) -> None:
        """Runs when this step stops being the current step."""

    def on_crossing(self, message: BaseMessage | None, prior_step: str | None = None) -> BaseMessage | None:
        """Decide what this step's model sees on arrival; opens with "Start" when there is nothing."""
        if message is None and message_step(self.get_last_message()) != self.id:
            return HumanMessageEx(self, OPENER_TEXT, origin="framework")
        return message

    async def on_response(self, result: Any) -> Any:
        """Turn a final model answer into a reply (str) or a route (step class, name or transition)."""
        return as_text(result)

    def check_response(self, result: AIMessage | Any) -> bool:
        """Return True to reject this model result and ask for another one."""
        return False

    def accepts_attachments(self) -> bool:
        """Whether the files attached to a turn join the user's message when the turn starts at this step.

        Return False for a step whose model should never see them (a router): they stay out of its memory and
        requests, and flow code still reaches them with ``flow.get_attachments()`` to attach them later.
        """
        return True

    async def run(self, user_message: str | None = None) -> Any:
        """Execute this step: by default the model loop, starting from ``user_message`` when given.

        Override to prepare state (then call ``super().run(...)``) or to compute a nested worker's output.
        """
        return await self.flow.run_context.require_services().model_loop(self, user_message)

    # -- model-call policy and recovery ---------------------------------------------------------

    def config_llm_call_policy(self) -> dict[str, Any]:
        """Override the flow's call policy: omit ``timeout_ms`` or ``stall_ms`` to inherit, an int replaces, None
        removes."""
        return {}

    def get_llm_call_policy(self) -> LlmCallPolicy:
        """The flow's call policy with this step's override applied."""
        return resolve_call_policy(self.flow.config_llm_call_policy(), self.config_llm_call_policy())

    def struct_output_schema(self) -> type[BaseModel] | dict[str, Any] | None:
        """A schema to constrain the model's answer, or None for free text."""
        return None

    def is_logic(self) -> bool:
        return False

    def is_end(self) -> bool:
        """Whether the response reports the session as completed."""
        return self.flow.run_context.require_doc().run_status == "completed"

    # -- state --------------------------------------------------------------------------------

    def save_state(self, data: dict[str, Any]) -> None:
        """Replace ``data``'s first key, deep-merge the rest, and stamp ``_saveOn``.

        The state is saved with the session at the end of the turn; an empty ``data`` changes nothing.

        Args:
            data: The keys to save; plain JSON values.

        Example:
            ```python
            self.save_state({"name": args.name})
            ```
        """
        if not data:
            return
        context = self.flow.run_context
        context.view(self.flow).record_write(self, list(data))
        state = context.state_of(self)
        state.pop(next(iter(data)), None)
        deep_merge(state, data)
        state[SAVE_ON_KEY] = format_timestamp(datetime.now(UTC))

    def get_state(self, path: str | None = None) -> Any:
        """The whole durable state, or one dotted path in it.

        Args:
            path: A dotted path (``"address.city"``); None reads the whole state.

        Returns:
            The value at ``path`` (None when it is missing).

        Example:
            ```python
            first = self.get_state("first")
            ```
        """
        return read_path(self.flow.run_context.state_of(self), path)

    def get_step_state(self, step_cls: type[Step] | str, key: str | None = None) -> Any:
        """Another registered step's state, by class or name: the whole state, or the value at ``key`` (a dotted
        path; None when absent). The flow reads it, so a parallel worker sees its snapshot."""
        return self.flow.get_step_state(step_cls, key)

    def remove_state(self, key: str) -> None:
        context = self.flow.run_context
        context.view(self.flow).record_write(self, [key])
        context.state_of(self).pop(key, None)

    def save_transient_state(self, data: dict[str, Any]) -> None:
        """Keep ``data`` for this request only; it is never persisted."""
        context = self.flow.run_context
        context.view(self.flow).record_write(self, [])
        deep_merge(context.state_of(self).setdefault(TRANSIENT_KEY, {}), data)

    def get_transient_state(self, path: str | None = None) -> Any:
        return read_path(self.flow.run_context.state_of(self).get(TRANSIENT_KEY, {}), path)

    def get_context(self, path: str | None = None) -> Any:
        """The flow context (or one dotted path in it), as ``flow.get_context`` reads it."""
        return copy.deepcopy(read_path(self.flow.run_context.values, path))

    # -- memory -------------------------------------------------------------------------------

    def get_memory(self) -> list[BaseMessage]:
        """The live history of this step's namespace (index 0 is the system slot)."""
        return self.flow.run_context.view(self.flow).memory().messages(self.namespace)

    def get_last_message(self) -> BaseMessage | None:
        messages = self.get_memory()
        return messages[-1] if len(messages) > 1 else None

    def erase_memory(self) -> list[BaseMessage]:
        """Clear this namespace's messages (every step sharing it loses them); state is untouched.

        A rolling summary of the namespace is kept and still reaches the model; call
        ``flow.get_memory().clear_summary(namespace)`` as well for a completely fresh start.
        """
        return self.flow.run_context.view(self.flow).memory().namespace(self.namespace).erase()

    def gen_message_id(self) -> str:
        return gen_message_id(self)

    def tool_idempotency_key(self, call: Mapping[str, Any] | None = None) -> str:
        """A stable key for the tool call being handled (in a ``@tools`` handler, pass one of its calls): hand it to
        payment, booking or ticketing APIs so that a repeated call is recognised instead of applied twice.

        For an effect tool (``effect=True``) it is the call's journal key (``picoflow.session.journal.effect_key``):
        a digest of the session id, the revision the turn started from, this step, the tool name, the canonical
        JSON of the validated arguments and the ordinal of identical calls in the turn. It is the same in every
        retry of the turn, whatever ids the model gives its calls, and differs for other arguments and in any
        later turn. For a plain tool it is a digest of the session id, this step, the tool name and the model's
        call id, which a retried model answer does not repeat.
        """
        call = call or handled_tool_call()
        if not call or not call.get("id"):
            raise PicoFlowError("tool_idempotency_key() needs a tool call: use it inside a tool handler.")
        journaled = journaled_key(call["id"])
        if journaled is not None:
            return journaled
        raw = f"{self.flow.run_context.require_doc().id}|{self.id}|{call.get('name')}|{call['id']}"
        return hashlib.sha256(raw.encode("utf-8")).hexdigest()[:32]

    # -- completion ---------------------------------------------------------------------------

    def session_completed(self) -> None:
        """Mark the session completed without moving the cursor."""
        self.flow.mark_completed()

    # -- nested execution -----------------------------------------------------------------------

    async def run_step(self, step_cls: type[Step] | str, user_message: str | None = None) -> Any:
        """Run a registered child step inside this turn and return its answer; the cursor stays put.

        Args:
            step_cls: The child step's class or registered name.
            user_message: The message the child starts from; None opens it with the framework's own.

        Returns:
            The child's answer: its last reply's content, or what its ``on_response`` returned.

        Raises:
            PicoFlowError: the child is not registered, or it tries to move the cursor.

        Example:
            ```python
            tagline = await self.run_step(TaglineStep, "Write a tagline for Ada")
            ```
        """
        return await self.flow.run_context.require_services().run_child(self.flow, step_cls, user_message)

    async def run_steps(
        self,
        requests: list[RunStepRequest | dict[str, Any] | type[Step] | str],
        *,
        failure_policy: FailurePolicy = "retain-successes",
        max_concurrency: int | None = None,
        checkpoint: Checkpoint = "none",
        signal: CancellationSignal | None = None,
    ) -> ParallelBatchResult:
        """Run isolated workers of registered steps concurrently and publish their state at the join.

        Branch results come back in request order. ``failure_policy="atomic"`` publishes nothing when a
        branch fails; ``checkpoint="root-join"`` saves the session right after a top-level join.
        """
        return await self.flow.run_context.require_services().run_steps(
            self,
            requests,
            failure_policy=failure_policy,
            max_concurrency=max_concurrency,
            checkpoint=checkpoint,
            signal=signal,
        )

    def parallel_state_channels(self) -> dict[str, StateChannel]:
        """State fields that parallel workers combine through ``contribute_state`` (see ``StepChannels``)."""
        return {}

    def parallel_params_schema(self) -> type[BaseModel] | None:
        """A pydantic model that every ``run_steps`` request's params for this step must satisfy."""
        return None

    def contribute_state(self, name: str, value: Any) -> None:
        """From a worker: add ``value`` to the channel ``name``; contributions reduce in request order."""
        self._own_worker("contribute_state() can only be called by a run_steps() worker on itself.").contribute(
            name, value
        )

    def get_parallel_invocation(self) -> ParallelInvocation:
        """From a worker: its read-only params, branch key, request index, path and cancellation signal."""
        return self._own_worker(f"Step '{self.id}' is not running as a run_steps() worker.").invocation

    def _own_worker(self, refusal: str) -> Worker:
        worker = self.flow.run_context.view(self.flow).worker
        if worker is None or worker.step is not self:
            raise PicoFlowError(refusal)
        return worker


class LogicStep(Step):
    """A deterministic step: ``run_logic`` routes without calling a model."""

    def is_logic(self) -> bool:
        return True

    def on_crossing(self, message: BaseMessage | None, prior_step: str | None = None) -> BaseMessage | None:
        # No model reads a logic step's history, so there is nothing to open with.
        return message

    async def run_logic(self) -> Transition | type[Step] | str:
        raise NotImplementedError(f"{type(self).__name__} must implement run_logic().")


CLOSING_PROMPT = (
    "The user has ended the conversation. Confirm briefly and politely that the chat is over, "
    "and do not take up any other topic."
)


class TerminateSessionStep(Step):
    """The closing stage: entering it completes the session; the model says goodbye."""

    class TerminateArgs(BaseModel):
        prompt: str

    def is_end(self) -> bool:
        return True

    async def on_enter(self) -> None:
        self.flow.mark_completed()

    def on_crossing(self, message: BaseMessage | None, prior_step: str | None = None) -> BaseMessage | None:
        if prior_step:
            prior = self.flow.get_step(prior_step)
            if prior is not None:
                self.content_type = prior.content_type
        return HumanMessageEx(self, "I'm done with chat", origin="framework")

    def get_prompt(self) -> str | None:
        return super().get_prompt() or CLOSING_PROMPT

    def define_tools(self) -> list[ToolSpec]:
        """The flow-wide ``terminate_session`` definition, after the subclass's typed tools.

        A handler of it elsewhere may take ``args: TerminateSessionStep.TerminateArgs``, a dict or no arguments.
        """
        return [
            *super().define_tools(),
            ToolSpec(
                name="terminate_session",
                description="End the conversation when the user asks to stop.",
                schema=self.TerminateArgs,
            ),
        ]

    async def terminate_session(self, args: dict[str, Any]) -> Transition:
        # Deliberately undecorated: conversational steps expose and handle the tool themselves.
        return go(TerminateSessionStep).with_prompt(args.get("prompt") or CLOSING_PROMPT)

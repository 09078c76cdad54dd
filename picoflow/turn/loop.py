"""The turn's agent loop: run the executing step, call its model, dispatch tool calls, apply transitions.

One module holds the whole loop a step's turn goes through, so a change to how a hop, a model call (its
attempts, timeouts, refusals and recovery hooks) or a tool call works is made in one place.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from langchain_core.messages import AIMessage, BaseMessage, SystemMessage
from pydantic import BaseModel, ValidationError

from picoflow import telemetry
from picoflow.deadline import time_left
from picoflow.errors import (
    ApprovalNotPendingError,
    LlmBlockedError,
    ModelNotConfiguredError,
    ModelUnavailableError,
    ParallelCancelledError,
    PicoFlowError,
)
from picoflow.files.reader import with_file_parts
from picoflow.files.refs import with_files
from picoflow.files.reopen import OPEN_FILE_TOOL, FileOpening, open_file_tool
from picoflow.flow import Flow
from picoflow.mcp import MCPTools, ToolCallOutcome, ToolOffer, offered_tools, run_offered
from picoflow.memory import Namespace
from picoflow.messages import (
    CONTINUE_PREFIX,
    EMPTY_RESPONSE_NUDGE,
    AiMessageEx,
    HumanMessageEx,
    ToolMessageEx,
    TurnNotesMessage,
    add_usage,
    as_text,
    content_text,
    gen_message_id,
    is_direct,
    summary_system_message,
)
from picoflow.models.calls import model_call_for
from picoflow.models.refusals import configuration_error
from picoflow.models.registry import ModelSelection, ProviderRegistry
from picoflow.recovery import (
    LlmAttemptErrorContext,
    LlmBlockedContext,
    LlmErrorContext,
    LlmErrorKind,
    RetryWithModel,
    StopReason,
    is_transient_error,
)
from picoflow.results import RunResponse
from picoflow.run_context import cancellation_signal, ensure_top_level, execution_frames
from picoflow.session import approvals as records
from picoflow.session.approvals import Decision
from picoflow.state import PROMPT_KEY
from picoflow.step import LogicStep, Step
from picoflow.step_registry import collect_steps
from picoflow.step_tools import (
    InvalidToolArguments,
    approval_of,
    argument_model,
    group_handler,
    is_effect,
    offered_names,
    takes_no_arguments,
    tool_handler,
)
from picoflow.transitions import TOOL_VALIDATED, DirectResult, Transition, as_transition, handling
from picoflow.turn import approvals, effects, streaming

MAX_HOPS_PER_TURN = 64
# finish_reason values (lower-cased) with which providers report a refused or filtered candidate.
BLOCKED_FINISH_REASONS = frozenset({"content_filter", "safety", "prohibited_content", "blocklist", "spii"})
# Error codes with which providers refuse a prompt outright instead of answering.
BLOCKED_ERROR_CODES = frozenset({"content_filter", "content_policy_violation"})


async def prepare_flow(flow_cls: type[Flow], config: dict[str, Any] | None, providers: ProviderRegistry) -> Flow:
    """A new ``flow_cls`` for one turn: the request config in its context, ``init()`` run, its steps collected and
    every model it would call checked against ``providers``."""
    flow = flow_cls()
    if config is not None:
        flow.add_context({"config": config})
    await flow.init()
    collect_steps(flow)
    providers.validate(flow.model_selection())
    for step in flow.get_steps():
        if not step.is_logic():
            providers.validate(step.model_selection())
    return flow


async def answer_turn(flow: Flow, user_message: str | None, request_id: str,
                      decisions: tuple[Decision, ...] = (), caller: str | None = None) -> RunResponse:
    """Run one turn of a bound flow and answer it: the current step opens the turn (``on_start`` for a new session,
    its opener joining the history, else ``on_restore``), a batch flow saves first, the user's decisions on waiting
    tool calls are taken and settled, then the steps run."""
    context = flow.run_context
    step = _executing_step(flow)
    if context.require_doc().revision == 0:
        opener = await step.on_start()
        if opener is not None:
            step.get_memory().append(opener)
    else:
        await step.on_restore()
    if flow.is_batch():
        await context.require_services().save()
    extra, finish = await settle_approvals(flow, decisions, approver="user", decided_by=caller)
    if extra is not None and is_direct(extra) and not user_message:
        # An approved handler answered in code: that is the reply, unless the user also said something.
        message: Any = _deliver_direct(flow, extra, finish)
    else:
        if extra is not None:
            _executing_step(flow).get_memory().append(extra)
        message = await run_turn(flow, user_message)
    return _answered(flow, message, request_id)


async def answer_review(flow: Flow, decisions: tuple[Decision, ...], reviewer: str, request_id: str) -> RunResponse:
    """A reviewer's decision on a waiting call, settled at once (the approved tool runs in this request); the
    model answers on the user's next turn."""
    extra, finish = await settle_approvals(flow, decisions, approver="reviewer", decided_by=reviewer)
    message = _deliver_direct(flow, extra, finish) if extra is not None and is_direct(extra) else ""
    if extra is not None and not is_direct(extra):
        _executing_step(flow).get_memory().append(extra)
    return _answered(flow, message, request_id)


def _answered(flow: Flow, message: Any, request_id: str) -> RunResponse:
    doc = flow.run_context.require_doc()
    current = _executing_step(flow)
    return RunResponse(success=True, completed=current.is_end(), message=message, session=doc.id,
                       content_type=current.content_type, request_id=request_id,
                       pending_approvals=records.pending(doc))


async def settle_approvals(flow: Flow, decisions: tuple[Decision, ...], *, approver: str,
                           decided_by: str | None) -> tuple[BaseMessage | None, bool]:
    """Expire overdue waiting calls, record ``decisions`` and claim them in one conditional write, then settle every
    decided call nobody else is settling; the direct message an approved handler answered with, if any."""
    doc = flow.run_context.require_doc()
    if not doc.approvals:
        if decisions:
            raise ApprovalNotPendingError("The call is not waiting for a decision.")
        return None, False
    records.expire(doc)
    decided = records.decide(doc, decisions, approver=approver, decided_by=decided_by, owner=doc.owner)
    due = records.lapsed(records.unsettled(doc))
    if decided or any(approval.status == "approved" for approval in due):
        # The decision is written before anything runs: of two racing for one call, only one write lands.
        records.claim(due)
        await flow.run_context.require_services().save()
    return await approvals.settle(flow, due, functools.partial(_run_approved, flow))


async def _run_approved(flow: Flow, step: Step, ai: AiMessageEx,
                        key: str) -> tuple[list[BaseMessage], BaseMessage | None, bool]:
    """Run an approved call on the step that made it (moving the cursor back to it if the conversation moved on)."""
    if flow.get_current_step() is not step:
        await flow.goto(step.id)
    offer = ModelCall.read(step, flow.run_context.view(flow).memory().namespace(step.namespace))
    tools = await dispatch_tools(flow, step, ai, offer, approved_key=key)
    return tools.messages, tools.extra, tools.finish


async def run_turn(flow: Flow, user_message: str | None) -> Any:
    """Run the current step (and whatever it routes to) for one user message; return the reply."""
    step = _executing_step(flow)
    if flow.is_batch_coordinator():
        return await flow.spawn_steps()
    return await step.run(user_message)


async def run_model_loop(step: Step, user_message: str | None) -> Any:
    """The default ``Step.run``: drive the executing step from ``user_message`` until it answers.

    The files attached to the turn join the first message built from the user's input, unless the step
    declines them (``Step.accepts_attachments``).
    """
    attached = step.flow.run_context.files.take_attached() if step.accepts_attachments() else []
    content = with_files(user_message, attached) if attached else user_message
    incoming = HumanMessageEx(step.id, content) if content else None
    with telemetry.step_runs():
        return await _drive(step.flow, incoming)


def _executing_step(flow: Flow) -> Step:
    """The step running in this task (the innermost nested one, else the one under the cursor)."""
    step = flow.get_executing_step()
    if step is None:
        raise PicoFlowError(f"Flow '{flow.id}' has no current step.")
    return step


async def _drive(flow: Flow, pending: BaseMessage | None) -> Any:
    prior = _executing_step(flow).id
    fallback: tuple[str, ModelSelection] | None = None
    for _ in range(MAX_HOPS_PER_TURN):
        step = _executing_step(flow)
        telemetry.step_run(step)
        if step.id != prior:
            if flow.checkpoint_on_crossing and not execution_frames(flow):
                await flow.checkpoint()
            if flow.run_context.events is not None:
                streaming.announce_step(flow, step)
            pending = step.on_crossing(pending, prior)
        prior = step.id
        # The namespace, read once per hop: handlers and nested steps append to the same live list.
        space = flow.run_context.view(flow).memory().namespace(step.namespace)
        memory = space.messages

        if step.is_logic():
            if not isinstance(step, LogicStep):
                raise PicoFlowError(f"Step '{step.id}': is_logic() is True only for a LogicStep; subclass LogicStep.")
            handover = pending or HumanMessageEx(step.id, f"{CONTINUE_PREFIX}{step.id}", origin="framework")
            memory.append(handover)
            transition = as_transition(await step.run_logic())
            if transition is None:
                raise PicoFlowError(f"Logic step '{step.id}' must return a step or a transition.")
            message = transition.message
            answer_now = message if message is not None and is_direct(message) else None
            # A direct answer ends the turn, so a logic step may keep the cursor with one; anything else would loop.
            if transition.step == step.id and answer_now is None:
                raise PicoFlowError(
                    f"Logic step '{step.id}' must move the cursor to another step or answer with direct_to(...)."
                )
            await apply_transition(flow, transition)
            if answer_now is not None:
                return _deliver_direct(flow, answer_now, transition.finish)
            pending = transition.message
            continue

        if pending is not None:
            memory.append(pending)
            pending = None
        offer = ModelCall.read(step, space)
        outcome = await call_model(flow, step, offer, fallback[1] if fallback and fallback[0] == step.id else None)
        if outcome.fallback is not None:
            fallback = (step.id, outcome.fallback)

        model_text = None
        if outcome.ai is None:
            answer = outcome.answer
        else:
            ai = outcome.ai.model_copy(update={"id": gen_message_id(step.id)})
            if ai.tool_calls and outcome.parsed is None:
                if flow.run_context.events is not None:
                    streaming.announce_tools(flow, ai)
                tools = await dispatch_tools(flow, step, ai, offer)
                # The call and its results are stored together, after whatever the handlers did: a nested
                # child sharing this namespace must never send a tool call whose results are not there yet.
                memory.extend([ai, *tools.messages])
                if tools.result is not None:
                    return tools.result.value
                if tools.extra is not None and is_direct(tools.extra):
                    if tools.finish:
                        flow.mark_completed()
                    _executing_step(flow).get_memory().append(tools.extra)
                    return content_text(tools.extra.content)
                if tools.paused:
                    # A call waits for a person: the turn ends here and commits with the call pending.
                    return content_text(ai.content)
                pending = tools.extra
                continue
            result = outcome.parsed if outcome.parsed is not None else content_text(ai.content)
            answer = await step.on_response(result)
            model_text = content_text(ai.content) or as_text(outcome.parsed)
            if isinstance(answer, str) and answer == as_text(result):
                # The model's own words are a reply, never a route, even when they spell a step's name:
                # a flow that routes on a reply says so by returning go(...) or a step.
                answer = _Reply(answer)

        transition = _response_transition(flow, answer)
        if transition is None:
            text = str(as_text(answer))
            memory.append(AiMessageEx(step.id, text))
            return text
        if model_text is not None:
            memory.append(AiMessageEx(step.id, model_text))
        await apply_transition(flow, transition)
        pending = transition.message
        if pending is not None and is_direct(pending):
            return _deliver_direct(flow, pending, transition.finish)
    raise PicoFlowError(f"Flow '{flow.id}' moved between steps more than {MAX_HOPS_PER_TURN} times in one turn.")


def _deliver_direct(flow: Flow, message: BaseMessage, finish: bool) -> str:
    if finish:
        flow.mark_completed()
    step = _executing_step(flow)
    if message.id is None:
        # finish(text) made outside a handler (possibly once, for reuse): a copy belongs to the step that finished
        message = message.model_copy(update={"id": gen_message_id(step.id)})
    step.get_memory().append(message)
    return content_text(message.content)


class _Reply(str):
    """Text to send as it is: a string that ``_response_transition`` never reads as a step name."""


def _response_transition(flow: Flow, answer: Any) -> Transition | None:
    if isinstance(answer, _Reply):
        return None
    if isinstance(answer, str):
        return as_transition(answer) if flow.get_step(answer.strip()) is not None else None
    return as_transition(answer)


# -- transitions ----------------------------------------------------------------------------------


async def apply_transition(flow: Flow, transition: Transition) -> Step:
    """Apply one transition in the fixed order: goto, prompt, state, content type."""
    executing = _executing_step(flow)
    target = transition.step or executing.id
    # A nested child may stay on itself (a tool result fed back to its model) or reply directly (its result);
    # moving the cursor, or finishing the session, belongs to the owning step.
    if transition.finish or target != executing.id:
        ensure_top_level(flow, target)
    if transition.finish or not transition.step or transition.step == executing.id:
        destination = executing
    else:
        destination = await flow.goto(transition.step)
    if transition.prompt is not None:
        destination.save_state({PROMPT_KEY: transition.prompt})
    if transition.state:
        destination.save_state(transition.state)
    if transition.content_type:
        destination.content_type = transition.content_type
    return destination


# -- tool calls -----------------------------------------------------------------------------------


@dataclass
class _ToolOutcome:
    messages: list[BaseMessage] = field(default_factory=list)
    extra: BaseMessage | None = None
    finish: bool = False
    result: DirectResult | None = None
    #: Whether a call now waits for a person's decision instead of having run.
    paused: bool = False


async def _call_handler(step: Step, handler: Any, argument: Any, call: Mapping[str, Any] | None = None) -> Any:
    with handling(step, call):
        # A tool without arguments is handled by ``async def show_table(self)``.
        result = handler() if takes_no_arguments(getattr(handler, "__func__", handler)) else handler(argument)
        return await result if inspect.isawaitable(result) else result


async def _run_handler(flow: Flow, step: Step, handler: Any, calls: list[dict[str, Any]],
                       run: Callable[[], Awaitable[Any]], key: str | None = None) -> Any:
    """What a handler returns; an effect handler runs once per turn, however often the turn is retried (an approved
    call once under its approval's ``key``, in whichever request settles it)."""
    if key is not None or is_effect(flow, [call["name"] for call in calls], handler):
        return await effects.once(flow, step, calls, run, key=key)
    return await run()


def _handler_route(step: Step, handler: Any, result: Any) -> Transition:
    """A tool handler's answer (other than None, which routes nowhere) as a transition."""
    transition = as_transition(result)
    if transition is None:
        where = f"Tool handler '{type(step).__name__}.{getattr(handler, '__name__', handler)}'"
        # A TypeScript-style {step, state} object is the usual slip: say what to write instead.
        raise PicoFlowError(
            f"{where} returned a {type(result).__name__}; return go(Step), stay(...), direct(...), "
            "a step class or name, or None (go(Step).with_state({...}) carries state)."
        )
    return transition


def _group_route(step: Step, method: str, result: Any) -> Transition:
    where = f"Tool group handler '{type(step).__name__}.{method}'"
    if result is None:
        raise PicoFlowError(f"{where} returned None.")
    if isinstance(result, str) and not result.strip():
        raise PicoFlowError(f"{where} returned an empty step name.")
    if isinstance(result, (bool, int, float, list, tuple)):
        raise PicoFlowError(f"{where} returned an unsupported {type(result).__name__} result.")
    if isinstance(result, dict) and "step" not in result:
        raise PicoFlowError(f"{where} returned an object without step.")
    transition = as_transition(result)
    if transition is None:
        raise PicoFlowError(f"{where} returned an object with an invalid step.")
    return transition


async def dispatch_tools(flow: Flow, step: Step, ai: AIMessage, offer: ModelCall, *,
                         approved_key: str | None = None) -> _ToolOutcome:
    """Run the handlers for one AI message's tool calls; one tool message per call.

    A call that needs a person's decision does not run: it waits (``picoflow.turn.approvals``) and the outcome
    says so. ``approved_key`` settles calls a person approved: they run under that journal key.
    """
    calls = ai.tool_calls
    outcome = _ToolOutcome()
    group = group_handler(step, {call["name"] for call in calls})
    if group is not None:
        checked = [(call, _checked_args(flow, call)) for call in calls]
        valid = [(call, args) for call, args in checked if not isinstance(args, ValidationError)]
        if len(valid) < len(checked):
            # The group handler owns the whole batch, so nothing runs until every call is valid.
            for call, args in checked:
                if isinstance(args, ValidationError):
                    outcome.messages.append(await _refuse_arguments(flow, step, call, args, outcome))
                else:
                    outcome.messages.append(_tool_message(
                        step, call, "Not run: another call in this batch had invalid arguments.", status="error"
                    ))
            return outcome
        validated = [{**call, "args": _as_dict(args)} for call, args in valid]
        rule = None if approved_key else approval_of(flow, [call["name"] for call in calls], group)
        approver = rule.approver_for(validated) if rule is not None else None
        if rule is not None and approver is not None:
            outcome.messages.extend(approvals.pause(flow, step, validated, rule, approver, group=True))
            outcome.paused = True
            return outcome
        run_group = functools.partial(_call_handler, step, group, validated)
        returned = await _run_handler(flow, step, group, validated, run_group, approved_key)
        if isinstance(returned, DirectResult):
            outcome.result = _worker_result(flow, step, returned)
            outcome.messages.extend(_tool_message(step, call, TOOL_VALIDATED) for call in calls)
            return outcome
        transition = _group_route(step, group.__name__, returned)
        await apply_transition(flow, transition)
        for call in calls:
            outcome.messages.append(_tool_message(step, call, transition.tool or TOOL_VALIDATED))
        outcome.extra, outcome.finish = transition.message, transition.finish
        return outcome

    exposed = set(offer.tools)
    offered = await offer.mcp_tools(step)
    opening: FileOpening | None = None
    for call in telemetry.tool_calls(calls, outcome.messages):
        name = call["name"]
        if name in offered.tools or name in offered.unavailable:
            arguments = call.get("args") or {}
            ran = (await run_offered(offered.tools[name], arguments) if name in offered.tools
                   else offered.unavailable_outcome(name, arguments))
            await _dispatch_offered(flow, step, call, ran, outcome)
            continue
        if name == OPEN_FILE_TOOL and name not in exposed:
            opening = opening or FileOpening(step.get_memory(), flow.run_context.files.budget, step)
            outcome.messages.append(_tool_message(step, call, *opening.answer(call.get("args") or {})))
            continue
        if name not in exposed:
            flow.logger.warn(f"hallucinated tool: {name}", step=step.id)
            outcome.messages.append(
                _tool_message(step, call, f"LLM hallucinates a non-existing tool: {name}", status="error")
            )
            continue
        args = _checked_args(flow, call)
        if isinstance(args, ValidationError):
            outcome.messages.append(await _refuse_arguments(flow, step, call, args, outcome))
            continue
        handler = tool_handler(step, name)
        if handler is None:
            flow.logger.warn(f"missing tool handler: {name}", step=step.id)
            outcome.messages.append(_tool_message(step, call, TOOL_VALIDATED))
            continue
        argument = _handler_argument(handler, args)
        rule = None if approved_key else approval_of(flow, [name], handler)
        approver = rule.approver_for(argument) if rule is not None else None
        if rule is not None and approver is not None:
            outcome.messages.extend(approvals.pause(flow, step, [{**call, "args": _as_dict(args)}], rule, approver))
            outcome.paused = True
            continue
        run = functools.partial(_call_handler, step, handler, argument, call)
        returned = await _run_handler(flow, step, handler, [{**call, "args": _as_dict(args)}], run, approved_key)
        if isinstance(returned, DirectResult):
            outcome.result = _worker_result(flow, step, returned)
            outcome.messages.append(_tool_message(step, call, TOOL_VALIDATED))
            continue
        if returned is None:
            outcome.messages.append(_tool_message(step, call, TOOL_VALIDATED))
            continue
        transition = _handler_route(step, handler, returned)
        await apply_transition(flow, transition)
        outcome.messages.append(_tool_message(step, call, transition.tool or TOOL_VALIDATED))
        if transition.message is not None:
            outcome.extra, outcome.finish = transition.message, transition.finish
    # The opened files follow every call's result, in one message the next request carries in full.
    outcome.messages.extend(opening.messages() if opening is not None else [])
    return outcome


async def _dispatch_offered(flow: Flow, step: Step, call: Mapping[str, Any], ran: ToolCallOutcome,
                            outcome: _ToolOutcome) -> None:
    """An MCP tool the step offers, answered: a same-named handler of the step gets the server's result."""
    handler = tool_handler(step, call["name"]) if ran.result is not None else None
    if handler is None:
        if ran.result is not None and ran.result.error is not None:
            flow.logger.warn("MCP tool unavailable", step=step.id, server=ran.result.server, tool=ran.result.tool,
                             reason=ran.result.error.reason)
        outcome.messages.append(_tool_message(step, call, ran.content, status=ran.status))
        return
    returned = await _call_handler(step, handler, ran.result, call)
    if isinstance(returned, DirectResult):
        outcome.result = _worker_result(flow, step, returned)
        outcome.messages.append(_tool_message(step, call, ran.content, status=ran.status))
        return
    if returned is None:
        # The handler only looked: the model reads the server's result (or the fixed sentence on a failure).
        outcome.messages.append(_tool_message(step, call, ran.content, status=ran.status))
        return
    transition = _handler_route(step, handler, returned)
    await apply_transition(flow, transition)
    outcome.messages.append(_tool_message(step, call, transition.tool or ran.content))
    if transition.message is not None:
        outcome.extra, outcome.finish = transition.message, transition.finish


@dataclass
class ModelCall:
    """What one model call of a step reads from the step and the running turn once, for its attempts and its tool
    dispatch alike: the step's namespace and the tools it offers."""

    space: Namespace
    #: The flow-registry tools offered, in order.
    tools: list[str]
    #: What ``use_mcp_tools()`` returned; the servers are listed when first needed.
    mcp_offers: list[MCPTools]
    _mcp: ToolOffer | None = None

    @classmethod
    def read(cls, step: Step, space: Namespace) -> ModelCall:
        mcp_offers = step.use_mcp_tools()
        return cls(space, offered_names(type(step), step.use_tools(), mcp_offers), mcp_offers)

    async def mcp_tools(self, step: Step) -> ToolOffer:
        """The MCP server tools offered, by name; a step offering none never reaches the MCP client."""
        if self._mcp is None:
            self._mcp = await offered_tools(step.flow, self.mcp_offers) if self.mcp_offers else ToolOffer()
        return self._mcp


def _worker_result(flow: Flow, step: Step, result: DirectResult) -> DirectResult:
    worker = flow.run_context.view(flow).worker
    if worker is None or worker.step is not step:
        raise PicoFlowError("direct_result() can only be returned by a tool handler of a run_steps() worker.")
    return result


def _checked_args(flow: Flow, call: Mapping[str, Any]) -> dict[str, Any] | BaseModel | ValidationError:
    """The call's arguments validated against its tool schema (the model instance), or the validation error."""
    spec = flow.get_tool(call["name"])
    raw = call.get("args") or {}
    if spec is None:
        return dict(raw)
    try:
        return spec.schema.model_validate(raw)
    except ValidationError as exc:
        return exc


def _as_dict(args: dict[str, Any] | BaseModel) -> dict[str, Any]:
    # By alias: a field declared ``Field(alias="json")`` reaches a dict handler under the name the model sent.
    return args.model_dump(mode="json", by_alias=True) if isinstance(args, BaseModel) else args


def _handler_argument(handler: Any, args: dict[str, Any] | BaseModel) -> Any:
    """A typed handler (``args: Model``) gets the validated model; any other handler its JSON dict."""
    wanted = argument_model(getattr(handler, "__func__", handler))
    return args if wanted is not None and isinstance(args, wanted) else _as_dict(args)


def _tool_message(step: Step, call: Mapping[str, Any], content: str, status: str = "success") -> ToolMessageEx:
    return ToolMessageEx(step.id, content, call.get("id") or "", name=call["name"], status=status)


async def _refuse_arguments(
    flow: Flow, step: Step, call: Mapping[str, Any], error: ValidationError, outcome: _ToolOutcome
) -> ToolMessageEx:
    """The tool result for a call with invalid arguments: the step's own feedback, or the default one."""
    invalid = InvalidToolArguments(name=call["name"], args=dict(call.get("args") or {}), error=error)
    hook = step.on_invalid_tool_arguments
    answer = await _call_handler(step, hook, invalid, call)
    if answer is None or isinstance(answer, str):
        return _tool_message(step, call, answer or invalid.default_feedback(), status="error")
    transition = _handler_route(step, hook, answer)
    await apply_transition(flow, transition)
    if transition.message is not None:
        outcome.extra, outcome.finish = transition.message, transition.finish
    # A bare stay() carries "input validated", which would tell the model the opposite of what happened.
    feedback = transition.tool if transition.tool not in (None, TOOL_VALIDATED) else invalid.default_feedback()
    return _tool_message(step, call, feedback, status="error")


# -- the model call -------------------------------------------------------------------------------


@dataclass
class ModelOutcome:
    """An accepted model answer, or (``ai`` None) the answer a recovery hook gave instead."""

    ai: AIMessage | None = None
    parsed: Any = None
    answer: Any = None
    # The fallback model ``on_llm_error`` chose; it serves the step's later calls in this loop.
    fallback: ModelSelection | None = None


@dataclass
class _Failure:
    kind: LlmErrorKind
    reason: str
    message: str
    attempts: int
    error: BaseException | None = None
    last_response: Any = None
    stopped_because: StopReason = "attempts_exhausted"

    def as_error(self, selection: ModelSelection) -> ModelUnavailableError | ModelNotConfiguredError:
        # Codes of their own, so clients and metrics tell a failing model apart from a failing flow; none aborts.
        text = f"LLM call failed. Reason:{self.reason}. Error:{self.message}"
        configuration = configuration_error(self.error, selection.provider, text)
        if configuration is not None:
            return configuration
        if self.reason == "timeout":
            return ModelUnavailableError(text, code="MODEL_TIMEOUT", status_code=504)
        if _is_throttling(self.error):
            return ModelUnavailableError(text, code="MODEL_THROTTLED", status_code=503)
        return ModelUnavailableError(text)


_THROTTLING_NAMES = frozenset({"RateLimitError", "ThrottlingException", "ResourceExhausted", "TooManyRequests"})


def _is_throttling(error: BaseException | None) -> bool:
    # OpenAI-style clients raise RateLimitError with status 429, Google's ResourceExhausted carries code 429,
    # and botocore's ClientError names ThrottlingException in its response.
    if error is None:
        return False
    if 429 in (getattr(error, "status_code", None), getattr(error, "code", None)):
        return True
    response = getattr(error, "response", None)
    code = response.get("Error", {}).get("Code") if isinstance(response, dict) else None
    return type(error).__name__ in _THROTTLING_NAMES or code in _THROTTLING_NAMES


def build_request(step: Step, space: Namespace) -> list[BaseMessage]:
    """Rewrite the system slot of ``step``'s namespace ``space`` from ``get_prompt()`` and assemble what the model
    is sent."""
    history = space.messages
    prompt = step.get_prompt() or ""
    history[0] = SystemMessage(content=prompt)
    request: list[BaseMessage] = [history[0]] if prompt else []
    if space.summary:
        request.append(summary_system_message(space.summary))
    request.extend(history[1:])
    notes = step.get_turn_notes()
    if notes:
        request.append(TurnNotesMessage(notes))
    return request


async def call_model(flow: Flow, step: Step, offer: ModelCall, fallback: ModelSelection | None = None) -> ModelOutcome:
    """One accepted model result for ``step``, or the answer of its recovery hooks.

    Ordinary attempts use the step's selection and its attempt budget; a ``fallback`` (chosen earlier
    by ``on_llm_error``) gets one attempt per call and cannot be replaced by a second fallback.
    """
    selection = fallback or step.model_selection()
    outcome = await _attempts(flow, step, offer, selection, 1 if fallback else selection.retry_attempts)
    if isinstance(outcome, ModelOutcome):
        return outcome
    answer = await _recover(flow, step, selection, outcome)
    if isinstance(answer, RetryWithModel) and fallback is None:
        alternate = answer.selection
        outcome = await _attempts(flow, step, offer, alternate, 1)
        if isinstance(outcome, ModelOutcome):
            outcome.fallback = alternate
            return outcome
        answer = await _recover(flow, step, alternate, outcome)
    if isinstance(answer, RetryWithModel):
        raise PicoFlowError(f"Step '{step.id}' asked for a second fallback model in one recovery sequence.")
    return ModelOutcome(answer=answer)


async def _recover(flow: Flow, step: Step, selection: ModelSelection, failure: _Failure) -> Any:
    context = LlmErrorContext(
        kind=failure.kind,
        step_id=step.id,
        provider=selection.provider,
        model=selection.name,
        attempts=failure.attempts,
        stopped_because=failure.stopped_because,
        error=failure.error,
        last_response=failure.last_response,
        signal=cancellation_signal(flow),
    )
    answer = await recover_from_error(step, context)
    if answer is None:
        raise failure.as_error(selection) from failure.error
    return answer


async def _blocked(flow: Flow, step: Step, selection: ModelSelection, block: Block) -> ModelOutcome:
    flow.logger.warn("model call blocked by the provider", step=step.id, reason=block.reason, phase=block.phase)
    context = LlmBlockedContext(
        step_id=step.id,
        provider=selection.provider,
        model=selection.name,
        reason=block.reason,
        raw_reason=block.raw_reason,
        phase=block.phase,
        details=block.details,
        signal=cancellation_signal(flow),
    )
    return ModelOutcome(answer=await handle_block(step, context))


async def _attempts(
    flow: Flow, step: Step, offer: ModelCall, selection: ModelSelection, budget: int
) -> ModelOutcome | _Failure:
    runtime = flow.run_context.require_services()
    model = runtime.providers.chat_model(selection)
    specs = [flow.run_context.require_tool(name, flow.id) for name in offer.tools]
    schema = step.struct_output_schema()
    policy = step.get_llm_call_policy()
    policy_ms = policy.timeout_ms
    stall = policy.stall_ms / 1000 if policy.stall_ms else None
    # Tools offered from MCP servers come with their servers' schemas (listed when first needed).
    offered = [] if schema is not None else [t.as_model_tool() for t in (await offer.mcp_tools(step)).tools.values()]
    tools = [spec.as_model_tool() for spec in specs] + offered
    if schema is not None:
        runnable = model.with_structured_output(schema, include_raw=True)
    elif tools:
        runnable = model.bind_tools(tools)
    else:
        runnable = model
    # The built-in open_file is offered when a request references a file shown earlier, unless a tool has its name.
    can_open = schema is None and OPEN_FILE_TOOL not in {tool["function"]["name"] for tool in tools}
    signal = cancellation_signal(flow)

    failure = _Failure("invocation_error", "unknown", "no attempt was made", attempts=0)
    for attempt in range(1, budget + 1):
        if attempt > 1 and runtime.retry_delay:
            await asyncio.sleep(runtime.retry_delay)
        if signal is not None:
            signal.raise_if_cancelled()
        request = build_request(step, offer.space)
        called = runnable
        # Outside the attempt's error handling: a file the model cannot read is the caller's error, not a retry.
        if any(isinstance(message.content, list) for message in request):
            # Only multimodal content can reference files: plain text needs no look at the file store.
            prepared = await with_file_parts(request, flow.run_context.files, runtime.providers.file_types(selection),
                                             step.id, step.namespace, can_open=can_open)
            request = prepared.messages
            if prepared.openable:
                called = model.bind_tools([*tools, open_file_tool()])
        timeout = _attempt_timeout(policy_ms)
        # Structured output arrives whole; a plain reply of the turn's own step streams to the client.
        sink = streaming.reply_sink(flow, step) if schema is None and flow.run_context.events is not None else None
        try:
            with telemetry.model_call(selection, "chat", step.id, request) as traced:
                call = (called.ainvoke(request) if sink is None
                        else streaming.streamed_call(called, request, sink, stall))
                output = traced.answered(await _invoke(call, timeout, signal, step.id))
        except TimeoutError as exc:
            # Without a turn deadline or call policy the timeout is the provider's own.
            limit = "its time limit" if timeout is None else f"{timeout * 1000:.0f} ms"
            problem = str(exc) if isinstance(exc, streaming.StalledReplyError) else f"the model call exceeded {limit}"
            failure = _Failure("invocation_error", "timeout", problem, attempt, exc)
            flow.logger.warn("model attempt timed out", step=step.id, attempt=attempt)
        except ParallelCancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - any provider error counts as a failed attempt
            block = blocked_error(exc)
            if block is not None:
                return await _blocked(flow, step, selection, block)
            failure = _Failure("invocation_error", "error", f"{type(exc).__name__}: {exc}", attempt, exc)
            flow.logger.warn("model attempt failed", step=step.id, attempt=attempt, error=type(exc).__name__)
        else:
            ai = output.get("raw") if schema is not None else output
            if isinstance(ai, AIMessage):
                # Token accounting records attempted work, workers' included.
                add_usage(flow.run_context.require_doc().tokens, ai)
            block = blocked_response(ai)
            if block is not None:
                # A refusal is final for this call: no ordinary retry and no on_llm_error.
                return await _blocked(flow, step, selection, block)
            parsed = None
            if schema is not None:
                parsed = output.get("parsed")
                if parsed is None:
                    problem = str(output.get("parsing_error") or "no structured output")
                    failure = _Failure("empty_response", "parse", problem, attempt, last_response=ai)
                    flow.logger.warn("model attempt returned unusable structured output", step=step.id, attempt=attempt)
                    continue
                if not isinstance(ai, AIMessage):
                    ai = AIMessage(content=as_text(parsed))
            elif not ai.tool_calls and not content_text(ai.content).strip():
                reason = str(ai.response_metadata.get("finish_reason") or "empty")
                failure = _Failure("empty_response", reason, "the model returned an empty response", attempt,
                                   last_response=ai)
                offer.space.messages.append(HumanMessageEx(step.id, EMPTY_RESPONSE_NUDGE, origin="framework"))
                continue
            if step.check_response(parsed if parsed is not None else ai):
                failure = _Failure("response_rejected", "rejected", "check_response() rejected the result", attempt,
                                   last_response=parsed if parsed is not None else ai)
                continue
            return ModelOutcome(ai=ai, parsed=parsed)
        # Only an invocation that raised gets here: the other failures went on to the next attempt above.
        if attempt < budget and failure.error is not None:
            context = LlmAttemptErrorContext(
                step_id=step.id,
                provider=selection.provider,
                model=selection.name,
                error=failure.error,
                attempt=attempt,
                max_attempts=budget,
                signal=signal,
            )
            if not should_retry(step, context):
                failure.stopped_because = "retry_declined"
                break
    return failure


async def _invoke(call: Coroutine[Any, Any, Any], timeout: float | None, signal: Any, step_id: str) -> Any:
    """One model invocation (a whole stream, when streamed), bounded by ``timeout`` and abandoned as soon as
    ``signal`` is cancelled."""
    with model_call_for("chat", step_id, timeout):
        return await _invoke_bounded(call, timeout, signal)


async def _invoke_bounded(invocation: Coroutine[Any, Any, Any], timeout: float | None, signal: Any) -> Any:
    if signal is None:
        return await asyncio.wait_for(invocation, timeout)
    call = asyncio.ensure_future(invocation)
    stop = asyncio.ensure_future(signal.wait())
    try:
        done, _ = await asyncio.wait({call, stop}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
        if not call.done():
            call.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await call
    if call in done:
        return call.result()
    signal.raise_if_cancelled()
    raise TimeoutError


def _attempt_timeout(policy_ms: int | None) -> float | None:
    """Seconds for one attempt: the step's call policy (``policy_ms``), bounded by what is left of the turn."""
    remaining = time_left("the next model call")
    limits = [limit for limit in (remaining, policy_ms / 1000 if policy_ms else None) if limit is not None]
    return min(limits) if limits else None


# -- recovery hooks -------------------------------------------------------------------------------


def should_retry(step: Step, context: LlmAttemptErrorContext) -> bool:
    """The step's decision, else the flow's, else ``is_transient_error``."""
    for owner in (step, step.flow):
        decision = owner.should_retry_llm_error(context)
        if decision is not None:
            return bool(decision)
    return is_transient_error(context.error)


async def recover_from_error(step: Step, context: LlmErrorContext) -> Any:
    """The first non-None answer of ``on_llm_error`` on the step, then on the flow."""
    answer = await step.on_llm_error(context)
    if answer is None:
        answer = await step.flow.on_llm_error(context)
    return _unless_cancelled(context, answer)


async def handle_block(step: Step, context: LlmBlockedContext) -> Any:
    """The first non-None answer of ``on_llm_blocked`` on the step, then on the flow; else raise."""
    answer = await step.on_llm_blocked(context)
    if answer is None:
        answer = await step.flow.on_llm_blocked(context)
    if answer is None:
        raise LlmBlockedError(context)
    if isinstance(answer, RetryWithModel):
        raise PicoFlowError("on_llm_blocked() cannot switch models; return a safe reply or a route instead.")
    return _unless_cancelled(context, answer)


def _unless_cancelled(context: LlmErrorContext | LlmBlockedContext, answer: Any) -> Any:
    # A cancelled parallel worker stops here, whatever its hooks answered meanwhile.
    if context.signal is not None:
        context.signal.raise_if_cancelled()
    return answer


# -- refusals -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    """A detected refusal: the normalised reason, the provider's own value and where it happened."""

    reason: str
    raw_reason: str | None
    phase: Literal["prompt", "candidate"]
    details: dict[str, Any]


def blocked_response(message: Any) -> Block | None:
    """A refusal carried by a model answer: a filtering finish reason, a prompt block or a refusal text."""
    if not isinstance(message, AIMessage):
        return None
    metadata = message.response_metadata or {}
    feedback = metadata.get("prompt_feedback")
    if isinstance(feedback, Mapping) and feedback.get("block_reason"):
        raw = str(feedback["block_reason"])
        return Block(raw.lower(), raw, "prompt", {"prompt_feedback": dict(feedback)})
    finish = metadata.get("finish_reason")
    if isinstance(finish, str) and finish.lower() in BLOCKED_FINISH_REASONS:
        details = {"safety_ratings": metadata["safety_ratings"]} if metadata.get("safety_ratings") else {}
        return Block(finish.lower(), finish, "candidate", details)
    refusal = (message.additional_kwargs or {}).get("refusal")
    if refusal:
        return Block("refusal", None, "candidate", {"refusal": str(refusal)})
    return None


def blocked_error(error: BaseException) -> Block | None:
    """A refusal reported by raising, e.g. an OpenAI-compatible ``content_filter`` error for the prompt."""
    code = getattr(error, "code", None)
    if isinstance(code, str) and code.lower() in BLOCKED_ERROR_CODES:
        return Block(code.lower(), code, "prompt", {})
    return None

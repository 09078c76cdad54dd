"""Tool dispatch: the handlers for one AI message's tool calls, with their arguments checked, their approvals asked
and their answers applied as transitions; one tool message per call."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage
from pydantic import BaseModel, ValidationError

from picoflow import telemetry
from picoflow.authoring.step import Step
from picoflow.authoring.step_tools import Handling, InvalidToolArguments, ToolTable, tool_table
from picoflow.authoring.transitions import TOOL_VALIDATED, DirectResult, Transition, as_transition, handling
from picoflow.errors import PicoFlowError
from picoflow.files.reopen import OPEN_FILE_TOOL, FileOpening
from picoflow.mcp import ToolCallOutcome, run_offered
from picoflow.messages import ToolMessageEx
from picoflow.turn import approvals, effects
from picoflow.turn.cursor import apply_transition
from picoflow.turn.hop import Hop
from picoflow.turn.model_call import ModelCall


@dataclass
class ToolOutcome:
    """What the calls of one AI message came to: their tool messages and what a handler answered besides."""

    messages: list[BaseMessage] = field(default_factory=list)
    extra: BaseMessage | None = None
    finish: bool = False
    result: DirectResult | None = None
    #: Whether a call now waits for a person's decision instead of having run.
    paused: bool = False
    #: The step the last transition a handler answered with landed on; None when none moved anything.
    destination: Step | None = None

    async def route(self, hop: Hop, answer: Any) -> Transition | None:
        """Apply a handler's ``answer`` when it is a route, keeping the message it carries for the turn; None when
        it is none (nothing moved)."""
        transition = as_transition(answer)
        if transition is None:
            return None
        self.destination = await apply_transition(hop, transition)
        if transition.message is not None:
            self.extra, self.finish = transition.message, transition.finish
        return transition


def calls_table(hop: Hop, ai: AIMessage, offer: ModelCall) -> ToolTable:
    """What handles each call of ``ai``, resolved once for the shown arguments and the dispatch alike: a handler
    may answer the registry tools the step offers and the MCP server tools it names."""
    flow = hop.flow
    handled = frozenset(offer.tools).union(*(mcp.tools for mcp in offer.mcp_offers))
    return tool_table(hop.step, flow.run_context.tools, {call["name"] for call in ai.tool_calls}, handled,
                      bool(getattr(flow, "show_tool_calls", False)))


async def _call_handler(step: Step, handler: Any, argument: Any, call: Mapping[str, Any] | None = None, *,
                        bare: bool = False, keys: Mapping[str, str] | None = None) -> Any:
    with handling(step, call, keys):
        # A tool without arguments (``bare``) is handled by ``async def show_table(self)``.
        result = handler() if bare else handler(argument)
        return await result if inspect.isawaitable(result) else result


async def _run_handler(hop: Hop, handled: Handling, calls: list[dict[str, Any]], argument: Any,
                       call: Mapping[str, Any] | None = None, key: str | None = None) -> Any:
    """What the handler returns for ``argument`` (``call`` when it handles a single one); an effect handler runs
    once per turn, however often the turn is retried (an approved call once under its approval's ``key``, in
    whichever request settles it)."""

    def run(keys: Mapping[str, str] | None = None) -> Awaitable[Any]:
        return _call_handler(hop.step, handled.handler, argument, call, bare=handled.bare, keys=keys)

    if key is not None or handled.effect:
        return await effects.once(hop.flow, hop.step, calls, run, key=key)
    return await run()


async def _answered(hop: Hop, handler: Any, returned: Any, outcome: ToolOutcome, *,
                    group: bool = False) -> Transition | None:
    """A handler's answer taken: a direct result kept for the worker, None (which only a single call's handler may
    return) routing nowhere, anything else applied as a transition, which is returned."""
    if isinstance(returned, DirectResult):
        outcome.result = _worker_result(hop, returned)
        return None
    kind = "Tool group handler" if group else "Tool handler"
    where = f"{kind} '{type(hop.step).__name__}.{getattr(handler, '__name__', handler)}'"
    if returned is None:
        if group:
            raise PicoFlowError(f"{where} returned None.")
        return None
    if group:
        _check_group_answer(where, returned)
    transition = await outcome.route(hop, returned)
    if transition is None and group:
        raise PicoFlowError(f"{where} returned an object with an invalid step.")
    if transition is None:
        # A TypeScript-style {step, state} object is the usual slip: say what to write instead.
        raise PicoFlowError(
            f"{where} returned a {type(returned).__name__}; return go(Step), stay(...), direct(...), "
            "a step class or name, or None (go(Step).with_state({...}) carries state)."
        )
    return transition


def _check_group_answer(where: str, result: Any) -> None:
    """A group handler's answer must be a route: refuse the shapes that cannot be one, saying which."""
    if isinstance(result, str) and not result.strip():
        raise PicoFlowError(f"{where} returned an empty step name.")
    if isinstance(result, (bool, int, float, list, tuple)):
        raise PicoFlowError(f"{where} returned an unsupported {type(result).__name__} result.")
    if isinstance(result, dict) and "step" not in result:
        raise PicoFlowError(f"{where} returned an object without step.")


def _waits(hop: Hop, handled: Handling, validated: list[dict[str, Any]], argument: Any, outcome: ToolOutcome,
           approved_key: str | None, *, group: bool = False) -> bool:
    """Whether the calls wait for a person's decision instead of running (their waiting results then recorded);
    never for calls a person already approved (``approved_key``)."""
    if approved_key or handled.approval is None:
        return False
    waiting = approvals.pause(hop.flow, hop.step, handled.approval, argument, validated, group=group)
    if waiting is None:
        return False
    outcome.messages.extend(waiting)
    outcome.paused = True
    return True


async def dispatch_tools(hop: Hop, ai: AIMessage, offer: ModelCall, table: ToolTable, *,
                         approved_key: str | None = None) -> ToolOutcome:
    """Run the handlers ``table`` names for one AI message's tool calls; one tool message per call.

    A call that needs a person's decision does not run: it waits (``picoflow.turn.approvals``) and the outcome
    says so. ``approved_key`` settles calls a person approved: they run under that journal key.
    """
    flow, step = hop.flow, hop.step
    calls = ai.tool_calls
    outcome = ToolOutcome()
    if table.group is not None:
        await _dispatch_group(hop, table.group, calls, outcome, approved_key)
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
            await _dispatch_offered(hop, table.tools.get(name), call, ran, outcome)
        elif name == OPEN_FILE_TOOL and name not in exposed:
            opening = opening or FileOpening(hop.space.messages, flow.run_context.files.budget, step)
            outcome.messages.append(_tool_message(step, call, *opening.answer(call.get("args") or {})))
        elif name not in exposed:
            flow.logger.warn(f"hallucinated tool: {name}", step=step.id)
            outcome.messages.append(
                _tool_message(step, call, f"LLM hallucinates a non-existing tool: {name}", status="error")
            )
        else:
            await _dispatch_call(hop, table.tools[name], call, outcome, approved_key)
    # The opened files follow every call's result, in one message the next request carries in full.
    outcome.messages.extend(opening.messages() if opening is not None else [])
    return outcome


async def _dispatch_group(hop: Hop, group: Handling, calls: list[Any], outcome: ToolOutcome,
                          approved_key: str | None) -> None:
    """A group handler owns the whole batch: it runs once for every call, after every call's arguments check."""
    step = hop.step
    checked = [(call, _checked_args(hop, call)) for call in calls]
    valid = [(call, args) for call, args in checked if not isinstance(args, ValidationError)]
    if len(valid) < len(checked):
        # Nothing runs until every call is valid.
        for call, args in checked:
            if isinstance(args, ValidationError):
                outcome.messages.append(await _refuse_arguments(hop, call, args, outcome))
            else:
                outcome.messages.append(_tool_message(
                    step, call, "Not run: another call in this batch had invalid arguments.", status="error"
                ))
        return
    validated = [{**call, "args": _as_dict(args)} for call, args in valid]
    if _waits(hop, group, validated, validated, outcome, approved_key, group=True):
        return
    returned = await _run_handler(hop, group, validated, validated, key=approved_key)
    tool = _tool_text(await _answered(hop, group.handler, returned, outcome, group=True))
    outcome.messages.extend(_tool_message(step, call, tool or TOOL_VALIDATED) for call in calls)


async def _dispatch_call(hop: Hop, handled: Handling, call: Mapping[str, Any], outcome: ToolOutcome,
                         approved_key: str | None) -> None:
    """One call of an exposed tool: its arguments checked, its approval asked, then its handler run."""
    step = hop.step
    args = _checked_args(hop, call)
    if isinstance(args, ValidationError):
        outcome.messages.append(await _refuse_arguments(hop, call, args, outcome))
        return
    if handled.handler is None:
        hop.flow.logger.warn(f"missing tool handler: {call['name']}", step=step.id)
        outcome.messages.append(_tool_message(step, call, TOOL_VALIDATED))
        return
    # A typed handler (``args: Model``) gets the validated model; any other handler its JSON dict.
    argument = args if handled.argument is not None and isinstance(args, handled.argument) else _as_dict(args)
    validated = [{**call, "args": _as_dict(args)}]
    if _waits(hop, handled, validated, argument, outcome, approved_key):
        return
    returned = await _run_handler(hop, handled, validated, argument, call, approved_key)
    tool = _tool_text(await _answered(hop, handled.handler, returned, outcome))
    outcome.messages.append(_tool_message(step, call, tool or TOOL_VALIDATED))


async def _dispatch_offered(hop: Hop, handled: Handling | None, call: Mapping[str, Any], ran: ToolCallOutcome,
                            outcome: ToolOutcome) -> None:
    """An MCP tool the step offers, answered: a same-named handler of the step gets the server's result."""
    step = hop.step
    handler = handled.handler if handled is not None and ran.result is not None else None
    if handled is None or handler is None:
        if ran.result is not None and ran.result.error is not None:
            hop.flow.logger.warn("MCP tool unavailable", step=step.id, server=ran.result.server,
                                 tool=ran.result.tool, reason=ran.result.error.reason)
        outcome.messages.append(_tool_message(step, call, ran.content, status=ran.status))
        return
    returned = await _call_handler(step, handler, ran.result, call, bare=handled.bare)
    transition = await _answered(hop, handler, returned, outcome)
    if transition is None:
        # The handler only looked: the model reads the server's result (or the fixed sentence on a failure).
        outcome.messages.append(_tool_message(step, call, ran.content, status=ran.status))
    else:
        outcome.messages.append(_tool_message(step, call, transition.tool or ran.content))


def _tool_text(transition: Transition | None) -> str | None:
    """The tool result a handler's route chose for its calls, if any."""
    return transition.tool if transition is not None else None


def _worker_result(hop: Hop, result: DirectResult) -> DirectResult:
    if hop.worker is None or hop.worker.step is not hop.step:
        raise PicoFlowError("direct_result() can only be returned by a tool handler of a run_steps() worker.")
    return result


def shown_arguments(hop: Hop, ai: AIMessage, offer: ModelCall, table: ToolTable) -> dict[str, dict[str, Any]]:
    """The validated arguments of the calls clients may see (``Handling.shown``), by call id; a call whose
    arguments fail the schema, or a tool outside the flow's registry (an MCP server's, ``open_file``), is never
    shown."""
    shown: dict[str, dict[str, Any]] = {}
    for call in ai.tool_calls:
        name, call_id = call["name"], call.get("id")
        handled = table.group or table.tools.get(name)
        if not call_id or name not in offer.tools or handled is None or name not in handled.shown:
            continue
        args = _checked_args(hop, call)
        if not isinstance(args, ValidationError):
            shown[call_id] = _as_dict(args)
    return shown


def _checked_args(hop: Hop, call: Mapping[str, Any]) -> dict[str, Any] | BaseModel | ValidationError:
    """The call's arguments validated against its tool schema (the model instance), or the validation error."""
    spec = hop.flow.run_context.tools.get(call["name"])
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


def _tool_message(step: Step, call: Mapping[str, Any], content: str, status: str = "success") -> ToolMessageEx:
    return ToolMessageEx(step.id, content, call.get("id") or "", name=call["name"], status=status)


async def _refuse_arguments(
    hop: Hop, call: Mapping[str, Any], error: ValidationError, outcome: ToolOutcome
) -> ToolMessageEx:
    """The tool result for a call with invalid arguments: the step's own feedback, or the default one."""
    step = hop.step
    invalid = InvalidToolArguments(name=call["name"], args=dict(call.get("args") or {}), error=error)
    hook = step.on_invalid_tool_arguments
    answer = await _call_handler(step, hook, invalid, call)
    feedback = answer if isinstance(answer, str) else None
    if answer is not None and feedback is None:
        tool = _tool_text(await _answered(hop, hook, answer, outcome))
        # A bare stay() carries "input validated", which would tell the model the opposite of what happened.
        feedback = tool if tool != TOOL_VALIDATED else None
    return _tool_message(step, call, feedback or invalid.default_feedback(), status="error")

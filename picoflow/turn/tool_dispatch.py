"""Tool dispatch: validate each tool call's arguments, run its handler, and turn the answer into a route."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage
from pydantic import BaseModel, ValidationError

from picoflow.errors import PicoFlowError
from picoflow.flow import Flow
from picoflow.mcp import OfferedTool, offered_tools, run_offered
from picoflow.messages import ToolMessageEx
from picoflow.step import Step
from picoflow.tools import InvalidToolArguments, argument_model, handling, takes_no_arguments
from picoflow.transitions import TOOL_VALIDATED, DirectResult, Transition, as_transition
from picoflow.turn.apply_transition import apply_transition


@dataclass
class _ToolOutcome:
    messages: list[BaseMessage] = field(default_factory=list)
    extra: BaseMessage | None = None
    finish: bool = False
    result: DirectResult | None = None


async def _call_handler(step: Step, handler: Any, argument: Any, call: dict[str, Any] | None = None) -> Any:
    with handling(step, call):
        # A tool without arguments is handled by ``async def show_table(self)``.
        result = handler() if takes_no_arguments(getattr(handler, "__func__", handler)) else handler(argument)
        return await result if inspect.isawaitable(result) else result


def _handler_route(step: Step, handler: Any, result: Any) -> Transition | None:
    """A tool handler's answer as a transition; None (no transition) only for None itself."""
    if result is None:
        return None
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


async def dispatch_tools(flow: Flow, step: Step, ai: AIMessage) -> _ToolOutcome:
    """Run the handlers for one AI message's tool calls; one tool message per call."""
    calls = ai.tool_calls
    outcome = _ToolOutcome()
    group = step._group_handler({call["name"] for call in calls})
    if group is not None:
        checked = [(call, _checked_args(flow, call)) for call in calls]
        if any(isinstance(args, ValidationError) for _, args in checked):
            # The group handler owns the whole batch, so nothing runs until every call is valid.
            for call, args in checked:
                if isinstance(args, ValidationError):
                    outcome.messages.append(await _refuse_arguments(flow, step, call, args, outcome))
                else:
                    outcome.messages.append(_tool_message(
                        step, call, "Not run: another call in this batch had invalid arguments.", status="error"
                    ))
            return outcome
        validated = [{**call, "args": _as_dict(args)} for call, args in checked]
        returned = await _call_handler(step, group, validated)
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

    exposed = set(step._exposed_tool_names())
    offered = await offered_tools(step)
    for call in calls:
        name = call["name"]
        if name in offered:
            await _dispatch_offered(flow, step, call, offered[name], outcome)
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
        handler = step._tool_handler(name)
        if handler is None:
            flow.logger.warn(f"missing tool handler: {name}", step=step.id)
            outcome.messages.append(_tool_message(step, call, TOOL_VALIDATED))
            continue
        returned = await _call_handler(step, handler, _handler_argument(handler, args), call)
        if isinstance(returned, DirectResult):
            outcome.result = _worker_result(flow, step, returned)
            outcome.messages.append(_tool_message(step, call, TOOL_VALIDATED))
            continue
        transition = _handler_route(step, handler, returned)
        if transition is None:
            outcome.messages.append(_tool_message(step, call, TOOL_VALIDATED))
            continue
        await apply_transition(flow, transition)
        outcome.messages.append(_tool_message(step, call, transition.tool or TOOL_VALIDATED))
        if transition.message is not None:
            outcome.extra, outcome.finish = transition.message, transition.finish
    return outcome


async def _dispatch_offered(flow: Flow, step: Step, call: dict[str, Any], tool: OfferedTool,
                            outcome: _ToolOutcome) -> None:
    """An MCP tool the step offers: the server answers, and a same-named handler of the step gets its result."""
    ran = await run_offered(tool, call.get("args") or {})
    handler = step._tool_handler(call["name"]) if ran.result is not None else None
    if handler is None:
        if ran.result is not None and not ran.result.ok:
            flow.logger.warn("MCP tool unavailable", step=step.id, server=tool.spec.name, tool=tool.name,
                             reason=ran.result.error.reason)
        outcome.messages.append(_tool_message(step, call, ran.content, status=ran.status))
        return
    returned = await _call_handler(step, handler, ran.result, call)
    if isinstance(returned, DirectResult):
        outcome.result = _worker_result(flow, step, returned)
        outcome.messages.append(_tool_message(step, call, ran.content, status=ran.status))
        return
    transition = _handler_route(step, handler, returned)
    if transition is None:
        # The handler only looked: the model reads the server's result (or the fixed sentence on a failure).
        outcome.messages.append(_tool_message(step, call, ran.content, status=ran.status))
        return
    await apply_transition(flow, transition)
    outcome.messages.append(_tool_message(step, call, transition.tool or ran.content))
    if transition.message is not None:
        outcome.extra, outcome.finish = transition.message, transition.finish


def _worker_result(flow: Flow, step: Step, result: DirectResult) -> DirectResult:
    worker = flow._view().worker
    if worker is None or worker.step is not step:
        raise PicoFlowError("direct_result() can only be returned by a tool handler of a run_steps() worker.")
    return result


def _checked_args(flow: Flow, call: dict[str, Any]) -> dict[str, Any] | BaseModel | ValidationError:
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
    return args.model_dump(mode="json") if isinstance(args, BaseModel) else args


def _handler_argument(handler: Any, args: dict[str, Any] | BaseModel) -> Any:
    """A typed handler (``args: Model``) gets the validated model; any other handler its JSON dict."""
    wanted = argument_model(getattr(handler, "__func__", handler))
    return args if wanted is not None and isinstance(args, wanted) else _as_dict(args)


def _tool_message(step: Step, call: dict[str, Any], content: str, status: str = "success") -> ToolMessageEx:
    return ToolMessageEx(step, content, call.get("id") or "", name=call["name"], status=status)


async def _refuse_arguments(
    flow: Flow, step: Step, call: dict[str, Any], error: ValidationError, outcome: _ToolOutcome
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

"""The turn loop: model calls with retries, tool dispatch, transitions, logic steps and crossings."""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from langchain_core.messages import AIMessage, BaseMessage, SystemMessage
from pydantic import BaseModel, ValidationError

from picoflow.compaction import summary_system_message
from picoflow.errors import PicoFlowError
from picoflow.messages import AiMessageEx, HumanMessageEx, ToolMessageEx, content_text, gen_message_id, is_direct
from picoflow.transitions import TOOL_VALIDATED, Transition, _executing_handler_step, as_transition

if TYPE_CHECKING:
    from picoflow.flow import Flow
    from picoflow.step import Step

EMPTY_RESPONSE_NUDGE = "Follow system prompt and respond properly."
MAX_HOPS_PER_TURN = 64
# Do not start a model call with less time than this left before the turn deadline.
MIN_CALL_SECONDS = 1.0


class TurnDeadlineError(PicoFlowError):
    """The turn ran out of time before it could start another model call."""

    code = "TURN_DEADLINE"
    status_code = 504


@dataclass
class _ToolOutcome:
    messages: list[BaseMessage] = field(default_factory=list)
    extra: BaseMessage | None = None
    finish: bool = False


async def run_turn(flow: Flow, user_message: str | None) -> Any:
    """Run the current step (and whatever it routes to) for one user message; return the reply."""
    step = flow.get_executing_step()
    if step is None:
        raise PicoFlowError(f"Flow '{flow.id}' has no current step.")
    incoming = HumanMessageEx(step, user_message) if user_message else None
    return await _drive(flow, incoming)


async def run_nested(flow: Flow, child: Step, user_message: str | None) -> Any:
    """Run a child step in the frame the flow just opened for it."""
    incoming = HumanMessageEx(child, user_message) if user_message else None
    return await _drive(flow, incoming)


async def _drive(flow: Flow, pending: BaseMessage | None) -> Any:
    prior = flow.get_executing_step().id
    for _ in range(MAX_HOPS_PER_TURN):
        step = flow.get_executing_step()
        if step.id != prior:
            pending = step.on_crossing(pending, prior)
        prior = step.id

        if step.is_logic():
            step.get_memory().append(pending or HumanMessageEx(step, f"Continue to step:{step.id}"))
            transition = as_transition(await step.run_logic())
            if transition is None:
                raise PicoFlowError(f"Logic step '{step.id}' must return a step or a transition.")
            if transition.step == step.id:
                raise PicoFlowError(f"Logic step '{step.id}' must move the cursor to another step.")
            await apply_transition(flow, transition)
            pending = transition.message
            if pending is not None and is_direct(pending):
                return _deliver_direct(flow, transition)
            continue

        if pending is not None:
            step.get_memory().append(pending)
            pending = None
        ai, parsed = await call_model(flow, step)
        ai = ai.model_copy(update={"id": gen_message_id(step)})

        if ai.tool_calls and parsed is None:
            step.get_memory().append(ai)
            outcome = await dispatch_tools(flow, step, ai)
            step.get_memory().extend(outcome.messages)
            if outcome.extra is not None and is_direct(outcome.extra):
                if outcome.finish:
                    flow.mark_completed()
                flow.get_executing_step().get_memory().append(outcome.extra)
                return content_text(outcome.extra.content)
            pending = outcome.extra
            continue

        result = parsed if parsed is not None else content_text(ai.content)
        answer = await step.on_response(result)
        transition = _response_transition(flow, answer)
        if transition is None:
            text = answer if isinstance(answer, str) else json.dumps(answer)
            step.get_memory().append(AiMessageEx(step, text))
            return text
        step.get_memory().append(AiMessageEx(step, content_text(ai.content) or _as_text(parsed)))
        await apply_transition(flow, transition)
        pending = transition.message
        if pending is not None and is_direct(pending):
            return _deliver_direct(flow, transition)
    raise PicoFlowError(f"Flow '{flow.id}' moved between steps more than {MAX_HOPS_PER_TURN} times in one turn.")


def _deliver_direct(flow: Flow, transition: Transition) -> str:
    if transition.finish:
        flow.mark_completed()
    flow.get_executing_step().get_memory().append(transition.message)
    return content_text(transition.message.content)


def _as_text(value: Any) -> str:
    if isinstance(value, BaseModel):
        return value.model_dump_json()
    return value if isinstance(value, str) else json.dumps(value)


def _response_transition(flow: Flow, answer: Any) -> Transition | None:
    if isinstance(answer, str):
        return as_transition(answer) if flow.get_step(answer.strip()) is not None else None
    return as_transition(answer)


async def apply_transition(flow: Flow, transition: Transition) -> Step:
    """Apply one transition in the fixed order: goto, prompt, state, content type."""
    executing = flow.get_executing_step()
    if transition.finish or not transition.step or transition.step == executing.id:
        destination = executing
    else:
        destination = await flow.goto(transition.step)
    if transition.prompt is not None:
        destination.save_state({"_prompt": transition.prompt})
    if transition.state:
        destination.save_state(transition.state)
    if transition.content_type:
        destination.content_type = transition.content_type
    return destination


# -- model calls ---------------------------------------------------------------------------


def build_request(step: Step) -> list[BaseMessage]:
    """Rewrite the system slot from ``get_prompt()`` and assemble what the model is sent."""
    history = step.get_memory()
    prompt = step.get_prompt() or ""
    history[0] = SystemMessage(content=prompt)
    request: list[BaseMessage] = [history[0]] if prompt else []
    summary = step.flow.get_memory().namespace(step.namespace).summary
    if summary:
        request.append(summary_system_message(summary))
    request.extend(history[1:])
    return request


async def call_model(flow: Flow, step: Step) -> tuple[AIMessage, Any]:
    """One accepted model result for ``step``: (the AI message, the parsed structured output or None)."""
    selection = step.model_selection()
    engine = flow.get_flow_engine()
    model = engine.providers.chat_model(selection)
    specs = [flow.require_tool(name) for name in step.exposed_tool_names()]
    schema = step.struct_output_schema()
    if schema is not None:
        runnable = model.with_structured_output(schema, include_raw=True)
    elif specs:
        runnable = model.bind_tools([spec.as_model_tool() for spec in specs])
    else:
        runnable = model

    reason, failure = "unknown", "no attempt was made"
    for attempt in range(1, selection.retry_attempts + 1):
        if attempt > 1 and engine.retry_delay:
            await asyncio.sleep(engine.retry_delay)
        timeout = _remaining_time(flow)
        try:
            output = await asyncio.wait_for(runnable.ainvoke(build_request(step)), timeout)
        except TimeoutError:
            reason, failure = "timeout", f"the model call exceeded {timeout:.1f}s"
            flow.logger.warn("model attempt timed out", step=step.id, attempt=attempt)
            continue
        except Exception as exc:  # noqa: BLE001 - any provider error counts as a failed attempt
            reason, failure = "error", f"{type(exc).__name__}: {exc}"
            flow.logger.warn("model attempt failed", step=step.id, attempt=attempt, error=type(exc).__name__)
            continue

        parsed = None
        if schema is not None:
            ai = output.get("raw")
            parsed = output.get("parsed")
            if isinstance(ai, AIMessage):
                flow.tally(ai)
            if parsed is None:
                reason, failure = "parse", str(output.get("parsing_error") or "no structured output")
                flow.logger.warn("model attempt returned unusable structured output", step=step.id, attempt=attempt)
                continue
            if not isinstance(ai, AIMessage):
                ai = AIMessage(content=_as_text(parsed))
        else:
            ai = output
            flow.tally(ai)
            if not ai.tool_calls and not content_text(ai.content).strip():
                reason = str(ai.response_metadata.get("finish_reason") or "empty")
                failure = "the model returned an empty response"
                step.get_memory().append(HumanMessageEx(step, EMPTY_RESPONSE_NUDGE))
                continue
        if step.check_response(parsed if parsed is not None else ai):
            reason, failure = "rejected", "check_response() rejected the result"
            continue
        return ai, parsed
    raise PicoFlowError(f"LLM call failed. Reason:{reason}. Error:{failure}")


def _remaining_time(flow: Flow) -> float | None:
    deadline = flow.get_flow_engine().current_deadline()
    if deadline is None:
        return None
    remaining = deadline - time.monotonic()
    if remaining < MIN_CALL_SECONDS:
        raise TurnDeadlineError("The turn ran out of time before the next model call; please retry.")
    return remaining


# -- tool dispatch ---------------------------------------------------------------------------


async def _call_handler(step: Step, handler: Any, argument: Any) -> Any:
    token = _executing_handler_step.set(step)
    try:
        result = handler(argument)
        return await result if inspect.isawaitable(result) else result
    finally:
        _executing_handler_step.reset(token)


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
    group = step.group_handler({call["name"] for call in calls})
    if group is not None:
        checked = [(call, _checked_args(flow, call)) for call in calls]
        if any(isinstance(args, ValidationError) for _, args in checked):
            # The group handler owns the whole batch, so nothing runs until every call is valid.
            for call, args in checked:
                feedback = (_validation_feedback(call["name"], args) if isinstance(args, ValidationError)
                            else "Not run: another call in this batch had invalid arguments.")
                outcome.messages.append(_tool_message(step, call, feedback, status="error"))
            return outcome
        validated = [{**call, "args": args} for call, args in checked]
        transition = _group_route(step, group.__name__, await _call_handler(step, group, validated))
        await apply_transition(flow, transition)
        for call in calls:
            outcome.messages.append(_tool_message(step, call, transition.tool or TOOL_VALIDATED))
        outcome.extra, outcome.finish = transition.message, transition.finish
        return outcome

    exposed = set(step.exposed_tool_names())
    for call in calls:
        name = call["name"]
        if name not in exposed:
            flow.logger.warn(f"hallucinated tool: {name}", step=step.id)
            outcome.messages.append(
                _tool_message(step, call, f"LLM hallucinates a non-existing tool: {name}", status="error")
            )
            continue
        args = _checked_args(flow, call)
        if isinstance(args, ValidationError):
            outcome.messages.append(_tool_message(step, call, _validation_feedback(name, args), status="error"))
            continue
        handler = step.tool_handler(name)
        if handler is None:
            flow.logger.warn(f"missing tool handler: {name}", step=step.id)
            outcome.messages.append(_tool_message(step, call, TOOL_VALIDATED))
            continue
        transition = as_transition(await _call_handler(step, handler, args))
        if transition is None:
            outcome.messages.append(_tool_message(step, call, TOOL_VALIDATED))
            continue
        await apply_transition(flow, transition)
        outcome.messages.append(_tool_message(step, call, transition.tool or TOOL_VALIDATED))
        if transition.message is not None:
            outcome.extra, outcome.finish = transition.message, transition.finish
    return outcome


def _checked_args(flow: Flow, call: dict[str, Any]) -> dict[str, Any] | ValidationError:
    """The call's arguments validated against its tool schema, or the validation error."""
    spec = flow.get_tool(call["name"])
    raw = call.get("args") or {}
    if spec is None:
        return dict(raw)
    try:
        return spec.schema.model_validate(raw).model_dump()
    except ValidationError as exc:
        return exc


def _tool_message(step: Step, call: dict[str, Any], content: str, status: str = "success") -> ToolMessageEx:
    return ToolMessageEx(step, content, call.get("id") or "", name=call["name"], status=status)


def _validation_feedback(name: str, exc: ValidationError) -> str:
    problems = "; ".join(
        f"{'.'.join(str(p) for p in err.get('loc', ())) or 'arguments'}: {err.get('msg')}" for err in exc.errors()
    )
    return f"Invalid arguments for tool '{name}': {problems}. Call the tool again with corrected arguments."

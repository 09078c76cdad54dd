"""The hop loop of a turn: run the executing step, follow its transitions, stop at an answer."""

from __future__ import annotations

from typing import Any

from langchain_core.messages import BaseMessage

from picoflow.errors import PicoFlowError
from picoflow.execution import execution_frames
from picoflow.files.refs import with_files
from picoflow.flow import Flow
from picoflow.messages import (
    CONTINUE_PREFIX,
    AiMessageEx,
    HumanMessageEx,
    as_text,
    content_text,
    gen_message_id,
    is_direct,
)
from picoflow.models.selection import ModelSelection
from picoflow.step import Step
from picoflow.transitions import Transition, as_transition
from picoflow.turn.apply_transition import apply_transition
from picoflow.turn.model_call import call_model
from picoflow.turn.tool_dispatch import dispatch_tools

MAX_HOPS_PER_TURN = 64


async def run_turn(flow: Flow, user_message: str | None) -> Any:
    """Run the current step (and whatever it routes to) for one user message; return the reply."""
    step = flow.get_executing_step()
    if step is None:
        raise PicoFlowError(f"Flow '{flow.id}' has no current step.")
    if flow.is_batch_coordinator():
        return await flow.spawn_steps()
    return await step.run(user_message)


async def run_model_loop(step: Step, user_message: str | None) -> Any:
    """The default ``Step.run``: drive the executing step from ``user_message`` until it answers.

    The files attached to the turn join the first message built from the user's input.
    """
    attached = step.flow._turn().files.take_attached()
    content = with_files(user_message, attached) if attached else user_message
    incoming = HumanMessageEx(step, content) if content else None
    return await _drive(step.flow, incoming)


async def _drive(flow: Flow, pending: BaseMessage | None) -> Any:
    prior = flow.get_executing_step().id
    fallback: tuple[str, ModelSelection] | None = None
    for _ in range(MAX_HOPS_PER_TURN):
        step = flow.get_executing_step()
        if step.id != prior:
            if flow.checkpoint_on_crossing and not execution_frames(flow):
                await flow.checkpoint()
            pending = step.on_crossing(pending, prior)
        prior = step.id

        if step.is_logic():
            handover = pending or HumanMessageEx(step, f"{CONTINUE_PREFIX}{step.id}", origin="framework")
            step.get_memory().append(handover)
            transition = as_transition(await step.run_logic())
            if transition is None:
                raise PicoFlowError(f"Logic step '{step.id}' must return a step or a transition.")
            answers = transition.message is not None and is_direct(transition.message)
            # A direct answer ends the turn, so a logic step may keep the cursor with one; anything else would loop.
            if transition.step == step.id and not answers:
                raise PicoFlowError(
                    f"Logic step '{step.id}' must move the cursor to another step or answer with direct_to(...)."
                )
            await apply_transition(flow, transition)
            if answers:
                return _deliver_direct(flow, transition)
            pending = transition.message
            continue

        if pending is not None:
            step.get_memory().append(pending)
            pending = None
        outcome = await call_model(flow, step, fallback[1] if fallback and fallback[0] == step.id else None)
        if outcome.fallback is not None:
            fallback = (step.id, outcome.fallback)

        model_text = None
        if outcome.ai is None:
            answer = outcome.answer
        else:
            ai = outcome.ai.model_copy(update={"id": gen_message_id(step)})
            if ai.tool_calls and outcome.parsed is None:
                tools = await dispatch_tools(flow, step, ai)
                # The call and its results are stored together, after whatever the handlers did: a nested
                # child sharing this namespace must never send a tool call whose results are not there yet.
                step.get_memory().extend([ai, *tools.messages])
                if tools.result is not None:
                    return tools.result.value
                if tools.extra is not None and is_direct(tools.extra):
                    if tools.finish:
                        flow.mark_completed()
                    flow.get_executing_step().get_memory().append(tools.extra)
                    return content_text(tools.extra.content)
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
            step.get_memory().append(AiMessageEx(step, text))
            return text
        if model_text is not None:
            step.get_memory().append(AiMessageEx(step, model_text))
        await apply_transition(flow, transition)
        pending = transition.message
        if pending is not None and is_direct(pending):
            return _deliver_direct(flow, transition)
    raise PicoFlowError(f"Flow '{flow.id}' moved between steps more than {MAX_HOPS_PER_TURN} times in one turn.")


def _deliver_direct(flow: Flow, transition: Transition) -> str:
    if transition.finish:
        flow.mark_completed()
    step = flow.get_executing_step()
    message = transition.message
    if message.id is None:
        # finish(text) made outside a handler (possibly once, for reuse): a copy belongs to the step that finished
        message = message.model_copy(update={"id": gen_message_id(step)})
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



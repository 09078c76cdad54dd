"""The cursor of a turn: which step is executing, how a transition moves it, and what a step's answer means (a reply
to send or a route to take)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from langchain_core.messages import BaseMessage

from picoflow.authoring.flow import Flow
from picoflow.authoring.run_context import ensure_top_level
from picoflow.authoring.step import Step
from picoflow.authoring.transitions import Transition, as_transition
from picoflow.conversation.state import PROMPT_KEY
from picoflow.errors import PicoFlowError
from picoflow.messages import as_text, content_text, gen_message_id
from picoflow.turn.hop import Hop


@dataclass(frozen=True)
class Reply:
    """A step's answer that is sent to the user as it is."""

    text: str


@dataclass(frozen=True)
class Route:
    """A step's answer that moves the cursor (or changes the step) before the turn goes on."""

    transition: Transition


def executing_step(flow: Flow) -> Step:
    """The step running in this task (the innermost nested one, else the one under the cursor)."""
    step = flow.get_executing_step()
    if step is None:
        raise PicoFlowError(f"Flow '{flow.id}' has no current step.")
    return step


def read_answer(flow: Flow, answer: Any, *, model_said: Any = None) -> Reply | Route:
    """What ``answer`` (from ``on_response`` or a recovery hook) asks for.

    A string routes only when a step has that name, and never when it is the model's own result
    (``model_said``) handed back unchanged: the model's words are a reply even when they spell a step's name, and a
    flow that routes on a reply says so by returning ``go(...)`` or a step.
    """
    if isinstance(answer, str):
        spoken = model_said is not None and answer == as_text(model_said)
        if spoken or flow.get_step(answer.strip()) is None:
            return Reply(answer)
    transition = as_transition(answer)
    return Reply(str(as_text(answer))) if transition is None else Route(transition)


def deliver_direct(step: Step, message: BaseMessage, finish: bool) -> str:
    """Append a direct answer to the memory of ``step``, the executing one (completing the session when
    ``finish``); its text."""
    if finish:
        step.flow.mark_completed()
    memory = step.get_memory()
    if message.id is None:
        # finish(text) made outside a handler (possibly once, for reuse): a copy belongs to the step that finished
        message = message.model_copy(update={"id": gen_message_id(step.id)})
    memory.append(message)
    return content_text(message.content)


async def apply_transition(hop: Hop, transition: Transition) -> Step:
    """Apply one transition of ``hop`` in the fixed order: goto, prompt, state, content type; the step it lands on,
    which is the executing one after it."""
    flow = hop.flow
    # A nested child runs in its own frame for the whole hop; at the top level, a handler may have moved the cursor.
    executing = hop.step if hop.nested else flow.get_current_step()
    if executing is None:
        raise PicoFlowError(f"Flow '{flow.id}' has no current step.")
    if transition.step and transition.step != executing.id and not transition.finish:
        destination = await flow.goto(transition.step)
    else:
        # A nested child may stay on itself (a tool result fed back to its model) or reply directly (its result);
        # moving the cursor (which ``goto`` refuses it), or finishing the session, belongs to the owning step.
        if hop.nested and transition.finish:
            ensure_top_level(flow, transition.step or executing.id)
        destination = executing
    prompt = {PROMPT_KEY: transition.prompt} if transition.prompt is not None else {}
    # The prompt, then the state, each saved as flow code saves it (an empty one changes nothing).
    for saved in (prompt, transition.state or {}):
        destination.save_state(saved)
    if transition.content_type:
        destination.content_type = transition.content_type
    return destination

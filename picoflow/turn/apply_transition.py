"""Applying a transition on its destination step, in the fixed order: goto, prompt, state, content type."""

from __future__ import annotations

from picoflow.flow import Flow
from picoflow.step import PROMPT_KEY, Step
from picoflow.transitions import Transition


async def apply_transition(flow: Flow, transition: Transition) -> Step:
    """Apply one transition in the fixed order: goto, prompt, state, content type."""
    executing = flow.get_executing_step()
    target = transition.step or executing.id
    # A nested child may stay on itself (a tool result fed back to its model) or reply directly (its result);
    # moving the cursor, or finishing the session, belongs to the owning step.
    if transition.finish or target != executing.id:
        flow._ensure_top_level(target)
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

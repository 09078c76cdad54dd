"""SummaryStep: the profile read back, then the end of the session."""

from __future__ import annotations

from picoflow import Step, TerminateSessionStep, Transition, go, tool

from .age_gate import AgeGateStep
from .common import role
from .contact import ContactStep
from .favorites import FavoritesStep
from .name import NameStep


class SummaryStep(Step):
    """Read the profile back; the conversation ends when the user is happy."""

    def get_prompt(self) -> str:
        profile = {
            "name": self.flow.get_step_state(NameStep),
            "age": self.flow.get_step_state(AgeGateStep, "age"),
            "favorites": self.flow.get_step_state(FavoritesStep),
            "contact": self.flow.get_step_state(ContactStep),
        }
        tagline = self.get_transient_state("tagline")
        return (
            f"{role(self)}\nRead this profile back to the user: {profile}. "
            + (f"Offer the tagline '{tagline}'. " if tagline else "")
            + "When they are happy with it, call terminate_session."
        )

    @tool
    async def terminate_session(self, args: TerminateSessionStep.TerminateArgs) -> Transition:
        # The tool is defined once, by TerminateSessionStep; this handler puts it on this step's menu.
        return go(TerminateSessionStep).with_prompt(args.prompt)

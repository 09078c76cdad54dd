"""NameStep: the first stage of ProfileFlow."""

from __future__ import annotations

from pydantic import BaseModel, Field

from picoflow import Step, Transition, go, prompt, stay, tool

from .common import role
from .validators import parse_full_name


class NameArgs(BaseModel):
    full_name: str = Field(description="The user's first and last name, as they wrote it")


class NameStep(Step):
    """Ask for the user's name; only a first and a last name move the conversation on."""

    def get_prompt(self) -> str:
        return prompt("prompts/name.md", __file__, role=role(self))

    @tool
    async def save_name(self, args: NameArgs) -> Transition:
        """Save the user's first and last name."""
        name = parse_full_name(args.full_name)
        if name is None:
            return stay("That is not a first and a last name. Ask the user for both.")
        self.save_state({"first": name.first, "last": name.last})
        # The next step by its id: this module need not import the one that comes after it.
        return go("BirthdayStep")

"""BirthdayStep: the date of birth, asked for by the name NameStep saved."""

from __future__ import annotations

from pydantic import BaseModel, Field

from picoflow import Step, Transition, go, prompt, stay, tool

from .common import role, today
from .name import NameStep
from .validators import parse_birthday


class BirthdayArgs(BaseModel):
    birthday: str = Field(description="The date of birth as YYYY-MM-DD")


class BirthdayStep(Step):
    """Ask for the date of birth, addressing the user by the name NameStep saved."""

    def get_prompt(self) -> str:
        first_name = self.flow.get_step_state(NameStep, "first")
        return prompt(
            "prompts/birthday.md", __file__, role=role(self), first_name=first_name, today=today(self).isoformat()
        )

    @tool
    async def save_birthday(self, args: BirthdayArgs) -> Transition:
        """Save the user's date of birth."""
        birthday = parse_birthday(args.birthday, today(self))
        if birthday is None:
            return stay("Not a real past date in YYYY-MM-DD form. Ask again.")
        self.save_state({"birthday": birthday.isoformat()})
        return go("AgeGateStep")

"""The steps of ProfileFlow, the flow the basic tutorial builds one part at a time.

The ``--8<--`` comments mark the sections the tutorial pages show; they are plain comments to Python.
"""

from __future__ import annotations

from datetime import date
from typing import Any, Literal

from pydantic import BaseModel, Field

from picoflow import LogicStep, Step, TerminateSessionStep, Transition, finish, go, prompt, stay, tool, tools
from picoflow.messages import HumanMessageEx
from picoflow.parallel import RunStepRequest

from .validators import age_on, parse_birthday, parse_full_name

# The youngest age the service accepts.
MINIMUM_AGE = 13


def today(step: Step) -> date:
    """The session's ``config.today`` when it has one (tests pin the date), else the real date."""
    pinned = step.get_context("config.today")
    return date.fromisoformat(pinned) if pinned else date.today()


def role(step: Step) -> str:
    """The shared opening of every prompt, filled with the brand from the session's config."""
    return prompt("prompts/role.md", __file__, brand=step.get_context("config.brand") or "PicoFlow").strip()


# --8<-- [start:name_step]
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
        return go(BirthdayStep)
# --8<-- [end:name_step]


# --8<-- [start:birthday_step]
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
        return go(AgeGateStep)
# --8<-- [end:birthday_step]


# --8<-- [start:age_gate]
class AgeGateStep(LogicStep):
    """Route on the user's age in code: no model call, no prompt, the same answer every time."""

    async def run_logic(self) -> Transition:
        birthday = date.fromisoformat(self.flow.get_step_state(BirthdayStep, "birthday"))
        age = age_on(birthday, today(self))
        self.save_state({"age": age})
        if age < MINIMUM_AGE:
            return finish(f"Sorry, members must be at least {MINIMUM_AGE}. Thanks for stopping by!")
        return go(FavoritesStep)
# --8<-- [end:age_gate]


# --8<-- [start:favorites_schema]
class Favorites(BaseModel):
    """What the model answers in FavoritesStep: the facts so far and its next sentence."""

    color: str | None = Field(None, description="The favourite colour, once the user said it")
    season: Literal["spring", "summer", "autumn", "winter"] | None = Field(
        None, description="The favourite season, once the user said it"
    )
    reply: str = Field(description="The next thing to say to the user")
# --8<-- [end:favorites_schema]


# --8<-- [start:favorites_step]
class FavoritesStep(Step):
    """Collect two favourites through structured output; code decides when the step is done."""

    def get_prompt(self) -> str:
        return prompt("prompts/favorites.md", __file__, role=role(self))

    def struct_output_schema(self) -> type[BaseModel]:
        return Favorites

    def on_crossing(self, message: Any, prior_step: str | None = None) -> Any:
        # Open this step's own namespace with a user-side message of our making.
        return HumanMessageEx(self, "I'm ready to talk about my favourite things.")

    async def on_response(self, result: Favorites) -> Any:
        if result.color and result.season:
            self.save_state({"color": result.color, "season": result.season})
            return go(ContactStep)
        return result.reply
# --8<-- [end:favorites_step]


# --8<-- [start:contact_step]
class EmailArgs(BaseModel):
    email: str = Field(description="An e-mail address")


class PhoneArgs(BaseModel):
    phone: str = Field(description="A phone number, digits and an optional leading +")


class ContactStep(Step):
    """Two tools the model usually calls together; one handler takes the pair."""

    def get_prompt(self) -> str:
        return role(self) + "\nAsk for an e-mail address and a phone number; save each with its tool."

    @tool
    async def save_email(self, args: EmailArgs) -> Transition:
        """Save the user's e-mail address."""
        self.save_state({"email": args.email})
        return stay("E-mail saved. Now ask for the phone number.")

    @tool
    async def save_phone(self, args: PhoneArgs) -> Transition:
        """Save the user's phone number."""
        self.save_state({"phone": args.phone})
        return stay("Phone saved. Now ask for the e-mail address.")

    @tools(["save_email", "save_phone"])
    async def save_both(self, calls: list[dict[str, Any]]) -> Transition:
        # Called instead of the two handlers above when the model calls both tools in one reply.
        saved = {call["name"].removeprefix("save_"): next(iter(call["args"].values())) for call in calls}
        self.save_state(saved)
        return go(InsightsStep)
# --8<-- [end:contact_step]


# --8<-- [start:workers]
class ColorMeaningStep(Step):
    """A worker: one short sentence about the favourite colour."""

    def get_prompt(self) -> str:
        color = self.flow.get_step_state(FavoritesStep, "color")
        return f"In one sentence, say what the colour {color} is often said to stand for."


class SeasonMeaningStep(Step):
    """A worker: one short sentence about the favourite season."""

    def get_prompt(self) -> str:
        season = self.flow.get_step_state(FavoritesStep, "season")
        return f"In one sentence, say what people tend to love about {season}."


class TaglineStep(Step):
    """A child step: turn what the workers wrote into one line for the profile."""

    def get_prompt(self) -> str:
        return "Write a six-word profile tagline from the notes the user message gives you."
# --8<-- [end:workers]


# --8<-- [start:insights_step]
class InsightsStep(LogicStep):
    """Fan out to two workers, hand their notes to a child step, pass the result on as transient state."""

    async def run_logic(self) -> Transition:
        batch = await self.run_steps([RunStepRequest(ColorMeaningStep), RunStepRequest(SeasonMeaningStep)])
        notes = " ".join(str(branch.output) for branch in batch.fulfilled)
        tagline = await self.run_step(TaglineStep, notes)
        # Transient: SummaryStep reads it in this request only; it is never written to the session.
        self.flow.save_transient_step_state(SummaryStep, {"notes": notes, "tagline": tagline})
        return go(SummaryStep)
# --8<-- [end:insights_step]


# --8<-- [start:summary_step]
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
# --8<-- [end:summary_step]

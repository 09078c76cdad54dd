"""NameStep, DOBStep and AddressStep: the profile collection, sharing the ``default`` memory namespace."""

from __future__ import annotations

from pydantic import BaseModel, Field

from flows.basic.common import ADDRESS_END, ROLE, ExitOnRequest, parse_json_object
from flows.basic.in_context import InContextStep
from flows.basic.validators import InvalidInput, check_birth_date, check_full_name, parse_address
from picoflow import Step, TerminateSessionStep, Transition, go, stay, tool
from picoflow.authoring.prompts import prompt


class NameArgs(BaseModel):
    name: str = Field(min_length=3, description="The user's complete first and last name")


class BirthDateArgs(BaseModel):
    year: int = Field(ge=1900, le=2100, description="Four-digit year")
    month: int = Field(ge=1, le=12, description="Month number, 1 to 12")
    day: int = Field(ge=1, le=31, description="Day of the month, 1 to 31")


class AddressArgs(BaseModel):
    address: str = Field(description="The whole address exactly as the user typed it")


class NameStep(ExitOnRequest, Step):
    """Collects the full name, runs InContextStep inline, then moves to DOBStep."""

    def get_prompt(self) -> str:
        return prompt("name.md", __file__, role=ROLE)

    @tool
    async def user_name(self, args: NameArgs) -> Transition:
        """Record the user's full name"""
        try:
            name = check_full_name(args.name)
        except InvalidInput as exc:
            return stay(f"{exc} Tell the user and ask for a different full name.")
        self.save_state({"name": name})

        # Request config lives under "config." in the flow context.
        run_data = self.get_context("config.myRunData")
        if isinstance(run_data, dict):
            self.save_state({"runData": run_data})

        self.flow.save_transient_step_state(InContextStep, {"note": "passed by NameStep for this request only"})
        answer = await self.run_step(InContextStep, "Follow the system prompt.")
        if isinstance(answer, str):
            answer = parse_json_object(answer) or answer
        self.save_state({"inContext": answer})
        # The child ran without moving the cursor, so this step still decides where to go.
        return go(DOBStep)


class DOBStep(ExitOnRequest, Step):
    """Collects the date of birth, asking for it by the name NameStep collected."""

    def get_prompt(self) -> str:
        # Read at render time so the prompt always follows NameStep, which owns the value.
        name = self.flow.get_step_state(NameStep, "name") or "the user"
        return prompt("dob.md", __file__, role=ROLE, user_name=name)

    @tool
    async def dob(self, args: BirthDateArgs) -> Transition:
        """Record a date of birth; read numeric slash dates as month/day/year."""
        # The schema only bounds each number; whether the date exists is decided here.
        try:
            born = check_birth_date(args.year, args.month, args.day)
        except InvalidInput as exc:
            return stay(f"{exc} Ask for a valid date of birth in M/D/YYYY format.")
        self.save_state({"year": born.year, "month": born.month, "day": born.day})
        return go(AddressStep)


class AddressStep(ExitOnRequest, Step):
    """Collects the mailing address, parsed in code, then closes the session."""

    def get_prompt(self) -> str:
        return prompt("address.md", __file__, role=ROLE)

    @tool
    async def address(self, args: AddressArgs) -> Transition:
        """Record the user's mailing address"""
        try:
            parsed = parse_address(args.address)
        except InvalidInput as exc:
            return stay(f"{exc} Ask for the street, city, two-letter state and ZIP code.")
        # Keep the parsed parts, not the raw text, so every reader gets the same split.
        self.save_state({"address": parsed.as_dict()})
        # The prompt and the state both land on TerminateSessionStep.
        return go(TerminateSessionStep).with_prompt(ADDRESS_END).with_state({"closedBy": "AddressStep"})

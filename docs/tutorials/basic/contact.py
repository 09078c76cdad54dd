"""ContactStep: two tools the model usually calls in one reply, handled as a pair."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from picoflow import Step, Transition, go, stay, tool, tools

from .common import role


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

    # --8<-- [start:pair]
    @tools(["save_email", "save_phone"])
    async def save_both(self, calls: list[dict[str, Any]]) -> Transition:
        # Called instead of the two handlers above when the model calls both tools in one reply.
        saved = {call["name"].removeprefix("save_"): next(iter(call["args"].values())) for call in calls}
        self.save_state(saved)
        return go("InsightsStep")
    # --8<-- [end:pair]

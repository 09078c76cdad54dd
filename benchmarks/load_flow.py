"""``LoadProfileFlow``: the profile collection for the load test, routed in code so any model reply fits any turn.

Under load one server process interleaves many sessions on one ``PICOFLOW_SCRIPT``, so which scripted reply
a session gets is a matter of timing. Here the model only talks: each step checks the user's message itself
(with the same validators as BasicFlow) and moves on when it is valid, so every session follows the same
path whatever the replies say. A session of ``benchmarks.collection.CONVERSATION`` makes 22 model calls
(20 turns plus the openers of the date-of-birth and address steps) and completes on its 20th turn.
"""

from __future__ import annotations

import re
from typing import Any

from benchmarks.collection import ADDRESS_PROMPT, CLOSING, DOB_PROMPT, NAME_PROMPT
from flows.basic.validators import InvalidInput, check_birth_date, check_full_name, parse_address
from picoflow import Flow, ModelSelection, Step, Transition, finish, go

NAMESPACE = "profile"
_NAME_SHAPE = re.compile(r"^[A-Z][a-z]+(?: [A-Z][a-z'-]+)+$")
_SLASH_DATE = re.compile(r"\b(\d{1,2})/(\d{1,2})/(\d{4})\b")


class _CheckedStep(Step):
    """Remembers this turn's user message so ``on_response`` can judge it after the model has answered."""

    async def run(self, user_message: str | None = None) -> Any:
        # Transient: the step that is only entered later in the turn sees no input and just talks.
        self.save_transient_state({"input": user_message or ""})
        return await super().run(user_message)

    async def on_response(self, result: Any) -> Any:
        text = self.get_transient_state("input") or ""
        if not text:
            return result
        try:
            return self.accept(text)
        except InvalidInput:
            return result

    def accept(self, text: str) -> Transition:
        raise NotImplementedError


class LoadNameStep(_CheckedStep):
    def get_prompt(self) -> str:
        return NAME_PROMPT

    def accept(self, text: str) -> Transition:
        if not _NAME_SHAPE.match(text.strip()):
            raise InvalidInput("not a first and last name")
        self.save_state({"name": check_full_name(text)})
        return go(LoadBirthDateStep)


class LoadBirthDateStep(_CheckedStep):
    def get_prompt(self) -> str:
        return DOB_PROMPT.format(name=self.flow.get_step_state(LoadNameStep, "name"))

    def accept(self, text: str) -> Transition:
        match = _SLASH_DATE.search(text)
        if match is None:
            raise InvalidInput("no M/D/YYYY date")
        month, day, year = (int(part) for part in match.groups())
        born = check_birth_date(year, month, day)
        self.save_state({"year": born.year, "month": born.month, "day": born.day})
        return go(LoadAddressStep)


class LoadAddressStep(_CheckedStep):
    def get_prompt(self) -> str:
        return ADDRESS_PROMPT

    def accept(self, text: str) -> Transition:
        self.save_state({"address": parse_address(text).as_dict()})
        return finish(CLOSING.format(name=self.flow.get_step_state(LoadNameStep, "name")))


class LoadProfileFlow(Flow):
    """Name, date of birth and address; every model call is served by ``PICOFLOW_SCRIPT``."""

    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="openai", name="gpt-4o-mini")

    def define_steps(self) -> list[Step]:
        return [
            LoadNameStep(self).use_memory(NAMESPACE),
            LoadBirthDateStep(self).use_memory(NAMESPACE),
            LoadAddressStep(self).use_memory(NAMESPACE),
        ]

"""AgeGateStep: a rule kept in code, run without a model."""

from __future__ import annotations

from datetime import date

from picoflow import LogicStep, Transition, finish, go

from .birthday import BirthdayStep
from .common import today
from .validators import age_on

# The youngest age the service accepts.
MINIMUM_AGE = 13


class AgeGateStep(LogicStep):
    """Route on the user's age in code: no model call, no prompt, the same answer every time."""

    async def run_logic(self) -> Transition:
        birthday = date.fromisoformat(self.flow.get_step_state(BirthdayStep, "birthday"))
        age = age_on(birthday, today(self))
        self.save_state({"age": age})
        if age < MINIMUM_AGE:
            return finish(f"Sorry, members must be at least {MINIMUM_AGE}. Thanks for stopping by!")
        return go("FavoritesStep")

"""What every step of ProfileFlow shares: the date it counts from and the opening of its prompts."""

from __future__ import annotations

from datetime import date

from picoflow import Step, prompt


def today(step: Step) -> date:
    """The session's ``config.today`` when it has one (tests pin the date), else the real date."""
    pinned = step.get_context("config.today")
    return date.fromisoformat(pinned) if pinned else date.today()


def role(step: Step) -> str:
    """The shared opening of every prompt, filled with the brand from the session's config."""
    return prompt("prompts/role.md", __file__, brand=step.get_context("config.brand") or "PicoFlow").strip()

"""FavoritesStep: two favourites gathered through structured answers, without tools."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from picoflow import Step, go, prompt
from picoflow.messages import HumanMessageEx

from .common import role


# --8<-- [start:schema]
class Favorites(BaseModel):
    """What the model answers in FavoritesStep: the facts so far and its next sentence."""

    color: str | None = Field(None, description="The favourite colour, once the user said it")
    season: Literal["spring", "summer", "autumn", "winter"] | None = Field(
        None, description="The favourite season, once the user said it"
    )
    reply: str = Field(description="The next thing to say to the user")
# --8<-- [end:schema]


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
            return go("ContactStep")
        return result.reply

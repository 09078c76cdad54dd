"""FavoritesStep: a tool-less step that routes from ``on_response`` once the reply parses."""

from __future__ import annotations

import json
from typing import Any, Literal

from langchain_core.messages import BaseMessage
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from flows.basic.common import parse_json_object
from flows.basic.profile import NameStep
from picoflow import Step, Transition, go
from picoflow.authoring.prompts import load_prompt, prompt
from picoflow.messages import HumanMessageEx

PROMPT = prompt("favorites.md", __file__, question_schema=load_prompt("favorites.json", __file__).strip())


class Favorites(BaseModel):
    """The three favourites, under the field names the prompt's schema uses."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid")

    color: Literal["red", "blue", "white"] = Field(alias="favoriteColor")
    movie: str = Field(alias="favoriteMovie", min_length=1)
    season: Literal["spring", "summer", "autumn", "winter"] = Field(alias="favoriteSeason")


class FavoritesStep(Step):
    """Asks for a colour, a movie and a season, and moves to NameStep when the model answers with them as JSON."""

    def on_crossing(self, message: BaseMessage | None, prior_step: str | None = None) -> BaseMessage | None:
        # The user's last message was consumed by WeatherStep; give the model a turn of its own to open with.
        return HumanMessageEx(self, "Hi")

    def get_prompt(self) -> str:
        return PROMPT

    async def on_response(self, result: Any) -> str | Transition:
        data = result if isinstance(result, dict) else parse_json_object(result)
        if data is not None:
            try:
                favorites = Favorites.model_validate(data)
            except ValidationError:
                favorites = None
            if favorites is not None:
                self.save_state({"favorites": favorites.model_dump(by_alias=True)})
                return go(NameStep)
        # Prose (usually a follow-up question) goes to the user and this step keeps the next turn.
        return result if isinstance(result, str) else json.dumps(result)

"""HotelFlow's stages: collect criteria, present priced results, compare them, book one."""

from __future__ import annotations

import json
import os
from datetime import date
from typing import Any, Literal

from langchain_core.messages import HumanMessage
from pydantic import BaseModel, Field

from picoflow import Flow, Step, TerminateSessionStep, Transition, direct, direct_to, go, stay, tool
from picoflow.authoring.prompts import prompt
from picoflow.mcp import MCPUnavailableError
from picoflow.messages import HumanMessageEx

from . import booking, chart
from .contract import (
    AMENITIES,
    ROOM_TYPES,
    SERVER,
    TOOL,
    Budget,
    MaxDistanceMiles,
    SearchHotelsRequest,
    SearchHotelsResult,
    stay_nights,
)

Amenity = Literal[AMENITIES]  # type: ignore[valid-type]
RoomType = Literal[ROOM_TYPES]  # type: ignore[valid-type]
PICK_TWO = "Ask the user for at least two different hotels from the list to compare."
UNAVAILABLE = "The hotel search service is unavailable right now. Ask the user to try the search again in a moment."


class SearchCriteria(BaseModel):
    start: str = Field(description="Check-in date, YYYY-MM-DD")
    end: str = Field(description="Check-out date, YYYY-MM-DD")
    room_type: RoomType
    amenities: list[Amenity] = Field(default_factory=list, description="Amenities every result must offer")
    min_price: float | None = Field(None, description="Lowest acceptable nightly price in USD")
    max_price: float | None = Field(None, description="Highest acceptable nightly price in USD")
    max_airport_miles: float | None = Field(None, description="Maximum distance to the airport")
    max_city_center_miles: float | None = Field(None, description="Maximum distance to the city center")


class CaptureChoices(BaseModel):
    criteria: SearchCriteria


class ChosenHotel(BaseModel):
    hotel: str = Field(description="The chosen hotel's number in the list, or its name")


class HotelRefs(BaseModel):
    hotels: list[str] = Field(description="Numbers in the result list, or names, of the hotels")


class Comparison(HotelRefs):
    feature: str = Field(description=f"One of: {', '.join(chart.FEATURES)}")


class NoArgs(BaseModel):
    pass


async def search(flow: Flow, criteria: dict[str, Any]) -> list[dict[str, Any]]:
    """Priced matches from the hotel-pricing MCP server, as ``{"hotel", "nights", "prices", "total"}`` entries.

    Each entry also has ``amenities``, ``room_types`` and ``distance``: the server's optional details, None when
    it left them out. Nothing else is known of a hotel, so any server answering the contract will do.
    """
    request = SearchHotelsRequest(
        startDate=criteria["start"],
        endDate=criteria["end"],
        amenities=criteria.get("amenities") or [],
        roomTypes=[criteria["room_type"]],
        budget=Budget(min=criteria.get("min_price"), max=criteria.get("max_price")),
        maxDistanceMiles=MaxDistanceMiles(
            airport=criteria.get("max_airport_miles"), cityCenter=criteria.get("max_city_center_miles")
        ),
    )
    result = await flow.call_mcp_tool(SERVER, TOOL, request, result_model=SearchHotelsResult)
    nights = [night.isoformat() for night in stay_nights(date.fromisoformat(request.startDate),
                                                          date.fromisoformat(request.endDate))]
    found = []
    for hotel in result.hotels:
        prices = booking.nightly_prices(hotel.prices, len(nights))
        if prices is None:
            flow.logger.warn("hotel left out: its price list does not match the nights of the stay",
                             nights=len(nights), prices=len(hotel.prices))
            continue
        found.append({
            "hotel": hotel.hotelName,
            "nights": nights,
            "prices": prices,
            # The total of the nights charged, so the price table always sums to it.
            "total": round(sum(prices), 2),
            "amenities": hotel.amenities,
            "room_types": hotel.roomTypes,
            "distance": hotel.distanceMiles.model_dump() if hotel.distanceMiles else None,
        })
    return found


class HotelStep(Step):
    """A conversational stage: the shared persona, its own prompt file, and a way out."""

    prompt_file = ""
    #: Whether the prompt and tools read the search results (which a resumed session must fetch again).
    shows_results = False

    def prompt_values(self) -> dict[str, Any]:
        return {}

    def get_prompt(self) -> str:
        return prompt("role.md", __file__) + "\n\n" + prompt(self.prompt_file, __file__, **self.prompt_values())

    def forward(self, target: type[Step]) -> HumanMessageEx:
        """The user's latest words, attributed to ``target`` so that step acts on the same request."""
        text = next((m.content for m in reversed(self.get_memory()) if isinstance(m, HumanMessage)), "")
        return HumanMessageEx(target.id, str(text))

    def results(self) -> list[dict[str, Any]]:
        """The current search results: handed over by ExploreStep, or searched again when the session resumed."""
        return self.flow.require_step(PresentStep).get_transient_state("hotels") or []

    async def on_restore(self) -> None:
        # Results are derived from the criteria and never persisted: a resumed session searches again.
        criteria = self.flow.get_step_state(ExploreStep, "criteria")
        if self.shows_results and criteria:
            self.flow.save_transient_step_state(PresentStep, {"hotels": await search(self.flow, criteria)})

    def numbered(self, with_totals: bool) -> str:
        return "\n".join(
            f"{n}. {entry['hotel']}" + (f" - total {chart.money(entry['total'])}" if with_totals else "")
            for n, entry in enumerate(self.results(), 1)
        )

    def pick_to_compare(self, refs: list[str]) -> list[dict[str, Any]] | None:
        picked = booking.pick(self.results(), refs)
        return picked if picked and len(picked) > 1 else None

    @tool
    async def terminate_session(self, args: dict[str, Any]) -> Transition:
        return go(TerminateSessionStep).with_prompt(args["prompt"])


class ExploreStep(HotelStep):
    """Collects the search criteria (owned here, as ``criteria``) and runs the search."""

    prompt_file = "explore.md"

    def today(self) -> date:
        # Injectable so scripted runs and tests do not depend on the wall clock.
        pinned = self.get_context("config.currentDate") or os.environ.get("HOTEL_FLOW_CURRENT_DATE")
        return date.fromisoformat(str(pinned)[:10]) if pinned else date.today()

    def prompt_values(self) -> dict[str, Any]:
        return {
            "today": self.today().isoformat(),
            "room_types": ", ".join(ROOM_TYPES),
            "amenities": ", ".join(AMENITIES),
        }

    def get_turn_notes(self) -> str:
        # Saved criteria follow the conversation, so the prompt and history before them stay a cacheable prefix.
        criteria = json.dumps(self.get_state("criteria") or {})
        return f"Criteria saved from an earlier search (empty on the first search): {criteria}"

    @tool
    async def capture_choices(self, args: CaptureChoices) -> Transition:
        """Search hotels with the complete criteria, once the user asks to search."""
        problem = booking.date_problem(args.criteria.start, args.criteria.end, self.today())
        if problem:
            return stay(problem)
        criteria = args.criteria.model_dump(mode="json")
        self.save_state({"criteria": criteria})
        try:
            found = await search(self.flow, criteria)
        except MCPUnavailableError:
            return stay(UNAVAILABLE)
        if not found:
            return stay("No hotel matches these criteria. Ask the user which criterion to relax.")
        # Results are derived from the criteria: hand them over for this request only, never persist them.
        self.flow.save_transient_step_state(PresentStep, {"hotels": found})
        return go(PresentStep)


class PresentStep(HotelStep):
    """Lists the priced results and routes to booking, a new search, or a comparison."""

    prompt_file = "present.md"
    shows_results = True

    async def on_enter(self) -> None:
        # Each visit presents from state; an earlier visit's list would only mislead the model.
        self.erase_memory()

    def on_crossing(self, message: Any, prior_step: str | None = None) -> HumanMessageEx:
        return HumanMessageEx(self, "Which hotels can I choose from?")

    def prompt_values(self) -> dict[str, Any]:
        return {"hotels": self.numbered(with_totals=True)}

    # A booking is made outside the session: an effect runs once per turn, however often the turn is retried.
    @tool(effect=True)
    async def chosen_hotel(self, args: ChosenHotel) -> Transition:
        """Book the hotel the user chose."""
        picked = booking.pick(self.results(), [args.hotel])
        if picked is None:
            return stay(f"'{args.hotel}' is not in the list. Ask the user to choose 1 to {len(self.results())}.")
        entry, criteria = picked[0], self.flow.get_step_state(ExploreStep, "criteria")
        booked = {
            "hotel": entry["hotel"],
            "confirmation": booking.confirmation_number(self.flow.get_session_id(), entry["hotel"]),
            "room_type": criteria["room_type"],
            "start": criteria["start"],
            "end": criteria["end"],
            "total": entry["total"],
        }
        self.save_state({"booking": booked})
        # The confirmation is a fact, so code words it; the session ends without another model call.
        message = prompt("booked.md", __file__, **{**booked, "total": chart.money(entry["total"])})
        return direct_to(TerminateSessionStep, message)

    @tool
    async def search_again(self, args: NoArgs) -> Transition:
        """Change the criteria and search again."""
        return go(ExploreStep).with_message(self.forward(ExploreStep))

    @tool
    async def go_compare(self, args: HotelRefs) -> Transition:
        """Compare two or more listed hotels."""
        picked = self.pick_to_compare(args.hotels)
        if picked is None:
            return stay(PICK_TWO)
        self.flow.save_step_state(CompareStep, {"selected": [entry["hotel"] for entry in picked]})
        return go(CompareStep).with_message(self.forward(CompareStep))


class CompareStep(HotelStep):
    """Renders comparison tables in code and returns them verbatim, with no second model call."""

    prompt_file = "compare.md"
    shows_results = True

    async def on_enter(self) -> None:
        self.erase_memory()

    def prompt_values(self) -> dict[str, Any]:
        return {"hotels": self.numbered(with_totals=False), "features": ", ".join(chart.FEATURES)}

    def get_turn_notes(self) -> str:
        # Each comparison changes the selection: it follows the conversation, outside the cached prefix.
        return f"Hotels compared most recently: {', '.join(self.get_state('selected') or []) or 'none yet'}"

    @tool
    async def generate_comparison(self, args: Comparison) -> Transition:
        """Compare hotels on one feature."""
        feature = args.feature.strip().lower()
        if feature not in chart.FEATURES:
            return stay(f"'{args.feature}' cannot be compared. Offer these features: {', '.join(chart.FEATURES)}.")
        picked = self.pick_to_compare(args.hotels)
        if picked is None:
            return stay(PICK_TWO)
        self.save_state({"selected": [entry["hotel"] for entry in picked]})
        criteria = self.flow.get_step_state(ExploreStep, "criteria")
        return direct(f"{chart.comparison(feature, picked, criteria)}\n\nAnother comparison, or ready to book?")

    @tool
    async def resume_booking(self, args: NoArgs) -> Transition:
        """Go back to the result list to book."""
        return go(PresentStep)

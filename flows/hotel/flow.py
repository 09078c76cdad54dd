"""HotelFlow: book a Portland hotel in four stages (explore, present, compare, book)."""

from __future__ import annotations

from picoflow import Flow, ModelSelection, Step, TerminateSessionStep
from picoflow.mcp import MCPServerSpec
from picoflow.mcp.environment import server_from_env

from .contract import SERVER
from .steps import CompareStep, ExploreStep, PresentStep

MODEL = ModelSelection(provider="openai", name="gpt-4o")
#: Seconds the hotel search may take, connecting included (a bundled stdio server starts within it).
SEARCH_TIMEOUT_SECONDS = 10.0
#: Bytes a search answer may take: every hotel of a city with its details fits many times over, and the answer
#: goes into the prompt of the next steps.
SEARCH_MAX_BYTES = 262_144


class HotelFlow(Flow):
    """Collect criteria, present priced results, compare them, and book one."""

    def __init__(self) -> None:
        super().__init__()
        # Criteria collection runs for many short turns: fold its older history into a rolling summary.
        self.get_memory().set_summary_model(MODEL).set_summary_config(min_messages=8, recent_messages=4).enable_summary(
            "hotel-explore"
        )

    def config_model(self) -> ModelSelection:
        return MODEL

    def define_mcp_servers(self) -> list[MCPServerSpec]:
        # HOTEL_MCP_URL (streamable HTTP), else HOTEL_MCP_COMMAND (stdio), else the package's own server over stdio.
        return [server_from_env(SERVER, "HOTEL_MCP", f"{__package__}.mcp_server", timeout=SEARCH_TIMEOUT_SECONDS,
                                max_result_bytes=SEARCH_MAX_BYTES)]

    def define_steps(self) -> list[Step]:
        # ExploreStep comes first, so it is where a new session starts.
        return [
            ExploreStep(self).use_memory("hotel-explore"),
            PresentStep(self),
            CompareStep(self),
            TerminateSessionStep(self).use_memory("end"),
        ]

"""What each registered flow's tools are for, as the chat page shows a call waiting for a person's decision.

A waiting call names its tool; the person deciding should read what the tool does, so the page asks for the
descriptions the model itself is given. They are read off the flows the way registration checks them: each flow
built without a request's config and without ``init()``, its steps and tools collected. A flow that cannot be
built that way (its tools depend on the request) is left out, and the page shows the tool's name alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from picoflow.authoring.flow import Flow
from picoflow.authoring.step_registry import collect_steps

#: Flow name -> tool name -> the tool's description.
ToolCatalog = dict[str, dict[str, str]]
#: Answers the catalog of the flows a server runs.
CatalogReader = Callable[[], ToolCatalog]


def tool_catalog(flows: Iterable[type[Flow]]) -> ToolCatalog:
    """The description of every tool of ``flows``, by flow name (``Flow.id``) and tool name."""
    catalog: ToolCatalog = {}
    for flow_cls in flows:
        try:
            flow = flow_cls()
            collect_steps(flow)
        except Exception:  # noqa: BLE001 - flow code that needs a request: its calls are shown by tool name
            continue
        catalog[flow_cls.id] = {name: spec.description for name, spec in flow.run_context.tools.items()}
    return catalog


def cached(read: CatalogReader) -> CatalogReader:
    """``read``, run once: a running server's flows and their tools do not change."""
    kept: list[ToolCatalog] = []

    def answer() -> ToolCatalog:
        if not kept:
            kept.append(read())
        return kept[0]

    return answer

"""``POST /mcp``: the flows as an MCP server (``picoflow.protocols.mcp_server``) on the Lambda runtime.

The MCP SDK's server is an ASGI application; Mangum, a maintained ASGI adapter for Lambda, hands it the API
Gateway event and turns its answer back into a proxy response (``picoflow.aws.asgi``). The server is stateless
and answers JSON, so one request is one invocation (a JSON-RPC message in, its answer out) and any environment can
answer the next one.
The turns themselves run on the container's engine loop, like every other route's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from picoflow.aws.asgi import answer_asgi
from picoflow.aws.deadline import InvocationContext, turn_deadline
from picoflow.aws.runtime import get_runtime
from picoflow.protocols.mcp_server import build_server, http_app

T = TypeVar("T")


def answer_mcp(event: dict[str, Any], context: InvocationContext | None, *, caller: str | None,
               request_id: str) -> dict[str, Any]:
    """The proxy response to one ``POST /mcp`` event (API Gateway v2) for ``caller``."""
    runtime = get_runtime()

    def submit(coroutine: Coroutine[Any, Any, T]) -> asyncio.Future[T]:
        # The MCP app runs on Mangum's loop; sessions and models are the engine's, on the runtime's loop.
        return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coroutine, runtime.loop))

    server = build_server(runtime.engine, caller=caller, submit=submit, deadline=turn_deadline(context),
                          request_id=request_id)
    # Each request builds its server, whose session manager runs once: Mangum runs the app's lifespan around it.
    return answer_asgi(http_app(server), event, context, lifespan="auto")

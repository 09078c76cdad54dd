"""``/a2a/{flowName}``: each flow as an A2A agent (``picoflow.protocols.a2a``) on the Lambda runtime.

The A2A SDK's routes are a Starlette application; Mangum hands it the API Gateway event, as for ``POST /mcp``
(``picoflow.aws.asgi``). The
agent card names the JSON-RPC URL the request came through, and declares a bearer JWT when the API's authorizer
requires one (``JWT_ISSUER`` set, as the template sets it with ``JwtIssuer``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

from picoflow.aws.asgi import answer_asgi
from picoflow.aws.deadline import InvocationContext, turn_deadline
from picoflow.aws.runtime import get_runtime
from picoflow.protocols.a2a import A2A_PREFIX, http_app

T = TypeVar("T")
#: Set (to the issuer) when the API requires a JWT: the agent cards then declare the bearer scheme.
ISSUER_VARIABLE = "JWT_ISSUER"


def base_url(event: Mapping[str, Any], flow_name: str) -> str:
    """The agent's JSON-RPC URL as the client reached it (scheme, host and the route's path)."""
    headers = {str(name).lower(): value for name, value in (event.get("headers") or {}).items()}
    host = headers.get("host") or (event.get("requestContext") or {}).get("domainName") or "localhost"
    scheme = headers.get("x-forwarded-proto") or "https"
    return f"{scheme}://{host}{A2A_PREFIX}{flow_name}"


def answer_a2a(event: dict[str, Any], flow_name: str, context: InvocationContext | None, *, caller: str | None,
               request_id: str) -> dict[str, Any]:
    """The proxy response to one request of ``flow_name``'s agent (its card or a JSON-RPC call)."""
    runtime = get_runtime()

    def submit(coroutine: Coroutine[Any, Any, T]) -> asyncio.Future[T]:
        # The A2A app runs on Mangum's loop; sessions and models are the engine's, on the runtime's loop.
        return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coroutine, runtime.loop))

    app = http_app(runtime.engine, flow_name, base_url(event, flow_name),
                   bearer=bool(os.environ.get(ISSUER_VARIABLE)), caller=caller, submit=submit,
                   deadline=turn_deadline(context), request_id=request_id)
    return answer_asgi(app, event, context)

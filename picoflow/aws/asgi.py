"""ASGI applications (the MCP and A2A SDKs' servers) answering API Gateway events through Mangum.

Mangum runs an application on the event loop of the thread that calls it, and an SDK may leave work on that loop
after an answer. On Lambda every invocation comes on the same thread;
``picoflow serve`` invokes the handler on a new thread per request, whose loop would be dropped with that work
pending. So every application runs on one long-lived thread, as on Lambda.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

from mangum import Mangum

from picoflow.aws.deadline import InvocationContext

_ASGI_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="picoflow-asgi")


def answer_asgi(app: Any, event: dict[str, Any], context: InvocationContext | None, *,
                lifespan: Literal["auto", "on", "off"] = "off") -> dict[str, Any]:
    """The proxy response of ``app`` to one API Gateway v2 ``event``, run on the ASGI thread."""

    def answer() -> dict[str, Any]:
        # Built on the ASGI thread: Mangum sets up the event loop of the thread that builds it.
        response: dict[str, Any] = Mangum(app, lifespan=lifespan)(event, context)  # type: ignore[arg-type]
        return response

    return _ASGI_THREAD.submit(answer).result()

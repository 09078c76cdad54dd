"""The MCP sessions an engine holds: one live session per server declaration and event loop, held open by a task
of its own, reused by later turns, reconnected once when a reused one turns out to be gone; every operation
bounded by the server's timeout and the turn's deadline."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel

from picoflow.deadline import time_left
from picoflow.logger import library_log
from picoflow.mcp.specs import DEADLINE_RESERVE_SECONDS, MCPServerSpec, MCPToolResult, MCPUnavailableError
from picoflow.mcp.transport import ReadLimit, bounded_http_client, bounded_stdio
from picoflow.telemetry import trace_only_context

if TYPE_CHECKING:
    from mcp.client import Client
    from mcp.types import ListToolsResult

T = TypeVar("T")


class _Lost(Exception):
    """The session ended under a call (its connection closed, or its holding task stopped)."""


class _Connection:
    """One live MCP session, held open by a task of its own so that every turn's task can use it."""

    def __init__(self, spec: MCPServerSpec, headers: Mapping[str, str]) -> None:
        self.spec = spec
        self.headers = headers
        self.client: Client | None = None
        self.tools: dict[str, Any] | None = None
        self.limit = ReadLimit(spec.max_result_bytes)
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        # A fresh context: the session outlives the turn that opened it and must not carry its deadline. It keeps the
        # trace context, so the SDK's server/discover span nests under the span that opened the session.
        self.task = asyncio.create_task(self._hold(), name=f"picoflow-mcp-{spec.name}", context=trace_only_context())

    async def _hold(self) -> None:
        try:
            async with contextlib.AsyncExitStack() as stack:
                self.client = await _open_client(self.spec, self.headers, self.limit, stack)
                self._ready.set()
                await self._stop.wait()
        except Exception as exc:  # noqa: BLE001 - a failed or broken transport ends this session, nothing else
            library_log.info(
                "MCP session ended", extra={"mcpServer": self.spec.name, "errorType": type(exc).__name__}
            )
        finally:
            self.client = None
            self._ready.set()

    @property
    def alive(self) -> bool:
        return self.client is not None and not self.task.done()

    async def wait_ready(self, ends: float) -> None:
        try:
            await asyncio.wait_for(self._ready.wait(), _remaining(ends))
        except TimeoutError:
            raise MCPUnavailableError(self.spec.name, None, "timeout") from None
        if self.client is None:
            raise MCPUnavailableError(self.spec.name, None, "unreachable")

    async def run(self, operation: Callable[[Client], Awaitable[T]], ends: float) -> T:
        """``operation(client)`` bounded by ``ends``; ``_Lost`` when the session ends under it."""
        client = self.client
        if client is None:
            raise _Lost
        call = asyncio.ensure_future(operation(client))
        try:
            done, _ = await asyncio.wait({call, self.task}, timeout=_remaining(ends),
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not call.done():
                call.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await call
        if call in done:
            return _answer(call)
        if self.task in done:
            raise _Lost
        raise TimeoutError

    def close(self) -> None:
        """End the session in the background (a stopped subprocess must not hold up the turn)."""
        self.tools = None
        if self._ready.is_set():
            self._stop.set()
        else:
            self.task.cancel()


def _answer(call: asyncio.Future[T]) -> T:
    from mcp.shared.exceptions import MCPError
    from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT

    try:
        return call.result()
    except MCPError as exc:
        if exc.code == CONNECTION_CLOSED:
            raise _Lost from exc
        if exc.code == REQUEST_TIMEOUT:
            raise TimeoutError from exc
        raise
    except (OSError, EOFError) as exc:
        raise _Lost from exc
    except Exception as exc:
        # anyio reports a stream closed under a call with its own classes (ClosedResourceError and kin).
        if type(exc).__module__.startswith("anyio"):
            raise _Lost from exc
        raise


async def _open_client(spec: MCPServerSpec, headers: Mapping[str, str], limit: ReadLimit,
                       stack: contextlib.AsyncExitStack) -> Client:
    from mcp.client import Client

    if spec.url is not None:
        from mcp.client.streamable_http import streamable_http_client

        # Our own bound (the spec's timeout and the turn's deadline) applies to each call; the HTTP client's
        # limits only catch a connection that hangs for longer.
        http = await stack.enter_async_context(bounded_http_client(dict(headers), max(spec.timeout, 30.0), limit))
        # One SSE event can be no larger than the body that carries it, which the client bounds on its own.
        transport: Any = streamable_http_client(spec.url, http_client=http, max_sse_event_size=None)
    else:
        transport = bounded_stdio(spec, limit)
    return await stack.enter_async_context(Client(transport))


def _remaining(ends: float) -> float:
    return max(ends - time.monotonic(), 0.0)


async def _headers(spec: MCPServerSpec, ends: float) -> dict[str, str]:
    """``spec``'s headers, read off the event loop (SSM is a blocking call) within the operation's time."""
    try:
        return await asyncio.wait_for(asyncio.to_thread(spec.resolved_headers), _remaining(ends))
    except TimeoutError:
        raise MCPUnavailableError(spec.name, None, "timeout") from None
    except Exception as exc:  # noqa: BLE001 - any source failing (SSM, a callable) means the server cannot be reached
        # botocore's errors carry a code (ParameterNotFound, AccessDeniedException ...), never the value.
        response = getattr(exc, "response", None)
        code = response.get("Error", {}).get("Code") if isinstance(response, dict) else None
        library_log.warning(
            "MCP server headers could not be read",
            extra={"mcpServer": spec.name, "errorType": type(exc).__name__, "errorCode": code},
        )
        # Not chained: nothing a source said (a parameter's name or text) travels on with the failure.
        raise MCPUnavailableError(spec.name, None, "headers_unavailable") from None


def _budget(spec: MCPServerSpec, what: str) -> float:
    """When the operation must end: the server's timeout, or earlier when the turn's deadline comes first."""
    seconds = spec.timeout
    left = time_left(f"calling MCP server '{spec.name}' ({what})")
    if left is not None:
        seconds = min(seconds, left - DEADLINE_RESERVE_SECONDS)
    return time.monotonic() + seconds


def _describable(spec: MCPServerSpec, tool: Any) -> bool:
    """Whether ``tool``'s description and input schema fit ``spec.max_description_bytes`` (logged when not)."""
    size = len((tool.description or "").encode()) + len(json.dumps(tool.input_schema).encode())
    if size <= spec.max_description_bytes:
        return True
    library_log.warning("MCP tool left out: its description is larger than max_description_bytes",
                        extra={"mcpServer": spec.name, "mcpTool": tool.name, "bytes": size,
                               "maxDescriptionBytes": spec.max_description_bytes})
    return False


async def _tools_page(client: Client, cursor: str | None) -> ListToolsResult:
    return await client.list_tools(cursor=cursor)


def _text(content: Sequence[Any]) -> str:
    parts = []
    for block in content:
        text = getattr(block, "text", None)
        parts.append(text if isinstance(text, str) else f"[{getattr(block, 'type', 'non-text')} content omitted]")
    return "\n".join(parts)


REPORTED_LIMIT = 1_024
"""Problems remembered as already logged; past it the memory starts over."""


class MCPSessions:
    """The MCP client state one engine owns: its live sessions (and the locks that open them) per event loop, the
    servers kept out of offers for a while after their tools could not be listed, and what was already logged
    about left-out tools. ``FlowEngine`` creates one and closes it in ``FlowEngine.close``."""

    def __init__(self) -> None:
        # Sessions belong to the event loop that opened them; a loop that is gone takes its entries with it.
        self._pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[Any, ...], _Connection]] = (
            weakref.WeakKeyDictionary()
        )
        self._locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[Any, ...], asyncio.Lock]] = (
            weakref.WeakKeyDictionary()
        )
        self._offer_pauses: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[Any, ...], float]] = (
            weakref.WeakKeyDictionary()
        )
        #: What was logged about left-out tools, so a listing read at every model call logs each problem once.
        self._reported: set[tuple[Any, ...]] = set()

    def offer_paused(self, spec: MCPServerSpec) -> bool:
        """Whether ``spec``'s server is kept out of offers for now (its tools could not be listed lately)."""
        return self._offer_pauses.get(asyncio.get_running_loop(), {}).get(spec.connection_key(), 0.0) > time.monotonic()

    def pause_offers(self, spec: MCPServerSpec, seconds: float | None) -> None:
        """Keep ``spec``'s server out of offers for ``seconds``; None lets it back in at once."""
        pauses = self._offer_pauses.setdefault(asyncio.get_running_loop(), {})
        if seconds is None:
            pauses.pop(spec.connection_key(), None)
        else:
            pauses[spec.connection_key()] = time.monotonic() + seconds

    def first_report(self, key: tuple[Any, ...]) -> bool:
        """True the first time ``key`` (a problem with a server's tool) is reported, within a bounded memory."""
        if key in self._reported:
            return False
        if len(self._reported) >= REPORTED_LIMIT:
            self._reported.clear()
        self._reported.add(key)
        return True

    async def list_tools(self, spec: MCPServerSpec) -> dict[str, Any]:
        """The server's tools by name (the SDK's ``Tool`` objects), listed once per session.

        A list longer than ``spec.max_tools`` is refused (``too_many_tools``); a tool whose description and input
        schema pass ``spec.max_description_bytes`` is left out of it (logged).
        """

        async def listing(connection: _Connection, ends: float) -> dict[str, Any]:
            if connection.tools is None:
                found: dict[str, Any] = {}
                cursor: str | None = None
                while True:
                    page = await connection.run(functools.partial(_tools_page, cursor=cursor), ends)
                    found.update({tool.name: tool for tool in page.tools})
                    if len(found) > spec.max_tools:
                        library_log.warning("MCP server lists more tools than max_tools; none is offered",
                                            extra={"mcpServer": spec.name, "maxTools": spec.max_tools})
                        raise MCPUnavailableError(spec.name, None, "too_many_tools")
                    cursor = page.next_cursor
                    if cursor is None:
                        break
                connection.tools = {name: tool for name, tool in found.items() if _describable(spec, tool)}
            return connection.tools

        return await self._on_session(spec, None, "listing its tools", listing)

    async def call_tool(
        self, spec: MCPServerSpec, tool: str, arguments: Mapping[str, Any] | BaseModel | None = None
    ) -> MCPToolResult:
        """Call ``tool`` on the server; ``MCPUnavailableError`` for ``isError``, an unreachable server or a timeout."""
        args = arguments.model_dump(mode="json") if isinstance(arguments, BaseModel) else dict(arguments or {})

        async def calling(connection: _Connection, ends: float) -> Any:
            return await connection.run(
                lambda client: client.call_tool(tool, args, read_timeout_seconds=_remaining(ends) or None), ends
            )

        started = time.monotonic()
        result = await self._on_session(spec, tool, f"tool '{tool}'", calling)
        if result.is_error:
            library_log.warning("MCP tool answered with an error", extra={"mcpServer": spec.name, "mcpTool": tool})
            raise MCPUnavailableError(spec.name, tool, "tool_error")
        library_log.debug(
            "MCP tool called",
            extra={"mcpServer": spec.name, "mcpTool": tool, "elapsedMs": round((time.monotonic() - started) * 1000)},
        )
        return MCPToolResult(spec.name, tool, args, structured=result.structured_content, text=_text(result.content))

    async def close(self) -> None:
        """Close this event loop's sessions (stdio servers exit); the next use connects again."""
        pool = self._pools.pop(asyncio.get_running_loop(), {})
        for connection in pool.values():
            connection.close()
        tasks = [connection.task for connection in pool.values()]
        if tasks:
            await asyncio.wait(tasks, timeout=5)

    async def _connection(self, spec: MCPServerSpec, ends: float) -> tuple[_Connection, bool]:
        """The loop's session for ``spec`` and whether it was opened just now (sessions belong to one event loop)."""
        loop = asyncio.get_running_loop()
        pool = self._pools.setdefault(loop, {})
        key = spec.connection_key()
        connection = pool.get(key)
        if connection is not None and connection.alive:
            return connection, False
        lock = self._locks.setdefault(loop, {}).setdefault(key, asyncio.Lock())
        try:
            await asyncio.wait_for(lock.acquire(), _remaining(ends))
        except TimeoutError:
            raise MCPUnavailableError(spec.name, None, "timeout") from None
        try:
            connection = pool.get(key)
            if connection is not None and connection.alive:
                return connection, False
            if connection is not None:
                connection.close()
            headers = await _headers(spec, ends) if spec.url is not None else {}
            connection = pool[key] = _Connection(spec, headers)
            try:
                await connection.wait_ready(ends)
            except BaseException:
                self._discard(connection)
                raise
            library_log.info("MCP session opened", extra={"mcpServer": spec.name, "mcpTransport": spec.transport})
            return connection, True
        finally:
            lock.release()

    def _discard(self, connection: _Connection) -> None:
        pool = self._pools.get(asyncio.get_running_loop(), {})
        key = connection.spec.connection_key()
        if pool.get(key) is connection:
            del pool[key]
        connection.close()

    async def _on_session(
        self, spec: MCPServerSpec, tool: str | None, what: str, operation: Callable[[_Connection, float], Awaitable[T]]
    ) -> T:
        """Run ``operation`` on the shared session, reconnecting once when a reused session turns out to be gone."""
        ends = _budget(spec, what)
        connection, fresh = await self._connection(spec, ends)
        for attempt in (1, 2):
            try:
                return await operation(connection, ends)
            except Exception as exc:  # noqa: BLE001 - sorted below into the reasons a caller is told
                failure = exc
            if isinstance(failure, (_Lost, TimeoutError)):
                # A session that ended, or whose server let a call time out (it may be stuck), is not used again.
                self._discard(connection)
            # An answer refused for its size fails as such, whatever shape the transport gave the failure.
            if connection.limit.take():
                raise MCPUnavailableError(spec.name, tool, "too_large") from None
            if isinstance(failure, MCPUnavailableError):
                raise failure
            if isinstance(failure, TimeoutError):
                raise MCPUnavailableError(spec.name, tool, "timeout") from None
            if not isinstance(failure, _Lost):
                library_log.warning("MCP request failed", extra={
                    "mcpServer": spec.name, "mcpTool": tool, "errorType": type(failure).__name__,
                })
                raise MCPUnavailableError(spec.name, tool, "protocol_error") from failure
            if fresh or attempt == 2:
                raise MCPUnavailableError(spec.name, tool, "unreachable") from None
            library_log.info("MCP session went stale; reconnecting once", extra={"mcpServer": spec.name})
            connection, fresh = await self._connection(spec, ends)
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

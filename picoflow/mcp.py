"""Tools from MCP servers, on the official ``mcp`` SDK: declarations, shared sessions, bounded calls, tool offers.

A flow declares its servers once (``Flow.define_mcp_servers``) as ``MCPServerSpec.http(...)`` (streamable HTTP,
the deployed case) or ``MCPServerSpec.stdio(...)`` (a local subprocess). Nothing connects until a step or a
handler needs a server; the session then stays open, held by a task of its own on the running event loop, and
later turns on that loop reuse it. A call over a reused session that finds it gone reconnects once.

Every call is bounded by the server's timeout and by the turn's deadline. A tool error (``isError``), an
unreachable server and a timeout all raise ``MCPUnavailableError``: a handler may catch it; otherwise the turn
fails as a transient outage (code ``MCP_UNAVAILABLE``, 503, session unchanged). Nothing the server says, nor its
URL or headers, goes into the error's message or the log.

An HTTP server's headers come from the environment or from SSM parameters (decrypted, read at the first connect
and kept for the container's life), or from a callable; they are never logged.

The SDK is imported only when a server is first used, so flows without MCP never load it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from picoflow.deadline import time_left
from picoflow.errors import PicoFlowError
from picoflow.logger import library_log
from picoflow.mcp_transport import ReadLimit, bounded_http_client, bounded_stdio
from picoflow.models.parameters import secure_parameter
from picoflow.telemetry import trace_only_context

if TYPE_CHECKING:
    from mcp.client import Client
    from mcp.types import ListToolsResult

#: Seconds a server gets for one operation (connecting included) unless its declaration says otherwise.
DEFAULT_TIMEOUT_SECONDS = 10.0
#: A call gives up this long before the turn's deadline, so the turn can still answer in time.
DEADLINE_RESERVE_SECONDS = 0.25
#: Characters of a tool result the model sees; the rest is cut and marked, keeping the session small.
DEFAULT_MAX_RESULT_CHARS = 8_000
#: Bytes of one message a server may send (a tool's result, a page of its tool list); a larger one is refused.
DEFAULT_MAX_RESULT_BYTES = 1_048_576
#: Tools a server may list; a longer list is refused (OpenAI accepts at most 128 tools per request).
DEFAULT_MAX_TOOLS = 128
#: Bytes of one tool's description as the model would get it (its text and input schema, as JSON).
DEFAULT_MAX_DESCRIPTION_BYTES = 8_192
#: Seconds a server whose tools could not be listed stays out of steps' offers before it is asked again.
OFFER_RETRY_SECONDS = 10.0
#: What the model reads when an offered tool's server fails: a fixed sentence, never the server's words.
UNAVAILABLE_TOOL_FEEDBACK = (
    "The service behind this tool is unavailable right now. Tell the user it could not be reached "
    "and that they can try again shortly; do not call it again in this reply."
)

Reason = Literal[
    "tool_error", "unreachable", "timeout", "protocol_error", "invalid_result", "unknown_tool", "headers_unavailable",
    "too_large", "too_many_tools",
]
M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


class MCPUnavailableError(PicoFlowError):
    """An MCP call failed: the tool answered ``isError``, or the server was unreachable, too slow or out of contract.

    Transient for the turn (the session is left unchanged, the answer is a retryable 503). The message names the
    declared server, the tool and the reason only, never anything the server sent.
    """

    code = "MCP_UNAVAILABLE"
    status_code = 503

    def __init__(self, server: str, tool: str | None, reason: Reason) -> None:
        target = f"tool '{tool}' of MCP server '{server}'" if tool else f"MCP server '{server}'"
        super().__init__(f"The {target} is unavailable ({reason}).")
        self.server = server
        self.tool = tool
        self.reason: Reason = reason


class MCPServerSpec(BaseModel):
    """One MCP server a flow uses: its name, its transport and where to reach it, its timeout and its caps.

    Build it with :meth:`http` or :meth:`stdio`. Header values never sit in code: they are read when connecting,
    from the environment variables named in ``headers_from_env``, from the SSM parameters named in
    ``headers_from_ssm`` (decrypted, kept for ``PICOFLOW_PARAMETER_MAX_AGE`` seconds), or from the ``headers`` callable.

    The caps bound what the server can make the process read and the model receive: ``max_result_bytes`` (each
    message, counted while it arrives), ``max_tools`` (the length of its tool list) and ``max_description_bytes``
    (each tool's description and input schema; a tool over it is left out of every offer).
    """

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    name: str = Field(min_length=1)
    url: str | None = None
    command: str | None = None
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None
    #: Header name -> environment variable holding its value.
    headers_from_env: tuple[tuple[str, str], ...] = ()
    #: Header name -> SSM parameter (a SecureString, say) holding its value.
    headers_from_ssm: tuple[tuple[str, str], ...] = ()
    #: Extra headers computed when connecting (any other source of secrets), never logged.
    headers: Callable[[], Mapping[str, str]] | None = Field(default=None, exclude=True)
    timeout: float = Field(default=DEFAULT_TIMEOUT_SECONDS, gt=0)
    #: Variables of the process's environment a stdio server also gets (beside the SDK's minimal set and ``env``).
    inherit_env: tuple[str, ...] = ()
    max_result_bytes: int = Field(default=DEFAULT_MAX_RESULT_BYTES, gt=0)
    max_tools: int = Field(default=DEFAULT_MAX_TOOLS, gt=0)
    max_description_bytes: int = Field(default=DEFAULT_MAX_DESCRIPTION_BYTES, gt=0)

    @model_validator(mode="after")
    def _one_transport(self) -> MCPServerSpec:
        if (self.url is None) == (self.command is None):
            raise ValueError("An MCP server needs exactly one of url (streamable HTTP) or command (stdio).")
        return self

    @classmethod
    def http(
        cls,
        name: str,
        url: str,
        *,
        headers_from_env: Mapping[str, str] | None = None,
        headers_from_ssm: Mapping[str, str] | None = None,
        headers: Callable[[], Mapping[str, str]] | None = None,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
        max_tools: int = DEFAULT_MAX_TOOLS,
        max_description_bytes: int = DEFAULT_MAX_DESCRIPTION_BYTES,
    ) -> MCPServerSpec:
        """A remote server over streamable HTTP.

        ``headers_from_env`` maps header names to environment variables, ``headers_from_ssm`` to SSM parameter
        names (e.g. ``{"Authorization": "/app/hotel/token"}``; the function needs ``ssm:GetParameter`` on them,
        and ``kms:Decrypt`` for a customer-managed key).
        """
        return cls(
            name=name, url=url, headers_from_env=tuple(sorted((headers_from_env or {}).items())),
            headers_from_ssm=tuple(sorted((headers_from_ssm or {}).items())), headers=headers, timeout=timeout,
            max_result_bytes=max_result_bytes, max_tools=max_tools, max_description_bytes=max_description_bytes,
        )

    @classmethod
    def stdio(
        cls,
        name: str,
        command: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        inherit_env: Sequence[str] = (),
        cwd: str | os.PathLike[str] | None = None,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
        max_tools: int = DEFAULT_MAX_TOOLS,
        max_description_bytes: int = DEFAULT_MAX_DESCRIPTION_BYTES,
    ) -> MCPServerSpec:
        """A server started as a subprocess and spoken to over its stdin/stdout.

        Its environment is a minimal one (``PATH``, ``HOME``, ``LOGNAME``, ``SHELL``, ``TERM``, ``USER``), the
        process's variables named in ``inherit_env``, then ``env``: nothing else of the process's environment (its
        credentials, say) reaches the server. Its working folder is ``cwd``, made absolute when declared (a
        relative one is read against the process's working folder then); without it, the process's working folder
        when the server starts. ``command`` is looked up on the server's ``PATH``.
        """
        return cls(
            name=name, command=command, args=tuple(args), env=tuple(sorted((env or {}).items())),
            inherit_env=tuple(inherit_env), cwd=os.path.abspath(cwd) if cwd is not None else None, timeout=timeout,
            max_result_bytes=max_result_bytes, max_tools=max_tools, max_description_bytes=max_description_bytes,
        )

    @property
    def transport(self) -> Literal["streamable-http", "stdio"]:
        return "streamable-http" if self.url is not None else "stdio"

    def connection_key(self) -> tuple[Any, ...]:
        """What identifies one shared session: everything but the timeout."""
        return (self.name, self.url, self.command, self.args, self.env, self.inherit_env, self.cwd,
                self.headers_from_env, self.headers_from_ssm, id(self.headers) if self.headers else None,
                self.max_result_bytes, self.max_tools, self.max_description_bytes)

    def resolved_headers(self) -> dict[str, str]:
        """The headers to send: the environment's now (unset variables left out), SSM's, then ``headers()``.

        Blocking (SSM is read through boto3 at the first call); raises what a source raises.
        """
        found = {header: os.environ[variable] for header, variable in self.headers_from_env if os.environ.get(variable)}
        found.update({header: ssm_parameter(parameter) for header, parameter in self.headers_from_ssm})
        if self.headers is not None:
            found.update(self.headers())
        return found


def ssm_parameter(name: str) -> str:
    """The decrypted value of the SSM parameter ``name``, through the process's one parameter reader
    (``picoflow.models.parameters``): kept for ``PICOFLOW_PARAMETER_MAX_AGE`` seconds, read again after a failure.
    The value is never logged."""
    return secure_parameter(name)


class MCPTools(BaseModel):
    """The tools of one declared server a step offers to the model: named ones (an allowlist), or all of them.

    The model sees each with the server's own description and input schema; its call goes to the server and the
    result (structured content, else text, cut at ``max_result_chars``) becomes the tool result, unless the step
    handles the tool with its own ``@tool`` handler, which then receives an :class:`MCPToolResult`. A tool
    handled that way must be named here even with ``all_tools``.
    """

    model_config = ConfigDict(frozen=True)

    server: str = Field(min_length=1)
    tools: tuple[str, ...] = ()
    all_tools: bool = False
    max_result_chars: int = Field(default=DEFAULT_MAX_RESULT_CHARS, gt=0)

    @model_validator(mode="after")
    def _something_offered(self) -> MCPTools:
        if not self.tools and not self.all_tools:
            raise ValueError("MCPTools needs tool names, or all_tools=True to offer every tool of the server.")
        return self


@dataclass(frozen=True)
class MCPToolResult:
    """What one call of a server's tool gave: its structured content and text, or the failure."""

    server: str
    tool: str
    arguments: dict[str, Any]
    structured: dict[str, Any] | None = None
    text: str = ""
    error: MCPUnavailableError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def value(self) -> dict[str, Any] | str:
        """The structured content, else the text; raises the failure when the call failed."""
        if self.error is not None:
            raise self.error
        return self.structured if self.structured is not None else self.text

    def parse(self, model: type[M]) -> M:
        """The structured content validated by ``model``; ``MCPUnavailableError`` when it fails or does not fit."""
        if self.error is not None:
            raise self.error
        try:
            return model.model_validate(self.structured if self.structured is not None else json.loads(self.text))
        except (ValidationError, ValueError) as exc:
            library_log.warning(
                "MCP result does not fit its model",
                extra={"mcpServer": self.server, "mcpTool": self.tool, "resultModel": model.__name__},
            )
            raise MCPUnavailableError(self.server, self.tool, "invalid_result") from exc

    def for_model(self, max_chars: int = DEFAULT_MAX_RESULT_CHARS) -> str:
        """The tool result the model reads: JSON of the structured content, else the text, cut with a marker."""
        if self.error is not None:
            return UNAVAILABLE_TOOL_FEEDBACK
        text = json.dumps(self.structured, ensure_ascii=False) if self.structured is not None else self.text
        return cap(text, max_chars)


def cap(text: str, max_chars: int) -> str:
    """``text`` cut to ``max_chars`` characters, with a marker saying how much was left out."""
    if len(text) <= max_chars:
        return text
    return f"{text[:max_chars]}\n[result cut: {max_chars} of {len(text)} characters shown]"


@dataclass(frozen=True)
class OfferedTool:
    """A server tool a step offers: the allowlisting offer, and the server's description and input schema."""

    spec: MCPServerSpec
    offer: MCPTools
    name: str
    description: str
    input_schema: dict[str, Any]

    def as_model_tool(self) -> dict[str, Any]:
        """The OpenAI-style function description handed to ``bind_tools``: the server's own schema."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.input_schema},
        }

    def argument_problems(self, arguments: Mapping[str, Any]) -> str | None:
        """Why ``arguments`` do not fit the server's input schema, or None when they do."""
        from jsonschema import exceptions, validators

        try:
            validator_class = validators.validator_for(self.input_schema)
            errors = sorted(validator_class(self.input_schema).iter_errors(dict(arguments)), key=str)
        except exceptions.SchemaError:
            # A schema the validator cannot read is the server's to enforce.
            return None
        if not errors:
            return None
        return "; ".join(f"{'.'.join(map(str, e.absolute_path)) or 'arguments'}: {e.message}" for e in errors[:5])

    async def call(self, arguments: Mapping[str, Any]) -> MCPToolResult:
        """Call the tool; a failure comes back inside the result, for the step to handle or the model to be told."""
        try:
            return await call_tool(self.spec, self.name, arguments)
        except MCPUnavailableError as exc:
            return MCPToolResult(self.spec.name, self.name, dict(arguments), error=exc)


# -- the shared sessions -------------------------------------------------------------------------------------


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


_pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[Any, ...], _Connection]] = (
    weakref.WeakKeyDictionary()
)
_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[Any, ...], asyncio.Lock]] = (
    weakref.WeakKeyDictionary()
)


def _remaining(ends: float) -> float:
    return max(ends - time.monotonic(), 0.0)


async def _connection(spec: MCPServerSpec, ends: float) -> tuple[_Connection, bool]:
    """The loop's session for ``spec`` and whether it was opened just now (sessions belong to one event loop)."""
    loop = asyncio.get_running_loop()
    pool = _pools.setdefault(loop, {})
    key = spec.connection_key()
    connection = pool.get(key)
    if connection is not None and connection.alive:
        return connection, False
    lock = _locks.setdefault(loop, {}).setdefault(key, asyncio.Lock())
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
            _discard(connection)
            raise
        library_log.info("MCP session opened", extra={"mcpServer": spec.name, "mcpTransport": spec.transport})
        return connection, True
    finally:
        lock.release()


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


def _discard(connection: _Connection) -> None:
    pool = _pools.get(asyncio.get_running_loop(), {})
    key = connection.spec.connection_key()
    if pool.get(key) is connection:
        del pool[key]
    connection.close()


def _budget(spec: MCPServerSpec, what: str) -> float:
    """When the operation must end: the server's timeout, or earlier when the turn's deadline comes first."""
    seconds = spec.timeout
    left = time_left(f"calling MCP server '{spec.name}' ({what})")
    if left is not None:
        seconds = min(seconds, left - DEADLINE_RESERVE_SECONDS)
    return time.monotonic() + seconds


async def _on_session(
    spec: MCPServerSpec, tool: str | None, what: str, operation: Callable[[_Connection, float], Awaitable[T]]
) -> T:
    """Run ``operation`` on the shared session, reconnecting once when a reused session turns out to be gone."""
    ends = _budget(spec, what)
    connection, fresh = await _connection(spec, ends)
    for attempt in (1, 2):
        try:
            return await operation(connection, ends)
        except Exception as exc:  # noqa: BLE001 - sorted below into the reasons a caller is told
            failure = exc
        if isinstance(failure, (_Lost, TimeoutError)):
            # A session that ended, or whose server let a call time out (it may be stuck), is not used again.
            _discard(connection)
        # An answer refused for its size fails as such, whatever shape the transport gave the failure.
        if connection.limit.take():
            raise MCPUnavailableError(spec.name, tool, "too_large") from None
        if isinstance(failure, MCPUnavailableError):
            raise failure
        if isinstance(failure, TimeoutError):
            raise MCPUnavailableError(spec.name, tool, "timeout") from None
        if not isinstance(failure, _Lost):
            library_log.warning("MCP request failed",
                                extra={"mcpServer": spec.name, "mcpTool": tool, "errorType": type(failure).__name__})
            raise MCPUnavailableError(spec.name, tool, "protocol_error") from failure
        if fresh or attempt == 2:
            raise MCPUnavailableError(spec.name, tool, "unreachable") from None
        library_log.info("MCP session went stale; reconnecting once", extra={"mcpServer": spec.name})
        connection, fresh = await _connection(spec, ends)
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises


async def list_tools(spec: MCPServerSpec) -> dict[str, Any]:
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

    return await _on_session(spec, None, "listing its tools", listing)


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


async def call_tool(
    spec: MCPServerSpec, tool: str, arguments: Mapping[str, Any] | BaseModel | None = None
) -> MCPToolResult:
    """Call ``tool`` on the server; ``MCPUnavailableError`` for ``isError``, an unreachable server or a timeout."""
    args = arguments.model_dump(mode="json") if isinstance(arguments, BaseModel) else dict(arguments or {})

    async def calling(connection: _Connection, ends: float) -> Any:
        return await connection.run(
            lambda client: client.call_tool(tool, args, read_timeout_seconds=_remaining(ends) or None), ends
        )

    started = time.monotonic()
    result = await _on_session(spec, tool, f"tool '{tool}'", calling)
    if result.is_error:
        library_log.warning("MCP tool answered with an error", extra={"mcpServer": spec.name, "mcpTool": tool})
        raise MCPUnavailableError(spec.name, tool, "tool_error")
    library_log.debug(
        "MCP tool called",
        extra={"mcpServer": spec.name, "mcpTool": tool, "elapsedMs": round((time.monotonic() - started) * 1000)},
    )
    return MCPToolResult(spec.name, tool, args, structured=result.structured_content, text=_text(result.content))


def _text(content: Sequence[Any]) -> str:
    parts = []
    for block in content:
        text = getattr(block, "text", None)
        parts.append(text if isinstance(text, str) else f"[{getattr(block, 'type', 'non-text')} content omitted]")
    return "\n".join(parts)


async def close_sessions() -> None:
    """Close this event loop's MCP sessions (stdio servers exit); the next use connects again."""
    pool = _pools.pop(asyncio.get_running_loop(), {})
    for connection in pool.values():
        connection.close()
    tasks = [connection.task for connection in pool.values()]
    if tasks:
        await asyncio.wait(tasks, timeout=5)


# -- what flows and steps reach -------------------------------------------------------------------------------


def find_server(servers: Sequence[MCPServerSpec], name: str, owner: str) -> MCPServerSpec:
    """The declaration named ``name`` among ``servers`` (a flow's), or a clear error."""
    for spec in servers:
        if spec.name == name:
            return spec
    raise PicoFlowError(f"MCP server '{name}' is not declared by flow '{owner}' (see define_mcp_servers()).")


@dataclass(frozen=True)
class ToolOffer:
    """What a step offers the model from its servers on this call: the tools, by name, and the allow-listed names
    left out because their server could not be asked (a call of one answers the fixed unavailable sentence)."""

    tools: dict[str, OfferedTool] = field(default_factory=dict)
    #: Tool name -> the declared server that could not list it.
    unavailable: dict[str, str] = field(default_factory=dict)

    def unavailable_outcome(self, name: str, arguments: Mapping[str, Any]) -> ToolCallOutcome:
        """The outcome of a call of a left-out tool: the fixed sentence, and a failed result for a handler."""
        error = MCPUnavailableError(self.unavailable[name], name, "unreachable")
        result = MCPToolResult(self.unavailable[name], name, dict(arguments), error=error)
        return ToolCallOutcome(UNAVAILABLE_TOOL_FEEDBACK, "error", result)


_offer_pauses: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[Any, ...], float]] = (
    weakref.WeakKeyDictionary()
)
#: What was logged about left-out tools, so a listing read at every model call logs each problem once per server.
_reported: set[tuple[Any, ...]] = set()
REPORTED_LIMIT = 1_024


def _report(message: str, spec: MCPServerSpec, tool: str) -> None:
    key = (message, spec.connection_key(), tool)
    if key in _reported:
        return
    if len(_reported) >= REPORTED_LIMIT:
        _reported.clear()
    _reported.add(key)
    # A hostile server picks its tool names: the log keeps a bounded prefix.
    library_log.warning(message, extra={"mcpServer": spec.name, "mcpTool": tool[:64]})


async def _offer_listing(spec: MCPServerSpec) -> dict[str, Any] | None:
    """The server's tools for an offer, or None when it cannot list them now (then not asked again for a while)."""
    loop = asyncio.get_running_loop()
    pauses = _offer_pauses.setdefault(loop, {})
    key = spec.connection_key()
    if pauses.get(key, 0.0) > time.monotonic():
        return None
    try:
        listed = await list_tools(spec)
    except MCPUnavailableError as exc:
        library_log.warning("MCP server's tools left out of the offer",
                            extra={"mcpServer": spec.name, "reason": exc.reason})
        pauses[key] = time.monotonic() + OFFER_RETRY_SECONDS
        return None
    pauses.pop(key, None)
    return listed


async def offered_tools(flow: Any, offers: Sequence[MCPTools]) -> ToolOffer:
    """The server tools a step offers the model (its ``use_mcp_tools()``), with the servers' schemas.

    Connects lazily. Flow tools always win: a server tool named like one of the flow's own tools is left out, as
    are tools of a server that cannot list them, allow-listed tools the server does not list, and a second
    server's tool of a name already offered; each is logged, and the turn goes on with the rest.
    """
    offering = ToolOffer()
    for offer in offers:
        spec = flow.mcp_server(offer.server)
        listed = await _offer_listing(spec)
        names = list(offer.tools) if listed is None or not offer.all_tools else list(listed)
        for name in names:
            if flow.get_tool(name) is not None:
                _report("MCP tool left out: the flow has a tool of that name", spec, name)
            elif name in offering.tools or name in offering.unavailable:
                _report("MCP tool left out: another offered server has a tool of that name", spec, name)
            elif listed is None:
                offering.unavailable[name] = spec.name
            elif name not in listed:
                _report("MCP server does not list an offered tool", spec, name)
                offering.unavailable[name] = spec.name
            else:
                listing = listed[name]
                offering.tools[name] = OfferedTool(spec, offer, name, listing.description or name,
                                                 dict(listing.input_schema))
    return offering


@dataclass
class ToolCallOutcome:
    """An offered tool's call as tool dispatch needs it: the content for the model, or what a handler gets."""

    content: str
    status: Literal["success", "error"] = "success"
    result: MCPToolResult | None = field(default=None)


async def run_offered(tool: OfferedTool, arguments: Mapping[str, Any]) -> ToolCallOutcome:
    """Check the model's arguments against the server's schema, then call the tool."""
    problems = tool.argument_problems(arguments)
    if problems is not None:
        retry = "Call the tool again with corrected arguments."
        return ToolCallOutcome(f"Invalid arguments for tool '{tool.name}': {problems}. {retry}", "error")
    result = await tool.call(arguments)
    return ToolCallOutcome(result.for_model(tool.offer.max_result_chars), "success" if result.ok else "error", result)

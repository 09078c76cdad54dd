"""The ``mcp`` SDK's doors: transports that bound what a server can make the process read, and the SDK's logs.

The SDK reads a whole message before anything can judge its size (a stdio line, an HTTP JSON body), so a
server answering 20 MB makes the process hold and parse 20 MB. Here every message is counted while it arrives
and refused once it passes ``MCPServerSpec.max_result_bytes``; the call it answered then fails at once:

- streamable HTTP: the SDK's own transport, given an ``httpx2`` client whose transport (``AsyncBaseTransport``,
  httpx's public extension point) stops reading a POST's response body at the limit;
- stdio: a transport of our own (the SDK's ``Client`` accepts any ``Transport``) that starts the server, reads its
  stdout line by line up to the limit, skips what is not JSON-RPC without logging it, and logs the command's
  name and exit status (never its output) when the server exits on its own.

The SDK logs what it failed to parse (a server's stdout line, a response body) with its text and a traceback, and
every message at DEBUG. Once a transport first opens, the ``mcp`` logger stops passing its records on; each WARNING
or worse becomes one ``MCP SDK reported a problem`` record on PicoFlow's logger with the SDK logger's name and the
exception's type only, and anything below WARNING is dropped. An operator who wants the SDK's own records back
(while debugging a server they trust) sets ``logging.getLogger("mcp").propagate = True`` after the first
connection.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import subprocess
import sys
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

from picoflow.logger import library_log

if TYPE_CHECKING:
    import httpx2

#: The JSON-RPC error code of an answer refused for its size (in the range JSON-RPC leaves to implementations).
RESULT_TOO_LARGE = -32099
#: Bytes read from the server's stdout at a time.
CHUNK_BYTES = 65_536
#: Bytes kept of each end of a refused line, to find the request it answered.
ENDS_KEPT = 512
#: Seconds a stdio server gets to exit after its stdin closes, then again after SIGTERM.
EXIT_GRACE_SECONDS = 2.0


SDK_LOGGER = "mcp"


class SdkRecordRelay(logging.Handler):
    """Re-emits an SDK record as a fixed sentence with its logger's name and exception type (never its text)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        error = record.exc_info[0].__name__ if record.exc_info and record.exc_info[0] else None
        library_log.log(record.levelno, "MCP SDK reported a problem",
                        extra={"sdkLogger": record.name, "errorType": error})


def quiet_sdk_logs() -> None:
    """Route the ``mcp`` logger's records through :class:`SdkRecordRelay` only (once; later changes are kept)."""
    logger = logging.getLogger(SDK_LOGGER)
    if any(isinstance(handler, SdkRecordRelay) for handler in logger.handlers):
        return
    logger.addHandler(SdkRecordRelay())
    logger.propagate = False


class StdioCommand(Protocol):
    """What starting a stdio server needs of its declaration (``MCPServerSpec`` has it)."""

    @property
    def name(self) -> str: ...
    @property
    def command(self) -> str | None: ...
    @property
    def args(self) -> tuple[str, ...]: ...
    @property
    def env(self) -> tuple[tuple[str, str], ...]: ...
    @property
    def inherit_env(self) -> tuple[str, ...]: ...
    @property
    def cwd(self) -> str | None: ...


@dataclass
class ReadLimit:
    """The byte limit of one server's messages, and whether a message passed it since the last look."""

    max_bytes: int
    tripped: bool = field(default=False)

    def take(self) -> bool:
        """Whether a message was refused since the last call (and forget it)."""
        tripped, self.tripped = self.tripped, False
        return tripped


# -- streamable HTTP -----------------------------------------------------------------------------------------


def bounded_http_client(headers: dict[str, str], timeout: float, limit: ReadLimit) -> httpx2.AsyncClient:
    """An ``httpx2`` client whose POST response bodies stop at ``limit``, counted as they arrive.

    Past it, reading fails with a ``StreamError``, which the SDK turns into an error answer to the pending request
    (the session itself goes on).
    """
    import httpx2

    quiet_sdk_logs()

    class TooLarge(httpx2.StreamError):
        """A response body passed the limit (a ``StreamError``: the SDK answers the pending request with it)."""

    class BoundedStream(httpx2.AsyncByteStream):
        def __init__(self, inner: httpx2.AsyncByteStream) -> None:
            self.inner = inner

        async def __aiter__(self) -> AsyncIterator[bytes]:
            seen = 0
            async for chunk in self.inner:
                seen += len(chunk)
                if seen > limit.max_bytes:
                    limit.tripped = True
                    raise TooLarge("The response passed the client's size limit.")
                yield chunk

        async def aclose(self) -> None:
            await self.inner.aclose()

    class BoundedTransport(httpx2.AsyncBaseTransport):
        def __init__(self) -> None:
            self.inner = httpx2.AsyncHTTPTransport()

        async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
            response = await self.inner.handle_async_request(request)
            # Only POSTs carry answers; the GET stream of server notifications is bounded per event by the SDK.
            if request.method != "POST":
                return response
            assert isinstance(response.stream, httpx2.AsyncByteStream)
            return httpx2.Response(status_code=response.status_code, headers=response.headers,
                                   stream=BoundedStream(response.stream), extensions=response.extensions,
                                   request=request)

        async def aclose(self) -> None:
            await self.inner.aclose()

    return httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(timeout), transport=BoundedTransport())


# -- stdio ---------------------------------------------------------------------------------------------------


def stdio_environment(spec: StdioCommand) -> dict[str, str]:
    """The server's environment: the SDK's minimal set (``PATH``, ``HOME`` ...), ``inherit_env``, then ``env``."""
    from mcp.client.stdio import get_default_environment

    inherited = {name: os.environ[name] for name in spec.inherit_env if name in os.environ}
    return {**get_default_environment(), **inherited, **dict(spec.env)}


def command_name(spec: StdioCommand) -> str:
    """What the logs call the server's command: its file name, never its arguments (they may hold secrets)."""
    return Path(spec.command or "").name


@contextlib.asynccontextmanager
async def bounded_stdio(spec: StdioCommand, limit: ReadLimit) -> AsyncIterator[Any]:
    """Start ``spec``'s command and yield the SDK's ``(read, write)`` streams over its stdin and stdout."""
    import anyio
    from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
    from mcp.shared.message import SessionMessage

    quiet_sdk_logs()
    cwd = spec.cwd or os.getcwd()
    # The server's stderr is its own log: it goes to the process's real stderr (a replaced sys.stderr, such as a
    # test's capture, has no file descriptor to hand a subprocess).
    errlog: IO[str] | int = sys.__stderr__ if sys.__stderr__ is not None else subprocess.DEVNULL
    try:
        process = await anyio.open_process(
            [spec.command or "", *spec.args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errlog, cwd=cwd,
            env=stdio_environment(spec), start_new_session=True,
        )
    except OSError as exc:
        library_log.warning("MCP server could not be started", extra={
            "mcpServer": spec.name, "mcpCommand": command_name(spec), "errorType": type(exc).__name__,
            "errno": exc.errno,
        })
        raise
    incoming_send: MemoryObjectSendStream[Any]
    incoming: MemoryObjectReceiveStream[Any]
    incoming_send, incoming = anyio.create_memory_object_stream(0)
    outgoing: MemoryObjectSendStream[SessionMessage]
    outgoing_receive: MemoryObjectReceiveStream[SessionMessage]
    outgoing, outgoing_receive = anyio.create_memory_object_stream(0)
    reader = _LineReader(spec, limit, incoming_send)
    stopping = False

    async def read_stdout() -> None:
        nonlocal stopping
        assert process.stdout is not None
        async with incoming_send:
            with contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError,
                                     OSError):
                while True:
                    if not await reader.feed(await process.stdout.receive(CHUNK_BYTES)):
                        # The session is over on our side (closed, or a refused answer nobody can be told of).
                        stopping = True
                        break
        if not stopping:
            with anyio.move_on_after(EXIT_GRACE_SECONDS):
                await process.wait()
            library_log.warning("MCP server exited", extra={
                "mcpServer": spec.name, "mcpCommand": command_name(spec), "exitStatus": process.returncode,
            })

    async def write_stdin() -> None:
        assert process.stdin is not None
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            async with outgoing_receive:
                async for message in outgoing_receive:
                    reader.sent(message.message)
                    text = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send(text.encode() + b"\n")
        # The server may still be running: ending the read side lets a waiting call see the session end.
        await incoming_send.aclose()

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(read_stdout)
        tasks.start_soon(write_stdin)
        try:
            yield incoming, outgoing
        finally:
            stopping = True
            with anyio.CancelScope(shield=True):
                await _stop(process)
            tasks.cancel_scope.cancel()


async def _stop(process: Any) -> None:
    """Close the server's stdin, give it time to exit, then end its process group."""
    import anyio

    with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await process.stdin.aclose()
    with anyio.move_on_after(EXIT_GRACE_SECONDS):
        await process.wait()
    if process.returncode is None:
        if sys.platform == "win32":  # pragma: no cover - POSIX is where functions run
            process.kill()
        else:
            from mcp.os.posix.utilities import terminate_posix_process_tree

            await terminate_posix_process_tree(process, EXIT_GRACE_SECONDS)
    with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await process.stdout.aclose()


class _LineReader:
    """Splits the server's stdout into JSON-RPC messages, none longer than the limit, and hands them on."""

    def __init__(self, spec: StdioCommand, limit: ReadLimit, out: Any) -> None:
        self.spec = spec
        self.limit = limit
        self.out = out
        self.line = bytearray()
        self.skipping = False
        self.head = b""
        self.tail: deque[bytes] = deque()
        self.pending: list[Any] = []
        self.noise_reported = False

    def sent(self, message: Any) -> None:
        """Note a request going to the server: its answer is awaited."""
        from mcp.types import JSONRPCRequest

        if isinstance(message, JSONRPCRequest):
            self.pending.append(message.id)

    async def feed(self, chunk: bytes) -> bool:
        """Take a chunk of stdout; False once the session is over."""
        while chunk:
            end = chunk.find(b"\n")
            piece, chunk = (chunk, b"") if end < 0 else (chunk[:end], chunk[end + 1:])
            if self.skipping:
                self._keep_ends(piece)
            else:
                self.line += piece
                if len(self.line) > self.limit.max_bytes:
                    self.skipping, self.head = True, bytes(self.line[:ENDS_KEPT])
                    self._keep_ends(bytes(self.line[-ENDS_KEPT:]))
                    self.line = bytearray()
            if end < 0:
                break
            if self.skipping:
                if not await self._refuse():
                    return False
            elif not await self._deliver(bytes(self.line)):
                return False
            self.line, self.skipping, self.head = bytearray(), False, b""
            self.tail.clear()
        return True

    def _keep_ends(self, piece: bytes) -> None:
        self.tail.append(piece[-ENDS_KEPT:])
        while len(self.tail) > 2:
            self.tail.popleft()

    async def _deliver(self, line: bytes) -> bool:
        from mcp.shared.message import SessionMessage
        from mcp.types import JSONRPCError, JSONRPCResponse, jsonrpc_message_adapter
        from pydantic import ValidationError

        if not line.strip():
            return True
        try:
            message = jsonrpc_message_adapter.validate_json(line, by_name=False)
        except ValidationError:
            # Whatever the server printed is its business: counted, never quoted.
            level = "debug" if self.noise_reported else "warning"
            getattr(library_log, level)("MCP server wrote a line that is not JSON-RPC; skipped",
                                        extra={"mcpServer": self.spec.name, "bytes": len(line)})
            self.noise_reported = True
            return True
        if isinstance(message, JSONRPCResponse | JSONRPCError) and message.id in self.pending:
            self.pending.remove(message.id)
        return await self._send(SessionMessage(message))

    async def _refuse(self) -> bool:
        """Answer the request a refused line answered with an error; end the session when it cannot be told."""
        from mcp.shared.message import SessionMessage
        from mcp.types import ErrorData, JSONRPCError

        self.limit.tripped = True
        library_log.warning("MCP server message refused: larger than max_result_bytes",
                            extra={"mcpServer": self.spec.name, "maxResultBytes": self.limit.max_bytes})
        ends = self.head + b"\n" + b"".join(self.tail)
        named = [rid for rid in self.pending if re.search(rb'"id"\s*:\s*' + re.escape(json.dumps(rid).encode())
                                                          + rb"\s*[,}]", ends)]
        answered = named[0] if len(named) == 1 else self.pending[0] if len(self.pending) == 1 else None
        if answered is None:
            return False
        self.pending.remove(answered)
        error = ErrorData(code=RESULT_TOO_LARGE, message="The server's answer passed the client's size limit.")
        return await self._send(SessionMessage(JSONRPCError(jsonrpc="2.0", id=answered, error=error)))

    async def _send(self, message: Any) -> bool:
        import anyio

        try:
            await self.out.send(message)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            return False
        return True

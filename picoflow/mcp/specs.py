"""What a flow declares about MCP servers and what their tools give back: the server declarations, the offers a
step makes from them, a tool's result, the error every MCP failure raises, and the caps that bound a server."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from picoflow.errors import PicoFlowError
from picoflow.logger import library_log
from picoflow.models.parameters import secure_parameter

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

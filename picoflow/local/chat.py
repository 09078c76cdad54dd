"""``picoflow chat FLOW``: a terminal client for the PicoFlow HTTP API.

Each input line is one turn (``POST /ai/run``), asked for as server-sent events so the reply is printed as
the model writes it; the session id the turn reports is sent back on the next turn. ``/end`` deletes the
session (``POST /ai/end``), a blank line is ignored and end of input quits.

A tool call waiting for a decision is printed with its arguments; ``/approve [ID]`` and ``/deny [ID] [REASON]``
decide it (the id may be left out while a single call waits for the user), as a turn of its own.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from email.message import Message
from typing import IO, Any, TextIO

from picoflow.wire import JSON, SESSION_HEADER, read_envelope

# A little above the function timeout, so the server's own error arrives before ours.
REQUEST_TIMEOUT_SECONDS = 35.0
EVENT_STREAM = "text/event-stream"
#: Called with each event of a streamed turn (its name and JSON data) as it arrives.
OnEvent = Callable[[str, dict[str, Any]], None]


@dataclass
class Reply:
    """One HTTP answer from the API."""

    status: int
    content_type: str
    text: str
    session: str | None
    #: The turn came as a stream of events; ``text`` is its final event's envelope.
    streamed: bool = False

    @property
    def envelope(self) -> dict[str, Any] | None:
        """The parsed JSON envelope, or None when the body is a raw (non-envelope) message."""
        return read_envelope(self.content_type, self.text)


class UploadError(RuntimeError):
    """An upload the API or the upload URL refused."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"upload refused with status {status}")
        self.status = status
        self.text = text


class ChatClient:
    """Talks to one flow, carrying the session id from turn to turn."""

    def __init__(self, base_url: str, flow: str, config: dict[str, Any] | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.flow = flow
        self.config = config
        self.session: str | None = None
        #: The tool calls the last turn left waiting for a decision (its envelope's ``pendingApprovals``).
        self.pending: list[dict[str, Any]] = []

    def send(self, message: str, files: Sequence[str] = (), on_event: OnEvent | None = None,
             approvals: Sequence[dict[str, Any]] | None = None) -> Reply:
        """Run one turn (with the uploaded ``files``, by id, and the user's ``approvals`` decisions); a completed
        session is forgotten so the next line starts a new one. With ``on_event`` the turn is asked for as a
        stream and each event is passed to it as it arrives (a refused request is still answered by one JSON
        reply). An empty message with decisions sends the decisions alone."""
        payload: dict[str, Any] = {"flowName": self.flow}
        if message or not approvals:
            payload["message"] = message
        if approvals:
            payload["approvals"] = list(approvals)
        if files:
            payload["files"] = list(files)
        if self.session is None and self.config is not None:
            payload["config"] = self.config
        return self._turn(payload, on_event)

    def decide(
        self, approval_id: str, approved: bool, reason: str | None = None, on_event: OnEvent | None = None
    ) -> Reply:
        """Send the user's decision on the waiting call ``approval_id`` (a turn without a message)."""
        decision: dict[str, Any] = {"id": approval_id, "approved": approved}
        if reason:
            decision["reason"] = reason
        return self._turn({"flowName": self.flow, "approvals": [decision]}, on_event)

    def _turn(self, payload: dict[str, Any], on_event: OnEvent | None) -> Reply:
        reply = self._post("/ai/run", payload, on_event)
        envelope = reply.envelope
        if envelope is not None and envelope.get("success"):
            waiting = envelope.get("pendingApprovals")
            self.pending = [item for item in waiting if isinstance(item, dict)] if isinstance(waiting, list) else []
        if envelope is not None and envelope.get("success") and envelope.get("completed"):
            self.session = None
            self.pending = []
        elif reply.session:
            self.session = reply.session
        return reply

    def upload(self, name: str, content_type: str, data: bytes) -> str:
        """Upload a file for the next turn (``POST /ai/files``, then a PUT to its upload URL); its file id.

        Raises ``UploadError`` when either step is refused.
        """
        reply = self._post("/ai/files", {"name": name, "contentType": content_type, "size": len(data)})
        ticket = json.loads(reply.text) if reply.status == 200 else None
        if not isinstance(ticket, dict) or "uploadUrl" not in ticket:
            raise UploadError(reply.status, reply.text)
        # A local server answers with a URL relative to itself; S3's presigned URLs are absolute.
        request = urllib.request.Request(
            urllib.parse.urljoin(self.base_url + "/", ticket["uploadUrl"]), data=data, method="PUT",
            headers=ticket.get("uploadHeaders") or {},
        )
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_SECONDS):
                return str(ticket["fileId"])
        except urllib.error.HTTPError as error:
            with error:
                raise UploadError(error.code, error.read().decode("utf-8", errors="replace")) from None

    def end(self) -> Reply:
        """Delete the current session on the server."""
        reply = self._post("/ai/end", None)
        self.session = None
        self.pending = []
        return reply

    def _post(self, route: str, payload: dict[str, Any] | None, on_event: OnEvent | None = None) -> Reply:
        data = json.dumps(payload).encode("utf-8") if payload is not None else b""
        request = urllib.request.Request(self.base_url + route, data=data, method="POST")
        if payload is not None:
            request.add_header("Content-Type", JSON)
        if on_event is not None:
            request.add_header("Accept", EVENT_STREAM)
        if self.session:
            request.add_header(SESSION_HEADER, self.session)
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_SECONDS) as response:
                if on_event is not None and response.headers.get_content_type() == EVENT_STREAM:
                    return _streamed_reply(response, on_event)
                return _reply(response.status, response.headers, response.read())
        except urllib.error.HTTPError as error:
            with error:
                return _reply(error.code, error.headers, error.read())


def _reply(status: int, headers: Message, body: bytes) -> Reply:
    text = body.decode(headers.get_content_charset() or "utf-8", errors="replace")
    session = headers.get(SESSION_HEADER)
    content_type = headers.get_content_type()
    if not session and content_type == JSON:
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        if isinstance(data, dict) and isinstance(data.get("session"), str):
            session = data["session"]
    return Reply(status=status, content_type=content_type, text=text, session=session or None)


def read_events(stream: IO[bytes]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The server-sent events of ``stream`` as (name, JSON data) pairs, each as soon as its blank line arrives."""
    name, data = "message", ""
    for raw in stream:
        line = raw.decode("utf-8").rstrip("\r\n")
        if line.startswith("event:"):
            name = line[len("event:"):].strip()
        elif line.startswith("data:"):
            data += line[len("data:"):].strip()
        elif not line and data:
            yield name, json.loads(data)
            name, data = "message", ""


def _streamed_reply(response: IO[bytes], on_event: OnEvent) -> Reply:
    final: dict[str, Any] = {"success": False, "completed": False, "message": "The stream ended early.",
                             "session": "", "code": "STREAM_ENDED"}
    for name, data in read_events(response):
        on_event(name, data)
        if name in ("committed", "aborted"):
            final = data
            break
    session = final.get("session")
    return Reply(status=200, content_type=JSON, text=json.dumps(final),
                 session=session if isinstance(session, str) and session else None, streamed=True)


def chat(
    flow: str,
    url: str = "http://127.0.0.1:8000",
    config: dict[str, Any] | None = None,
    *,
    stdin: TextIO | None = None,
    stdout: TextIO | None = None,
) -> int:
    """Run the REPL until end of input; returns the process exit code."""
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    client = ChatClient(url, flow, config)
    interactive = stdin.isatty()

    def say(text: str) -> None:
        print(text, file=stdout, flush=True)

    say(f"Chatting with {flow} at {client.base_url}. /end deletes the session; /approve and /deny decide a "
        "waiting tool call; Ctrl+D quits.")
    while True:
        if interactive:
            stdout.write("you> ")
            stdout.flush()
        line = stdin.readline()
        if not line:
            return 0
        text = line.strip()
        if not text:
            continue
        try:
            command = text.split(maxsplit=1)[0]
            if command in ("/approve", "/deny"):
                chosen = _decision(client, text)
                if isinstance(chosen, str):
                    say(chosen)
                    continue
                before = client.session
                printer = _ReplyPrinter(stdout, flow)
                reply = client.decide(*chosen, on_event=printer)
            elif text == "/end":
                if client.session is None:
                    say("[no session to end]")
                    continue
                ended = client.session
                reply = client.end()
                envelope = reply.envelope or {}
                if envelope.get("success"):
                    say(f"[session {ended} ended]")
                else:
                    say(f"[could not end session {ended}: {envelope.get('message') or reply.text}]")
                continue
            else:
                before = client.session
                printer = _ReplyPrinter(stdout, flow)
                reply = client.send(text, on_event=printer)
        except (urllib.error.URLError, OSError) as error:
            say(f"[cannot reach {client.base_url}: {getattr(error, 'reason', error)}]")
            return 1
        printer.close(reply.streamed and bool((reply.envelope or {}).get("success")))
        _show(say, flow, reply, new_session=reply.session if reply.session != before else None,
              printed=printer.kept)
        _show_pending(say, client.pending if (reply.envelope or {}).get("success") else [])


def _decision(client: ChatClient, text: str) -> tuple[str, bool, str | None] | str:
    """``/approve [ID]`` or ``/deny [ID] [REASON]`` as ``(id, approved, reason)``, or what to tell the user instead.
    The id may be left out while exactly one call waits for the user's decision."""
    command, _, rest = text.partition(" ")
    approved = command == "/approve"
    mine = [item for item in client.pending if item.get("approver") == "user"]
    first, _, remainder = rest.strip().partition(" ")
    if first and any(item.get("id") == first for item in client.pending):
        approval_id, reason = first, remainder.strip()
    elif len(mine) == 1:
        approval_id, reason = str(mine[0].get("id")), rest.strip()
    elif not mine:
        return "[no call is waiting for your decision]"
    else:
        return f"[several calls wait for your decision: {command} ID]"
    if approved and reason:
        return "[/approve takes no reason]"
    return approval_id, approved, reason or None


def _show_pending(say: Callable[[str], None], pending: list[dict[str, Any]]) -> None:
    for item in pending:
        call = f"{item.get('tool')} {json.dumps(item.get('arguments'), ensure_ascii=False)} ({item.get('id')})"
        if item.get("approver") == "reviewer":
            say(f"[waiting for a reviewer: {call}]")
        else:
            say(f"[waiting for your decision: {call}; /approve or /deny REASON, until {item.get('expiresAt')}]")


class _ReplyPrinter:
    """Prints a streamed reply as it arrives; text taken back (``reset``) or never committed is marked so."""

    def __init__(self, stdout: TextIO, flow: str) -> None:
        self.stdout = stdout
        self.flow = flow
        self.open = False
        #: Whether the committed reply was printed as it streamed (so it is not printed again).
        self.kept = False

    def __call__(self, name: str, data: dict[str, Any]) -> None:
        if name == "delta":
            if not self.open:
                self.stdout.write(f"{self.flow}> ")
                self.open = True
            self.stdout.write(str(data.get("text", "")))
            self.stdout.flush()
        elif name == "reset" and self.open:
            self._end(" [discarded]")

    def close(self, committed: bool) -> None:
        """End the reply's line: kept when the turn committed, else marked as not kept."""
        if self.open:
            self.kept = committed
            self._end("" if committed else " [not kept]")

    def _end(self, note: str) -> None:
        self.stdout.write(note + "\n")
        self.stdout.flush()
        self.open = False


def _show(
    say: Callable[[str], None], flow: str, reply: Reply, *, new_session: str | None, printed: bool = False
) -> None:
    if new_session:
        say(f"[session {new_session}]")
    envelope = reply.envelope
    if envelope is None:
        if reply.status >= 400:
            say(f"[error {reply.status}] {reply.text}")
        else:
            say(f"{flow} ({reply.content_type})> {reply.text}")
        return
    if not envelope.get("success"):
        code = envelope.get("code")
        status = "aborted" if reply.streamed else f"error {reply.status}"
        say(f"[{status}{' ' + code if code else ''}] {envelope.get('message', '')}")
        return
    if not printed:
        message = envelope.get("message", "")
        say(f"{flow}> {message if isinstance(message, str) else json.dumps(message)}")
    if envelope.get("completed"):
        say("[session completed; the next message starts a new one]")

"""``make run``: replay a flow's scripted conversation through ``picoflow serve`` and the project's Lambda handler.

``python -m picoflow.local.demo --flow NAME [--flows MODULES] [--handler MODULE:ATTR] [--serve]``

Everything runs offline: the model is a scripted one, the session store is an embedded SQLite file, and each
turn travels as HTTP -> API Gateway v2 event -> the handler (``handlers.api:lambda_handler`` by default). The
conversation is the ``conversation.json`` of a flow package under ``--flows`` (``PICOFLOW_FLOWS``, else
``flows``) whose ``"flow"`` names the flow; a turn's ``"files"`` (names of files beside it) are uploaded
first and attached to it. At the end it prints the ``picoflow serve`` command that serves the same SQLite
file (and upload folder) and the page address of the finished session; with ``--serve``
(``make run SERVE=1``) the demo's own server keeps serving that page until Ctrl+C instead.
"""

from __future__ import annotations

import argparse
import importlib
import json
import mimetypes
import os
import shlex
import sys
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from picoflow.aws.discovery import DEFAULT_FLOW_MODULES, FLOWS_VARIABLE, flow_module_names
from picoflow.local.project import DEFAULT_HANDLER, default_flows, use_working_directory
from picoflow.wire import JSON

if TYPE_CHECKING:
    from picoflow.local.chat import ChatClient

CONVERSATION_FILE = "conversation.json"


def find_conversation(flow_name: str, flows: str | None = None) -> Path:
    """The ``conversation.json`` of the flow called ``flow_name``, in the packages of ``flows`` (see module doc)."""
    use_working_directory()
    known = []
    for module_name in flow_module_names(flows or default_flows()):
        for folder in getattr(importlib.import_module(module_name), "__path__", []):
            for path in sorted([Path(folder) / CONVERSATION_FILE, *Path(folder).glob(f"*/{CONVERSATION_FILE}")]):
                if not path.is_file():
                    continue
                name = json.loads(path.read_text(encoding="utf-8")).get("flow")
                known.append(name)
                if name == flow_name:
                    return path
    raise SystemExit(f"No scripted conversation for flow '{flow_name}'. Bundled: {', '.join(known) or 'none'}.")


def load_conversation(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The conversation, and its model replies flattened in call order (the ``PICOFLOW_SCRIPT`` form)."""
    conversation = json.loads(path.read_text(encoding="utf-8"))
    replies = [reply for turn in conversation["turns"] for reply in turn.get("replies", [])]
    return conversation, replies


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="picoflow-demo", description=__doc__)
    parser.add_argument("--flow", default="HotelFlow", help="flow to replay (default: %(default)s)")
    parser.add_argument("--flows", default=default_flows(), metavar="MODULES",
                        help="comma-separated flow modules (default: $PICOFLOW_FLOWS or flows)")
    parser.add_argument("--handler", default=DEFAULT_HANDLER, metavar="MODULE:ATTR",
                        help="the Lambda handler (default: %(default)s)")
    parser.add_argument("--serve", action="store_true", help="keep serving the finished session's page until Ctrl+C")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    path = find_conversation(args.flow, args.flows)
    conversation, replies = load_conversation(path)
    workdir = Path(tempfile.mkdtemp(prefix="picoflow-demo-"))
    script = workdir / "script.json"
    script.write_text(json.dumps(replies), encoding="utf-8")
    os.environ.update(
        SESSION_STORE="SQLITE",
        SQLITE_PATH=str(workdir / "sessions.sqlite"),
        PICOFLOW_SCRIPT=str(script),
        FILES_FOLDER=str(workdir / "uploads"),
        POWERTOOLS_LOG_LEVEL=os.environ.get("POWERTOOLS_LOG_LEVEL", "WARNING"),
        POWERTOOLS_METRICS_DISABLED="true",
        **{FLOWS_VARIABLE: args.flows},
    )
    from picoflow.local.chat import ChatClient
    from picoflow.local.inspector import session_reader
    from picoflow.local.serve import make_server

    server = make_server("127.0.0.1", 0, args.handler, inspector=True)
    server.access_log = False
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        print(f"PicoFlow demo: {args.flow} ({len(conversation['turns'])} turns, {len(replies)} scripted model replies)")
        print(f"serving the Lambda handler at {server.url}, sessions in {workdir / 'sessions.sqlite'}")
        client = ChatClient(server.url, args.flow, conversation.get("config"))
        ok, session = _replay(client, conversation["turns"], path.parent)
        if not ok:
            return 1
        if session is None:
            return 0
        read_session = session_reader(server.lambda_handler)
        _print_session(read_session(session) if read_session else None)
        if args.serve:
            print(f"\nOpen {server.url}/?session={session} to inspect the session. Ctrl+C to stop.", flush=True)
            _wait_for_interrupt()
        else:
            print(f"\nTo inspect the session in the browser, serve the same sessions file:\n"
                  f"  {_serve_command(workdir / 'sessions.sqlite', args.flows, args.handler)}\n"
                  f"and open http://127.0.0.1:8000/?session={session}")
    finally:
        server.shutdown()
        server.server_close()
    return 0


def _print_reply(user: str, status: int, content_type: str, text: str) -> tuple[str | None, bool]:
    print(f"\nuser > {user}")
    if content_type.startswith(JSON):
        body = json.loads(text)
        if isinstance(body, dict) and "success" in body:
            label = "bot" if body["success"] else f"error {status} {body.get('code')}"
            print(f"{label} > {body['message']}")
            for item in body.get("pendingApprovals") or []:
                print(f"waiting > {item['tool']} {json.dumps(item['arguments'])} for the {item['approver']}'s decision")
            return body.get("session"), bool(body.get("completed"))
    print(f"bot ({content_type}) >\n{text}")
    return None, False


def _replay(client: ChatClient, turns: list[dict[str, Any]], folder: Path) -> tuple[bool, str | None]:
    """Send every scripted turn (uploading its ``files``, found in ``folder``); whether they all succeeded, and
    the session id."""
    session = None
    for turn in turns:
        file_ids = [_upload(client, folder, name) for name in turn.get("files", [])]
        decision = turn.get("decision")
        waiting = [item for item in client.pending if item.get("approver") == "user"]
        decisions = [{"id": item["id"], **decision} for item in waiting] if decision else None
        verdict = "approves" if decision and decision.get("approved") else "declines"
        said = turn.get("user") or f"({verdict} the waiting calls)"
        reply = client.send(turn.get("user") or "", file_ids, approvals=decisions)
        session = reply.session or session
        reported, completed = _print_reply(said, reply.status, reply.content_type, reply.text)
        session = reported or session
        print(f"      [session {session}]")
        if reply.status >= 400:
            return False, session
        if completed:
            print("(session completed)")
    return True, session


def _upload(client: ChatClient, folder: Path, name: str) -> str:
    # Only a plain file name beside conversation.json: a scripted turn never reaches elsewhere on disk.
    path = folder / Path(name).name
    content_type = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    print(f"\nupload > {path.name} ({content_type}, {path.stat().st_size} bytes)")
    return client.upload(path.name, content_type, path.read_bytes())


def _print_session(doc: dict[str, Any] | None) -> None:
    if doc is None:
        return
    tokens = doc["tokens"]
    print(f"\nsession {doc['id']}: runStatus={doc['runStatus']}, revision={doc['revision']}, "
          f"currentStep={doc['flow']['currentStep']}")
    print(f"tokens: input={tokens['inputTokens']} output={tokens['outputTokens']} total={tokens['totalTokens']}")


def _wait_for_interrupt() -> None:
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        print("\nStopped.", flush=True)


def _serve_command(sqlite_path: Path, flows: str, handler: str) -> str:
    """A ``picoflow serve`` command line for this environment that reads ``sqlite_path`` and the uploads beside it."""
    script = Path(sys.executable).with_name("picoflow")
    if script.exists():
        program = shlex.quote(os.path.relpath(script) if script.is_relative_to(Path.cwd()) else str(script))
    else:
        program = f"{shlex.quote(sys.executable)} -m picoflow.local.cli"
    options = "" if flows == DEFAULT_FLOW_MODULES else f" --flows {shlex.quote(flows)}"
    options += "" if handler == DEFAULT_HANDLER else f" --handler {shlex.quote(handler)}"
    uploads = shlex.quote(str(sqlite_path.parent / "uploads"))
    return (
        f"SESSION_STORE=SQLITE SQLITE_PATH={shlex.quote(str(sqlite_path))} FILES_FOLDER={uploads} "
        f"{program} serve{options} --port 8000"
    )


if __name__ == "__main__":
    sys.exit(main())

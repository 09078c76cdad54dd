"""The ``picoflow`` command: ``picoflow serve``, ``picoflow chat FLOW``, ``picoflow eval SCENARIO...``,
``picoflow new NAME`` and ``picoflow erase --owner SUB``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from picoflow.local import erase_command, eval_command, scaffold
from picoflow.local.chat import chat
from picoflow.local.project import DEFAULT_HANDLER, ProjectError, use_working_directory


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"not valid JSON: {error}") from error
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object, e.g. '{\"tenantId\": \"demo\"}'")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="picoflow", description="Run PicoFlow flows locally.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser(
        "serve",
        help="serve the Lambda handler over HTTP (API Gateway v2 events, no Docker)",
        description="Serve POST /ai/run, POST /ai/end, GET /ai/flows and GET /health through the Lambda "
        "handler, plus a chat page with a session inspector at / (local only). Sessions use SQLite unless "
        "SESSION_STORE is set.",
    )
    serve.add_argument("--host", default="127.0.0.1", help="interface to bind (default: %(default)s)")
    serve.add_argument("--port", type=int, default=8000, help="port to listen on, 0 for any (default: %(default)s)")
    serve.add_argument("--flows", metavar="MODULES", help="comma-separated modules whose flows to register")
    serve.add_argument(
        "--decision-providers",
        metavar="NAME=MODULE:ATTR",
        help="comma-separated decision providers (or factories) to register, e.g. typesafe=my_app.decisions:typesafe",
    )
    serve.add_argument(
        "--handler",
        default=DEFAULT_HANDLER,
        metavar="MODULE:ATTR",
        help="the Lambda handler (default: %(default)s; PicoFlow's own where there is no handlers package)",
    )
    serve.add_argument(
        "--no-inspector",
        dest="inspector",
        action="store_false",
        help="serve only the handler's routes: no page at / and no GET /ai/session",
    )

    chat = commands.add_parser(
        "chat",
        help="talk to a flow from the terminal",
        description="Each line is one turn; /end deletes the session; end of input quits.",
    )
    chat.add_argument("flow", metavar="FLOW", help="registered flow name, e.g. HotelFlow")
    chat.add_argument("--url", default="http://127.0.0.1:8000", help="API base URL (default: %(default)s)")
    chat.add_argument("--config", type=_json_object, metavar="JSON", help="session config sent on the first turn")

    evaluate = commands.add_parser(
        "eval", help="run scenario files against the flows and judge every turn", description=eval_command.DESCRIPTION
    )
    eval_command.add_arguments(evaluate)

    new = commands.add_parser("new", help="create a project of your own", description=scaffold.DESCRIPTION)
    scaffold.add_arguments(new)

    erase = commands.add_parser(
        "erase", help="erase one principal's sessions, journal entries and files", description=erase_command.DESCRIPTION
    )
    erase_command.add_arguments(erase)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``picoflow`` console script; returns the exit code."""
    args = _parser().parse_args(argv)
    if args.command == "new":
        return scaffold.run(args)
    use_working_directory()
    if args.command == "eval":
        return eval_command.run(args)
    if args.command == "erase":
        return erase_command.run(args)
    if args.command == "serve":
        # Imported here: the server imports the handler's logging and metrics, which read their settings from the
        # environment at import; `picoflow eval` sets quieter ones first, so its table is not mixed with log lines.
        from picoflow.local.serve import serve

        try:
            return serve(args.host, args.port, args.flows, inspector=args.inspector, handler=args.handler,
                         decision_providers=args.decision_providers)
        except ProjectError as error:
            print(f"picoflow serve: error: {error}", file=sys.stderr)
            return 2
    return chat(args.flow, args.url, args.config)


if __name__ == "__main__":
    raise SystemExit(main())

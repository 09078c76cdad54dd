"""``picoflow erase --owner SUB``: erase one principal's data from the stores the environment names.

The stores are those the handler would use (``SESSION_STORE``, ``SESSION_TABLE``, ``FILES_BUCKET`` /
``FILES_FOLDER``); like ``picoflow serve``, an unset ``SESSION_STORE`` means the local SQLite file. Against a
deployed stack, set ``SESSION_STORE=DYNAMODB``, ``SESSION_TABLE`` and ``FILES_BUCKET`` to its outputs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import TYPE_CHECKING

from picoflow.errors import PicoFlowError

if TYPE_CHECKING:
    from picoflow.aws.erasure import Erasure
from picoflow.files.factory import file_store_from_env
from picoflow.session.factory import store_from_env

DESCRIPTION = (
    "Remove everything stored for one principal (the verified claim its sessions record, `sub` by default): "
    "its sessions with their receipts, its effect-journal entries and its uploaded files. Anonymous sessions "
    "are never touched. Running it again is safe; it reports what it removed."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's options on ``parser``."""
    parser.add_argument("--owner", required=True, metavar="SUB", help="the principal to erase (its claim value)")


async def _erase(owner: str) -> Erasure:
    # Imported here: erasure logs through the handler's logger, which reads its level from the environment at
    # import, and the CLI imports this module for every command (`picoflow eval` sets a quieter level first).
    from picoflow.aws.erasure import erase_owner

    env = dict(os.environ)
    env.setdefault("SESSION_STORE", "SQLITE")
    store = store_from_env(env)
    try:
        return await erase_owner(store, file_store_from_env(env), owner)
    finally:
        await store.close()


def run(args: argparse.Namespace) -> int:
    """Erase ``args.owner``; the exit code (0 done, 2 refused or failed)."""
    owner = str(args.owner).strip()
    if not owner:
        print("picoflow erase: --owner must name a principal.", file=sys.stderr)
        return 2
    try:
        erased = asyncio.run(_erase(owner))
    except PicoFlowError as error:
        print(f"picoflow erase: {error}", file=sys.stderr)
        return 2
    print(f"Erased {erased.sessions} session(s) and {erased.files} file(s).")
    return 0

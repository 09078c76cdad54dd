"""Effects once, across processes: refunds applied when a refund turn fails at each point of its life and is retried.

Run: .venv/bin/python benchmarks/effects_bench.py

Starts DynamoDB Local (java, and npm the first time) and a loopback payments service that counts the refunds it
applies; each attempt of the turn is a process of its own, killed with SIGKILL at the crash points. Prints the
table and writes it to benchmarks/RESULTS.md. Goal: exactly 1 refund in every timing when the payments service
honours the refund tool's key; ignoring it, at most 1 except the two windows between the payments call and the
journal write.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

# Run as a script: make the repository root importable for benchmarks/ and tests/support/.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TITLE = "Effects once: refunds applied per failure timing"
COMMAND = ".venv/bin/python benchmarks/effects_bench.py"


def main() -> None:
    from benchmarks.results import write_section
    from tests.support.dynamodb_local import DUMMY_AWS_ENV, create_unique_table, local_client, running_dynamodb_local

    os.environ.update(DUMMY_AWS_ENV)
    from tests.support.effect_timings import WINDOWS, expected, run_timings, table_markdown

    started = time.monotonic()
    with running_dynamodb_local() as endpoint:
        client = local_client(endpoint)
        table = create_unique_table(client, endpoint)
        rows = run_timings(endpoint, table.name)
    elapsed = time.monotonic() - started
    table_text = table_markdown(rows)
    keyed = all(row.keyed_honoured == 1 for row in rows)
    windows = all(row.keyed_ignored <= 1 for row in rows if row.timing not in WINDOWS)
    promised = rows == [expected(row) for row in rows]
    body = f"""A refund turn of a session at revision 1 fails in its first attempt as each row says; the client then
re-sends it until it is answered (the model gives its tool calls new ids on every attempt). Every attempt is a
process of its own on DynamoDB Local (a crash is SIGKILL at that point); a loopback payments service counts the
refunds applied. "Keyed client": every attempt carries the client's `Idempotency-Key`; "keyless": the session id
only. "Key honoured": the payments service deduplicates on the `Idempotency-Key` the refund tool sends
(`tool_idempotency_key()`); "ignored": it applies every request. The 409 row: the first attempt journals the refund
and waits on a slow model, the client's retry replays the journal and waits longer, the first attempt commits and
the retry's write meets the conflict (a keyed retry reads the first attempt's receipt back instead).

{table_text}

Goals (effects once), {len(rows) * 4} runs in {elapsed:.0f} s:
- keyed client, key honoured: exactly 1 refund in every timing ({'met' if keyed else 'missed'})
- key ignored: at most 1 except the two windows between the payments call and the journal write (rows 2 and 3)
  ({'met' if windows else 'missed'})
- keyless client: as keyed, except where the turn had committed before the client heard of it (rows 5 and 8):
  its re-send is a new turn, and this scripted model asks for the refund again
  ({'as documented' if promised else 'differs'})
"""
    print(body)
    write_section(TITLE, COMMAND, body)


if __name__ == "__main__":
    main()

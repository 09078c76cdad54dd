"""One ``picoflow serve`` process for the load test: the real Lambda handler behind ``make_server``.

Run by ``benchmarks/load_test.py`` as ``python -m benchmarks.load_server READY_FILE`` with the store, flow and
script configured in the environment. It binds a free loopback port, writes its URL to READY_FILE and serves
until its standard input closes, so it never outlives the benchmark that started it.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

from picoflow.local.serve import make_server

#: Listen backlog to apply (0 keeps the server's own); benchmarks/load_test.py sets it for its tuned runs.
LISTEN_BACKLOG = int(os.environ.get("LOAD_TEST_LISTEN_BACKLOG", "0"))


def main(ready_file: str) -> None:
    server = make_server("127.0.0.1", 0)
    if LISTEN_BACKLOG:
        # A burst of simultaneous connects can overflow a short accept queue, and the kernel then resets some
        # of them. Calling listen() again on the bound socket only changes the queue's length.
        server.socket.listen(LISTEN_BACKLOG)
    # One line per request on stderr would cost the server more than some turns do.
    server.access_log = False

    def stop_when_orphaned() -> None:
        sys.stdin.read()
        server.shutdown()

    threading.Thread(target=stop_when_orphaned, daemon=True).start()
    # Written last and renamed into place, so the benchmark never reads half a URL.
    staging = Path(ready_file + ".tmp")
    staging.write_text(server.url, encoding="utf-8")
    staging.rename(ready_file)
    try:
        server.serve_forever()
    finally:
        server.server_close()


if __name__ == "__main__":
    main(sys.argv[1])

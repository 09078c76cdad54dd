"""Write one benchmark's section of benchmarks/RESULTS.md, leaving the other sections alone."""

from __future__ import annotations

import os
import platform
import re
from datetime import UTC, datetime
from pathlib import Path

RESULTS = Path(__file__).with_name("RESULTS.md")
HEADER = "# Benchmark results\n\nEach section is rewritten by the command named in it.\n"


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"


def write_section(title: str, command: str, body: str) -> None:
    """Replace (or append) the ``## title`` section with ``body``, stamped with the date and machine."""
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    section = f"## {title}\n\n`{command}` — {stamp}, {machine()}\n\n{body.strip()}\n"
    text = RESULTS.read_text(encoding="utf-8") if RESULTS.exists() else HEADER
    pattern = re.compile(rf"^## {re.escape(title)}\n.*?(?=^## |\Z)", re.DOTALL | re.MULTILINE)
    found = pattern.search(text)
    text = pattern.sub(lambda _: section + "\n", text) if found else text.rstrip("\n") + "\n\n" + section
    RESULTS.write_text(text.rstrip("\n") + "\n", encoding="utf-8")

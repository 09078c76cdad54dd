"""``make run``: every bundled conversation replays to completion through the local server and handler."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from picoflow.local.demo import find_conversation, load_conversation

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("flow", ["BasicFlow", "HotelFlow", "HomeInsuranceQuoteFlow", "InvoiceFlow", "SupportFlow"])
def test_demo_replays_the_bundled_conversation_to_completion(flow, tmp_path):
    conversation, replies = load_conversation(find_conversation(flow))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TMPDIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", "picoflow.local.demo", "--flow", flow],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env=env,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    out = result.stdout
    assert out.count("\nuser > ") == len(conversation["turns"])
    assert "runStatus=completed" in out
    assert "error " not in out
    assert replies  # the script is not empty, so every reply above came from it


def test_unknown_flow_names_the_bundled_ones():
    with pytest.raises(SystemExit, match="Bundled: .*BasicFlow"):
        find_conversation("NoSuchFlow")

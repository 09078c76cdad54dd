"""DynamoDB session item size and save+load latency for a realistic 40-message conversation.

Run: .venv/bin/python benchmarks/store_bench.py

Starts DynamoDB Local with the same helper as the integration tests, so it needs java (and npm
the first time). Goal: the stored item is at most a third of the raw JSON document.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

# Run as a script: make the repository root importable for benchmarks/ and tests/support/.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results import write_section  # noqa: E402
from picoflow.session.document import (  # noqa: E402
    SessionDoc,  # noqa: E402
    encode_document,
    new_document,
)
from picoflow.session.dynamodb_store import DynamoDBSessionStore  # noqa: E402
from tests.support.dynamodb_local import (  # noqa: E402
    DUMMY_AWS_ENV,
    create_unique_table,
    local_client,
    running_dynamodb_local,
)

ITERATIONS = 50
WARMUP = 10
MESSAGES = 40
GOAL_RATIO = 1 / 3
TITLE = "Session store: DynamoDB item size and latency"
COMMAND = ".venv/bin/python benchmarks/store_bench.py"

GUEST_LINES = [
    "Hi, I'm looking for a hotel in Lisbon for the first week of May, two adults, ideally near Alfama.",
    "Our budget is around 180 euros a night. A balcony or a view of the river would be lovely.",
    "Does the second one have parking? We will arrive by car from Porto in the late afternoon.",
    "Can you check whether breakfast is included and whether they allow late check-out on Sunday?",
    "Actually, could we shift the dates by one day, arriving on the 2nd and leaving on the 8th?",
    "That sounds good. Please book the room with the river view and send the confirmation to my email.",
]
EXPLORE_PROMPT = (
    "You are a hotel booking assistant. Ask for the destination, dates, party size and budget, then search "
    "with the search_hotels tool. Never invent prices or availability; quote only what the tool returned."
)
PRESENT_PROMPT = (
    "Present at most five hotels from the latest search as a short comparison, answer follow-up questions "
    "from the hotel details, and book only after the guest explicitly confirms one option and the dates."
)
ASSISTANT_LINES = [
    "I found several hotels that match your dates and budget. Here are the options closest to Alfama, "
    "sorted by guest rating, with the nightly rate including taxes and the walking distance to the "
    "Miradouro de Santa Luzia.",
    "The Memmo Alfama has a terrace overlooking the Tagus and rooms with balconies on the upper floors. "
    "It is slightly above your budget on the Friday and Saturday nights, but the average across the "
    "week is 176 euros. Breakfast is served until 11:00 and is included in the flexible rate.",
    "Parking is available at a public garage two minutes away; the hotel offers a discounted daily rate "
    "of 18 euros for guests. Late check-out until 14:00 can be requested at the front desk and is "
    "confirmed on the morning of departure, subject to availability.",
    "I have updated the search for arrival on 2 May and departure on 8 May. The river-view double is "
    "still available at a total of 1,062 euros for six nights, with free cancellation until 48 hours "
    "before arrival.",
]


def _hotels(rng: random.Random, city: str) -> list[dict[str, Any]]:
    names = ["Memmo Alfama", "Solar do Castelo", "Palacio Belmonte", "Alfama Patio", "Lisbon Story Guesthouse"]
    return [
        {
            "hotelId": f"H{rng.randrange(10**6):06d}",
            "name": name,
            "city": city,
            "neighbourhood": "Alfama",
            "rating": round(rng.uniform(4.1, 4.9), 1),
            "reviews": rng.randrange(120, 2400),
            "nightlyRate": {"amount": rng.randrange(120, 240), "currency": "EUR", "taxesIncluded": True},
            "amenities": rng.sample(
                ["wifi", "breakfast", "balcony", "river view", "air conditioning", "parking", "bar", "terrace"], 5
            ),
            "cancellation": "Free cancellation until 48 hours before arrival.",
            "distanceMeters": rng.randrange(80, 900),
        }
        for name in names
    ]


# Two of every three turns go through a search tool call, as a booking conversation would.
def _conversation(rng: random.Random, step: str, count: int, start_turn: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    turn = start_turn
    while len(messages) < count:
        stamp = f"2026-03-04T05:{turn:02d}:{rng.randrange(60):02d}.{rng.randrange(1000):03d}Z"

        def message_id(stamp: str = stamp) -> str:
            return f"{step}|{stamp}|{rng.randrange(10**10):010d}"

        messages.append({"type": "human", "id": message_id(), "content": GUEST_LINES[turn % len(GUEST_LINES)]})
        if turn % 3 != 2 and count - len(messages) >= 3:
            call_id = f"call_{rng.randrange(16**24):024x}"
            args = {"city": "Lisbon", "checkIn": "2026-05-02", "checkOut": "2026-05-08", "guests": 2}
            messages.append(
                {
                    "type": "ai",
                    "id": message_id(),
                    "content": "",
                    "tool_calls": [{"name": "search_hotels", "args": args, "id": call_id}],
                }
            )
            messages.append(
                {
                    "type": "tool",
                    "id": message_id(),
                    "name": "search_hotels",
                    "tool_call_id": call_id,
                    "status": "success",
                    "content": json.dumps(_hotels(rng, "Lisbon")),
                }
            )
        messages.append({"type": "ai", "id": message_id(), "content": ASSISTANT_LINES[turn % len(ASSISTANT_LINES)]})
        turn += 1
    return messages


def build_document() -> SessionDoc:
    """A HotelFlow session after a realistic conversation: 40 messages in two namespaces, with tool calls."""
    rng = random.Random(42)
    explore = [{"type": "system", "content": EXPLORE_PROMPT}, *_conversation(rng, "ExploreStep", 18, 0)]
    present = [{"type": "system", "content": PRESENT_PROMPT}, *_conversation(rng, "PresentStep", 20, 6)]
    doc = new_document(
        {
            "name": "HotelFlow",
            "model": {"provider": "openai", "name": "gpt-4o", "params": {"temperature": 0.2}, "retryAttempts": 3},
            "context": {"config": {"tenantId": "demo", "locale": "en-GB", "channel": "web"}},
            "memory": {"hotel-explore": {"messages": explore}, "hotel-present": {"messages": present}},
            "steps": [
                {
                    "name": "ExploreStep",
                    "state": {
                        "city": "Lisbon",
                        "checkIn": "2026-05-02",
                        "checkOut": "2026-05-08",
                        "guests": 2,
                        "budget": {"amount": 180, "currency": "EUR"},
                        "_saveOn": "2026-03-04T05:09:12.000Z",
                    },
                },
                {
                    "name": "PresentStep",
                    "state": {"shortlist": ["Memmo Alfama", "Solar do Castelo"], "_saveOn": "2026-03-04T05:14:40.000Z"},
                },
            ],
            "currentStep": "PresentStep",
            "sequence": [{"level": 1, "stepName": "ExploreStep"}, {"level": 1, "stepName": "PresentStep"}],
        }
    )
    doc.tokens.input_tokens, doc.tokens.output_tokens, doc.tokens.total_tokens = 48_210, 3_904, 52_114
    return doc


async def measure(endpoint_url: str, doc: SessionDoc) -> dict[str, float]:
    table = create_unique_table(local_client(endpoint_url), endpoint_url, prefix="bench")
    store = table.store()
    current = await store.create(doc.flow)
    current.tokens = doc.tokens
    saves, loads = [], []
    # The first requests warm the emulator's JVM; they are run but not counted.
    for iteration in range(WARMUP + ITERATIONS):
        started = time.perf_counter()
        current = await store.save(current, current.revision)
        saved_at = time.perf_counter()
        loaded = await store.load(current.id)
        loaded_at = time.perf_counter()
        assert loaded is not None and loaded.revision == current.revision
        if iteration >= WARMUP:
            saves.append(saved_at - started)
            loads.append(loaded_at - saved_at)
    await store.close()
    table.client.close()
    pairs = [s + load for s, load in zip(saves, loads, strict=True)]
    return {
        "save_ms": statistics.median(saves) * 1000,
        "load_ms": statistics.median(loads) * 1000,
        "pair_ms": statistics.median(pairs) * 1000,
        "pair_p95_ms": sorted(pairs)[math.ceil(0.95 * len(pairs)) - 1] * 1000,
    }


def main() -> None:
    os.environ.update(DUMMY_AWS_ENV)
    doc = build_document()
    raw = len(encode_document(doc))
    stored = DynamoDBSessionStore("size-only").stored_size(doc)
    with running_dynamodb_local() as endpoint_url:
        timings = asyncio.run(measure(endpoint_url, doc))
    ratio = stored / raw
    messages = sum(len(ns.messages) for ns in doc.flow.memory.values())
    rows = [
        ("Messages in the document", f"{messages}"),
        ("Raw JSON document", f"{raw:,} bytes"),
        ("Stored DynamoDB item (zlib doc + attributes)", f"{stored:,} bytes"),
        ("Stored / raw", f"{ratio:.2f} (goal ≤ {GOAL_RATIO:.2f}: {'met' if ratio <= GOAL_RATIO else 'NOT met'})"),
        ("Write units per save, compressed item", f"{math.ceil(stored / 1024)}"),
        ("Write units per save, had the JSON been stored uncompressed", f"{math.ceil(raw / 1024)}"),
        (f"Median save (conditional PutItem), {ITERATIONS} runs", f"{timings['save_ms']:.1f} ms"),
        (f"Median load (consistent GetItem), {ITERATIONS} runs", f"{timings['load_ms']:.1f} ms"),
        ("Median save + load", f"{timings['pair_ms']:.1f} ms (p95 {timings['pair_p95_ms']:.1f} ms)"),
    ]
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        print(f"{label:<{width}}  {value}")
    table = "| Measure | Value |\n| --- | --- |\n" + "\n".join(f"| {label} | {value} |" for label, value in rows)
    write_section(
        TITLE,
        COMMAND,
        f"{table}\n\nLatency is against DynamoDB Local on this machine (loopback, in memory, after {WARMUP} "
        "warm-up round trips): it shows the store's own overhead, not AWS network time.",
    )


if __name__ == "__main__":
    main()

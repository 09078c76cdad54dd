"""The behavioural suite every ``SessionStore`` must pass, using only the public store contract.

Run it whole from any test::

    passed = await run_conformance(lambda: MyStore(...))

or one check at a time (``CHECK_NAMES`` / ``run_check``) to get one test per check. Each check
gets a fresh store from the factory and closes it afterwards. A failure raises ``AssertionError``
with a message naming the check.
"""

from __future__ import annotations

import asyncio
import base64
import inspect
import os
import random
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from picoflow.errors import SessionConflictError, SessionFlowInvariantError, SessionTooLargeError
from picoflow.session.document import MessageDoc, SessionDoc, new_document
from picoflow.session.receipts import TurnReceipt
from picoflow.session.store import SessionStore

StoreFactory = Callable[[], "SessionStore | Awaitable[SessionStore]"]

FLOW_NAME = "ConformanceFlow"
ISO_INSTANT = "2026-03-04T05:06:07.000Z"
ISO_DATE = "2026-03-04"
LARGE_HISTORY_BYTES = 1024 * 1024

_CONCURRENT_ROUNDS = 3
_CONTENDERS = 4


def _flow(name: str = FLOW_NAME) -> dict[str, Any]:
    return {
        "name": name,
        "model": {"provider": "scripted", "name": "conformance", "params": {"temperature": 0}},
        "context": {"config": {"tenantId": "conformance"}},
        "memory": {"ExploreStep": {"messages": [{"type": "system", "content": "You are a test."}]}},
        "steps": [{"name": "ExploreStep", "state": {"visits": 1}}],
        "currentStep": "ExploreStep",
        "sequence": [{"level": 1, "stepName": "ExploreStep"}],
    }


def _same(actual: SessionDoc, expected: SessionDoc) -> bool:
    return actual.to_json_dict() == expected.to_json_dict()


async def _load(store: SessionStore, session_id: str, check: str) -> SessionDoc:
    doc = await store.load(session_id)
    assert doc is not None, f"{check}: load({session_id!r}) returned None for a stored session"
    return doc


async def check_create_and_load(store: SessionStore) -> None:
    """``create`` returns revision 0 under a new id, and ``load`` returns that stored revision."""
    created = await store.create(_flow())
    assert created.revision == 0, f"create_and_load: create returned revision {created.revision}, expected 0"
    assert created.id, "create_and_load: create returned an empty id"
    other = await store.create(_flow())
    assert other.id != created.id, "create_and_load: two creates returned the same id"
    loaded = await _load(store, created.id, "create_and_load")
    assert loaded.revision == 0, f"create_and_load: load returned revision {loaded.revision}, expected 0"
    assert _same(loaded, created), "create_and_load: the loaded document differs from the created one"
    for unknown in ("no-such-session", ""):
        assert await store.load(unknown) is None, f"create_and_load: load({unknown!r}) of an unknown id is not None"


async def check_save_increments(store: SessionStore) -> None:
    """``save`` writes at ``expected + 1``, returns that copy, and ``load`` sees it."""
    doc = await store.create(_flow())
    doc.flow.current_step = "PresentStep"
    saved = await store.save(doc, 0)
    assert saved.revision == 1, f"save_increments: first save returned revision {saved.revision}, expected 1"
    assert saved is not doc, "save_increments: save returned the caller's object instead of a copy"
    loaded = await _load(store, doc.id, "save_increments")
    assert loaded.revision == 1, f"save_increments: load after save returned revision {loaded.revision}"
    assert loaded.flow.current_step == "PresentStep", "save_increments: the saved change was not persisted"
    again = await store.save(saved, 1)
    assert again.revision == 2, f"save_increments: second save returned revision {again.revision}, expected 2"
    assert (await _load(store, doc.id, "save_increments")).revision == 2, "save_increments: revision 2 not stored"


async def check_chosen_id_and_item_data(store: SessionStore) -> None:
    """``create`` under a chosen id (a second create there conflicts); receipts and write id ride along."""
    chosen = base64.b32encode(os.urandom(10)).decode().lower()
    created = await store.create(_flow(), session_id=chosen)
    assert created.id == chosen, f"chosen_id: create returned id {created.id!r}, expected {chosen!r}"
    await _refused(
        store.create(_flow(), session_id=chosen), SessionConflictError,
        "chosen_id: a second create under the same id did not raise SessionConflictError",
    )
    response = {"message": "hi", "status_code": 200}
    receipt = TurnReceipt(key="k" * 64, request="r" * 64, at=1_800_000_000, response=response)
    created.receipts = [receipt]
    created.write_id = "write-1"
    await store.save(created, 0)
    loaded = await _load(store, chosen, "chosen_id")
    assert loaded.receipts == [receipt], "chosen_id: the saved receipts did not come back"
    assert loaded.write_id == "write-1", "chosen_id: the saved write id did not come back"
    assert "_item" not in loaded.to_json_dict(), "chosen_id: item data leaked into the portable document"


async def check_iso_strings_round_trip(store: SessionStore) -> None:
    """ISO-looking strings in context, state and messages come back as the same strings."""
    doc = await store.create(_flow())
    doc.flow.context["config"]["checkIn"] = ISO_INSTANT
    doc.flow.context["travel"] = {"dates": [ISO_DATE, ISO_INSTANT], "nested": {"at": ISO_INSTANT}}
    doc.flow.steps[0].state.update({"_saveOn": ISO_INSTANT, "bookedOn": ISO_DATE})
    doc.flow.memory["ExploreStep"].messages[0].content = ISO_INSTANT
    await store.save(doc, 0)
    loaded = await _load(store, doc.id, "iso_strings_round_trip")
    context = loaded.flow.context
    found = {
        "context.config.checkIn": context["config"]["checkIn"],
        "context.travel.dates[0]": context["travel"]["dates"][0],
        "context.travel.dates[1]": context["travel"]["dates"][1],
        "context.travel.nested.at": context["travel"]["nested"]["at"],
        "steps[0].state._saveOn": loaded.flow.steps[0].state["_saveOn"],
        "steps[0].state.bookedOn": loaded.flow.steps[0].state["bookedOn"],
        "memory message content": loaded.flow.memory["ExploreStep"].messages[0].content,
    }
    expected = {
        "context.config.checkIn": ISO_INSTANT,
        "context.travel.dates[0]": ISO_DATE,
        "context.travel.dates[1]": ISO_INSTANT,
        "context.travel.nested.at": ISO_INSTANT,
        "steps[0].state._saveOn": ISO_INSTANT,
        "steps[0].state.bookedOn": ISO_DATE,
        "memory message content": ISO_INSTANT,
    }
    for where, value in found.items():
        assert type(value) is str, f"iso_strings_round_trip: {where} came back as {type(value).__name__}, not str"
        assert value == expected[where], f"iso_strings_round_trip: {where} came back as {value!r}"
    assert isinstance(loaded.created_on, datetime), "iso_strings_round_trip: createdOn is not a datetime"
    assert isinstance(loaded.save_on, datetime), "iso_strings_round_trip: saveOn is not a datetime"


async def check_stale_writes_conflict(store: SessionStore) -> None:
    """A stale ``save`` and a stale revision-checked ``delete`` raise ``SessionConflictError``; nothing changes."""
    doc = await store.create(_flow())
    await store.save(doc, 0)
    doc.flow.current_step = "StaleStep"
    await _refused(
        store.save(doc, 0), SessionConflictError,
        "stale_writes_conflict: a save from revision 0 over revision 1 did not conflict",
    )
    await _refused(
        store.delete(doc.id, 0), SessionConflictError,
        "stale_writes_conflict: a delete expecting revision 0 over revision 1 did not conflict",
    )
    loaded = await _load(store, doc.id, "stale_writes_conflict")
    assert loaded.revision == 1, f"stale_writes_conflict: stored revision became {loaded.revision}, expected 1"
    assert loaded.flow.current_step != "StaleStep", "stale_writes_conflict: the stale save was written"
    missing = await store.create(_flow())
    await store.delete(missing.id)
    await _refused(
        store.save(missing, 0), SessionConflictError,
        "stale_writes_conflict: saving a deleted session did not conflict",
    )
    assert await store.load(missing.id) is None, "stale_writes_conflict: saving a deleted session recreated it"


async def check_delete_then_load(store: SessionStore) -> None:
    """``delete`` removes the document (with or without a matching revision); ``load`` then returns ``None``."""
    checked = await store.create(_flow())
    await store.delete(checked.id, 0)
    assert await store.load(checked.id) is None, "delete_then_load: load after a revision-checked delete found it"
    plain = await store.create(_flow())
    await store.save(plain, 0)
    await store.delete(plain.id)
    assert await store.load(plain.id) is None, "delete_then_load: load after an unconditional delete found it"
    # Deleting what is not there (or was never there) without a revision is not an error.
    await store.delete(plain.id)
    await store.delete("")


async def check_concurrent_saves(store: SessionStore) -> None:
    """Concurrent saves from one revision: exactly one wins, every other raises ``SessionConflictError``."""
    doc = await store.create(_flow())
    for round_no in range(_CONCURRENT_ROUNDS):
        base = await _load(store, doc.id, "concurrent_saves")
        contenders = []
        for n in range(_CONTENDERS):
            contender = base.model_copy(deep=True)
            contender.flow.context["writer"] = f"round-{round_no}-writer-{n}"
            contenders.append(contender)
        results = await asyncio.gather(
            *(store.save(c, base.revision) for c in contenders), return_exceptions=True
        )
        winners = [r for r in results if isinstance(r, SessionDoc)]
        unexpected = [r for r in results if not isinstance(r, SessionDoc | SessionConflictError)]
        assert not unexpected, f"concurrent_saves: a save failed with something other than a conflict: {unexpected!r}"
        assert len(winners) == 1, (
            f"concurrent_saves: {len(winners)} of {_CONTENDERS} saves from revision {base.revision} succeeded, "
            "expected exactly one"
        )
        stored = await _load(store, doc.id, "concurrent_saves")
        assert stored.revision == base.revision + 1, (
            f"concurrent_saves: stored revision is {stored.revision}, expected {base.revision + 1}"
        )
        assert stored.flow.context["writer"] == winners[0].flow.context["writer"], (
            "concurrent_saves: the stored document is not the winner's"
        )


async def check_load_applies_no_policy(store: SessionStore) -> None:
    """``load`` returns old-version, long-idle and finished documents exactly as stored."""
    doc = await store.create(_flow())
    doc.version = 0.9
    doc.flow.context["lastSeen"] = "2001-01-01T00:00:00.000Z"
    doc.flow.steps[0].state["_saveOn"] = "2001-01-01T00:00:00.000Z"
    saved = await store.save(doc, 0)
    loaded = await _load(store, doc.id, "load_applies_no_policy")
    assert loaded.version == 0.9, f"load_applies_no_policy: version came back as {loaded.version}"
    assert _same(loaded, saved), "load_applies_no_policy: an old-version document was altered on load"
    for status in ("completed", "aborted"):
        finished = await store.create(_flow())
        finished.run_status = status
        written = await store.save(finished, 0)
        reloaded = await _load(store, finished.id, "load_applies_no_policy")
        assert reloaded.run_status == status, (
            f"load_applies_no_policy: a {status} document came back {reloaded.run_status}"
        )
        assert _same(reloaded, written), f"load_applies_no_policy: a {status} document was altered on load"


async def check_blank_flow_name(store: SessionStore) -> None:
    """A blank flow name is refused with ``SessionFlowInvariantError`` on create and on save."""
    for blank in ("", "   "):
        await _refused(
            store.create(_flow(blank)), SessionFlowInvariantError,
            f"blank_flow_name: create accepted flow name {blank!r}",
        )
    doc = await store.create(_flow())
    doc.flow.name = "  "
    await _refused(store.save(doc, 0), SessionFlowInvariantError, "blank_flow_name: save accepted a blank flow name")
    loaded = await _load(store, doc.id, "blank_flow_name")
    assert loaded.revision == 0 and loaded.flow.name == FLOW_NAME, "blank_flow_name: the refused save changed the doc"


async def check_flow_name_rebinding(store: SessionStore) -> None:
    """Saving a document under another flow name than the stored one is a conflict."""
    doc = await store.create(_flow())
    doc.flow.name = "AnotherFlow"
    await _refused(
        store.save(doc, 0), SessionConflictError,
        "flow_name_rebinding: a save changed the flow bound to the session",
    )
    loaded = await _load(store, doc.id, "flow_name_rebinding")
    assert loaded.flow.name == FLOW_NAME and loaded.revision == 0, "flow_name_rebinding: the stored doc changed"


async def check_size_limit(store: SessionStore) -> str | None:
    """An oversized document is refused with ``SessionTooLargeError`` and the stored one stays intact."""
    limit = store.max_document_bytes
    if limit is None:
        return "store is unbounded (max_document_bytes is None)"
    doc = await store.create(_flow())
    before = await _load(store, doc.id, "size_limit")
    # Random bytes in base64 barely compress, so this overflows raw and compressed encodings alike.
    doc.flow.context["blob"] = base64.b64encode(os.urandom(limit * 3 // 2)).decode("ascii")
    size = store.stored_size(doc)
    assert size > limit, f"size_limit: test document is only {size} bytes stored, limit {limit}"
    try:
        await store.save(doc, 0)
    except SessionTooLargeError as exc:
        assert exc.limit == limit and exc.size > limit, f"size_limit: error reports size {exc.size}, limit {exc.limit}"
    else:
        raise AssertionError(f"size_limit: a {size}-byte document was accepted over the {limit}-byte limit")
    after = await _load(store, doc.id, "size_limit")
    assert _same(after, before), "size_limit: the refused save changed the stored document"
    del doc.flow.context["blob"]
    saved = await store.save(doc, 0)
    assert saved.revision == 1, "size_limit: the revision moved although the oversized save was refused"
    return None


def large_history_messages(total_bytes: int = LARGE_HISTORY_BYTES, seed: int = 7) -> list[dict[str, Any]]:
    """Chat messages totalling about ``total_bytes`` of text, with a natural-language-like word mix."""
    rng = random.Random(seed)
    vocabulary = [
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(300)
    ]
    weights = [1 / (rank + 1) for rank in range(len(vocabulary))]
    messages: list[dict[str, Any]] = []
    size = 0
    while size < total_bytes:
        n = len(messages)
        text = " ".join(rng.choices(vocabulary, weights, k=rng.randint(80, 600)))
        message: dict[str, Any] = {
            "type": "human" if n % 2 == 0 else "ai",
            "content": text,
            "id": f"ExploreStep|2026-03-04T05:{n // 60 % 60:02d}:{n % 60:02d}.000Z|{rng.randrange(10**10):010d}",
        }
        messages.append(message)
        size += len(text)
    return messages


async def check_large_history(store: SessionStore) -> None:
    """A session with about 1 MiB of compressible conversation history round-trips intact."""
    doc = await store.create(_flow())
    doc.flow.memory["ExploreStep"].messages.extend(MessageDoc.model_validate(m) for m in large_history_messages())
    limit = store.max_document_bytes
    size = store.stored_size(doc)
    assert limit is None or size <= limit, f"large_history: ~1 MiB history takes {size} bytes stored, limit {limit}"
    saved = await store.save(doc, 0)
    loaded = await _load(store, doc.id, "large_history")
    assert _same(loaded, saved), "large_history: the loaded document differs from the saved one"


async def check_effect_journal(store: SessionStore) -> None:
    """The effect journal: a recorded outcome loads back as it was; a key is recorded once (the first outcome
    stays, among concurrent writers exactly one wins); unknown keys load None; entries never show as sessions."""
    doc = await store.create(_flow())
    outcome = {"kind": "transition", "states": {"ExploreStep": {"note": "Zoë", "n": [1, 2.5, None]}}, "at": ISO_INSTANT}
    assert await store.record_effect(doc.id, "k-first", outcome) is True, "effect_journal: a new key was not recorded"
    assert await store.load_effect(doc.id, "k-first") == outcome, "effect_journal: the outcome did not round-trip"
    assert await store.record_effect(doc.id, "k-first", {"kind": "none"}) is False, (
        "effect_journal: a key was recorded twice"
    )
    assert await store.load_effect(doc.id, "k-first") == outcome, "effect_journal: a second record replaced the first"
    assert await store.load_effect(doc.id, "k-unknown") is None, "effect_journal: an unknown key loaded an outcome"
    won = await asyncio.gather(*(store.record_effect(doc.id, "k-race", {"writer": n}) for n in range(_CONTENDERS)))
    assert won.count(True) == 1, f"effect_journal: {won.count(True)} concurrent writers recorded one key"
    loaded = await _load(store, doc.id, "effect_journal")
    assert loaded.revision == 0 and _same(loaded, doc), "effect_journal: recording an effect changed the session"


async def check_owner_erasure(store: SessionStore) -> None:
    """``delete_owner`` removes the owner's sessions (receipts with them) and journal entries, whatever their state,
    and nothing of anyone else's; a second call finds nothing; a blank owner is refused."""
    owner, other = "erasure-" + os.urandom(6).hex(), "keeper-" + os.urandom(6).hex()
    first = await store.create(_flow(), owner=owner)
    first.receipts = [TurnReceipt(key="k" * 64, request="r" * 64, at=1_800_000_000, response={"message": "hi"})]
    saved = await store.save(first, 0)
    inserted = await store.insert(new_document(_flow(), owner=owner))
    theirs = await store.create(_flow(), owner=other)
    anonymous = await store.create(_flow())
    assert await store.record_effect(saved.id, "k-erased", {"kind": "none"}, owner=owner), (
        "owner_erasure: a new key was not recorded"
    )
    assert await store.record_effect(theirs.id, "k-kept", {"kind": "none"}, owner=other), (
        "owner_erasure: a new key was not recorded"
    )
    removed = await store.delete_owner(owner)
    assert removed == 2, f"owner_erasure: delete_owner reported {removed} sessions removed, expected 2"
    for gone in (saved.id, inserted.id):
        assert await store.load(gone) is None, f"owner_erasure: session {gone!r} of the erased owner remains"
    assert await store.load_effect(saved.id, "k-erased") is None, "owner_erasure: the owner's journal entry remains"
    kept = await _load(store, theirs.id, "owner_erasure")
    assert kept.owner == other and _same(kept, theirs), "owner_erasure: another owner's session changed"
    assert await store.load(anonymous.id) is not None, "owner_erasure: an anonymous session was removed"
    assert await store.load_effect(theirs.id, "k-kept") == {"kind": "none"}, (
        "owner_erasure: another owner's journal entry was removed"
    )
    assert await store.delete_owner(owner) == 0, "owner_erasure: a second delete_owner found sessions"
    await _refused(store.delete_owner(""), ValueError, "owner_erasure: delete_owner('') did not raise ValueError")


async def _refused(call: Awaitable[Any], refusal: type[Exception], complaint: str) -> None:
    """Await ``call``, which must raise ``refusal``; ``complaint`` says what the store did instead."""
    try:
        await call
    except refusal:
        return
    raise AssertionError(complaint)


Check = Callable[[SessionStore], Awaitable[str | None]]

CHECKS: dict[str, Check] = {
    "create_and_load": check_create_and_load,
    "save_increments": check_save_increments,
    "chosen_id_and_item_data": check_chosen_id_and_item_data,
    "iso_strings_round_trip": check_iso_strings_round_trip,
    "stale_writes_conflict": check_stale_writes_conflict,
    "delete_then_load": check_delete_then_load,
    "concurrent_saves": check_concurrent_saves,
    "load_applies_no_policy": check_load_applies_no_policy,
    "blank_flow_name": check_blank_flow_name,
    "flow_name_rebinding": check_flow_name_rebinding,
    "effect_journal": check_effect_journal,
    "owner_erasure": check_owner_erasure,
    "size_limit": check_size_limit,
    "large_history": check_large_history,
}
CHECK_NAMES: tuple[str, ...] = tuple(CHECKS)


async def _make(make_store: StoreFactory) -> SessionStore:
    store = make_store()
    if inspect.isawaitable(store):
        store = await store
    return store


async def run_check(name: str, make_store: StoreFactory, *, large_history: bool = False) -> str:
    """Run one named check on a fresh store; return ``name``, or ``"name (skipped: why)"``."""
    if name not in CHECKS:
        raise KeyError(f"Unknown conformance check {name!r}; known: {', '.join(CHECK_NAMES)}")
    if name == "large_history" and not large_history:
        return f"{name} (skipped: large_history=False)"
    store = await _make(make_store)
    try:
        skipped = await CHECKS[name](store)
    finally:
        await store.close()
    return f"{name} (skipped: {skipped})" if skipped else name


async def run_conformance(make_store: StoreFactory, *, large_history: bool = False) -> list[str]:
    """Run every check in order, each on a fresh store; return the outcome line of each."""
    return [await run_check(name, make_store, large_history=large_history) for name in CHECK_NAMES]

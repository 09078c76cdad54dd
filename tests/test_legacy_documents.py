"""Documents written by the original runtime load, migrate and continue exactly where they stood.

``tests/fixtures/legacy_v1_session.json`` is written for these tests from the shapes that runtime used:
envelope version 1 with a ``flows`` list and a document-database ``_id``, memory as ``[{nameSpace, history}]``,
the cursor as ``isActive`` on a step, a step's model as ``modelName`` / ``modelParamsName`` / ``modelParams``,
the sequence as plain step names and structured output stored as an object.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from picoflow import Flow, ModelSelection, Step
from picoflow.session.document import SESSION_DOC_VERSION, encode_document, validate_namespace
from picoflow.stores import MemorySessionStore, SessionDoc
from tests.support.engine import scripted_engine, text

FIXTURE = Path(__file__).parent / "fixtures" / "legacy_v1_session.json"


def legacy() -> dict[str, Any]:
    return json.loads(FIXTURE.read_text())


class GatherStep(Step):
    def get_prompt(self) -> str:
        return "Gather the trip's city and length."


class ItineraryStep(Step):
    def get_prompt(self) -> str:
        return f"Refine the itinerary for {self.flow.get_step_state(GatherStep, 'city')}."


class LegacyTripFlow(Flow):
    migrated: list[int] = []

    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="openai", name="gpt-4o")

    def define_steps(self) -> list[Step]:
        return [GatherStep(self).use_memory("trip"), ItineraryStep(self).use_memory("trip")]

    async def on_restore_session_doc(self, doc: SessionDoc) -> SessionDoc | None:
        # The documented migration recipe: accept the older version and stamp the current one.
        if doc.version == 1:
            LegacyTripFlow.migrated.append(doc.revision)
            doc.version = SESSION_DOC_VERSION
        return doc if doc.version == SESSION_DOC_VERSION else None


def test_every_legacy_shape_is_normalised_on_load():
    doc = SessionDoc.from_stored(legacy())
    flow = doc.flow
    assert doc.id == "legacy-7d1c2f0a" and doc.version == 1
    assert flow.current_step == "ItineraryStep"
    assert [(item.level, item.step_name) for item in flow.sequence] == [(1, "GatherStep"), (1, "ItineraryStep")]
    itinerary = next(step for step in flow.steps if step.name == "ItineraryStep")
    assert itinerary.model is not None
    assert (itinerary.model.provider, itinerary.model.name) == ("openai", "o4-mini")
    assert itinerary.model.params == {"reasoning": {"effort": "low"}}
    messages = flow.memory["trip"].messages
    assert json.loads(messages[2].content) == {"city": "Lisbon", "days": 2}
    dumped = doc.to_json_dict()
    assert "_id" not in dumped and "expireAfter" not in dumped and "flows" not in dumped


def test_a_document_keyed_only_by_its_database_id_gets_that_id():
    data = legacy()
    del data["id"]
    assert SessionDoc.from_stored(data).id == "65f0c0ffee0000000000abcd"


async def _stored_legacy(store: MemorySessionStore) -> str:
    """Put the legacy document in the store as the original runtime left it, at its revision."""
    doc = SessionDoc.from_stored(legacy())
    store._rows[doc.id] = (doc.revision, doc.flow.name, json.dumps(legacy()).encode())
    return doc.id


async def test_a_migrated_session_continues_exactly_where_it_stood():
    LegacyTripFlow.migrated = []
    store = MemorySessionStore()
    session = await _stored_legacy(store)
    engine, model = scripted_engine([LegacyTripFlow], [text("Day two now ends at the Gulbenkian.")], store=store)
    response = await engine.run("LegacyTripFlow", "Keep the museum late in the day.", session_id=session)
    assert (response.success, response.session) == (True, session), response.detail
    assert LegacyTripFlow.migrated == [4]

    # The step's own model selection survived: the call went to o4-mini with its reasoning effort.
    selection = model.selections[0]
    assert (selection.name, selection.params) == ("o4-mini", {"reasoning": {"effort": "low"}})
    request = model.calls[0]
    assert request[0].content == "Refine the itinerary for Lisbon."
    assert [m.content for m in request[1:4]] == [
        "Two days in Lisbon, please.", '{"city": "Lisbon", "days": 2}', "Add a museum."
    ]

    stored = await store.load(session)
    assert stored is not None and stored.version == SESSION_DOC_VERSION and stored.revision == 6
    assert stored.flow.current_step == "ItineraryStep" and stored.run_status == "running"
    assert stored.tokens.input_tokens >= 900
    # Saved in the current shape, and it loads again unchanged.
    again = SessionDoc.from_stored(json.loads(encode_document(stored)))
    assert again.to_json_dict() == stored.to_json_dict()


async def test_a_legacy_document_without_a_resolvable_cursor_is_declined_not_aborted():
    data = legacy()
    for step in data["flows"][0]["steps"]:
        step["isActive"] = False
    data["flows"][0]["steps"][1]["name"] = "RenamedStep"
    store = MemorySessionStore()
    store._rows[data["id"]] = (data["revision"], "LegacyTripFlow", json.dumps(data).encode())
    engine, _ = scripted_engine([LegacyTripFlow], [text("hello")], store=store)
    response = await engine.run("LegacyTripFlow", "hi", session_id=data["id"])
    assert response.success and response.session != data["id"]
    untouched = store._rows[data["id"]]
    assert untouched[0] == data["revision"] and json.loads(untouched[2]) == data


async def test_a_restore_hook_that_writes_the_legacy_sequence_shape_does_not_break_the_session():
    class SequenceWritingFlow(LegacyTripFlow):
        async def on_restore_session_doc(self, doc: SessionDoc) -> SessionDoc | None:
            doc.version = SESSION_DOC_VERSION
            doc.flow.sequence = ["GatherStep", "ItineraryStep"]  # type: ignore[list-item]
            return doc

    SequenceWritingFlow.id = "LegacyTripFlow"
    store = MemorySessionStore()
    session = await _stored_legacy(store)
    engine, _ = scripted_engine([SequenceWritingFlow], [text("ok")], store=store)
    response = await engine.run("LegacyTripFlow", "go on", session_id=session)
    assert response.success, response.detail
    stored = await store.load(session)
    assert [item.step_name for item in stored.flow.sequence][:2] == ["GatherStep", "ItineraryStep"]


@pytest.mark.parametrize("name", ["abc\n", "abc\nxyz", "a b"])
def test_namespace_names_must_match_entirely(name):
    with pytest.raises(ValueError):
        validate_namespace(name)

"""The session document model: the seed schema, legacy normalisation and refusals."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from picoflow.errors import SessionFlowInvariantError
from picoflow.session.document import SessionDoc

# The example document of the session document schema page, verbatim.
SEED_EXAMPLE = json.loads(
    """
{
  "id": "b3f0…",
  "revision": 7,
  "version": 1.5,
  "runStatus": "running",
  "createdOn": "2026-03-04T05:06:07.000Z",
  "saveOn": "2026-03-04T05:12:41.113Z",
  "flow": {
    "name": "HotelFlow",
    "model": { "provider": "openai", "name": "gpt-4o", "params": {}, "retryAttempts": 3 },
    "context": { "config": { "tenantId": "demo" } },
    "memory": { "hotel-explore": { "messages": [], "summary": "…" } },
    "steps": [{ "name": "ExploreStep", "state": {} }],
    "currentStep": "PresentStep",
    "sequence": [{ "level": 1, "stepName": "ExploreStep" }]
  },
  "tokens": { "inputTokens": 0, "outputTokens": 0, "totalTokens": 0 },
  "log": [],
  "error": [],
  "warn": [],
  "debug": [],
  "verbose": []
}
"""
)

TOKEN_BREAKDOWNS = {"reasoningTokens", "visibleOutputTokens", "cachedInputTokens", "cacheCreationInputTokens"}


def _doc(**flow: Any) -> dict[str, Any]:
    return {"id": "s1", "revision": 0, "flow": {"name": "HotelFlow", **flow}}


def test_seed_example_validates_and_dumps_the_same_keys() -> None:
    dumped = SessionDoc.from_stored(copy.deepcopy(SEED_EXAMPLE)).to_json_dict()
    assert set(dumped) == set(SEED_EXAMPLE)
    assert set(dumped["flow"]) == set(SEED_EXAMPLE["flow"])
    assert set(dumped["flow"]["model"]) == set(SEED_EXAMPLE["flow"]["model"])
    assert set(dumped["flow"]["memory"]["hotel-explore"]) == {"messages", "summary"}
    # The page abbreviates tokens to the three billable totals; the schema has all seven.
    assert set(dumped["tokens"]) == set(SEED_EXAMPLE["tokens"]) | TOKEN_BREAKDOWNS
    assert all(dumped["tokens"][key] == 0 for key in TOKEN_BREAKDOWNS)
    assert {k: v for k, v in dumped.items() if k != "tokens"} == {
        k: v for k, v in SEED_EXAMPLE.items() if k != "tokens"
    }


def test_dump_round_trips_through_from_stored() -> None:
    first = SessionDoc.from_stored(copy.deepcopy(SEED_EXAMPLE)).to_json_dict()
    assert SessionDoc.from_stored(json.loads(json.dumps(first))).to_json_dict() == first


def test_only_created_on_and_save_on_are_datetimes() -> None:
    iso = "2026-03-04T05:06:07.000Z"
    data = _doc(
        context={"config": {"checkIn": iso}, "dates": [iso, "2026-03-04"]},
        steps=[{"name": "ExploreStep", "state": {"_saveOn": iso, "nested": {"at": iso}}}],
        memory={"ExploreStep": {"messages": [{"type": "human", "content": iso, "timestamp": iso}]}},
    )
    data["createdOn"] = iso
    data["saveOn"] = "2026-03-04T05:12:41.113Z"
    data["log"] = [{"timestamp": iso, "level": "info", "message": "hi", "at": iso}]
    doc = SessionDoc.from_stored(data)
    assert doc.created_on == datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)
    assert isinstance(doc.save_on, datetime)
    assert doc.flow.context == {"config": {"checkIn": iso}, "dates": [iso, "2026-03-04"]}
    assert doc.flow.steps[0].state == {"_saveOn": iso, "nested": {"at": iso}}
    message = doc.flow.memory["ExploreStep"].messages[0]
    assert (message.content, message.timestamp) == (iso, iso)
    assert doc.to_json_dict()["log"][0] == {"timestamp": iso, "level": "info", "message": "hi", "at": iso}


def test_legacy_array_memory_becomes_a_namespace_map() -> None:
    data = _doc(
        memory=[
            {"nameSpace": "explore", "history": [{"type": "human", "content": "hello"}]},
            {"nameSpace": "present", "history": []},
        ]
    )
    doc = SessionDoc.from_stored(data)
    assert list(doc.flow.memory) == ["explore", "present"]
    assert doc.flow.memory["explore"].messages[0].content == "hello"
    assert doc.to_json_dict()["flow"]["memory"]["present"] == {"messages": []}


def test_legacy_flows_list_of_one_becomes_flow() -> None:
    doc = SessionDoc.from_stored({"id": "s1", "flows": [{"name": "HotelFlow", "currentStep": "A"}]})
    assert doc.flow.name == "HotelFlow" and doc.flow.current_step == "A"
    assert "flows" not in doc.to_json_dict()


def test_legacy_expire_after_is_dropped() -> None:
    doc = SessionDoc.from_stored({**_doc(), "expireAfter": 3600})
    assert "expireAfter" not in doc.to_json_dict()


def test_legacy_string_sequence_entries_become_level_one() -> None:
    doc = SessionDoc.from_stored(_doc(sequence=["ExploreStep", {"level": 2, "stepName": "Child"}]))
    assert doc.to_json_dict()["flow"]["sequence"] == [
        {"level": 1, "stepName": "ExploreStep"},
        {"level": 2, "stepName": "Child"},
    ]


def test_whole_float_revision_is_normalised() -> None:
    assert SessionDoc.from_stored({**_doc(), "revision": 3.0}).revision == 3


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(_doc(sequence=[{"level": 0, "stepName": "A"}]), id="sequence-level-0"),
        pytest.param(_doc(sequence=[{"level": 1, "stepName": ""}]), id="sequence-blank-step"),
        pytest.param(_doc(memory={"__proto__": {"messages": []}}), id="namespace-__proto__"),
        pytest.param(_doc(memory={"constructor": {"messages": []}}), id="namespace-constructor"),
        pytest.param(_doc(memory={"prototype": {"messages": []}}), id="namespace-prototype"),
        pytest.param(_doc(memory={"1abc": {"messages": []}}), id="namespace-leading-digit"),
        pytest.param(_doc(memory={"a" * 129: {"messages": []}}), id="namespace-129-chars"),
        pytest.param(_doc(memory={"has space": {"messages": []}}), id="namespace-space"),
        pytest.param(_doc(memory=[{"history": []}]), id="legacy-memory-without-namespace"),
        pytest.param({"id": "s1", "flow": {"name": ""}}, id="blank-flow-name"),
        pytest.param({"id": "s1", "flow": {"name": "   "}}, id="whitespace-flow-name"),
        pytest.param({"id": "s1", "flow": {}}, id="missing-flow-name"),
        pytest.param({"id": "s1"}, id="no-flow"),
        pytest.param({"id": "s1", "flows": [{"name": "A"}, {"name": "B"}]}, id="two-flows"),
        pytest.param({"id": "s1", "flows": []}, id="empty-flows"),
        pytest.param({"id": "s1", "flow": {"name": "A"}, "flows": [{"name": "B"}]}, id="flow-and-flows"),
        pytest.param(_doc(memory={"a": {"messages": [{"type": "tool", "content": "x"}]}}), id="tool-without-id"),
        pytest.param({**_doc(), "runStatus": "paused"}, id="unknown-run-status"),
        pytest.param({**_doc(), "revision": -1}, id="negative-revision"),
        pytest.param(_doc(steps=[{"name": "", "state": {}}]), id="blank-step-name"),
        pytest.param(_doc(context=["not", "a", "mapping"]), id="context-not-mapping"),
        pytest.param(["not", "a", "document"], id="not-an-object"),
    ],
)
def test_malformed_documents_are_refused_with_a_typed_error(data: Any) -> None:
    with pytest.raises(SessionFlowInvariantError) as raised:
        SessionDoc.from_stored(data)
    assert raised.value.code == "SESSION_FLOW_INVARIANT" and raised.value.status_code == 409


def test_longest_legal_namespace_is_accepted() -> None:
    key = "a" + "B1_-" * 31 + "xyz"
    assert len(key) == 128
    assert list(SessionDoc.from_stored(_doc(memory={key: {"messages": []}})).flow.memory) == [key]


def test_check_invariant_catches_in_place_mutation() -> None:
    doc = SessionDoc.from_stored(_doc())
    doc.check_invariant()
    doc.flow.name = " "
    with pytest.raises(SessionFlowInvariantError, match="s1"):
        doc.check_invariant()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


json_objects = st.dictionaries(st.text(max_size=10), json_values, max_size=5)


@settings(max_examples=75, deadline=None)
@given(context=json_objects, state=json_objects)
def test_user_data_round_trips_untouched(context: dict[str, Any], state: dict[str, Any]) -> None:
    data = _doc(context=context, steps=[{"name": "S", "state": state}])
    dumped = json.loads(json.dumps(SessionDoc.from_stored(data).to_json_dict()))
    assert dumped["flow"]["context"] == context
    assert dumped["flow"]["steps"][0]["state"] == state

"""State, transient state, context and memory helpers of Flow and Step (seed: state/memory/context/transient)."""

from __future__ import annotations

import pytest

from picoflow import Flow, ModelSelection, Step, TerminateSessionStep
from picoflow.authoring.step_registry import collect_steps
from picoflow.conversation.state import deep_merge, read_path
from picoflow.errors import PicoFlowError
from picoflow.lifecycle import new_flow_doc
from picoflow.session.document import new_document


class OwnerStep(Step):
    pass


class OtherStep(Step):
    pass


class StateFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="scripted", name="m")

    def define_steps(self) -> list[Step]:
        return [OwnerStep(self), OtherStep(self).use_memory("shared"), TerminateSessionStep(self).use_memory("shared")]


@pytest.fixture
def flow() -> StateFlow:
    flow = StateFlow()
    collect_steps(flow)
    # A turn's context: a fresh session document bound to the flow.
    flow.run_context.bind(new_document(new_flow_doc(flow)))
    return flow


def test_save_state_replaces_the_first_key(flow):
    step = flow.require_step(OwnerStep)
    step.save_state({"criteria": {"city": "Paris", "nights": 3}})
    step.save_state({"criteria": {"city": "Berlin"}})
    assert step.get_state("criteria") == {"city": "Berlin"}


def test_save_state_merges_every_key_after_the_first(flow):
    step = flow.require_step(OwnerStep)
    step.save_state({"criteria": {"city": "Paris", "nights": 3}, "filters": {"wifi": True, "pool": False}})
    step.save_state({"criteria": {"city": "Berlin"}, "filters": {"wifi": False}})
    assert step.get_state("criteria") == {"city": "Berlin"}
    assert step.get_state("filters") == {"wifi": False, "pool": False}


def test_save_state_stamps_save_on_and_ignores_empty_input(flow):
    step = flow.require_step(OwnerStep)
    step.save_state({})
    assert step.get_state() == {}
    step.save_state({"email": "user@example.com"})
    assert step.get_state("_saveOn").endswith("Z")
    assert step.get_state("email") == "user@example.com"


def test_get_state_reads_dotted_paths_and_the_whole_state(flow):
    step = flow.require_step(OwnerStep)
    step.save_state({"criteria": {"city": "Paris", "rooms": [{"type": "suite"}]}})
    assert step.get_state("criteria.city") == "Paris"
    assert step.get_state("criteria.rooms.0.type") == "suite"
    assert step.get_state("criteria.missing.deeper") is None
    assert set(step.get_state()) == {"criteria", "_saveOn"}


def test_remove_state_drops_a_key(flow):
    step = flow.require_step(OwnerStep)
    step.save_state({"email": "a@b.c", "name": "Ada"})
    step.remove_state("email")
    assert step.get_state("email") is None
    assert step.get_state("name") == "Ada"


def test_saved_values_are_copies(flow):
    step = flow.require_step(OwnerStep)
    value = {"city": "Paris"}
    step.save_state({"criteria": value})
    value["city"] = "Rome"
    assert step.get_state("criteria.city") == "Paris"


def test_transient_state_is_stripped_from_the_step_document(flow):
    step = flow.require_step(OwnerStep)
    step.save_state({"kept": 1})
    flow.save_transient_step_state(OwnerStep, {"results": [1, 2, 3]})
    assert step.get_transient_state("results") == [1, 2, 3]
    assert flow.get_transient_step_state(OwnerStep, "results") == [1, 2, 3]
    doc = flow.run_context.write_back(flow.id, flow.model_selection())
    written = next(stored for stored in doc.flow.steps if stored.name == step.id)
    assert "_transient" not in written.state
    assert written.state["kept"] == 1


def test_cross_step_state_goes_through_the_flow(flow):
    flow.save_step_state(OwnerStep, {"name": "Ada"})
    assert flow.get_step_state(OwnerStep, "name") == "Ada"
    assert flow.get_step_state("OwnerStep") == flow.require_step(OwnerStep).get_state()
    with pytest.raises(PicoFlowError, match="Step 'Nope' is not defined in flow 'StateFlow'"):
        flow.get_step_state("Nope")


def test_context_reads_dotted_paths_under_config(flow):
    flow.add_context({"config": {"tenant": {"region": "eu"}, "isPresident": True}})
    assert flow.get_context("config.tenant.region") == "eu"
    assert flow.require_step(OwnerStep).get_context("config.isPresident") is True
    copy = flow.get_context("config")
    copy["isPresident"] = False
    assert flow.get_context("config.isPresident") is True


def test_default_namespace_is_the_step_id_and_use_memory_validates(flow):
    assert flow.require_step(OwnerStep).namespace == "OwnerStep"
    assert flow.require_step(OtherStep).namespace == "shared"
    for bad in ["__proto__", "constructor", "prototype", "1abc", "a" * 129, "has space", ""]:
        with pytest.raises(PicoFlowError):
            OwnerStep(flow).use_memory(bad)
    assert OwnerStep(flow).use_memory("a" * 128).namespace == "a" * 128


def test_shared_namespaces_share_one_history(flow):
    other = flow.require_step(OtherStep)
    terminal = flow.require_step(TerminateSessionStep)
    assert other.get_memory() is terminal.get_memory()
    assert flow.require_step(OwnerStep).get_memory() is not other.get_memory()


def test_erase_memory_keeps_state(flow):
    step = flow.require_step(OwnerStep)
    step.save_state({"name": "Ada"})
    from picoflow.messages import HumanMessageEx

    step.get_memory().append(HumanMessageEx(step, "hello"))
    step.erase_memory()
    assert len(step.get_memory()) == 1  # only the system slot
    assert step.get_state("name") == "Ada"


def test_read_path_and_deep_merge_helpers():
    assert read_path({"a": [{"b": 2}]}, "a.0.b") == 2
    assert read_path({"a": 1}, None) == {"a": 1}
    assert read_path({"a": [1]}, "a.5") is None
    target = {"a": {"b": 1, "c": 2}, "d": [1]}
    deep_merge(target, {"a": {"b": 9}, "d": [2]})
    assert target == {"a": {"b": 9, "c": 2}, "d": [2]}

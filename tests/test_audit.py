"""Documented behaviours pinned after a review against the reference documentation.

Step model overrides inherit the flow's attempt budget, erasing memory keeps the rolling summary, both
``credential`` and ``credentials`` are stripped from a persisted selection, the decision defaults, and the
``{{NAME}}`` prompt placeholders with their handling of falsy and missing values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import SystemMessage
from pydantic import BaseModel

import picoflow
from picoflow import Flow, ModelSelection, Step, ToolSpec, go, load_prompt, prompt, render, tool
from picoflow.authoring.decision import DEFAULT_DECISION_MAX_RETRIES, DEFAULT_DECISION_TIMEOUT_MS, DecisionConfig
from picoflow.authoring.step_registry import collect_steps
from picoflow.messages import SUMMARY_MESSAGE_PREFIX, HumanMessageEx
from picoflow.session.document import ModelSelectionDoc
from tests.support.engine import call, scripted_engine, text

# -- 1. a step's use_model(...) inherits the flow's retry_attempts -------------------------------------------

OTHER = ModelSelection(provider="scripted", name="other")


class PlainStep(Step):
    pass


def flow_with(step_selection: ModelSelection | dict[str, Any] | None, flow_attempts: int | None) -> type[Flow]:
    class AttemptsFlow(Flow):
        def config_model(self) -> ModelSelection:
            if flow_attempts is None:
                return ModelSelection(provider="scripted", name="m")
            return ModelSelection(provider="scripted", name="m", retry_attempts=flow_attempts)

        def define_steps(self) -> list[Step]:
            step = PlainStep(self)
            return [step if step_selection is None else step.use_model(step_selection)]

    return AttemptsFlow


async def test_a_step_override_without_retry_attempts_makes_as_many_attempts_as_the_flow_allows():
    engine, model = scripted_engine([flow_with(OTHER, 1)], [{"error": "rate limited"}, text("too late")])

    response = await engine.run("AttemptsFlow", "q")

    assert not response.success and response.error_code == "MODEL_UNAVAILABLE"
    assert len(model.calls) == 1


async def test_a_step_override_that_sets_retry_attempts_keeps_its_own_budget():
    selection = ModelSelection(provider="scripted", name="other", retry_attempts=2)
    engine, model = scripted_engine([flow_with(selection, 1)], [{"error": "rate limited"}, text("second try")])

    response = await engine.run("AttemptsFlow", "q")

    assert (response.success, response.message) == (True, "second try")
    assert len(model.calls) == 2


def test_the_effective_step_selection_takes_the_flow_budget_unless_it_names_its_own():
    def effective(step_selection: ModelSelection | dict[str, Any], flow_attempts: int | None) -> ModelSelection:
        flow = flow_with(step_selection, flow_attempts)()
        collect_steps(flow)
        return flow.require_step(PlainStep).model_selection()

    assert effective(OTHER, 5).retry_attempts == 5
    assert effective({"provider": "scripted", "name": "m", "params": {"seed": 1}}, 4).retry_attempts == 4
    assert effective({"provider": "scripted", "name": "other", "retry_attempts": 3}, 1).retry_attempts == 3
    assert effective(OTHER, None).retry_attempts == 3  # the flow's own default


def test_a_stored_step_selection_without_an_attempt_budget_inherits_the_flow_one():
    flow = flow_with(None, 2)()
    collect_steps(flow)
    step = flow.require_step(PlainStep)
    # A session that stored the step's own model, as loading its document records it.
    stored = ModelSelectionDoc(provider="scripted", name="other")
    flow.run_context.step_models[step.id] = ModelSelection.from_doc(stored)

    assert step.model_selection() == ModelSelection(provider="scripted", name="other", retry_attempts=2)
    assert ModelSelection.from_doc(ModelSelectionDoc(provider="p", name="n", retryAttempts=4)).retry_attempts == 4


async def test_the_persisted_step_model_records_the_inherited_budget():
    engine, _ = scripted_engine([flow_with(OTHER, 1)], [text("hello")])

    response = await engine.run("AttemptsFlow", "q")

    doc = await engine.session_store.load(response.session)
    (step_doc,) = doc.flow.steps
    assert step_doc.model is not None
    assert (step_doc.model.name, step_doc.model.retry_attempts) == ("other", 1)


# -- 2. erase_memory() keeps the namespace's rolling summary -------------------------------------------------


class ErasingStep(Step):
    def get_prompt(self) -> str:
        return "Handle the request."

    async def on_enter(self) -> None:
        self.erase_memory()


class HandOverArgs(BaseModel):
    note: str


class IntakeStep(Step):
    def define_tools(self) -> list[ToolSpec]:
        return [ToolSpec(name="hand_over", description="Hand the conversation over.", schema=HandOverArgs)]

    @tool
    async def hand_over(self, args: dict[str, Any]) -> object:
        # Stands in for an earlier compaction of the shared namespace.
        self.flow.get_memory().namespace("desk").summary = "The user wants a refund for order 42."
        return go(ErasingStep)


class ErasingFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="scripted", name="m")

    def define_steps(self) -> list[Step]:
        return [IntakeStep(self).use_memory("desk"), ErasingStep(self).use_memory("desk")]


def test_erase_memory_clears_the_messages_but_keeps_the_summary():
    flow = ErasingFlow()
    collect_steps(flow)
    step = flow.require_step(ErasingStep)
    space = flow.get_memory().namespace("desk")
    space.summary, space.summarized_through_id = "earlier facts", "IntakeStep|x|1"
    step.get_memory().append(HumanMessageEx(step, "hello"))

    remaining = step.erase_memory()

    assert remaining is step.get_memory() and len(remaining) == 1 and isinstance(remaining[0], SystemMessage)
    assert (space.summary, space.summarized_through_id) == ("earlier facts", "IntakeStep|x|1")
    flow.get_memory().clear_summary("desk")
    assert (space.summary, space.summarized_through_id) == (None, None)


async def test_a_summary_survives_an_erase_on_entry_and_still_reaches_the_model():
    engine, model = scripted_engine([ErasingFlow], [call(("hand_over", {"note": "refund"})), text("On it.")])

    response = await engine.run("ErasingFlow", "I want a refund")

    assert (response.success, response.message) == (True, "On it.")
    second = model.calls[-1]
    assert [m.type for m in second[:2]] == ["system", "system"]
    assert second[1].content.startswith(SUMMARY_MESSAGE_PREFIX)
    assert "order 42" in second[1].content
    assert all(m.content != "I want a refund" for m in second)  # the erased messages are gone
    doc = await engine.session_store.load(response.session)
    assert doc.flow.memory["desk"].summary == "The user wants a refund for order 42."


# -- 3. the singular "credential" key is stripped as well -----------------------------------------------------


def test_credential_and_credentials_keys_are_stripped_from_a_persisted_selection():
    selection = ModelSelection(
        provider="p",
        name="n",
        params={
            "credential": "c1",
            "credentials": {"key": "c2"},
            "client": {"Service-Credential": "c3", "region": "eu"},
            "apiKey": "k",
            "temperature": 0.2,
        },
    )

    assert selection.to_doc().params == {"client": {"region": "eu"}, "temperature": 0.2}
    assert selection.params["credential"] == "c1"  # the live selection keeps what the provider needs


# -- 4. decision defaults -------------------------------------------------------------------------------------


def test_decision_defaults_are_no_extra_attempt_and_thirty_seconds_per_attempt():
    assert (DEFAULT_DECISION_MAX_RETRIES, DEFAULT_DECISION_TIMEOUT_MS) == (0, 30_000)
    config = DecisionConfig()
    assert (config.max_retries, config.timeout_ms) == (0, 30_000)


# -- 5. prompt templates ----------------------------------------------------------------------------------------


def test_double_brace_placeholders_are_filled_and_tolerate_inner_spaces():
    template = "Today is {{CurrentDate}}. Hotels: {{ HOTEL_JSON }}. Guest: {{UserName}}."
    assert render(template, CurrentDate="2027-08-01", HOTEL_JSON='[{"name": "Ritz"}]', UserName="Ada") == (
        'Today is 2027-08-01. Hotels: [{"name": "Ritz"}]. Guest: Ada.'
    )


def test_falsy_values_are_rendered_while_missing_and_none_values_keep_the_placeholder():
    template = "{{ZERO}}|{{NO}}|{{EMPTY}}|{{NONE}}|{{MISSING}}|{zero}|{none}"
    assert render(template, ZERO=0, NO=False, EMPTY="", NONE=None, zero=0, none=None) == (
        "0|false||{{NONE}}|{{MISSING}}|0|{none}"
    )


def test_non_string_values_render_as_json_and_names_may_come_from_a_mapping():
    class Address(BaseModel):
        city: str

    values = {"internal address": {"zip": "97006", "open": True}, "tags": ["a", "b"], "where": Address(city="Oslo")}
    assert render("{{internal address}} {{tags}} {{where}} {n}", values, n=2.5) == (
        '{"zip": "97006", "open": true} ["a", "b"] {"city":"Oslo"} 2.5'
    )
    assert render("{{A}}", {"A": "from mapping"}, A="keyword wins") == "keyword wins"


def test_text_in_braces_that_is_no_placeholder_is_left_alone():
    template = 'Reply like {"answer": "yes"} or {{ {"nested": 1} }}; keep {{}} and {not a name}.'
    assert render(template, answer="x", nested="y") == template


def test_prompt_files_render_both_placeholder_forms(tmp_path: Path):
    module = tmp_path / "steps.py"
    module.write_text("# a step module\n")
    (tmp_path / "dob.md").write_text("Ask {{UserName}} ({role}) for a date of birth; retries left: {{RETRIES}}.")

    assert prompt("dob.md", str(module), {"UserName": "Ada"}, role="clerk", RETRIES=0) == (
        "Ask Ada (clerk) for a date of birth; retries left: 0."
    )
    assert load_prompt("dob.md", str(module)).startswith("Ask {{UserName}}")


def test_the_prompt_helpers_are_exported_and_documented():
    for name in ("load_prompt", "prompt", "render"):
        assert name in picoflow.__all__
        helper = getattr(picoflow, name)
        assert helper.__doc__ and helper.__doc__.strip()


@pytest.mark.parametrize("value", [0, 0.0, False, "", [], {}])
def test_every_falsy_value_replaces_its_placeholder(value: object):
    assert "{{X}}" not in render("[{{X}}]", X=value)

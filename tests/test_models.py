import asyncio
import json
import threading
from pathlib import Path

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from pydantic import BaseModel

from picoflow import Flow, FlowEngine, Step
from picoflow.errors import PicoFlowError, ScriptedModelError
from picoflow.messages import usage_from_message
from picoflow.models.calls import model_call_for
from picoflow.models.common import CLIENT_RETRIES
from picoflow.models.factory import default_registry
from picoflow.models.openai import OpenAIProvider
from picoflow.models.registry import ModelProvider, ModelSelection, ProviderRegistry, provider_family
from picoflow.models.scripted import ScriptedChatModel, ScriptedProvider
from picoflow.stores import MemorySessionStore

SCRIPTED = ModelSelection(provider="scripted", name="any-model")

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


class Criteria(BaseModel):
    city: str
    nights: int


class _CountingProvider(ModelProvider):
    def __init__(self, name: str) -> None:
        self.name = name
        self.built = 0

    def chat_model(self, selection: ModelSelection) -> BaseChatModel:
        self.built += 1
        return ScriptedProvider([], name=self.name).chat_model(selection)


# -- provider_family ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "family"),
    [
        ("gpt-4o", "openai"),
        ("GPT-5.1", "openai"),
        ("o1-mini", "openai"),
        ("o3", "openai"),
        ("o4-mini", "openai"),
        ("gemini-2.5-pro", "gemini"),
        ("gemma-3", "gemini"),
        ("claude-sonnet-4-5", "anthropic"),
        ("deepseek-v3", "unsupported"),
        ("llama3", "unsupported"),
    ],
)
def test_provider_family_is_judged_by_name_prefix(name: str, family: str) -> None:
    assert provider_family(name) == family


# -- registry ----------------------------------------------------------------------------------


def test_registering_a_duplicate_name_is_refused_unless_replacing() -> None:
    registry = ProviderRegistry([ScriptedProvider([])])
    replacement = ScriptedProvider([])

    with pytest.raises(PicoFlowError, match="'scripted' is already registered"):
        registry.register(ScriptedProvider([]))
    registry.register(replacement, replace=True)

    assert registry.get("scripted") is replacement
    assert registry.names() == ["scripted"]


def test_a_provider_needs_a_name() -> None:
    with pytest.raises(PicoFlowError, match="non-empty name"):
        ProviderRegistry().register(ScriptedProvider([], name=" "))


def test_unknown_provider_is_a_clear_error() -> None:
    registry = ProviderRegistry([ScriptedProvider([])])
    selection = ModelSelection(provider="nvidia", name="llama")

    with pytest.raises(PicoFlowError, match="Model provider 'nvidia' is not registered."):
        registry.get("nvidia")
    with pytest.raises(PicoFlowError, match="provider 'nvidia' is not registered"):
        registry.validate(selection)
    with pytest.raises(PicoFlowError, match="provider 'nvidia' is not registered"):
        registry.chat_model(selection)


def test_validate_delegates_to_the_provider() -> None:
    registry = ProviderRegistry([OpenAIProvider(api_key="k")])

    registry.validate(ModelSelection(provider="openai", name="gpt-4o", params={"temperature": 0.2}))
    with pytest.raises(PicoFlowError, match="Model 'openai:gpt-4o' does not accept parameter"):
        registry.validate(ModelSelection(provider="openai", name="gpt-4o", params={"reasoning_effort": "low"}))


def test_chat_models_are_cached_per_distinct_selection() -> None:
    provider = _CountingProvider("counting")
    registry = ProviderRegistry([provider])
    cool = ModelSelection(provider="counting", name="m", params={"temperature": 0.1, "top_p": 0.5})
    same = ModelSelection(provider="counting", name="m", params={"top_p": 0.5, "temperature": 0.1})
    warm = ModelSelection(provider="counting", name="m", params={"temperature": 0.9})

    first = registry.chat_model(cool)

    assert registry.chat_model(same) is first
    assert registry.chat_model(warm) is not first
    assert provider.built == 2


def test_replacing_a_provider_stops_serving_its_cached_models() -> None:
    registry = ProviderRegistry([_CountingProvider("counting")])
    selection = ModelSelection(provider="counting", name="m")
    before = registry.chat_model(selection)
    replacement = _CountingProvider("counting")

    registry.register(replacement, replace=True)

    assert registry.chat_model(selection) is not before
    assert replacement.built == 1


def test_an_override_serves_every_selection_whatever_its_provider() -> None:
    script = ScriptedProvider([{"content": "from the script"}, {"content": "again"}])
    registry = ProviderRegistry(override=script)

    openai_reply = registry.chat_model(ModelSelection(provider="openai", name="gpt-4o")).invoke("hi")
    other_reply = registry.chat_model(ModelSelection(provider="google", name="gemini-2.5-pro")).invoke("hi")

    assert (openai_reply.content, other_reply.content) == ("from the script", "again")
    assert [s.provider for s in script.selections] == ["openai", "google"]


def test_an_override_still_runs_the_registered_provider_validation() -> None:
    registry = ProviderRegistry([OpenAIProvider()], override=ScriptedProvider([]))

    registry.validate(ModelSelection(provider="anything", name="x"))
    with pytest.raises(PicoFlowError, match="does not support temperature"):
        registry.validate(ModelSelection(provider="openai", name="gpt-5", params={"temperature": 0.3}))


def test_default_registry_uses_picoflow_script_as_override(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"content": "offline"}]), encoding="utf-8")

    offline = default_registry({"PICOFLOW_SCRIPT": str(script)})
    online = default_registry({})

    assert isinstance(offline.override, ScriptedProvider)
    assert offline.chat_model(ModelSelection(provider="openai", name="gpt-4o")).invoke("hi").content == "offline"
    assert online.override is None
    assert online.names()[0] == "openai" and "bedrock" in online.names() and "scripted" not in online.names()


# -- OpenAI catalog and parameter checks ---------------------------------------------------------


@pytest.mark.parametrize(
    ("selection", "message"),
    [
        # A name the catalog does not list is checked as its family: gpt-5*/o* are reasoning models.
        (ModelSelection(provider="openai", name="gpt-5.9-nova", params={"temperature": 0.2}), "temperature"),
        (ModelSelection(provider="openai", name="o9-mini", params={"seed": 1}), r"does not accept parameter\(s\) seed"),
        (ModelSelection(provider="openai", name="gpt-4.9", params={"reasoning_effort": "low"}), "reasoning_effort"),
        (
            ModelSelection(provider="openai", name="gpt-5", params={"temperature": 0.2}),
            "Model 'openai:gpt-5' does not support temperature.",
        ),
        (
            ModelSelection(provider="openai", name="o4-mini", params={"temperature": 1}),
            "does not support temperature",
        ),
        (ModelSelection(provider="openai", name="gpt-4o", params={"temperature": 2.5}), "from 0 to 2"),
        (ModelSelection(provider="openai", name="gpt-4o", params={"temperature": "hot"}), "from 0 to 2"),
        (ModelSelection(provider="openai", name="gpt-4o", params={"maxTokens": 10}), "does not accept .*maxTokens"),
        (ModelSelection(provider="openai", name="gpt-4o", params={"max_tokens": 0}), "positive integer"),
        (ModelSelection(provider="openai", name="gpt-4o", params={"max_retries": 2}), "transport retries"),
        (ModelSelection(provider="openai", name="gpt-4o", params={"api_key": "sk-x"}), "credentials"),
        (
            ModelSelection(provider="openai", name="gpt-5.1", params={"reasoning": {"effort": "extreme"}}),
            "reasoning effort",
        ),
        (ModelSelection(provider="openai", name="gpt-5", params={"reasoning_effort": "max"}), "reasoning effort"),
    ],
)
def test_openai_validation_rejects_bad_selections(selection: ModelSelection, message: str) -> None:
    with pytest.raises(PicoFlowError, match=message):
        OpenAIProvider().validate(selection)


@pytest.mark.parametrize(
    "selection",
    [
        ModelSelection(provider="openai", name="gpt-4o", params={"temperature": 0, "max_tokens": 800}),
        ModelSelection(provider="openai", name="gpt-4o-2024-08-06", params={"temperature": 2}),
        ModelSelection(provider="openai", name="gpt-5.1", params={"reasoning": {"effort": "low"}}),
        ModelSelection(provider="openai", name="gpt-5", params={"reasoning_effort": "minimal", "timeout": 30}),
    ],
)
def test_openai_validation_accepts_cataloged_selections(selection: ModelSelection) -> None:
    OpenAIProvider().validate(selection)


def test_an_openai_compatible_provider_under_another_name_accepts_any_model_but_checks_params() -> None:
    provider = OpenAIProvider(name="nvidia", base_url="http://127.0.0.1:9/v1")

    provider.validate(ModelSelection(provider="nvidia", name="meta/llama-3.1-70b", params={"temperature": 0.4}))
    with pytest.raises(PicoFlowError, match="temperature"):
        provider.validate(ModelSelection(provider="nvidia", name="meta/llama", params={"temperature": 3}))
    with pytest.raises(PicoFlowError, match="does not support temperature"):
        provider.validate(ModelSelection(provider="nvidia", name="o3-pro", params={"temperature": 0.1}))


def test_openai_without_a_key_fails_clearly_when_a_model_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)

    with pytest.raises(PicoFlowError, match="no API key.*OPENAI_API_KEY"):
        OpenAIProvider().chat_model(ModelSelection(provider="openai", name="gpt-4o"))


def test_openai_takes_key_and_endpoint_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "env-key")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")

    model = OpenAIProvider().chat_model(ModelSelection(provider="openai", name="gpt-4o", params={"temperature": 0.3}))

    assert model.model_name == "gpt-4o"
    assert model.temperature == 0.3
    assert model.max_retries == CLIENT_RETRIES
    assert model.openai_api_key.get_secret_value() == "env-key"
    assert model.openai_api_base == "http://127.0.0.1:9/v1"
    assert "env-key" not in repr(model)


# -- ScriptedProvider ----------------------------------------------------------------------------


def test_scripted_replies_come_in_order_with_usage_and_metadata() -> None:
    provider = ScriptedProvider(
        [
            {
                "content": "Hello!",
                "usage": {"input_tokens": 12, "output_tokens": 3},
                "response_metadata": {"system_fingerprint": "fp"},
            },
            AIMessage(content="Second", usage_metadata={"input_tokens": 1, "output_tokens": 1, "total_tokens": 2}),
        ]
    )
    model = provider.chat_model(SCRIPTED)

    first = model.invoke("hi")
    second = model.invoke("again")

    assert isinstance(model, ScriptedChatModel)
    assert first.content == "Hello!"
    assert first.usage_metadata == {"input_tokens": 12, "output_tokens": 3, "total_tokens": 15}
    assert first.response_metadata["finish_reason"] == "stop"
    assert first.response_metadata["model_name"] == "any-model"
    assert first.response_metadata["system_fingerprint"] == "fp"
    assert second.content == "Second"
    assert provider.remaining == 0


def test_scripted_usage_details_reach_token_accounting() -> None:
    provider = ScriptedProvider(
        [
            {
                "content": "ok",
                "usage": {
                    "input_tokens": 100,
                    "output_tokens": 40,
                    "total_tokens": 140,
                    "input_token_details": {"cache_read": 64},
                    "output_token_details": {"reasoning": 10},
                },
            }
        ]
    )

    usage = usage_from_message(provider.chat_model(SCRIPTED).invoke("hi"))

    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (100, 40, 140)
    assert (usage.cached_input_tokens, usage.reasoning_tokens, usage.visible_output_tokens) == (64, 10, 30)


async def test_scripted_tool_calls_get_deterministic_ids_when_missing() -> None:
    provider = ScriptedProvider(
        [
            {"content": "", "tool_calls": [{"name": "get_weather", "args": {"city": "Oslo"}}]},
            {
                "tool_calls": [
                    {"name": "get_weather", "args": {"city": "Rome"}, "id": "mine"},
                    {"name": "get_weather", "args": {"city": "Lima"}},
                ]
            },
            AIMessage(content="", tool_calls=[{"name": "get_weather", "args": {}, "id": None}]),
        ]
    )
    model = provider.chat_model(SCRIPTED)

    first = await model.ainvoke("weather?")
    second = await model.ainvoke("more")
    third = await model.ainvoke("once more")

    assert first.tool_calls == [
        {"name": "get_weather", "args": {"city": "Oslo"}, "id": "call_scripted_1_1", "type": "tool_call"}
    ]
    assert first.response_metadata["finish_reason"] == "tool_calls"
    assert [c["id"] for c in second.tool_calls] == ["mine", "call_scripted_2_2"]
    assert third.tool_calls[0]["id"] == "call_scripted_3_1"


def test_an_exhausted_script_names_the_provider_and_the_call() -> None:
    provider = ScriptedProvider([{"content": "only one"}], name="planner")
    model = provider.chat_model(ModelSelection(provider="planner", name="m"))
    model.invoke("one")

    with pytest.raises(PicoFlowError, match=r"Scripted provider 'planner' has no reply for model call 2"):
        model.invoke("two")


def test_a_missing_reply_names_the_call_its_purpose_and_step() -> None:
    provider = ScriptedProvider([{"content": "for the user"}, {"for": "decision", "content": "{}"}])
    model = provider.chat_model(SCRIPTED)

    with model_call_for("summary", None), pytest.raises(PicoFlowError) as summary:
        model.invoke("fold this")
    assert str(summary.value) == (
        "Scripted provider 'scripted' has no reply for model call 1, a summary call: 2 of its 2 replies are unused and "
        'none answers this call. A compaction summary takes only a reply with "for": "summary".'
    )
    with model_call_for("chat", "AskStep"):
        assert model.invoke("hi").content == "for the user"
        with pytest.raises(PicoFlowError) as chat:
            model.invoke("again")
    assert "model call 3, a chat call of step 'AskStep': 1 of its 2 replies are unused" in str(chat.value)
    assert 'Add a reply without "for" or with "for": "chat" (optionally with "step": "AskStep").' in str(chat.value)
    assert provider.purposes == ["summary", "chat", "chat"]


def test_each_reply_serves_only_its_purpose_and_step_keys_come_first() -> None:
    provider = ScriptedProvider([
        {"for": "summary", "content": "a summary"},
        {"for": "decision", "content": "a decision"},
        {"content": "either"},
        {"for": "chat", "content": "a chat reply"},
        {"for": "decision", "step": "Router", "content": "the router's decision"},
    ])
    model = provider.chat_model(SCRIPTED)

    def ask(purpose: str, step: str | None) -> str:
        with model_call_for(purpose, step):  # type: ignore[arg-type]
            return str(model.invoke("x").content)

    assert ask("chat", "AskStep") == "either"  # the first reply without a purpose
    assert ask("decision", "Router") == "the router's decision"  # keyed to the step, so ahead of its turn
    assert ask("decision", "Other") == "a decision"
    assert ask("chat", None) == "a chat reply"
    assert ask("summary", None) == "a summary"
    assert provider.remaining == 0


async def test_a_scripted_error_is_raised_instead_of_a_reply() -> None:
    provider = ScriptedProvider([{"error": "rate limited"}, {"content": "recovered"}])
    model = provider.chat_model(SCRIPTED)

    with pytest.raises(ScriptedModelError, match="rate limited"):
        await model.ainvoke("hi")
    assert (await model.ainvoke("hi")).content == "recovered"
    with pytest.raises(ScriptedModelError):
        ScriptedProvider([{"error": "boom"}]).chat_model(SCRIPTED).invoke("sync")


async def test_a_scripted_delay_waits_asynchronously_and_can_time_out() -> None:
    provider = ScriptedProvider([{"content": "slow", "delay": 5}, {"content": "quick", "delay": 0.01}])
    model = provider.chat_model(SCRIPTED)

    with pytest.raises(TimeoutError):
        await asyncio.wait_for(model.ainvoke("hi"), 0.05)
    assert (await model.ainvoke("hi")).content == "quick"


def test_calls_record_copies_of_the_messages_received() -> None:
    provider = ScriptedProvider([{"content": "a"}, {"content": "b"}])
    model = provider.chat_model(SCRIPTED)
    history = [SystemMessage(content="Be brief."), HumanMessage(content="Hi")]

    model.invoke(history)
    history[1].content = "changed afterwards"
    model.invoke([HumanMessage(content="Second")])

    assert [[m.content for m in call] for call in provider.calls] == [["Be brief.", "Hi"], ["Second"]]
    assert isinstance(provider.calls[0][0], SystemMessage)
    assert provider.tools == [[], []]


async def test_bound_tools_share_the_script_and_are_recorded() -> None:
    provider = ScriptedProvider(
        [{"tool_calls": [{"name": "get_weather", "args": {"city": "Oslo"}}]}, {"content": "Sunny."}]
    )
    model = provider.chat_model(SCRIPTED)

    bound = model.bind_tools([WEATHER_TOOL, Criteria])
    called = await bound.ainvoke("weather in Oslo?")
    answered = await model.ainvoke("thanks")

    assert called.tool_calls[0]["args"] == {"city": "Oslo"}
    assert answered.content == "Sunny."
    assert provider.tools == [["get_weather", "Criteria"], []]


def test_structured_output_with_a_pydantic_class_parses_fenced_json() -> None:
    provider = ScriptedProvider([{"content": '```json\n{"city": "Oslo", "nights": 2}\n```'}])

    parsed = provider.chat_model(SCRIPTED).with_structured_output(Criteria).invoke("plan")

    assert parsed == Criteria(city="Oslo", nights=2)


def test_structured_output_with_a_dict_schema_uses_tool_call_args_or_dict_content() -> None:
    schema = {"title": "Criteria", "type": "object", "properties": {"city": {"type": "string"}}}
    provider = ScriptedProvider(
        [{"tool_calls": [{"name": "Criteria", "args": {"city": "Rome"}}]}, {"content": {"city": "Lima"}}]
    )
    runnable = provider.chat_model(SCRIPTED).with_structured_output(schema)

    assert runnable.invoke("plan") == {"city": "Rome"}
    assert runnable.invoke("plan") == {"city": "Lima"}


async def test_structured_output_include_raw_keeps_usage_and_reports_parse_errors() -> None:
    provider = ScriptedProvider(
        [
            {"content": '{"city": "Oslo", "nights": 3}', "usage": {"input_tokens": 9, "output_tokens": 4}},
            {"content": "not json", "usage": {"input_tokens": 5, "output_tokens": 2}},
        ]
    )
    runnable = provider.chat_model(SCRIPTED).with_structured_output(Criteria, include_raw=True)

    good = await runnable.ainvoke("plan")
    bad = await runnable.ainvoke("plan")

    assert good["parsed"] == Criteria(city="Oslo", nights=3)
    assert good["parsing_error"] is None
    assert usage_from_message(good["raw"]).total_tokens == 13
    assert bad["parsed"] is None
    assert bad["parsing_error"] is not None
    assert usage_from_message(bad).total_tokens == 7


def test_structured_output_without_include_raw_raises_on_a_mismatch() -> None:
    provider = ScriptedProvider([{"content": '{"city": "Oslo"}'}])

    with pytest.raises(ValueError, match="output schema"):
        provider.chat_model(SCRIPTED).with_structured_output(Criteria).invoke("plan")


def test_two_named_providers_keep_independent_scripts() -> None:
    fast = ScriptedProvider([{"content": "fast 1"}, {"content": "fast 2"}], name="fast")
    smart = ScriptedProvider([{"content": "smart 1"}], name="smart")
    registry = ProviderRegistry([fast, smart])
    fast_model = registry.chat_model(ModelSelection(provider="fast", name="f"))
    smart_model = registry.chat_model(ModelSelection(provider="smart", name="s"))

    replies = [fast_model.invoke("a").content, smart_model.invoke("b").content, fast_model.invoke("c").content]

    assert replies == ["fast 1", "smart 1", "fast 2"]
    assert (len(fast.calls), len(smart.calls)) == (2, 1)
    assert (fast.remaining, smart.remaining) == (0, 0)


def test_every_reply_is_served_once_across_threads() -> None:
    provider = ScriptedProvider([{"content": str(n)} for n in range(40)])
    model = provider.chat_model(SCRIPTED)
    seen: list[str] = []

    def worker() -> None:
        for _ in range(10):
            seen.append(str(model.invoke("hi").content))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(seen, key=int) == [str(n) for n in range(40)]


def test_from_file_loads_a_json_list_of_replies(tmp_path: Path) -> None:
    path = tmp_path / "script.json"
    replies = [{"content": "", "tool_calls": [{"name": "get_weather", "args": {"city": "Oslo"}}]}, {"content": "hi"}]
    path.write_text(json.dumps(replies), encoding="utf-8")

    provider = ScriptedProvider.from_file(path, name="demo")
    model = provider.chat_model(ModelSelection(provider="demo", name="m"))

    assert provider.name == "demo"
    assert model.invoke("x").tool_calls[0]["name"] == "get_weather"
    assert model.invoke("y").content == "hi"


def test_bad_scripts_are_refused_up_front(tmp_path: Path) -> None:
    not_a_list = tmp_path / "object.json"
    not_a_list.write_text('{"content": "hi"}', encoding="utf-8")

    with pytest.raises(PicoFlowError, match="must be a JSON list"):
        ScriptedProvider.from_file(not_a_list)
    with pytest.raises(PicoFlowError, match="Cannot read the model script"):
        ScriptedProvider.from_file(tmp_path / "missing.json")
    with pytest.raises(PicoFlowError, match="unknown key"):
        ScriptedProvider([{"contents": "typo"}])
    with pytest.raises(PicoFlowError, match="tool call without a name"):
        ScriptedProvider([{"tool_calls": [{"args": {}}]}])
    with pytest.raises(PicoFlowError, match="delay"):
        ScriptedProvider([{"content": "x", "delay": -1}])
    with pytest.raises(PicoFlowError, match='"for" must be one of chat, decision, summary, judge'):
        ScriptedProvider([{"content": "x", "for": "answer"}])
    with pytest.raises(PicoFlowError, match="summary calls belong to no step"):
        ScriptedProvider([{"content": "x", "for": "summary", "step": "ChatStep"}])
    with pytest.raises(PicoFlowError, match="judge calls belong to no step"):
        ScriptedProvider([{"content": "x", "for": "judge", "step": "ChatStep"}])


# -- model names the catalog does not list ----------------------------------------------------------------


class AnswerStep(Step):
    def get_prompt(self) -> str:
        return "Answer briefly."


def _flow_on(selection: ModelSelection) -> type[Flow]:
    class SelectedFlow(Flow):
        def config_model(self) -> ModelSelection:
            return selection

        def define_steps(self) -> list[Step]:
            return [AnswerStep(self)]

    SelectedFlow.id = f"On_{selection.name.replace('.', '_').replace('-', '_')}"
    return SelectedFlow


def _unlisted_warnings(caplog: pytest.LogCaptureFixture, label: str) -> list[str]:
    messages = [record.getMessage() for record in caplog.records]
    return [message for message in messages if "not in OPENAI_MODELS" in message and label in message]


@pytest.mark.parametrize(("name", "warnings"), [("gpt-5.6-luna", 0), ("gpt-5.7-unlisted-preview", 1)])
async def test_a_listed_or_unlisted_openai_model_registers_and_runs_scripted(
    name: str, warnings: int, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"content": "First."}, {"content": "Second."}]), encoding="utf-8")
    selection = ModelSelection(provider="openai", name=name, params={"reasoning": {"effort": "low"}}, retry_attempts=2)
    flow = _flow_on(selection)

    with caplog.at_level("WARNING", logger="picoflow"):
        engine = FlowEngine(flows=[flow], session_store=MemorySessionStore(),
                            providers=default_registry({"PICOFLOW_SCRIPT": str(script)}))
        first = await engine.run(flow.id, "Hello")
        second = await engine.run(flow.id, "Again", first.session)
        FlowEngine(flows=[flow], session_store=MemorySessionStore(), providers=default_registry({}))

    assert (first.message, second.message) == ("First.", "Second.")
    assert len(_unlisted_warnings(caplog, f"openai:{name}")) == warnings
    # The family's rules still hold for a name the catalog does not list.
    with pytest.raises(PicoFlowError, match="does not support temperature"):
        FlowEngine(flows=[_flow_on(selection.model_copy(update={"params": {"temperature": 0.2}}))],
                   session_store=MemorySessionStore(), providers=default_registry({}))


def test_an_unknown_provider_fails_when_the_flow_is_registered() -> None:
    flow = _flow_on(ModelSelection(provider="opneai", name="gpt-5.6-luna"))

    with pytest.raises(PicoFlowError, match="model provider 'opneai' is not registered"):
        FlowEngine(flows=[flow], session_store=MemorySessionStore(), providers=default_registry({}))

"""Each provider gets its own content parts for attached files, checked offline on its real LangChain model.

Anthropic and Gemini answer from a loopback server recording the request; Bedrock's Converse goes through a
botocore ``Stubber``. A model that cannot read a file's type is refused before any request.
"""

from __future__ import annotations

import base64
from typing import Any

import pytest
from botocore.stub import Stubber

from picoflow import FlowEngine
from picoflow.files.intake import InlineFile, take_files
from picoflow.files.local_store import LocalFileStore
from picoflow.files.policy import FilePolicy
from picoflow.messages import from_message_doc, to_message_doc
from picoflow.models.factory import default_registry
from picoflow.session.document import MessageDoc
from picoflow.stores import MemorySessionStore
from tests.support.fake_openai import FakeOpenAIServer
from tests.support.file_flows import AnthropicLookFlow, BedrockLookFlow, GoogleLookFlow, OllamaLookFlow
from tests.support.files import INVOICE_PDF, INVOICE_PNG, b64
from tests.test_providers import RecordingServer, _anthropic_message, _converse_response, _gemini_response

FILES = [("invoice.png", "image/png", INVOICE_PNG), ("invoice.pdf", "application/pdf", INVOICE_PDF)]


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


async def _run(flow: type, env: dict[str, str], tmp_path: Any, registry: Any = None) -> tuple[Any, FlowEngine]:
    store = LocalFileStore(tmp_path / "files")
    engine = FlowEngine([flow], MemorySessionStore(), registry or default_registry(env), file_store=store)
    inline = [InlineFile(name=name, contentType=kind, data=b64(data)) for name, kind, data in FILES]
    taken = await take_files(store, FilePolicy(), inline=inline, caller=None, session_id=None)
    result = await engine.run(flow.id, "What is this?", files=taken.refs, file_data=taken.data,
                              inline_files=taken.inline)
    return result, engine


async def test_anthropic_gets_image_and_document_blocks(tmp_path):
    usage = {"input_tokens": 1800, "output_tokens": 12}
    with RecordingServer([_anthropic_message(usage)]) as server:
        env = {"ANTHROPIC_API_KEY": "anthropic-key", "ANTHROPIC_BASE_URL": server.url}
        result, _ = await _run(AnthropicLookFlow, env, tmp_path)

    assert result.success, result.message
    [user] = [m for m in server.requests[0]["messages"] if m["role"] == "user"]
    blocks = [block for block in user["content"] if block["type"] in ("image", "document")]
    assert [(b["type"], b["source"]["type"], b["source"]["media_type"]) for b in blocks] == [
        ("image", "base64", "image/png"), ("document", "base64", "application/pdf"),
    ]
    assert [base64.b64decode(b["source"]["data"]) for b in blocks] == [INVOICE_PNG, INVOICE_PDF]
    # The image's tokens are in the provider's own count, which the session records as reported.
    assert result.tokens.input_tokens == 1800


async def test_bedrock_gets_converse_image_and_document_blocks(tmp_path, aws_credentials):
    registry = default_registry({"AWS_REGION": "eu-west-1"})
    model = registry.chat_model(BedrockLookFlow.selection)
    sent: list[dict[str, Any]] = []
    model.client.meta.events.register(
        "before-parameter-build.bedrock-runtime.Converse", lambda params, **_: sent.append(params)
    )
    with Stubber(model.client) as stub:
        stub.add_response("converse", _converse_response({"inputTokens": 1500, "outputTokens": 9, "totalTokens": 1509}))
        result, _ = await _run(BedrockLookFlow, {}, tmp_path, registry)
        stub.assert_no_pending_responses()

    assert result.success, result.message
    [user] = [m for m in sent[0]["messages"] if m["role"] == "user"]
    image = next(block["image"] for block in user["content"] if "image" in block)
    document = next(block["document"] for block in user["content"] if "document" in block)
    assert (image["format"], image["source"]["bytes"]) == ("png", INVOICE_PNG)
    assert (document["format"], document["source"]["bytes"]) == ("pdf", INVOICE_PDF)


async def test_gemini_gets_inline_data(tmp_path):
    usage = {"promptTokenCount": 1300, "candidatesTokenCount": 8, "totalTokenCount": 1308}
    with RecordingServer([_gemini_response(usage)]) as server:
        result, _ = await _run(GoogleLookFlow, {"GEMINI_API_KEY": "k", "GOOGLE_BASE_URL": server.url}, tmp_path)

    assert result.success, result.message
    parts = [part for content in server.requests[0]["contents"] for part in content["parts"]]
    inline = [part.get("inlineData") or part.get("inline_data") for part in parts if "text" not in part]
    assert [(item.get("mimeType") or item.get("mime_type")) for item in inline] == ["image/png", "application/pdf"]
    # The Gemini client sends bytes URL-safe base64-encoded, unpadded.
    decoded = [base64.urlsafe_b64decode(item["data"] + "=" * (-len(item["data"]) % 4)) for item in inline]
    assert decoded == [INVOICE_PNG, INVOICE_PDF]


async def test_a_model_that_cannot_read_a_type_is_refused_before_any_call(tmp_path):
    with FakeOpenAIServer([]) as server:
        env = {"OLLAMA_BASE_URL": server.url + "/v1"}
        result, engine = await _run(OllamaLookFlow, env, tmp_path)

    assert (result.success, result.error_code, result.status_code) == (False, "FILE_TYPE_UNSUPPORTED", 415)
    assert server.requests == []
    # The session is untouched: the turn's write never happened.
    stored = await engine.session_store.load(result.session) if result.session else None
    assert stored is None or stored.revision == 0


def test_a_message_with_file_references_round_trips_through_its_stored_form():
    doc = MessageDoc(type="human", content=[
        {"type": "text", "text": "Here"},
        {"type": "file_ref", "id": "f_" + "a" * 32, "name": "x.png", "contentType": "image/png", "size": 3,
         "digest": "sha256:00"},
    ], id="S|t|1", timestamp="2026-01-01T00:00:00.000Z")
    message = from_message_doc(doc)
    assert to_message_doc(message).model_dump() == doc.model_dump()

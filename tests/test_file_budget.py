"""Files reach a step's model in full once per step visit, then as references it can open again, within a budget.

Conversations run through the engine on the scripted model, which records every call's messages and tools;
the files live in a local file store, attached to turns the way ``POST /ai/run`` attaches uploaded ones.
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import pytest
from langchain_core.messages import BaseMessage, ToolMessage

from picoflow import Flow, FlowEngine, ModelSelection, Step, go, tool
from picoflow.aws.runtime import build_engine
from picoflow.files.local_store import LocalFileStore
from picoflow.files.policy import DEFAULT_REQUEST_FILE_BYTES, FilePolicy
from picoflow.files.refs import FileRef, digest_of, new_file_id
from picoflow.files.reopen import OPEN_FILE_TOOL
from picoflow.files.store import FileRecord
from picoflow.models.scripted import ScriptedProvider
from picoflow.stores import MemorySessionStore
from tests.support.files import INVOICE_PNG, contains_file

KB = 1024


class ReviewStep(Step):
    def get_prompt(self) -> str:
        return "Review the files the user sends."

    @tool
    async def hand_over(self) -> Any:
        """Hand the conversation to the auditor."""
        return go(AuditStep)


class AuditStep(Step):
    def get_prompt(self) -> str:
        return "Audit the files of this conversation."


class ReviewFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="scripted", name="reviewer")

    def define_steps(self) -> list[Step]:
        return [ReviewStep(self).use_memory("review"), AuditStep(self).use_memory("review")]


class Conversation:
    """One session of ReviewFlow: turns with attached files, and what each model call received."""

    def __init__(self, tmp_path: Any, budget: int = DEFAULT_REQUEST_FILE_BYTES) -> None:
        self.store = LocalFileStore(tmp_path / "files")
        self.budget = budget
        self.session: str | None = None

    def script(self, replies: list[dict[str, Any]]) -> None:
        self.model = ScriptedProvider(replies)
        self.engine = FlowEngine([ReviewFlow], MemorySessionStore(), [self.model], file_store=self.store,
                                 file_budget=self.budget)

    async def upload(self, size: int, name: str = "scan.png") -> tuple[FileRef, bytes]:
        """A stored PNG of ``size`` bytes, distinct from every other (its padding is its id)."""
        file_id = new_file_id()
        data = (INVOICE_PNG + file_id.encode() * size)[:size]
        record = FileRecord(id=file_id, name=name, content_type="image/png", size=size,
                            expires_at=int(time.time()) + 3600)
        await self.store.put(record, data)
        return FileRef(id=file_id, name=name, content_type="image/png", size=size, digest=digest_of(data)), data

    async def turn(self, message: str, files: list[FileRef] = ()) -> str:
        result = await self.engine.run("ReviewFlow", message, self.session, files=files)
        assert result.success, result.message
        self.session = result.session
        return result.message

    async def document(self) -> dict[str, Any]:
        doc = await self.engine.session_store.load(self.session)
        return doc.to_json_dict()


def sent_files(call: list[BaseMessage]) -> list[bytes]:
    """The bytes of every file a model call received in full."""
    return [base64.b64decode(part["base64"]) for message in call if isinstance(message.content, list)
            for part in message.content if isinstance(part, dict) and part.get("type") in ("image", "file")]


def reference_lines(call: list[BaseMessage]) -> list[str]:
    return [part["text"] for message in call if isinstance(message.content, list) for part in message.content
            if isinstance(part, dict) and part.get("type") == "text" and part["text"].startswith("[File ")]


def text(reply: str) -> dict[str, Any]:
    return {"content": reply}


def call(name: str, **args: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "args": args}]}


async def test_each_turn_sends_only_its_own_file_and_names_the_earlier_ones(tmp_path):
    chat = Conversation(tmp_path)
    chat.script([text(f"Reviewed {n}.") for n in range(4)])
    uploads = [await chat.upload(180 * KB, name=f"page-{n}.png") for n in range(4)]

    for n, (ref, _) in enumerate(uploads):
        await chat.turn(f"Here is page {n}.", [ref])

    for n, call_messages in enumerate(chat.model.calls):
        assert sent_files(call_messages) == [uploads[n][1]]
        lines = reference_lines(call_messages)
        assert len(lines) == n
        assert all(f'file_id "{ref.id}"' in line for line, (ref, _) in zip(lines, uploads, strict=False))
    assert [OPEN_FILE_TOOL in tools for tools in chat.model.tools] == [False, True, True, True]
    # The document keeps references only, whatever the model was sent.
    stored = json.dumps(await chat.document())
    assert all(ref.id in stored and not contains_file(stored, data) for ref, data in uploads)


async def test_the_model_opens_an_earlier_file_again_and_gets_it_once(tmp_path):
    chat = Conversation(tmp_path)
    (first, first_data), (second, second_data) = [await chat.upload(50 * KB) for _ in range(2)]
    chat.script([text("Reviewed."), text("Reviewed."), call(OPEN_FILE_TOOL, file_id=first.id),
                 text("Page 0 says INV-2041."), text("Anything else?")])

    await chat.turn("Page 0.", [first])
    await chat.turn("Page 1.", [second])
    assert await chat.turn("What did page 0 say?") == "Page 0 says INV-2041."
    await chat.turn("Thanks.")

    asked, answered, later = chat.model.calls[2:]
    assert sent_files(asked) == []
    assert sent_files(answered) == [first_data]
    assert isinstance(answered[-2], ToolMessage) and answered[-2].status == "success"
    assert sent_files(later) == []
    assert len(reference_lines(later)) == 3


async def test_only_files_of_the_conversation_can_be_opened(tmp_path):
    chat = Conversation(tmp_path)
    ref, _ = await chat.upload(10 * KB)
    stranger, _ = await chat.upload(10 * KB)
    chat.script([text("Reviewed."), call(OPEN_FILE_TOOL, file_id=stranger.id), text("No.")])

    await chat.turn("A page.", [ref])
    await chat.turn(f"Open {stranger.id}.")

    _, asked, answered = chat.model.calls
    refused = answered[-1]
    assert isinstance(refused, ToolMessage) and refused.status == "error"
    assert sent_files(answered) == []


async def test_a_tool_loop_keeps_the_file_and_the_next_step_reads_it_once(tmp_path):
    chat = Conversation(tmp_path)
    chat.script([call("hand_over"), text("Audited."), text("Still audited.")])
    ref, data = await chat.upload(20 * KB)

    assert await chat.turn("Review and hand over.", [ref]) == "Audited."
    await chat.turn("Anything to add?")

    review, audit, audit_later = chat.model.calls
    # The reviewer reads the file; the auditor's visit starts with it in full; its next turn names it.
    assert sent_files(review) == [data] and sent_files(audit) == [data]
    assert sent_files(audit_later) == [] and len(reference_lines(audit_later)) == 1


async def test_a_request_carries_at_most_its_budget_of_files_newest_first(tmp_path):
    chat = Conversation(tmp_path, budget=200 * KB)
    chat.script([text("Reviewed.")])
    (older, _), (newer, newer_data), (huge, _) = [await chat.upload(size) for size in (120 * KB, 150 * KB, 300 * KB)]

    await chat.turn("Three pages.", [older, newer, huge])

    [sent] = chat.model.calls
    assert sent_files(sent) == [newer_data]
    lines = reference_lines(sent)
    assert any(f'file_id "{older.id}"' in line for line in lines)
    assert any("larger than one request may carry" in line and huge.id not in line for line in lines)


def test_the_budget_is_configured_from_the_environment(tmp_path):
    assert FilePolicy.from_env({}).max_request_bytes == DEFAULT_REQUEST_FILE_BYTES
    script = tmp_path / "script.json"
    script.write_text("[]")
    env = {"PICOFLOW_MAX_REQUEST_FILE_BYTES": "262144", "FILES_FOLDER": str(tmp_path / "files"),
           "PICOFLOW_FLOWS": "flows.basic", "PICOFLOW_SCRIPT": str(script)}
    assert build_engine(env).file_budget == 262144
    with pytest.raises(ValueError):
        FilePolicy.from_env({"PICOFLOW_MAX_REQUEST_FILE_BYTES": "0"})

"""A flow's conversation memory: its namespaces of messages and which of them roll into summaries."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import BaseMessage, SystemMessage

from picoflow.messages import from_message_doc, to_message_doc
from picoflow.models.registry import ModelSelection
from picoflow.session.document import MessageDoc, NamespaceDoc, validate_namespace

DEFAULT_SUMMARY_MIN_MESSAGES = 16
DEFAULT_SUMMARY_RECENT_MESSAGES = 8
MIN_SUMMARY_MIN_MESSAGES = 8


@dataclass(frozen=True)
class SummaryConfig:
    """When a namespace is compacted and how many of its newest messages are kept verbatim.

    A namespace is compacted once its history, the system slot at index 0 included, has reached
    ``min_messages`` messages; ``recent_messages`` is how many of the newest ones survive a compaction
    unchanged.
    """

    min_messages: int = DEFAULT_SUMMARY_MIN_MESSAGES
    recent_messages: int = DEFAULT_SUMMARY_RECENT_MESSAGES

    def __post_init__(self) -> None:
        if not _is_int(self.min_messages) or self.min_messages < MIN_SUMMARY_MIN_MESSAGES:
            raise ValueError(
                f"min_messages must be an integer >= {MIN_SUMMARY_MIN_MESSAGES}, got {self.min_messages!r}"
            )
        upper = self.min_messages - 2
        if not _is_int(self.recent_messages) or not 1 <= self.recent_messages <= upper:
            raise ValueError(
                f"recent_messages must be an integer from 1 to {upper} (min_messages - 2), got {self.recent_messages!r}"
            )


def _is_int(value: Any) -> bool:
    # bool is an int subclass, but True is not a message count
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass
class Namespace:
    """One namespace's live history; index 0 is the system slot."""

    messages: list[BaseMessage] = field(default_factory=lambda: [SystemMessage(content="")])
    summary: str | None = None
    summarized_through_id: str | None = None
    # The stored form of each message loaded from the document, keyed by the message object's id(); stored
    # messages are history and are never edited in place, so saving can reuse these instead of re-encoding.
    stored: dict[int, tuple[BaseMessage, MessageDoc]] = field(default_factory=dict, repr=False)

    def erase(self) -> list[BaseMessage]:
        """Drop every message but the system slot; the summary is a separate record and stays."""
        del self.messages[1:]
        return self.messages

    def dump(self) -> NamespaceDoc:
        return NamespaceDoc(
            messages=[self._stored_form(message) for message in self.messages],
            summary=self.summary,
            summarized_through_id=self.summarized_through_id,
        )

    def _stored_form(self, message: BaseMessage) -> MessageDoc:
        known = self.stored.get(id(message))
        return known[1] if known is not None and known[0] is message else to_message_doc(message)


class Memory:
    """All namespaces of one flow, and which of them are compacted into rolling summaries."""

    def __init__(self) -> None:
        # A namespace stays in its stored form until a step touches it: most turns read one namespace.
        self._spaces: dict[str, Namespace | NamespaceDoc] = {}
        self.summary_model: ModelSelection | None = None
        self.summary_config = SummaryConfig()
        self.summary_namespaces: set[str] = set()

    def set_summary_model(self, selection: ModelSelection | dict[str, Any]) -> Memory:
        """The model that writes rolling summaries (resolved through the engine's providers)."""
        self.summary_model = selection if isinstance(selection, ModelSelection) else ModelSelection(**selection)
        return self

    def set_summary_config(self, min_messages: int = 16, recent_messages: int = 8) -> Memory:
        """Compact once a history (system slot included) reaches ``min_messages``, keeping ``recent_messages``."""
        self.summary_config = SummaryConfig(min_messages=min_messages, recent_messages=recent_messages)
        return self

    def enable_summary(self, namespace: str) -> Memory:
        """Opt one namespace into compaction."""
        self.summary_namespaces.add(validate_namespace(namespace))
        return self

    def namespace(self, name: str) -> Namespace:
        """The live namespace, created (with its system slot) on first use."""
        space = self._spaces.get(name)
        if space is None:
            space = self._spaces[validate_namespace(name)] = Namespace()
        elif isinstance(space, NamespaceDoc):
            space = self._spaces[name] = _hydrate(space)
        return space

    def clear_summary(self, name: str) -> None:
        """Forget the rolling summary of namespace ``name``; its messages stay."""
        space = self.namespace(name)
        space.summary = None
        space.summarized_through_id = None

    def messages(self, name: str) -> list[BaseMessage]:
        return self.namespace(name).messages

    def names(self) -> list[str]:
        return list(self._spaces)

    def load(self, docs: dict[str, NamespaceDoc]) -> None:
        """Hydrate from the persisted ``flow.memory`` map."""
        self._spaces = dict(docs)

    def dump(self) -> dict[str, NamespaceDoc]:
        """The persisted ``flow.memory`` map."""
        return {
            name: space if isinstance(space, NamespaceDoc) else space.dump() for name, space in self._spaces.items()
        }


def _hydrate(doc: NamespaceDoc) -> Namespace:
    pairs = [(from_message_doc(m), m) for m in doc.messages]
    messages = [message for message, _ in pairs]
    if not messages or not isinstance(messages[0], SystemMessage):
        messages.insert(0, SystemMessage(content=""))
    stored = {id(message): (message, stored) for message, stored in pairs}
    return Namespace(messages, doc.summary, doc.summarized_through_id, stored)


"""The flow's conversation memory: message lists keyed by namespace, plus compaction settings."""

from __future__ import annotations

from dataclasses import dataclass, field

from langchain_core.messages import BaseMessage, SystemMessage

from picoflow.compaction import SummaryConfig
from picoflow.messages import from_message_doc, to_message_doc
from picoflow.models.selection import ModelSelection
from picoflow.session.document import NamespaceDoc, validate_namespace


@dataclass
class Namespace:
    """One namespace's live history; index 0 is the system slot."""

    messages: list[BaseMessage] = field(default_factory=lambda: [SystemMessage(content="")])
    summary: str | None = None
    summarized_through_id: str | None = None


class Memory:
    """All namespaces of one flow, and which of them are compacted into rolling summaries."""

    def __init__(self) -> None:
        # A namespace stays in its stored form until a step touches it: most turns read one namespace.
        self._spaces: dict[str, Namespace | NamespaceDoc] = {}
        self.summary_model: ModelSelection | None = None
        self.summary_config = SummaryConfig()
        self.summary_namespaces: set[str] = set()

    def set_summary_model(self, selection: ModelSelection | dict) -> Memory:
        """The model that writes rolling summaries (resolved through the engine's providers)."""
        self.summary_model = selection if isinstance(selection, ModelSelection) else ModelSelection(**selection)
        return self

    def set_summary_config(self, min_messages: int = 16, recent_messages: int = 8) -> Memory:
        """Compact once a namespace holds more than ``min_messages``, keeping ``recent_messages`` verbatim."""
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
            name: space if isinstance(space, NamespaceDoc) else NamespaceDoc(
                messages=[to_message_doc(m) for m in space.messages],
                summary=space.summary,
                summarized_through_id=space.summarized_through_id,
            )
            for name, space in self._spaces.items()
        }


def _hydrate(doc: NamespaceDoc) -> Namespace:
    messages = [from_message_doc(m) for m in doc.messages]
    if not messages or not isinstance(messages[0], SystemMessage):
        messages.insert(0, SystemMessage(content=""))
    return Namespace(messages, doc.summary, doc.summarized_through_id)

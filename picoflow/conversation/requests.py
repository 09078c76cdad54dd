"""The user's requests in a conversation: what a decision reads and ``Flow.get_conversation`` returns."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NoReturn

from langchain_core.messages import BaseMessage, HumanMessage

from picoflow.errors import PicoFlowError
from picoflow.messages import CONTINUE_PREFIX, EMPTY_RESPONSE_NUDGE, OPENER_TEXT, content_text, message_origin

DEFAULT_MAX_PRIOR_REQUESTS = 4


class DecisionConversation(dict[str, Any]):
    """The newest human request of a namespace and up to N earlier ones, oldest first.

    It is the read-only mapping ``{"request": ..., "priorRequests": [...]}``, so ``json.dumps`` and a prompt's
    placeholder both give that JSON as it is; ``request`` and ``prior_requests`` read the same values.
    """

    def __init__(self, request: str = "", prior_requests: Iterable[str] = ()) -> None:
        super().__init__(request=request, priorRequests=tuple(prior_requests))

    @property
    def request(self) -> str:
        """The newest human request, ``""`` when there is none."""
        return str(self["request"])

    @property
    def prior_requests(self) -> tuple[str, ...]:
        """The earlier human requests, oldest first."""
        return tuple(self["priorRequests"])

    def as_state(self) -> dict[str, Any]:
        """The framework-owned part of a decision's input state."""
        return {"request": self.request, "priorRequests": list(self.prior_requests)}

    def __repr__(self) -> str:
        return f"DecisionConversation(request={self.request!r}, prior_requests={self.prior_requests!r})"

    def __hash__(self) -> int:  # type: ignore[override]
        return hash((self.request, self.prior_requests))

    def __reduce__(self) -> tuple[Any, ...]:
        # Copies and pickles are rebuilt through __init__, never by writing items into a read-only mapping.
        return (type(self), (self.request, self.prior_requests))

    def _read_only(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("A DecisionConversation is read-only.")

    __setitem__ = __delitem__ = __ior__ = _read_only
    clear = pop = popitem = setdefault = update = _read_only


def read_conversation(
    messages: Sequence[BaseMessage], step_names: Iterable[str], max_prior_requests: int = DEFAULT_MAX_PRIOR_REQUESTS
) -> DecisionConversation:
    """The human requests in ``messages``, leaving out the navigation messages the framework writes.

    A message's recorded origin decides; one without it (stored before origins were recorded, or built as a
    plain ``HumanMessage``) counts as navigation when its text is one the framework writes.
    """
    if isinstance(max_prior_requests, bool) or not isinstance(max_prior_requests, int) or max_prior_requests < 0:
        raise PicoFlowError("max_prior_requests must be a non-negative integer.")
    # The framework's own human messages: the opener of a step entered with nothing to say, the hand-over into
    # a logic step, the nudge after an empty answer.
    navigation = {OPENER_TEXT, EMPTY_RESPONSE_NUDGE, *(f"{CONTINUE_PREFIX}{name}" for name in step_names)}
    requests = []
    for message in messages:
        if not isinstance(message, HumanMessage):
            continue
        origin = message_origin(message)
        text = content_text(message.content)
        if origin == "user" or (origin is None and text not in navigation):
            requests.append(text)
    if not requests:
        return DecisionConversation()
    earlier = requests[:-1][-max_prior_requests:] if max_prior_requests else []
    return DecisionConversation(request=requests[-1], prior_requests=tuple(earlier))

"""Chat Completions requests sent as LangChain built them, without the OpenAI SDK's per-request parameter transform.

The SDK's ``chat.completions.create`` walks every message of the request against its typed-dict schema (aliases,
date and file formats) before sending it: several milliseconds of CPU for a conversation of a few dozen messages,
most of a request's cost. The payloads ``langchain-openai`` builds are plain JSON values that this walk returns
unchanged, so ``DirectCompletions`` sends them as they are. Everything else is the SDK's own: the request options
(headers, timeout, authentication) come from ``create`` itself, called with no messages, and the request is sent,
retried, parsed and streamed by the same resource.
"""

from __future__ import annotations

from typing import Any

# The keyword arguments of ``create`` that are request options rather than body fields.
_OPTION_KEYS = frozenset({"extra_headers", "extra_query", "extra_body", "timeout"})


class _Recorder:
    """Stands in for the resource so that ``create`` hands over what it would send instead of sending it."""

    def __init__(self) -> None:
        self.sent: dict[str, Any] | None = None

    def _post(self, path: str, **request: Any) -> None:
        self.sent = {"path": path, **request}


class DirectCompletions:
    """A ``chat.completions`` resource whose ``create`` skips the body transform; anything else is the resource's."""

    def __init__(self, completions: Any) -> None:
        self._completions = completions

    def create(self, **params: Any) -> Any:
        options = {key: params.pop(key) for key in _OPTION_KEYS & params.keys()}
        recorder = _Recorder()
        try:
            # Only the options and the response types are taken from this call; its tiny body is dropped.
            type(self._completions).create(
                recorder, model=params.get("model", ""), messages=[], stream=params.get("stream") or False, **options
            )
        except (TypeError, AttributeError):
            recorder.sent = None
        sent = recorder.sent
        if sent is None:
            # An SDK whose create works differently: send through it, transform and all.
            return self._completions.create(**params, **options)
        sent["body"] = params
        return self._completions._post(sent.pop("path"), **sent)

    @property
    def with_raw_response(self) -> _RawResponse:
        return _RawResponse(self)

    def __getattr__(self, name: str) -> Any:
        completions = self.__dict__.get("_completions")
        # Special names (copying, pickling) and a half-made copy must not reach into the resource.
        if completions is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(completions, name)


class _RawResponse:
    """``with_raw_response``: the same call, answered with the SDK's raw response object."""

    def __init__(self, direct: DirectCompletions) -> None:
        from openai._legacy_response import to_raw_response_wrapper

        self.create = to_raw_response_wrapper(direct.create)

"""Chat Completions requests sent as LangChain built them, without the OpenAI SDK's per-request parameter transform.

The SDK's ``chat.completions.create`` walks every message of the request against its typed-dict schema (aliases,
date and file formats) before sending it: several milliseconds of CPU for a conversation of a few dozen messages,
most of a request's cost. The payloads ``langchain-openai`` builds are plain JSON values that this walk returns
unchanged, so ``DirectCompletions`` sends them as they are. Everything else is the SDK's own: the request options
(authentication, response types) come from ``create`` itself, called once with no messages, the call's own
options (headers, timeout) from the SDK's option builder, and the request is sent, retried, parsed and streamed
by the same resource.
"""

from __future__ import annotations

import contextlib
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
        # Imported here, like the SDK itself: only a model that is being built needs them.
        from openai._base_client import make_request_options
        from openai._legacy_response import to_raw_response_wrapper

        self._completions = completions
        self._request_options = make_request_options
        # What create sends besides the body and the call's own options, per stream flag: it depends on the SDK
        # alone, so it is recorded once (None: this SDK's create cannot be recorded).
        self._shapes: dict[bool, dict[str, Any] | None] = {}
        self.with_raw_response = _RawResponse(to_raw_response_wrapper(self.create))

    def create(self, **params: Any) -> Any:
        options = {key: params.pop(key) for key in _OPTION_KEYS & params.keys()}
        shape = self._shape(bool(params.get("stream")))
        if shape is None:
            # An SDK whose create works differently: send through it, transform and all.
            return self._completions.create(**params, **options)
        request = {**shape, "body": params, "options": {**shape["options"], **self._request_options(**options)}}
        return self._completions._post(request.pop("path"), **request)

    def _shape(self, stream: bool) -> dict[str, Any] | None:
        if stream not in self._shapes:
            recorder = _Recorder()
            with contextlib.suppress(TypeError, AttributeError):
                type(self._completions).create(recorder, model="", messages=[], stream=stream)
            self._shapes[stream] = recorder.sent
        return self._shapes[stream]

    def __getattr__(self, name: str) -> Any:
        completions = self.__dict__.get("_completions")
        # Special names (copying, pickling) and a half-made copy must not reach into the resource.
        if completions is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(completions, name)


class _RawResponse:
    """``with_raw_response``: the same call, answered with the SDK's raw response object."""

    def __init__(self, create: Any) -> None:
        self.create = create

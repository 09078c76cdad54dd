"""The built-in ``openai`` provider: LangChain's ``ChatOpenAI``, and a small catalog of the models it knows."""

from __future__ import annotations

import os
import re
from typing import Any

from langchain_core.language_models import BaseChatModel

from picoflow.errors import PicoFlowError
from picoflow.models.registry import ModelProvider
from picoflow.models.selection import ModelSelection

_CHAT_PARAMS = frozenset(
    {"temperature", "top_p", "max_tokens", "max_completion_tokens", "timeout", "seed", "stop",
     "frequency_penalty", "presence_penalty"}
)
_REASONING_PARAMS = frozenset({"reasoning_effort", "reasoning", "max_tokens", "max_completion_tokens", "timeout"})

OPENAI_MODELS: dict[str, frozenset[str]] = {
    "gpt-4o": _CHAT_PARAMS,
    "gpt-4o-mini": _CHAT_PARAMS,
    "gpt-4.1": _CHAT_PARAMS,
    "gpt-4.1-mini": _CHAT_PARAMS,
    "gpt-4.1-nano": _CHAT_PARAMS,
    "gpt-5": _REASONING_PARAMS,
    "gpt-5-mini": _REASONING_PARAMS,
    "gpt-5-nano": _REASONING_PARAMS,
    "gpt-5.1": _REASONING_PARAMS,
    "o3": _REASONING_PARAMS,
    "o3-mini": _REASONING_PARAMS,
    "o4-mini": _REASONING_PARAMS,
}
"""Model names the ``openai`` provider accepts (a dated snapshot such as ``gpt-4o-2024-08-06`` too), with
the parameters each takes."""

REASONING_EFFORTS = frozenset({"none", "minimal", "low", "medium", "high"})

# Connection and retry settings belong to the provider and the runner, never to a selection's params.
_RESERVED_PARAMS = {
    "model": "the model is the selection's name",
    "model_name": "the model is the selection's name",
    "api_key": "credentials belong to the provider",
    "openai_api_key": "credentials belong to the provider",
    "base_url": "the endpoint belongs to the provider",
    "openai_api_base": "the endpoint belongs to the provider",
    "max_retries": "set retry_attempts on the selection; PicoFlow makes the attempts itself",
}

_REASONING_NAME = re.compile(r"^(gpt-5|o\d)", re.IGNORECASE)
_SNAPSHOT_SUFFIX = re.compile(r"-\d{4}-\d{2}-\d{2}$")


class OpenAIProvider(ModelProvider):
    """Chat models from OpenAI, or from any OpenAI-compatible server given by ``base_url``.

    The key comes from ``api_key`` or ``OPENAI_API_KEY``, the endpoint from ``base_url`` or
    ``OPENAI_BASE_URL`` (both read when a model is built). Registered under the built-in name
    ``openai`` it accepts only the models of ``OPENAI_MODELS``; under any other name (an
    application-owned compatible endpoint) any model name is accepted and only the parameters
    are checked.
    """

    def __init__(self, api_key: str | None = None, base_url: str | None = None, name: str = "openai") -> None:
        self.name = name
        self._api_key = api_key
        self._base_url = base_url

    def validate(self, selection: ModelSelection) -> None:
        """Reject an uncataloged built-in model, an unknown or reserved parameter, or a bad parameter value."""
        label = f"{selection.provider}:{selection.name}"
        params = selection.params
        for key, reason in _RESERVED_PARAMS.items():
            if key in params:
                raise PicoFlowError(f"Model '{label}' params must not set '{key}': {reason}.")
        accepted = _catalog_params(label, selection.name) if self.name == "openai" else None
        _check_values(label, selection.name, params)
        if accepted is not None and (unknown := sorted(set(params) - accepted)):
            raise PicoFlowError(
                f"Model '{label}' does not accept parameter(s) {', '.join(unknown)}; "
                f"accepted: {', '.join(sorted(accepted))}."
            )

    def chat_model(self, selection: ModelSelection) -> BaseChatModel:
        """A ``ChatOpenAI`` for ``selection`` with client-side retries off (the runner makes the attempts)."""
        api_key = self._api_key or os.environ.get("OPENAI_API_KEY")
        if not api_key:
            raise PicoFlowError(
                f"Model provider '{self.name}' has no API key: pass api_key to OpenAIProvider or set OPENAI_API_KEY."
            )
        base_url = self._base_url or os.environ.get("OPENAI_BASE_URL") or None
        # Imported here: the OpenAI client stack is slow to import and a Lambda cold start may not need it.
        from langchain_openai import ChatOpenAI

        options: dict[str, Any] = dict(selection.params)
        if base_url:
            options["base_url"] = base_url
        return ChatOpenAI(model=selection.name, api_key=api_key, max_retries=0, **options)


def _catalog_params(label: str, model_name: str) -> frozenset[str]:
    accepted = OPENAI_MODELS.get(_SNAPSHOT_SUFFIX.sub("", model_name))
    if accepted is None:
        raise PicoFlowError(
            f"Unknown built-in model '{label}'. Add it to OPENAI_MODELS before selecting it, "
            "or register an OpenAIProvider under another name for an uncataloged model."
        )
    return accepted


def _check_values(label: str, model_name: str, params: dict[str, Any]) -> None:
    if "temperature" in params:
        if _REASONING_NAME.match(model_name):
            raise PicoFlowError(f"Model '{label}' does not support temperature.")
        temperature = params["temperature"]
        if not _is_number(temperature) or not 0 <= temperature <= 2:
            raise PicoFlowError(f"Model '{label}' temperature must be a number from 0 to 2, got {temperature!r}.")
    if "top_p" in params and (not _is_number(params["top_p"]) or not 0 <= params["top_p"] <= 1):
        raise PicoFlowError(f"Model '{label}' top_p must be a number from 0 to 1, got {params['top_p']!r}.")
    for key in ("max_tokens", "max_completion_tokens"):
        value = params.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise PicoFlowError(f"Model '{label}' {key} must be a positive integer, got {value!r}.")
    timeout = params.get("timeout")
    if timeout is not None and (not _is_number(timeout) or timeout <= 0):
        raise PicoFlowError(f"Model '{label}' timeout must be a positive number of seconds, got {timeout!r}.")
    efforts = [params.get("reasoning_effort")]
    reasoning = params.get("reasoning")
    if reasoning is not None:
        if not isinstance(reasoning, dict):
            raise PicoFlowError(f"Model '{label}' reasoning must be an object such as {{'effort': 'low'}}.")
        efforts.append(reasoning.get("effort"))
    for effort in efforts:
        if effort is not None and effort not in REASONING_EFFORTS:
            raise PicoFlowError(
                f"Model '{label}' reasoning effort must be one of {', '.join(sorted(REASONING_EFFORTS))}, "
                f"got {effort!r}."
            )


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)

"""The ``anthropic`` provider: Claude through Anthropic's Messages API (``pip install 'picoflow[anthropic]'``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from langchain_core.language_models import BaseChatModel

from picoflow.errors import ModelNotConfiguredError, PicoFlowError
from picoflow.files.refs import KNOWN_TYPES
from picoflow.models.caching import ANTHROPIC_POINTS, PROMPT_CACHE_PARAM, check_prompt_cache, prompt_caching
from picoflow.models.common import (
    CLIENT_RETRIES,
    DEFAULT_TIMEOUT_SECONDS,
    check_common_values,
    checked_params,
    env_value,
    import_extra,
    key_setting,
    key_token,
    usage_normalising,
)
from picoflow.models.registry import ModelProvider, ModelSelection

ANTHROPIC_DEFAULT_BASE_URL = "https://api.anthropic.com"
ANTHROPIC_PARAMS = frozenset(
    {"temperature", "top_p", "top_k", "max_tokens", "timeout", "stop", "thinking", PROMPT_CACHE_PARAM}
)
"""The parameters an ``anthropic`` selection may set."""


class AnthropicProvider(ModelProvider):
    """Claude models via ``langchain-anthropic``'s ``ChatAnthropic``, imported only when a model is built.

    The key comes from ``api_key`` or ``ANTHROPIC_API_KEY``, the endpoint from ``base_url``,
    ``ANTHROPIC_BASE_URL`` or Anthropic's own; both are read from ``environ`` (the process environment by
    default) when a model is built. Any model name is accepted; the parameters are checked. Requests carry
    cache points (see ``picoflow.models.caching``) unless the selection sets ``prompt_cache`` to false.
    """

    #: Images and PDFs, sent as images and PDF documents.
    file_types = KNOWN_TYPES

    def __init__(
        self,
        api_key: str | None = None,
        base_url: str | None = None,
        *,
        name: str = "anthropic",
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self._api_key = api_key
        self._base_url = base_url
        self._environ = environ

    def validate(self, selection: ModelSelection) -> None:
        """Reject a reserved or unknown parameter, or a bad parameter value."""
        label, params = checked_params(selection, ANTHROPIC_PARAMS)
        check_common_values(label, params, max_temperature=1.0)
        check_prompt_cache(label, params)
        thinking = params.get("thinking")
        if thinking is not None and not isinstance(thinking, dict):
            raise PicoFlowError(
                f"Model '{label}' thinking must be an object such as {{'type': 'enabled', 'budget_tokens': 2048}}."
            )

    def missing_setting(self) -> str | None:
        """``ANTHROPIC_API_KEY`` (or its ``_PARAMETER``) when no key is set."""
        env = os.environ if self._environ is None else self._environ
        return None if self._api_key or env_value(env, "ANTHROPIC_API_KEY") else key_setting(env, "ANTHROPIC_API_KEY")

    def credentials_token(self) -> str:
        env = os.environ if self._environ is None else self._environ
        return key_token(self._api_key or env_value(env, "ANTHROPIC_API_KEY"))

    def chat_model(self, selection: ModelSelection) -> BaseChatModel:
        """A ``ChatAnthropic`` with a request timeout; its client retries transport failures itself."""
        env = os.environ if self._environ is None else self._environ
        api_key = self._api_key or env_value(env, "ANTHROPIC_API_KEY")
        if not api_key:
            raise ModelNotConfiguredError(
                f"Model provider '{self.name}' has no API key: pass api_key to AnthropicProvider "
                "or set ANTHROPIC_API_KEY.",
                provider=self.name,
                setting=key_setting(env, "ANTHROPIC_API_KEY"),
            )
        base_url = self._base_url or env_value(env, "ANTHROPIC_BASE_URL") or ANTHROPIC_DEFAULT_BASE_URL
        module = import_extra("langchain_anthropic", provider=self.name, extra="anthropic")
        options: dict[str, Any] = {"timeout": DEFAULT_TIMEOUT_SECONDS, **selection.params}
        chat_class = usage_normalising(module.ChatAnthropic)
        if options.pop(PROMPT_CACHE_PARAM, True):
            chat_class = prompt_caching(chat_class, ANTHROPIC_POINTS)
        model: BaseChatModel = chat_class(
            model=selection.name, api_key=api_key, base_url=base_url, max_retries=CLIENT_RETRIES, **options
        )
        return model

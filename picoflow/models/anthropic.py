"""The ``anthropic`` provider: Claude through Anthropic's Messages API (``pip install 'picoflow[anthropic]'``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langchain_core.language_models import BaseChatModel

from picoflow.errors import PicoFlowError
from picoflow.files.refs import KNOWN_TYPES
from picoflow.models.caching import ANTHROPIC_POINTS, PROMPT_CACHE_PARAM, check_prompt_cache, prompt_caching
from picoflow.models.common import (
    CLIENT_RETRIES,
    DEFAULT_TIMEOUT_SECONDS,
    KeyedProvider,
    env_value,
    import_extra,
    usage_normalising,
)
from picoflow.models.registry import ModelSelection
from picoflow.models.vocabulary import Vocabulary

ANTHROPIC_DEFAULT_BASE_URL = "https://api.anthropic.com"
ANTHROPIC_PARAMS = frozenset(
    {"temperature", "top_p", "top_k", "max_tokens", "timeout", "stop", "thinking", PROMPT_CACHE_PARAM}
)
"""The parameters an ``anthropic`` selection may set."""


ANTHROPIC_VOCABULARY = Vocabulary(
    # Claude ends a reply its safety classifiers stopped with stop_reason "refusal".
    blocked_finish_reasons=frozenset({"refusal"}),
    throttling_names=frozenset({"RateLimitError"}),
)
"""How Anthropic's API refuses and throttles."""


class AnthropicProvider(KeyedProvider):
    """Claude models via ``langchain-anthropic``'s ``ChatAnthropic``, imported only when a model is built.

    The key comes from ``api_key`` or ``ANTHROPIC_API_KEY``, the endpoint from ``base_url``,
    ``ANTHROPIC_BASE_URL`` or Anthropic's own; both are read from ``environ`` (the process environment by
    default) when a model is built. Any model name is accepted; the parameters are checked. Requests carry
    cache points (see ``picoflow.models.caching``) unless the selection sets ``prompt_cache`` to false.
    """

    #: Images and PDFs, sent as images and PDF documents.
    file_types = KNOWN_TYPES

    name = "anthropic"
    accepted_params = ANTHROPIC_PARAMS
    max_temperature = 1.0
    key_variables = ("ANTHROPIC_API_KEY",)
    vocabulary = ANTHROPIC_VOCABULARY

    def check_values(self, label: str, params: Mapping[str, Any]) -> None:
        """The prompt cache switch, and ``thinking`` as an object."""
        check_prompt_cache(label, params)
        thinking = params.get("thinking")
        if thinking is not None and not isinstance(thinking, dict):
            raise PicoFlowError(
                f"Model '{label}' thinking must be an object such as {{'type': 'enabled', 'budget_tokens': 2048}}."
            )

    def chat_model(self, selection: ModelSelection) -> BaseChatModel:
        """A ``ChatAnthropic`` with a request timeout; its client retries transport failures itself."""
        api_key = self.required_key()
        base_url = self._base_url or env_value(self.environ, "ANTHROPIC_BASE_URL") or ANTHROPIC_DEFAULT_BASE_URL
        module = import_extra("langchain_anthropic", provider=self.name, extra="anthropic")
        options: dict[str, Any] = {"timeout": DEFAULT_TIMEOUT_SECONDS, **selection.params}
        chat_class = usage_normalising(module.ChatAnthropic)
        if options.pop(PROMPT_CACHE_PARAM, True):
            chat_class = prompt_caching(chat_class, ANTHROPIC_POINTS)
        model: BaseChatModel = chat_class(
            model=selection.name, api_key=api_key, base_url=base_url, max_retries=CLIENT_RETRIES, **options
        )
        return model

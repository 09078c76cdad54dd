"""The ``google`` provider: Gemini through the Gemini API (``pip install 'picoflow[google]'``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from langchain_core.language_models import BaseChatModel

from picoflow.errors import ModelNotConfiguredError, PicoFlowError
from picoflow.files.refs import KNOWN_TYPES
from picoflow.models.common import (
    CLIENT_RETRIES,
    DEFAULT_TIMEOUT_SECONDS,
    check_common_values,
    checked_params,
    env_value,
    import_extra,
    key_setting,
    key_token,
)
from picoflow.models.registry import ModelProvider, ModelSelection

GOOGLE_DEFAULT_BASE_URL = "https://generativelanguage.googleapis.com"
GOOGLE_PARAMS = frozenset(
    {"temperature", "top_p", "top_k", "max_output_tokens", "max_tokens", "timeout", "stop", "seed",
     "thinking_budget", "include_thoughts", "presence_penalty", "frequency_penalty", "safety_settings"}
)
"""The parameters a ``google`` selection may set (``max_tokens`` is read as ``max_output_tokens``)."""

# The Google client counts attempts, the first included (0 would mean its own default).
_GOOGLE_CLIENT_ATTEMPTS = CLIENT_RETRIES + 1


class GoogleProvider(ModelProvider):
    """Gemini models via ``langchain-google-genai``'s ``ChatGoogleGenerativeAI``, imported only when a model
    is built.

    The key comes from ``api_key``, ``GOOGLE_API_KEY`` or ``GEMINI_API_KEY``, the endpoint from ``base_url``,
    ``GOOGLE_BASE_URL`` or the Gemini API's own; all are read from ``environ`` (the process environment by
    default) when a model is built. Any model name is accepted; the parameters are checked.
    """

    #: Images and PDFs, sent as inline data.
    file_types = KNOWN_TYPES

    def __init__(
        self,
        api_key: str | None = None,
        base_url: str | None = None,
        *,
        name: str = "google",
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self._api_key = api_key
        self._base_url = base_url
        self._environ = environ

    def validate(self, selection: ModelSelection) -> None:
        """Reject a reserved or unknown parameter, or a bad parameter value."""
        label, params = checked_params(selection, GOOGLE_PARAMS)
        if "max_tokens" in params and "max_output_tokens" in params:
            raise PicoFlowError(f"Model '{label}' sets both max_tokens and max_output_tokens; keep one.")
        check_common_values(label, params)
        budget = params.get("thinking_budget")
        if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool) or budget < -1):
            raise PicoFlowError(
                f"Model '{label}' thinking_budget must be an integer: -1 (dynamic), 0 (off) or a token count, "
                f"got {budget!r}."
            )

    def missing_setting(self) -> str | None:
        """``GOOGLE_API_KEY`` (or its ``_PARAMETER``) when neither it nor ``GEMINI_API_KEY`` is set."""
        env = os.environ if self._environ is None else self._environ
        if self._api_key or env_value(env, "GOOGLE_API_KEY", "GEMINI_API_KEY"):
            return None
        return key_setting(env, "GOOGLE_API_KEY")

    def credentials_token(self) -> str:
        env = os.environ if self._environ is None else self._environ
        return key_token(self._api_key or env_value(env, "GOOGLE_API_KEY", "GEMINI_API_KEY"))

    def chat_model(self, selection: ModelSelection) -> BaseChatModel:
        """A ``ChatGoogleGenerativeAI`` with a request timeout and a single attempt per call (the runner makes
        the attempts)."""
        env = os.environ if self._environ is None else self._environ
        api_key = self._api_key or env_value(env, "GOOGLE_API_KEY", "GEMINI_API_KEY")
        if not api_key:
            raise ModelNotConfiguredError(
                f"Model provider '{self.name}' has no API key: pass api_key to GoogleProvider "
                "or set GOOGLE_API_KEY (or GEMINI_API_KEY).",
                provider=self.name,
                setting=key_setting(env, "GOOGLE_API_KEY"),
            )
        module = import_extra("langchain_google_genai", provider=self.name, extra="google")
        options: dict[str, Any] = {"timeout": DEFAULT_TIMEOUT_SECONDS, **selection.params}
        if "max_tokens" in options:
            options["max_output_tokens"] = options.pop("max_tokens")
        base_url = self._base_url or env_value(env, "GOOGLE_BASE_URL")
        if base_url:
            options["base_url"] = base_url
        model: BaseChatModel = module.ChatGoogleGenerativeAI(
            model=selection.name, google_api_key=api_key, max_retries=_GOOGLE_CLIENT_ATTEMPTS, **options
        )
        return model

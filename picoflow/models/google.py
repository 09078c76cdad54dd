"""The ``google`` provider: Gemini through the Gemini API (``pip install 'picoflow[google]'``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langchain_core.language_models import BaseChatModel

from picoflow.errors import PicoFlowError
from picoflow.files.refs import KNOWN_TYPES
from picoflow.models.common import (
    CLIENT_RETRIES,
    DEFAULT_TIMEOUT_SECONDS,
    KeyedProvider,
    env_value,
    import_extra,
)
from picoflow.models.registry import ModelSelection
from picoflow.models.vocabulary import Vocabulary

GOOGLE_DEFAULT_BASE_URL = "https://generativelanguage.googleapis.com"
GOOGLE_PARAMS = frozenset(
    {"temperature", "top_p", "top_k", "max_output_tokens", "max_tokens", "timeout", "stop", "seed",
     "thinking_budget", "include_thoughts", "presence_penalty", "frequency_penalty", "safety_settings"}
)
"""The parameters a ``google`` selection may set (``max_tokens`` is read as ``max_output_tokens``)."""

# The Google client counts attempts, the first included (0 would mean its own default).
_GOOGLE_CLIENT_ATTEMPTS = CLIENT_RETRIES + 1


GOOGLE_VOCABULARY = Vocabulary(
    blocked_finish_reasons=frozenset({"safety", "prohibited_content", "blocklist", "spii"}),
    # Gemini reports a prompt it will not answer at all in the reply's prompt feedback.
    prompt_feedback_key="prompt_feedback",
    throttling_names=frozenset({"ResourceExhausted", "TooManyRequests"}),
)
"""How the Gemini API refuses and throttles."""


class GoogleProvider(KeyedProvider):
    """Gemini models via ``langchain-google-genai``'s ``ChatGoogleGenerativeAI``, imported only when a model
    is built.

    The key comes from ``api_key``, ``GOOGLE_API_KEY`` or ``GEMINI_API_KEY``, the endpoint from ``base_url``,
    ``GOOGLE_BASE_URL`` or the Gemini API's own; all are read from ``environ`` (the process environment by
    default) when a model is built. Any model name is accepted; the parameters are checked.
    """

    #: Images and PDFs, sent as inline data.
    file_types = KNOWN_TYPES

    name = "google"
    accepted_params = GOOGLE_PARAMS
    key_variables = ("GOOGLE_API_KEY", "GEMINI_API_KEY")
    vocabulary = GOOGLE_VOCABULARY

    def check_values(self, label: str, params: Mapping[str, Any]) -> None:
        """One of ``max_tokens`` and ``max_output_tokens``, and a ``thinking_budget`` Gemini understands."""
        if "max_tokens" in params and "max_output_tokens" in params:
            raise PicoFlowError(f"Model '{label}' sets both max_tokens and max_output_tokens; keep one.")
        budget = params.get("thinking_budget")
        if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool) or budget < -1):
            raise PicoFlowError(
                f"Model '{label}' thinking_budget must be an integer: -1 (dynamic), 0 (off) or a token count, "
                f"got {budget!r}."
            )

    def chat_model(self, selection: ModelSelection) -> BaseChatModel:
        """A ``ChatGoogleGenerativeAI`` with a request timeout and a single attempt per call (the runner makes
        the attempts)."""
        api_key = self.required_key()
        module = import_extra("langchain_google_genai", provider=self.name, extra="google")
        options: dict[str, Any] = {"timeout": DEFAULT_TIMEOUT_SECONDS, **selection.params}
        if "max_tokens" in options:
            options["max_output_tokens"] = options.pop("max_tokens")
        base_url = self._base_url or env_value(self.environ, "GOOGLE_BASE_URL")
        if base_url:
            options["base_url"] = base_url
        model: BaseChatModel = module.ChatGoogleGenerativeAI(
            model=selection.name, google_api_key=api_key, max_retries=_GOOGLE_CLIENT_ATTEMPTS, **options
        )
        return model

"""The OpenAI-compatible providers: OpenAI itself, Azure OpenAI and the servers that speak OpenAI's Chat Completions.

One ``OpenAIProvider`` class serves the whole family; ``OPENAI_COMPATIBLE`` says how each member is reached
(its key variable, its default endpoint and the variable that overrides it).
"""

from __future__ import annotations

import email.utils
import functools
import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal
from urllib.parse import urlsplit

from langchain_core.language_models import BaseChatModel

from picoflow.deadline import current_scope
from picoflow.errors import ModelNotConfiguredError, PicoFlowError
from picoflow.files.refs import IMAGE_TYPES, KNOWN_TYPES
from picoflow.logger import library_log
from picoflow.models.common import (
    CLIENT_RETRIES,
    DEFAULT_TIMEOUT_SECONDS,
    check_accepted,
    check_common_values,
    check_reserved,
    env_value,
    key_setting,
    key_token,
    usage_normalising,
)
from picoflow.models.registry import ModelProvider, ModelSelection
from picoflow.models.vocabulary import Vocabulary

#: How LangChain asks an OpenAI-style server for structured output.
StructuredOutputMethod = Literal["function_calling", "json_schema", "json_mode"]

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
    "gpt-5.6-luna": _REASONING_PARAMS,
    "o3": _REASONING_PARAMS,
    "o3-mini": _REASONING_PARAMS,
    "o4-mini": _REASONING_PARAMS,
}
"""Model names the ``openai`` provider knows (a dated snapshot such as ``gpt-4o-2024-08-06`` too), with the
parameters each takes. A name it does not list is still served, with a warning (see ``_catalog_params``)."""

REASONING_EFFORTS = frozenset({"none", "minimal", "low", "medium", "high"})

_REASONING_NAME = re.compile(r"^(gpt-5|o\d)", re.IGNORECASE)
_SNAPSHOT_SUFFIX = re.compile(r"-\d{4}-\d{2}-\d{2}$")


@dataclass(frozen=True)
class CompatibleEndpoint:
    """How one provider of the OpenAI-compatible family is reached.

    ``kind`` picks the LangChain class: ``openai`` is ``ChatOpenAI`` as is, ``azure`` is ``AzureChatOpenAI``
    (the selection's name is the deployment), ``compatible`` is ``ChatOpenAI`` held to Chat Completions,
    with structured output through ``structured_output`` and cache hits read from where the server reports them.
    """

    name: str
    key_env: str
    base_url_env: str
    default_base_url: str | None
    kind: Literal["openai", "azure", "compatible"] = "compatible"
    key_required: bool = True
    structured_output: StructuredOutputMethod = "function_calling"
    api_version_env: str | None = None
    bare_host_path: str = ""
    """Appended to an endpoint given as a bare host (``http://host:11434`` for Ollama means ``.../v1``)."""


OPENAI_COMPATIBLE: dict[str, CompatibleEndpoint] = {
    endpoint.name: endpoint
    for endpoint in (
        CompatibleEndpoint(
            "openai", "OPENAI_API_KEY", "OPENAI_BASE_URL", "https://api.openai.com/v1",
            kind="openai", structured_output="json_schema",
        ),
        CompatibleEndpoint(
            "azure-openai", "AZURE_OPENAI_API_KEY", "AZURE_OPENAI_ENDPOINT", None,
            kind="azure", structured_output="json_schema", api_version_env="OPENAI_API_VERSION",
        ),
        CompatibleEndpoint("deepseek", "DEEPSEEK_API_KEY", "DEEPSEEK_BASE_URL", "https://api.deepseek.com"),
        CompatibleEndpoint("moonshot", "MOONSHOT_API_KEY", "MOONSHOT_BASE_URL", "https://api.moonshot.ai/v1"),
        CompatibleEndpoint("zai", "ZAI_API_KEY", "ZAI_BASE_URL", "https://api.z.ai/api/paas/v4"),
        CompatibleEndpoint("openrouter", "OPENROUTER_API_KEY", "OPENROUTER_BASE_URL", "https://openrouter.ai/api/v1"),
        CompatibleEndpoint(
            "ollama", "OLLAMA_API_KEY", "OLLAMA_BASE_URL", "http://localhost:11434/v1",
            key_required=False, bare_host_path="/v1",
        ),
    )
}
"""The built-in members of the family, by provider name."""


OPENAI_VOCABULARY = Vocabulary(
    blocked_finish_reasons=frozenset({"content_filter"}),
    # A prompt the content filters refuse is an error with one of these codes (Azure's and OpenAI's).
    blocked_error_codes=frozenset({"content_filter", "content_policy_violation"}),
    refusal_key="refusal",
    throttling_names=frozenset({"RateLimitError"}),
)
"""How OpenAI and the OpenAI-compatible family refuse and throttle."""


class OpenAIProvider(ModelProvider):
    """Chat models from OpenAI or from any provider of the OpenAI-compatible family.

    ``name`` picks the member of ``OPENAI_COMPATIBLE`` (``openai`` by default); any other name is an
    application-owned OpenAI-compatible endpoint configured like ``openai`` (``OPENAI_API_KEY``,
    ``OPENAI_BASE_URL``), or by ``endpoint``. The key comes from ``api_key`` or the member's key variable,
    the endpoint from ``base_url``, the member's endpoint variable or its default; both are read from
    ``environ`` (the process environment by default) when a model is built.

    Under the built-in name ``openai`` the parameters of the models in ``OPENAI_MODELS`` are checked against
    the catalog, and a name it does not list is served with a warning; every other member accepts any model
    name and only the parameters' values are checked.
    """

    vocabulary = OPENAI_VOCABULARY

    def __init__(
        self,
        api_key: str | None = None,
        base_url: str | None = None,
        name: str = "openai",
        *,
        api_version: str | None = None,
        environ: Mapping[str, str] | None = None,
        endpoint: CompatibleEndpoint | None = None,
    ) -> None:
        self.endpoint = endpoint or OPENAI_COMPATIBLE.get(name) or replace(OPENAI_COMPATIBLE["openai"], name=name)
        self.name = self.endpoint.name
        # OpenAI's own API (and Azure's) reads PDFs as file parts; the wider family is promised images only.
        self.file_types = KNOWN_TYPES if self.endpoint.kind != "compatible" else IMAGE_TYPES
        self._api_key = api_key
        self._base_url = base_url
        self._api_version = api_version
        self._environ = environ

    def validate(self, selection: ModelSelection) -> None:
        """Reject an unknown or reserved parameter, or a bad parameter value; warn once of an unlisted model."""
        label = f"{selection.provider}:{selection.name}"
        params = selection.params
        check_reserved(label, params)
        accepted = _catalog_params(label, selection.name) if self.name == "openai" else None
        _check_values(label, selection.name, params)
        if accepted is not None:
            check_accepted(label, params, accepted)

    def missing_setting(self) -> str | None:
        """The key variable (or its ``_PARAMETER``) when no key is set, or Azure's endpoint or API version."""
        endpoint = self.endpoint
        env = os.environ if self._environ is None else self._environ
        if endpoint.key_required and not (self._api_key or env_value(env, endpoint.key_env)):
            return key_setting(env, endpoint.key_env)
        if endpoint.kind != "azure":
            return None
        if not (self._base_url or env_value(env, endpoint.base_url_env)):
            return endpoint.base_url_env
        if not (self._api_version or env_value(env, endpoint.api_version_env)):
            return endpoint.api_version_env
        return None

    def credentials_token(self) -> str:
        env = os.environ if self._environ is None else self._environ
        return key_token(self._api_key or env_value(env, self.endpoint.key_env))

    def chat_model(self, selection: ModelSelection) -> BaseChatModel:
        """A chat model for ``selection`` with a request timeout; its client retries transport failures."""
        endpoint = self.endpoint
        env = os.environ if self._environ is None else self._environ
        api_key = self._api_key or env_value(env, endpoint.key_env)
        if not api_key and endpoint.key_required:
            raise ModelNotConfiguredError(
                f"Model provider '{self.name}' has no API key: pass api_key to OpenAIProvider "
                f"or set {endpoint.key_env}.",
                provider=self.name,
                setting=key_setting(env, endpoint.key_env),
            )
        base_url = self._base_url or env_value(env, endpoint.base_url_env)
        # A streamed reply asks for its usage (stream_options.include_usage), so streamed turns are counted too;
        # LangChain would assume so only for OpenAI's own endpoint without a client of ours. The call's own
        # timeout bounds a whole stream (a stall included), so LangChain's per-chunk timer, a task and a timer
        # per chunk, is left off; the client's read timeout still catches a dead connection.
        options: dict[str, Any] = {
            "timeout": DEFAULT_TIMEOUT_SECONDS, "stream_usage": True, "stream_chunk_timeout": None, **selection.params
        }
        # Imported here: the OpenAI client stack is slow to import and a Lambda cold start may not need it.
        if endpoint.kind == "azure":
            return self._azure_model(selection, api_key, base_url, env, options)
        if endpoint.kind == "openai":
            from langchain_openai import ChatOpenAI

            if base_url:
                options["base_url"] = base_url
            return _built(ChatOpenAI, model=selection.name, api_key=api_key, max_retries=CLIENT_RETRIES, **options)
        base_url = _with_bare_host_path(base_url or endpoint.default_base_url or "", endpoint.bare_host_path)
        return _built(
            _compatible_chat_class(),
            model=selection.name,
            # The OpenAI client insists on a key; a server that needs none (Ollama) ignores this one.
            api_key=api_key or "unused",
            base_url=base_url,
            max_retries=CLIENT_RETRIES,
            use_responses_api=False,
            structured_output_method=endpoint.structured_output,
            **options,
        )

    def _azure_model(
        self,
        selection: ModelSelection,
        api_key: str | None,
        azure_endpoint: str | None,
        env: Mapping[str, str],
        options: dict[str, Any],
    ) -> BaseChatModel:
        endpoint = self.endpoint
        if not azure_endpoint:
            raise ModelNotConfiguredError(
                f"Model provider '{self.name}' has no endpoint: pass base_url to OpenAIProvider or set "
                f"{endpoint.base_url_env} (https://<resource>.openai.azure.com/).",
                provider=self.name,
                setting=endpoint.base_url_env,
            )
        api_version = self._api_version or env_value(env, endpoint.api_version_env)
        if not api_version:
            raise ModelNotConfiguredError(
                f"Model provider '{self.name}' has no API version: pass api_version to OpenAIProvider or set "
                f"{endpoint.api_version_env} (e.g. 2024-10-21).",
                provider=self.name,
                setting=str(endpoint.api_version_env),
            )
        from langchain_openai import AzureChatOpenAI

        return _built(
            AzureChatOpenAI,
            model=selection.name,
            azure_deployment=selection.name,
            azure_endpoint=azure_endpoint,
            api_key=api_key,
            api_version=api_version,
            max_retries=CLIENT_RETRIES,
            **options,
        )


def _built(chat_class: Callable[..., BaseChatModel], **options: Any) -> BaseChatModel:
    """``chat_class(**options)`` whose asynchronous HTTP client gives up on a retry the turn has no time for.

    The OpenAI client retries connection errors, timeouts, 408, 409, 429 and 5xx itself, waiting as
    ``Retry-After`` says. When that wait would end after the running call's deadline, the response is marked
    ``x-should-retry: false`` (the SDK's own signal) so the failure surfaces at once, as a throttled model,
    instead of the wait running into the deadline.
    """
    from openai import DefaultAsyncHttpxClient

    return chat_class(**options, http_async_client=DefaultAsyncHttpxClient(event_hooks={"response": [_no_late_retry]}))


_RETRIED_STATUSES = frozenset({408, 409, 429})


async def _no_late_retry(response: Any) -> None:
    deadline = current_scope().call_deadline
    status = response.status_code
    if deadline is None or (status not in _RETRIED_STATUSES and status < 500):
        return
    wait = retry_after_seconds(response.headers)
    if wait is not None and time.monotonic() + wait >= deadline:
        response.headers["x-should-retry"] = "false"


def retry_after_seconds(headers: Mapping[str, str]) -> float | None:
    """The wait a response asks for in ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date)."""
    for name, divisor in (("retry-after-ms", 1000), ("retry-after", 1)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            return float(value) / divisor
        except ValueError:
            pass
    stamp = headers.get("retry-after")
    parsed = email.utils.parsedate_tz(stamp) if stamp else None
    return None if parsed is None else email.utils.mktime_tz(parsed) - time.time()


@functools.cache
def _compatible_chat_class() -> type[BaseChatModel]:
    from langchain_openai import ChatOpenAI

    class CompatibleChatOpenAI(ChatOpenAI):
        """``ChatOpenAI`` for a server that speaks Chat Completions but not always OpenAI's structured outputs."""

        structured_output_method: StructuredOutputMethod = "function_calling"

        def with_structured_output(
            self, schema: Any = None, *, method: StructuredOutputMethod | None = None, **kwargs: Any
        ) -> Any:
            return super().with_structured_output(schema, method=method or self.structured_output_method, **kwargs)

    return usage_normalising(CompatibleChatOpenAI)


def _with_bare_host_path(url: str, path: str) -> str:
    if path and urlsplit(url).path in ("", "/"):
        return url.rstrip("/") + path
    return url


_warned_unlisted: set[str] = set()
_warned_lock = threading.Lock()


def _catalog_params(label: str, model_name: str) -> frozenset[str]:
    """The parameters a model accepts: its catalog entry, or for a name the catalog does not list (providers
    ship new models every month), those of the family its name suggests, with one warning per name."""
    accepted = OPENAI_MODELS.get(_SNAPSHOT_SUFFIX.sub("", model_name))
    if accepted is not None:
        return accepted
    with _warned_lock:
        first = label not in _warned_unlisted
        _warned_unlisted.add(label)
    if first:
        library_log.warning(
            "Model %s is not in OPENAI_MODELS: it is passed to the provider as named, with its pricing and "
            "capabilities unknown and its parameters checked as for the family its name suggests.",
            label,
            extra={"model": label},
        )
    if _REASONING_NAME.match(model_name):
        return _REASONING_PARAMS
    return _CHAT_PARAMS if model_name.lower().startswith("gpt") else _CHAT_PARAMS | _REASONING_PARAMS


def _check_values(label: str, model_name: str, params: dict[str, Any]) -> None:
    if "temperature" in params and _REASONING_NAME.match(model_name):
        raise PicoFlowError(f"Model '{label}' does not support temperature.")
    check_common_values(label, params)
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

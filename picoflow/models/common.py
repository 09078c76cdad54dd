"""What the built-in providers share: parameter checks, optional packages, timeouts and usage normalisation."""

from __future__ import annotations

import functools
import hashlib
import importlib
import os
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from types import ModuleType
from typing import Any

from picoflow.errors import ModelNotConfiguredError, PicoFlowError
from picoflow.models.registry import ModelProvider, ModelSelection

DEFAULT_TIMEOUT_SECONDS = 60.0
"""The per-request timeout of every built-in provider's client, unless a selection sets ``timeout``."""

CLIENT_RETRIES = 2
"""Retries a provider's SDK client makes on its own after a transport failure (a lost connection, a timeout,
408, 429 or 5xx), waiting as ``Retry-After`` says; PicoFlow's own attempts (``retry_attempts``) are for what only
it can judge (see ``picoflow.authoring.recovery.is_transient_error``)."""

# Connection and retry settings belong to the provider and the runner, never to a selection's params.
RESERVED_PARAMS: dict[str, str] = {
    "model": "the model is the selection's name",
    "model_name": "the model is the selection's name",
    "model_id": "the model is the selection's name",
    "azure_deployment": "the deployment is the selection's name",
    "deployment_name": "the deployment is the selection's name",
    "api_key": "credentials belong to the provider",
    "openai_api_key": "credentials belong to the provider",
    "anthropic_api_key": "credentials belong to the provider",
    "google_api_key": "credentials belong to the provider",
    "credentials": "credentials belong to the provider",
    "aws_access_key_id": "credentials belong to the provider",
    "aws_secret_access_key": "credentials belong to the provider",
    "aws_session_token": "credentials belong to the provider",
    "credentials_profile_name": "credentials belong to the provider",
    "base_url": "the endpoint belongs to the provider",
    "openai_api_base": "the endpoint belongs to the provider",
    "anthropic_api_url": "the endpoint belongs to the provider",
    "azure_endpoint": "the endpoint belongs to the provider",
    "endpoint_url": "the endpoint belongs to the provider",
    "client_options": "the endpoint belongs to the provider",
    "region_name": "the Region belongs to the provider (AWS_REGION)",
    "client": "the client belongs to the provider",
    "config": "the client belongs to the provider",
    "max_retries": "transport retries belong to the provider's client; set retry_attempts for PicoFlow's own",
    "retries": "transport retries belong to the provider's client; set retry_attempts for PicoFlow's own",
}


def checked_params(selection: ModelSelection, accepted: Iterable[str]) -> tuple[str, Mapping[str, Any]]:
    """The selection's label and params, once no reserved and no unaccepted parameter is among them."""
    label = f"{selection.provider}:{selection.name}"
    check_reserved(label, selection.params)
    check_accepted(label, selection.params, accepted)
    return label, selection.params


def check_reserved(label: str, params: Mapping[str, Any]) -> None:
    """Reject a parameter that only the provider or the runner may set."""
    for key, reason in RESERVED_PARAMS.items():
        if key in params:
            raise PicoFlowError(f"Model '{label}' params must not set '{key}': {reason}.")


def check_accepted(label: str, params: Mapping[str, Any], accepted: Iterable[str]) -> None:
    """Reject a parameter outside ``accepted``, naming the ones that are."""
    accepted = frozenset(accepted)
    if unknown := sorted(set(params) - accepted):
        raise PicoFlowError(
            f"Model '{label}' does not accept parameter(s) {', '.join(unknown)}; "
            f"accepted: {', '.join(sorted(accepted))}."
        )


def check_common_values(label: str, params: Mapping[str, Any], *, max_temperature: float = 2.0) -> None:
    """Check the values of the parameters most providers share: sampling, output length and timeout."""
    if "temperature" in params:
        temperature = params["temperature"]
        if not is_number(temperature) or not 0 <= temperature <= max_temperature:
            raise PicoFlowError(
                f"Model '{label}' temperature must be a number from 0 to {max_temperature:g}, got {temperature!r}."
            )
    if "top_p" in params and (not is_number(params["top_p"]) or not 0 <= params["top_p"] <= 1):
        raise PicoFlowError(f"Model '{label}' top_p must be a number from 0 to 1, got {params['top_p']!r}.")
    for key in ("max_tokens", "max_completion_tokens", "max_output_tokens", "top_k"):
        value = params.get(key)
        if value is not None and not is_positive_int(value):
            raise PicoFlowError(f"Model '{label}' {key} must be a positive integer, got {value!r}.")
    timeout = params.get("timeout")
    if timeout is not None and (not is_number(timeout) or timeout <= 0):
        raise PicoFlowError(f"Model '{label}' timeout must be a positive number of seconds, got {timeout!r}.")
    stop = params.get("stop")
    if stop is not None and not isinstance(stop, str) and (
        not isinstance(stop, list) or not all(isinstance(s, str) for s in stop)
    ):
        raise PicoFlowError(f"Model '{label}' stop must be a string or a list of strings, got {stop!r}.")


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def is_positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def env_value(environ: Mapping[str, str], *names: str | None) -> str | None:
    """The first of ``names`` set to a non-blank value in ``environ`` (a ``None`` name is skipped)."""
    for name in names:
        value = (environ.get(name) or "").strip() if name else ""
        if value:
            return value
    return None


def key_token(key: str | None) -> str:
    """What ``ModelProvider.credentials_token`` reports for ``key``: a short digest, "" for no key."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:16] if key else ""


def key_setting(environ: Mapping[str, str], key_variable: str) -> str:
    """The setting to name for a missing key: ``<key_variable>_PARAMETER`` when that parameter is set (so its
    value could not be read), else ``key_variable`` itself."""
    parameter = f"{key_variable}_PARAMETER"
    return parameter if env_value(environ, parameter) else key_variable


def import_extra(module: str, *, provider: str, extra: str) -> ModuleType:
    """Import ``module`` from an optional dependency, or explain which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        package = module.replace("_", "-")
        raise ModelNotConfiguredError(
            f"Model provider '{provider}' needs the {package} package: pip install 'picoflow[{extra}]'.",
            provider=provider,
            setting=f"the {package} package",
        ) from exc


# -- the opening the built-in providers share ------------------------------------------------------


class BuiltInProvider(ModelProvider):
    """A provider whose settings are read from an environment when a model is built, and whose selections are
    checked against the parameters it accepts (``accepted_params``) and the values every provider checks."""

    #: The parameters a selection may set.
    accepted_params: frozenset[str] = frozenset()
    #: The highest ``temperature`` the provider's API takes.
    max_temperature: float = 2.0

    def __init__(self, *, name: str | None = None, environ: Mapping[str, str] | None = None) -> None:
        if name is not None:
            self.name = name
        self._environ = environ

    @property
    def environ(self) -> Mapping[str, str]:
        """Where settings are read: the ``environ`` given, else the process environment."""
        return os.environ if self._environ is None else self._environ

    def validate(self, selection: ModelSelection) -> None:
        """Reject a reserved or unknown parameter, or a bad parameter value."""
        label, params = checked_params(selection, self.accepted_params)
        self.check_values(label, params)
        check_common_values(label, params, max_temperature=self.max_temperature)

    def check_values(self, label: str, params: Mapping[str, Any]) -> None:  # noqa: B027 - an optional hook
        """Check the values of the parameters only this provider takes; nothing by default."""


class KeyedProvider(BuiltInProvider):
    """A built-in provider reached with an API key (``api_key`` or the first of ``key_variables`` set) and an
    endpoint (``base_url``, else the provider's own variable or default)."""

    #: The variables that may hold the key, the one to name when none is set first.
    key_variables: tuple[str, ...] = ()

    def __init__(
        self,
        api_key: str | None = None,
        base_url: str | None = None,
        *,
        name: str | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(name=name, environ=environ)
        self._api_key = api_key
        self._base_url = base_url

    def api_key(self) -> str | None:
        """The key a model built now would carry, if any."""
        return self._api_key or env_value(self.environ, *self.key_variables)

    def missing_setting(self) -> str | None:
        """The key variable (or its ``_PARAMETER``) when no key is set."""
        return None if self.api_key() else key_setting(self.environ, self.key_variables[0])

    def credentials_token(self) -> str:
        return key_token(self.api_key())

    def required_key(self) -> str:
        """The key, or ``ModelNotConfiguredError`` naming the variable to set."""
        key = self.api_key()
        if not key:
            variables = " (or ".join(self.key_variables) + ")" * (len(self.key_variables) - 1)
            raise ModelNotConfiguredError(
                f"Model provider '{self.name}' has no API key: pass api_key to {type(self).__name__} "
                f"or set {variables}.",
                provider=self.name,
                setting=key_setting(self.environ, self.key_variables[0]),
            )
        return key


# -- usage normalisation ---------------------------------------------------------------------------


def normalise_usage(message: Any, raw_usage: Mapping[str, Any] | None = None) -> None:
    """Complete a reply's ``usage_metadata`` in place where its LangChain integration leaves counts out.

    - Cache writes split by lifetime (``ephemeral_5m_input_tokens`` / ``ephemeral_1h_input_tokens``,
      reported by Anthropic and by Bedrock) leave ``cache_creation`` at 0: it becomes their sum.
    - Cache hits that an OpenAI-compatible server reports outside ``prompt_tokens_details``
      (DeepSeek's ``prompt_cache_hit_tokens``, Moonshot's top-level ``cached_tokens``) become ``cache_read``.
    """
    usage = getattr(message, "usage_metadata", None)
    if not usage:
        return
    details = dict(usage.get("input_token_details") or {})
    changed = False
    split_writes = sum(
        value
        for key, value in details.items()
        if key.startswith("ephemeral_") and key.endswith("_input_tokens") and is_positive_int(value)
    )
    if split_writes and not details.get("cache_creation"):
        details["cache_creation"] = split_writes
        changed = True
    if raw_usage and not details.get("cache_read"):
        hits = raw_usage.get("prompt_cache_hit_tokens", raw_usage.get("cached_tokens"))
        if is_positive_int(hits):
            details["cache_read"] = hits
            changed = True
    if changed:
        message.usage_metadata = {**usage, "input_token_details": details}


def _normalise_result(result: Any) -> Any:
    llm_output = getattr(result, "llm_output", None) or {}
    raw = llm_output.get("token_usage") if isinstance(llm_output, Mapping) else None
    for generation in result.generations:
        normalise_usage(generation.message, raw if isinstance(raw, Mapping) else None)
    return result


@functools.cache
def usage_normalising(chat_class: type) -> type:
    """A subclass of the LangChain chat model class ``chat_class`` whose replies pass through ``normalise_usage``."""

    class UsageNormalising(chat_class):  # type: ignore[misc]
        # The explicit signatures matter: LangChain passes run_manager only to a method that declares it.
        def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> Any:
            return _normalise_result(super()._generate(messages, stop=stop, run_manager=run_manager, **kwargs))

        async def _agenerate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> Any:
            result = await super()._agenerate(messages, stop=stop, run_manager=run_manager, **kwargs)
            return _normalise_result(result)

        def _stream(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> Iterator[Any]:
            for chunk in super()._stream(messages, stop=stop, run_manager=run_manager, **kwargs):
                normalise_usage(chunk.message)
                yield chunk

        async def _astream(
            self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any
        ) -> AsyncIterator[Any]:
            async for chunk in super()._astream(messages, stop=stop, run_manager=run_manager, **kwargs):
                normalise_usage(chunk.message)
                yield chunk

    UsageNormalising.__name__ = UsageNormalising.__qualname__ = chat_class.__name__
    return UsageNormalising

"""Which model a flow or step talks to (``ModelSelection``), the providers that build it, and the registry that
resolves a selection to a LangChain chat model."""

from __future__ import annotations

import json
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any, Literal

from langchain_core.language_models import BaseChatModel
from pydantic import BaseModel, ConfigDict, Field

from picoflow.errors import ModelNotConfiguredError, PicoFlowError
from picoflow.models.vocabulary import Vocabulary
from picoflow.session.document import ModelSelectionDoc

ProviderFamily = Literal["openai", "gemini", "anthropic", "unsupported"]

_FAMILY_PREFIXES: tuple[tuple[tuple[str, ...], ProviderFamily], ...] = (
    (("gpt", "o1", "o3", "o4"), "openai"),
    (("gemini", "gemma"), "gemini"),
    (("claude",), "anthropic"),
)


def provider_family(model_name: str) -> ProviderFamily:
    """The API family a model name belongs to, judged by its prefix."""
    name = model_name.strip().lower()
    for prefixes, family in _FAMILY_PREFIXES:
        if name.startswith(prefixes):
            return family
    return "unsupported"


# Normalised (lower case, no "_" or "-") key endings that mark a credential.
SENSITIVE_KEY_ENDINGS = (
    "apikey",
    "authorization",
    "credential",
    "credentials",
    "password",
    "secret",
    "secretkey",
    "token",
)
DEFAULT_RETRY_ATTEMPTS = 3


class ModelSelection(BaseModel):
    """A provider name, a model name, call parameters and the total attempt budget per model call.

    ``retry_attempts`` counts every attempt, the first included. A flow's selection defaults to three; a step's
    ``use_model(...)`` selection that leaves it out inherits the flow's budget instead.
    """

    model_config = ConfigDict(frozen=True)

    provider: str = Field(min_length=1)
    name: str = Field(min_length=1)
    params: dict[str, Any] = Field(default_factory=dict)
    retry_attempts: int = Field(default=DEFAULT_RETRY_ATTEMPTS, ge=1)

    @property
    def sets_retry_attempts(self) -> bool:
        """Whether ``retry_attempts`` was given explicitly rather than left at its default."""
        return "retry_attempts" in self.model_fields_set

    def inherit(self, base: ModelSelection) -> ModelSelection:
        """This selection as a step override of ``base``: an unset attempt budget comes from ``base``, and
        the parameters merge over ``base``'s when both name the same provider and model."""
        update: dict[str, Any] = {}
        if not self.sets_retry_attempts:
            update["retry_attempts"] = base.retry_attempts
        if self.provider == base.provider and self.name == base.name:
            update["params"] = {**base.params, **self.params}
        return self.model_copy(update=update) if update else self

    def to_doc(self) -> ModelSelectionDoc:
        """The persisted form, with secrets stripped from the parameters."""
        return ModelSelectionDoc(
            provider=self.provider,
            name=self.name,
            params=strip_sensitive(self.params),
            retry_attempts=self.retry_attempts,
        )

    @classmethod
    def from_doc(cls, doc: ModelSelectionDoc) -> ModelSelection:
        """Rebuild a stored selection; a stored document without an attempt budget leaves it unset."""
        if not doc.provider.strip():
            raise ValueError("A stored model selection has a blank provider.")
        fields: dict[str, Any] = {"provider": doc.provider, "name": doc.name, "params": dict(doc.params)}
        if doc.retry_attempts:
            fields["retry_attempts"] = doc.retry_attempts
        return cls(**fields)


def strip_sensitive(value: Any) -> Any:
    """Drop keys that look like credentials, recursively."""
    if isinstance(value, dict):
        return {
            k: strip_sensitive(v)
            for k, v in value.items()
            if not _is_sensitive(k)
        }
    if isinstance(value, list):
        return [strip_sensitive(v) for v in value]
    return value


def _is_sensitive(key: str) -> bool:
    normalised = key.lower().replace("_", "").replace("-", "")
    return normalised.endswith(SENSITIVE_KEY_ENDINGS)


class ModelProvider(ABC):
    """Connection setup for one provider: builds chat models for the selections that name it.

    A provider owns credentials and endpoints only; hyperparameters come from the selection.
    """

    name: str
    #: The file types (MIME) its chat models read as content parts; a file of another type is refused.
    file_types: frozenset[str] = frozenset()
    #: Its words for refusals, throttling and configuration faults; by default only what HTTP says.
    vocabulary: Vocabulary = Vocabulary()

    @abstractmethod
    def chat_model(self, selection: ModelSelection) -> BaseChatModel:
        """A chat model for ``selection``, configured with its ``params``."""

    def validate(self, selection: ModelSelection) -> None:  # noqa: B027 - an optional hook, not abstract
        """Raise ``PicoFlowError`` when this provider cannot serve ``selection``; accepts everything by default."""

    def missing_setting(self) -> str | None:
        """The name (never the value) of a setting this provider needs to build a model and lacks, such as its key
        variable; None when nothing is missing. ``chat_model`` raises ``ModelNotConfiguredError`` naming it."""
        return None

    def credentials_token(self) -> str:
        """A digest of the credentials a model built now would carry ("" when there are none to tell).

        The registry rebuilds a cached model when it changes, so a rotated key reaches new calls."""
        return ""


class ProviderRegistry:
    """The providers an engine can use, keyed by name, with one cached chat model per distinct selection.

    When ``override`` is set it serves every selection, whatever provider the selection names; a
    selection whose provider is also registered is still validated by that provider, so catalog
    mistakes surface offline too.
    """

    def __init__(
        self,
        providers: Iterable[ModelProvider] = (),
        *,
        override: ModelProvider | None = None,
    ) -> None:
        self._providers: dict[str, ModelProvider] = {}
        self._models: dict[tuple[int, str], tuple[ModelProvider, str, BaseChatModel]] = {}
        self._lock = threading.Lock()
        self.override = override
        for provider in providers:
            self.register(provider)

    def register(self, provider: ModelProvider, replace: bool = False) -> None:
        """Add ``provider`` under its name; an existing name is an error unless ``replace`` is true."""
        name = getattr(provider, "name", "")
        if not isinstance(name, str) or not name.strip():
            raise PicoFlowError("A model provider needs a non-empty name.")
        if name in self._providers and not replace:
            raise PicoFlowError(f"Model provider '{name}' is already registered.")
        self._providers[name] = provider

    def get(self, name: str) -> ModelProvider:
        """The provider registered as ``name``."""
        provider = self._providers.get(name)
        if provider is None:
            raise PicoFlowError(f"Model provider '{name}' is not registered.")
        return provider

    def names(self) -> list[str]:
        """Registered provider names, in registration order."""
        return list(self._providers)

    def validate(self, selection: ModelSelection) -> None:  # noqa: B027 - an optional hook, not abstract
        """Raise ``PicoFlowError`` when ``selection`` cannot be served (unknown provider, model or parameter)."""
        registered = self._providers.get(selection.provider)
        if self.override is None:
            if registered is None:
                raise ModelNotConfiguredError(
                    f"Model '{selection.provider}:{selection.name}' cannot be used: "
                    f"model provider '{selection.provider}' is not registered.",
                    provider=selection.provider,
                    setting="the registered model providers",
                )
            registered.validate(selection)
            return
        if registered is not None:
            registered.validate(selection)
        self.override.validate(selection)

    def file_types(self, selection: ModelSelection) -> frozenset[str]:
        """The file types the provider serving ``selection`` reads."""
        provider = self.override or self._providers.get(selection.provider)
        return provider.file_types if provider is not None else frozenset()

    def vocabulary(self, selection: ModelSelection) -> Vocabulary:
        """The vocabulary of the provider serving ``selection``, to read its answers and errors in."""
        provider = self.override or self._providers.get(selection.provider)
        return provider.vocabulary if provider is not None else Vocabulary()

    def chat_model(self, selection: ModelSelection) -> BaseChatModel:
        """The chat model serving ``selection``, validated first and built once per distinct selection."""
        self.validate(selection)
        provider = self.override or self._providers[selection.provider]
        key = (id(provider), _selection_key(selection))
        token = provider.credentials_token()
        with self._lock:
            cached = self._models.get(key)
            # The provider is kept with the model so a recycled id() never returns another provider's model. A
            # model whose key was rotated is rebuilt; one whose key cannot be read right now keeps serving.
            if cached is not None and cached[0] is provider and token in (cached[1], ""):
                return cached[2]
            model = provider.chat_model(selection)
            self._models[key] = (provider, token, model)
            return model


def _selection_key(selection: ModelSelection) -> str:
    return json.dumps(selection.model_dump(mode="json"), sort_keys=True, default=str)

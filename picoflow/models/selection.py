"""Which model a flow or step talks to."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from picoflow.session.document import ModelSelectionDoc

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

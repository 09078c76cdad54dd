"""Which model a flow or step talks to."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from picoflow.session.document import ModelSelectionDoc

# Normalised (lower case, no "_" or "-") key endings that mark a credential.
SENSITIVE_KEY_ENDINGS = ("apikey", "authorization", "credentials", "password", "secret", "secretkey", "token")


class ModelSelection(BaseModel):
    """A provider name, a model name, call parameters and the total attempt budget per model call."""

    model_config = ConfigDict(frozen=True)

    provider: str = Field(min_length=1)
    name: str = Field(min_length=1)
    params: dict[str, Any] = Field(default_factory=dict)
    retry_attempts: int = Field(default=3, ge=1)

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
        if not doc.provider.strip():
            raise ValueError("A stored model selection has a blank provider.")
        return cls(
            provider=doc.provider,
            name=doc.name,
            params=dict(doc.params),
            retry_attempts=doc.retry_attempts or 3,
        )


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

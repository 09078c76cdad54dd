"""What a provider's refusal of a call says about the deployment: a key it rejects, access it denies, a model it
does not know. These are the operator's to fix, not the user's failure, and each has a code of its own:
``MODEL_AUTH_FAILED`` for rejected credentials (HTTP 401 or 403, or a provider's own codes for refused
credentials), and ``MODEL_NOT_CONFIGURED`` for an unknown model (404, or the provider's code for it). Both answer
503 and leave the session as it was.
"""

from __future__ import annotations

from picoflow.errors import ModelAuthFailedError, ModelNotConfiguredError
from picoflow.models.parameters import forget_parameters
from picoflow.models.vocabulary import Vocabulary, error_code

_AUTH_STATUSES = {401: "the API key", 403: "the API key's access"}
_CONFIGURATION_STATUSES = {404: "the model name"}


def configuration_error(
    error: BaseException | None, provider: str, text: str, vocabulary: Vocabulary
) -> ModelNotConfiguredError | None:
    """The error to answer when ``error`` (a failed call to ``provider``, read in its ``vocabulary``) says the
    deployment is misconfigured, else None. ``text`` is the error's message, for the logs and the session's
    ``error`` array.

    A rejected key also drops the kept SSM parameter values, so the next request reads a rotated key at once.
    """
    if error is None:
        return None
    status = getattr(error, "status_code", None)
    code = error_code(error)
    auth = _AUTH_STATUSES.get(status) if isinstance(status, int) else None
    auth = auth or (vocabulary.auth_codes.get(code) if code is not None else None)
    if auth is not None:
        forget_parameters()
        return ModelAuthFailedError(text, provider=provider, setting=auth)
    setting = _CONFIGURATION_STATUSES.get(status) if isinstance(status, int) else None
    setting = setting or (vocabulary.configuration_codes.get(code) if code is not None else None)
    return ModelNotConfiguredError(text, provider=provider, setting=setting) if setting is not None else None

"""Secrets kept in SSM Parameter Store (model keys, MCP tokens), read through Powertools Parameters.

Every read in the process goes through one ``SSMProvider`` (one SSM client, short timeouts, two attempts), which
keeps each value for ``PICOFLOW_PARAMETER_MAX_AGE`` seconds (300 by default): a rotated key is picked up within
that time, without replacing containers. A failed read is not kept: the next request reads again, so creating
or fixing a parameter heals a running container. Within one request a failure is remembered for
``FAILED_READ_HOLD_SECONDS``, so a stalled SSM costs a turn one read, not one per lookup.

``ParameterEnviron`` puts those values where the model providers look for their keys: an environment in which a
variable ``X`` unset but ``X_PARAMETER`` set (``OPENAI_API_KEY_PARAMETER=/picoflow/openai-api-key``) reads as the
value of that parameter.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

from picoflow.logger import library_log

#: The variable holding the seconds a parameter's value is kept before it is read again.
MAX_AGE_VARIABLE = "PICOFLOW_PARAMETER_MAX_AGE"
DEFAULT_MAX_AGE_SECONDS = 300
#: How long a failed read answers for itself before a lookup reads again (longer than one lookup, shorter
#: than the gap between two requests).
FAILED_READ_HOLD_SECONDS = 1.0
#: The suffix naming a variable's parameter: ``OPENAI_API_KEY_PARAMETER`` holds the name of ``OPENAI_API_KEY``'s.
PARAMETER_SUFFIX = "_PARAMETER"
# A read happens while a turn waits: bounded, so a stalled SSM cannot eat the turn's time.
_SSM_TIMEOUTS: dict[str, Any] = {
    "connect_timeout": 2,
    "read_timeout": 3,
    "retries": {"mode": "standard", "total_max_attempts": 2},
}

_provider: Any = None
_provider_lock = threading.Lock()


def max_age(environ: Mapping[str, str] | None = None) -> int:
    """Seconds a value is kept: ``PICOFLOW_PARAMETER_MAX_AGE`` when it is a whole number >= 0, else 300."""
    raw = ((os.environ if environ is None else environ).get(MAX_AGE_VARIABLE) or "").strip()
    return int(raw) if raw.isdigit() else DEFAULT_MAX_AGE_SECONDS


def _ssm() -> Any:
    """The process's one ``SSMProvider`` (its SSM client built on first use)."""
    global _provider
    with _provider_lock:
        if _provider is None:
            from aws_lambda_powertools.utilities.parameters import SSMProvider
            from botocore.config import Config

            _provider = SSMProvider(boto_config=Config(**_SSM_TIMEOUTS))
        return _provider


def secure_parameter(name: str, *, environ: Mapping[str, str] | None = None) -> str:
    """The decrypted value of the SSM parameter ``name``, kept for ``max_age(environ)`` seconds.

    Raises what SSM answered (botocore's ``ClientError``, whose code says why: ``ParameterNotFound``,
    ``AccessDeniedException`` ...) rather than Powertools' wrapper, which keeps only its text.
    """
    from aws_lambda_powertools.utilities.parameters.exceptions import GetParameterError

    try:
        value = _ssm().get(name, max_age=max_age(environ), decrypt=True)
    except GetParameterError as exc:
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, Exception):
            raise cause from None
        raise
    if not isinstance(value, str):  # without a transform the provider hands back the stored text
        raise TypeError(f"SSM parameter {name} did not read as text")
    return value


def reset_reader() -> None:
    """Drop the process's parameter reader, its client and kept values (for tests and tools that switch accounts
    or Regions within one process)."""
    global _provider
    with _provider_lock:
        _provider = None


def forget_parameters() -> None:
    """Drop every kept value, so the next lookup reads SSM again (after a provider rejected a key)."""
    with _provider_lock:
        provider = _provider
    if provider is not None:
        provider.clear_cache()


class ParameterEnviron(Mapping[str, str]):
    """``environ`` with each variable ``X`` that is unset but has ``X_PARAMETER`` set read from that SSM parameter.

    Values are read when looked up, never at construction, and kept as ``secure_parameter`` keeps them. A read
    that fails is logged (the parameter's name and the error's type, never a value) and the variable reads as
    unset, so the provider that needed it answers ``MODEL_NOT_CONFIGURED`` naming ``X_PARAMETER``. Iterating lists
    the variables of ``environ`` only.
    """

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._environ = dict(os.environ if environ is None else environ)
        self._failed: dict[str, float] = {}
        self._lock = threading.Lock()

    @property
    def plain(self) -> dict[str, str]:
        """The variables as given, without any parameter read."""
        return dict(self._environ)

    def __getitem__(self, key: str) -> str:
        if key in self._environ:
            return self._environ[key]
        parameter = (self._environ.get(key + PARAMETER_SUFFIX) or "").strip()
        if not parameter or key.endswith(PARAMETER_SUFFIX):
            raise KeyError(key)
        value = self._read(key, parameter)
        if value is None:
            raise KeyError(key)
        return value

    def _read(self, key: str, parameter: str) -> str | None:
        with self._lock:
            failed_at = self._failed.get(parameter)
        if failed_at is not None and time.monotonic() - failed_at < FAILED_READ_HOLD_SECONDS:
            return None
        try:
            value = secure_parameter(parameter, environ=self._environ)
        except Exception as exc:  # noqa: BLE001 - a missing key must not take down routes that need none
            with self._lock:
                self._failed[parameter] = time.monotonic()
            response = getattr(exc, "response", None)
            code = response.get("Error", {}).get("Code") if isinstance(response, dict) else None
            library_log.error(
                "Cannot read a key parameter",
                extra={"parameter": parameter, "variable": key, "errorType": type(exc).__name__, "errorCode": code},
            )
            return None
        with self._lock:
            self._failed.pop(parameter, None)
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self._environ)

    def __len__(self) -> int:
        return len(self._environ)

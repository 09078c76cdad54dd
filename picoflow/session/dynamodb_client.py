"""The DynamoDB client the session store builds: its timeouts, retries and User-Agent, and how long one request
under a client's configuration can take at most."""

from __future__ import annotations

from botocore.config import Config

CONNECT_TIMEOUT_SECONDS = 2
READ_TIMEOUT_SECONDS = 5
MAX_ATTEMPTS = 3

# Throttling and connection errors are retried by botocore (standard mode: jittered exponential backoff with a
# retry quota), then surface as a 503 SessionStoreError. ``total_max_attempts`` counts the first attempt too:
# 3 in all, whose backoff is at most 1 s + 2 s, which keeps a turn's read and write well inside the Lambda timeout.
# A ``config`` given to the store is merged over these defaults, so it may change any of them.
CLIENT_CONFIG = Config(
    connect_timeout=CONNECT_TIMEOUT_SECONDS,
    read_timeout=READ_TIMEOUT_SECONDS,
    retries={"mode": "standard", "total_max_attempts": MAX_ATTEMPTS},
)

# botocore's own defaults, for a client whose configuration leaves a value unset.
_BOTOCORE_TIMEOUT_SECONDS = 60
# Standard and legacy retries back off at most 2**i seconds before retry i+1, capped at 20 s.
_MAX_BACKOFF_SECONDS = 20


def longest_request_seconds(config: Config) -> float | None:
    """The longest one request can take under a client's ``config``: every attempt timing out on connecting and
    on reading, with the longest backoff between attempts; None when the configuration does not bound the attempts.
    """
    retries = getattr(config, "retries", None) or {}
    if "total_max_attempts" in retries:
        attempts = int(retries["total_max_attempts"])
    elif "max_attempts" in retries:
        attempts = int(retries["max_attempts"]) + 1
    else:
        return None  # the mode's default comes from the environment or a profile: not known here
    connect = getattr(config, "connect_timeout", None) or _BOTOCORE_TIMEOUT_SECONDS
    read = getattr(config, "read_timeout", None) or _BOTOCORE_TIMEOUT_SECONDS  # not in the stubs
    per_attempt = float(connect) + float(read)
    return attempts * per_attempt + sum(min(1 << retry, _MAX_BACKOFF_SECONDS) for retry in range(attempts - 1))


def user_agent_extra() -> str:
    """``picoflow/<version>``: what every client the store builds adds to its User-Agent."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"picoflow/{version('picoflow-aws').split('+')[0]}"
    except PackageNotFoundError:  # a source tree that was never installed
        return "picoflow/unknown"

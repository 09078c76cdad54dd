"""The resolver's CORS rules, mirroring the ``CorsConfiguration`` of ``template.yaml`` for local serving."""

from __future__ import annotations

import os
from collections.abc import Mapping

from aws_lambda_powertools.event_handler import CORSConfig

from picoflow.wire import IDEMPOTENCY_HEADER, REPLAYED_HEADER, RETRY_AFTER_HEADER, SESSION_HEADER

# What a browser on another origin may send and read; template.yaml lists the same, lower-cased.
CORS_REQUEST_HEADERS = ("content-type", "authorization", SESSION_HEADER.lower(), IDEMPOTENCY_HEADER.lower())
CORS_EXPOSED_HEADERS = (SESSION_HEADER.lower(), REPLAYED_HEADER.lower(), RETRY_AFTER_HEADER.lower())
CORS_DEFAULT_MAX_AGE_SECONDS = 600


def allowed_origins(environ: Mapping[str, str] | None = None) -> list[str]:
    """The origins ``CORS_ALLOW_ORIGIN`` names (comma-separated)."""
    env = os.environ if environ is None else environ
    return [origin.strip() for origin in (env.get("CORS_ALLOW_ORIGIN") or "").split(",") if origin.strip()]


def allowed_origin(origin: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """``origin`` when a browser page there may read this API's answers (``*`` allows any), else None."""
    origins = allowed_origins(environ)
    if "*" in origins:
        return "*"
    return origin if origin and origin in origins else None


def cors_config(environ: Mapping[str, str] | None = None) -> CORSConfig | None:
    """The CORS rules from ``CORS_ALLOW_ORIGIN`` (comma-separated origins); None when it names none."""
    env = os.environ if environ is None else environ
    origins = allowed_origins(env)
    if not origins:
        return None
    return CORSConfig(
        allow_origin=origins[0],
        extra_origins=origins[1:],
        allow_headers=list(CORS_REQUEST_HEADERS),
        expose_headers=list(CORS_EXPOSED_HEADERS),
        max_age=int(env.get("CORS_MAX_AGE_SECONDS") or CORS_DEFAULT_MAX_AGE_SECONDS),
        allow_credentials=False,
    )

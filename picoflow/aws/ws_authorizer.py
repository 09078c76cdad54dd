"""``$connect``'s authorizer: the HTTP API's JWT rules, applied to a WebSocket API's connections.

WebSocket APIs have no JWT authorizer of their own, and browsers cannot set an ``Authorization`` header on a
WebSocket. The one header a browser does let a page set is ``Sec-WebSocket-Protocol``, so the token travels as one
of the subprotocols the client offers, beside ``picoflow`` (``new WebSocket(url, ["picoflow", token])``), never in
the URL (which access logs and proxies record). The connection's ``$connect`` answers with the ``picoflow``
subprotocol (``picoflow.aws.websocket``), as browsers require. The token is checked here as the HTTP API's
authorizer checks it: signed by one of the issuer's published keys (found by
OpenID discovery), issued by ``JWT_ISSUER``, not expired, and for one of ``JWT_AUDIENCE`` (its ``aud``, or
the ``client_id`` of a Cognito access token). The principal claim (``picoflow.aws.principal``) goes into the
connection's context, which API Gateway hands to every later message of the connection.
"""

from __future__ import annotations

import json
import os
import threading
import urllib.request
from collections.abc import Mapping
from typing import Any

import jwt
from aws_lambda_powertools.utilities.typing import LambdaContext

from picoflow.aws.observability import logger
from picoflow.aws.principal import principal

ISSUER_VARIABLE = "JWT_ISSUER"
AUDIENCE_VARIABLE = "JWT_AUDIENCE"
#: The subprotocol a client offers beside its token, and the one the connection agrees on.
SUBPROTOCOL = "picoflow"
PROTOCOL_HEADER = "sec-websocket-protocol"
#: The key of the principal in the connection's authorizer context ("" for a token without the claim).
PRINCIPAL_KEY = "principal"
# The issuer's discovery document and keys are fetched at a connect: bounded, so a stalled issuer fails fast.
FETCH_TIMEOUT_SECONDS = 3
ALGORITHMS = ["RS256", "RS384", "RS512"]

_key_sources: dict[str, jwt.PyJWKClient] = {}
_lock = threading.Lock()


@logger.inject_lambda_context(clear_state=True)
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """The connect authorizer's Lambda handler (a function of its own, whose role reaches no data)."""
    return authorize(event)


def authorize(event: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The IAM policy answering a ``REQUEST`` authorizer event: Allow with the principal, or Deny."""
    env = os.environ if environ is None else environ
    issuer = (env.get(ISSUER_VARIABLE) or "").strip()
    audiences = {audience.strip() for audience in (env.get(AUDIENCE_VARIABLE) or "").split(",") if audience.strip()}
    token = _token(event)
    try:
        if not issuer or not audiences or not token:
            raise jwt.InvalidTokenError("no token, or no issuer and audience to check it against")
        claims = verified_claims(token, issuer, audiences)
    except (jwt.PyJWTError, OSError, ValueError) as exc:
        # The token itself is never logged.
        logger.info("Connection refused", extra={"errorType": type(exc).__name__})
        return _policy("Deny", event)
    return _policy("Allow", event, {PRINCIPAL_KEY: principal(claims) or ""})


def verified_claims(token: str, issuer: str, audiences: set[str]) -> dict[str, Any]:
    """The claims of ``token`` once its signature, issuer, expiry and audience are verified."""
    key = key_source(issuer).get_signing_key_from_jwt(token)
    claims: dict[str, Any] = jwt.decode(
        token, key.key, algorithms=ALGORITHMS, issuer=issuer,
        options={"verify_aud": False, "require": ["exp", "iss"]},
    )
    aud = claims.get("aud")
    named = set(aud if isinstance(aud, list) else [aud]) | {claims.get("client_id")}
    if not named & audiences:
        raise jwt.InvalidAudienceError("the token is for another audience")
    return claims


def key_source(issuer: str) -> jwt.PyJWKClient:
    """The (cached) signing keys the issuer publishes at the ``jwks_uri`` of its discovery document."""
    with _lock:
        source = _key_sources.get(issuer)
    if source is not None:
        return source
    discovery = issuer.rstrip("/") + "/.well-known/openid-configuration"
    with urllib.request.urlopen(discovery, timeout=FETCH_TIMEOUT_SECONDS) as response:  # noqa: S310 - the issuer's URL
        jwks_uri = json.load(response)["jwks_uri"]
    source = jwt.PyJWKClient(jwks_uri, cache_keys=True, timeout=FETCH_TIMEOUT_SECONDS)
    with _lock:
        return _key_sources.setdefault(issuer, source)


def offered_protocols(event: Mapping[str, Any]) -> list[str]:
    """The subprotocols a ``$connect`` request offers (``Sec-WebSocket-Protocol``, comma-separated)."""
    headers = {str(name).lower(): str(value) for name, value in (event.get("headers") or {}).items()}
    return [item.strip() for item in headers.get(PROTOCOL_HEADER, "").split(",") if item.strip()]


def _token(event: Mapping[str, Any]) -> str | None:
    return next((item for item in offered_protocols(event) if item != SUBPROTOCOL), None)


def _policy(effect: str, event: Mapping[str, Any], context: dict[str, str] | None = None) -> dict[str, Any]:
    answer: dict[str, Any] = {
        "principalId": (context or {}).get(PRINCIPAL_KEY) or "anonymous",
        "policyDocument": {
            "Version": "2012-10-17",
            "Statement": [{"Action": "execute-api:Invoke", "Effect": effect, "Resource": event.get("methodArn")}],
        },
    }
    if context is not None:
        answer["context"] = context
    return answer

"""Lambda entry point of the WebSocket API's connect authorizer (template parameter EnableWebSocketApi with
JwtIssuer): it checks the JWT a client offers as a subprotocol, and its role reaches no session or file."""

from picoflow.aws.ws_authorizer import lambda_handler

__all__ = ["lambda_handler"]

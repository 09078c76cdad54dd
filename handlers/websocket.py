"""Lambda entry point of the WebSocket API (template parameter EnableWebSocketApi): its connect authorizer and the
turns its messages run, each event posted back to the connection as it happens."""

from picoflow.aws.websocket import lambda_handler

__all__ = ["lambda_handler"]

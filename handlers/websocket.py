"""Lambda entry point of the WebSocket API (template parameter EnableWebSocketApi): the turns its messages run,
each event posted back to the connection as it happens. Inside Lambda its import also primes the first turn."""

from picoflow.aws import priming
from picoflow.aws.websocket import lambda_handler

priming.install()

__all__ = ["lambda_handler"]

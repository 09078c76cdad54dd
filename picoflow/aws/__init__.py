"""The AWS adapter: the Lambda handlers' runtime, the HTTP API on Powertools, the WebSocket API, the protocol routes,
idempotency, observability and priming."""

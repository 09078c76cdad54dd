"""Lambda entry point of the example application."""

from picoflow.aws.api import app, lambda_handler

__all__ = ["app", "lambda_handler"]

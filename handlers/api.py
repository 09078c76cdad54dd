"""Lambda entry point of the example application; inside Lambda its import also primes the first turn."""

from picoflow.aws import priming
from picoflow.aws.api import app, lambda_handler

priming.install()

__all__ = ["app", "lambda_handler"]

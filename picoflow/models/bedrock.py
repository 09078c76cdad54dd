"""The ``bedrock`` provider: models on Amazon Bedrock through the Converse API (``pip install 'picoflow[bedrock]'``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langchain_core.language_models import BaseChatModel

from picoflow.errors import ModelNotConfiguredError, PicoFlowError
from picoflow.files.refs import KNOWN_TYPES
from picoflow.models.caching import PROMPT_CACHE_PARAM, bedrock_points, check_prompt_cache, prompt_caching
from picoflow.models.common import (
    CLIENT_RETRIES,
    DEFAULT_TIMEOUT_SECONDS,
    BuiltInProvider,
    env_value,
    import_extra,
    usage_normalising,
)
from picoflow.models.registry import ModelSelection
from picoflow.models.vocabulary import Vocabulary

BEDROCK_PARAMS = frozenset(
    {"temperature", "top_p", "max_tokens", "stop", "timeout", "additional_model_request_fields",
     "guardrail_config", "performance_config", PROMPT_CACHE_PARAM}
)
"""The parameters a ``bedrock`` selection may set."""

BEDROCK_CONNECT_TIMEOUT_SECONDS = 10.0
_OBJECT_PARAMS = ("additional_model_request_fields", "guardrail_config", "performance_config")


BEDROCK_VOCABULARY = Vocabulary(
    # The Converse API's stopReason when a guardrail or the content filters stopped the reply.
    blocked_finish_reasons=frozenset({"guardrail_intervened", "content_filtered"}),
    throttling_names=frozenset({"ThrottlingException"}),
    auth_codes={
        "UnrecognizedClientException": "the AWS credentials",
        "AccessDeniedException": "the model access of the function's role",
    },
    configuration_codes={"ResourceNotFoundException": "the model name"},
)
"""How Bedrock refuses, throttles and reports a role or a model it does not know."""


class BedrockProvider(BuiltInProvider):
    """Bedrock models via ``langchain-aws``'s ``ChatBedrockConverse``, imported only when a model is built.

    There is no key: boto3 finds the IAM credentials (on Lambda, the function's role). The Region comes from
    ``region`` or ``AWS_REGION`` / ``AWS_DEFAULT_REGION`` in ``environ`` (the process environment by
    default). The selection's name is a model ID (``amazon.nova-lite-v1:0``) or an inference profile ID
    (``us.anthropic.claude-sonnet-4-5-20250929-v1:0``); the parameters are checked. Requests to Claude and Nova
    models carry cache points (see ``picoflow.models.caching``) unless the selection sets ``prompt_cache`` to
    false.
    """

    #: Images and PDFs, sent as Converse image and document blocks.
    file_types = KNOWN_TYPES

    name = "bedrock"
    accepted_params = BEDROCK_PARAMS
    # The Converse API takes temperature from 0 to 1 whatever the model.
    max_temperature = 1.0
    vocabulary = BEDROCK_VOCABULARY

    def __init__(
        self, region: str | None = None, *, name: str | None = None, environ: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(name=name, environ=environ)
        self._region = region

    def check_values(self, label: str, params: Mapping[str, Any]) -> None:
        """The prompt cache switch, and the Converse API's objects as objects."""
        check_prompt_cache(label, params)
        for key in _OBJECT_PARAMS:
            if key in params and not isinstance(params[key], dict):
                raise PicoFlowError(f"Model '{label}' {key} must be an object.")

    def missing_setting(self) -> str | None:
        """``AWS_REGION`` when no Region is set (credentials are boto3's to find, at the first call)."""
        return None if self._region or env_value(self.environ, "AWS_REGION", "AWS_DEFAULT_REGION") else "AWS_REGION"

    def chat_model(self, selection: ModelSelection) -> BaseChatModel:
        """A ``ChatBedrockConverse`` whose boto3 client has connect and read timeouts and retries transport
        failures and throttling itself (botocore's standard mode)."""
        region = self._region or env_value(self.environ, "AWS_REGION", "AWS_DEFAULT_REGION")
        if not region:
            raise ModelNotConfiguredError(
                f"Model provider '{self.name}' has no AWS Region: pass region to BedrockProvider "
                "or set AWS_REGION (Lambda sets it).",
                provider=self.name,
                setting="AWS_REGION",
            )
        module = import_extra("langchain_aws", provider=self.name, extra="bedrock")
        from botocore.config import Config

        options: dict[str, Any] = dict(selection.params)
        config = Config(
            connect_timeout=BEDROCK_CONNECT_TIMEOUT_SECONDS,
            read_timeout=options.pop("timeout", DEFAULT_TIMEOUT_SECONDS),
            retries={"total_max_attempts": CLIENT_RETRIES + 1, "mode": "standard"},
        )
        chat_class = usage_normalising(module.ChatBedrockConverse)
        points = bedrock_points(selection.name)
        if options.pop(PROMPT_CACHE_PARAM, True) and points is not None:
            chat_class = prompt_caching(chat_class, points)
        model: BaseChatModel = chat_class(model=selection.name, region_name=region, config=config, **options)
        return model

"""The registry the handler and the CLI build from the environment: every built-in provider.

It lives beside the provider contract (``registry.py``) rather than inside it, so the contract imports no provider
and no provider imports anything that imports it back.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from picoflow.models.anthropic import AnthropicProvider
from picoflow.models.bedrock import BedrockProvider
from picoflow.models.google import GoogleProvider
from picoflow.models.openai import OPENAI_COMPATIBLE, OpenAIProvider
from picoflow.models.registry import ModelProvider, ProviderRegistry


def default_registry(environ: Mapping[str, str] | None = None) -> ProviderRegistry:
    """The registry the handler and the CLI use: every built-in provider, configured from ``environ`` (the
    process environment by default; keys, endpoints and Regions are read when a model is built, so a
    ``ParameterEnviron`` hands each model the key its parameter holds at that time), and,
    when ``PICOFLOW_SCRIPT`` names a JSON script, a ``ScriptedProvider`` overriding every selection.

    The built-in providers are the OpenAI-compatible family (``openai``, ``azure-openai``, ``deepseek``,
    ``moonshot``, ``zai``, ``openrouter``, ``ollama``), then ``anthropic``, ``google`` and ``bedrock``, whose
    LangChain packages are optional extras imported only when one of their models is built."""
    env = os.environ if environ is None else environ
    providers: list[ModelProvider] = [OpenAIProvider(name=name, environ=env) for name in OPENAI_COMPATIBLE]
    providers += [AnthropicProvider(environ=env), GoogleProvider(environ=env), BedrockProvider(environ=env)]
    registry = ProviderRegistry(providers)
    script_path = env.get("PICOFLOW_SCRIPT")
    if script_path:
        # Imported only here: a deployment serving real models never needs the scripted one.
        from picoflow.models.scripted import ScriptedProvider

        registry.override = ScriptedProvider.from_file(script_path)
    return registry

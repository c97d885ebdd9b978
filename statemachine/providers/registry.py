"""Model strings: ``"openai:gpt-4.1"`` or ``"anthropic:claude-sonnet-4-5"`` for a client.

The bundled prefixes: ``openai`` (Chat Completions, ``OpenAIChatModel``),
``openai-responses`` (the Responses API, ``OpenAIResponsesModel``), ``anthropic``
(``AnthropicModel``), ``gemini`` and its alias ``google-gla`` (the Gemini API with an
AI Studio key, ``GeminiModel``) and ``bedrock`` (Bedrock Converse, ``BedrockModel``;
the model id may hold colons: ``"bedrock:us.anthropic.claude-sonnet-4-20250514-v1:0"``,
only the first colon ends the prefix); ``azure`` and ``azure-responses`` (Azure
OpenAI, ``statemachine.providers.azure``); ``vertex`` (Gemini on Vertex AI) and
``vertex-anthropic`` (Claude on Vertex AI, ``statemachine.providers.vertex``);
``ollama`` (Ollama's native chat API, ``OllamaModel``); and the OpenAI-compatible
services of ``statemachine.providers.compatible``: ``groq``, ``deepseek``,
``openrouter``, ``xai``, ``together``, ``fireworks``, ``cerebras`` and ``mistral``.

``model_from_string("provider:model", **options)`` builds the bundled adapter the
prefix names, with ``options`` as its keyword arguments (``api_key``, ``base_url``,
``system``...); ``Agent``, ``run_agent`` and ``resume_agent`` take such a string
wherever they take a client. The adapter is built at once, so a missing key or SDK
is an error where the string is given, not at the first model call.

Extension point: ``register_provider(prefix, factory)`` adds a prefix, ``factory``
being called ``factory(model_name, **options)`` and returning a ``ModelClient``. The
bundled prefixes are registered in ``_BUNDLED`` below; an adapter added to this
package registers its prefix there.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from typing import Any

from statemachine.agent.model import ModelClient
from statemachine.errors import UsageError
from statemachine.providers.compatible import COMPATIBLE, compatible_model

__all__ = ["ModelFactory", "known_providers", "model_from_string", "register_provider"]

ModelFactory = Callable[..., ModelClient]
"""``factory(model_name, **options) -> ModelClient``."""


def _lazy(module: str, name: str) -> ModelFactory:
    """The adapter class ``name`` of ``module``, imported when a string first uses it
    (so a missing SDK only matters to the prefix that needs it)."""

    def build(model: str, **options: Any) -> ModelClient:
        adapter: ModelFactory = getattr(importlib.import_module(module), name)
        return adapter(model, **options)

    build.__qualname__ = f"{name} (lazy)"
    return build


_BUNDLED: dict[str, ModelFactory] = {
    "openai": _lazy("statemachine.providers.openai_chat", "OpenAIChatModel"),
    "openai-responses": _lazy("statemachine.providers.openai_responses", "OpenAIResponsesModel"),
    "anthropic": _lazy("statemachine.providers.anthropic_messages", "AnthropicModel"),
    "gemini": _lazy("statemachine.providers.gemini", "GeminiModel"),
    "google-gla": _lazy("statemachine.providers.gemini", "GeminiModel"),
    "bedrock": _lazy("statemachine.providers.bedrock", "BedrockModel"),
    "azure": _lazy("statemachine.providers.azure", "AzureOpenAIChatModel"),
    "azure-responses": _lazy("statemachine.providers.azure", "AzureOpenAIResponsesModel"),
    "vertex": _lazy("statemachine.providers.vertex", "VertexGeminiModel"),
    "vertex-anthropic": _lazy("statemachine.providers.vertex", "AnthropicVertexModel"),
    "ollama": _lazy("statemachine.providers.ollama", "OllamaModel"),
}


def _compatible(prefix: str) -> ModelFactory:
    def build(model: str, **options: Any) -> ModelClient:
        return compatible_model(prefix, model, **options)

    build.__qualname__ = f"compatible_model({prefix!r})"
    return build


_BUNDLED.update({prefix: _compatible(prefix) for prefix in COMPATIBLE})
_providers: dict[str, ModelFactory] = dict(_BUNDLED)

_PREFIX = re.compile(r"[a-z][a-z0-9_-]*")


def register_provider(prefix: str, factory: ModelFactory) -> None:
    """Make ``"prefix:model"`` build ``factory("model", **options)`` (replacing the
    factory of that prefix, if any)."""
    if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
        raise UsageError(f"a provider prefix is lowercase letters, digits, - and _; got {prefix!r}")
    if not callable(factory):
        raise UsageError(f"the factory of {prefix!r} must be callable")
    _providers[prefix] = factory


def known_providers() -> tuple[str, ...]:
    """The prefixes a model string may have, sorted."""
    return tuple(sorted(_providers))


def model_from_string(spec: str, **options: Any) -> ModelClient:
    """The client ``"provider:model"`` names, built with ``options``."""
    if not isinstance(spec, str):
        raise UsageError(f"a model string is 'provider:model', got {type(spec).__name__}")
    prefix, colon, model = spec.partition(":")
    known = ", ".join(known_providers())
    if not colon or not model:
        raise UsageError(
            f"model string {spec!r} is not 'provider:model' (known providers: {known})"
        )
    factory = _providers.get(prefix)
    if factory is None:
        raise UsageError(f"unknown model provider {prefix!r} in {spec!r}; known: {known}")
    return factory(model, **options)

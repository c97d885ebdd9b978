"""Model clients for real providers: OpenAI-compatible Chat Completions, the OpenAI
Responses API, Anthropic Messages, Gemini and AWS Bedrock Converse; their Azure
OpenAI and Vertex AI variants; Ollama's native chat API; and ``FallbackModel``, which
asks the next model when one is out of service.

``model_from_string("openai:gpt-4.1")`` builds one from a model string
(``statemachine.providers.registry``); ``CallOptions`` and ``ModelSettings`` are what a
run hands a client besides the context (instructions, settings, streaming listeners;
see ``statemachine.agent.model`` for the calling convention).

Each adapter needs its provider's SDK (the extras ``agent-statemachine[openai]``,
``[anthropic]``, ``[gemini]`` and ``[bedrock]``) and is imported on first use, so that
this package, its errors and its retry policy load without any SDK. An adapter whose
SDK is missing raises ``ImportError`` saying which extra to install.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from statemachine.agent.model import CallOptions, ModelSettings
from statemachine.errors import (
    ContextOverflowError,
    ProviderAuthError,
    ProviderError,
    ProviderLimitError,
    ProviderRequestError,
    ProviderResponseError,
    ProviderUnavailableError,
)
from statemachine.providers._retry import RetryPolicy
from statemachine.providers.redaction import RedactSecrets
from statemachine.providers.registry import known_providers, model_from_string, register_provider

if TYPE_CHECKING:
    from statemachine.providers.anthropic_messages import AnthropicModel
    from statemachine.providers.azure import AzureOpenAIChatModel, AzureOpenAIResponsesModel
    from statemachine.providers.bedrock import BedrockModel
    from statemachine.providers.fallback import FallbackModel
    from statemachine.providers.gemini import GeminiModel
    from statemachine.providers.ollama import OllamaModel
    from statemachine.providers.openai_chat import OpenAIChatModel
    from statemachine.providers.openai_responses import OpenAIResponsesModel
    from statemachine.providers.vertex import AnthropicVertexModel, VertexGeminiModel

__all__ = [
    "AnthropicModel",
    "AnthropicVertexModel",
    "AzureOpenAIChatModel",
    "AzureOpenAIResponsesModel",
    "BedrockModel",
    "CallOptions",
    "ContextOverflowError",
    "FallbackModel",
    "GeminiModel",
    "ModelSettings",
    "OllamaModel",
    "OpenAIChatModel",
    "OpenAIResponsesModel",
    "ProviderAuthError",
    "ProviderError",
    "ProviderLimitError",
    "ProviderRequestError",
    "ProviderResponseError",
    "ProviderUnavailableError",
    "RedactSecrets",
    "RetryPolicy",
    "VertexGeminiModel",
    "known_providers",
    "model_from_string",
    "register_provider",
]

_LAZY = {
    "OpenAIChatModel": "statemachine.providers.openai_chat",
    "OpenAIResponsesModel": "statemachine.providers.openai_responses",
    "AnthropicModel": "statemachine.providers.anthropic_messages",
    "BedrockModel": "statemachine.providers.bedrock",
    "GeminiModel": "statemachine.providers.gemini",
    "AzureOpenAIChatModel": "statemachine.providers.azure",
    "AzureOpenAIResponsesModel": "statemachine.providers.azure",
    "VertexGeminiModel": "statemachine.providers.vertex",
    "AnthropicVertexModel": "statemachine.providers.vertex",
    "OllamaModel": "statemachine.providers.ollama",
    "FallbackModel": "statemachine.providers.fallback",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # Without its SDK, the module raises the one message: pip install the extra.
    return getattr(importlib.import_module(_LAZY[name]), name)

"""The hosted services that speak OpenAI Chat Completions, each a model-string prefix.

``"groq:llama-3.3-70b-versatile"`` builds an ``OpenAIChatModel`` with the service's
base URL, its key from its own environment variable (or ``api_key=``), and its name
in every error (``"Groq model 'llama-3.3-70b-versatile' at https://api.groq.com/..."``).
Every other option is ``OpenAIChatModel``'s; ``base_url=`` replaces the default (a
proxy, a region, a self-hosted gateway).

What each service adds on the wire is read tolerantly by the Chat adapter (Groq's
``x_groq`` and ``service_tier``, OpenRouter's ``provider`` and ``reasoning``...), and
reasoning sent as ``reasoning_content`` (DeepSeek) or ``reasoning`` (OpenRouter, Groq,
Cerebras) is kept as thinking. Chat Completions has no input for reasoning, so it is
not sent back, except to DeepSeek, whose thinking mode takes it back as
``reasoning_content`` between tool calls (``reasoning_field="reasoning_content"``, set
by the ``deepseek`` prefix).

Mistral is taken through its OpenAI-compatible endpoint rather than its own SDK: the
endpoint serves the same ``/v1/chat/completions`` wire (messages, function tools,
``tool_calls``, server-sent events, usage), so the adapter that is already tested
against recorded traffic serves it, with one SDK less to install and bound; Mistral's
own SDK would add no capability a run uses. Its reasoning models (Magistral) send
thinking as content chunks, which the Chat adapter reads as text.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import attrs

from statemachine.errors import InvalidInputError

if TYPE_CHECKING:
    from statemachine.providers.openai_chat import OpenAIChatModel

__all__ = ["COMPATIBLE", "Compatible", "compatible_model"]


@attrs.frozen
class Compatible:
    """One service: its display name, default base URL and key variable."""

    name: str
    base_url: str
    key_env: str
    telemetry: str  # its ``gen_ai.provider.name`` (the conventions' value where they have one)


COMPATIBLE: dict[str, Compatible] = {
    "groq": Compatible("Groq", "https://api.groq.com/openai/v1", "GROQ_API_KEY", "groq"),
    "deepseek": Compatible(
        "DeepSeek", "https://api.deepseek.com/v1", "DEEPSEEK_API_KEY", "deepseek"
    ),
    "openrouter": Compatible(
        "OpenRouter", "https://openrouter.ai/api/v1", "OPENROUTER_API_KEY", "openrouter"
    ),
    "xai": Compatible("xAI", "https://api.x.ai/v1", "XAI_API_KEY", "x_ai"),
    "together": Compatible(
        "Together AI", "https://api.together.xyz/v1", "TOGETHER_API_KEY", "together_ai"
    ),
    "fireworks": Compatible(
        "Fireworks AI", "https://api.fireworks.ai/inference/v1", "FIREWORKS_API_KEY", "fireworks"
    ),
    "cerebras": Compatible(
        "Cerebras", "https://api.cerebras.ai/v1", "CEREBRAS_API_KEY", "cerebras"
    ),
    "mistral": Compatible("Mistral", "https://api.mistral.ai/v1", "MISTRAL_API_KEY", "mistral_ai"),
}
"""The services by prefix (the providers guide has the same table)."""


def compatible_model(prefix: str, model: str, **options: Any) -> OpenAIChatModel:
    """The ``OpenAIChatModel`` of the service ``prefix`` names (see the module docstring)."""
    from statemachine.providers.openai_chat import OpenAIChatModel  # needs the SDK

    service = COMPATIBLE[prefix]
    key = options.pop("api_key", None) or os.environ.get(service.key_env)
    if not key:
        raise InvalidInputError(
            f"no {service.name} API key: set {service.key_env} or pass api_key="
        )
    options.setdefault("base_url", service.base_url)
    if prefix == "deepseek":
        options.setdefault("reasoning_field", "reasoning_content")
    client = OpenAIChatModel(model, api_key=key, **options)
    # Errors name the service and the variable its key comes from.
    client.provider = service.name
    client.key_env = service.key_env
    client.provider_name = service.telemetry
    return client

"""Model clients for real providers: OpenAI-compatible Chat Completions and Anthropic.

``OpenAIChatModel`` and ``AnthropicModel`` each need their SDK (the extras
``agent-statemachine[openai]`` and ``[anthropic]``); they are imported on first use,
so that this package, its errors and its retry policy load without either SDK.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._errors import (
    ContextOverflowError,
    ProviderAuthError,
    ProviderError,
    ProviderRequestError,
    ProviderResponseError,
    ProviderUnavailableError,
)
from ._logging import RedactSecrets
from ._retry import RetryPolicy

if TYPE_CHECKING:
    from .anthropic_messages import AnthropicModel
    from .openai_chat import OpenAIChatModel

__all__ = [
    "AnthropicModel",
    "ContextOverflowError",
    "OpenAIChatModel",
    "ProviderAuthError",
    "ProviderError",
    "ProviderRequestError",
    "ProviderResponseError",
    "ProviderUnavailableError",
    "RedactSecrets",
    "RetryPolicy",
]

_LAZY = {
    "OpenAIChatModel": ("statemachine.providers.openai_chat", "openai"),
    "AnthropicModel": ("statemachine.providers.anthropic_messages", "anthropic"),
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module_name, extra = _LAZY[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportError(
            f"{name} needs the {extra!r} SDK: pip install 'agent-statemachine[{extra}]' ({exc})"
        ) from exc
    return getattr(module, name)

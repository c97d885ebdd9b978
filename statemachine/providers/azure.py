"""Azure OpenAI: ``AzureOpenAIChatModel`` (Chat Completions) and
``AzureOpenAIResponsesModel`` (the Responses API), through the ``openai`` SDK's
``AsyncAzureOpenAI`` client.

They are the OpenAI adapters (same projection, streaming, limits, retries and
errors) with Azure's addressing and credentials:

* ``endpoint`` [``AZURE_OPENAI_ENDPOINT``]: the resource, ``https://NAME.openai.azure.com``;
* ``api_version`` [``OPENAI_API_VERSION``, else ``DEFAULT_API_VERSION``]: sent as the
  ``api-version`` query parameter of every request;
* ``deployment`` [None]: the deployment to call. Without it, Chat Completions calls
  the deployment named like the model (``/openai/deployments/{model}/...``), which is
  how Azure names deployments by default; the Responses API takes the deployment
  name as its ``model``;
* ``api_key`` [``AZURE_OPENAI_API_KEY``] or ``token_provider``: a Microsoft Entra ID
  token provider (a callable returning a bearer token, e.g. ``azure.identity``'s
  ``get_bearer_token_provider(DefaultAzureCredential(), scope)``), for keyless
  deployments; one of the two is required.

Azure's stream opens with a prompt-filter chunk (``"object": ""``, no choices) and
adds content-filter annotations; the Chat adapter reads past them (see
``openai_chat``).
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import Any, Unpack

from statemachine.providers._errors import missing_extra

try:
    import openai
except ImportError as exc:  # pragma: no cover - exercised by a test that hides the SDK
    raise missing_extra("openai") from exc

from statemachine.errors import InvalidInputError
from statemachine.providers._adapter import AdapterOptions, ModelAdapter
from statemachine.providers.openai_chat import OpenAIChatModel
from statemachine.providers.openai_responses import OpenAIResponsesModel

__all__ = ["DEFAULT_API_VERSION", "AzureOpenAIChatModel", "AzureOpenAIResponsesModel"]

DEFAULT_API_VERSION = "2025-04-01-preview"
"""The ``api-version`` used when neither ``api_version`` nor ``OPENAI_API_VERSION`` is
given: one that serves both Chat Completions and the Responses API."""

TokenProvider = Callable[[], str | Awaitable[str]]


class _Azure(ModelAdapter):
    """What both Azure adapters add: the resource, the version and the credential."""

    provider = "Azure OpenAI"
    provider_name: str | None = "azure.ai.openai"  # its gen_ai.provider.name
    key_env = "AZURE_OPENAI_API_KEY"
    _azure: dict[str, Any]

    def _azure_setup(
        self,
        endpoint: str | None,
        api_version: str | None,
        deployment: str | None,
        api_key: str | None,
        token_provider: TokenProvider | None,
    ) -> tuple[str, str | None]:
        """Check the options; the endpoint and the key (``None`` with a token provider)."""
        endpoint = endpoint or os.environ.get("AZURE_OPENAI_ENDPOINT")
        if not endpoint:
            raise InvalidInputError(
                "no Azure OpenAI endpoint: set AZURE_OPENAI_ENDPOINT or pass endpoint="
            )
        if token_provider is not None and not callable(token_provider):
            raise InvalidInputError("token_provider must be a callable that returns a token")
        key = api_key or os.environ.get(self.key_env)
        if not key and token_provider is None:
            raise InvalidInputError(
                "no Azure OpenAI credential: set AZURE_OPENAI_API_KEY, pass api_key=, "
                "or pass token_provider= (Microsoft Entra ID)"
            )
        self._azure = {
            "azure_endpoint": endpoint,
            "api_version": api_version
            or os.environ.get("OPENAI_API_VERSION")
            or DEFAULT_API_VERSION,
            "azure_deployment": deployment,
            "azure_ad_token_provider": token_provider,
            "api_key": None if token_provider is not None else key,
        }
        return endpoint, key

    def _new_client(self, key: str | None, base_url: str | None) -> openai.AsyncAzureOpenAI:
        # Azure's client is addressed by its endpoint (in ``_azure``), not by a base URL.
        options = {k: v for k, v in self._sdk_options(None).items() if k != "base_url"}
        return openai.AsyncAzureOpenAI(**self._azure, **options)


class AzureOpenAIChatModel(_Azure, OpenAIChatModel):
    """``OpenAIChatModel`` on Azure OpenAI (see the module docstring for the options;
    every other option is ``OpenAIChatModel``'s)."""

    def __init__(
        self,
        model: str,
        *,
        endpoint: str | None = None,
        api_version: str | None = None,
        deployment: str | None = None,
        api_key: str | None = None,
        token_provider: TokenProvider | None = None,
        max_tokens: int | None = None,
        stream: bool = True,
        stream_usage: bool = True,
        native_output: bool = True,
        **options: Unpack[AdapterOptions],
    ) -> None:
        endpoint, key = self._azure_setup(
            endpoint, api_version, deployment, api_key, token_provider
        )
        super().__init__(
            model,
            api_key=key,
            base_url=endpoint,
            max_tokens=max_tokens,
            stream=stream,
            stream_usage=stream_usage,
            native_output=native_output,
            **options,
        )


class AzureOpenAIResponsesModel(_Azure, OpenAIResponsesModel):
    """``OpenAIResponsesModel`` on Azure OpenAI (see the module docstring for the
    options; every other option is ``OpenAIResponsesModel``'s). ``model`` is the
    deployment's name."""

    def __init__(
        self,
        model: str,
        *,
        endpoint: str | None = None,
        api_version: str | None = None,
        api_key: str | None = None,
        token_provider: TokenProvider | None = None,
        max_output_tokens: int | None = None,
        reasoning: dict[str, Any] | None = None,
        encrypted_reasoning: bool = True,
        stream: bool = True,
        **options: Unpack[AdapterOptions],
    ) -> None:
        endpoint, key = self._azure_setup(endpoint, api_version, None, api_key, token_provider)
        super().__init__(
            model,
            api_key=key,
            base_url=endpoint,
            max_output_tokens=max_output_tokens,
            reasoning=reasoning,
            encrypted_reasoning=encrypted_reasoning,
            stream=stream,
            **options,
        )

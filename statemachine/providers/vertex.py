"""Models on Google Cloud Vertex AI: ``VertexGeminiModel`` (Gemini, through
``google-genai``'s Vertex AI mode) and ``AnthropicVertexModel`` (Claude, through the
``anthropic`` SDK's ``AsyncAnthropicVertex`` client).

They are the Gemini and Anthropic adapters (same projection, streaming, limits,
retries and errors) with Vertex AI's addressing and Google credentials instead of an
API key:

* ``project`` [``GOOGLE_CLOUD_PROJECT``]: the Google Cloud project;
* ``location`` [``GOOGLE_CLOUD_LOCATION``, else ``"global"`` for Gemini and
  ``"us-east5"`` for Claude]: the region (``"global"`` routes to any);
* ``credentials`` [Application Default Credentials]: a ``google.auth`` credentials
  object; for Claude, ``access_token=`` is accepted as well.

The model names are Vertex AI's (``gemini-2.5-flash``, ``claude-sonnet-4@20250514``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Unpack

from statemachine.errors import InvalidInputError
from statemachine.providers._adapter import AdapterOptions
from statemachine.providers.anthropic_messages import AnthropicModel
from statemachine.providers.gemini import GeminiModel

__all__ = ["AnthropicVertexModel", "VertexGeminiModel"]


def _project(project: str | None) -> str:
    project = project or os.environ.get("GOOGLE_CLOUD_PROJECT")
    if not project:
        raise InvalidInputError(
            "no Google Cloud project: set GOOGLE_CLOUD_PROJECT or pass project="
        )
    return project


class VertexGeminiModel(GeminiModel):
    """``GeminiModel`` on Vertex AI (see the module docstring for the options; every
    other option is ``GeminiModel``'s)."""

    provider = "Vertex AI Gemini"
    provider_name = "gcp.vertex_ai"  # its gen_ai.provider.name
    needs_key = False

    def __init__(
        self,
        model: str,
        *,
        project: str | None = None,
        location: str | None = None,
        credentials: Any = None,
        base_url: str | None = None,
        max_output_tokens: int | None = None,
        thinking: Mapping[str, Any] | None = None,
        stream: bool = True,
        api_version: str = "v1",
        native_output: bool | None = None,
        **options: Unpack[AdapterOptions],
    ) -> None:
        self._vertex = {
            "project": _project(project),
            "location": location or os.environ.get("GOOGLE_CLOUD_LOCATION") or "global",
            "credentials": credentials,
        }
        super().__init__(
            model,
            api_key="",  # none: Google credentials authenticate the calls
            base_url=base_url,
            max_output_tokens=max_output_tokens,
            thinking=thinking,
            stream=stream,
            api_version=api_version,
            native_output=native_output,
            **options,
        )
        if base_url is None:
            location = self._vertex["location"]
            host = "aiplatform" if location == "global" else f"{location}-aiplatform"
            self._base = f"https://{host}.googleapis.com"

    def _new_client(self, key: str | None, base_url: str | None) -> Any:
        from google import genai

        options = self._http_options(base_url)
        return genai.Client(vertexai=True, http_options=options, **self._vertex)


class AnthropicVertexModel(AnthropicModel):
    """``AnthropicModel`` on Vertex AI (see the module docstring for the options;
    every other option is ``AnthropicModel``'s)."""

    provider = "Vertex AI Anthropic"
    provider_name = "gcp.vertex_ai"
    needs_key = False

    def __init__(
        self,
        model: str,
        *,
        project: str | None = None,
        location: str | None = None,
        credentials: Any = None,
        access_token: str | None = None,
        base_url: str | None = None,
        max_tokens: int = 4096,
        thinking: Mapping[str, Any] | None = None,
        prompt_cache: bool = False,
        stream: bool = True,
        native_output: bool = False,
        **options: Unpack[AdapterOptions],
    ) -> None:
        self._vertex = {
            "project_id": _project(project),
            "region": location or os.environ.get("GOOGLE_CLOUD_LOCATION") or "us-east5",
            "credentials": credentials,
            "access_token": access_token,
        }
        super().__init__(
            model,
            api_key=access_token or "",
            base_url=base_url,
            max_tokens=max_tokens,
            thinking=thinking,
            prompt_cache=prompt_cache,
            stream=stream,
            native_output=native_output,
            **options,
        )

    def _new_client(self, key: str | None, base_url: str | None) -> Any:
        import anthropic

        return anthropic.AsyncAnthropicVertex(**self._vertex, **self._sdk_options(base_url))

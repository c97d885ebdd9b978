"""``OpenAIChatModel``: a ``ModelClient`` over OpenAI Chat Completions.

It serves any OpenAI-compatible server too (vLLM, llama.cpp, Ollama, LM Studio):
pass ``base_url``. It uses the official ``openai`` SDK, created with
``max_retries=0`` (retries are ours, see ``_retry``) and strict response validation.

Projection to the Chat Completions wire format, on top of ``sendable_history``:

* user text is a plain string when it is one block (every compatible server takes
  that), otherwise a list of parts; images become ``image_url`` data URLs; empty
  content is sent as ``(empty message)`` (and an empty result as ``(no output)``),
  since some servers refuse empty strings;
* an assistant message becomes ``content`` plus ``tool_calls`` (arguments as JSON
  text); thinking is not sent back (Chat Completions has no input for it);
* each result becomes one ``role: tool`` message right after its assistant message.
  Tool messages carry text only, so a result's images follow in one user message
  after the batch's results;
* tool-call ids are kept when OpenAI accepts them (at most 40 characters of
  ``[A-Za-z0-9_-]``) and otherwise replaced by a stable substitute.

Streaming: text deltas, tool-call fragments keyed by ``index`` (id and name arrive
once, arguments in pieces), a final usage chunk (``stream_options.include_usage``),
and ``reasoning_content`` that some compatible servers send, kept as thinking.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random as _random
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import openai
from openai.types.chat import ChatCompletionChunk

from .._abort import AbortSignal
from .._errors import InvalidInputError
from .._log import library_logger
from .._messages import (
    AssistantMessage,
    ImageContent,
    Message,
    StopReason,
    TextContent,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
    thaw_json,
)
from .._tools import ToolDefinition
from ._errors import (
    Failure,
    ProviderResponseError,
    classify,
    connection_failure,
    redact,
    validation_detail,
)
from ._projection import MessageBuilder, normalise_id, sendable_history
from ._retry import (
    AbortWatch,
    RetryPolicy,
    Sleep,
    aborted_message,
    complete_with_retries,
    race_abort,
)

__all__ = ["OpenAIChatModel", "project_messages", "project_tools"]

MAX_ID_LENGTH = 40
_FINISH: dict[str, StopReason] = {
    "stop": StopReason.STOP,
    "tool_calls": StopReason.TOOL_USE,
    "function_call": StopReason.TOOL_USE,
    "length": StopReason.LENGTH,
    "content_filter": StopReason.ERROR,
}


class _IncompleteStreamError(Exception):
    """The stream ended before a finish reason: the connection broke mid-response."""


def _data_url(block: ImageContent) -> str:
    return f"data:{block.mime_type};base64,{block.data}"


def _user_parts(content: Sequence[TextContent | ImageContent]) -> str | list[dict[str, Any]]:
    if len(content) == 1 and isinstance(content[0], TextContent):
        return content[0].text
    parts: list[dict[str, Any]] = []
    for block in content:
        if isinstance(block, TextContent):
            if block.text:
                parts.append({"type": "text", "text": block.text})
        else:
            parts.append({"type": "image_url", "image_url": {"url": _data_url(block)}})
    return parts


def project_messages(
    messages: Sequence[Message], system: str | None = None
) -> list[dict[str, Any]]:
    """Our history as Chat Completions ``messages`` (see the module docstring)."""
    out: list[dict[str, Any]] = []
    if system:
        out.append({"role": "system", "content": system})
    pending_images: list[dict[str, Any]] = []

    def flush_images() -> None:
        if pending_images:
            out.append({"role": "user", "content": list(pending_images)})
            pending_images.clear()

    for message in sendable_history(messages):
        if not isinstance(message, ToolResultMessage):
            flush_images()
        if isinstance(message, UserMessage):
            # Some compatible servers refuse empty content; say that it was empty.
            parts = _user_parts(message.content) or "(empty message)"
            out.append({"role": "user", "content": parts})
        elif isinstance(message, AssistantMessage):
            entry: dict[str, Any] = {"role": "assistant", "content": message.text or None}
            calls = [
                {
                    "id": normalise_id(call.id, MAX_ID_LENGTH),
                    "type": "function",
                    "function": {
                        "name": call.name,
                        "arguments": json.dumps(thaw_json(call.arguments), ensure_ascii=False),
                    },
                }
                for call in message.content
                if isinstance(call, ToolCall)
            ]
            if calls:
                entry["tool_calls"] = calls
            if entry["content"] is None and not calls:
                continue  # e.g. a response that held only thinking
            out.append(entry)
        else:
            text = message.text
            images = [b for b in message.content if isinstance(b, ImageContent)]
            if images:
                call_id = normalise_id(message.tool_call_id, MAX_ID_LENGTH)
                note = f"(image output of tool call {call_id})"
                pending_images.append({"type": "text", "text": note})
                pending_images.extend(
                    {"type": "image_url", "image_url": {"url": _data_url(b)}} for b in images
                )
                text = text or "(see the image(s) in the next message)"
            text = text or "(no output)"
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": normalise_id(message.tool_call_id, MAX_ID_LENGTH),
                    "content": ("Error: " + text) if message.is_error and text else text,
                }
            )
    flush_images()
    return out


def project_tools(tools: Sequence[ToolDefinition]) -> list[dict[str, Any]]:
    """Our tool definitions as Chat Completions ``tools``."""
    return [
        {
            "type": "function",
            "function": {
                "name": t.name,
                "description": t.description,
                "parameters": t.schema_dict(),
            },
        }
        for t in tools
    ]


def _usage(raw: Any) -> Usage | None:
    if raw is None:
        return None
    details = raw.prompt_tokens_details
    cached = (details.cached_tokens or 0) if details is not None else 0
    written = (details.cache_write_tokens or 0) if details is not None else 0
    prompt = raw.prompt_tokens or 0
    output = raw.completion_tokens or 0
    return Usage(
        # prompt_tokens counts cached tokens too; ours keeps them apart.
        input=max(0, prompt - cached - written),
        output=output,
        cache_read=cached,
        cache_write=written,
        total_tokens=raw.total_tokens or (prompt + output),
    )


class OpenAIChatModel:
    """A streaming ``ModelClient`` for OpenAI Chat Completions and compatible servers.

    The key comes from ``api_key`` or ``OPENAI_API_KEY``; with a ``base_url`` and no
    key (a local server) a placeholder is sent. ``on_text`` receives text deltas as
    they arrive (a retried attempt streams its text again). ``sleep`` and ``random``
    exist for tests; ``client`` replaces the SDK client entirely.
    """

    provider = "OpenAI"

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        system: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        extra_body: Mapping[str, Any] | None = None,
        stream_usage: bool = True,
        retry: RetryPolicy | None = None,
        timeout: float = 600.0,
        on_text: Callable[[str], None] | None = None,
        logger: Any = None,
        client: openai.AsyncOpenAI | None = None,
        sleep: Sleep = asyncio.sleep,
        random: Callable[[], float] = _random.random,
    ) -> None:
        if not isinstance(model, str) or not model:
            raise InvalidInputError("model must be a non-empty model name")
        key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self._secrets = (key,) if key else ()
        if not key:
            if base_url is None and client is None:
                raise InvalidInputError(
                    "no OpenAI API key: set OPENAI_API_KEY or pass api_key= "
                    "(a local server given by base_url needs none)"
                )
            key = "no-key"  # local servers ignore it, but the SDK requires one
        self.model = model
        self.system = system
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.extra_body = dict(extra_body or {})
        self.stream_usage = stream_usage
        self.retry = retry if retry is not None else RetryPolicy()
        self.on_text = on_text
        self.sleep = sleep
        self.random = random
        self.log = logger if logger is not None else library_logger("statemachine.providers")
        self._client = client or openai.AsyncOpenAI(
            api_key=key,
            base_url=base_url,
            max_retries=0,
            timeout=timeout,
            _strict_response_validation=True,
        )

    def __repr__(self) -> str:
        # Never the key: reprs end up in logs and tracebacks.
        return f"OpenAIChatModel(model={self.model!r}, base_url={str(self._client.base_url)!r})"

    def request_body(
        self, messages: Sequence[Message], tools: Sequence[ToolDefinition]
    ) -> dict[str, Any]:
        """The keyword arguments of ``chat.completions.create`` for this context."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": project_messages(messages, self.system),
            "stream": True,
        }
        if self.stream_usage:
            body["stream_options"] = {"include_usage": True}
        if tools:
            body["tools"] = project_tools(tools)
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if self.extra_body:
            body["extra_body"] = dict(self.extra_body)
        return body

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition],
        signal: AbortSignal,
    ) -> AssistantMessage:
        body = self.request_body(messages, tools)
        return await complete_with_retries(
            lambda watch: self._attempt(body, watch),
            self._classify,
            provider=self.provider,
            policy=self.retry,
            signal=signal,
            sleep=self.sleep,
            random=self.random,
            log=self.log,
        )

    def _classify(self, exc: Exception) -> Failure | None:
        if isinstance(exc, openai.APIStatusError):
            return classify(
                self.provider,
                status=exc.status_code,
                headers=exc.response.headers,
                body=exc.body,
                message=exc.message,
                key_hint="OPENAI_API_KEY",
                secrets=self._secrets,
            )
        if isinstance(exc, (openai.APIConnectionError, _IncompleteStreamError)):
            return connection_failure(self.provider, exc, self._secrets)
        if isinstance(exc, openai.APIResponseValidationError):
            return Failure(
                ProviderResponseError(
                    f"{self.provider} sent a response the SDK could not validate: "
                    f"{redact(validation_detail(exc), self._secrets)}"
                ),
                retryable=False,
            )
        if isinstance(exc, openai.APIError):
            # An error object inside the stream: no status, only its body.
            return classify(
                self.provider,
                status=None,
                headers={},
                body=exc.body,
                message=exc.message,
                key_hint="OPENAI_API_KEY",
                secrets=self._secrets,
            )
        return None

    async def _attempt(self, body: dict[str, Any], watch: AbortWatch) -> AssistantMessage:
        create = cast(Any, self._client.chat.completions).create
        aborted, opened = await race_abort(watch, create(**body))
        if aborted or opened is None:
            return aborted_message("aborted before the response began")
        stream = cast("openai.AsyncStream[ChatCompletionChunk]", opened)
        builder = MessageBuilder(on_text=self.on_text)
        state: dict[str, Any] = {"finish": None, "usage": None}

        async def consume() -> None:
            async for chunk in stream:
                self._apply(chunk, builder, state)
                if watch.signal.aborted:
                    return

        try:
            aborted, _ = await race_abort(watch, consume())
        finally:
            with contextlib.suppress(Exception):
                await stream.close()
        if aborted or watch.signal.aborted:
            return builder.aborted(_usage(state["usage"]))
        finish = state["finish"]
        if finish is None:
            raise _IncompleteStreamError("the response stream ended before a finish reason")
        stop = _FINISH.get(finish, StopReason.STOP)
        error = None
        if finish == "content_filter":
            error = f"{self.provider}'s content filter stopped the response"
        return builder.finish(stop, _usage(state["usage"]), error)

    @staticmethod
    def _apply(chunk: ChatCompletionChunk, builder: MessageBuilder, state: dict[str, Any]) -> None:
        if chunk.usage is not None:
            state["usage"] = chunk.usage
        for choice in chunk.choices:
            if choice.index != 0:
                continue  # we ask for one choice; ignore any other
            delta = choice.delta
            extra = delta.model_extra or {}
            reasoning = extra.get("reasoning_content") or extra.get("reasoning")
            if isinstance(reasoning, str) and reasoning:
                builder.add_text(builder.block(("thinking", 0), "thinking"), reasoning)
            if delta.content:
                builder.append_text(delta.content)
            if delta.refusal:
                builder.append_text(delta.refusal)
            for fragment in delta.tool_calls or ():
                block = builder.block(("tool", fragment.index), "tool")
                if fragment.id and block.call_id and fragment.id != block.call_id:
                    # Some servers (Ollama) send every call whole at index 0: a new
                    # id at a used index is a new call, not more of the old one.
                    block = builder.restart(("tool", fragment.index), "tool")
                if fragment.id:
                    block.call_id = fragment.id
                function = fragment.function
                if function is not None:
                    if function.name:
                        block.name += function.name
                    if function.arguments:
                        block.text.append(function.arguments)
            if choice.finish_reason is not None:
                state["finish"] = choice.finish_reason

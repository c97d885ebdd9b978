"""``AnthropicModel``: a ``ModelClient`` over the Anthropic Messages API.

It uses the official ``anthropic`` SDK, created with ``max_retries=0`` (retries are
ours, see ``_retry``) and strict response validation.

Projection to the Messages wire format, on top of ``sendable_history``:

* the results of one assistant message become ``tool_result`` blocks in ONE user
  message right after it (``is_error`` carried over, images kept inside the result);
  a user message that follows joins that same message after the results, because
  the API wants alternating roles and the results first;
* consecutive messages of the same role are merged into one;
* a thinking block goes back with its signature; one without a signature (cut off,
  or from another provider) is dropped, since the API would refuse it. Redacted
  thinking is kept as a redacted ``ThinkingContent`` holding the encrypted data and
  goes back as the ``redacted_thinking`` block it came as;
* empty text blocks are dropped (the API refuses them), and a user message left with
  no content says ``(empty message)``; a history that starts with an assistant
  message gets a ``(conversation start)`` user message first, because the API
  wants the user to open; tool-use ids are kept when
  they match ``[A-Za-z0-9_-]{1,64}`` and otherwise replaced by a stable substitute.

Streaming: ``content_block_*`` events by index (text, thinking and its signature,
tool-use input as ``partial_json`` fragments), usage from ``message_start`` and the
cumulative ``message_delta``, and the stop reason from ``message_delta``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random as _random
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import anthropic
from anthropic.types import RawMessageStreamEvent

from .._abort import AbortSignal
from .._errors import InvalidInputError
from .._log import library_logger
from .._messages import (
    AssistantMessage,
    ImageContent,
    Message,
    StopReason,
    TextContent,
    ThinkingContent,
    ToolCall,
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

__all__ = ["AnthropicModel", "project_messages", "project_tools"]

MAX_ID_LENGTH = 64
_STOP: dict[str, StopReason] = {
    "end_turn": StopReason.STOP,
    "stop_sequence": StopReason.STOP,
    # The server paused a long turn; the response so far is a normal answer.
    "pause_turn": StopReason.STOP,
    "tool_use": StopReason.TOOL_USE,
    "max_tokens": StopReason.LENGTH,
    "model_context_window_exceeded": StopReason.LENGTH,
    "refusal": StopReason.ERROR,
}


class _IncompleteStreamError(Exception):
    """The stream ended before ``message_stop``: the connection broke mid-response."""


_EMPTY = {"type": "text", "text": "(empty message)"}
_START = {"type": "text", "text": "(conversation start)"}


def _image(block: ImageContent) -> dict[str, Any]:
    return {
        "type": "image",
        "source": {"type": "base64", "media_type": block.mime_type, "data": block.data},
    }


def _media(content: Sequence[TextContent | ImageContent]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for block in content:
        if isinstance(block, TextContent):
            if block.text:
                out.append({"type": "text", "text": block.text})
        else:
            out.append(_image(block))
    return out


def _assistant_blocks(message: AssistantMessage) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for block in message.content:
        if isinstance(block, ThinkingContent):
            if block.redacted and block.signature:
                out.append({"type": "redacted_thinking", "data": block.signature})
            elif block.signature:
                out.append(
                    {"type": "thinking", "thinking": block.thinking, "signature": block.signature}
                )
        elif isinstance(block, TextContent):
            if block.text:
                out.append({"type": "text", "text": block.text})
        elif isinstance(block, ToolCall):
            out.append(
                {
                    "type": "tool_use",
                    "id": normalise_id(block.id, MAX_ID_LENGTH),
                    "name": block.name,
                    "input": thaw_json(block.arguments),
                }
            )
    return out


def project_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Our history as Messages API ``messages`` (see the module docstring)."""
    out: list[dict[str, Any]] = []
    for message in sendable_history(messages):
        if isinstance(message, UserMessage):
            # The API refuses empty content; the model should still see that a turn
            # of the person's passed.
            role, blocks = "user", _media(message.content) or [_EMPTY]
        elif isinstance(message, AssistantMessage):
            role, blocks = "assistant", _assistant_blocks(message)
        else:
            result: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": normalise_id(message.tool_call_id, MAX_ID_LENGTH),
                "content": _media(message.content) or [{"type": "text", "text": "(no output)"}],
            }
            if message.is_error:
                result["is_error"] = True
            role, blocks = "user", [result]
        if not blocks:
            continue
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    if out and out[0]["role"] == "assistant":
        out.insert(0, {"role": "user", "content": [_START]})  # the API wants a user first
    return out


def project_tools(tools: Sequence[ToolDefinition]) -> list[dict[str, Any]]:
    """Our tool definitions as Messages API ``tools``."""
    return [
        {"name": t.name, "description": t.description, "input_schema": t.schema_dict()}
        for t in tools
    ]


_CACHEABLE = frozenset({"text", "image", "tool_use", "tool_result"})


def _mark_cache_breakpoints(body: dict[str, Any]) -> None:
    """Mark two prompt-cache breakpoints: the end of the tools and system prompt
    (stable for the whole run) and the end of the last message (so the next turn,
    which only appends, reads everything before it from the cache). The API allows
    four; thinking blocks cannot carry one, so the last cacheable block is used."""
    ephemeral = {"type": "ephemeral"}
    if "system" in body:
        body["system"] = [{"type": "text", "text": body["system"], "cache_control": ephemeral}]
    elif body.get("tools"):
        body["tools"][-1]["cache_control"] = ephemeral
    if body["messages"]:
        for block in reversed(body["messages"][-1]["content"]):
            if block["type"] in _CACHEABLE:
                block["cache_control"] = ephemeral
                break


class AnthropicModel:
    """A streaming ``ModelClient`` for the Anthropic Messages API.

    The key comes from ``api_key`` or ``ANTHROPIC_API_KEY``. ``thinking`` is passed
    through as the request's ``thinking`` object (e.g. ``{"type": "enabled",
    "budget_tokens": 2048}``). ``prompt_cache=True`` marks cache breakpoints (see
    ``_mark_cache_breakpoints``), which an agent loop that resends a growing history
    each turn pays back from its second turn on. ``on_text`` receives text deltas as they arrive (a
    retried attempt streams its text again). ``sleep`` and ``random`` exist for tests;
    ``client`` replaces the SDK client entirely.
    """

    provider = "Anthropic"

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        system: str | None = None,
        max_tokens: int = 4096,
        temperature: float | None = None,
        thinking: Mapping[str, Any] | None = None,
        prompt_cache: bool = False,
        extra_body: Mapping[str, Any] | None = None,
        retry: RetryPolicy | None = None,
        timeout: float = 600.0,
        on_text: Callable[[str], None] | None = None,
        logger: Any = None,
        client: anthropic.AsyncAnthropic | None = None,
        sleep: Sleep = asyncio.sleep,
        random: Callable[[], float] = _random.random,
    ) -> None:
        if not isinstance(model, str) or not model:
            raise InvalidInputError("model must be a non-empty model name")
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise InvalidInputError("max_tokens must be a positive integer")
        key = api_key if api_key is not None else os.environ.get("ANTHROPIC_API_KEY")
        if not key and client is None:
            raise InvalidInputError("no Anthropic API key: set ANTHROPIC_API_KEY or pass api_key=")
        self.model = model
        self.system = system
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.thinking = dict(thinking) if thinking is not None else None
        self.prompt_cache = prompt_cache
        self.extra_body = dict(extra_body or {})
        self.retry = retry if retry is not None else RetryPolicy()
        self.on_text = on_text
        self.sleep = sleep
        self.random = random
        self._secrets = (key,) if key else ()
        self.log = logger if logger is not None else library_logger("statemachine.providers")
        self._client = client or anthropic.AsyncAnthropic(
            api_key=key,
            base_url=base_url,
            max_retries=0,
            timeout=timeout,
            _strict_response_validation=True,
        )

    def __repr__(self) -> str:
        # Never the key: reprs end up in logs and tracebacks.
        return f"AnthropicModel(model={self.model!r}, base_url={str(self._client.base_url)!r})"

    def request_body(
        self, messages: Sequence[Message], tools: Sequence[ToolDefinition]
    ) -> dict[str, Any]:
        """The keyword arguments of ``messages.create`` for this context."""
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "messages": project_messages(messages),
            "stream": True,
        }
        if self.system:
            body["system"] = self.system
        if tools:
            body["tools"] = project_tools(tools)
        if self.prompt_cache:
            _mark_cache_breakpoints(body)
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if self.thinking is not None:
            body["thinking"] = dict(self.thinking)
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
        if isinstance(exc, anthropic.APIStatusError):
            # A mid-stream ``error`` event arrives as a status error with the stream's
            # own status (200); only its body tells what it was.
            status = exc.status_code if exc.status_code >= 400 else None
            return classify(
                self.provider,
                status=status,
                headers=exc.response.headers,
                body=exc.body,
                message=exc.message,
                key_hint="ANTHROPIC_API_KEY",
                secrets=self._secrets,
            )
        if isinstance(exc, (anthropic.APIConnectionError, _IncompleteStreamError)):
            return connection_failure(self.provider, exc, self._secrets)
        if isinstance(exc, anthropic.APIResponseValidationError):
            return Failure(
                ProviderResponseError(
                    f"{self.provider} sent a response the SDK could not validate: "
                    f"{redact(validation_detail(exc), self._secrets)}"
                ),
                retryable=False,
            )
        if isinstance(exc, anthropic.APIError):
            return classify(
                self.provider,
                status=None,
                headers={},
                body=exc.body,
                message=exc.message,
                key_hint="ANTHROPIC_API_KEY",
                secrets=self._secrets,
            )
        return None

    async def _attempt(self, body: dict[str, Any], watch: AbortWatch) -> AssistantMessage:
        create = cast(Any, self._client.messages).create
        aborted, opened = await race_abort(watch, create(**body))
        if aborted or opened is None:
            return aborted_message("aborted before the response began")
        stream = cast("anthropic.AsyncStream[RawMessageStreamEvent]", opened)
        builder = MessageBuilder(on_text=self.on_text)
        state = _StreamState()

        async def consume() -> None:
            async for event in stream:
                state.apply(event, builder)
                if watch.signal.aborted:
                    return

        try:
            aborted, _ = await race_abort(watch, consume())
        finally:
            with contextlib.suppress(Exception):
                await stream.close()
        if aborted or watch.signal.aborted:
            return builder.aborted(state.usage())
        if not state.stopped:
            raise _IncompleteStreamError("the response stream ended before message_stop")
        reason = state.stop_reason or "end_turn"
        error = None
        if reason == "refusal":
            error = f"{self.provider} refused to continue the response (stop reason 'refusal')"
        return builder.finish(_STOP.get(reason, StopReason.STOP), state.usage(), error)


class _StreamState:
    """Stop reason and token counts as the stream reports them."""

    def __init__(self) -> None:
        self.stop_reason: str | None = None
        self.stopped = False
        self.counts = {"input": 0, "output": 0, "cache_read": 0, "cache_write": 0}
        self.seen_usage = False
        self.ignored: set[int] = set()  # indices of blocks we do not keep

    def _count(self, usage: Any) -> None:
        # message_delta carries cumulative counts; a field it omits keeps its value.
        self.seen_usage = True
        for ours, theirs in (
            ("input", "input_tokens"),
            ("output", "output_tokens"),
            ("cache_read", "cache_read_input_tokens"),
            ("cache_write", "cache_creation_input_tokens"),
        ):
            value = getattr(usage, theirs, None)
            if isinstance(value, int):
                self.counts[ours] = value

    def usage(self) -> Usage | None:
        if not self.seen_usage:
            return None
        c = self.counts
        return Usage(
            input=c["input"],
            output=c["output"],
            cache_read=c["cache_read"],
            cache_write=c["cache_write"],
            total_tokens=c["input"] + c["output"] + c["cache_read"] + c["cache_write"],
        )

    def apply(self, event: RawMessageStreamEvent, builder: MessageBuilder) -> None:
        if event.type == "message_start":
            self._count(event.message.usage)
        elif event.type == "content_block_start":
            block = event.content_block
            if block.type == "text":
                builder.add_text(builder.block(("block", event.index), "text"), block.text)
            elif block.type == "thinking":
                target = builder.block(("block", event.index), "thinking")
                target.text.append(block.thinking)
                target.signature = block.signature or None
            elif block.type == "redacted_thinking":
                target = builder.block(("block", event.index), "thinking")
                target.signature = block.data
                target.redacted = True
            elif block.type == "tool_use":
                target = builder.block(("block", event.index), "tool")
                target.call_id = block.id
                target.name = block.name
            else:
                # Server-side tool blocks are not ours to keep.
                self.ignored.add(event.index)
        elif event.type == "content_block_delta":
            delta = event.delta
            if event.index in self.ignored:
                return
            if delta.type == "text_delta":
                builder.add_text(builder.block(("block", event.index), "text"), delta.text)
            elif delta.type == "thinking_delta":
                builder.block(("block", event.index), "thinking").text.append(delta.thinking)
            elif delta.type == "signature_delta":
                target = builder.block(("block", event.index), "thinking")
                target.signature = (target.signature or "") + delta.signature
            elif delta.type == "input_json_delta":
                builder.block(("block", event.index), "tool").text.append(delta.partial_json)
        elif event.type == "message_delta":
            if event.delta.stop_reason is not None:
                self.stop_reason = event.delta.stop_reason
            self._count(event.usage)
        elif event.type == "message_stop":
            self.stopped = True

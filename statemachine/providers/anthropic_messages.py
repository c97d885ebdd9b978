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
  or from another provider), or with the tagged signature the Gemini and OpenAI
  Responses adapters write, is dropped, since the API would refuse it. Redacted
  thinking is kept as a redacted ``ThinkingContent`` holding the encrypted data and
  goes back as the ``redacted_thinking`` block it came as;
* empty text blocks are dropped (the API refuses them), and a user message left with
  no content says ``(empty message)``; a history that starts with an assistant
  message gets a ``(conversation start)`` user message first, because the API
  wants the user to open; tool-use ids are kept when
  they match ``[A-Za-z0-9_-]{1,64}`` and otherwise replaced by a stable substitute.

Streaming: ``content_block_*`` events by index (text, thinking and its signature,
tool-use input as ``partial_json`` fragments), usage from ``message_start`` and the
cumulative ``message_delta``, and the stop reason from ``message_delta``. With
``stream=False`` the whole message arrives at once and is read the same way. The
events arrive as raw JSON and each is validated with the SDK's models: an event,
block or delta of a type newer than the SDK is skipped with a debug log (and so are
the later events of a block it started), where the SDK's own stream would fail the
call; any other mismatch is ``ProviderResponseError``. Each text block stays a
``TextContent`` of its own (a model that writes, searches and writes again has two
texts, not one run together). Token counts are read from ``usage`` alone: its
other members (``server_tool_use``, ``cache_creation``...) are dropped before
validation, since their shape changes between API versions and the SDK's.

Server-side tool blocks (``server_tool_use``, ``mcp_tool_use`` and every
``*_tool_result``, e.g. from a ``web_search`` tool passed in ``extra_body``) are
refused by name with ``ProviderResponseError``: our history has no block that could
carry them back, and dropping them would send the next turn a conversation the
model did not have.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Unpack, cast

import pydantic

from statemachine.providers._errors import missing_extra

try:
    import anthropic
except ImportError as exc:  # pragma: no cover - exercised by a test that hides the SDK
    raise missing_extra("anthropic") from exc

from statemachine.agent.model import CallOptions
from statemachine.core.checks import positive_int
from statemachine.core.messages import (
    AssistantMessage,
    ImageContent,
    Message,
    StopReason,
    TextContent,
    ThinkingContent,
    ToolCall,
    ToolResultMessage,
    Usage,
    thaw_json,
)
from statemachine.core.tools import ToolDefinition
from statemachine.errors import InvalidInputError
from statemachine.providers._adapter import (
    AdapterOptions,
    IncompleteStreamError,
    ModelAdapter,
    ResponseReader,
    UnreadableResponseError,
)
from statemachine.providers._native import checked_flag
from statemachine.providers._projection import (
    alternating_turns,
    foreign_signature,
    normalise_id,
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


def _image(block: ImageContent) -> dict[str, Any]:
    return {
        "type": "image",
        "source": {"type": "base64", "media_type": block.mime_type, "data": block.data},
    }


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _assistant_blocks(message: AssistantMessage) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for block in message.content:
        if isinstance(block, ThinkingContent):
            if block.signature and foreign_signature(block.signature):
                continue  # Gemini's or OpenAI's reasoning: not a Claude signature
            if block.redacted and block.signature:
                out.append({"type": "redacted_thinking", "data": block.signature})
            elif block.signature:
                out.append(
                    {"type": "thinking", "thinking": block.thinking, "signature": block.signature}
                )
        elif isinstance(block, TextContent):
            if block.text:
                out.append(_text(block.text))
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


def _tool_result(message: ToolResultMessage, content: list[dict[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {
        "type": "tool_result",
        "tool_use_id": normalise_id(message.tool_call_id, MAX_ID_LENGTH),
        "content": content,
    }
    if message.is_error:
        result["is_error"] = True
    return result


def project_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Our history as Messages API ``messages`` (see the module docstring)."""
    return alternating_turns(messages, _text, _image, _assistant_blocks, _tool_result)


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


class _StreamState(ResponseReader):
    """The message, stop reason and token counts as the stream reports them."""

    def __init__(self, on_text: Callable[[str], None] | None, provider: str) -> None:
        super().__init__(on_text, provider)
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

    def result(self) -> AssistantMessage:
        if not self.stopped:
            raise IncompleteStreamError("the response stream ended before message_stop")
        self.require_unique_call_ids("tool_use id")
        reason = self.stop_reason or "end_turn"
        error = None
        if reason == "refusal":
            error = f"{self.provider} refused to continue the response (stop reason 'refusal')"
        return self.builder.finish(_STOP.get(reason, StopReason.STOP), self.usage(), error)

    def apply(self, item: Any) -> None:
        item = _counts_only(item)
        if isinstance(item, Mapping) and item.get("type") == "message":
            self._whole(item)  # stream=False: the whole message
            return
        event = _known(_EVENT, item)
        if event is None:
            self._unknown(item)
            return
        builder = self.builder
        if event.type == "message_start":
            self.note_response(event.message.id, event.message.model)
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
                _refuse_server_block(block.type, getattr(block, "name", None))
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
                builder.add_arguments(
                    builder.block(("block", event.index), "tool"), delta.partial_json
                )
        elif event.type == "message_delta":
            if event.delta.stop_reason is not None:
                self.stop_reason = event.delta.stop_reason
            self._count(event.usage)
        elif event.type == "message_stop":
            self.stopped = True

    def _unknown(self, item: Any) -> None:
        """An event, block or delta of a type the SDK does not know: skipped, and so
        is every later event of a block it started."""
        kind = item.get("type") if isinstance(item, Mapping) else None
        block = item.get("content_block") if isinstance(item, Mapping) else None
        if isinstance(block, Mapping):
            _refuse_server_block(block.get("type"), block.get("name"))
        if kind == "content_block_start" and isinstance(item.get("index"), int):
            self.ignored.add(item["index"])
        detail = block.get("type") if isinstance(block, Mapping) else ""
        self.skipped(f"event:{kind}", str(detail or ""))

    def _whole(self, raw: Mapping[str, Any]) -> None:
        message = _MESSAGE_HEAD.validate_python(raw)
        self.note_response(raw.get("id"), raw.get("model"))
        builder = self.builder
        for index, item in enumerate(raw.get("content") or ()):
            if isinstance(item, Mapping):
                _refuse_server_block(item.get("type"), item.get("name"))
            block = _known(_BLOCK, item)
            if block is None:
                self.skipped("block", str(item.get("type") if isinstance(item, Mapping) else ""))
                continue
            if block.type == "text":
                builder.add_text(builder.block(("block", index), "text"), block.text)
            elif block.type == "thinking":
                target = builder.block(("block", index), "thinking")
                target.text.append(block.thinking)
                target.signature = block.signature or None
            elif block.type == "redacted_thinking":
                target = builder.block(("block", index), "thinking")
                target.signature, target.redacted = block.data, True
            elif block.type == "tool_use":
                target = builder.block(("block", index), "tool")
                target.call_id, target.name = block.id, block.name
                target.text.append(json.dumps(block.input))
            else:
                _refuse_server_block(block.type, getattr(block, "name", None))
                self.skipped("block", block.type)
        self._count(message.usage)
        self.stop_reason = message.stop_reason
        self.stopped = True


_COUNTS = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
)


def _counts_only(item: Any) -> Any:
    """``item`` (an event or a whole message) with its ``usage`` cut down to the four
    token counts we read; everything else in it is dropped before validation."""
    if not isinstance(item, Mapping):
        return item
    holder = item.get("message") if item.get("type") == "message_start" else item
    if not isinstance(holder, Mapping) or not isinstance(holder.get("usage"), Mapping):
        return item
    usage = {k: v for k, v in holder["usage"].items() if k in _COUNTS}
    if holder is item:
        return {**item, "usage": usage}
    return {**item, "message": {**holder, "usage": usage}}


def _is_server_block(kind: object) -> bool:
    return isinstance(kind, str) and (
        kind in ("server_tool_use", "mcp_tool_use") or kind.endswith("_tool_result")
    )


def _refuse_server_block(kind: object, name: object) -> None:
    """Raise if ``kind`` is a server-side tool block: see the module docstring."""
    if not _is_server_block(kind):
        return
    named = f" of the tool {name!r}" if isinstance(name, str) and name else ""
    raise UnreadableResponseError(
        f"the response holds a {kind!r} block{named}: a server-side tool, whose blocks "
        "this adapter cannot carry back to the API. Leave server tools out of the request "
        "(extra_body) or give the model a tool of your own instead"
    )


def _tags(annotation: Any) -> frozenset[str]:
    """The ``type`` values of a union of the SDK's models (its discriminator)."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    members = typing.get_args(annotation) or (annotation,)
    tags: set[str] = set()
    for member in members:
        field = getattr(member, "model_fields", {}).get("type")
        if field is not None:
            tags.update(typing.get_args(field.annotation))
    return frozenset(tags)


_EVENT_TYPES = _tags(anthropic.types.RawMessageStreamEvent)
_BLOCK_TYPES = _tags(anthropic.types.ContentBlock)
_START_TYPES = _tags(
    anthropic.types.RawContentBlockStartEvent.model_fields["content_block"].annotation
)
_DELTA_TYPES = _tags(anthropic.types.RawContentBlockDeltaEvent.model_fields["delta"].annotation)


def _unknown_type(item: Any) -> bool:
    """Whether ``item`` (an event or a block), or the block or delta it carries, is of
    a type this SDK does not know."""
    if not isinstance(item, Mapping):
        return False
    kind = item.get("type")
    if kind in _EVENT_TYPES:
        inner, known = {
            "content_block_start": ("content_block", _START_TYPES),
            "content_block_delta": ("delta", _DELTA_TYPES),
        }.get(kind, ("", frozenset()))
        nested = item.get(inner) if inner else None
        return isinstance(nested, Mapping) and nested.get("type") not in known
    return kind not in _BLOCK_TYPES


def _known(adapter: pydantic.TypeAdapter[Any], item: Any) -> Any:
    """``item`` validated by ``adapter``; ``None`` when its type (or the type of the
    block or delta it carries) is unknown to the SDK. Any other mismatch raises
    ``ValidationError``."""
    if _unknown_type(item):
        return None
    return adapter.validate_python(item)


class _MessageHead(pydantic.BaseModel):
    """What a whole message carries besides its content blocks."""

    usage: anthropic.types.Usage
    stop_reason: str | None = None


_EVENT: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(anthropic.types.RawMessageStreamEvent)
_BLOCK: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(anthropic.types.ContentBlock)
_MESSAGE_HEAD: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(_MessageHead)


class AnthropicModel(ModelAdapter):
    """A streaming ``ModelClient`` for the Anthropic Messages API.

    The key comes from ``api_key`` or ``ANTHROPIC_API_KEY``. The options shared with
    ``OpenAIChatModel`` (``system``, ``temperature``, ``extra_body``, ``retry``, the
    limits, ``on_text``, ``logger``) are described in ``AdapterOptions``; ``system``
    is sent as the request's ``system`` field. ``thinking`` is passed through as the
    request's ``thinking`` object (e.g. ``{"type": "enabled", "budget_tokens":
    2048}``). ``stream=False`` asks for the whole message at once (for proxies that
    do not stream). ``prompt_cache=True`` marks cache breakpoints (see
    ``_mark_cache_breakpoints``), which an agent loop that resends a growing history
    each turn pays back from its second turn on. ``native_output=True`` sends a run's
    ``output_type`` as ``output_config.format`` ``json_schema`` (structured outputs,
    which only recent Claude models accept) instead of offering the final-result
    tool; it is off by default, so ``output_mode="auto"`` uses the tool.

    Limits per attempt (see ``_adapter``): ``timeout`` 600 s for the whole attempt,
    response stream included; ``idle_timeout`` 300 s between stream events (the
    SDK drops ``ping`` events, so they do not count); ``max_response_bytes`` 32 MiB.
    Exceeding one raises ``ProviderLimitError`` naming the URL, the model and the
    limit. Retries follow ``retry`` (``RetryPolicy()``: 4 attempts, at most 120 s of
    waiting in all); a refused connection fails at once. ``sleep`` and ``random``
    exist for tests; ``client`` replaces the SDK client entirely (and with it the size
    limit, which lives in the HTTP client the adapter builds).
    """

    provider = "Anthropic"
    key_env = "ANTHROPIC_API_KEY"
    sdk: ClassVar[Any] = anthropic
    reader = _StreamState

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        max_tokens: int = 4096,
        thinking: Mapping[str, Any] | None = None,
        prompt_cache: bool = False,
        stream: bool = True,
        client: anthropic.AsyncAnthropic | None = None,
        native_output: bool = False,
        **options: Unpack[AdapterOptions],
    ) -> None:
        key = self._setup(model, api_key, options)
        self.native_output = checked_flag(native_output)
        positive_int("max_tokens", max_tokens)
        if not key and client is None and self.needs_key:
            raise InvalidInputError("no Anthropic API key: set ANTHROPIC_API_KEY or pass api_key=")
        self.max_tokens = max_tokens
        self.thinking = dict(thinking) if thinking is not None else None
        self.prompt_cache = prompt_cache
        self.stream = stream
        self._client = client or self._new_client(key, base_url)

    needs_key = True  # False for Anthropic on Vertex AI, which authenticates with Google

    def request_body(
        self, messages: Sequence[Message], tools: Sequence[ToolDefinition]
    ) -> dict[str, Any]:
        """The keyword arguments of ``messages.create`` for this context."""
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "messages": project_messages(messages),
            "stream": self.stream,
        }
        if self.system:
            body["system"] = self.system
        if tools:
            body["tools"] = project_tools(tools)
        if self.prompt_cache:
            _mark_cache_breakpoints(body)
        if self.thinking is not None:
            body["thinking"] = dict(self.thinking)
        body = self._shared_fields(body)
        if "temperature" in body:  # the SDK's create() no longer names it: a body field
            body["extra_body"] = {
                **body.get("extra_body", {}),
                "temperature": body.pop("temperature"),
            }
        return body

    accepts_instructions = True
    supported_settings = frozenset({"temperature", "max_tokens", "top_p", "stop"})

    def apply_options(self, body: dict[str, Any], options: CallOptions) -> dict[str, Any]:
        """The run's instructions as the ``system`` field (instead of the adapter's
        ``system``), and its settings as request fields (``stop`` is
        ``stop_sequences``; ``temperature`` and ``top_p`` go in the body as they are)."""
        if options.output_schema is not None:
            body["output_config"] = {
                **body.get("output_config", {}),
                "format": {"type": "json_schema", "schema": dict(options.output_schema)},
            }
        if options.instructions is not None:
            body["system"] = options.instructions
            if self.prompt_cache:
                _mark_cache_breakpoints(body)
        settings = options.settings.set_fields()
        if "stop" in settings:
            body["stop_sequences"] = list(settings.pop("stop"))
        if "max_tokens" in settings:
            body["max_tokens"] = settings.pop("max_tokens")
        if settings:
            # Sampling fields the SDK's create() no longer names: sent as body fields.
            body["extra_body"] = {**body.get("extra_body", {}), **settings}
        return body

    async def _open(self, body: dict[str, Any]) -> Any:
        # Raw JSON events, each validated by the reader: an event or block type newer
        # than the SDK is skipped there, where the SDK's own stream would reject it.
        payload = {k: v for k, v in body.items() if k != "extra_body"}
        payload.update(body.get("extra_body") or {})
        client = cast(Any, self._client)
        if not body["stream"]:
            return await client.post("/v1/messages", body=payload, cast_to=object)
        return await client.post(
            "/v1/messages",
            body=payload,
            cast_to=object,
            stream=True,
            stream_cls=anthropic.AsyncStream[object],
        )

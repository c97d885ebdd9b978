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
  ``[A-Za-z0-9_-]``) and otherwise replaced by a stable substitute. A call that
  arrives with an empty id (Gemini's compatible endpoint sends those), or with an
  id an earlier call of the same response has, gets a new unique ``call_`` id.

Streaming: text deltas, tool-call fragments keyed by ``index`` (id and name arrive
once, arguments in pieces), a final usage chunk (``stream_options.include_usage``),
and ``reasoning_content`` that some compatible servers send, kept as thinking. With
``stream=False`` the whole completion arrives at once and is read the same way.

Limits (per attempt; see ``_adapter``): ``timeout=600`` s for the whole attempt,
``idle_timeout=300`` s between stream events, ``max_response_bytes`` 32 MiB. Invalid
JSON or a malformed chunk raises ``ProviderResponseError``; a refused connection
raises ``ProviderUnavailableError`` at once, naming the URL and the model.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Unpack, cast

from statemachine.providers._errors import missing_extra

try:
    import openai
except ImportError as exc:  # pragma: no cover - exercised by a test that hides the SDK
    raise missing_extra("openai") from exc

from openai.types.chat import ChatCompletion

from statemachine.agent.model import CallOptions
from statemachine.core.messages import (
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
from statemachine.core.tools import ToolDefinition
from statemachine.errors import InvalidInputError
from statemachine.providers._adapter import (
    AdapterOptions,
    IncompleteStreamError,
    ModelAdapter,
    ResponseReader,
)
from statemachine.providers._errors import Failure, ProviderRequestError
from statemachine.providers._native import checked_flag, openai_json_schema
from statemachine.providers._projection import normalise_id, sendable_history

__all__ = ["OpenAIChatModel", "project_messages", "project_tools"]

MAX_ID_LENGTH = 40
_FINISH: dict[str, StopReason] = {
    "stop": StopReason.STOP,
    "tool_calls": StopReason.TOOL_USE,
    "function_call": StopReason.TOOL_USE,
    "length": StopReason.LENGTH,
    "content_filter": StopReason.ERROR,
}


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


def _assistant_entry(message: AssistantMessage) -> dict[str, Any] | None:
    """An assistant message as a Chat Completions entry; ``None`` if it has neither
    text nor calls (e.g. a response that held only thinking)."""
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
        return None
    return entry


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
            entry = _assistant_entry(message)
            if entry is not None:
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


class _ChunkReader(ResponseReader):
    """Reads the chunks of a stream, or one whole completion (``stream=False``)."""

    def __init__(self, on_text: Callable[[str], None] | None, provider: str) -> None:
        super().__init__(on_text, provider)
        self.finish: str | None = None
        self.raw_usage: Any = None

    def usage(self) -> Usage | None:
        return _usage(self.raw_usage)

    def result(self) -> AssistantMessage:
        if self.finish is None:
            raise IncompleteStreamError("the response ended before a finish reason")
        error = None
        if self.finish == "content_filter":
            error = f"{self.provider}'s content filter stopped the response"
        # Some compatible servers (Gemini's) send calls with empty ids.
        self.builder.unique_call_ids()
        return self.builder.finish(_FINISH.get(self.finish, StopReason.STOP), self.usage(), error)

    def apply(self, item: Any) -> None:
        self.note_response(item.id, item.model)
        if item.usage is not None:
            self.raw_usage = item.usage
        whole = isinstance(item, ChatCompletion)
        for choice in item.choices:
            if choice.index != 0:
                continue  # we ask for one choice; ignore any other
            part = choice.message if whole else choice.delta
            extra = part.model_extra or {}
            reasoning = extra.get("reasoning_content") or extra.get("reasoning")
            if isinstance(reasoning, str) and reasoning:
                self.builder.add_text(self.builder.block(("thinking", 0), "thinking"), reasoning)
            if part.content:
                self.builder.append_text(part.content)
            if part.refusal:
                self.builder.append_text(part.refusal)
            if whole:
                self._whole_calls(choice.message.tool_calls or ())
            else:
                self._call_fragments(choice.delta.tool_calls or ())
            if choice.finish_reason is not None:
                self.finish = choice.finish_reason

    def _whole_calls(self, calls: Sequence[Any]) -> None:
        for index, call in enumerate(calls):
            function = getattr(call, "function", None)
            if function is None:
                continue  # a custom (non-function) tool call: not one of ours
            block = self.builder.block(("tool", index), "tool")
            block.call_id, block.name = call.id, function.name
            block.text.append(function.arguments)

    def _call_fragments(self, fragments: Sequence[Any]) -> None:
        builder = self.builder
        for fragment in fragments:
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
                    builder.add_arguments(block, function.arguments)


def _is_adapter_system(entry: dict[str, Any], system: str | None) -> bool:
    return bool(system) and entry.get("role") == "system" and entry.get("content") == system


_MENTIONS_STREAMING = re.compile(r"stream", re.IGNORECASE)


class OpenAIChatModel(ModelAdapter):
    """A ``ModelClient`` for OpenAI Chat Completions and compatible servers.

    The key comes from ``api_key`` or ``OPENAI_API_KEY``; with a ``base_url`` and no
    key (a local server) a placeholder is sent. The options shared with
    ``AnthropicModel`` (``system``, ``temperature``, ``extra_body``, ``retry``, the
    limits, ``on_text``, ``logger``) are described in ``AdapterOptions``; ``system``
    is sent as the first message, with the ``system`` role.

    ``stream=False`` asks for the whole response at once, for servers that do not
    stream; a server that answers a streaming request with plain JSON, or refuses
    one with an error that mentions streaming, gets an error that says to pass it.
    A run's ``output_type`` is sent as ``response_format`` ``json_schema`` (native
    structured output); ``native_output=False`` is for a compatible server without
    it, whose runs then get the final-result tool.

    Limits per attempt (see ``_adapter``): ``timeout`` 600 s for the whole attempt,
    response stream included; ``idle_timeout`` 300 s between stream events (streaming
    only); ``max_response_bytes`` 32 MiB. Exceeding one raises ``ProviderLimitError``
    naming the URL, the model and the limit. Retries follow ``retry``
    (``RetryPolicy()``: 4 attempts, at most 120 s of waiting in all); a refused
    connection fails at once. ``sleep`` and ``random`` exist for tests; ``client``
    replaces the SDK client entirely (and with it the size limit, which lives in the
    HTTP client the adapter builds).
    """

    provider = "OpenAI"
    key_env = "OPENAI_API_KEY"
    sdk: ClassVar[Any] = openai
    reader = _ChunkReader

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        max_tokens: int | None = None,
        stream: bool = True,
        stream_usage: bool = True,
        client: openai.AsyncOpenAI | None = None,
        native_output: bool = True,
        **options: Unpack[AdapterOptions],
    ) -> None:
        key = self._setup(model, api_key, options)
        self.native_output = checked_flag(native_output)
        if not key:
            if base_url is None and client is None:
                raise InvalidInputError(
                    "no OpenAI API key: set OPENAI_API_KEY or pass api_key= "
                    "(a local server given by base_url needs none)"
                )
            key = "no-key"  # local servers ignore it, but the SDK requires one
        self.max_tokens = max_tokens
        self.stream = stream
        self.stream_usage = stream_usage
        self._client = client or openai.AsyncOpenAI(api_key=key, **self._sdk_options(base_url))

    def request_body(
        self, messages: Sequence[Message], tools: Sequence[ToolDefinition]
    ) -> dict[str, Any]:
        """The keyword arguments of ``chat.completions.create`` for this context."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": project_messages(messages, self.system),
            "stream": self.stream,
        }
        if self.stream and self.stream_usage:
            body["stream_options"] = {"include_usage": True}
        if tools:
            body["tools"] = project_tools(tools)
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        return self._shared_fields(body)

    accepts_instructions = True
    supported_settings = frozenset(
        {
            "temperature",
            "max_tokens",
            "top_p",
            "stop",
            "seed",
            "presence_penalty",
            "frequency_penalty",
            "parallel_tool_calls",
            "reasoning_effort",
            # the SDK's own keywords of create(), sent as given
            "timeout",
            "extra_headers",
            "extra_body",
        }
    )

    def apply_options(self, body: dict[str, Any], options: CallOptions) -> dict[str, Any]:
        """The run's instructions as the first ``system`` message (instead of the
        adapter's ``system``), its settings as request fields, and its output schema
        as ``response_format`` ``json_schema`` (native structured output)."""
        if options.output_schema is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": openai_json_schema(options.output_schema),
            }
        if options.instructions is not None:
            messages = [m for m in body["messages"] if not _is_adapter_system(m, self.system)]
            body["messages"] = [{"role": "system", "content": options.instructions}, *messages]
        body.update(options.settings.set_fields())
        if "stop" in body:
            body["stop"] = list(body["stop"])
        if "tools" not in body:  # the API refuses parallel_tool_calls without tools
            body.pop("parallel_tool_calls", None)
        return body

    async def _open(self, body: dict[str, Any]) -> Any:
        opened = await cast(Any, self._client.chat.completions).create(**body)
        if not body["stream"]:
            return opened
        content_type = str(opened.response.headers.get("content-type", "")).lower()
        if "json" in content_type:
            # The server ignored "stream": true and sent one JSON document.
            await opened.close()
            raise ProviderRequestError(
                f"{self.where} answered a streaming request with {content_type!r} "
                "instead of an event stream: the server does not stream. Pass "
                "stream=False to OpenAIChatModel."
            )
        return opened

    def _classify(self, exc: Exception) -> Failure | None:
        failure = super()._classify(exc)
        if (
            failure is not None
            and self.stream
            and type(failure.error) is ProviderRequestError
            and _MENTIONS_STREAMING.search(str(getattr(exc, "message", "")))
        ):
            hint = (
                " If the server does not support streaming, pass stream=False to OpenAIChatModel."
            )
            return Failure(ProviderRequestError(f"{failure.error}{hint}"), retryable=False)
        return failure

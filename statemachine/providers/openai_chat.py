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
  text); thinking is not sent back (Chat Completions has no input for it), unless
  ``reasoning_field`` names the field a server takes it in (DeepSeek's
  ``reasoning_content``, which its thinking mode needs back between tool calls);
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

Compatible servers are read tolerantly. Responses are validated (strictly) against
the adapter's own models of what it reads (``_Completion``, ``_Chunk``), not the
SDK's: a field those do not name is kept in ``model_extra`` and otherwise ignored,
and a value the SDK's types would refuse where we read none (Groq's
``"service_tier": "on_demand"``, Azure's prompt-filter chunk with ``"object": ""``)
passes. A chunk with no choices (Azure's filter annotations, the usage chunk) adds
nothing but its usage; Groq's streamed usage (``x_groq.usage``) is read as usage, and a
``content`` given as a list of parts (Mistral's reasoning models) as its text and
thinking parts. What we do read is checked: text is text, a call's name and
arguments are text, a whole completion has a finish reason. A tool call of a type
other than ``function`` (``"custom"``: free-form input for a tool this library
never declares) is refused by name with ``ProviderResponseError``, as the Responses
adapter refuses the same call: running it is impossible and dropping it would end
the run quietly.

Limits (per attempt; see ``_adapter``): ``timeout=600`` s for the whole attempt,
``idle_timeout=300`` s between stream events, ``max_response_bytes`` 32 MiB. Invalid
JSON or a malformed chunk raises ``ProviderResponseError``; a refused connection
raises ``ProviderUnavailableError`` at once, naming the URL and the model.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, ClassVar, Unpack, cast

from statemachine.providers._errors import missing_extra

try:
    import openai
except ImportError as exc:  # pragma: no cover - exercised by a test that hides the SDK
    raise missing_extra("openai") from exc

import pydantic

from statemachine.agent.model import CallOptions
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
    UserMessage,
    thaw_json,
)
from statemachine.core.tools import ToolDefinition
from statemachine.errors import InvalidInputError, ProviderRequestError
from statemachine.providers._adapter import (
    AdapterOptions,
    IncompleteStreamError,
    ModelAdapter,
    ResponseReader,
    UnreadableResponseError,
)
from statemachine.providers._errors import Failure
from statemachine.providers._native import checked_flag, openai_json_schema
from statemachine.providers._projection import function_tools as project_tools
from statemachine.providers._projection import media_parts, normalise_id, sendable_history

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
    return media_parts(
        content,
        lambda text: {"type": "text", "text": text},
        lambda image: {"type": "image_url", "image_url": {"url": _data_url(image)}},
    )


def _assistant_entry(
    message: AssistantMessage, reasoning_field: str | None = None
) -> dict[str, Any] | None:
    """An assistant message as a Chat Completions entry; ``None`` if it has neither
    text nor calls (e.g. a response that held only thinking). With a
    ``reasoning_field``, its thinking goes back in that field."""
    entry: dict[str, Any] = {"role": "assistant", "content": message.text or None}
    thinking = "".join(
        b.thinking for b in message.content if isinstance(b, ThinkingContent) and not b.redacted
    )
    if reasoning_field and thinking:
        entry[reasoning_field] = thinking
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
    messages: Sequence[Message], system: str | None = None, reasoning_field: str | None = None
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
            entry = _assistant_entry(message, reasoning_field)
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


# -- what we read of a response ------------------------------------------------------
# The SDK's BaseModel keeps unknown fields (model_extra); each model names only what
# the reader uses, so any other field or value a compatible server sends passes.


class _Function(openai.BaseModel):
    name: str | None = None
    arguments: str | None = None


class _Call(openai.BaseModel):
    index: int = 0  # streamed fragments only
    id: str | None = None
    type: str | None = None
    function: _Function | None = None


class _ContentChunk(openai.BaseModel):
    """A part of a ``content`` list: Mistral's reasoning models send ``text`` parts
    and ``thinking`` parts (whose ``thinking`` is a list of ``text`` parts)."""

    type: str
    text: str | None = None
    thinking: list[_ContentChunk] | None = None


class _Part(openai.BaseModel):
    """A whole message or a streamed delta (``reasoning_content`` in ``model_extra``)."""

    content: str | list[_ContentChunk] | None = None
    refusal: str | None = None
    tool_calls: list[_Call] | None = None


class _PromptDetails(openai.BaseModel):
    cached_tokens: int | None = None
    cache_write_tokens: int | None = None


class _CompletionDetails(openai.BaseModel):
    reasoning_tokens: int | None = None


class _Usage(openai.BaseModel):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None
    prompt_tokens_details: _PromptDetails | None = None
    completion_tokens_details: _CompletionDetails | None = None


class _ChunkChoice(openai.BaseModel):
    index: int = 0
    delta: _Part | None = None  # Azure's content-filter annotations have none
    finish_reason: str | None = None


class _Groq(openai.BaseModel):
    usage: _Usage | None = None


class _Chunk(openai.BaseModel):
    id: str | None = None
    model: str | None = None
    choices: list[_ChunkChoice] = pydantic.Field(default_factory=list)
    usage: _Usage | None = None
    x_groq: _Groq | None = None  # Groq streams its usage here, in the last chunk


class _Choice(openai.BaseModel):
    index: int = 0
    message: _Part
    finish_reason: str


class _Completion(openai.BaseModel):
    id: str | None = None
    model: str | None = None
    choices: list[_Choice]
    usage: _Usage | None = None


def _refuse_other_call(call: _Call) -> None:
    """A call of a type other than ``function``: see the module docstring. (Streamed
    fragments after the first carry no type.)"""
    kind = call.type
    if kind is None or kind == "function":
        return
    inner = (call.model_extra or {}).get(kind)
    name = inner.get("name") if isinstance(inner, dict) else None
    named = f" of the tool {name!r}" if isinstance(name, str) and name else ""
    raise UnreadableResponseError(
        f"the response holds a tool call of type {kind!r}{named}, a call of a kind this "
        "adapter cannot run or carry back (only function tools are sent)"
    )


class _ChunkReader(ResponseReader):
    """Reads the chunks of a stream, or one whole completion (``stream=False``)."""

    def __init__(self, on_text: Callable[[str], None] | None, provider: str) -> None:
        super().__init__(on_text, provider)
        self.finish: str | None = None
        self.raw_usage: Any = None

    def usage(self) -> Usage | None:
        return _usage(self.raw_usage)

    def reasoning_tokens(self) -> int | None:
        details = getattr(self.raw_usage, "completion_tokens_details", None)
        count = getattr(details, "reasoning_tokens", None)
        return count if isinstance(count, int) and count > 0 else None

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
        elif isinstance(item, _Chunk) and item.x_groq is not None and item.x_groq.usage:
            self.raw_usage = item.x_groq.usage
        whole = isinstance(item, _Completion)
        for choice in item.choices:
            if choice.index != 0:
                continue  # we ask for one choice; ignore any other
            part = choice.message if whole else choice.delta
            if part is None:
                # A chunk that only annotates (Azure's content filter) may still end
                # the response.
                if choice.finish_reason is not None:
                    self.finish = choice.finish_reason
                continue
            for call in part.tool_calls or ():
                _refuse_other_call(call)
            extra = part.model_extra or {}
            reasoning = extra.get("reasoning_content") or extra.get("reasoning")
            if isinstance(reasoning, str) and reasoning:
                self.builder.add_text(self.builder.block(("thinking", 0), "thinking"), reasoning)
            if isinstance(part.content, list):
                self._content_chunks(part.content)
            elif part.content:
                self.builder.append_text(part.content)
            if part.refusal:
                self.builder.append_text(part.refusal)
            if whole:
                self._whole_calls(part.tool_calls or ())
            else:
                self._call_fragments(part.tool_calls or ())
            if choice.finish_reason is not None:
                self.finish = choice.finish_reason

    def _content_chunks(self, chunks: Sequence[_ContentChunk]) -> None:
        for chunk in chunks:
            if chunk.type == "thinking":
                thinking = "".join(t.text or "" for t in chunk.thinking or () if t.type == "text")
                if thinking:
                    self.builder.add_text(self.builder.block(("thinking", 0), "thinking"), thinking)
            elif chunk.type == "text" and chunk.text:
                self.builder.append_text(chunk.text)
            else:
                self.skipped("content", chunk.type)

    def _whole_calls(self, calls: Sequence[Any]) -> None:
        for index, call in enumerate(calls):
            function = call.function
            if function is None or function.name is None:
                raise UnreadableResponseError("a tool call of the completion has no function name")
            block = self.builder.block(("tool", index), "tool")
            block.call_id, block.name = call.id or "", function.name or ""
            block.text.append(function.arguments or "")

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


# Settings that are not body fields: extra_body merges into it, the rest are options.
_REQUEST_OPTIONS = {"extra_body": "", "timeout": "timeout", "extra_headers": "headers"}


class OpenAIChatModel(ModelAdapter):
    """A ``ModelClient`` for OpenAI Chat Completions and compatible servers.

    The key comes from ``api_key`` or ``OPENAI_API_KEY``; with a ``base_url`` and no
    key (a local server) a placeholder is sent. The options shared with
    ``AnthropicModel`` (``system``, ``temperature``, ``extra_body``, ``retry``, the
    limits, ``on_text``, ``logger``) are described in ``AdapterOptions``; ``system``
    is sent as the first message, with the ``system`` role.

    ``reasoning_field`` [None]: the assistant-message field that carries thinking
    back to a server that takes it (``"reasoning_content"`` for DeepSeek, which the
    ``deepseek:`` prefix sets); by default thinking is not sent back.

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
    # A compatible service's gen_ai.provider.name (None: a tracer takes "openai").
    provider_name: str | None = None
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
        reasoning_field: str | None = None,
        **options: Unpack[AdapterOptions],
    ) -> None:
        key = self._setup(model, api_key, options)
        if reasoning_field is not None and not (
            isinstance(reasoning_field, str) and reasoning_field.isidentifier()
        ):
            raise InvalidInputError("reasoning_field must be a field name such as 'reasoning'")
        self.reasoning_field = reasoning_field
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
        self._client = client or self._new_client(key, base_url)

    def request_body(
        self, messages: Sequence[Message], tools: Sequence[ToolDefinition]
    ) -> dict[str, Any]:
        """The keyword arguments of ``chat.completions.create`` for this context."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": project_messages(messages, self.system, self.reasoning_field),
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
        {"temperature", "max_tokens", "top_p", "stop", "seed", "presence_penalty"}
        | {"frequency_penalty", "parallel_tool_calls", "reasoning_effort", "extra_body"}
        | {"timeout", "extra_headers"}  # sent as the request's options, not its body
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
        # Posted with our own response models (see the module docstring) instead of
        # chat.completions.create, whose models refuse what compatible servers send.
        payload = {k: v for k, v in body.items() if k not in _REQUEST_OPTIONS}
        payload.update(body.get("extra_body") or {})
        options = {_REQUEST_OPTIONS[k]: body[k] for k in ("timeout", "extra_headers") if k in body}
        post = partial(cast(Any, self._client).post, "/chat/completions", options=options)
        if not body["stream"]:
            return await post(body=payload, cast_to=_Completion)
        opened = await post(
            body=payload, cast_to=_Chunk, stream=True, stream_cls=openai.AsyncStream[_Chunk]
        )
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

"""``OllamaModel``: a ``ModelClient`` over Ollama's native chat API (``POST /api/chat``).

Ollama also serves ``/v1/chat/completions`` (``OpenAIChatModel`` with a ``base_url``),
but its native API is the one that carries what it does best: ``think`` (reasoning,
returned as ``message.thinking`` and sent back on the next turn), ``options``
(``num_ctx``, ``num_predict``...), ``keep_alive`` and ``format`` (a JSON schema).

It speaks plain HTTP through the library's size-limited ``httpx2`` client rather than
the ``ollama`` package: the API is small (one request, a stream of JSON lines), the
package would bring an HTTP client of its own that the size limit could not wrap, and
no SDK types stand between the wire and the checks below.

Projection, on top of ``sendable_history``: user text as ``content`` (images in
``images``, base64); an assistant message as ``content``, its thinking as
``thinking`` and its calls as ``tool_calls`` with ``arguments`` as a JSON object;
each result as a ``role: tool`` message naming its tool (``tool_name``).

Reading: a stream is JSON lines (``"stream": true``, the default), each a chunk of
``message`` (``content``, ``thinking``, whole ``tool_calls``); the last has
``"done": true``, the ``done_reason`` and the token counts (``prompt_eval_count``,
``eval_count``). Calls come without ids (older servers) or with ids; each gets a
unique one. A response with calls ends with ``TOOL_USE`` whatever its ``done_reason``
(Ollama says ``stop``). An ``{"error": ...}`` line or body is classified like any
provider error (a 404 is a model that is not pulled).

Limits per attempt (see ``_adapter``): ``timeout`` 600 s, ``idle_timeout`` 300 s
between lines, ``max_response_bytes`` 32 MiB (a line is within the body, so bounded
by it too). The base URL is ``base_url``, else ``OLLAMA_HOST``, else
``http://localhost:11434``; a key (``api_key`` or ``OLLAMA_API_KEY``, for Ollama's
cloud at ``https://ollama.com``) is sent as a bearer token when there is one.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, ClassVar, Unpack

import httpx2

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
from statemachine.errors import InvalidInputError
from statemachine.providers._adapter import (
    AdapterOptions,
    IncompleteStreamError,
    ModelAdapter,
    ReportedError,
    ResponseReader,
    UnreadableResponseError,
)
from statemachine.providers._errors import Failure, classify
from statemachine.providers._native import checked_flag
from statemachine.providers._projection import function_tools, sendable_history

__all__ = ["DEFAULT_BASE_URL", "OllamaModel", "project_messages"]

DEFAULT_BASE_URL = "http://localhost:11434"
_STOP = {"stop": StopReason.STOP, "length": StopReason.LENGTH}


class _HTTPStatusError(Exception):
    """An HTTP error status, with the body Ollama sent (``{"error": "..."}``)."""

    def __init__(self, status: int, headers: Mapping[str, str], body: object) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.headers = headers
        self.body = body


def _assistant_entry(message: AssistantMessage) -> dict[str, Any] | None:
    entry: dict[str, Any] = {"role": "assistant", "content": message.text}
    thinking = "".join(
        b.thinking for b in message.content if isinstance(b, ThinkingContent) and not b.redacted
    )
    if thinking:
        entry["thinking"] = thinking
    calls = [
        {"function": {"name": c.name, "arguments": thaw_json(c.arguments)}}
        for c in message.content
        if isinstance(c, ToolCall)
    ]
    if calls:
        entry["tool_calls"] = calls
    if not message.text and not calls and not thinking:
        return None
    return entry


def project_messages(
    messages: Sequence[Message], system: str | None = None
) -> list[dict[str, Any]]:
    """Our history as the ``messages`` of ``/api/chat`` (see the module docstring)."""
    out: list[dict[str, Any]] = []
    if system:
        out.append({"role": "system", "content": system})
    for message in sendable_history(messages):
        if isinstance(message, UserMessage):
            entry: dict[str, Any] = {
                "role": "user",
                "content": "".join(b.text for b in message.content if isinstance(b, TextContent)),
            }
            images = [b.data for b in message.content if isinstance(b, ImageContent)]
            if images:
                entry["images"] = images
            out.append(entry)
        elif isinstance(message, AssistantMessage):
            assistant = _assistant_entry(message)
            if assistant is not None:
                out.append(assistant)
        elif isinstance(message, ToolResultMessage):
            text = message.text or "(no output)"
            result: dict[str, Any] = {
                "role": "tool",
                "tool_name": message.tool_name,
                "content": ("Error: " + text) if message.is_error else text,
            }
            images = [b.data for b in message.content if isinstance(b, ImageContent)]
            if images:
                result["images"] = images
            out.append(result)
    return out


def _text(value: object, what: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise UnreadableResponseError(f"{what} is not text")
    return value


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


class _LineReader(ResponseReader):
    """Reads the JSON lines of a stream, or the one object of ``stream=False``."""

    def __init__(self, on_text: Callable[[str], None] | None, provider: str) -> None:
        super().__init__(on_text, provider)
        self.done_reason: str | None = None
        self.done = False
        self.calls = 0
        self.counts: tuple[int, int] | None = None

    def usage(self) -> Usage | None:
        if self.counts is None:
            return None
        prompt, output = self.counts
        return Usage(input=prompt, output=output, total_tokens=prompt + output)

    def result(self) -> AssistantMessage:
        if not self.done:
            raise IncompleteStreamError("the response ended before its done line")
        self.builder.unique_call_ids()
        stop = _STOP.get(self.done_reason or "stop", StopReason.STOP)
        if self.calls and stop is StopReason.STOP:
            stop = StopReason.TOOL_USE
        return self.builder.finish(stop, self.usage())

    def apply(self, item: Any) -> None:
        if not isinstance(item, Mapping):
            raise UnreadableResponseError("a line of the response is not a JSON object")
        self.note_response(None, item.get("model"))
        message = item.get("message") or {}
        if not isinstance(message, Mapping):
            raise UnreadableResponseError("the message of a line is not a JSON object")
        thinking = _text(message.get("thinking"), "the thinking")
        if thinking:
            self.builder.add_text(self.builder.block(("thinking", 0), "thinking"), thinking)
        self.builder.append_text(_text(message.get("content"), "the content"))
        calls = message.get("tool_calls") or []
        if not isinstance(calls, list):
            raise UnreadableResponseError("tool_calls is not a list")
        for call in calls:
            self._call(call)
        if item.get("done") is True:
            self.done = True
            reason = item.get("done_reason")
            self.done_reason = reason if isinstance(reason, str) else None
            self.counts = (_count(item.get("prompt_eval_count")), _count(item.get("eval_count")))

    def _call(self, call: object) -> None:
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise UnreadableResponseError("a tool call has no function name")
        arguments = function.get("arguments")
        text = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
        assert isinstance(call, Mapping)
        block = self.builder.block(("tool", self.calls), "tool")
        self.calls += 1
        call_id = call.get("id")
        block.call_id = call_id if isinstance(call_id, str) else ""
        block.name = function["name"]
        self.builder.add_arguments(block, text)


class OllamaModel(ModelAdapter):
    """A ``ModelClient`` for Ollama's native chat API (see the module docstring).

    ``think`` [None: the model's default] is sent as ``think`` (``True``/``False``,
    or ``"low"``/``"medium"``/``"high"`` for the models that take a level);
    ``ollama_options`` [{}] as ``options`` (``num_ctx``, ``seed``...), to which
    ``temperature`` and the run's settings are added (``max_tokens`` as
    ``num_predict``); ``keep_alive`` [None] as ``keep_alive``. A run's
    ``output_type`` is sent as ``format`` (a JSON schema) unless
    ``native_output=False``. The shared options (``system``, ``extra_body``,
    ``retry``, the limits, ``on_text``, ``logger``) are ``AdapterOptions``.
    """

    provider = "Ollama"
    provider_name = "ollama"  # its gen_ai.provider.name
    key_env = "OLLAMA_API_KEY"
    sdk: ClassVar[Any] = None
    reader = _LineReader
    accepts_instructions = True
    supported_settings = frozenset({"temperature", "max_tokens", "top_p", "stop"})

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        think: bool | str | None = None,
        ollama_options: Mapping[str, Any] | None = None,
        keep_alive: str | int | None = None,
        stream: bool = True,
        native_output: bool = True,
        **options: Unpack[AdapterOptions],
    ) -> None:
        key = self._setup(model, api_key, options)
        if think is not None and not isinstance(think, (bool, str)):
            raise InvalidInputError("think must be True, False or a level such as 'high'")
        self.think = think
        self.ollama_options = dict(ollama_options or {})
        self.keep_alive = keep_alive
        self.stream = stream
        self.native_output = checked_flag(native_output)
        base = base_url or os.environ.get("OLLAMA_HOST") or DEFAULT_BASE_URL
        if "://" not in base:
            base = "http://" + base  # OLLAMA_HOST is often host:port
        self._base = base.rstrip("/")
        headers = {"Accept-Encoding": "gzip, deflate"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._client = self._http_client(httpx2.AsyncClient)
        self._client.headers.update(headers)

    def _raw_base_url(self) -> str:
        return self._base

    def request_body(
        self, messages: Sequence[Message], tools: Sequence[ToolDefinition]
    ) -> dict[str, Any]:
        """The JSON body of ``POST /api/chat`` for this context."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": project_messages(messages, self.system),
            "stream": self.stream,
        }
        if tools:
            body["tools"] = function_tools(tools)
        if self.think is not None:
            body["think"] = self.think
        options = dict(self.ollama_options)
        if self.temperature is not None:
            options["temperature"] = self.temperature
        if options:
            body["options"] = options
        if self.keep_alive is not None:
            body["keep_alive"] = self.keep_alive
        body.update(self.extra_body)
        return body

    def apply_options(self, body: dict[str, Any], options: CallOptions) -> dict[str, Any]:
        """The run's instructions as the first ``system`` message, its settings in
        ``options`` and its output schema as ``format``."""
        if options.output_schema is not None:
            body["format"] = dict(options.output_schema)
        if options.instructions is not None:
            messages = [
                m
                for m in body["messages"]
                if not (m["role"] == "system" and self.system and m["content"] == self.system)
            ]
            body["messages"] = [{"role": "system", "content": options.instructions}, *messages]
        settings = options.settings.set_fields()
        if settings:
            sent = dict(body.get("options") or {})
            for name, value in settings.items():
                if name == "max_tokens":
                    sent["num_predict"] = value
                else:
                    sent[name] = list(value) if name == "stop" else value
            body["options"] = sent
        return body

    async def _open(self, body: dict[str, Any]) -> Any:
        request = self._client.build_request("POST", self._base + "/api/chat", json=body)
        response = await self._client.send(request, stream=True)
        if response.status_code >= 400:
            try:
                raw = await response.aread()
            finally:
                await response.aclose()
            try:
                error: object = json.loads(raw)
            except ValueError:
                error = raw.decode("utf-8", "replace")
            raise _HTTPStatusError(response.status_code, response.headers, error)
        if not body["stream"]:
            try:
                return _checked(json.loads(await response.aread()))
            finally:
                await response.aclose()
        return _lines(response)

    def _classify_sdk(self, exc: Exception) -> Failure | None:
        if isinstance(exc, _HTTPStatusError):
            return classify(
                self.where,
                status=exc.status,
                headers=exc.headers,
                body=exc.body,
                message=_error_text(exc.body) or str(exc),
                key_hint=self.key_env,
                secrets=self._secrets,
                not_found="The model is most likely not pulled on this server: `ollama pull` it.",
            )
        return None


def _error_text(body: object) -> str | None:
    """The text of Ollama's ``{"error": "..."}``."""
    error = body.get("error") if isinstance(body, Mapping) else None
    return error if isinstance(error, str) and error else None


def _checked(item: object) -> object:
    """``item``, unless it is an error Ollama reported in a normal response: the
    model failed while it ran, which is the server's failure (retried as a 500)."""
    if isinstance(item, Mapping) and "error" in item:
        raise ReportedError(_error_text(item) or "unknown error", item, status=500)
    return item


async def _lines(response: httpx2.Response) -> AsyncIterator[object]:
    """Each JSON line of a streamed response, closing it at the end. Lines are split
    on bytes and decoded strictly: text that is not UTF-8 is an error, not replaced.
    (What is buffered is within ``max_response_bytes``, which bounds the body.)"""
    buffer = bytearray()
    try:
        async for chunk in response.aiter_bytes():
            searched = len(buffer)  # a long line is scanned once, not once per chunk
            buffer += chunk
            while (end := buffer.find(b"\n", searched)) >= 0:
                line = bytes(buffer[:end])
                del buffer[: end + 1]
                searched = 0
                if line.strip():
                    yield _checked(json.loads(line.decode("utf-8")))
        if buffer.strip():
            yield _checked(json.loads(buffer.decode("utf-8")))
    finally:
        await response.aclose()

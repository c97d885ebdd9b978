"""``OpenAIResponsesModel``: a ``ModelClient`` over the OpenAI Responses API.

It uses the official ``openai`` SDK (the ``[openai]`` extra), created with
``max_retries=0`` (retries are ours, see ``_retry``), and shares every limit of the
other adapters through ``_adapter``. The SDK sends the request; the events come back
as plain JSON objects that this module reads itself, so that an event type newer
than the SDK is skipped (with a debug log) instead of failing the call.

The conversation is sent whole each turn (``store=False``, no
``previous_response_id``): our history is the only state, so a resumed or edited
run sends exactly what it holds. Reasoning survives across turns because the
adapter asks for ``reasoning.encrypted_content`` and keeps it in the history.

Projection to the Responses ``input``, on top of ``sendable_history``:

* a user message is ``{"role": "user", "content": ...}``: a string when it is one
  text, else ``input_text`` and ``input_image`` (a data URL) parts; empty content is
  sent as ``(empty message)``;
* assistant text is an input message with the ``assistant`` role;
* a tool call is a ``function_call`` item with its ``call_id`` and, when the call
  came from this API, its item id (``fc_...``): the ``ToolCall.id`` of such a call
  is ``"<call_id>|<item id>"``, and the result answers the ``call_id`` part;
* a result is a ``function_call_output`` item: a string, or ``input_text`` and
  ``input_image`` parts when it holds images; an error result starts ``Error:``;
* reasoning comes back as a ``ThinkingContent`` whose ``thinking`` is the summary
  text and whose ``signature`` holds the item id and the encrypted content (see
  ``reasoning_signature``); it is sent back as the ``reasoning`` item it was.
  Thinking without such a signature (from another provider, cut off, or received
  without encrypted content) cannot be carried: the API takes no plain-text
  reasoning, so it is left out of the request (the model loses that reasoning,
  nothing else changes);
* call ids longer than 64 characters or with other characters than
  ``[A-Za-z0-9_-]`` are replaced by a stable substitute.

Reading: ``response.output_item.added``/``.done``, ``response.output_text.delta``,
``response.refusal.delta``, ``response.function_call_arguments.delta``,
``response.reasoning_summary_text.delta`` (and ``response.reasoning_text.delta``, the
raw reasoning open models send) build the message; ``response.completed``
and ``response.incomplete`` end it (``max_output_tokens`` is ``length``,
``content_filter`` an ``error`` stop); ``response.failed`` and ``error`` raise
the error they report, classified like an HTTP error (``server_error`` and rate
limits are retried). A stream that ends without one of those is incomplete and
retried. An event type the adapter does not know is skipped with a debug log; an
output item of an unknown type that carries a ``call_id`` (a call the client should
answer, of a kind this adapter cannot run) ends the call with
``ProviderResponseError`` rather than being lost. With ``stream=False`` the whole
response is read the same way.

Usage: ``input`` is ``input_tokens`` less the cached ones (``cache_read``);
``output`` is ``output_tokens``, reasoning tokens included (the API counts them
there; our ``Usage`` has no separate field for them).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Unpack, cast

from statemachine.providers._errors import missing_extra

try:
    import openai
except ImportError as exc:  # pragma: no cover - exercised by a test that hides the SDK
    raise missing_extra("openai") from exc

from statemachine.agent.model import CallOptions
from statemachine.core.checks import positive_int
from statemachine.core.messages import AssistantMessage, Message, StopReason, Usage
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
from statemachine.providers._native import openai_json_schema
from statemachine.providers._projection import Block
from statemachine.providers._responses_input import (
    SIGNATURE_PREFIX,
    project_input,
    project_tools,
    reasoning_signature,
    split_call_id,
)

__all__ = [
    "SIGNATURE_PREFIX",
    "OpenAIResponsesModel",
    "project_input",
    "project_tools",
    "reasoning_signature",
    "split_call_id",
]


# The error type (as ``classify`` knows them) each error code of a failed response
# stands for, so that it is classified, and retried or not, like the same failure
# reported as an HTTP error.
_CODE_TYPE = {
    "server_error": "server_error",
    "rate_limit_exceeded": "rate_limit_error",
    "vector_store_timeout": "timeout_error",
    "insufficient_quota": "invalid_request_error",
    "invalid_api_key": "authentication_error",
}


def _usage(raw: object) -> Usage | None:
    if not isinstance(raw, Mapping):
        return None
    details = raw.get("input_tokens_details")
    cached = _count(details.get("cached_tokens")) if isinstance(details, Mapping) else 0
    prompt = _count(raw.get("input_tokens"))
    output = _count(raw.get("output_tokens"))
    return Usage(
        input=max(0, prompt - cached),
        output=output,
        cache_read=cached,
        total_tokens=_count(raw.get("total_tokens")) or prompt + output,
    )


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise UnreadableResponseError(f"{what} is not text")
    return value


def _mapping(value: object, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise UnreadableResponseError(f"{what} is not a JSON object")
    return value


def _index(event: Mapping[str, Any]) -> int:
    index = event.get("output_index")
    if not isinstance(index, int) or isinstance(index, bool):
        raise UnreadableResponseError(f"the event {event.get('type')!r} has no output_index")
    return index


_KNOWN_ITEMS = frozenset({"message", "function_call", "reasoning"})
_IGNORED_EVENTS = frozenset(
    {
        "response.created",
        "response.in_progress",
        "response.queued",
        "response.content_part.added",
        "response.content_part.done",
        "response.output_text.done",
        "response.output_text.annotation.added",
        "response.refusal.done",
        "response.function_call_arguments.done",
        "response.reasoning_summary_part.done",
        "response.reasoning_summary_text.done",
        "response.reasoning_text.done",
    }
)


class _EventReader(ResponseReader):
    """Reads the events of a stream, or one whole response (``stream=False``)."""

    def __init__(self, on_text: Callable[[str], None] | None, provider: str) -> None:
        super().__init__(on_text, provider)
        self.status: str | None = None
        self.reason: str | None = None
        self.raw_usage: object = None
        self.summary_parts: dict[int, int] = {}  # output_index -> summary parts begun
        self.items: dict[int, Mapping[str, Any]] = {}  # output_index -> the item as known

    def usage(self) -> Usage | None:
        return _usage(self.raw_usage)

    def reasoning_tokens(self) -> int | None:
        raw = self.raw_usage
        details = raw.get("output_tokens_details") if isinstance(raw, Mapping) else None
        count = _count(details.get("reasoning_tokens")) if isinstance(details, Mapping) else 0
        return count or None

    def result(self) -> AssistantMessage:
        if self.status is None:
            raise IncompleteStreamError("the response stream ended before response.completed")
        self.require_unique_call_ids("call_id and item id")
        for index, item in self.items.items():
            if item.get("type") == "reasoning":
                block = self.builder.block(("item", index), "thinking")
                block.signature = reasoning_signature(item, self.items.get(index + 1))
        if self.status == "completed":
            calls = any(b.kind == "tool" for b in self.builder.blocks)
            return self.builder.finish(
                StopReason.TOOL_USE if calls else StopReason.STOP, self.usage()
            )
        # incomplete
        if self.reason == "content_filter":
            error = f"{self.provider}'s content filter stopped the response"
            return self.builder.finish(StopReason.ERROR, self.usage(), error)
        return self.builder.finish(StopReason.LENGTH, self.usage())

    def apply(self, item: Any) -> None:
        event = _mapping(item, "a response event")
        kind = event.get("type")
        about = event.get("response", event)  # response.created and such, or a whole one
        if isinstance(about, Mapping):
            self.note_response(about.get("id"), about.get("model"))
        if kind is None and event.get("object") == "response":
            self._whole(event)  # stream=False: the response itself
            return
        if kind in _IGNORED_EVENTS:
            return
        handler = self._HANDLERS.get(kind) if isinstance(kind, str) else None
        if handler is None:
            self._unknown_event(event)
            return
        handler(self, event)

    # -- whole responses --------------------------------------------------------------

    def _whole(self, response: Mapping[str, Any]) -> None:
        output = response.get("output")
        if not isinstance(output, list):
            raise UnreadableResponseError("the response has no output list")
        for index, raw in enumerate(output):
            self._item_done(index, _mapping(raw, "an output item"))
        self._end(response)

    def _end(self, response: Mapping[str, Any]) -> None:
        status = response.get("status")
        if status == "failed":
            self._failed(response.get("error"))
        if status not in ("completed", "incomplete"):
            raise UnreadableResponseError(f"the response ended with status {status!r}")
        self.raw_usage = response.get("usage")
        details = response.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, Mapping) else None
        self.status, self.reason = status, reason if isinstance(reason, str) else None

    def _failed(self, error: object) -> None:
        body = error if isinstance(error, Mapping) else {}
        code = body.get("code")
        message = body.get("message")
        text = message if isinstance(message, str) and message else "the response failed"
        kind = _CODE_TYPE.get(code, "invalid_request_error") if isinstance(code, str) else None
        raise ReportedError(text, {**body, "type": body.get("type") or kind})

    # -- items ------------------------------------------------------------------------

    def _item_done(self, index: int, item: Mapping[str, Any]) -> None:
        """An output item as finished: it settles what the deltas built."""
        kind = item.get("type")
        key = ("item", index)
        self.items[index] = item
        if kind == "function_call":
            block = self._call_block(key, item)
            block.text = [_text(item.get("arguments"), "a function call's arguments")]
        elif kind == "reasoning":
            block = self.builder.block(key, "thinking")
            summary = [
                _text(s.get("text"), "a reasoning summary")
                for s in item.get("summary") or ()
                if isinstance(s, Mapping)
            ]
            # Open models (served by vLLM and others) send their raw reasoning as
            # content instead of a summary.
            raw = [
                _text(c.get("text"), "reasoning text")
                for c in item.get("content") or ()
                if isinstance(c, Mapping) and c.get("type") == "reasoning_text"
            ]
            if summary:
                block.text = ["\n\n".join(summary)]
            elif raw:
                block.text = ["".join(raw)]
        elif kind == "message":
            parts = []
            for raw in item.get("content") or ():
                part = _mapping(raw, "a message part")
                if part.get("type") == "output_text":
                    parts.append(_text(part.get("text"), "output text"))
                elif part.get("type") == "refusal":
                    parts.append(_text(part.get("refusal"), "a refusal"))
            block = self.builder.block(key, "text")
            if not block.text and parts:
                self.builder.add_text(block, "".join(parts))
        else:
            self._unknown_item(item)

    def _call_block(self, key: tuple[str, int], item: Mapping[str, Any]) -> Block:
        """The block of a function call item, its id and name set from the item."""
        block = self.builder.block(key, "tool")
        call_id = _text(item.get("call_id"), "a function call's call_id")
        item_id = item.get("id")
        block.call_id = f"{call_id}|{item_id}" if isinstance(item_id, str) else call_id
        block.name = _text(item.get("name"), "a function call's name")
        return block

    def _unknown_item(self, item: Mapping[str, Any]) -> None:
        kind = item.get("type")
        if "call_id" in item:
            raise UnreadableResponseError(
                f"the response holds a {kind!r} item with a call_id, a call of a kind this "
                "adapter cannot run or carry back"
            )
        self.skipped(f"item:{kind}")

    def _unknown_event(self, event: Mapping[str, Any]) -> None:
        item = event.get("item")
        if isinstance(item, Mapping) and item.get("type") not in _KNOWN_ITEMS:
            self._unknown_item(item)
            return
        self.skipped(f"event:{event.get('type')}")

    # -- events -----------------------------------------------------------------------

    def _on_item_added(self, event: Mapping[str, Any]) -> None:
        item = _mapping(event.get("item"), "an added item")
        kind = item.get("type")
        index = _index(event)
        key = ("item", index)
        self.items.setdefault(index, item)
        if kind == "function_call":
            self._call_block(key, item)
        elif kind == "reasoning":
            self.builder.block(key, "thinking")
        elif kind == "message":
            self.builder.block(key, "text")
        else:
            self._unknown_item(item)

    def _on_item_done(self, event: Mapping[str, Any]) -> None:
        self._item_done(_index(event), _mapping(event.get("item"), "a finished item"))

    def _on_text(self, event: Mapping[str, Any]) -> None:
        block = self.builder.block(("item", _index(event)), "text")
        self.builder.add_text(block, _text(event.get("delta"), "a text delta"))

    def _on_arguments(self, event: Mapping[str, Any]) -> None:
        block = self.builder.block(("item", _index(event)), "tool")
        self.builder.add_arguments(block, _text(event.get("delta"), "an arguments delta"))

    def _on_summary_part(self, event: Mapping[str, Any]) -> None:
        index = _index(event)
        begun = self.summary_parts.get(index, 0)
        if begun:
            self.builder.block(("item", index), "thinking").text.append("\n\n")
        self.summary_parts[index] = begun + 1

    def _on_summary_text(self, event: Mapping[str, Any]) -> None:
        block = self.builder.block(("item", _index(event)), "thinking")
        block.text.append(_text(event.get("delta"), "a summary delta"))

    def _on_end(self, event: Mapping[str, Any]) -> None:
        response = _mapping(event.get("response"), "the final response")
        output = response.get("output")
        if not self.builder.blocks and isinstance(output, list):
            # A server that sent no item events: the final response holds them all.
            for index, raw in enumerate(output):
                self._item_done(index, _mapping(raw, "an output item"))
        self._end(response)

    def _on_failed(self, event: Mapping[str, Any]) -> None:
        response = _mapping(event.get("response"), "the failed response")
        self._failed(response.get("error"))

    def _on_error(self, event: Mapping[str, Any]) -> None:
        inner = event.get("error")
        if not isinstance(inner, Mapping):  # the event itself holds code and message
            inner = {k: v for k, v in event.items() if k != "type"}
        self._failed(inner)

    _HANDLERS: ClassVar[dict[str, Callable[[_EventReader, Mapping[str, Any]], None]]] = {
        "response.output_item.added": _on_item_added,
        "response.output_item.done": _on_item_done,
        "response.output_text.delta": _on_text,
        "response.refusal.delta": _on_text,
        "response.function_call_arguments.delta": _on_arguments,
        "response.reasoning_summary_part.added": _on_summary_part,
        "response.reasoning_summary_text.delta": _on_summary_text,
        "response.reasoning_text.delta": _on_summary_text,
        "response.completed": _on_end,
        "response.incomplete": _on_end,
        "response.failed": _on_failed,
        "error": _on_error,
    }


class OpenAIResponsesModel(ModelAdapter):
    """A ``ModelClient`` for the OpenAI Responses API (``POST /v1/responses``).

    The key comes from ``api_key`` or ``OPENAI_API_KEY``. The options shared with the
    other adapters (``system``, ``temperature``, ``extra_body``, ``retry``, the limits,
    ``on_text``, ``logger``) are described in ``AdapterOptions``; ``system`` is sent as
    ``instructions``. ``reasoning`` is passed through as the request's ``reasoning``
    object (e.g. ``{"effort": "low", "summary": "auto"}``), ``max_output_tokens`` as
    itself. A run's ``output_type`` is sent as ``text.format`` (native structured
    output, ``statemachine.agent.output``).

    A run's instructions replace ``system`` as ``instructions``; of its
    ``ModelSettings`` it sends ``temperature``, ``max_tokens`` (as
    ``max_output_tokens``) and ``top_p``; ``stop`` it cannot (the API has no stop
    sequences), so a run that sets it is refused before any call.

    ``encrypted_reasoning=True`` (the default) asks for
    ``reasoning.encrypted_content``, which a stateless conversation needs to carry a
    reasoning model's reasoning to the next turn; pass ``False`` for a server or
    model that refuses that ``include``. ``stream=False`` asks for the whole response
    at once.

    Limits per attempt (see ``_adapter``): ``timeout`` 600 s for the whole attempt,
    ``idle_timeout`` 300 s between stream events, ``max_response_bytes`` 32 MiB;
    exceeding one raises ``ProviderLimitError`` naming the URL, the model and the
    limit. Retries follow ``retry`` (``RetryPolicy()``).
    """

    provider = "OpenAI Responses"
    key_env = "OPENAI_API_KEY"
    sdk: ClassVar[Any] = openai
    reader = _EventReader

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        max_output_tokens: int | None = None,
        reasoning: Mapping[str, Any] | None = None,
        encrypted_reasoning: bool = True,
        stream: bool = True,
        client: openai.AsyncOpenAI | None = None,
        **options: Unpack[AdapterOptions],
    ) -> None:
        key = self._setup(model, api_key, options)
        if not key:
            if base_url is None and client is None:
                raise InvalidInputError("no OpenAI API key: set OPENAI_API_KEY or pass api_key=")
            key = "no-key"  # a local server ignores it, but the SDK requires one
        if max_output_tokens is not None:
            positive_int("max_output_tokens", max_output_tokens)
        self.max_output_tokens = max_output_tokens
        self.reasoning = dict(reasoning) if reasoning is not None else None
        self.encrypted_reasoning = encrypted_reasoning
        self.stream = stream
        self._client = client or self._new_client(key, base_url)

    def request_body(
        self, messages: Sequence[Message], tools: Sequence[ToolDefinition]
    ) -> dict[str, Any]:
        """The JSON body of ``POST /responses`` for this context."""
        body: dict[str, Any] = {
            "model": self.model,
            "input": project_input(messages),
            "stream": self.stream,
            "store": False,
        }
        if self.system:
            body["instructions"] = self.system
        if self.encrypted_reasoning:
            body["include"] = ["reasoning.encrypted_content"]
        if tools:
            body["tools"] = project_tools(tools)
        if self.reasoning is not None:
            body["reasoning"] = dict(self.reasoning)
        if self.max_output_tokens is not None:
            body["max_output_tokens"] = self.max_output_tokens
        if self.temperature is not None:
            body["temperature"] = self.temperature
        body.update(self.extra_body)
        return body

    accepts_instructions = True
    # The Responses API has no stop sequences.
    supported_settings = frozenset(
        {
            "temperature",
            "max_tokens",
            "top_p",
            "parallel_tool_calls",
            "reasoning_effort",
            "extra_body",
        }
    )

    native_output = True

    def apply_options(self, body: dict[str, Any], options: CallOptions) -> dict[str, Any]:
        """The run's instructions as ``instructions`` (instead of the adapter's
        ``system``), its settings as ``temperature``, ``max_output_tokens`` and
        ``top_p``, and its output schema as ``text.format`` ``json_schema`` (native
        structured output)."""
        if options.output_schema is not None:
            text = dict(body.get("text") or {})
            text["format"] = {"type": "json_schema", **openai_json_schema(options.output_schema)}
            body["text"] = text
        if options.instructions is not None:
            body["instructions"] = options.instructions
        settings = options.settings
        if settings.temperature is not None:
            body["temperature"] = settings.temperature
        if settings.max_tokens is not None:
            body["max_output_tokens"] = settings.max_tokens
        if settings.top_p is not None:
            body["top_p"] = settings.top_p
        if settings.parallel_tool_calls is not None and "tools" in body:
            body["parallel_tool_calls"] = settings.parallel_tool_calls
        if settings.reasoning_effort is not None:
            body["reasoning"] = {
                **(body.get("reasoning") or {}),
                "effort": settings.reasoning_effort,
            }
        body.update(settings.set_fields().get("extra_body", {}))
        return body

    async def _open(self, body: dict[str, Any]) -> Any:
        # Raw JSON objects, not the SDK's models: an event type newer than the SDK
        # must be skippable, and strict validation would reject it.
        client = cast(Any, self._client)
        if not body["stream"]:
            return await client.post("/responses", body=body, cast_to=object)
        return await client.post(
            "/responses",
            body=body,
            cast_to=object,
            stream=True,
            stream_cls=openai.AsyncStream[object],
        )

"""``GeminiModel``: a ``ModelClient`` over the Gemini API (``generateContent``).

It uses the official ``google-genai`` SDK (the ``[gemini]`` extra) with its retries
off (retries are ours, see ``_retry``) and the HTTP client of ``_adapter``, so that
every limit of the other adapters holds here too.

Projection to Gemini ``contents``, on top of ``sendable_history``:

* a user message is a ``user`` content of ``text`` and ``inline_data`` (image) parts;
  empty content is sent as one empty text part, which Gemini accepts;
* an assistant message is a ``model`` content: text parts, ``function_call`` parts,
  and thought parts (``thought: true``) for thinking that came from Gemini;
* the results of one assistant message are ``function_response`` parts of ONE
  ``user`` content right after it (``{"output": text}``, or ``{"error": text}`` for
  an error result); a result's images follow as ``inline_data`` parts of that same
  content; consecutive contents of one role are merged;
* thought signatures go back on the part they came on. A signature Gemini put on a
  text or call part is kept in the history as an empty ``ThinkingContent`` just
  before that part, its ``signature`` being ``gemini:`` and the base64 signature;
  a thought part's own signature stays on its ``ThinkingContent`` (an unsigned
  thought's signature is ``gemini:`` alone, marking it as Gemini's). Thinking from
  another provider cannot be carried (Gemini would take it as its own thoughts
  without a valid signature) and is left out of the request.

Call ids: Gemini often sends calls without an id (or with an empty one), and ids
need not be unique. Each call in our history gets an id that is unique within its
response: the provider's own when it has a non-empty one not used before in that
response, else a new ``gemini_call_<random>`` id. Generated ids are not sent back
(Gemini matches a ``function_response`` to its call by name and order, as it does
for calls it sent without ids); a provider's own id is sent back on the call and
on its result.

Reading: each chunk of the stream (or the one response of ``stream=False``) adds
its parts; a part of a kind this adapter does not use (code execution, files, or a
kind newer than the SDK, which the SDK strips to an empty part) is skipped with a
debug log. The finish reason ends the message: ``STOP`` (``tool_use`` when there
are calls), ``MAX_TOKENS`` is ``length``, and safety, recitation, blocklist,
malformed-call and other refusals are an ``error`` stop naming the reason; a prompt
blocked before any candidate is an ``error`` stop too. A stream that ends without a
finish reason is incomplete and retried.

Usage: ``input`` is ``promptTokenCount`` less ``cachedContentTokenCount``
(``cache_read``); ``output`` is ``candidatesTokenCount`` plus ``thoughtsTokenCount``
(thinking is billed as output).

Errors are classified like the other adapters' HTTP errors; the wait a rate-limit
error names in its ``RetryInfo`` detail (``"retryDelay": "13s"``, where Gemini puts
it instead of a ``Retry-After`` header) is honoured like ``Retry-After``.
"""

from __future__ import annotations

import base64
import json
import os
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Final, Unpack

from statemachine.providers._errors import missing_extra

try:
    from google import genai
    from google.genai import errors as genai_errors
    from google.genai import types as genai_types
except ImportError as exc:  # pragma: no cover - exercised by a test that hides the SDK
    raise missing_extra("gemini") from exc

import httpx2

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
from statemachine.providers._errors import (
    Failure,
    classify,
    connection_failure,
)
from statemachine.providers._projection import add_turn, media_parts, sendable_history

__all__ = ["GeminiModel", "project_contents", "project_tools"]

SIGNATURE_PREFIX = "gemini:"
GENERATED_ID_PREFIX = "gemini_call_"
DEFAULT_BASE_URL = "https://generativelanguage.googleapis.com"

_ERROR_FINISH = {
    "SAFETY": "its safety filters",
    "RECITATION": "recitation (it would repeat training data)",
    "BLOCKLIST": "a blocklist",
    "PROHIBITED_CONTENT": "prohibited content",
    "SPII": "sensitive personal information",
    "MALFORMED_FUNCTION_CALL": "a malformed function call",
    "UNEXPECTED_TOOL_CALL": "an unexpected tool call",
    "LANGUAGE": "an unsupported language",
    "OTHER": "an unspecified reason",
}


def _signature(raw: bytes | None) -> str | None:
    return SIGNATURE_PREFIX + base64.b64encode(raw).decode("ascii") if raw else None


def _signature_bytes(block: ThinkingContent) -> bytes | None:
    signature = block.signature or ""
    if not signature.startswith(SIGNATURE_PREFIX):
        return None
    try:
        return base64.b64decode(signature[len(SIGNATURE_PREFIX) :], validate=True)
    except ValueError:
        return None


def _media(content: Sequence[TextContent | ImageContent]) -> list[dict[str, Any]]:
    return media_parts(content, lambda text: {"text": text}, _inline_data)


def _inline_data(image: ImageContent) -> dict[str, Any]:
    return {"inline_data": {"mime_type": image.mime_type, "data": base64.b64decode(image.data)}}


def _own_id(call_id: str) -> str | None:
    """The id to send back: the provider's, or none for one we generated."""
    return None if call_id.startswith(GENERATED_ID_PREFIX) else call_id


def _model_parts(message: AssistantMessage) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    pending: bytes | None = None  # a signature for the next part
    for block in message.content:
        part: dict[str, Any]
        if isinstance(block, ThinkingContent):
            signature = _signature_bytes(block)
            if signature is None:
                continue  # another provider's thinking: cannot be carried
            if not block.thinking:
                pending = signature or None
                continue
            thought: dict[str, Any] = {"text": block.thinking, "thought": True}
            if signature:
                thought["thought_signature"] = signature
            parts.append(thought)
            continue
        if isinstance(block, TextContent):
            if not block.text:
                continue
            part = {"text": block.text}
        elif isinstance(block, ToolCall):
            call: dict[str, Any] = {"name": block.name, "args": thaw_json(block.arguments)}
            own = _own_id(block.id)
            if own is not None:
                call["id"] = own
            part = {"function_call": call}
        else:
            continue
        if pending is not None:
            part["thought_signature"] = pending
            pending = None
        parts.append(part)
    return parts


def _result_parts(message: ToolResultMessage) -> list[dict[str, Any]]:
    text = message.text or "(no output)"
    response: dict[str, Any] = {"name": message.tool_name}
    response["response"] = {"error": text} if message.is_error else {"output": text}
    own = _own_id(message.tool_call_id)
    if own is not None:
        response["id"] = own
    images = [b for b in message.content if isinstance(b, ImageContent)]
    return [{"function_response": response}, *_media(images)]


def project_contents(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Our history as Gemini ``contents`` (see the module docstring)."""
    out: list[dict[str, Any]] = []
    for message in sendable_history(messages):
        if isinstance(message, UserMessage):
            # An empty text part is accepted (recorded), and says what the person sent.
            role, parts = "user", _media(message.content) or [{"text": ""}]
        elif isinstance(message, AssistantMessage):
            role, parts = "model", _model_parts(message)
        else:
            role, parts = "user", _result_parts(message)
        add_turn(out, role, parts, key="parts")
    return out


def project_tools(tools: Sequence[ToolDefinition]) -> list[dict[str, Any]]:
    """Our tool definitions as one Gemini tool of ``function_declarations``."""
    if not tools:
        return []
    declarations = [
        {"name": t.name, "description": t.description, "parameters_json_schema": t.schema_dict()}
        for t in tools
    ]
    return [{"function_declarations": declarations}]


def _usage(raw: Any) -> Usage | None:
    if raw is None:
        return None
    prompt = raw.prompt_token_count or 0
    cached = raw.cached_content_token_count or 0
    output = (raw.candidates_token_count or 0) + (raw.thoughts_token_count or 0)
    return Usage(
        input=max(0, prompt - cached),
        output=output,
        cache_read=cached,
        total_tokens=raw.total_token_count or prompt + output,
    )


def _retry_delay(body: object) -> float | None:
    """The wait Google names in an error's ``RetryInfo`` detail (``"retryDelay":
    "13s"``), which Gemini sends instead of a ``Retry-After`` header."""
    error = body.get("error") if isinstance(body, Mapping) else None
    details = error.get("details") if isinstance(error, Mapping) else None
    for detail in details if isinstance(details, list) else ():
        delay = detail.get("retryDelay") if isinstance(detail, Mapping) else None
        if isinstance(delay, str) and delay.endswith("s"):
            try:
                seconds = float(delay[:-1])
            except ValueError:
                continue
            if 0 <= seconds < 86_400:
                return seconds
    return None


def _enum_text(value: Any) -> str | None:
    if value is None:
        return None
    return str(getattr(value, "value", value))


class _ChunkReader(ResponseReader):
    """Reads the chunks of a stream, or one whole response (``stream=False``)."""

    def __init__(self, on_text: Callable[[str], None] | None, provider: str) -> None:
        super().__init__(on_text, provider)
        self.finish: str | None = None
        self.raw_usage: Any = None
        self.calls = 0
        self.ids: set[str] = set()

    def usage(self) -> Usage | None:
        return _usage(self.raw_usage)

    def reasoning_tokens(self) -> int | None:
        count = getattr(self.raw_usage, "thoughts_token_count", None)
        return count if isinstance(count, int) and count > 0 else None

    def result(self) -> AssistantMessage:
        if self.finish is None:
            raise IncompleteStreamError("the response ended before a finish reason")
        if self.finish.startswith("BLOCKED:"):
            reason = self.finish.removeprefix("BLOCKED:")
            error = f"{self.provider} blocked the prompt ({reason})"
            return self.builder.finish(StopReason.ERROR, self.usage(), error)
        if self.finish == "MAX_TOKENS":
            return self.builder.finish(StopReason.LENGTH, self.usage())
        if self.finish in _ERROR_FINISH:
            error = (
                f"{self.provider} stopped the response because of {_ERROR_FINISH[self.finish]} "
                f"(finish reason {self.finish})"
            )
            return self.builder.finish(StopReason.ERROR, self.usage(), error)
        stop = StopReason.TOOL_USE if self.calls else StopReason.STOP
        return self.builder.finish(stop, self.usage())

    def apply(self, item: Any) -> None:
        self.note_response(item.response_id, item.model_version)
        if item.usage_metadata is not None:
            self.raw_usage = item.usage_metadata
        candidates = item.candidates or []
        if not candidates:
            feedback = item.prompt_feedback
            blocked = _enum_text(feedback.block_reason) if feedback is not None else None
            if blocked:
                self.finish = f"BLOCKED:{blocked}"
            return
        candidate = candidates[0]
        content = candidate.content
        for part in (content.parts if content is not None else None) or ():
            self._part(part)
        reason = _enum_text(candidate.finish_reason)
        if reason is not None:
            self.finish = reason

    def _part(self, part: Any) -> None:
        builder = self.builder
        signature = _signature(part.thought_signature)
        if part.function_call is not None:
            if signature is not None:
                self._marker(signature)
            call = part.function_call
            block = builder.restart(("call", self.calls), "tool")
            self.calls += 1
            block.call_id = self._unique_id(call.id)
            block.name = call.name or ""
            # Gemini sends a call whole: its arguments are one fragment.
            builder.add_arguments(block, json.dumps(call.args if call.args is not None else {}))
        elif part.text is not None and part.thought:
            block = builder.restart(("thought", len(builder.blocks)), "thinking")
            block.text.append(part.text)
            # The prefix alone marks an unsigned thought as Gemini's own.
            block.signature = signature or SIGNATURE_PREFIX
        elif part.text is not None:
            if signature is not None:
                self._marker(signature)
            builder.append_text(part.text)
        elif signature is not None and not _has_content(part):
            self._marker(signature)  # a signature on a part of its own
        else:
            kinds = [k for k, v in part if v is not None and k != "thought_signature"]
            self.skipped("part", ",".join(kinds) or "(a part the SDK did not recognise)")

    def _marker(self, signature: str) -> None:
        block = self.builder.restart(("signature", len(self.builder.blocks)), "thinking")
        block.signature = signature

    def _unique_id(self, raw: str | None) -> str:
        fresh = GENERATED_ID_PREFIX + uuid.uuid4().hex[:16]
        chosen = raw if raw and raw not in self.ids else fresh
        self.ids.add(chosen)
        return chosen


def _has_content(part: Any) -> bool:
    return any(v is not None for k, v in part if k != "thought_signature")


_BEFORE_GEMINI_3 = re.compile(r"(models/)?gemini-[12]\.")
"""Model names whose API refuses JSON output together with function calling."""


# The run's settings this adapter sends, by their ``GenerateContentConfig`` names.
_CONFIG_FIELDS: Final = {
    "temperature": "temperature",
    "max_tokens": "max_output_tokens",
    "top_p": "top_p",
    "stop": "stop_sequences",
    "seed": "seed",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
}


class GeminiModel(ModelAdapter):
    """A ``ModelClient`` for the Gemini API (Google AI Studio keys).

    The key comes from ``api_key``, ``GEMINI_API_KEY`` or ``GOOGLE_API_KEY``. The
    options shared with the other adapters (``system``, ``temperature``,
    ``extra_body``, ``retry``, the limits, ``on_text``, ``logger``) are described in
    ``AdapterOptions``; ``system`` is sent as ``system_instruction`` and
    ``extra_body`` is merged into the request's ``GenerateContentConfig`` fields.
    ``thinking`` is passed as ``thinking_config`` (e.g. ``{"include_thoughts": True,
    "thinking_budget": 1024}``), ``max_output_tokens`` as itself. ``stream=False``
    asks for the whole response at once; ``api_version`` [``v1beta``, where the
    Gemini API has every feature] is the path's version.

    A run's instructions replace ``system`` as ``system_instruction``; its
    ``ModelSettings`` go in the generation config (``temperature``, ``max_tokens`` as
    ``max_output_tokens``, ``top_p``, ``stop`` as ``stop_sequences``). Gemini sends a
    function call whole, so its arguments reach ``on_tool_call_delta`` as one fragment.
    A run's ``output_type`` is sent as ``response_json_schema`` with
    ``response_mime_type`` ``application/json`` (native structured output), except
    for models before Gemini 3 (``gemini-1.x``, ``gemini-2.x``), which refuse JSON
    output in a request that also offers functions: those get the final-result tool.
    ``native_output`` (``True``/``False``) decides it for another model name.

    Limits per attempt (see ``_adapter``): ``timeout`` 600 s for the whole attempt,
    ``idle_timeout`` 300 s between stream chunks, ``max_response_bytes`` 32 MiB;
    exceeding one raises ``ProviderLimitError`` naming the URL, the model and the
    limit. Retries follow ``retry`` (``RetryPolicy()``); the SDK's own are off.
    """

    provider = "Gemini"
    key_env = "GEMINI_API_KEY"
    sdk: ClassVar[Any] = genai
    reader = _ChunkReader

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        max_output_tokens: int | None = None,
        thinking: Mapping[str, Any] | None = None,
        stream: bool = True,
        api_version: str = "v1beta",
        client: genai.Client | None = None,
        native_output: bool | None = None,
        **options: Unpack[AdapterOptions],
    ) -> None:
        if api_key is None and not os.environ.get(self.key_env):
            api_key = os.environ.get("GOOGLE_API_KEY")
        key = self._setup(model, api_key, options)
        if not key and client is None and self.needs_key:
            raise InvalidInputError("no Gemini API key: set GEMINI_API_KEY or pass api_key=")
        if max_output_tokens is not None:
            positive_int("max_output_tokens", max_output_tokens)
        self.max_output_tokens = max_output_tokens
        self.thinking = dict(thinking) if thinking is not None else None
        self.stream = stream
        if native_output is not None and not isinstance(native_output, bool):
            raise InvalidInputError("native_output must be True, False or None")
        self.native_output = (
            native_output if native_output is not None else not _BEFORE_GEMINI_3.match(model)
        )
        self._base = (base_url or DEFAULT_BASE_URL).rstrip("/")
        self._api_version = api_version
        self._client = client or self._new_client(key, base_url)

    needs_key = True  # False on Vertex AI, which authenticates with Google credentials

    def _http_options(self, base_url: str | None) -> genai_types.HttpOptions:
        return genai_types.HttpOptions(
            base_url=base_url,
            api_version=self._api_version,
            timeout=int(self.limits.timeout * 1000),
            retry_options=genai_types.HttpRetryOptions(attempts=1),
            httpx_async_client=self._http_client(httpx2.AsyncClient),
        )

    def _new_client(self, key: str | None, base_url: str | None) -> Any:
        return genai.Client(api_key=key, http_options=self._http_options(base_url))

    def _raw_base_url(self) -> str:
        return self._base

    def request_body(
        self, messages: Sequence[Message], tools: Sequence[ToolDefinition]
    ) -> dict[str, Any]:
        """The keyword arguments of ``generate_content`` for this context."""
        config: dict[str, Any] = {}
        if self.system:
            config["system_instruction"] = self.system
        if tools:
            config["tools"] = project_tools(tools)
        if self.temperature is not None:
            config["temperature"] = self.temperature
        if self.max_output_tokens is not None:
            config["max_output_tokens"] = self.max_output_tokens
        if self.thinking is not None:
            config["thinking_config"] = dict(self.thinking)
        config.update(self.extra_body)
        return {
            "model": self.model,
            "contents": project_contents(messages),
            "config": config,
            "stream": self.stream,
        }

    accepts_instructions = True
    supported_settings = frozenset(_CONFIG_FIELDS)

    def apply_options(self, body: dict[str, Any], options: CallOptions) -> dict[str, Any]:
        """The run's instructions as ``system_instruction`` (instead of the adapter's
        ``system``), its settings as the ``GenerateContentConfig`` fields
        ``_CONFIG_FIELDS`` names, and its output schema as ``response_json_schema``
        (native structured output)."""
        config = dict(body["config"])
        if options.output_schema is not None:
            config["response_mime_type"] = "application/json"
            config["response_json_schema"] = dict(options.output_schema)
        if options.instructions is not None:
            config["system_instruction"] = options.instructions
        for name, field in _CONFIG_FIELDS.items():
            value = getattr(options.settings, name)
            if value is not None:
                config[field] = list(value) if name == "stop" else value
        return {**body, "config": config}

    async def _open(self, body: dict[str, Any]) -> Any:
        models = self._client.aio.models
        kwargs = {k: v for k, v in body.items() if k != "stream"}
        if body["stream"]:
            return await models.generate_content_stream(**kwargs)
        return await models.generate_content(**kwargs)

    def _classify_sdk(self, exc: Exception) -> Failure | None:
        if isinstance(exc, genai_errors.APIError):
            response = getattr(exc, "response", None)
            headers = getattr(response, "headers", None) or {}
            failure = classify(
                self.where,
                status=exc.code if isinstance(exc.code, int) and exc.code >= 400 else None,
                headers=headers,
                body={"error": {"message": exc.message, "status": exc.status}},
                message=exc.message or str(exc),
                key_hint=f"{self.key_env} (or GOOGLE_API_KEY)",
                secrets=self._secrets,
            )
            delay = _retry_delay(exc.details)
            if failure.retryable and failure.retry_after is None and delay is not None:
                return Failure(failure.error, retryable=True, retry_after=delay)
            return failure
        if isinstance(exc, genai_errors.UnknownApiResponseError):
            cause = exc.__cause__
            why = f"JSONDecodeError: {cause}" if cause is not None else str(exc)
            return self._bad_response(f"it is not valid JSON text ({why})")
        if isinstance(exc, (httpx2.TimeoutException, ConnectionError)):
            return connection_failure(self.where, exc, self._secrets)
        return None

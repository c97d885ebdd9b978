"""``BedrockModel``: a ``ModelClient`` over the AWS Bedrock Converse API.

It uses the official ``boto3``/``botocore`` SDK (the ``[bedrock]`` extra): botocore
builds, signs and parses every request (``Converse``, or ``ConverseStream`` and its
binary event stream), and its retries are off (retries are ours, see ``_retry``).
botocore is synchronous, so each call runs in a worker thread; but the bytes do not
travel through botocore's own HTTP stack: a ``before-send`` hook (botocore's public
event for replacing the sender) hands the signed request to the HTTP client of
``_adapter`` on the event loop, so ``timeout``, ``idle_timeout``,
``max_response_bytes`` and bounded decompression hold exactly as for the other
adapters. The worker thread only waits for chunks the loop reads; when the loop
stops a call (a limit, an abort), the pending read is cancelled and the thread ends.

Projection to Converse ``messages``, on top of ``sendable_history``:

* a user message is ``text`` and ``image`` blocks (png, jpeg, gif and webp; another
  image type cannot be carried and raises ``InvalidInputError``); empty content is
  sent as ``(empty message)``, since Converse refuses empty text;
* an assistant message is ``reasoningContent``, ``text`` and ``toolUse`` blocks;
  reasoning goes back with its signature (or as the ``redactedContent`` it came as);
  reasoning without a signature, or signed by another provider (Gemini, OpenAI
  Responses), cannot be carried and is left out;
* the results of one assistant message are ``toolResult`` blocks (``status:
  error`` for an error result, images kept inside the result) in ONE user message
  right after it; a user message that follows joins it; consecutive messages of one
  role are merged, and a history that starts with the assistant gets a
  ``(conversation start)`` user message first;
* tool-use ids are kept when they match ``[A-Za-z0-9_-]{1,64}`` and otherwise replaced
  by a stable substitute.

Reading: ``contentBlockStart``/``contentBlockDelta`` by block index (text, tool-use
input as JSON fragments, reasoning text, signature and redacted content),
``messageStop`` for the stop reason, ``metadata`` for usage; a ``Converse`` response
is read the same way. A block or delta of a kind this adapter does not use is
skipped with a debug log (an event type botocore's service model does not know is
dropped by botocore itself, before the adapter sees it). Bedrock's errors
(throttling, validation, access denied, model errors inside the stream) are
classified like HTTP errors and name the region and the model id.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextvars
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, Unpack

from statemachine.providers._errors import missing_extra

try:
    import boto3
    import botocore.config
    import botocore.eventstream
    import botocore.exceptions
    import botocore.parsers
    from botocore.awsrequest import AWSResponse
except ImportError as exc:  # pragma: no cover - exercised by a test that hides the SDK
    raise missing_extra("bedrock") from exc

import httpx2

from statemachine.agent.model import CallOptions
from statemachine.core.checks import positive_int
from statemachine.core.messages import AssistantMessage, Message, StopReason, Usage
from statemachine.core.tools import ToolDefinition
from statemachine.errors import InvalidInputError, ProviderAuthError, ProviderRequestError
from statemachine.providers._adapter import (
    AdapterOptions,
    IncompleteStreamError,
    ModelAdapter,
    ResponseReader,
    UnreadableResponseError,
)
from statemachine.providers._bedrock_input import project_messages, project_tools
from statemachine.providers._errors import Failure, classify, connection_failure
from statemachine.providers._native import OUTPUT_SCHEMA_NAME, checked_flag
from statemachine.providers.redaction import protect_secret

__all__ = ["BedrockModel", "project_messages", "project_tools"]

_STOP: dict[str, StopReason] = {
    "end_turn": StopReason.STOP,
    "stop_sequence": StopReason.STOP,
    "tool_use": StopReason.TOOL_USE,
    "max_tokens": StopReason.LENGTH,
    "model_context_window_exceeded": StopReason.LENGTH,
    "guardrail_intervened": StopReason.ERROR,
    "content_filtered": StopReason.ERROR,
}

# Bedrock's error codes, as the kinds ``classify`` knows (the HTTP status decides the
# rest): throttling and server trouble are retried, access problems are auth errors.
_CODE_KIND = {
    "ThrottlingException": "rate_limit_error",
    "ServiceUnavailableException": "overloaded_error",
    "InternalServerException": "api_error",
    "ModelStreamErrorException": "api_error",
    "ModelNotReadyException": "overloaded_error",
    "ModelTimeoutException": "timeout_error",
    "AccessDeniedException": "permission_error",
    "UnrecognizedClientException": "authentication_error",
    "ExpiredTokenException": "authentication_error",
    "InvalidSignatureException": "authentication_error",
    "ValidationException": "invalid_request_error",
    "ResourceNotFoundException": "invalid_request_error",
    "ServiceQuotaExceededException": "invalid_request_error",
}


# -- reading ----------------------------------------------------------------------------


def _mapping(value: object, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise UnreadableResponseError(f"{what} is not a JSON object")
    return value


def _index(event: Mapping[str, Any]) -> int:
    index = event.get("contentBlockIndex")
    if not isinstance(index, int) or isinstance(index, bool):
        raise UnreadableResponseError("a content block event has no contentBlockIndex")
    return index


def _text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise UnreadableResponseError(f"{what} is not text")
    return value


class _EventReader(ResponseReader):
    """Reads the events of a ``ConverseStream``, or one ``Converse`` response."""

    def __init__(self, on_text: Callable[[str], None] | None, provider: str) -> None:
        super().__init__(on_text, provider)
        self.stop_reason: str | None = None
        self.raw_usage: Mapping[str, Any] | None = None

    def usage(self) -> Usage | None:
        raw = self.raw_usage
        if raw is None:
            return None
        counts = {k: v for k, v in raw.items() if isinstance(v, int)}
        read = counts.get("cacheReadInputTokens", 0)
        written = counts.get("cacheWriteInputTokens", 0)
        prompt, output = counts.get("inputTokens", 0), counts.get("outputTokens", 0)
        return Usage(
            input=prompt,
            output=output,
            cache_read=read,
            cache_write=written,
            total_tokens=counts.get("totalTokens", prompt + output + read + written),
        )

    def result(self) -> AssistantMessage:
        if self.stop_reason is None:
            raise IncompleteStreamError("the response stream ended before messageStop")
        self.require_unique_call_ids("toolUseId")
        stop = _STOP.get(self.stop_reason, StopReason.STOP)
        error = None
        if stop is StopReason.ERROR:
            error = f"{self.provider} stopped the response (stop reason {self.stop_reason!r})"
        return self.builder.finish(stop, self.usage(), error)

    def apply(self, item: Any) -> None:
        item = _mapping(item, "a response event")
        if "output" in item:  # Converse: the whole response
            message = _mapping(_mapping(item["output"], "the output").get("message"), "the message")
            content = message.get("content")
            if not isinstance(content, list):
                raise UnreadableResponseError("the message has no content list")
            for index, block in enumerate(content):
                self._block(index, _mapping(block, "a content block"))
            self.raw_usage = item.get("usage")
            self.stop_reason = item.get("stopReason") or "end_turn"
            return
        for kind, event in item.items():
            handler = self._HANDLERS.get(kind)
            if handler is None:
                self.skipped(f"event:{kind}")
            else:
                handler(self, _mapping(event, f"the {kind} event"))

    def _block(self, index: int, block: Mapping[str, Any]) -> None:
        """One whole content block (of a ``Converse`` response)."""
        builder = self.builder
        if "text" in block:
            builder.add_text(builder.block(("block", index), "text"), _text(block["text"], "text"))
        elif "toolUse" in block:
            use = _mapping(block["toolUse"], "a toolUse block")
            target = builder.block(("block", index), "tool")
            target.call_id = _text(use.get("toolUseId"), "a toolUseId")
            target.name = _text(use.get("name"), "a tool name")
            target.text.append(json.dumps(use.get("input", {})))
        elif "reasoningContent" in block:
            self._reasoning(index, block["reasoningContent"])
        else:
            self.skipped("block", ",".join(block))

    def _reasoning(self, index: int, content: Mapping[str, Any]) -> None:
        target = self.builder.block(("block", index), "thinking")
        text = content.get("reasoningText")
        if isinstance(text, Mapping):
            target.text.append(text.get("text", ""))
            target.signature = text.get("signature") or target.signature
        if "text" in content:  # a stream delta
            target.text.append(content["text"])
        if "signature" in content:
            target.signature = (target.signature or "") + content["signature"]
        redacted = content.get("redactedContent")
        if redacted is not None:
            raw = redacted if isinstance(redacted, bytes) else str(redacted).encode()
            target.signature = (target.signature or "") + base64.b64encode(raw).decode("ascii")
            target.redacted = True

    def _on_start(self, event: Mapping[str, Any]) -> None:
        start = _mapping(event.get("start", {}), "a block start")
        if "toolUse" in start:
            use = _mapping(start["toolUse"], "a toolUse start")
            target = self.builder.block(("block", _index(event)), "tool")
            target.call_id = _text(use.get("toolUseId"), "a toolUseId")
            target.name = _text(use.get("name"), "a tool name")
        elif start:
            self.skipped("block", ",".join(start))

    def _on_delta(self, event: Mapping[str, Any]) -> None:
        index = _index(event)
        delta = _mapping(event.get("delta"), "a block delta")
        builder = self.builder
        if "text" in delta:
            text = _text(delta["text"], "a text delta")
            builder.add_text(builder.block(("block", index), "text"), text)
        elif "toolUse" in delta:
            use = _mapping(delta["toolUse"], "a toolUse delta")
            piece = _text(use.get("input"), "a toolUse input delta")
            builder.add_arguments(builder.block(("block", index), "tool"), piece)
        elif "reasoningContent" in delta:
            self._reasoning(index, _mapping(delta["reasoningContent"], "a reasoning delta"))
        else:
            self.skipped("delta", ",".join(delta))

    def _on_stop(self, event: Mapping[str, Any]) -> None:
        self.stop_reason = event.get("stopReason") or "end_turn"

    def _on_metadata(self, event: Mapping[str, Any]) -> None:
        self.raw_usage = event.get("usage")

    def _ignore(self, event: Mapping[str, Any]) -> None:
        pass

    _HANDLERS: ClassVar[dict[str, Callable[[_EventReader, Mapping[str, Any]], None]]] = {
        "messageStart": _ignore,
        "contentBlockStart": _on_start,
        "contentBlockDelta": _on_delta,
        "contentBlockStop": _ignore,
        "messageStop": _on_stop,
        "metadata": _on_metadata,
    }


# -- the bridge from botocore's thread to the event loop ------------------------------------


class _Call:
    """One call's loop, the requests it has in flight and the bodies it opened (to
    cancel and close them when the call is stopped)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.sending: list[concurrent.futures.Future[AWSResponse]] = []
        self.bodies: list[_LoopBody] = []

    async def stop(self) -> None:
        """Cancel what is in flight, so that botocore's thread stops waiting."""
        for future in self.sending:
            future.cancel()
        for body in self.bodies:
            await body.aclose()


_CURRENT: contextvars.ContextVar[_Call] = contextvars.ContextVar("statemachine_bedrock_call")


async def _next_chunk(chunks: Any) -> bytes | None:
    try:
        chunk: bytes = await chunks.__anext__()
    except StopAsyncIteration:
        return None
    return chunk


class _LoopBody:
    """A response body that botocore's thread reads and the event loop receives."""

    def __init__(self, response: httpx2.Response, loop: asyncio.AbstractEventLoop) -> None:
        self._response = response
        self._loop = loop
        self._chunks = response.aiter_bytes()
        self._pending: concurrent.futures.Future[bytes | None] | None = None

    def stream(self, **_: Any) -> Iterator[bytes]:
        while True:
            self._pending = asyncio.run_coroutine_threadsafe(_next_chunk(self._chunks), self._loop)
            chunk = self._pending.result()
            if chunk is None:
                return
            yield chunk

    def close(self) -> None:
        """botocore's close (from its thread)."""
        if self._pending is not None:
            self._pending.cancel()
        asyncio.run_coroutine_threadsafe(self._response.aclose(), self._loop)

    async def aclose(self) -> None:
        """Our close (on the loop): a read the thread still waits for is cancelled."""
        if self._pending is not None:
            self._pending.cancel()
        await self._response.aclose()


class _ThreadedEvents:
    """The events of a ``ConverseStream``, each taken from botocore in a thread."""

    def __init__(self, events: Any, call: _Call) -> None:
        self._events = iter(events)
        self._call = call

    def __aiter__(self) -> _ThreadedEvents:
        return self

    async def __anext__(self) -> Any:
        try:
            item = await asyncio.to_thread(next, self._events, None)
        except (AttributeError, KeyError, TypeError) as exc:
            # botocore's event parser meeting a payload of the wrong shape.
            raise UnreadableResponseError(f"botocore could not parse an event ({exc!r})") from exc
        if item is None:
            raise StopAsyncIteration
        return item

    async def aclose(self) -> None:
        await self._call.stop()


# -- the adapter ----------------------------------------------------------------------------


class BedrockModel(ModelAdapter):
    """A ``ModelClient`` for AWS Bedrock's Converse API.

    ``model`` is a Bedrock model id or inference profile (e.g.
    ``"us.anthropic.claude-sonnet-4-20250514-v1:0"``). Credentials come from boto3's
    usual chain (environment, profile, role) unless ``aws_access_key_id`` and
    ``aws_secret_access_key`` (and ``aws_session_token``) are given; ``region`` from
    ``AWS_REGION``/``AWS_DEFAULT_REGION`` or the profile. ``endpoint_url`` replaces
    the regional endpoint (a VPC endpoint, a test server). The options shared with
    the other adapters are described in ``AdapterOptions``; ``system`` is sent as
    ``system``, ``extra_body`` is merged into the request. ``max_tokens`` goes in
    ``inferenceConfig``; ``additional_fields`` is sent as
    ``additionalModelRequestFields`` (e.g. ``{"thinking": {"type": "enabled",
    "budget_tokens": 1024}}`` for Claude). ``stream=False`` calls ``Converse``.

    A run's instructions replace ``system`` as the ``system`` blocks; its
    ``ModelSettings`` go in ``inferenceConfig`` (``temperature``, ``maxTokens``,
    ``topP``, ``stopSequences``), over the adapter's own ``max_tokens`` and
    ``temperature``. ``native_output=True`` sends a run's ``output_type`` as
    ``outputConfig.textFormat`` (a JSON schema, which only some models accept) instead
    of offering the final-result tool; off by default, so ``output_mode="auto"`` uses
    the tool.

    Limits per attempt (see ``_adapter``): ``timeout`` 600 s for the whole attempt,
    ``idle_timeout`` 300 s between stream events, ``max_response_bytes`` 32 MiB, all
    enforced on the event loop (see the module docstring). Retries follow ``retry``.
    """

    provider = "Bedrock"
    key_env = "AWS_SECRET_ACCESS_KEY"
    sdk: ClassVar[Any] = boto3
    reader = _EventReader

    def __init__(
        self,
        model: str,
        *,
        region: str | None = None,
        endpoint_url: str | None = None,
        aws_access_key_id: str | None = None,
        aws_secret_access_key: str | None = None,
        aws_session_token: str | None = None,
        max_tokens: int | None = None,
        additional_fields: Mapping[str, Any] | None = None,
        stream: bool = True,
        session: boto3.Session | None = None,
        native_output: bool = False,
        **options: Unpack[AdapterOptions],
    ) -> None:
        self._setup(model, aws_secret_access_key, options)
        self.native_output = checked_flag(native_output)
        if max_tokens is not None:
            positive_int("max_tokens", max_tokens)
        session = session or boto3.Session(
            aws_access_key_id=aws_access_key_id,
            aws_secret_access_key=aws_secret_access_key,
            aws_session_token=aws_session_token,
            region_name=region or os.environ.get("AWS_REGION"),
        )
        self.region = session.region_name
        if not self.region:
            raise InvalidInputError("no AWS region for Bedrock: pass region= or set AWS_REGION")
        self._protect(session, aws_session_token)
        self.max_tokens = max_tokens
        self.additional_fields = dict(additional_fields) if additional_fields else None
        self.stream = stream
        self._client = session.client(
            "bedrock-runtime",
            endpoint_url=endpoint_url,
            config=botocore.config.Config(
                retries={"total_max_attempts": 1, "mode": "standard"},
                connect_timeout=self.limits.timeout,
                read_timeout=self.limits.timeout,
            ),
        )
        self._http = self._http_client(httpx2.AsyncClient)
        self._client.meta.events.register("before-send.bedrock-runtime.*", self._send)

    def _protect(self, session: boto3.Session, token: str | None) -> None:
        """Keep every secret of the credentials out of errors and logs."""
        credentials = session.get_credentials()
        frozen = credentials.get_frozen_credentials() if credentials is not None else None
        found = [token]
        if frozen is not None:
            found += [frozen.secret_key, frozen.token]
        for secret in found:
            if secret and secret not in self._secrets:
                self._secrets = (*self._secrets, secret)
                protect_secret(secret)

    def _raw_base_url(self) -> str:
        return str(self._client.meta.endpoint_url)

    @property
    def where(self) -> str:
        return f"Bedrock model {self.model!r} in region {self.region} at {self.base_url}"

    def request_body(
        self, messages: Sequence[Message], tools: Sequence[ToolDefinition]
    ) -> dict[str, Any]:
        """The keyword arguments of ``converse``/``converse_stream`` for this context."""
        body: dict[str, Any] = {"modelId": self.model, "messages": project_messages(messages)}
        if self.system:
            body["system"] = [{"text": self.system}]
        inference: dict[str, Any] = {}
        if self.max_tokens is not None:
            inference["maxTokens"] = self.max_tokens
        if self.temperature is not None:
            inference["temperature"] = self.temperature
        if inference:
            body["inferenceConfig"] = inference
        if tools:
            body["toolConfig"] = {"tools": project_tools(tools)}
        if self.additional_fields:
            body["additionalModelRequestFields"] = dict(self.additional_fields)
        body.update(self.extra_body)
        return body

    accepts_instructions = True
    supported_settings = frozenset({"temperature", "max_tokens", "top_p", "stop"})

    def apply_options(self, body: dict[str, Any], options: CallOptions) -> dict[str, Any]:
        """The run's instructions as the ``system`` blocks (instead of the adapter's
        ``system``), and its settings in ``inferenceConfig`` (``temperature``,
        ``maxTokens``, ``topP``, ``stopSequences``)."""
        if options.output_schema is not None:
            structure = {"name": OUTPUT_SCHEMA_NAME, "schema": json.dumps(options.output_schema)}
            body["outputConfig"] = {
                "textFormat": {"type": "json_schema", "structure": {"jsonSchema": structure}}
            }
        if options.instructions is not None:
            body["system"] = [{"text": options.instructions}]
        settings = options.settings
        inference = dict(body.get("inferenceConfig") or {})
        if settings.temperature is not None:
            inference["temperature"] = settings.temperature
        if settings.max_tokens is not None:
            inference["maxTokens"] = settings.max_tokens
        if settings.top_p is not None:
            inference["topP"] = settings.top_p
        if settings.stop is not None:
            inference["stopSequences"] = list(settings.stop)
        if inference:
            body["inferenceConfig"] = inference
        return body

    def _streams(self, body: dict[str, Any]) -> bool:
        return self.stream

    async def _open(self, body: dict[str, Any]) -> Any:
        call = _Call(asyncio.get_running_loop())
        _CURRENT.set(call)  # the worker thread runs in a copy of this context
        if not self.stream:
            try:
                return await asyncio.to_thread(lambda: self._client.converse(**body))
            finally:
                await call.stop()  # the body was read whole: only cleanup is left
        try:
            response = await asyncio.to_thread(lambda: self._client.converse_stream(**body))
        except BaseException:
            await call.stop()
            raise
        return _ThreadedEvents(response["stream"], call)

    def _send(self, request: Any, **_: Any) -> AWSResponse:
        """botocore's ``before-send`` hook, in its thread: the loop sends the request."""
        call = _CURRENT.get()
        future = asyncio.run_coroutine_threadsafe(self._send_on_loop(request, call), call.loop)
        call.sending.append(future)
        return future.result()

    async def _send_on_loop(self, request: Any, call: _Call) -> AWSResponse:
        outgoing = self._http.build_request(
            request.method, request.url, headers=dict(request.headers.items()), content=request.body
        )
        response = await self._http.send(outgoing, stream=True)
        body = _LoopBody(response, call.loop)
        call.bodies.append(body)
        return AWSResponse(str(request.url), response.status_code, dict(response.headers), body)

    def _classify_sdk(self, exc: Exception) -> Failure | None:
        if isinstance(exc, botocore.exceptions.ClientError):
            error = exc.response.get("Error", {})
            code = str(error.get("Code") or "")
            code = code[:1].upper() + code[1:]  # stream exceptions are camelCase
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            message = str(error.get("Message") or code or "no error message")
            return classify(
                self.where,
                status=status if isinstance(status, int) and status >= 400 else None,
                headers=exc.response.get("ResponseMetadata", {}).get("HTTPHeaders", {}),
                body={
                    "type": _CODE_KIND.get(code),
                    "code": code or None,
                    "message": f"{code}: {message}" if code else message,
                },
                message=message,
                key_hint="the AWS credentials and the IAM permission bedrock:InvokeModel",
                secrets=self._secrets,
                not_found=(
                    "The model or the endpoint was not found: check the model id, that the "
                    "model is offered in this region, and endpoint_url if you set one; "
                    "retrying will not help."
                ),
            )
        if isinstance(exc, botocore.exceptions.ParamValidationError):
            return Failure(
                ProviderRequestError(f"{self.where}: botocore refused the request: {exc}"),
                retryable=False,
            )
        if isinstance(exc, botocore.parsers.ResponseParserError):
            return self._bad_response(f"botocore could not parse it ({exc})")
        if isinstance(exc, botocore.eventstream.ParserError):
            return self._bad_response(f"the event stream is corrupt ({exc})")
        if isinstance(exc, botocore.exceptions.NoCredentialsError):
            return Failure(
                ProviderAuthError(
                    f"{self.where}: no AWS credentials were found; configure them as for "
                    "the AWS CLI or pass aws_access_key_id and aws_secret_access_key"
                ),
                retryable=False,
            )
        if isinstance(exc, (botocore.exceptions.BotoCoreError, concurrent.futures.CancelledError)):
            return connection_failure(self.where, exc, self._secrets)
        return None

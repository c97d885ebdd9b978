"""What every adapter shares: the limits on one model call, the HTTP client that
enforces the size limit, and the bounded attempt that reads one response.

Every attempt (one HTTP request and its response) is bounded three ways:

* ``timeout`` (default 600 s): the whole attempt, from sending the request to the
  last byte of the response stream. A server that streams forever, or drips one byte
  every few seconds, is stopped here.
* ``idle_timeout`` (default 300 s): the longest silence between two events of a
  stream, and before the first. A non-streaming response arrives in one piece at the
  end, so only ``timeout`` bounds it.
* ``max_response_bytes`` (default 32 MiB): one response body as it arrives, error
  bodies included, counted after decompression (only gzip and deflate are accepted,
  and decompressed in bounded steps). The HTTP client the adapter builds enforces
  it; a ``client=`` of your own is yours to bound.

Hitting a limit raises ``ProviderLimitError`` naming the URL, the model and the limit;
it is not retried. Retries of other failures are bounded by the ``RetryPolicy``, so one
``complete`` takes at most about ``max_attempts * timeout + max_total_delay`` seconds
(2,520 s with the defaults).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import json
import math
import os
import random as _random
import urllib.parse
import zlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, ClassVar, TypedDict

import attrs
import httpx2
import pydantic

from statemachine._log import library_logger
from statemachine.agent.model import CallOptions
from statemachine.core.abort import AbortSignal
from statemachine.core.messages import AssistantMessage, Message, Usage
from statemachine.core.tools import ToolDefinition
from statemachine.errors import (
    InvalidInputError,
    ProviderError,
    ProviderLimitError,
    ProviderResponseError,
    UsageError,
)
from statemachine.providers._errors import Failure, classify, connection_failure, validation_detail
from statemachine.providers._projection import MessageBuilder
from statemachine.providers._retry import (
    AbortWatch,
    RetryPolicy,
    Sleep,
    aborted_message,
    complete_with_retries,
    race_abort,
)
from statemachine.providers.redaction import protect_secret, redact

__all__ = [
    "AdapterOptions",
    "Limits",
    "ModelAdapter",
    "ReportedError",
    "ResponseReader",
    "SizeLimitedClient",
]

_MIB = 1024 * 1024


def _positive(_: object, attribute: attrs.Attribute[Any], value: float) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value <= 0:
        raise InvalidInputError(f"{attribute.name} must be a positive number of seconds")


def _byte_count(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidInputError(f"{attribute.name} must be a positive whole number of bytes")


@attrs.frozen
class Limits:
    """The bounds on one attempt; see the module docstring."""

    timeout: float = attrs.field(default=600.0, validator=_positive)
    idle_timeout: float = attrs.field(default=300.0, validator=_positive)
    max_response_bytes: int = attrs.field(default=32 * _MIB, validator=_byte_count)


class ResponseTooLargeError(Exception):
    """Raised inside the HTTP client when a body passes ``max_response_bytes``."""


class UnreadableResponseError(Exception):
    """A body the HTTP client will not decode, or a response part no reader can read."""


class IncompleteStreamError(Exception):
    """The stream ended before its last event: the connection broke mid-response."""


class ReportedError(Exception):
    """A failure reported inside a response (a stream's error event, a failed response),
    classified like an HTTP error; ``status``: the HTTP status its code stands for."""

    def __init__(self, message: str, body: object, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.body = body
        self.status = status


class _CountedStream(httpx2.AsyncByteStream):
    """A body that stops with ``ResponseTooLargeError`` once it has given ``limit``
    bytes, decompressing gzip or deflate itself so that the count is of what is kept."""

    def __init__(self, inner: httpx2.AsyncByteStream, limit: int, compressed: bool) -> None:
        self._inner = inner
        self._limit = limit
        self._total = 0
        # wbits 47 reads both the gzip and the zlib wrapper.
        self._decoder = zlib.decompressobj(wbits=47) if compressed else None

    async def __aiter__(self) -> AsyncIterator[bytes]:
        self._total = 0
        async for chunk in self._inner:
            yield self._count(self._inflate(chunk))
        if self._decoder is not None:
            yield self._count(self._decoder.flush())

    def _inflate(self, chunk: bytes) -> bytes:
        if self._decoder is None:
            return chunk
        try:
            # At most one byte beyond the limit is ever inflated.
            return self._decoder.decompress(chunk, self._limit - self._total + 1)
        except zlib.error as exc:
            raise UnreadableResponseError(f"the compressed body is corrupt ({exc})") from None

    def _count(self, chunk: bytes) -> bytes:
        self._total += len(chunk)
        if self._total > self._limit:
            raise ResponseTooLargeError(self._limit)
        return chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class SizeLimitedClient(httpx2.AsyncClient):
    """An ``httpx2.AsyncClient`` whose response bodies end at ``max_response_bytes``.

    Mixed in before an SDK's default client class, so that the SDK's own defaults
    (connection limits, keep-alive, proxies) stay as they are.
    """

    def __init__(self, *, max_response_bytes: int, **kwargs: Any) -> None:
        # Only encodings we can inflate in bounded steps; httpx2 would add br/zstd.
        kwargs.setdefault("headers", {"Accept-Encoding": "gzip, deflate"})
        super().__init__(**kwargs)
        self.max_response_bytes = max_response_bytes

    async def send(
        self, request: httpx2.Request, *, stream: bool = False, **kwargs: Any
    ) -> httpx2.Response:
        response = await super().send(request, stream=True, **kwargs)
        try:
            self._limit(response)
            if not stream:
                await response.aread()
        except BaseException:
            await response.aclose()
            raise
        return response

    def _limit(self, response: httpx2.Response) -> None:
        limit = self.max_response_bytes
        length = response.headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:
            raise ResponseTooLargeError(limit)
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("identity", "gzip", "deflate"):
            raise UnreadableResponseError(f"the body uses the content encoding {encoding!r}")
        # We inflate it ourselves (bounded); httpx2 must not do it again.
        response.headers.pop("content-encoding", None)
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        response.stream = _CountedStream(response.stream, limit, encoding != "identity")


def _public_url(url: str) -> str:
    """``url`` without user, password, query or fragment: those can hold credentials."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path.rstrip("/"), "", ""))


class ResponseReader(abc.ABC):
    """Turns the items of one response (stream events, or one whole completion) into
    an ``AssistantMessage``; each adapter has its own."""

    def __init__(self, on_text: Callable[[str], None] | None, provider: str) -> None:
        self.builder = MessageBuilder(on_text=on_text)
        self.provider = provider  # named in the errors a response can end with
        self.opened = False  # the response has begun
        self.log: Any = library_logger("statemachine.providers")
        self.response_id: str | None = None  # as the provider named them (telemetry)
        self.response_model: str | None = None

    def note_response(self, response_id: object, model: object) -> None:
        """The response's id and the model that answered, the first time they are
        given (at most 256 characters each; anything else is ignored)."""
        if self.response_id is None and isinstance(response_id, str) and response_id:
            self.response_id = response_id[:256]
        if self.response_model is None and isinstance(model, str) and model:
            self.response_model = model[:256]

    def reasoning_tokens(self) -> int | None:  # when the provider counts them apart
        return None

    def require_unique_call_ids(self, what: str) -> None:
        """Refuse a response with two calls of one id (``what`` names the id): their
        results could not be told apart, and the provider would refuse them too."""
        ids = [b.call_id for b in self.builder.blocks if b.kind == "tool"]
        if len(set(ids)) != len(ids):
            raise UnreadableResponseError(
                f"two calls have the same {what}, so their results could not be told apart"
            )

    def skipped(self, kind: str, detail: str = "") -> None:
        """Note, at debug level, a part of the response this adapter does not use."""
        self.log.debug("provider_event_skipped", provider=self.provider, kind=kind, detail=detail)

    @abc.abstractmethod
    def apply(self, item: Any) -> None:
        """Take in one item of the response."""

    @abc.abstractmethod
    def usage(self) -> Usage | None:
        """Token counts as reported so far."""

    @abc.abstractmethod
    def result(self) -> AssistantMessage:
        """The finished message; ``IncompleteStreamError`` if the response broke off."""

    def aborted(self) -> AssistantMessage:
        if not self.opened:
            return aborted_message("aborted before the response began")
        return self.builder.aborted(self.usage())


class AdapterOptions(TypedDict, total=False):
    """The options every adapter takes (defaults in brackets).

    * ``system`` [None]: the system prompt, sent with every request.
    * ``temperature`` [None: the provider's default] and ``extra_body`` [{}]: extra
      request fields, passed through.
    * ``retry`` [``RetryPolicy()``]: how transient failures are retried.
    * ``timeout`` [600 s], ``idle_timeout`` [300 s], ``max_response_bytes`` [32 MiB]:
      the limits of one attempt (see the ``_adapter`` module).
    * ``on_text`` [None]: called with each text delta as it arrives (a retried
      attempt streams its text again).
    * ``logger`` [the library's default: stdlib logging's ``statemachine.providers``
      logger, silent unless the application configures logging or structlog]: where
      retries are logged.
    * ``sleep`` [``asyncio.sleep``] and ``random`` [``random.random``]: for tests.
    """

    system: str | None
    temperature: float | None
    extra_body: Mapping[str, Any] | None
    retry: RetryPolicy | None
    timeout: float
    idle_timeout: float
    max_response_bytes: int
    on_text: Callable[[str], None] | None
    logger: Any
    sleep: Sleep
    random: Callable[[], float]


class ModelAdapter(abc.ABC):
    """The part of a ``ModelClient`` that does not depend on the provider: options,
    retries, limits, classification of failures, redaction, reading a response."""

    provider: str  # class defaults; a compatible service's instance names its own
    key_env: str
    sdk: ClassVar[Any]  # the SDK module (OpenAI and Anthropic name their exceptions alike)
    reader: ClassVar[type[ResponseReader]]  # reads one response of this provider
    # What the run's CallOptions may carry for this adapter (statemachine.agent.model).
    accepts_instructions: ClassVar[bool] = False
    supported_settings: ClassVar[frozenset[str]] = frozenset()
    model: str
    _client: Any

    def _setup(self, model: str, api_key: str | None, options: AdapterOptions) -> str | None:
        """Check and keep the shared options; the key (``api_key`` or the environment)."""
        if not isinstance(model, str) or not model:
            raise InvalidInputError("model must be a non-empty model name")
        unknown = set(options) - set(AdapterOptions.__annotations__)
        if unknown:
            raise InvalidInputError(f"unknown option(s): {', '.join(sorted(unknown))}")
        self.model = model
        self.system = options.get("system")
        self.temperature = options.get("temperature")
        self.extra_body = dict(options.get("extra_body") or {})
        self.retry = options.get("retry") or RetryPolicy()
        self.limits = Limits(
            options.get("timeout", 600.0),
            options.get("idle_timeout", 300.0),
            options.get("max_response_bytes", 32 * _MIB),
        )
        self.on_text = options.get("on_text")
        self.sleep = options.get("sleep", asyncio.sleep)
        self.random = options.get("random", _random.random)
        logger = options.get("logger")
        self.log = logger if logger is not None else library_logger("statemachine.providers")
        key = api_key if api_key is not None else os.environ.get(self.key_env)
        self._secrets: tuple[str, ...] = (key,) if key else ()
        if key:
            protect_secret(key)
        return key

    def _shared_fields(self, body: dict[str, Any]) -> dict[str, Any]:
        """``body`` with the request fields the APIs take alike."""
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if self.extra_body:
            body["extra_body"] = dict(self.extra_body)
        return body

    def _http_client(self, base: type[httpx2.AsyncClient]) -> httpx2.AsyncClient:
        """The SDK's default HTTP client class with the size limit mixed in."""
        limited = type(f"Limited{base.__name__}", (SizeLimitedClient, base), {})
        client: httpx2.AsyncClient = limited(
            max_response_bytes=self.limits.max_response_bytes,
            # A backstop only: every phase of an attempt is within its deadline anyway.
            timeout=self.limits.timeout,
        )
        return client

    def _sdk_options(self, base_url: str | None) -> dict[str, Any]:
        """The SDK client's keyword arguments (besides the key)."""
        return {
            "base_url": base_url,
            "max_retries": 0,  # retries are ours
            "timeout": self.limits.timeout,
            "http_client": self._http_client(self.sdk.DefaultAsyncHttpxClient),
            "_strict_response_validation": True,
        }

    def _new_client(self, key: str | None, base_url: str | None) -> Any:
        """The SDK client this adapter talks through. The OpenAI and Anthropic SDKs both
        name theirs ``AsyncClient``; an adapter on another SDK builds its own."""
        return self.sdk.AsyncClient(api_key=key, **self._sdk_options(base_url))

    def _raw_base_url(self) -> str:
        """The base URL as the client holds it (an adapter whose SDK client does not
        expose one keeps its own)."""
        return str(getattr(self._client, "base_url", ""))

    @property
    def base_url(self) -> str:
        """The client's base URL without anything that could be a credential."""
        raw = self._raw_base_url()
        return redact(_public_url(raw), self._secrets) if raw else "(unknown URL)"

    @property
    def where(self) -> str:
        """The provider, model and URL, as every error names them."""
        return f"{self.provider} model {self.model!r} at {self.base_url}"

    def __repr__(self) -> str:
        # Never the key: reprs end up in logs and tracebacks.
        return f"{type(self).__name__}(model={self.model!r}, base_url={self.base_url!r})"

    @abc.abstractmethod
    def request_body(
        self, messages: Sequence[Message], tools: Sequence[ToolDefinition]
    ) -> dict[str, Any]:
        """The keyword arguments of the SDK's create call for this context."""

    @abc.abstractmethod
    async def _open(self, body: dict[str, Any]) -> Any:
        """Send the request; the stream to read, or the whole response."""

    def _reader(self, options: CallOptions | None = None) -> ResponseReader:
        """A fresh reader for one response, telling the run's listeners too."""
        if options is None:
            plain = self.reader(self.on_text, self.provider)
            plain.log = self.log
            return plain
        listeners = [f for f in (self.on_text, options.on_text) if f is not None]

        def on_text(text: str) -> None:
            for listener in listeners:
                listener(text)

        reader = self.reader(on_text if listeners else None, self.provider)
        reader.builder.on_call = options.on_tool_call_delta
        reader.log = self.log
        return reader

    def apply_options(self, body: dict[str, Any], options: CallOptions) -> dict[str, Any]:
        """``body`` with the run's instructions and settings (``CallOptions``). An
        adapter that sends them overrides this and says so with
        ``accepts_instructions`` and ``supported_settings`` (checked before the run)."""
        if options.instructions is not None or options.settings.set_fields():
            raise UsageError(f"{type(self).__name__} cannot send instructions or settings yet")
        return body

    def _streams(self, body: dict[str, Any]) -> bool:
        return bool(body.get("stream"))

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition],
        signal: AbortSignal,
        *,
        options: CallOptions | None = None,
    ) -> AssistantMessage:
        body = self.request_body(messages, tools)
        if options is not None:
            body = self.apply_options(body, options)
        return await complete_with_retries(
            lambda watch: self._attempt(body, watch, options),
            self._classify,
            provider=self.provider,
            policy=self.retry,
            signal=signal,
            sleep=self.sleep,
            random=self.random,
            log=self.log,
            secrets=self._secrets,
        )

    async def _attempt(
        self, body: dict[str, Any], watch: AbortWatch, options: CallOptions | None = None
    ) -> AssistantMessage:
        reader = self._reader(options)
        aborted, _ = await race_abort(watch, self._read(body, reader, watch.signal))
        said = (reader.response_id, reader.response_model, reader.reasoning_tokens())
        if options is not None and options.on_response is not None and any(said):
            options.on_response(*said)
        if aborted or watch.signal.aborted:
            return reader.aborted()
        return reader.result()

    async def _read(
        self, body: dict[str, Any], reader: ResponseReader, signal: AbortSignal
    ) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.timeout
        streaming = self._streams(body)

        def wake_at() -> float:
            if not streaming:
                return deadline
            return min(deadline, loop.time() + self.limits.idle_timeout)

        timer = asyncio.timeout_at(wake_at())
        try:
            async with timer:
                await self._receive(body, reader, signal, lambda: timer.reschedule(wake_at()))
            return
        except TimeoutError:
            if not timer.expired():
                raise
            timed_out = "timeout" if loop.time() >= deadline else "idle_timeout"
        raise self._limit_error(timed_out)

    async def _receive(
        self,
        body: dict[str, Any],
        reader: ResponseReader,
        signal: AbortSignal,
        heard: Callable[[], None],
    ) -> None:
        response = await self._open(body)
        reader.opened = True
        if not self._streams(body):
            reader.apply(response)
            return
        try:
            async for item in response:
                heard()
                reader.apply(item)
                if signal.aborted:
                    return
        finally:
            # SDK streams have close(); a plain async generator has aclose().
            close = getattr(response, "aclose", None) or response.close
            with contextlib.suppress(Exception):
                await close()

    def _limit_error(self, limit: str) -> ProviderLimitError:
        n = self.limits
        what = {
            "timeout": f"the call took longer than its limit of {n.timeout:g} s "
            f"(timeout={n.timeout:g})",
            "idle_timeout": f"the response sent nothing for {n.idle_timeout:g} s "
            f"(idle_timeout={n.idle_timeout:g})",
            "max_response_bytes": f"the response grew beyond its limit of "
            f"{n.max_response_bytes} bytes (max_response_bytes={n.max_response_bytes})",
        }[limit]
        return ProviderLimitError(
            f"{self.where}: {what}. The call was stopped and is not retried; raise the "
            "limit if the model really needs more."
        )

    def _classify(self, exc: Exception) -> Failure | None:
        if isinstance(exc, ProviderError):
            return Failure(exc, retryable=False)
        inner = _find(exc, (ResponseTooLargeError, UnreadableResponseError))
        if isinstance(inner, ResponseTooLargeError):
            return Failure(self._limit_error("max_response_bytes"), retryable=False)
        if inner is not None:
            return self._bad_response(str(inner))
        if isinstance(exc, json.JSONDecodeError):
            return self._bad_response(f"it is not valid JSON text (JSONDecodeError: {exc})")
        if isinstance(exc, UnicodeDecodeError):
            return self._bad_response(f"it is not UTF-8 text (UnicodeDecodeError: {exc})")
        if isinstance(exc, (IncompleteStreamError, httpx2.TransportError, OSError)):
            return connection_failure(self.where, exc, self._secrets)
        if isinstance(exc, pydantic.ValidationError):
            # An adapter that validates raw events itself (Anthropic, Gemini's SDK).
            lines = str(exc).splitlines()[:4]
            detail = redact("; ".join(line.strip() for line in lines), self._secrets)
            return Failure(
                ProviderResponseError(
                    f"{self.where} sent a response the SDK could not validate: {detail[:600]}"
                ),
                retryable=False,
            )
        if isinstance(exc, ReportedError):
            return classify(
                self.where,
                status=exc.status,
                headers={},
                body=exc.body,
                message=exc.message,
                key_hint=self.key_env,
                secrets=self._secrets,
            )
        return self._classify_sdk(exc)

    def _bad_response(self, why: str) -> Failure:
        return Failure(
            ProviderResponseError(
                f"{self.where} sent a response that cannot be read: {redact(why, self._secrets)}"
            ),
            retryable=False,
        )

    def _classify_sdk(self, exc: Exception) -> Failure | None:
        sdk = self.sdk
        if isinstance(exc, sdk.APIConnectionError):  # timeouts included
            return connection_failure(self.where, exc, self._secrets)
        if isinstance(exc, sdk.APIResponseValidationError):
            detail = redact(validation_detail(exc), self._secrets)
            return Failure(
                ProviderResponseError(
                    f"{self.where} sent a response the SDK could not validate: {detail}"
                ),
                retryable=False,
            )
        if not isinstance(exc, sdk.APIError):
            return None
        status = getattr(exc, "status_code", None)
        response = getattr(exc, "response", None)
        return classify(
            self.where,
            # A mid-stream error event arrives as a status error with the stream's own
            # status (200); only its body tells what it was.
            status=status if isinstance(status, int) and status >= 400 else None,
            headers=response.headers if response is not None else {},
            body=exc.body,
            message=exc.message,
            key_hint=self.key_env,
            secrets=self._secrets,
        )


def _find(exc: BaseException, kinds: tuple[type[BaseException], ...]) -> BaseException | None:
    """The first exception of ``kinds`` in ``exc``'s chain (SDKs wrap what we raise)."""
    current: BaseException | None = exc
    for _ in range(16):
        if current is None or isinstance(current, kinds):
            return current
        current = current.__cause__ or current.__context__
    return None

"""OpenTelemetry spans and metrics for runs (``pip install 'agent-statemachine[otel]'``).

Opt-in: nothing here runs unless you wrap a run with an :class:`AgentTracer`, so a run
that is not traced pays nothing. The spans and metrics follow the OpenTelemetry GenAI
semantic conventions (the latest experimental ones; the table of every attribute and
where it comes from is in the OpenTelemetry guide):

- ``invoke_agent {agent}``: one per run (INTERNAL): the agent's name, id, version and
  description, the conversation id when the caller gives one, the provider and
  model, the run's token totals, and how it ended (``statemachine.run.state``,
  ``statemachine.run.turns``); status ERROR unless the run ended ``Done`` or stopped
  ``AwaitingUser``.
- ``chat {model}``: one per model call (CLIENT), a child of the run's span, current
  while the call runs: provider, request model and parameters, server address and
  port, finish reasons (the conventions' values), token usage, ``error.type``.
- ``execute_tool {tool}``: one per tool call (INTERNAL), a child of the run's span,
  current while the tool runs (so the tool's own spans nest under it): the tool's
  name, description, type and call id; ``error.type`` ``tool_error`` (an error
  result), the exception's class, ``cancelled`` (an abort) or ``timeout`` (the
  tool's deadline). A call answered without running (unknown tool, invalid
  arguments, denied, never started because of an abort) gets a span of no duration
  when its answer is recorded, with ``statemachine.tool.executed`` false; a call the
  run abandoned after an abort has its span ended when it is abandoned.
- Metrics: ``gen_ai.client.token.usage`` and ``gen_ai.client.operation.duration``
  per model call.

**Telemetry never changes a run.** Every call into the OpenTelemetry API (starting
and ending spans, attributes, metrics; processors, samplers and exporters run inside
them) is isolated: an exception there is logged through the library's logger
(``statemachine.otel``; a warning the first time for each kind, debug after) and the
run goes on exactly as it would untraced.

Message content (model input and output, system instructions, tool definitions,
tool arguments and results) is recorded only with ``capture_content=True``, in the
conventions' JSON shapes, and bounded: at most ``max_content_chars`` characters of
content per span (default :data:`DEFAULT_MAX_CONTENT_CHARS`); the newest messages
are kept, older ones dropped, and ``statemachine.content.truncated`` says so. The
cost per span is bounded by that limit, so a long run costs time linear in its turns.
Exception messages are never recorded (they may quote content); the class is.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextvars import ContextVar
from typing import Any

import attrs

from statemachine._log import library_logger
from statemachine._version import __version__
from statemachine.agent.events import MessageAdded, RunEvent, RunResult, ToolEnded
from statemachine.agent.executor import current_tool_call
from statemachine.agent.model import ModelClient
from statemachine.agent.run import AgentRun
from statemachine.agent.tools import Tool, tool_output_from
from statemachine.core.abort import AbortSignal
from statemachine.core.messages import (
    AssistantMessage,
    ImageContent,
    Message,
    StopReason,
    TextContent,
    ThinkingContent,
    ToolCall,
    ToolResultMessage,
    UserMessage,
    thaw_json,
)
from statemachine.core.table import TurnState
from statemachine.core.tools import ToolDefinition
from statemachine.errors import InvalidInputError

try:
    from opentelemetry import context as otel_context
    from opentelemetry import metrics, trace
    from opentelemetry.metrics import Histogram, MeterProvider
    from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, TracerProvider
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "statemachine.otel needs OpenTelemetry: pip install 'agent-statemachine[otel]'"
    ) from exc

__all__ = ["DEFAULT_MAX_CONTENT_CHARS", "SCHEMA_URL", "AgentTracer"]

SCHEMA_URL = "https://opentelemetry.io/schemas/1.41.1"
"""The semantic conventions the spans follow: the GenAI conventions (developed in
their own repository since) build on this version of the general ones."""
DEFAULT_MAX_CONTENT_CHARS = 65_536
"""Characters of captured content one span may hold (``capture_content=True``)."""

_OK_STATES = frozenset({TurnState.Done, TurnState.AwaitingUser})
# The conventions' finish reasons.
_FINISH = {
    StopReason.STOP: "stop",
    StopReason.TOOL_USE: "tool_call",
    StopReason.LENGTH: "length",
    StopReason.ERROR: "error",
    StopReason.ABORTED: "error",
}
# The provider names of the library's own adapters (the conventions' values).
_PROVIDERS = {"OpenAI": "openai", "Anthropic": "anthropic"}
# Request parameters a client may expose as attributes, and their attribute names.
_REQUEST_PARAMETERS = {
    "max_tokens": "gen_ai.request.max_tokens",
    "temperature": "gen_ai.request.temperature",
    "top_p": "gen_ai.request.top_p",
    "top_k": "gen_ai.request.top_k",
    "frequency_penalty": "gen_ai.request.frequency_penalty",
    "presence_penalty": "gen_ai.request.presence_penalty",
    "seed": "gen_ai.request.seed",
}
# The conventions' bucket boundaries for the two GenAI client histograms.
_TOKEN_BUCKETS = [4.0**i for i in range(14)]
_DURATION_BUCKETS = [0.01 * 2.0**i for i in range(14)]
_DESCRIPTION_CHARS = 1_000  # of a tool's description, on its span

Attributes = dict[str, Any]


class _Guard:
    """Calls into OpenTelemetry that can never raise into a run.

    Processors, samplers, views and exporters run inside these calls; whatever they
    raise is logged (a warning the first time per kind, then debug) and dropped.
    """

    def __init__(self) -> None:
        self._seen: set[tuple[str, str]] = set()
        self._log = library_logger("statemachine.otel")

    def failed(self, where: str, exc: Exception) -> None:
        key = (where, type(exc).__name__)
        level = "debug" if key in self._seen else "warning"
        self._seen.add(key)
        try:
            getattr(self._log, level)(
                "telemetry_call_failed", where=where, error=type(exc).__name__, run_unchanged=True
            )
        except Exception:  # noqa: BLE001 - a broken logger must not break a run either
            pass

    def start(
        self,
        tracer: Tracer,
        name: str,
        kind: SpanKind,
        attributes: Attributes,
        parent: Span | None = None,
        start_time: int | None = None,
    ) -> Span | None:
        try:
            context = trace.set_span_in_context(parent) if parent is not None else None
            return tracer.start_span(
                name,
                context=context,
                kind=kind,
                attributes=attributes,
                start_time=start_time,
                record_exception=False,
                set_status_on_exception=False,
            )
        except Exception as exc:  # noqa: BLE001 - see the class docstring
            self.failed(f"start {name.split(' ', 1)[0]}", exc)
            return None

    def set(self, span: Span | None, attributes: Attributes) -> None:
        if span is None:
            return
        try:
            span.set_attributes(attributes)
        except Exception as exc:  # noqa: BLE001 - see the class docstring
            self.failed("set_attributes", exc)

    def error(self, span: Span | None, error_type: str) -> None:
        if span is None:
            return
        try:
            span.set_attribute("error.type", error_type)
            span.set_status(Status(StatusCode.ERROR, error_type))
        except Exception as exc:  # noqa: BLE001 - see the class docstring
            self.failed("set_status", exc)

    def end(self, span: Span | None, end_time: int | None = None) -> None:
        if span is None:
            return
        try:
            span.end(end_time)
        except Exception as exc:  # noqa: BLE001 - see the class docstring
            self.failed("end span", exc)

    def attach(self, span: Span | None) -> object:
        if span is None:
            return None
        try:
            return otel_context.attach(trace.set_span_in_context(span))
        except Exception as exc:  # noqa: BLE001 - see the class docstring
            self.failed("attach context", exc)
            return None

    def detach(self, token: object) -> None:
        if token is None:
            return
        try:
            otel_context.detach(token)  # type: ignore[arg-type]
        except Exception as exc:  # noqa: BLE001 - see the class docstring
            self.failed("detach context", exc)

    def record(self, histogram: Histogram | None, value: float, attributes: Attributes) -> None:
        if histogram is None:
            return
        try:
            histogram.record(value, attributes)
        except Exception as exc:  # noqa: BLE001 - see the class docstring
            self.failed("record metric", exc)


class AgentTracer:
    """Makes the spans and metrics of the runs it wraps.

    ``tracer_provider`` and ``meter_provider`` default to the global ones. Simplest
    use: ``await AgentTracer().run_agent(model=..., tools=..., messages=...)`` (the
    arguments of :func:`statemachine.run_agent`, plus ``conversation_id``). With an
    :class:`AgentRun`, wrap its model and tools, then run it through :meth:`trace`::

        tracer = AgentTracer()
        run = AgentRun(model=tracer.model(model), tools=tracer.tools(tools), ...)
        result = await tracer.trace(run, conversation_id="support-ticket-1234")

    ``provider_name`` names the provider of a model client the tracer does not know
    (the library's adapters name theirs; ``gen_ai.provider.name`` is required); a
    client may also say it itself with a ``provider_name`` attribute.
    """

    def __init__(
        self,
        tracer_provider: TracerProvider | None = None,
        *,
        meter_provider: MeterProvider | None = None,
        agent_name: str = "statemachine",
        agent_id: str | None = None,
        agent_version: str | None = None,
        agent_description: str | None = None,
        provider_name: str | None = None,
        capture_content: bool = False,
        max_content_chars: int = DEFAULT_MAX_CONTENT_CHARS,
    ) -> None:
        if isinstance(max_content_chars, bool) or not (
            isinstance(max_content_chars, int) and max_content_chars > 0
        ):
            raise InvalidInputError(
                f"max_content_chars must be a positive integer, got {max_content_chars!r}"
            )
        self._guard = _Guard()
        self._tracer: Tracer = trace.get_tracer(
            "statemachine", __version__, tracer_provider, schema_url=SCHEMA_URL
        )
        self._tokens: Histogram | None = None
        self._duration: Histogram | None = None
        try:
            meter = metrics.get_meter(
                "statemachine", __version__, meter_provider, schema_url=SCHEMA_URL
            )
            self._tokens = meter.create_histogram(
                "gen_ai.client.token.usage",
                unit="{token}",
                description="Number of input and output tokens used.",
                explicit_bucket_boundaries_advisory=_TOKEN_BUCKETS,
            )
            self._duration = meter.create_histogram(
                "gen_ai.client.operation.duration",
                unit="s",
                description="GenAI operation duration.",
                explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
            )
        except Exception as exc:  # noqa: BLE001 - no metrics, never a failed tracer
            self._guard.failed("create metrics", exc)
        self.agent_name = agent_name
        self.agent_id = agent_id
        self.agent_version = agent_version
        self.agent_description = agent_description
        self.provider_name = provider_name
        self.capture_content = capture_content
        self.max_content_chars = max_content_chars

    async def run_agent(self, *, conversation_id: str | None = None, **kwargs: Any) -> RunResult:
        """``statemachine.run_agent(**kwargs)``, traced."""
        kwargs["model"] = self.model(kwargs["model"])
        kwargs["tools"] = self.tools(kwargs.get("tools", ()))
        return await self.trace(AgentRun(**kwargs), conversation_id=conversation_id)

    async def trace(self, run: AgentRun, *, conversation_id: str | None = None) -> RunResult:
        """Run ``run`` inside its ``invoke_agent`` span and record how it ended.

        ``conversation_id`` is recorded as ``gen_ai.conversation.id`` (runs of one
        conversation share it); the run's own id is ``statemachine.run.id``.
        """
        # The run's model client, when it was wrapped by a tracer: its provider and
        # model describe the agent too (best effort: the run does not publish it).
        model = getattr(run, "_model", None)
        described = model if isinstance(model, _TracedModel) else None
        attributes: Attributes = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.provider.name": (
                described.provider if described else self.provider_name or "_OTHER"
            ),
            "gen_ai.agent.name": self.agent_name,
            "statemachine.run.id": run.run_id,
        }
        if described is not None and described.model:
            attributes["gen_ai.request.model"] = described.model
        optional = {
            "gen_ai.agent.id": self.agent_id,
            "gen_ai.agent.version": self.agent_version,
            "gen_ai.agent.description": self.agent_description,
            "gen_ai.conversation.id": conversation_id,
        }
        attributes.update({k: v for k, v in optional.items() if v is not None})
        guard = self._guard
        span = guard.start(
            self._tracer, f"invoke_agent {self.agent_name}", SpanKind.INTERNAL, attributes
        )
        state = _RunState(span)
        events = asyncio.ensure_future(self._follow(run.events(), state))
        token = _run_state.set(state)
        attached = guard.attach(span)
        try:
            result = await run.run()
        except BaseException as exc:
            guard.error(span, type(exc).__name__)
            raise
        else:
            usage = result.stats.usage if result.stats is not None else None
            ended: Attributes = {
                "statemachine.run.state": result.state.value,
                "statemachine.run.turns": result.turns,
            }
            if usage is not None:
                ended["gen_ai.usage.input_tokens"] = usage.input
                ended["gen_ai.usage.output_tokens"] = usage.output
            guard.set(span, ended)
            if result.state not in _OK_STATES:
                guard.error(span, result.state.value)
            return result
        finally:
            guard.detach(attached)
            _run_state.reset(token)
            # The events of the run end with RunFinished; a run that raised may not
            # have sent it: then they are not waited for.
            if not events.done():
                await asyncio.wait((events,), timeout=0 if run.result is None else 1.0)
                events.cancel()
            for call_id in list(state.open):  # still running: given up on with the run
                state.close(guard, call_id, "cancelled", abandoned=True)
            guard.end(span)

    async def _follow(self, events: AsyncIterator[RunEvent], state: _RunState) -> None:
        """Spans for calls answered without running, when their answer is recorded,
        and the end of the calls the run abandoned, when it abandons them."""
        async for event in events:
            if isinstance(event, MessageAdded):
                message = event.message
                if (
                    isinstance(message, ToolResultMessage)
                    and message.tool_call_id not in state.executed
                ):
                    self._unexecuted(state, message)
            elif isinstance(event, ToolEnded) and event.abandoned:
                state.close(self._guard, event.call.id, "cancelled", abandoned=True)

    def _unexecuted(self, state: _RunState, message: ToolResultMessage) -> None:
        if message.tool_call_id in state.answered:
            return
        state.answered.add(message.tool_call_id)
        now = time.time_ns()
        attributes = _tool_attributes(message.tool_name, message.tool_call_id, None)
        attributes["statemachine.tool.executed"] = False
        if self.capture_content:
            budget = _Budget(self.max_content_chars)
            budget.put(attributes, "gen_ai.tool.call.result", _result_parts(message.content))
            budget.mark(attributes)
        guard = self._guard
        span = guard.start(
            self._tracer,
            f"execute_tool {message.tool_name}",
            SpanKind.INTERNAL,
            attributes,
            parent=state.span,
            start_time=now,
        )
        aborted = message.text.startswith("Operation aborted")
        guard.error(span, "cancelled" if aborted else "tool_error")
        guard.end(span, now)

    def model(self, client: ModelClient, *, provider_name: str | None = None) -> ModelClient:
        """``client``, making a ``chat`` span around each call (``provider_name``:
        its ``gen_ai.provider.name``, when the tracer cannot tell). A client this
        tracer wrapped already is returned as it is."""
        if isinstance(client, _TracedModel) and client._tracer is self:
            return client
        return _TracedModel(client, self, provider_name or self._provider_of(client))

    def tools(self, tools: Iterable[Tool]) -> list[Tool]:
        """``tools``, each making an ``execute_tool`` span around each call (a tool
        this tracer wrapped already is kept as it is)."""
        return [
            t
            if isinstance(t.execute, _TracedExecute) and t.execute._tracer is self
            else attrs.evolve(t, execute=_TracedExecute(t, self))
            for t in tools
        ]

    def _provider_of(self, client: object) -> str:
        """The client's own ``provider_name``, the conventions' name of one of the
        library's adapters, the tracer's ``provider_name``, or the client's class."""
        named = getattr(client, "provider_name", None)
        if isinstance(named, str) and named:
            return named
        adapter = getattr(client, "provider", None)
        if isinstance(adapter, str) and adapter in _PROVIDERS:
            return _PROVIDERS[adapter]
        return self.provider_name or type(client).__name__


# -- the run's state, seen by the model and tool wrappers through a context variable --------


class _RunState:
    """The run's span, the calls that ran, and the tool spans still open."""

    def __init__(self, span: Span | None) -> None:
        self.span = span
        self.executed: set[str] = set()  # the calls that ran
        self.answered: set[str] = set()  # the calls that did not, their span made
        self.open: dict[str, Span | None] = {}

    def close(
        self, guard: _Guard, call_id: str, error_type: str | None, *, abandoned: bool = False
    ) -> None:
        if call_id not in self.open:
            return  # ended already
        span = self.open.pop(call_id)
        if abandoned:
            guard.set(span, {"statemachine.tool.abandoned": True})
        if error_type is not None:
            guard.error(span, error_type)
        guard.end(span)


_run_state: ContextVar[_RunState | None] = ContextVar("statemachine_otel_run", default=None)


def _tool_attributes(name: str, call_id: str | None, tool: Tool | None) -> Attributes:
    execute = tool.execute if tool is not None else None
    extra = getattr(execute, "otel_attributes", None)
    attributes: Attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": name,
        "gen_ai.tool.type": "function",
    }
    if isinstance(extra, Mapping):
        attributes.update(extra)
    if tool is not None and tool.definition.description:
        attributes["gen_ai.tool.description"] = tool.definition.description[:_DESCRIPTION_CHARS]
    if call_id is not None:
        attributes["gen_ai.tool.call.id"] = call_id
    return attributes


def _error_type(exc: BaseException) -> str:
    """The exception's HTTP status when it (or its cause) carries one, else its class."""
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            break
        for name in ("status_code", "status"):
            status = getattr(seen, name, None)
            if isinstance(status, int) and not isinstance(status, bool) and 100 <= status < 600:
                return str(status)
        seen = seen.__cause__
    return type(exc).__name__


# -- captured content in the conventions' JSON shapes -----------------------------------------


class _Budget:
    """Characters of content a span may still take; JSON built within it.

    ``put`` adds an attribute only when something of it fits; whatever was cut or
    left out is said by ``statemachine.content.truncated`` (``mark``).
    """

    def __init__(self, chars: int) -> None:
        self.left = chars
        self.truncated = False

    def put(self, attributes: Attributes, key: str, value: object) -> None:
        text = self._fit(value, self.left)
        if text is not None:
            attributes[key] = text
            self.left -= len(text)

    def put_messages(self, attributes: Attributes, key: str, messages: Sequence[Message]) -> None:
        """The newest messages that fit, oldest first; the newest one cut if it
        alone does not fit. Costs what it keeps, not the history's length."""
        if self.left < 2:
            self.truncated = True
            return
        room = self.left - 2  # the brackets
        kept: list[str] = []
        for message in reversed(messages):
            text = json.dumps(_message(message), ensure_ascii=False, default=str)
            separator = 2 if kept else 0
            if len(text) + separator > room:
                self.truncated = True
                if not kept:
                    cut = self._fit(_message(message), room)
                    if cut is not None:
                        kept.append(cut)
                        room -= len(cut)
                break
            room -= len(text) + separator
            kept.append(text)
        attributes[key] = "[" + ", ".join(reversed(kept)) + "]"
        self.left = room

    def mark(self, attributes: Attributes) -> None:
        if self.truncated:
            attributes["statemachine.content.truncated"] = True

    def _fit(self, value: object, room: int) -> str | None:
        """``value`` as JSON in at most ``room`` characters, its strings and
        containers cut as needed; None when not even its shape fits."""
        text = json.dumps(value, ensure_ascii=False, default=str)
        if len(text) <= room:
            return text
        self.truncated = True
        chars = room // 2
        while chars >= 1:
            text = json.dumps(_cut(value, chars), ensure_ascii=False, default=str)
            if len(text) <= room:
                return text
            chars //= 2
        return None


def _cut(value: object, chars: int) -> object:
    """``value`` with every string cut to ``chars`` characters and containers to
    ``chars`` items (enough to show the shape of something too long to keep)."""
    if isinstance(value, str):
        return value if len(value) <= chars else value[:chars] + "..."
    if isinstance(value, Mapping):
        return {k: _cut(v, chars) for k, v in list(value.items())[:chars]}
    if isinstance(value, list | tuple):
        return [_cut(v, chars) for v in value[:chars]]
    return value


def _part(block: object) -> dict[str, Any]:
    if isinstance(block, TextContent):
        return {"type": "text", "content": block.text}
    if isinstance(block, ThinkingContent):
        return {"type": "reasoning", "content": "" if block.redacted else block.thinking}
    if isinstance(block, ToolCall):
        return {
            "type": "tool_call",
            "id": block.id,
            "name": block.name,
            "arguments": block.arguments_dict(),
        }
    if isinstance(block, ImageContent):
        return {
            "type": "blob",
            "modality": "image",
            "mime_type": block.mime_type,
            "content": block.data,
        }
    return {"type": str(getattr(block, "type", type(block).__name__))}


def _result_parts(content: Sequence[object]) -> object:
    if all(isinstance(b, TextContent) for b in content):
        return "".join(b.text for b in content if isinstance(b, TextContent))
    return [_part(b) for b in content]


def _message(message: Message) -> dict[str, Any]:
    if isinstance(message, ToolResultMessage):
        response = {
            "type": "tool_call_response",
            "id": message.tool_call_id,
            "response": _result_parts(message.content),
        }
        return {"role": "tool", "parts": [response]}
    if isinstance(message, AssistantMessage):
        return {"role": "assistant", "parts": [_part(b) for b in message.content]}
    if isinstance(message, UserMessage):
        return {"role": "user", "parts": [_part(b) for b in message.content]}
    return {"role": str(getattr(message, "role", "user")), "parts": []}


# -- the wrappers -------------------------------------------------------------------------------


class _TracedModel:
    def __init__(self, client: ModelClient, tracer: AgentTracer, provider: str) -> None:
        self._client = client
        self._tracer = tracer
        self.provider = provider
        model = getattr(client, "model", None)
        self.model = model if isinstance(model, str) else ""
        self._name = f"chat {self.model}" if self.model else "chat"
        self._request: Attributes = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": provider,
        }
        if self.model:
            self._request["gen_ai.request.model"] = self.model
        for option, attribute in _REQUEST_PARAMETERS.items():
            value = getattr(client, option, None)
            if isinstance(value, int | float) and not isinstance(value, bool):
                self._request[attribute] = value
        self._request.update(_server(getattr(client, "base_url", None)))
        self._metric: Attributes = {
            k: v
            for k, v in self._request.items()
            if k in ("gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.request.model")
            or k.startswith("server.")
        }
        system = getattr(client, "system", None)
        self._system = system if isinstance(system, str) and system else None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def complete(
        self, messages: Sequence[Message], tools: Sequence[ToolDefinition], signal: AbortSignal
    ) -> AssistantMessage:
        tracer, guard = self._tracer, self._tracer._guard
        state = _run_state.get()
        if state is not None:
            # The calls of the last batch that never ran: their spans come before this
            # call's (the run's events reach the tracer a step later).
            for message in reversed(messages):
                if not isinstance(message, ToolResultMessage):
                    break
                if message.tool_call_id not in state.executed:
                    tracer._unexecuted(state, message)
        span = guard.start(
            tracer._tracer,
            self._name,
            SpanKind.CLIENT,
            dict(self._request),
            parent=state.span if state is not None else None,
        )
        attached = guard.attach(span)
        started = time.monotonic()
        try:
            response = await self._client.complete(messages, tools, signal)
        except BaseException as exc:
            error = "cancelled" if isinstance(exc, asyncio.CancelledError) else _error_type(exc)
            guard.error(span, error)
            self._measure(started, None, error)
            if tracer.capture_content:
                self._content(span, messages, tools, None)
            guard.detach(attached)
            guard.end(span)
            raise
        reason = _FINISH.get(response.stop_reason, "error")
        ended: Attributes = {"gen_ai.response.finish_reasons": (reason,)}
        usage = response.usage
        if usage is not None:
            ended["gen_ai.usage.input_tokens"] = usage.input
            ended["gen_ai.usage.output_tokens"] = usage.output
            if usage.cache_read:
                ended["gen_ai.usage.cache_read.input_tokens"] = usage.cache_read
            if usage.cache_write:
                ended["gen_ai.usage.cache_creation.input_tokens"] = usage.cache_write
        guard.set(span, ended)
        failure: str | None = None
        if response.stop_reason is StopReason.ABORTED:
            failure = "cancelled"
        elif response.stop_reason is StopReason.ERROR:
            failure = "error"
        if failure is not None:
            guard.error(span, failure)
        self._measure(started, usage, failure)
        if tracer.capture_content:
            self._content(span, messages, tools, response)
        guard.detach(attached)
        guard.end(span)
        return response

    def _measure(self, started: float, usage: Any, error: str | None) -> None:
        guard, tracer = self._tracer._guard, self._tracer
        attributes = dict(self._metric)
        if error is not None:
            attributes["error.type"] = error
        guard.record(tracer._duration, time.monotonic() - started, attributes)
        if usage is not None:
            for kind, count in (("input", usage.input), ("output", usage.output)):
                guard.record(tracer._tokens, count, {**self._metric, "gen_ai.token.type": kind})

    def _content(
        self,
        span: Span | None,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition],
        response: AssistantMessage | None,
    ) -> None:
        budget = _Budget(self._tracer.max_content_chars)
        content: Attributes = {}
        if response is not None:
            output = _message(response)
            output["finish_reason"] = _FINISH.get(response.stop_reason, "error")
            budget.put(content, "gen_ai.output.messages", [output])
        if self._system is not None:
            budget.put(
                content, "gen_ai.system_instructions", [{"type": "text", "content": self._system}]
            )
        budget.put_messages(content, "gen_ai.input.messages", messages)
        if tools:
            definitions = [
                {
                    "type": "function",
                    "name": t.name,
                    "description": t.description,
                    "parameters": thaw_json(t.parameters),
                }
                for t in tools
            ]
            budget.put(content, "gen_ai.tool.definitions", definitions)
        budget.mark(content)
        self._tracer._guard.set(span, content)


def _server(base_url: object) -> Attributes:
    """``server.address`` and ``server.port`` of a client's base URL."""
    if not isinstance(base_url, str) or "//" not in base_url:
        return {}
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(base_url)
        port = parts.port or {"https": 443, "http": 80}.get(parts.scheme)
    except ValueError:
        return {}
    if not parts.hostname:
        return {}
    found: Attributes = {"server.address": parts.hostname}
    if port is not None:
        found["server.port"] = port
    return found


class _TracedExecute:
    def __init__(self, tool: Tool, tracer: AgentTracer) -> None:
        self._tool = tool
        self._tracer = tracer
        # Kept visible to another tracer wrapping this one.
        self.otel_attributes = getattr(tool.execute, "otel_attributes", None)

    async def __call__(self, arguments: dict[str, Any], signal: AbortSignal) -> Any:
        tracer, guard = self._tracer, self._tracer._guard
        call = current_tool_call()
        call_id = call.id if call is not None else None
        state = _run_state.get()
        attributes = _tool_attributes(self._tool.name, call_id, self._tool)
        attributes["statemachine.tool.executed"] = True
        budget = _Budget(tracer.max_content_chars)
        if tracer.capture_content:
            budget.put(attributes, "gen_ai.tool.call.arguments", arguments)
            budget.mark(attributes)
        span = guard.start(
            tracer._tracer,
            f"execute_tool {self._tool.name}",
            SpanKind.INTERNAL,
            attributes,
            parent=state.span if state is not None else None,
        )
        if state is not None and call_id is not None:
            state.executed.add(call_id)
            state.open[call_id] = span
        attached = guard.attach(span)
        started = time.monotonic()
        try:
            value = await self._tool.execute(arguments, signal)
        except BaseException as exc:
            guard.detach(attached)
            timed_out = self._timed_out(signal, started)
            self._end(state, call_id, span, "timeout" if timed_out else self._failure(exc, signal))
            raise
        guard.detach(attached)
        output = tool_output_from(value)
        error = "timeout" if self._timed_out(signal, started) else None
        if output is not None and error is None:
            if output.is_error:
                error = "tool_error"
            if tracer.capture_content:
                ended: Attributes = {}
                budget.put(ended, "gen_ai.tool.call.result", _result_parts(output.content))
                budget.mark(ended)
                guard.set(span, ended)
        self._end(state, call_id, span, error)
        return value

    def _timed_out(self, signal: AbortSignal, started: float) -> bool:
        """Whether the driver gave up on the call at its tool's deadline: it signals
        the call "timed out" then (its result, if one comes, is not used)."""
        timeout = self._tool.timeout
        return (
            timeout is not None
            and signal.aborted
            and time.monotonic() - started >= timeout
            and "timed out" in str(signal.reason)
        )

    def _failure(self, exc: BaseException, signal: AbortSignal) -> str:
        if isinstance(exc, asyncio.CancelledError):
            return "cancelled"
        if isinstance(exc, TimeoutError):
            return "timeout"
        return type(exc).__name__

    def _end(
        self, state: _RunState | None, call_id: str | None, span: Span | None, error: str | None
    ) -> None:
        guard = self._tracer._guard
        if state is not None and call_id is not None:
            state.close(guard, call_id, error)  # unless the run has ended it already
            return
        if error is not None:
            guard.error(span, error)
        guard.end(span)

"""The spans of one run: its state, and the wrappers that make the chat and
execute_tool spans around a model client and a tool."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import attrs
from opentelemetry.trace import Span, SpanKind

from statemachine.agent.model import CallOptions, ModelClient, takes_options
from statemachine.agent.model_call import answer_of
from statemachine.agent.running import current_tool_call
from statemachine.agent.tools import Tool, tool_output_from
from statemachine.core.abort import AbortSignal
from statemachine.core.messages import (
    AssistantMessage,
    Message,
    StopReason,
    ToolResultMessage,
    thaw_json,
)
from statemachine.core.tools import ToolDefinition
from statemachine.otel._content import (
    FINISH_REASONS,
    Budget,
    MessageCache,
    as_message,
    as_result,
)
from statemachine.otel._guard import Attributes, Guard

if TYPE_CHECKING:
    from statemachine.otel import AgentTracer

# Request parameters a client may expose as attributes, and their attribute names.
# Request parameters a client may expose as attributes, and their attribute names.
REQUEST_PARAMETERS = {
    "max_tokens": "gen_ai.request.max_tokens",
    "temperature": "gen_ai.request.temperature",
    "top_p": "gen_ai.request.top_p",
    "top_k": "gen_ai.request.top_k",
    "frequency_penalty": "gen_ai.request.frequency_penalty",
    "presence_penalty": "gen_ai.request.presence_penalty",
    "seed": "gen_ai.request.seed",
}
REASONING_TOKENS = "gen_ai.usage.reasoning.output_tokens"
# What the run's span repeats of its last model call: the response of the run's answer.
RESPONSE_ATTRIBUTES = (
    "gen_ai.response.id",
    "gen_ai.response.model",
    "gen_ai.response.finish_reasons",
)
DESCRIPTION_CHARS = 1_000  # of a tool's description, on its span


class RunState:
    """The run's span, the calls that ran, and the tool spans still open."""

    def __init__(self, span: Span | None, *, described: bool) -> None:
        self.span = span
        self.described = described  # the run's span names its provider and model
        self.executed: set[str] = set()  # the calls that ran
        self.answered: set[str] = set()  # the calls that did not, their span made
        self.open: dict[str, Span | None] = {}
        self.messages_json: MessageCache = {}  # content capture: each message once
        self.response: Attributes = {}  # the last model call's gen_ai.response.*
        self.reasoning = 0  # the reasoning tokens of the run's responses, when reported

    def close(
        self, guard: Guard, call_id: str, error_type: str | None, *, abandoned: bool = False
    ) -> None:
        if call_id not in self.open:
            return  # ended already
        span = self.open.pop(call_id)
        if abandoned:
            guard.set(span, {"statemachine.tool.abandoned": True})
        if error_type is not None:
            guard.error(span, error_type)
        guard.end(span)


run_state: ContextVar[RunState | None] = ContextVar("statemachine_otel_run", default=None)


def record_unexecuted(tracer: AgentTracer, state: RunState, message: ToolResultMessage) -> None:
    """The span of a call answered without running, of no duration, made now (once)."""
    call_id = message.tool_call_id
    if call_id in state.executed or call_id in state.answered:
        return
    state.answered.add(call_id)
    now = time.time_ns()
    attributes = tool_attributes(message.tool_name, call_id, None)
    attributes["statemachine.tool.executed"] = False
    if tracer.capture_content:
        budget = Budget(tracer.max_content_chars)
        budget.put(attributes, "gen_ai.tool.call.result", as_result(message.content))
        budget.mark(attributes)
    guard = tracer._guard
    span = guard.start(
        tracer._tracer,
        f"execute_tool {message.tool_name}",
        SpanKind.INTERNAL,
        attributes,
        parent=state.span,
        start_time=now,
    )
    aborted = message.text.startswith("Operation aborted")
    guard.error(span, "cancelled" if aborted else "tool_error")
    guard.end(span, now)


def tool_attributes(name: str, call_id: str | None, tool: Tool | None) -> Attributes:
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
        attributes["gen_ai.tool.description"] = tool.definition.description[:DESCRIPTION_CHARS]
    if call_id is not None:
        attributes["gen_ai.tool.call.id"] = call_id
    return attributes


def error_type(exc: BaseException) -> str:
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


# -- the wrappers -------------------------------------------------------------------------------


def _noting_response(options: CallOptions | None, answered: Attributes) -> CallOptions:
    """``options`` whose ``on_response`` also puts the response's id, model and
    reasoning tokens in ``answered`` (``gen_ai.response.id``, ``gen_ai.response.model``,
    ``gen_ai.usage.reasoning.output_tokens``)."""
    given = options if options is not None else CallOptions()
    before = given.on_response

    def noted(
        response_id: str | None, model: str | None, reasoning_tokens: int | None = None, /
    ) -> None:
        if response_id:
            answered["gen_ai.response.id"] = response_id
        if model:
            answered["gen_ai.response.model"] = model
        if isinstance(reasoning_tokens, int) and reasoning_tokens > 0:
            answered[REASONING_TOKENS] = reasoning_tokens
        if before is not None:
            before(response_id, model, reasoning_tokens)

    return attrs.evolve(given, on_response=noted)


class TracedModel:
    """A model client whose calls make ``chat`` spans and the GenAI metrics.

    It passes a run's ``CallOptions`` on to a client whose ``complete`` declares
    ``options`` (so instructions, settings and streamed deltas work as without the
    tracer) and says what that client can send (``accepts_instructions``,
    ``supported_settings``); a client without ``options`` is called as before, and a
    run that needs options is refused for it before any call, as without the tracer.
    """

    def __init__(self, client: ModelClient, tracer: AgentTracer, provider: str) -> None:
        self._client = client
        self._with_options = takes_options(client)
        self.tracer = tracer
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
        self._described = {
            k: v
            for k, v in self._request.items()
            if k in ("gen_ai.provider.name", "gen_ai.request.model")
        }
        for option, attribute in REQUEST_PARAMETERS.items():
            value = getattr(client, option, None)
            if isinstance(value, int | float) and not isinstance(value, bool):
                self._request[attribute] = value
        self._request.update(server_of(getattr(client, "base_url", None)))
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

    @property
    def accepts_instructions(self) -> bool:
        """Whether the wrapped client can send a run's instructions."""
        if not self._with_options:
            return False
        accepts = getattr(self._client, "accepts_instructions", True)
        return accepts is not False

    @property
    def supported_settings(self) -> frozenset[str] | None:
        """The settings the wrapped client can send (``None``: it does not say)."""
        if not self._with_options:
            return frozenset()
        supported = getattr(self._client, "supported_settings", None)
        return None if supported is None else frozenset(supported)

    async def _call(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition],
        signal: AbortSignal,
        options: CallOptions | None,
    ) -> AssistantMessage:
        # A complete that is not async def is refused with the UsageError an untraced
        # run gives (not a TypeError about await), and the chat span records it.
        if options is None or not self._with_options:
            return await answer_of(self._client, self._client.complete(messages, tools, signal))
        return await answer_of(
            self._client,
            self._client.complete(messages, tools, signal, options=options),  # type: ignore[call-arg]
        )

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition],
        signal: AbortSignal,
        *,
        options: CallOptions | None = None,
    ) -> AssistantMessage:
        guard = self.tracer._guard
        answered: Attributes = {}  # the response's id and model, if the client says
        if self._with_options:
            options = _noting_response(options, answered)
        sent = options if self._with_options else None  # what reaches the client
        try:
            span = self._open(messages, sent)
        except Exception as exc:  # noqa: BLE001 - telemetry never changes a run
            guard.failed("start chat", exc)
            return await self._call(messages, tools, signal, options)
        attached = guard.attach(span)
        started = time.monotonic()
        try:
            response = await self._call(messages, tools, signal, options)
        except BaseException as exc:
            guard.detach(attached)
            error = "cancelled" if isinstance(exc, asyncio.CancelledError) else error_type(exc)
            guard.safely(
                "end chat", self._close, span, started, messages, tools, None, error, sent, answered
            )
            raise
        guard.detach(attached)
        guard.safely(
            "end chat", self._close, span, started, messages, tools, response, None, sent, answered
        )
        return response

    def _open(self, messages: Sequence[Message], options: CallOptions | None) -> Span | None:
        tracer, guard = self.tracer, self.tracer._guard
        state = run_state.get()
        if state is not None:
            # The calls of the last batch answered without running (answered at once,
            # they were recorded before this call): their spans come before its.
            for message in reversed(messages):
                if not isinstance(message, ToolResultMessage):
                    break
                record_unexecuted(tracer, state, message)
            if not state.described:  # the run's span names the agent's provider and model
                state.described = True
                guard.set(state.span, self._described)
        return guard.start(
            tracer._tracer,
            self._name,
            SpanKind.CLIENT,
            {**self._request, **settings_attributes(options), **output_type(options)},
            parent=state.span if state is not None else None,
        )

    def _close(
        self,
        span: Span | None,
        started: float,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition],
        response: object,
        error: str | None,
        options: CallOptions | None,
        answered: Attributes,
    ) -> None:
        guard = self.tracer._guard
        usage = None
        ended: Attributes = dict(answered)  # the provider's id, model and reasoning tokens
        if isinstance(response, AssistantMessage):
            reason = FINISH_REASONS.get(response.stop_reason, "error")
            ended["gen_ai.response.finish_reasons"] = (reason,)
            usage = response.usage
            if usage is not None:
                ended["gen_ai.usage.input_tokens"] = usage.input
                ended["gen_ai.usage.output_tokens"] = usage.output
                if usage.cache_read:
                    ended["gen_ai.usage.cache_read.input_tokens"] = usage.cache_read
                if usage.cache_write:
                    ended["gen_ai.usage.cache_creation.input_tokens"] = usage.cache_write
            if response.stop_reason is StopReason.ABORTED:
                error = "cancelled"
            elif response.stop_reason is StopReason.ERROR:
                error = "error"
        elif error is None:  # not a response: the run says so; the span marks it
            error = "_OTHER"
        guard.set(span, ended)
        state = run_state.get()
        if state is not None:
            state.response = {k: ended[k] for k in RESPONSE_ATTRIBUTES if k in ended}
            reasoning = ended.get(REASONING_TOKENS)
            state.reasoning += reasoning if isinstance(reasoning, int) else 0
        if error is not None:
            guard.error(span, error)
        self._measure(started, usage, error, answered.get("gen_ai.response.model"))
        if self.tracer.capture_content:
            answer = response if isinstance(response, AssistantMessage) else None
            system = self._system
            if options is not None and options.instructions is not None:
                system = options.instructions  # the run's, sent instead of the client's own
            self._content(span, messages, tools, answer, system)
        guard.end(span)

    def _measure(self, started: float, usage: Any, error: str | None, model: object) -> None:
        guard, tracer = self.tracer._guard, self.tracer
        metric = dict(self._metric)
        if model:
            metric["gen_ai.response.model"] = model
        attributes = dict(metric)
        if error is not None:
            attributes["error.type"] = error
        guard.record(tracer._duration, time.monotonic() - started, attributes)
        if usage is not None:
            for kind, count in (("input", usage.input), ("output", usage.output)):
                guard.record(tracer._tokens, count, {**metric, "gen_ai.token.type": kind})

    def _content(
        self,
        span: Span | None,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition],
        response: AssistantMessage | None,
        system: str | None,
    ) -> None:
        budget = Budget(self.tracer.max_content_chars)
        content: Attributes = {}
        if response is not None:
            output = as_message(response)
            output["finish_reason"] = FINISH_REASONS.get(response.stop_reason, "error")
            budget.put(content, "gen_ai.output.messages", [output])
        if system is not None:
            budget.put(content, "gen_ai.system_instructions", [{"type": "text", "content": system}])
        state = run_state.get()
        cache = state.messages_json if state is not None else None
        budget.put_messages(content, "gen_ai.input.messages", messages, cache)
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
        self.tracer._guard.set(span, content)


def settings_attributes(options: CallOptions | None) -> Attributes:
    """The request attributes of a run's ``ModelSettings`` (over the client's own)."""
    if options is None:
        return {}
    attributes: Attributes = {}
    for name, value in options.settings.set_fields().items():
        if name == "stop":
            attributes["gen_ai.request.stop_sequences"] = tuple(value)
        elif name in REQUEST_PARAMETERS:
            attributes[REQUEST_PARAMETERS[name]] = value
    return attributes


def output_type(options: CallOptions | None) -> Attributes:
    """``gen_ai.output.type`` of a call: ``json`` when it asks for the provider's JSON
    output mode (a native structured output), else ``text``."""
    asked = options is not None and options.output_schema is not None
    return {"gen_ai.output.type": "json" if asked else "text"}


def server_of(base_url: object) -> Attributes:
    """``server.address`` and ``server.port`` of a client's base URL."""
    if not isinstance(base_url, str) or "//" not in base_url:
        return {}

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


class TracedExecute:
    """A tool's ``execute`` whose calls make ``execute_tool`` spans."""

    def __init__(self, tool: Tool, tracer: AgentTracer) -> None:
        self._tool = tool
        self.tracer = tracer
        # Kept visible to another tracer wrapping this one.
        self.otel_attributes = getattr(tool.execute, "otel_attributes", None)

    async def __call__(self, arguments: dict[str, Any], signal: AbortSignal) -> Any:
        guard = self.tracer._guard
        state = run_state.get()
        try:
            call_id, span, budget = self._open(arguments, state)
        except Exception as exc:  # noqa: BLE001 - telemetry never changes a run
            guard.failed("start execute_tool", exc)
            return await self._tool.execute(arguments, signal)
        attached = guard.attach(span)
        started = time.monotonic()
        try:
            value = await self._tool.execute(arguments, signal)
        except BaseException as exc:
            guard.detach(attached)
            error = "timeout" if self._timed_out(signal, started) else self._failure(exc, signal)
            guard.safely("end execute_tool", self._end, state, call_id, span, error)
            raise
        guard.detach(attached)
        guard.safely(
            "end execute_tool", self._close, state, call_id, span, budget, value, started, signal
        )
        return value

    def _open(
        self, arguments: dict[str, Any], state: RunState | None
    ) -> tuple[str | None, Span | None, Budget]:
        tracer = self.tracer
        call = current_tool_call()
        call_id = call.id if call is not None else None
        attributes = tool_attributes(self._tool.name, call_id, self._tool)
        attributes["statemachine.tool.executed"] = True
        budget = Budget(tracer.max_content_chars)
        if tracer.capture_content:
            budget.put(attributes, "gen_ai.tool.call.arguments", arguments)
            budget.mark(attributes)
        span = tracer._guard.start(
            tracer._tracer,
            f"execute_tool {self._tool.name}",
            SpanKind.INTERNAL,
            attributes,
            parent=state.span if state is not None else None,
        )
        if state is not None and call_id is not None:
            state.executed.add(call_id)
            state.open[call_id] = span
        return call_id, span, budget

    def _close(
        self,
        state: RunState | None,
        call_id: str | None,
        span: Span | None,
        budget: Budget,
        value: object,
        started: float,
        signal: AbortSignal,
    ) -> None:
        output = tool_output_from(value)
        error = "timeout" if self._timed_out(signal, started) else None
        if output is not None and error is None:
            if output.is_error:
                error = "tool_error"
            if self.tracer.capture_content:
                ended: Attributes = {}
                budget.put(ended, "gen_ai.tool.call.result", as_result(output.content))
                budget.mark(ended)
                self.tracer._guard.set(span, ended)
        self._end(state, call_id, span, error)

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
        self, state: RunState | None, call_id: str | None, span: Span | None, error: str | None
    ) -> None:
        guard = self.tracer._guard
        if state is not None and call_id is not None:
            state.close(guard, call_id, error)  # unless the run has ended it already
            return
        if error is not None:
            guard.error(span, error)
        guard.end(span)

"""OpenTelemetry spans for runs (``pip install 'agent-statemachine[otel]'``).

Opt-in: nothing here runs unless you wrap a run with an :class:`AgentTracer`, so a run
that is not traced pays nothing. The spans follow the OpenTelemetry GenAI semantic
conventions:

- ``invoke_agent {agent}``: one per run (INTERNAL). ``gen_ai.operation.name``,
  ``gen_ai.agent.name``, ``gen_ai.conversation.id`` (the run id), and the run's end as
  ``statemachine.run.state`` and ``statemachine.run.turns``; status ERROR unless the
  run ended ``Done`` or stopped ``AwaitingUser``.
- ``chat {model}``: one per model call (CLIENT), a child of the run's span.
  ``gen_ai.provider.name``, ``gen_ai.request.model``, ``gen_ai.response.finish_reasons``,
  ``gen_ai.usage.input_tokens`` / ``output_tokens`` (and cache tokens when given);
  status ERROR when the call raised or the response reports an error.
- ``execute_tool {tool}``: one per tool call (INTERNAL), a child of the run's span,
  current while the tool runs (so the tool's own spans nest under it).
  ``gen_ai.tool.name``, ``gen_ai.tool.call.id``, ``gen_ai.tool.type``; status ERROR
  with ``error.type`` when the result is an error (``tool_error``), the tool raised
  (the exception's class), or it was cancelled by an abort (``cancelled``). A call
  answered without running (unknown tool, invalid arguments, denied, or never started
  because of an abort) gets a span too, of no duration, when the run ends, with
  ``statemachine.tool.executed`` false.

Message content (model input and output, tool arguments and results) is recorded only
with ``capture_content=True``: ``gen_ai.input.messages``, ``gen_ai.output.messages``,
``gen_ai.tool.call.arguments``, ``gen_ai.tool.call.result``, each as JSON in the wire
format. Exception messages are never recorded (they may quote content); the class is.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from contextvars import ContextVar
from functools import partial
from typing import Any

import attrs

from statemachine.agent.events import (
    RunResult,
)
from statemachine.agent.executor import (
    current_tool_call,
)
from statemachine.agent.model import ModelClient
from statemachine.agent.run import (
    AgentRun,
)
from statemachine.agent.tools import Tool, tool_output_from
from statemachine.core.abort import AbortSignal
from statemachine.core.messages import (
    AssistantMessage,
    Message,
    StopReason,
    ToolResultMessage,
)
from statemachine.core.table import TurnState
from statemachine.core.tools import ToolDefinition, ToolOutput
from statemachine.core.wire import (
    block_to_dict,
    message_to_dict,
)

try:
    from opentelemetry import trace
    from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, TracerProvider
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "statemachine.otel needs OpenTelemetry: pip install 'agent-statemachine[otel]'"
    ) from exc

__all__ = ["AgentTracer"]

_OK_STATES = frozenset({TurnState.Done, TurnState.AwaitingUser})


class AgentTracer:
    """Makes the spans of the runs it wraps.

    ``tracer_provider`` defaults to the global one (``opentelemetry.trace``).
    Simplest use: ``await AgentTracer().run_agent(model=..., tools=..., messages=...)``
    (the arguments of :func:`statemachine.run_agent`). With an :class:`AgentRun`, wrap
    its model and tools, then run it through :meth:`trace`::

        tracer = AgentTracer()
        run = AgentRun(model=tracer.model(model), tools=tracer.tools(tools), ...)
        result = await tracer.trace(run)
    """

    def __init__(
        self,
        tracer_provider: TracerProvider | None = None,
        *,
        agent_name: str = "statemachine",
        capture_content: bool = False,
    ) -> None:
        self._tracer: Tracer = trace.get_tracer("statemachine", tracer_provider=tracer_provider)
        self.agent_name = agent_name
        self.capture_content = capture_content

    async def run_agent(self, **kwargs: Any) -> RunResult:
        """``statemachine.run_agent(**kwargs)``, traced."""
        kwargs["model"] = self.model(kwargs["model"])
        kwargs["tools"] = self.tools(kwargs.get("tools", ()))
        return await self.trace(AgentRun(**kwargs))

    async def trace(self, run: AgentRun) -> RunResult:
        """Run ``run`` inside its ``invoke_agent`` span and record how it ended."""
        name = f"invoke_agent {self.agent_name}"
        executed: set[str] = set()
        token = _executed.set(executed)
        try:
            with self._span(name, SpanKind.INTERNAL) as span:
                span.set_attribute("gen_ai.operation.name", "invoke_agent")
                span.set_attribute("gen_ai.agent.name", self.agent_name)
                span.set_attribute("gen_ai.conversation.id", run.run_id)
                before = len(run.engine.messages)
                try:
                    result = await run.run()
                except BaseException as exc:
                    _error(span, type(exc).__name__)
                    raise
                span.set_attribute("statemachine.run.state", result.state.value)
                span.set_attribute("statemachine.run.turns", result.turns)
                self._unexecuted_calls(result.messages[before:], executed)
                if result.state not in _OK_STATES:
                    _error(span, result.state.value)
                return result
        finally:
            _executed.reset(token)

    def model(self, client: ModelClient) -> ModelClient:
        """``client``, making a ``chat`` span around each call."""
        return _TracedModel(client, self)

    def tools(self, tools: Iterable[Tool]) -> list[Tool]:
        """``tools``, each making an ``execute_tool`` span around each call."""
        return [attrs.evolve(t, execute=_TracedExecute(t, self)) for t in tools]

    # -- span helpers -------------------------------------------------------------------------

    def _content(self, span: Span, key: str, build: Callable[[], object]) -> None:
        """Record content as JSON, building it only when content is captured."""
        if self.capture_content:
            span.set_attribute(key, json.dumps(build(), ensure_ascii=False, default=str))

    def _span(self, name: str, kind: SpanKind) -> Any:
        # Exceptions are neither recorded nor put in the status by the SDK: their
        # messages may quote content. _error() records the class instead.
        return self._tracer.start_as_current_span(
            name, kind=kind, record_exception=False, set_status_on_exception=False
        )

    def _unexecuted_calls(self, messages: Sequence[Message], executed: set[str]) -> None:
        for message in messages:
            if isinstance(message, ToolResultMessage) and message.tool_call_id not in executed:
                with self._span(f"execute_tool {message.tool_name}", SpanKind.INTERNAL) as span:
                    _tool_attributes(span, message.tool_name, message.tool_call_id)
                    span.set_attribute("statemachine.tool.executed", False)
                    self._content(
                        span, "gen_ai.tool.call.result", partial(message_to_dict, message)
                    )
                    _error(span, "tool_error")


# The ids of the calls that ran in the current run, so that the calls answered without
# running can be told apart when it ends (tool tasks inherit the run's context).
_executed: ContextVar[set[str] | None] = ContextVar("statemachine_otel_executed", default=None)


def _tool_attributes(span: Span, name: str, call_id: str | None) -> None:
    span.set_attribute("gen_ai.operation.name", "execute_tool")
    span.set_attribute("gen_ai.tool.name", name)
    span.set_attribute("gen_ai.tool.type", "function")
    if call_id is not None:
        span.set_attribute("gen_ai.tool.call.id", call_id)


def _error(span: Span, error_type: str) -> None:
    span.set_attribute("error.type", error_type)
    span.set_status(Status(StatusCode.ERROR, error_type))


class _TracedModel:
    def __init__(self, client: ModelClient, tracer: AgentTracer) -> None:
        self._client = client
        self._tracer = tracer
        self._model = str(getattr(client, "model", "") or type(client).__name__)
        module = type(client).__module__
        self._provider = (
            "openai"
            if module.endswith("openai_chat")
            else "anthropic"
            if module.endswith("anthropic_messages")
            else type(client).__name__
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def complete(
        self, messages: Sequence[Message], tools: Sequence[ToolDefinition], signal: AbortSignal
    ) -> AssistantMessage:
        tracer = self._tracer
        with tracer._span(f"chat {self._model}", SpanKind.CLIENT) as span:
            span.set_attribute("gen_ai.operation.name", "chat")
            span.set_attribute("gen_ai.provider.name", self._provider)
            span.set_attribute("gen_ai.request.model", self._model)
            tracer._content(
                span, "gen_ai.input.messages", lambda: [message_to_dict(m) for m in messages]
            )
            try:
                response = await self._client.complete(messages, tools, signal)
            except BaseException as exc:
                _error(span, type(exc).__name__)
                raise
            span.set_attribute("gen_ai.response.finish_reasons", [response.stop_reason.value])
            usage = response.usage
            if usage is not None:
                span.set_attribute("gen_ai.usage.input_tokens", usage.input)
                span.set_attribute("gen_ai.usage.output_tokens", usage.output)
                if usage.cache_read:
                    span.set_attribute("gen_ai.usage.cache_read.input_tokens", usage.cache_read)
                if usage.cache_write:
                    span.set_attribute(
                        "gen_ai.usage.cache_creation.input_tokens", usage.cache_write
                    )
            tracer._content(span, "gen_ai.output.messages", lambda: [message_to_dict(response)])
            if response.stop_reason in (StopReason.ERROR, StopReason.ABORTED):
                _error(span, response.stop_reason.value)
            return response


class _TracedExecute:
    def __init__(self, tool: Tool, tracer: AgentTracer) -> None:
        self._tool = tool
        self._tracer = tracer

    async def __call__(self, arguments: dict[str, Any], signal: AbortSignal) -> Any:
        tracer = self._tracer
        call = current_tool_call()
        call_id = call.id if call is not None else None
        executed = _executed.get()
        if executed is not None and call_id is not None:
            executed.add(call_id)
        name = self._tool.name
        with tracer._span(f"execute_tool {name}", SpanKind.INTERNAL) as span:
            _tool_attributes(span, name, call_id)
            span.set_attribute("statemachine.tool.executed", True)
            tracer._content(span, "gen_ai.tool.call.arguments", lambda: arguments)
            try:
                value = await self._tool.execute(arguments, signal)
            except BaseException as exc:
                cancelled = type(exc).__name__ == "CancelledError"
                _error(span, "cancelled" if cancelled else type(exc).__name__)
                raise
            output: ToolOutput | None = tool_output_from(value)
            if output is not None:
                if output.is_error:
                    _error(span, "tool_error")
                content = output.content
                tracer._content(
                    span, "gen_ai.tool.call.result", lambda: [block_to_dict(b) for b in content]
                )
            return value

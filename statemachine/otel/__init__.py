"""OpenTelemetry spans and metrics for runs (``pip install 'agent-statemachine[otel]'``).

Opt-in: nothing here runs unless you wrap a run with an :class:`AgentTracer`, so a run
that is not traced pays nothing. The spans and metrics follow the OpenTelemetry GenAI
semantic conventions (the latest experimental ones; the table of every attribute and
where it comes from is in the OpenTelemetry guide):

- ``invoke_agent {agent}``: one per run (INTERNAL): the agent's name, id, version and
  description, the conversation id when the caller gives one, the provider and
  model, the output type, the run's token totals (reasoning tokens too, when
  reported), the response of its last model call (``gen_ai.response.*``), and how
  it ended (``statemachine.run.state``, ``statemachine.run.turns``); status ERROR
  unless the run ended ``Done`` or stopped ``AwaitingUser``.
- ``chat {model}``: one per model call (CLIENT), a child of the run's span, current
  while the call runs: provider, request model and parameters, server address and
  port, output type, the response's id, model and finish reasons (the conventions'
  values), token usage (reasoning tokens when the provider reports them),
  ``error.type``.
- ``execute_tool {tool}``: one per tool call (INTERNAL), a child of the run's span,
  current while the tool runs (so the tool's own spans nest under it): the tool's
  name, description, type and call id; ``error.type`` ``tool_error`` (an error
  result), the exception's class, ``cancelled`` (an abort) or ``timeout`` (the
  tool's deadline). A call answered without running (unknown tool, invalid
  arguments, denied, never started because of an abort) gets a span of no duration
  before the next model call's (or at the run's end, for the last batch), with
  ``statemachine.tool.executed`` false; a call the run abandoned after an abort has
  its span ended with the run (which ends as it gives up on the call), not whenever
  the tool returns.
- Metrics: ``gen_ai.client.token.usage`` and ``gen_ai.client.operation.duration``
  per model call (with ``gen_ai.response.model`` when the provider names it).

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

from collections.abc import Iterable
from typing import Any

import attrs

from statemachine._version import __version__
from statemachine.agent.events import RunResult
from statemachine.agent.model import ModelClient, resolve_model
from statemachine.agent.run import AgentRun
from statemachine.agent.tools import Tool
from statemachine.core.messages import ToolResultMessage
from statemachine.core.table import TurnState
from statemachine.errors import UsageError

try:
    from opentelemetry import metrics, trace
    from opentelemetry.metrics import Histogram, MeterProvider
    from opentelemetry.trace import SpanKind, Tracer, TracerProvider
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "statemachine.otel needs OpenTelemetry: pip install 'agent-statemachine[otel]'"
    ) from exc

from statemachine.core.checks import positive_int
from statemachine.otel._guard import Attributes, Guard
from statemachine.otel._spans import (
    REASONING_TOKENS,
    RunState,
    TracedExecute,
    TracedModel,
    record_unexecuted,
    run_state,
)

__all__ = ["DEFAULT_MAX_CONTENT_CHARS", "SCHEMA_URL", "AgentTracer"]

SCHEMA_URL = "https://opentelemetry.io/schemas/1.44.0"
"""The semantic conventions the spans follow: those of
``opentelemetry-semantic-conventions`` 0.66b2 (whose GenAI attributes, developed in
their own repository since, have the names used here)."""
DEFAULT_MAX_CONTENT_CHARS = 65_536
"""Characters of captured content one span may hold (``capture_content=True``)."""

_OK_STATES = frozenset({TurnState.DONE, TurnState.AWAITING_USER})
# The provider names of the library's own adapters (the conventions' values).
# The conventions' gen_ai.provider.name of each bundled adapter (its ``provider``).
_PROVIDERS = {
    "OpenAI": "openai",
    "OpenAI Responses": "openai",
    "Anthropic": "anthropic",
    "Gemini": "gcp.gemini",
    "Bedrock": "aws.bedrock",
}
# The conventions' bucket boundaries for the two GenAI client histograms.
_TOKEN_BUCKETS = [4.0**i for i in range(14)]
_DURATION_BUCKETS = [0.01 * 2.0**i for i in range(14)]


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
        positive_int("max_content_chars", max_content_chars)
        self._guard = Guard()
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
        model = self.model(kwargs["model"])
        kwargs["model"] = model
        kwargs["tools"] = self.tools(kwargs.get("tools", ()))
        run = AgentRun(**kwargs)
        assert isinstance(model, TracedModel)
        return await self._traced(run, conversation_id, model)

    async def trace(self, run: AgentRun, *, conversation_id: str | None = None) -> RunResult:
        """Run ``run`` inside its ``invoke_agent`` span and record how it ended.

        ``conversation_id`` is recorded as ``gen_ai.conversation.id`` (runs of one
        conversation share it); the run's own id is ``statemachine.run.id``. The
        provider and model of the run's span are its model client's, once its first
        call starts (``run_agent`` knows them from the start).
        """
        return await self._traced(run, conversation_id, None)

    async def _traced(
        self, run: AgentRun, conversation_id: str | None, model: TracedModel | None
    ) -> RunResult:
        guard = self._guard
        span = guard.start(
            self._tracer,
            f"invoke_agent {self.agent_name}",
            SpanKind.INTERNAL,
            self._agent_attributes(run, conversation_id, model),
        )
        state = RunState(span, described=model is not None)
        before = len(run.engine.messages)
        token = run_state.set(state)
        attached = guard.attach(span)
        try:
            result = await run.run()
        except BaseException as exc:
            guard.error(span, type(exc).__name__)
            raise
        else:
            ended: Attributes = {
                "statemachine.run.state": result.state.value,
                "statemachine.run.turns": result.turns,
            }
            if result.stats is not None:
                ended["gen_ai.usage.input_tokens"] = result.stats.usage.input
                ended["gen_ai.usage.output_tokens"] = result.stats.usage.output
            if state.reasoning:
                ended[REASONING_TOKENS] = state.reasoning
            ended.update(state.response)  # the response of the run's last model call
            guard.set(span, ended)
            if result.state not in _OK_STATES:
                guard.error(span, result.state.value)
            return result
        finally:
            guard.detach(attached)
            run_state.reset(token)
            self._ended(run, state, before)
            guard.end(span)

    def _ended(self, run: AgentRun, state: RunState, before: int) -> None:
        """The spans the run's end settles, made or ended now (it has just ended):
        calls of its last batch answered without running (the earlier ones had
        theirs when the next model call started), and calls it gave up on."""
        outcome = run.result
        for message in outcome.messages[before:] if outcome is not None else ():
            if isinstance(message, ToolResultMessage):
                record_unexecuted(self, state, message)
        for call_id in list(state.open):  # still running: abandoned with the run
            state.close(self._guard, call_id, "cancelled", abandoned=True)

    def _agent_attributes(
        self, run: AgentRun, conversation_id: str | None, model: TracedModel | None
    ) -> Attributes:
        attributes: Attributes = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.provider.name": model.provider if model else self.provider_name or "_OTHER",
            "gen_ai.agent.name": self.agent_name,
            "gen_ai.output.type": "text" if run.engine.output is None else "json",
            "statemachine.run.id": run.run_id,
        }
        optional = {
            "gen_ai.request.model": model.model if model else None,
            "gen_ai.agent.id": self.agent_id,
            "gen_ai.agent.version": self.agent_version,
            "gen_ai.agent.description": self.agent_description,
            "gen_ai.conversation.id": conversation_id,
        }
        attributes.update({k: v for k, v in optional.items() if v})
        return attributes

    def model(self, client: ModelClient | str, *, provider_name: str | None = None) -> ModelClient:
        """``client`` (or the client a model string names), making a ``chat`` span
        around each call (``provider_name``: its ``gen_ai.provider.name``, when the
        tracer cannot tell). A client this tracer wrapped already is returned as it is;
        an object without ``complete`` is a ``UsageError``. A ``complete`` that is not
        ``async def`` fails each call with the ``UsageError`` an untraced run gives
        (only the call tells: a plain function may return an awaitable)."""
        client = resolve_model(client)
        if isinstance(client, TracedModel) and client.tracer is self:
            return client
        if not callable(getattr(client, "complete", None)):
            raise UsageError(
                f"AgentTracer.model: {type(client).__name__} has no complete method; a model "
                "client defines async def complete(self, messages, tools, signal)"
            )
        return TracedModel(client, self, provider_name or self._provider_of(client))

    def tools(self, tools: Iterable[Tool]) -> list[Tool]:
        """``tools``, each making an ``execute_tool`` span around each call (a tool
        this tracer wrapped already is kept as it is)."""
        return [
            t
            if isinstance(t.execute, TracedExecute) and t.execute.tracer is self
            else attrs.evolve(t, execute=TracedExecute(t, self))
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

"""Telemetry never changes a run, costs what it keeps, and ends every span at the
right time; read back from the SDK's in-memory exporter."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from structlog.testing import capture_logs
from test_otel import Script, _calls, double

import statemachine as sm
from statemachine.otel import AgentTracer


class Raising(SpanProcessor):
    """A span processor that raises in ``on_start`` or ``on_end`` of the spans whose
    name starts with ``prefix``."""

    def __init__(self, hook: str, prefix: str) -> None:
        self.hook = hook
        self.prefix = prefix

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        if self.hook == "on_start" and span.name.startswith(self.prefix):
            raise RuntimeError("processor failed in on_start")

    def on_end(self, span: ReadableSpan) -> None:
        if self.hook == "on_end" and span.name.startswith(self.prefix):
            raise RuntimeError("processor failed in on_end")


def _script() -> Script:
    return Script(_calls(("a", "double", {"n": 2})), sm.AssistantMessage("it is 4"))


def _exported(tracer: AgentTracer | None = None, **options: Any) -> tuple[AgentTracer, Any]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return tracer or AgentTracer(provider, agent_name="tester", **options), exporter


@pytest.mark.timeout(30)
@pytest.mark.parametrize("prefix", ["chat", "execute_tool", "invoke_agent"])
@pytest.mark.parametrize("hook", ["on_start", "on_end"])
def test_a_span_processor_that_raises_never_changes_the_run(hook: str, prefix: str) -> None:
    untraced = asyncio.run(
        sm.run_agent(model=_script(), tools=[double], messages=[sm.UserMessage("go")])
    )
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(Raising(hook, prefix))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = AgentTracer(provider, agent_name="tester")
    with capture_logs() as logs:
        result = asyncio.run(
            tracer.run_agent(model=_script(), tools=[double], messages=[sm.UserMessage("go")])
        )
    assert result.state is sm.TurnState.DONE, result.explanation
    assert result.messages == untraced.messages
    (answer,) = [m for m in result.messages if isinstance(m, sm.ToolResultMessage)]
    assert not answer.is_error
    assert answer.text == "4"
    failures = [e for e in logs if e["event"] == "telemetry_call_failed"]
    assert failures, "the failure was not logged"
    assert failures[0]["log_level"] == "warning"
    assert failures[0]["error"] == "RuntimeError"
    where = f"start {prefix}" if hook == "on_start" else "end span"
    assert failures[0]["where"] == where
    # The other spans were made and exported. The failing one is not: the SDK stops
    # calling processors at the first that raises (on_start: it was never made).
    names = {s.name for s in exporter.get_finished_spans()}
    made = {"chat scripted-1", "execute_tool double", "invoke_agent tester"}
    assert names == {n for n in made if not n.startswith(prefix)}


# -- content capture: bounded per span, linear in the run --------------------------------------


def _long_run(turns: int, max_content_chars: int) -> tuple[int, int]:
    """Run ``turns`` tool turns with content captured: the largest content attribute
    and the content characters of the whole run."""
    steps: list[Any] = [_calls((f"c{i}", "double", {"n": i})) for i in range(turns)]
    model = Script(*steps, sm.AssistantMessage("done"), record=False)
    tracer, exporter = _exported(capture_content=True, max_content_chars=max_content_chars)
    result = asyncio.run(
        tracer.run_agent(
            model=model, tools=[double], messages=[sm.UserMessage("go")], max_turns=turns + 1
        )
    )
    assert result.state is sm.TurnState.DONE
    largest = total = 0
    for span in exporter.get_finished_spans():
        content = sum(
            len(v)
            for k, v in (span.attributes or {}).items()
            if isinstance(v, str)
            and k.startswith("gen_ai.")
            and k.endswith(("messages", "arguments", "result", "definitions", "instructions"))
        )
        largest = max(largest, content)
        total += content
    return largest, total


@pytest.mark.timeout(120)
def test_content_capture_is_bounded_per_span_and_linear_in_the_run() -> None:
    limit = 3_000
    largest_100, total_100 = _long_run(100, limit)
    largest_200, total_200 = _long_run(200, limit)
    assert largest_100 <= limit
    assert largest_200 <= limit
    # Twice the turns, twice the content (a history recorded whole per call: 4x).
    assert total_200 < 2.3 * total_100, (total_100, total_200)


@pytest.mark.timeout(60)
def test_each_message_of_a_run_is_made_json_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from statemachine.otel import _content

    made: list[object] = []
    real = _content.as_message

    def counted(message: Any) -> dict[str, Any]:
        made.append(message)
        return real(message)

    monkeypatch.setattr(_content, "as_message", counted)
    turns = 150
    _long_run(turns, 1_000_000)  # every message fits: each call sends the whole history
    history = 1 + 2 * turns + 1  # the user's, each turn's call and result, the answer
    assert len(made) <= history, (len(made), history)  # not turns * history / 2


@pytest.mark.timeout(30)
def test_content_past_the_limit_keeps_the_newest_messages_and_says_so() -> None:
    tracer, exporter = _exported(capture_content=True, max_content_chars=400)
    model = Script(
        _calls(("a", "double", {"n": 1})),
        _calls(("b", "double", {"n": 2})),
        sm.AssistantMessage("done " + "x" * 1_000),
    )
    asyncio.run(
        tracer.run_agent(model=model, tools=[double], messages=[sm.UserMessage("go " * 50)])
    )
    chats = [s for s in exporter.get_finished_spans() if s.name.startswith("chat")]
    last = dict(chats[-1].attributes or {})
    assert last["statemachine.content.truncated"] is True
    (output,) = json.loads(str(last["gen_ai.output.messages"]))
    assert output["parts"][0]["content"].startswith("done x")  # cut, still JSON
    sent = json.loads(str(last["gen_ai.input.messages"]))
    assert sent[-1]["role"] == "tool"  # the newest kept, the oldest dropped
    assert sent[0]["role"] != "user"
    with pytest.raises(sm.InvalidInputError, match="max_content_chars"):
        AgentTracer(max_content_chars=0)


# -- spans ended at the right time --------------------------------------------------------------


@pytest.mark.timeout(30)
def test_an_abandoned_call_has_its_span_ended_when_the_run_gives_up_on_it() -> None:
    release = asyncio.Event()

    @sm.tool
    async def stubborn() -> str:
        """Swallows cancellation until released."""
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                continue
        return "finally"

    tracer, exporter = _exported()

    async def go() -> tuple[sm.RunResult, list[ReadableSpan]]:
        run = sm.AgentRun(
            model=tracer.model(Script(_calls(("s", "stubborn", {})))),
            tools=tracer.tools([stubborn]),
            messages=[sm.UserMessage("go")],
            grace_period=0.2,
        )
        asyncio.get_running_loop().call_later(0.05, run.abort, "stop")
        result = await tracer.trace(run)
        finished = list(exporter.get_finished_spans())  # before the tool returns
        release.set()
        await asyncio.sleep(0)
        return result, finished

    result, finished = asyncio.run(go())
    assert result.state is sm.TurnState.ABORTED
    (span,) = [s for s in finished if s.name == "execute_tool stubborn"]
    attributes = dict(span.attributes or {})
    assert attributes["statemachine.tool.abandoned"] is True
    assert attributes["error.type"] == "cancelled"
    (root,) = [s for s in finished if s.name.startswith("invoke_agent")]
    assert span.end_time is not None
    assert root.end_time is not None
    assert span.end_time <= root.end_time


@pytest.mark.timeout(30)
def test_a_call_that_never_ran_has_its_span_when_it_is_answered() -> None:
    tracer, exporter = _exported()
    model = Script(
        _calls(("a", "double", {"n": 1}), ("m", "missing", {})),
        _calls(("b", "double", {"n": 2})),
        sm.AssistantMessage("done"),
    )
    result = asyncio.run(
        tracer.run_agent(model=model, tools=[double], messages=[sm.UserMessage("go")])
    )
    assert result.state is sm.TurnState.DONE
    spans = exporter.get_finished_spans()
    (missing,) = [s for s in spans if s.name == "execute_tool missing"]
    chats = sorted((s for s in spans if s.name.startswith("chat")), key=lambda s: s.start_time or 0)
    assert missing.start_time is not None
    assert missing.end_time is not None
    assert chats[1].start_time is not None
    assert chats[0].end_time is not None
    assert chats[0].end_time <= missing.start_time <= missing.end_time <= chats[1].start_time
    assert missing.status.status_code is StatusCode.ERROR


@pytest.mark.timeout(30)
def test_a_tool_past_its_deadline_is_a_timeout_not_a_cancellation() -> None:
    @sm.tool(timeout=0.1)
    async def slow() -> str:
        """Never finishes in time."""
        await asyncio.Event().wait()
        return "unreachable"

    tracer, exporter = _exported()
    model = Script(_calls(("t", "slow", {})), sm.AssistantMessage("done"))
    result = asyncio.run(
        tracer.run_agent(model=model, tools=[slow], messages=[sm.UserMessage("go")])
    )
    (answer,) = [m for m in result.messages if isinstance(m, sm.ToolResultMessage)]
    assert "timed out" in answer.text
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "execute_tool slow"]
    assert dict(span.attributes or {})["error.type"] == "timeout"
    assert span.status.status_code is StatusCode.ERROR


@pytest.mark.timeout(30)
def test_a_client_answering_something_else_fails_the_run_as_untraced() -> None:
    class Odd:
        model = "odd-1"

        async def complete(self, *args: Any) -> Any:
            return {"not": "a message"}

    untraced = asyncio.run(sm.run_agent(model=Odd(), messages=[sm.UserMessage("go")]))
    tracer, exporter = _exported(capture_content=True)
    traced = asyncio.run(tracer.run_agent(model=Odd(), messages=[sm.UserMessage("go")]))
    assert (traced.state, traced.explanation) == (untraced.state, untraced.explanation)
    chat = next(s for s in exporter.get_finished_spans() if s.name == "chat odd-1")
    assert dict(chat.attributes or {})["error.type"] == "_OTHER"


@pytest.mark.timeout(30)
def test_a_failure_in_the_tracers_own_work_never_changes_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from statemachine.otel import _content

    def broken(*args: Any) -> None:
        raise ValueError("content could not be built")

    monkeypatch.setattr(_content.Budget, "put", broken)
    tracer, exporter = _exported(capture_content=True)
    with capture_logs() as logs:
        result = asyncio.run(
            tracer.run_agent(model=_script(), tools=[double], messages=[sm.UserMessage("go")])
        )
    assert result.state is sm.TurnState.DONE
    (answer,) = [m for m in result.messages if isinstance(m, sm.ToolResultMessage)]
    assert answer.text == "4"
    assert not answer.is_error
    failures = {e["where"] for e in logs if e["event"] == "telemetry_call_failed"}
    # the tool ran untraced, so the next call tried to record it as unexecuted
    assert failures == {"start execute_tool", "start chat", "end chat"}
    assert "invoke_agent tester" in {s.name for s in exporter.get_finished_spans()}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("with_options", [False, True])
def test_a_client_whose_complete_is_not_async_is_refused_with_a_usage_error(
    with_options: bool,
) -> None:
    done = sm.AssistantMessage([sm.TextContent("done")])

    class SyncClient:
        model = "sync-1"

        def complete(self, *args: Any, **kwargs: Any) -> Any:
            return done

    class SyncClientWithOptions(SyncClient):
        def complete(self, *args: Any, options: Any = None) -> Any:
            return done

    client = SyncClientWithOptions() if with_options else SyncClient()
    untraced = asyncio.run(sm.run_agent(model=client, messages=[sm.UserMessage("go")]))
    tracer, exporter = _exported()
    traced = asyncio.run(tracer.run_agent(model=client, messages=[sm.UserMessage("go")]))
    assert traced.state is sm.TurnState.FAILED
    assert (traced.state, traced.explanation) == (untraced.state, untraced.explanation)
    assert "complete must be an async def" in traced.explanation
    assert traced.error is not None
    assert isinstance(traced.error.__cause__, sm.UsageError)
    chat = next(s for s in exporter.get_finished_spans() if s.name == "chat sync-1")
    assert dict(chat.attributes or {})["error.type"] == "UsageError"


def test_an_object_without_complete_is_refused_when_wrapped() -> None:
    tracer, _ = _exported()
    with pytest.raises(sm.UsageError, match="object has no complete method"):
        tracer.model(object())  # type: ignore[arg-type]

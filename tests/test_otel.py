"""OpenTelemetry spans of traced runs, read back from the SDK's in-memory exporter."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import statemachine as sm
import statemachine.messages
from statemachine.otel import AgentTracer
from statemachine.testing import ScriptedModel

ROOT = Path(__file__).resolve().parent.parent


class Script(ScriptedModel):
    """A scripted model with a name: the tracer reports a client's ``model``."""

    model = "scripted-1"


def _calls(*calls: tuple[str, str, dict[str, Any]]) -> sm.AssistantMessage:
    blocks = tuple(sm.ToolCall(i, name, args) for i, name, args in calls)
    usage = sm.messages.Usage(input=100, output=20, cache_read=5)
    return sm.AssistantMessage(blocks, stop_reason=sm.messages.StopReason.TOOL_USE, usage=usage)


@sm.tool
async def double(n: int) -> str:
    """Double a number."""
    await asyncio.sleep(0.01)
    return str(2 * n)


@sm.tool
async def fail() -> str:
    """Always raises."""
    raise RuntimeError("secret detail that must not reach the trace")


@sm.tool
async def wait_forever() -> str:
    """Never finishes by itself."""
    await asyncio.sleep(3600)
    return "unreachable"


def _tracer(capture_content: bool = False) -> tuple[AgentTracer, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return AgentTracer(provider, agent_name="tester", capture_content=capture_content), exporter


def _tree(spans: Sequence[ReadableSpan]) -> tuple[ReadableSpan, list[ReadableSpan]]:
    (root,) = [s for s in spans if s.parent is None]
    assert root.context is not None
    children = [s for s in spans if s.parent is not None]
    for child in children:
        assert child.parent is not None
        assert child.parent.span_id == root.context.span_id, child.name
        assert child.context is not None
        assert child.context.trace_id == root.context.trace_id
    return root, sorted(children, key=lambda s: (s.start_time or 0, s.name))


@pytest.mark.timeout(30)
def test_a_run_with_parallel_tools_and_an_error_gives_the_span_tree() -> None:
    tracer, exporter = _tracer()
    model = Script(
        _calls(("a", "double", {"n": 2}), ("b", "double", {"n": 5}), ("c", "fail", {})),
        _calls(("d", "missing", {})),
        sm.AssistantMessage(
            (sm.TextContent("done"),), usage=sm.messages.Usage(input=300, output=4)
        ),
    )
    result = asyncio.run(
        tracer.run_agent(
            model=model, tools=[double, fail], messages=[sm.UserMessage("go")], run_id="run-1"
        )
    )
    assert result.state is sm.TurnState.DONE
    root, children = _tree(exporter.get_finished_spans())
    assert root.name == "invoke_agent tester"
    assert root.kind is SpanKind.INTERNAL
    assert dict(root.attributes or {}) == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.provider.name": "Script",  # a client the tracer does not know: its class
        "gen_ai.request.model": "scripted-1",
        "gen_ai.agent.name": "tester",
        "statemachine.run.id": "run-1",
        "statemachine.run.state": "Done",
        "statemachine.run.turns": 3,
        "gen_ai.usage.input_tokens": 500,
        "gen_ai.usage.output_tokens": 44,
        "gen_ai.output.type": "text",
        "gen_ai.response.finish_reasons": ("stop",),  # the last model call's
    }
    assert root.status.status_code is StatusCode.UNSET
    chats = [s for s in children if s.name == "chat scripted-1"]
    assert len(chats) == 3
    assert all(s.kind is SpanKind.CLIENT for s in chats)
    first = dict(chats[0].attributes or {})
    assert first["gen_ai.operation.name"] == "chat"
    assert first["gen_ai.request.model"] == "scripted-1"
    assert first["gen_ai.response.finish_reasons"] == ("tool_call",)
    assert first["gen_ai.usage.input_tokens"] == 100
    assert first["gen_ai.usage.output_tokens"] == 20
    assert first["gen_ai.usage.cache_read.input_tokens"] == 5
    assert "gen_ai.input.messages" not in first  # content only when asked for
    tools = {
        str(dict(s.attributes or {})["gen_ai.tool.call.id"]): s for s in children if s not in chats
    }
    assert sorted(tools) == ["a", "b", "c", "d"]
    for call_id in "ab":
        span = tools[call_id]
        assert span.name == "execute_tool double"
        assert span.status.status_code is StatusCode.UNSET
        assert dict(span.attributes or {})["statemachine.tool.executed"] is True
    # a and b ran side by side: their spans overlap
    a, b = tools["a"], tools["b"]
    assert a.start_time is not None
    assert a.end_time is not None
    assert b.start_time is not None
    assert b.end_time is not None
    assert a.start_time < b.end_time
    assert b.start_time < a.end_time
    failed = tools["c"]
    assert failed.status.status_code is StatusCode.ERROR
    assert dict(failed.attributes or {})["error.type"] == "RuntimeError"
    missing = tools["d"]
    assert missing.name == "execute_tool missing"
    assert dict(missing.attributes or {})["statemachine.tool.executed"] is False
    assert missing.status.status_code is StatusCode.ERROR
    everything = json.dumps([s.to_json() for s in exporter.get_finished_spans()])
    assert "secret detail" not in everything


@pytest.mark.timeout(30)
def test_an_aborted_run_marks_the_cancelled_call_and_the_run() -> None:
    tracer, exporter = _tracer()
    model = Script(_calls(("h", "wait_forever", {}), ("x", "double", {"n": 1})))

    async def go() -> sm.RunResult:
        run = sm.AgentRun(
            model=tracer.model(model),
            tools=tracer.tools([wait_forever, double]),
            messages=[sm.UserMessage("go")],
            grace_period=0.2,
        )
        asyncio.get_running_loop().call_later(0.2, run.abort, "stop")
        return await tracer.trace(run)

    result = asyncio.run(go())
    assert result.state is sm.TurnState.ABORTED
    root, children = _tree(exporter.get_finished_spans())
    assert root.status.status_code is StatusCode.ERROR
    assert dict(root.attributes or {})["error.type"] == "Aborted"
    tools = {dict(s.attributes or {}).get("gen_ai.tool.call.id"): s for s in children}
    hung = tools["h"]
    assert hung.status.status_code is StatusCode.ERROR
    assert dict(hung.attributes or {})["error.type"] == "cancelled"
    assert tools["x"].status.status_code is StatusCode.UNSET


@pytest.mark.timeout(30)
def test_content_is_recorded_only_when_asked_for() -> None:
    tracer, exporter = _tracer(capture_content=True)
    model = Script(_calls(("a", "double", {"n": 21})), sm.AssistantMessage("it is 42"))
    asyncio.run(tracer.run_agent(model=model, tools=[double], messages=[sm.UserMessage("hi")]))
    spans = {s.name: dict(s.attributes or {}) for s in exporter.get_finished_spans()}
    tool = spans["execute_tool double"]
    assert json.loads(str(tool["gen_ai.tool.call.arguments"])) == {"n": 21}
    assert json.loads(str(tool["gen_ai.tool.call.result"])) == "42"
    chat = spans["chat scripted-1"]
    sent = json.loads(str(chat["gen_ai.input.messages"]))
    assert sent == [
        {"role": "user", "parts": [{"type": "text", "content": "hi"}]},
        {
            "role": "assistant",
            "parts": [{"type": "tool_call", "id": "a", "name": "double", "arguments": {"n": 21}}],
        },
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "a", "response": "42"}]},
    ]
    assert json.loads(str(chat["gen_ai.output.messages"])) == [
        {
            "role": "assistant",
            "parts": [{"type": "text", "content": "it is 42"}],
            "finish_reason": "stop",
        }
    ]
    (definition,) = json.loads(str(chat["gen_ai.tool.definitions"]))
    assert definition["type"] == "function"
    assert definition["name"] == "double"
    assert definition["parameters"]["properties"]["n"]["type"] == "integer"


@pytest.mark.timeout(30)
def test_a_failing_model_call_is_an_error_span() -> None:
    class Broken:
        model = "broken-1"

        async def complete(self, *args: Any) -> sm.AssistantMessage:
            raise ConnectionError("api key sk-123 in the message")

    tracer, exporter = _tracer()
    result = asyncio.run(tracer.run_agent(model=Broken(), messages=[sm.UserMessage("go")]))
    assert result.state is sm.TurnState.FAILED
    spans = {s.name: s for s in exporter.get_finished_spans()}
    chat = spans["chat broken-1"]
    assert chat.status.status_code is StatusCode.ERROR
    assert dict(chat.attributes or {})["error.type"] == "ConnectionError"
    assert "sk-123" not in json.dumps([s.to_json() for s in spans.values()])
    assert spans["invoke_agent tester"].status.status_code is StatusCode.ERROR


@pytest.mark.timeout(60)
def test_an_untraced_run_never_loads_opentelemetry() -> None:
    code = (
        "import sys, statemachine as sm, statemachine.testing, statemachine.workspace\n"
        "assert not [m for m in sys.modules if m.startswith('opentelemetry')]"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr


@pytest.mark.timeout(60)
def test_without_opentelemetry_the_import_says_which_extra_to_install() -> None:
    code = "import sys; sys.modules['opentelemetry'] = None; import statemachine.otel"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert proc.returncode == 1
    assert "pip install 'agent-statemachine[otel]'" in proc.stderr.splitlines()[-1]


@pytest.mark.timeout(30)
def test_without_content_capture_no_content_is_even_built(monkeypatch: pytest.MonkeyPatch) -> None:
    # Building the history's JSON per model call would make tracing cost grow with the run.
    def refuse(*args: Any) -> Any:
        raise AssertionError("content built although capture_content is off")

    for module, helper in [
        ("_spans", "as_message"),
        ("_spans", "as_result"),
        ("_content", "as_message"),
        ("_content", "as_part"),
    ]:
        monkeypatch.setattr(f"statemachine.otel.{module}.{helper}", refuse)
    tracer, exporter = _tracer()
    model = Script(
        _calls(("a", "double", {"n": 1}), ("b", "missing", {})), sm.AssistantMessage("ok")
    )
    result = asyncio.run(
        tracer.run_agent(model=model, tools=[double], messages=[sm.UserMessage("go")])
    )
    assert result.state is sm.TurnState.DONE
    assert len(exporter.get_finished_spans()) == 5


# -- a run's instructions, settings and deltas under tracing ------------------------------


def _streamed(tracer: AgentTracer, **kwargs: Any) -> tuple[sm.RunResult, list[sm.RunEvent]]:
    async def main() -> tuple[sm.RunResult, list[sm.RunEvent]]:
        run = sm.AgentRun(messages="hi", **{**kwargs, "model": tracer.model(kwargs["model"])})
        events = run.events()
        result = await tracer.trace(run)
        return result, [e async for e in events]

    return asyncio.run(main())


@pytest.mark.timeout(30)
def test_a_traced_client_gets_the_runs_instructions_settings_and_listeners() -> None:
    tracer, exporter = _tracer(capture_content=True)
    model = Script(sm.AssistantMessage("it is forty two"), stream=True)
    model.system = "the client's own prompt"  # type: ignore[attr-defined]
    settings = sm.ModelSettings(temperature=0.5, max_tokens=77, top_p=0.9, stop=["END"])
    result, events = _streamed(
        tracer, model=model, instructions="Be brief.", model_settings=settings
    )
    assert result.final_text == "it is forty two"
    [request] = model.requests
    assert (request.instructions, request.settings) == ("Be brief.", settings)
    texts = [e.text for e in events if isinstance(e, sm.TextDelta)]
    assert len(texts) > 1
    assert "".join(texts) == "it is forty two"
    chat = {s.name: dict(s.attributes or {}) for s in exporter.get_finished_spans()}[
        "chat scripted-1"
    ]
    assert json.loads(str(chat["gen_ai.system_instructions"])) == [
        {"type": "text", "content": "Be brief."}
    ]
    assert chat["gen_ai.request.temperature"] == 0.5
    assert chat["gen_ai.request.max_tokens"] == 77
    assert chat["gen_ai.request.top_p"] == 0.9
    assert chat["gen_ai.request.stop_sequences"] == ("END",)


@pytest.mark.timeout(30)
def test_without_run_instructions_the_clients_own_system_prompt_is_recorded() -> None:
    tracer, exporter = _tracer(capture_content=True)
    model = Script(sm.AssistantMessage("ok"))
    model.system = "the client's own prompt"  # type: ignore[attr-defined]
    result, _ = _streamed(tracer, model=model)
    assert result.ok
    chat = dict(exporter.get_finished_spans()[0].attributes or {})
    assert json.loads(str(chat["gen_ai.system_instructions"])) == [
        {"type": "text", "content": "the client's own prompt"}
    ]
    assert "gen_ai.request.temperature" not in chat


class Plain:
    """A client written against ``complete(messages, tools, signal)`` only."""

    model = "plain-1"

    def __init__(self) -> None:
        self.calls = 0

    async def complete(
        self,
        messages: Sequence[sm.Message],
        tools: Sequence[sm.ToolDefinition],
        signal: sm.AbortSignal,
    ) -> sm.AssistantMessage:
        self.calls += 1
        return sm.AssistantMessage("plain answer")


@pytest.mark.timeout(30)
def test_a_traced_client_without_options_works_and_is_refused_what_it_cannot_send() -> None:
    tracer, exporter = _tracer()
    model = Plain()
    result, _ = _streamed(tracer, model=model)
    assert result.final_text == "plain answer"
    with pytest.raises(sm.UsageError, match="cannot send instructions"):
        _streamed(tracer, model=model, instructions="Be brief.")
    with pytest.raises(sm.UsageError, match="cannot send temperature"):
        _streamed(tracer, model=model, model_settings=sm.ModelSettings(temperature=0.1))
    assert model.calls == 1
    assert [s.name for s in exporter.get_finished_spans()].count("chat plain-1") == 1


@pytest.mark.timeout(30)
def test_a_traced_adapter_streams_deltas_and_keeps_its_supported_settings() -> None:
    from providers_server import FAST, LoopbackServer, Sleeps, sse

    from statemachine.providers import OpenAIResponsesModel

    tracer, exporter = _tracer()
    with LoopbackServer() as server:
        server.add(sse("responses/text_stream.sse", piece_size=9))
        model = OpenAIResponsesModel(
            "gpt-5-mini", api_key="sk-test", base_url=server.url + "/v1", retry=FAST, sleep=Sleeps()
        )
        with pytest.raises(sm.UsageError, match="cannot send stop"):
            _streamed(tracer, model=model, model_settings=sm.ModelSettings(stop=["END"]))
        result, events = _streamed(
            tracer,
            model=model,
            instructions="Be brief.",
            model_settings=sm.ModelSettings(max_tokens=50),
        )
        body = server.requests[0].json()
    assert (body["instructions"], body["max_output_tokens"]) == ("Be brief.", 50)
    texts = [e.text for e in events if isinstance(e, sm.TextDelta)]
    assert texts == ["The work", "space contains ", "README.md", " and src/", "index.ts."]
    assert "".join(texts) == result.final_text
    chat = dict(exporter.get_finished_spans()[0].attributes or {})
    assert chat["gen_ai.request.max_tokens"] == 50
    assert chat["gen_ai.provider.name"] == "openai"


def test_the_gemini_and_bedrock_adapters_have_the_conventions_provider_names() -> None:
    from statemachine.providers import BedrockModel, GeminiModel

    tracer, _ = _tracer()
    gemini = tracer.model(GeminiModel("gemini-2.5-flash", api_key="AIza-test"))
    bedrock = tracer.model(
        BedrockModel(
            "us.anthropic.claude-sonnet-4-20250514-v1:0",
            region="eu-central-1",
            aws_access_key_id="AKIAFAKEFAKEFAKE",
            aws_secret_access_key="fake-secret-0123456789",
        )
    )
    assert (gemini.provider, bedrock.provider) == ("gcp.gemini", "aws.bedrock")  # type: ignore[attr-defined]


def test_a_model_string_is_the_client_it_names_traced(monkeypatch: pytest.MonkeyPatch) -> None:
    from statemachine.providers import OpenAIChatModel

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-key")
    tracer, _ = _tracer()
    traced = tracer.model("openai:gpt-4.1")
    # Before, the string itself was wrapped: a client with no model and no provider.
    assert traced.provider == "openai"  # type: ignore[attr-defined]
    assert traced.model == "gpt-4.1"  # type: ignore[attr-defined]
    assert not isinstance(traced, OpenAIChatModel)  # wrapped, so each call is a span

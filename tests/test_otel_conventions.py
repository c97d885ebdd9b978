"""The OpenTelemetry GenAI semantic conventions, attribute by attribute: what each span
and metric carries, and when (at creation, for samplers, or at the end)."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from collections.abc import Sequence
from typing import Any

import attrs
import pytest
from opentelemetry.context import Context
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes
from opentelemetry.semconv.schemas import Schemas
from opentelemetry.trace import Link, SpanKind, StatusCode, TraceState
from opentelemetry.util.types import Attributes
from providers_server import FAST, LoopbackServer, Reply, fixture_text, sse
from test_mcp import DEVNULL, SERVER
from test_otel import Script, _calls, double

import statemachine as sm
import statemachine.messages
from statemachine.agent.model import CallOptions
from statemachine.otel import SCHEMA_URL, AgentTracer
from statemachine.providers.anthropic_messages import AnthropicModel
from statemachine.providers.gemini import GeminiModel
from statemachine.providers.openai_chat import OpenAIChatModel
from statemachine.providers.openai_responses import OpenAIResponsesModel

KEY = "sk-test-key-0123456789"


class Recorder(Sampler):
    """Samples everything and keeps the attributes each span had at its creation."""

    def __init__(self) -> None:
        self.seen: dict[str, dict[str, Any]] = {}

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: TraceState | None = None,
    ) -> SamplingResult:
        self.seen.setdefault(name, dict(attributes or {}))
        return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes)

    def get_description(self) -> str:
        return "recorder"


def _setup(
    sampler: Sampler | None = None, **options: Any
) -> tuple[AgentTracer, InMemorySpanExporter, InMemoryMetricReader]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=sampler) if sampler else TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    options.setdefault("agent_name", "tester")
    return AgentTracer(provider, meter_provider=meters, **options), exporter, reader


def _by_name(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    return {s.name: s for s in exporter.get_finished_spans()}


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@pytest.mark.timeout(30)
def test_the_agent_span_names_the_agent_the_conversation_and_the_totals() -> None:
    sampler = Recorder()
    tracer, exporter, _ = _setup(
        sampler,
        agent_id="agent-7",
        agent_version="2.1",
        agent_description="Doubles numbers.",
        provider_name="acme",
    )
    model = Script(_calls(("a", "double", {"n": 2})), sm.AssistantMessage("4"))
    asyncio.run(
        tracer.run_agent(
            model=model,
            tools=[double],
            messages=[sm.UserMessage("go")],
            run_id="r1",
            conversation_id="ticket-1234",
        )
    )
    root = _by_name(exporter)["invoke_agent tester"]
    attributes = dict(root.attributes or {})
    assert attributes["gen_ai.conversation.id"] == "ticket-1234"
    assert attributes["statemachine.run.id"] == "r1"
    assert attributes["gen_ai.agent.id"] == "agent-7"
    assert attributes["gen_ai.agent.version"] == "2.1"
    assert attributes["gen_ai.agent.description"] == "Doubles numbers."
    assert attributes["gen_ai.usage.input_tokens"] == 100
    assert attributes["gen_ai.usage.output_tokens"] == 20
    at_creation = sampler.seen["invoke_agent tester"]
    assert at_creation["gen_ai.operation.name"] == "invoke_agent"
    assert at_creation["gen_ai.agent.name"] == "tester"
    assert at_creation["gen_ai.provider.name"] == "acme"
    assert at_creation["gen_ai.request.model"] == "scripted-1"
    chat = sampler.seen["chat scripted-1"]
    assert chat["gen_ai.provider.name"] == "acme"
    assert chat["gen_ai.request.model"] == "scripted-1"
    tool = sampler.seen["execute_tool double"]
    assert tool["gen_ai.tool.name"] == "double"
    assert tool["gen_ai.tool.description"] == "Double a number."
    assert tool["gen_ai.tool.type"] == "function"


def _chat_provider(model: Any, per_client: str | None = None, **options: Any) -> str:
    tracer, exporter, _ = _setup(**options)
    traced = tracer.model(model, provider_name=per_client)
    asyncio.run(tracer.run_agent(model=traced, messages=[sm.UserMessage("go")]))
    (chat,) = [s for s in exporter.get_finished_spans() if s.name.startswith("chat")]
    return str(dict(chat.attributes or {})["gen_ai.provider.name"])


@pytest.mark.timeout(30)
def test_the_provider_name_of_a_user_client_can_be_set() -> None:
    class Named(Script):
        provider_name = "in-house"

    def answer() -> sm.AssistantMessage:
        return sm.AssistantMessage("x")

    assert _chat_provider(Script(answer())) == "Script"  # unknown: the client's class
    assert _chat_provider(Named(answer())) == "in-house"  # the client says it
    assert _chat_provider(Script(answer()), provider_name="acme") == "acme"  # the tracer
    assert _chat_provider(Named(answer()), provider_name="acme") == "in-house"
    assert _chat_provider(Named(answer()), per_client="mine") == "mine"  # per client


@pytest.mark.timeout(60)
def test_an_adapter_gives_provider_server_and_request_parameters() -> None:
    port = _closed_port()
    sampler = Recorder()
    tracer, exporter, reader = _setup(sampler)
    client = OpenAIChatModel(
        "gpt-test",
        base_url=f"http://127.0.0.1:{port}/v1",
        api_key="sk-test-key-0123456789",
        max_tokens=256,
        temperature=0.25,
    )
    result = asyncio.run(tracer.run_agent(model=client, messages=[sm.UserMessage("hi")]))
    assert result.state is sm.TurnState.FAILED  # nothing listens on the port
    chat = _by_name(exporter)["chat gpt-test"]
    assert chat.kind is SpanKind.CLIENT
    at_creation = sampler.seen["chat gpt-test"]
    assert at_creation == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-test",
        "gen_ai.request.max_tokens": 256,
        "gen_ai.output.type": "text",
        "gen_ai.request.temperature": 0.25,
        "server.address": "127.0.0.1",
        "server.port": port,
    }
    attributes = dict(chat.attributes or {})
    assert chat.status.status_code is StatusCode.ERROR
    assert attributes["error.type"]  # the exception's class (or its HTTP status)
    everything = json.dumps([s.to_json() for s in exporter.get_finished_spans()])
    assert "sk-test-key" not in everything
    (duration,) = _points(reader, "gen_ai.client.operation.duration")
    assert dict(duration.attributes or {})["error.type"] == attributes["error.type"]
    assert dict(duration.attributes or {})["server.port"] == port


def _points(reader: InMemoryMetricReader, name: str) -> list[HistogramDataPoint]:
    data = reader.get_metrics_data()
    assert data is not None
    points: list[HistogramDataPoint] = []
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            assert scope.scope.name == "statemachine"
            assert scope.scope.version == sm.__version__
            assert scope.scope.schema_url == SCHEMA_URL
            for metric in scope.metrics:
                if metric.name == name:
                    points += [
                        p for p in metric.data.data_points if isinstance(p, HistogramDataPoint)
                    ]
    return points


@pytest.mark.timeout(30)
def test_the_genai_metrics_count_tokens_and_time_per_model_call() -> None:
    tracer, _, reader = _setup()
    model = Script(_calls(("a", "double", {"n": 2})), sm.AssistantMessage("4"))
    asyncio.run(tracer.run_agent(model=model, tools=[double], messages=[sm.UserMessage("go")]))
    tokens = {
        str(dict(p.attributes or {})["gen_ai.token.type"]): p
        for p in _points(reader, "gen_ai.client.token.usage")
    }
    assert sorted(tokens) == ["input", "output"]
    assert tokens["input"].sum == 100  # the second response reports no usage
    assert tokens["input"].count == 1
    assert tokens["output"].sum == 20
    assert dict(tokens["input"].attributes or {})["gen_ai.operation.name"] == "chat"
    assert dict(tokens["input"].attributes or {})["gen_ai.request.model"] == "scripted-1"
    (duration,) = _points(reader, "gen_ai.client.operation.duration")
    assert duration.count == 2
    assert "error.type" not in dict(duration.attributes or {})
    assert tokens["input"].explicit_bounds[:3] == (1.0, 4.0, 16.0)
    assert duration.explicit_bounds[:3] == (0.01, 0.02, 0.04)


@pytest.mark.timeout(30)
def test_the_scope_names_the_library_its_version_and_the_schema() -> None:
    tracer, exporter, _ = _setup()
    asyncio.run(
        tracer.run_agent(model=Script(sm.AssistantMessage("x")), messages=[sm.UserMessage("go")])
    )
    for span in exporter.get_finished_spans():
        scope = span.instrumentation_scope
        assert scope is not None
        assert (scope.name, scope.version, scope.schema_url) == (
            "statemachine",
            sm.__version__,
            SCHEMA_URL,
        )


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("stop", "reason", "error"),
    [
        (sm.messages.StopReason.STOP, "stop", None),
        (sm.messages.StopReason.TOOL_USE, "tool_call", None),
        (sm.messages.StopReason.LENGTH, "length", None),
        (sm.messages.StopReason.ERROR, "error", "error"),
    ],
)
def test_finish_reasons_use_the_conventions_values(
    stop: sm.messages.StopReason, reason: str, error: str | None
) -> None:
    tracer, exporter, _ = _setup(capture_content=True)
    response = sm.AssistantMessage(
        (sm.TextContent("x"),), stop_reason=stop, error_message="e" if error else None
    )
    asyncio.run(tracer.run_agent(model=Script(response), messages=[sm.UserMessage("go")]))
    chat = dict(_by_name(exporter)["chat scripted-1"].attributes or {})
    assert chat["gen_ai.response.finish_reasons"] == (reason,)
    assert chat.get("error.type") == error
    (output,) = json.loads(str(chat["gen_ai.output.messages"]))
    assert output["finish_reason"] == reason


@pytest.mark.timeout(30)
def test_captured_content_has_the_conventions_shapes() -> None:
    class Instructed(Script):
        system = "You double numbers."

    image = sm.ImageContent("iVBORw0KGgo=", "image/png")
    thinking = sm.messages.ThinkingContent("let me think")
    model = Instructed(
        sm.AssistantMessage(
            (thinking, sm.ToolCall("a", "double", {"n": 2})),
            stop_reason=sm.messages.StopReason.TOOL_USE,
        ),
        sm.AssistantMessage("4"),
    )
    tracer, exporter, _ = _setup(capture_content=True)
    asyncio.run(
        tracer.run_agent(
            model=model,
            tools=[double],
            messages=[sm.UserMessage((sm.TextContent("double 2"), image))],
        )
    )
    chats = sorted(
        (s for s in exporter.get_finished_spans() if s.name.startswith("chat")),
        key=lambda s: s.start_time or 0,
    )
    first = dict(chats[0].attributes or {})
    assert json.loads(str(first["gen_ai.system_instructions"])) == [
        {"type": "text", "content": "You double numbers."}
    ]
    assert json.loads(str(first["gen_ai.input.messages"])) == [
        {
            "role": "user",
            "parts": [
                {"type": "text", "content": "double 2"},
                {
                    "type": "blob",
                    "modality": "image",
                    "mime_type": "image/png",
                    "content": "iVBORw0KGgo=",
                },
            ],
        }
    ]
    assert json.loads(str(first["gen_ai.output.messages"])) == [
        {
            "role": "assistant",
            "parts": [
                {"type": "reasoning", "content": "let me think"},
                {"type": "tool_call", "id": "a", "name": "double", "arguments": {"n": 2}},
            ],
            "finish_reason": "tool_call",
        }
    ]
    tool = dict(_by_name(exporter)["execute_tool double"].attributes or {})
    assert json.loads(str(tool["gen_ai.tool.call.arguments"])) == {"n": 2}
    assert json.loads(str(tool["gen_ai.tool.call.result"])) == "4"


@pytest.mark.timeout(60)
def test_mcp_tools_are_extensions_with_their_descriptions() -> None:
    from statemachine.mcp import MCPServer

    tracer, exporter, _ = _setup()

    async def go() -> sm.RunResult:
        server = MCPServer.stdio(sys.executable, [str(SERVER), "stdio"], stderr=DEVNULL)
        async with server:
            model = Script(_calls(("a", "add", {"a": 1, "b": 2})), sm.AssistantMessage("3"))
            return await tracer.run_agent(
                model=model, tools=server.tools, messages=[sm.UserMessage("go")]
            )

    result = asyncio.run(go())
    assert result.state is sm.TurnState.DONE
    tool = dict(_by_name(exporter)["execute_tool add"].attributes or {})
    assert tool["gen_ai.tool.type"] == "extension"
    assert tool["gen_ai.tool.description"] == "Add two integers."


@pytest.mark.timeout(30)
def test_a_traced_agent_run_names_its_provider_and_model_from_its_first_call() -> None:
    tracer, exporter, _ = _setup(provider_name="acme")
    run = sm.AgentRun(
        model=tracer.model(Script(sm.AssistantMessage("x"))),
        messages=[sm.UserMessage("go")],
        run_id="r2",
    )
    asyncio.run(tracer.trace(run, conversation_id="c-9"))
    root = dict(_by_name(exporter)["invoke_agent tester"].attributes or {})
    assert root["gen_ai.provider.name"] == "acme"
    assert root["gen_ai.request.model"] == "scripted-1"
    assert root["gen_ai.conversation.id"] == "c-9"


def _openai(url: str) -> sm.ModelClient:
    return OpenAIChatModel("gpt-4o-mini", api_key=KEY, base_url=url + "/v1", retry=FAST)


def _anthropic(url: str) -> sm.ModelClient:
    return AnthropicModel("claude-sonnet-4-5", api_key=KEY, base_url=url, retry=FAST)


def _responses(url: str) -> sm.ModelClient:
    return OpenAIResponsesModel("gpt-5-mini", api_key=KEY, base_url=url + "/v1", retry=FAST)


def _gemini(url: str) -> sm.ModelClient:
    return GeminiModel("gemini-2.5-flash", api_key=KEY, base_url=url)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("make", "stream", "response_id", "model"),
    [
        (_openai, "openai/text_stream.sse", "chatcmpl-AZx81", "gpt-4o-mini-2024-07-18"),
        (
            _anthropic,
            "anthropic/text_stream.sse",
            "msg_01XFDUDYJgAACzvnptvVoYEL",
            "claude-sonnet-4-5-20250929",
        ),
        (_responses, "responses/text_stream.sse", "resp_1", "gpt-5-mini"),
        (_gemini, "gemini/text_stream.sse", "r1", "gemini-2.5-flash"),
    ],
    ids=["openai", "anthropic", "responses", "gemini"],
)
def test_the_chat_span_has_the_response_id_and_model_the_provider_gave(
    make: Any, stream: str, response_id: str, model: str
) -> None:
    tracer, exporter, _ = _setup()
    with LoopbackServer() as server:
        server.add(sse(stream))
        client = make(server.url)
        result = asyncio.run(tracer.run_agent(model=client, messages=[sm.UserMessage("hi")]))
    assert result.state is sm.TurnState.DONE
    (chat,) = [s for s in exporter.get_finished_spans() if s.name.startswith("chat")]
    attributes = dict(chat.attributes or {})
    assert attributes["gen_ai.response.id"] == response_id
    assert attributes["gen_ai.response.model"] == model


@pytest.mark.timeout(30)
def test_a_client_that_does_not_say_leaves_the_response_attributes_out() -> None:
    tracer, exporter, _ = _setup()
    asyncio.run(tracer.run_agent(model=Script(sm.AssistantMessage("ok")), messages="hi"))
    (chat,) = [s for s in exporter.get_finished_spans() if s.name.startswith("chat")]
    assert not {"gen_ai.response.id", "gen_ai.response.model"} & set(chat.attributes or {})


def _with_reasoning(name: str, reasoning: str) -> Reply:
    """A recorded stream whose final usage reports reasoning tokens (``reasoning``: the
    text that replaces the fixture's last usage figure)."""
    text = fixture_text(name)
    if name.startswith("gemini/"):
        said, count = '"candidatesTokenCount": 19,', f'"candidatesTokenCount": 19, {reasoning},'
    else:
        said, count = '"reasoning_tokens":0', reasoning
    assert text.count(said) == 1
    return attrs.evolve(sse(name), body=text.replace(said, count).encode("utf-8"))


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("make", "stream", "reasoning", "response_id", "model"),
    [
        (
            _openai,
            "openai/text_stream.sse",
            '"reasoning_tokens":7',
            "chatcmpl-AZx81",
            "gpt-4o-mini-2024-07-18",
        ),
        (_responses, "responses/text_stream.sse", '"reasoning_tokens":7', "resp_1", "gpt-5-mini"),
        (_gemini, "gemini/text_stream.sse", '"thoughtsTokenCount": 7', "r1", "gemini-2.5-flash"),
    ],
    ids=["openai", "responses", "gemini"],
)
def test_reasoning_tokens_and_the_response_reach_the_chat_and_agent_spans_and_the_metrics(
    make: Any, stream: str, reasoning: str, response_id: str, model: str
) -> None:
    tracer, exporter, reader = _setup()
    with LoopbackServer() as server:
        server.add(_with_reasoning(stream, reasoning))
        result = asyncio.run(tracer.run_agent(model=make(server.url), messages="hi"))
    assert result.state is sm.TurnState.DONE
    spans = _by_name(exporter)
    (chat,) = [dict(s.attributes or {}) for s in spans.values() if s.name.startswith("chat")]
    agent = dict(spans["invoke_agent tester"].attributes or {})
    for attributes in (chat, agent):
        assert attributes["gen_ai.usage.reasoning.output_tokens"] == 7
        assert attributes["gen_ai.response.id"] == response_id
        assert attributes["gen_ai.response.model"] == model
        assert attributes["gen_ai.response.finish_reasons"] == ("stop",)
        assert attributes["gen_ai.output.type"] == "text"
    for metric in ("gen_ai.client.token.usage", "gen_ai.client.operation.duration"):
        for point in _points(reader, metric):
            assert dict(point.attributes or {})["gen_ai.response.model"] == model


@pytest.mark.timeout(30)
def test_a_provider_that_reports_no_reasoning_tokens_leaves_the_attribute_out() -> None:
    tracer, exporter, _ = _setup()
    with LoopbackServer() as server:
        server.add(sse("anthropic/text_stream.sse"))
        asyncio.run(tracer.run_agent(model=_anthropic(server.url), messages="hi"))
    for span in exporter.get_finished_spans():
        assert "gen_ai.usage.reasoning.output_tokens" not in dict(span.attributes or {})


@pytest.mark.timeout(30)
def test_the_output_type_is_json_for_a_run_with_a_native_structured_output() -> None:
    recorder = Recorder()
    tracer, exporter, _ = _setup(recorder)
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    model = Script(sm.AssistantMessage('{"n": 4}'), native_output=True)
    result = asyncio.run(
        tracer.run_agent(model=model, messages="go", output_type=schema, output_mode="native")
    )
    assert result.output == {"n": 4}
    spans = _by_name(exporter)
    assert dict(spans["chat scripted-1"].attributes or {})["gen_ai.output.type"] == "json"
    assert recorder.seen["chat scripted-1"]["gen_ai.output.type"] == "json"  # at creation
    assert dict(spans["invoke_agent tester"].attributes or {})["gen_ai.output.type"] == "json"


@pytest.mark.timeout(30)
def test_the_schema_url_is_the_newest_of_the_installed_conventions() -> None:
    newest = max(Schemas, key=lambda s: tuple(int(p) for p in s.value.rsplit("/", 1)[1].split(".")))
    assert newest.value == SCHEMA_URL
    assert gen_ai_attributes.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS == (
        "gen_ai.usage.reasoning.output_tokens"
    )
    assert gen_ai_attributes.GEN_AI_OUTPUT_TYPE == "gen_ai.output.type"


class Telling(Script):
    """A client of its own that tells the response's id and model (two arguments, as
    before reasoning tokens could be told too), or all three."""

    def __init__(self, *said: Any) -> None:
        super().__init__(sm.AssistantMessage("ok"))
        self.said = said

    async def complete(
        self,
        messages: Any,
        tools: Any,
        signal: Any,
        *,
        options: CallOptions | None = None,
    ) -> sm.AssistantMessage:
        assert options is not None
        assert options.on_response is not None
        options.on_response(*self.said)
        return await super().complete(messages, tools, signal)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("said", "reasoning"), [(("r-1", "m-2"), None), (("r-1", "m-2", 3), 3)], ids=["two", "three"]
)
def test_a_client_of_its_own_tells_the_response_with_or_without_reasoning_tokens(
    said: tuple[Any, ...], reasoning: int | None
) -> None:
    tracer, exporter, _ = _setup()
    asyncio.run(tracer.run_agent(model=Telling(*said), messages="hi"))
    (chat,) = [s for s in exporter.get_finished_spans() if s.name.startswith("chat")]
    attributes = dict(chat.attributes or {})
    assert (attributes["gen_ai.response.id"], attributes["gen_ai.response.model"]) == said[:2]
    assert attributes.get("gen_ai.usage.reasoning.output_tokens") == reasoning

"""``FallbackModel`` over real adapters against 127.0.0.1: the next model on rate
limits, unavailability and timeouts, never on a bad key or a refused request, and the
model that answered told to the run's ``on_response`` (so to the ``chat`` span)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from providers_corpus import recording
from providers_server import (
    TEXT_REPLY,
    Log,
    LoopbackServer,
    Reply,
    Sleeps,
    complete,
    error,
    sse,
)

import statemachine as sm
from statemachine.errors import InvalidInputError
from statemachine.otel import AgentTracer
from statemachine.providers import (
    CallOptions,
    FallbackModel,
    OpenAIChatModel,
    ProviderAuthError,
    ProviderRequestError,
    ProviderUnavailableError,
    RetryPolicy,
    model_from_string,
)


def chat(server: LoopbackServer, name: str, **kw: Any) -> OpenAIChatModel:
    """A Chat model at ``/{name}/v1`` of the server (so requests tell who was asked)."""
    return OpenAIChatModel(
        name,
        api_key=f"sk-{name}-0123456789",
        base_url=f"{server.url}/{name}/v1",
        retry=RetryPolicy(max_attempts=1),
        sleep=Sleeps(),
        **kw,
    )


def asked(server: LoopbackServer) -> list[str]:
    return [r.path.split("/")[1] for r in server.requests]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("status", "body"),
    [(429, "openai/error_429.json"), (500, "openai/error_500.json")],
    ids=["rate-limited", "unavailable"],
)
def test_the_next_model_answers_when_the_first_is_out_of_service(
    status: int, body: str, server: LoopbackServer
) -> None:
    server.add(error(status, body), sse("openai/text_stream.sse"))
    log = Log()
    model = FallbackModel([chat(server, "primary"), chat(server, "backup")], logger=log)
    assert complete(model) == TEXT_REPLY
    assert asked(server) == ["primary", "backup"]
    [(_event, fields)] = [e for e in log.entries if e[0] == "model_fallback"]
    assert fields["given_up"] == "primary"
    assert fields["next"] == "backup"
    assert fields["error"].startswith("ProviderUnavailableError")
    assert "sk-primary" not in fields["error"]


@pytest.mark.timeout(60)
def test_the_next_model_answers_when_the_first_goes_silent(server: LoopbackServer) -> None:
    server.add(sse("openai/partial_then_hold.sse", hold=True), sse("openai/text_stream.sse"))
    model = FallbackModel([chat(server, "primary", idle_timeout=0.3), chat(server, "backup")])
    assert complete(model) == TEXT_REPLY
    assert asked(server) == ["primary", "backup"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("status", "body", "kind"),
    [
        (401, "openai/error_401.json", ProviderAuthError),
        (400, "openai/error_400.json", ProviderRequestError),
    ],
    ids=["bad-key", "bad-request"],
)
def test_a_bad_key_or_a_refused_request_is_raised_without_asking_the_next(
    status: int, body: str, kind: type[Exception], server: LoopbackServer
) -> None:
    server.add(error(status, body), sse("openai/text_stream.sse"))
    model = FallbackModel([chat(server, "primary"), chat(server, "backup")])
    with pytest.raises(kind):
        complete(model)
    assert asked(server) == ["primary"]


@pytest.mark.timeout(60)
def test_when_every_model_fails_the_last_error_is_raised(server: LoopbackServer) -> None:
    server.add(error(429, "openai/error_429.json"), error(500, "openai/error_500.json"))
    model = FallbackModel([chat(server, "primary"), chat(server, "backup")])
    with pytest.raises(ProviderUnavailableError, match="'backup'"):
        complete(model)
    assert asked(server) == ["primary", "backup"]


def _tracer() -> tuple[AgentTracer, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return AgentTracer(provider, agent_name="fallback"), exporter


@pytest.mark.timeout(60)
def test_the_chat_span_names_the_model_that_answered(server: LoopbackServer) -> None:
    server.add(error(429, "openai/error_429.json"), sse("openai/text_stream.sse"))
    tracer, exporter = _tracer()
    model = FallbackModel([chat(server, "primary"), chat(server, "backup")])
    result = asyncio.run(tracer.run_agent(model=model, messages=[sm.UserMessage("go")]))
    assert result.state is sm.TurnState.DONE
    [span] = [s for s in exporter.get_finished_spans() if s.name.startswith("chat")]
    attributes = dict(span.attributes or {})
    assert attributes["gen_ai.request.model"] == "primary"
    # The backup's own report of itself (text_stream.sse's "model").
    assert attributes["gen_ai.response.model"] == "gpt-4o-mini-2024-07-18"


class Down:
    """A client that is out of service, and one that answers without reporting a model."""

    model = "down-1"

    async def complete(self, *args: Any, **kw: Any) -> sm.AssistantMessage:
        raise ProviderUnavailableError("down-1 is overloaded")


class Quiet:
    model = "quiet-1"

    async def complete(
        self, messages: Any, tools: Any, signal: Any, *, options: Any = None
    ) -> sm.AssistantMessage:
        return sm.AssistantMessage("quietly")


class Reasons:
    """A client that reports its response with the reasoning tokens it counted."""

    model = "reasons-1"

    async def complete(
        self, messages: Any, tools: Any, signal: Any, *, options: Any = None
    ) -> sm.AssistantMessage:
        options.on_response("resp-1", "reasons-1-2026", 5)
        return sm.AssistantMessage("thought")


def test_the_reasoning_tokens_a_client_reports_pass_through_the_fallback() -> None:
    told: list[tuple[Any, ...]] = []
    options = CallOptions(on_response=lambda *said: told.append(said))
    model = FallbackModel([Down(), Reasons()])
    signal = sm.AbortController().signal
    reply = asyncio.run(model.complete([sm.UserMessage("hi")], (), signal, options=options))
    assert reply.text == "thought"
    assert told == [("resp-1", "reasons-1-2026", 5)]


def test_a_client_that_reports_no_model_is_named_by_its_model_attribute() -> None:
    told: list[tuple[str | None, str | None]] = []
    options = CallOptions(on_response=lambda i, m, r=None: told.append((i, m)))
    model = FallbackModel([Down(), Quiet()])
    signal = sm.AbortController().signal
    reply = asyncio.run(model.complete([sm.UserMessage("hi")], (), signal, options=options))
    assert reply.text == "quietly"
    assert told == [(None, "quiet-1")]


def test_what_a_run_may_send_is_what_every_model_can_send(server: LoopbackServer) -> None:
    both = FallbackModel([chat(server, "a"), chat(server, "b")])
    assert both.accepts_instructions
    assert both.supported_settings == chat(server, "c").supported_settings
    assert both.native_output
    mixed = FallbackModel([chat(server, "a"), Down()])
    assert not mixed.accepts_instructions
    assert mixed.supported_settings == frozenset()
    assert not mixed.native_output


def test_fallback_takes_model_strings_and_refuses_an_empty_list(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GROQ_API_KEY", "gsk-0123456789")
    monkeypatch.setenv("CEREBRAS_API_KEY", "csk-0123456789")
    model = FallbackModel(["groq:llama-3.3-70b-versatile", "cerebras:llama3.1-8b"])
    assert [m.model for m in model.models] == [  # type: ignore[attr-defined]
        "llama-3.3-70b-versatile",
        "llama3.1-8b",
    ]
    with pytest.raises(InvalidInputError):
        FallbackModel([])
    with pytest.raises(InvalidInputError):
        FallbackModel([Down()], fallback_on=(ValueError,))  # type: ignore[arg-type]


@pytest.mark.timeout(60)
def test_an_abort_during_the_first_model_does_not_ask_the_next(server: LoopbackServer) -> None:
    server.add(Reply(200, stall=True), sse("openai/text_stream.sse"))
    controller = sm.AbortController()
    model = FallbackModel([chat(server, "primary"), chat(server, "backup")])

    async def go() -> sm.AssistantMessage:
        task = asyncio.ensure_future(model.complete([sm.UserMessage("hi")], (), controller.signal))
        while not server.requests:
            await asyncio.sleep(0.01)
        controller.abort()
        return await task

    reply = asyncio.run(go())
    assert reply.stop_reason is sm.messages.StopReason.ABORTED
    assert asked(server) == ["primary"]


@pytest.mark.timeout(60)
def test_recorded_openrouter_rate_limit_falls_back_to_a_recorded_groq_answer(
    server: LoopbackServer,
) -> None:
    limited = recording("openrouter", "openrouter_errors_raised").interactions[0]
    answer = recording("groq", "groq_model_instructions").interactions[0]
    assert limited.status == 429
    server.add(limited.reply(), answer.reply())
    fallback = FallbackModel(
        [
            model_from_string(
                "openrouter:google/gemini-2.0-flash-exp:free",
                api_key="sk-or-0123456789",
                base_url=server.url + "/api/v1",
                stream=False,
                retry=RetryPolicy(max_attempts=1),
            ),
            model_from_string(
                "groq:llama-3.3-70b-versatile",
                api_key="gsk-0123456789",
                base_url=server.url + "/openai/v1",
                stream=False,
                retry=RetryPolicy(max_attempts=1),
            ),
        ]
    )
    told: list[str | None] = []
    options = CallOptions(on_response=lambda _, model, r=None: told.append(model))
    signal = sm.AbortController().signal
    reply = asyncio.run(fallback.complete([sm.UserMessage("hi")], (), signal, options=options))
    recorded = answer.response["json"]
    assert reply.text == recorded["choices"][0]["message"]["content"]
    assert told == [recorded["model"]]
    assert [r.path for r in server.requests] == [
        "/api/v1/chat/completions",
        "/openai/v1/chat/completions",
    ]

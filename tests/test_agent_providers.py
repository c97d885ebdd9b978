"""The run's instructions, settings and streamed deltas through the two bundled adapters,
against recorded streams replayed on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from providers_server import FAST, LoopbackServer, Sleeps, options_run, sse

import statemachine as sm
from statemachine.providers import AnthropicModel, CallOptions, OpenAIChatModel

pytestmark = pytest.mark.timeout(60)

KEY = "sk-test-0123456789abcdef-secret"


def openai(server: LoopbackServer, **kw: Any) -> OpenAIChatModel:
    return OpenAIChatModel(
        "gpt-4o-mini", api_key=KEY, base_url=server.url + "/v1", retry=FAST, sleep=Sleeps(), **kw
    )


def anthropic(server: LoopbackServer, **kw: Any) -> AnthropicModel:
    return AnthropicModel(
        "claude-sonnet-4-5", api_key=KEY, base_url=server.url, retry=FAST, sleep=Sleeps(), **kw
    )


SETTINGS = sm.ModelSettings(temperature=0.5, max_tokens=77, top_p=0.9, stop=["END"])


def test_openai_gets_the_instructions_as_its_first_system_message_and_the_settings(
    server: LoopbackServer,
) -> None:
    server.add(sse("openai/text_stream.sse"))
    pieces: list[str] = []
    model = openai(server, system="the adapter's prompt", on_text=pieces.append)
    result, events = options_run(model, instructions="Be brief.", model_settings=SETTINGS)
    body = server.requests[0].json()
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "list the files"},
    ]
    assert (body["temperature"], body["max_tokens"], body["top_p"], body["stop"]) == (
        0.5,
        77,
        0.9,
        ["END"],
    )
    texts = [e.text for e in events if isinstance(e, sm.TextDelta)]
    assert texts == pieces  # the adapter's on_text and the run both hear every fragment
    assert "".join(texts) == result.final_text


def test_anthropic_gets_the_instructions_as_system_and_stop_as_stop_sequences(
    server: LoopbackServer,
) -> None:
    server.add(sse("anthropic/text_stream.sse"))
    result, events = options_run(
        anthropic(server), instructions=lambda: "Be brief.", model_settings=SETTINGS
    )
    body = server.requests[0].json()
    assert body["system"] == "Be brief."
    assert (body["temperature"], body["max_tokens"], body["top_p"]) == (0.5, 77, 0.9)
    assert body["stop_sequences"] == ["END"]
    assert "stop" not in body
    texts = [e.text for e in events if isinstance(e, sm.TextDelta)]
    assert len(texts) > 1
    assert "".join(texts) == result.final_text


def test_without_run_instructions_the_adapters_own_system_prompt_is_sent(
    server: LoopbackServer,
) -> None:
    server.add(sse("anthropic/text_stream.sse"))
    options_run(anthropic(server, system="adapter prompt"))
    assert server.requests[0].json()["system"] == "adapter prompt"


@pytest.mark.parametrize(
    ("make", "fixture"),
    [(openai, "openai/single_tool_call.sse"), (anthropic, "anthropic/single_tool_call.sse")],
)
def test_tool_call_arguments_stream_as_deltas_that_add_up_to_the_call(
    server: LoopbackServer, make: Any, fixture: str
) -> None:
    server.add(sse(fixture))
    fragments: list[tuple[int, str, str, str]] = []
    options = CallOptions(on_tool_call_delta=lambda *f: fragments.append(f))

    async def call() -> sm.AssistantMessage:
        model: OpenAIChatModel | AnthropicModel = make(server)
        return await model.complete(
            [sm.UserMessage("read it")], (), sm.AbortController().signal, options=options
        )

    reply = asyncio.run(call())
    [tool_call] = reply.tool_calls
    assert len(fragments) > 1
    assert {(f[0], f[1], f[2]) for f in fragments} == {(0, tool_call.id, tool_call.name)}
    arguments = json.loads("".join(f[3] for f in fragments))
    assert sm.ToolCall(tool_call.id, tool_call.name, arguments) == tool_call


def test_the_anthropic_adapters_own_temperature_is_sent_as_a_body_field(
    server: LoopbackServer,
) -> None:
    server.add(sse("anthropic/text_stream.sse"))
    result, _ = options_run(anthropic(server, temperature=0.25))
    assert result.ok
    assert server.requests[0].json()["temperature"] == 0.25

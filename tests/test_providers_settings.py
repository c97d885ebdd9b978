"""The model settings a PydanticAI user sets (seed, penalties, parallel tool calls,
reasoning effort, timeout, extra headers and body): each mapped to the provider's
request field, or refused by name before any call."""

from __future__ import annotations

from typing import Any

import pytest
from providers_server import FAST, LoopbackServer, Sleeps, options_run, sse

import statemachine as sm
from statemachine.providers import (
    AnthropicModel,
    GeminiModel,
    OpenAIChatModel,
    OpenAIResponsesModel,
)

pytestmark = pytest.mark.timeout(60)

EVERYTHING = sm.ModelSettings(
    seed=7,
    presence_penalty=0.5,
    frequency_penalty=-0.5,
    parallel_tool_calls=False,
    reasoning_effort="low",
    timeout=30,
    extra_headers={"X-Team": "books"},
    extra_body={"service_tier": "flex"},
)


def test_openai_chat_sends_every_setting_as_its_own_field(server: LoopbackServer) -> None:
    server.add(sse("openai/text_stream.sse"))
    model = OpenAIChatModel(
        "gpt-4o-mini", api_key="sk-test", base_url=server.url + "/v1", retry=FAST, sleep=Sleeps()
    )
    result, _ = options_run(model, model_settings=EVERYTHING)
    assert result.ok, result.explanation
    request = server.requests[0]
    body = request.json()
    assert (body["seed"], body["presence_penalty"], body["frequency_penalty"]) == (7, 0.5, -0.5)
    assert body["reasoning_effort"] == "low"
    assert body["service_tier"] == "flex"  # extra_body, merged by the SDK
    assert "parallel_tool_calls" not in body  # the API refuses it without tools
    assert request.headers["x-team"] == "books"


def test_openai_responses_sends_reasoning_and_extra_body(server: LoopbackServer) -> None:
    server.add(sse("responses/text_stream.sse"))
    model = OpenAIResponsesModel(
        "gpt-4.1", api_key="sk-test", base_url=server.url + "/v1", retry=FAST, sleep=Sleeps()
    )
    settings = sm.ModelSettings(reasoning_effort="high", extra_body={"store": False})
    result, _ = options_run(model, model_settings=settings)
    assert result.ok, result.explanation
    body = server.requests[0].json()
    assert body["reasoning"] == {"effort": "high"}
    assert body["store"] is False
    with pytest.raises(sm.UsageError, match="cannot send seed"):
        options_run(model, model_settings=sm.ModelSettings(seed=1))


def test_gemini_sends_seed_and_penalties_in_its_config(server: LoopbackServer) -> None:
    server.add(sse("gemini/text_stream.sse"))
    model = GeminiModel(
        "gemini-2.5-flash",
        api_key="AIza-test-0123456789",
        base_url=server.url,
        retry=FAST,
        sleep=Sleeps(),
    )
    settings = sm.ModelSettings(seed=3, presence_penalty=1, frequency_penalty=0.25)
    result, _ = options_run(model, model_settings=settings)
    assert result.ok, result.explanation
    config = server.requests[0].json()["generationConfig"]
    assert (config["seed"], config["presencePenalty"], config["frequencyPenalty"]) == (3, 1, 0.25)


@pytest.mark.parametrize(
    "field",
    [
        "seed",
        "presence_penalty",
        "parallel_tool_calls",
        "reasoning_effort",
        "timeout",
        "extra_headers",
        "extra_body",
    ],
)
def test_a_setting_a_provider_cannot_send_is_refused_by_name(field: str) -> None:
    model = AnthropicModel("claude-sonnet-4-5", api_key="sk-ant-test")
    settings = sm.ModelSettings(**{field: EVERYTHING.set_fields()[field]})
    with pytest.raises(sm.UsageError, match=f"cannot send {field}"):
        sm.run_agent_sync(model=model, messages="q", model_settings=settings)


@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("seed", "7"),
        ("presence_penalty", 3),
        ("frequency_penalty", -2.5),
        ("parallel_tool_calls", "yes"),
        ("reasoning_effort", "extreme"),
        ("timeout", 0),
        ("extra_headers", {"X": 1}),
        ("extra_body", ["not", "an", "object"]),
    ],
)
def test_a_setting_out_of_range_is_refused_when_made(field: str, bad: Any) -> None:
    with pytest.raises(sm.InvalidInputError, match=field):
        sm.ModelSettings(**{field: bad})


def test_settings_merge_field_by_field_and_stay_hashable() -> None:
    agent_wide = sm.ModelSettings(seed=1, extra_headers={"A": "1"})
    merged = agent_wide.merged(sm.ModelSettings(extra_body={"k": [1]}))
    assert merged.set_fields() == {
        "seed": 1,
        "extra_headers": {"A": "1"},
        "extra_body": {"k": [1]},
    }
    assert hash(merged) == hash(agent_wide.merged(sm.ModelSettings(extra_body={"k": [1]})))

"""Native structured output through the bundled adapters, on 127.0.0.1: the request
carries the run's output schema in the provider's own JSON-schema mode (Chat
Completions ``response_format``, Responses ``text.format``, Gemini
``response_json_schema``), no ``final_result`` tool is offered, and the reply's text
is validated as the output (an invalid one goes back to the model).

The Chat Completions case replays recorded Ollama traffic
(``ollama/recorded/ollama_local_native_output_uses_json_schema.json``, sent by
PydanticAI's ``NativeOutput``); the Responses and Gemini streams are the shared
text streams with a JSON answer (``responses/json_output.sse``,
``gemini/json_output.sse``)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from providers_corpus import recording
from providers_server import FAST, LoopbackServer, Reply, Sleeps, options_run, sse

import statemachine as sm
from statemachine.providers import (
    AnthropicModel,
    BedrockModel,
    GeminiModel,
    OpenAIChatModel,
    OpenAIResponsesModel,
)

KEY = "sk-native-output-0123456789abcdef"
JSON = (("Content-Type", "application/json"),)
CITY = {
    "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
    "required": ["city", "country"],
    "title": "CityLocation",
    "type": "object",
}
PARIS = {"city": "Paris", "country": "France"}


def _chat_reply(text: str) -> Reply:
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "qwen3:0.6b",
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": text},
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }
    return Reply(200, JSON, json.dumps(body).encode())


def _chat(server: LoopbackServer) -> OpenAIChatModel:
    return OpenAIChatModel(
        "qwen3:0.6b",
        api_key=KEY,
        base_url=server.url + "/v1",
        stream=False,
        retry=FAST,
        sleep=Sleeps(),
    )


@pytest.mark.timeout(60)
def test_chat_completions_sends_response_format_and_the_recorded_answer_is_the_output(
    server: LoopbackServer,
) -> None:
    [turn] = recording("ollama", "ollama_local_native_output_uses_json_schema").interactions
    server.add(turn.reply())
    prompt = turn.body["messages"][0]["content"]
    result = asyncio.run(sm.run_agent(model=_chat(server), messages=prompt, output_type=CITY))
    assert result.state is sm.TurnState.DONE
    assert result.output == PARIS
    [body] = server.bodies()
    recorded = turn.body["response_format"]
    # As PydanticAI sent it, but under the run's own name, with strict only where
    # OpenAI's strict mode takes the schema (this one is open: not strict).
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {**recorded["json_schema"], "name": "final_result", "strict": False},
    }
    assert "tools" not in body
    assert body["messages"] == turn.body["messages"]


@pytest.mark.timeout(60)
def test_chat_completions_sends_strict_for_a_closed_schema(server: LoopbackServer) -> None:
    closed = {**CITY, "additionalProperties": False}
    server.add(_chat_reply(json.dumps(PARIS)))
    result, _ = options_run(_chat(server), output_type=closed)
    assert result.output == PARIS
    assert server.bodies()[0]["response_format"]["json_schema"]["strict"] is True


@pytest.mark.timeout(60)
def test_chat_completions_invalid_text_goes_back_and_the_retry_is_the_output(
    server: LoopbackServer,
) -> None:
    server.add(_chat_reply('{"city": "Paris"}'), _chat_reply(json.dumps(PARIS)))
    result, _ = options_run(_chat(server), output_type=CITY)
    assert result.output == PARIS
    first, second = server.bodies()
    assert second["response_format"] == first["response_format"]
    reminder = second["messages"][-1]
    assert reminder["role"] == "user"
    assert "output: 'country' is a required property" in reminder["content"]
    assert second["messages"][-2] == {"role": "assistant", "content": '{"city": "Paris"}'}


@pytest.mark.timeout(60)
def test_chat_completions_that_never_validates_ends_output_invalid(server: LoopbackServer) -> None:
    server.add(_chat_reply("Paris"), _chat_reply("Paris, France"))
    result, _ = options_run(_chat(server), output_type=CITY, output_retries=1)
    assert result.state is sm.TurnState.OUTPUT_INVALID
    assert len(server.requests) == 2
    assert "the final text is not JSON" in result.explanation


@pytest.mark.timeout(60)
def test_tool_mode_on_chat_completions_sends_no_response_format(server: LoopbackServer) -> None:
    arguments = json.dumps(PARIS)
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "final_result", "arguments": arguments},
    }
    body = json.loads(_chat_reply("").body)
    body["choices"][0]["message"] = {"role": "assistant", "content": None, "tool_calls": [call]}
    body["choices"][0]["finish_reason"] = "tool_calls"
    server.add(Reply(200, JSON, json.dumps(body).encode()))
    result, _ = options_run(_chat(server), output_type=CITY, output_mode="tool")
    assert result.output == PARIS
    [sent] = server.bodies()
    assert "response_format" not in sent
    assert [t["function"]["name"] for t in sent["tools"]] == ["final_result"]


@pytest.mark.timeout(60)
def test_a_compatible_server_without_json_schema_gets_the_tool(server: LoopbackServer) -> None:
    model = OpenAIChatModel(
        "local", api_key=KEY, base_url=server.url + "/v1", stream=False, native_output=False
    )
    with pytest.raises(sm.errors.UsageError, match="output_mode='native'"):
        options_run(model, output_type=CITY, output_mode="native")
    assert server.requests == []


@pytest.mark.timeout(60)
def test_responses_sends_text_format_and_validates_the_streamed_answer(
    server: LoopbackServer,
) -> None:
    server.add(sse("responses/json_output.sse", piece_size=13))
    model = OpenAIResponsesModel(
        "gpt-5-mini", api_key=KEY, base_url=server.url + "/v1", retry=FAST, sleep=Sleeps()
    )
    result, events = options_run(model, output_type=CITY)
    assert result.output == PARIS
    [body] = server.bodies()
    assert body["text"] == {
        "format": {"type": "json_schema", "name": "final_result", "schema": CITY, "strict": False}
    }
    assert "tools" not in body
    deltas = "".join(e.text for e in events if isinstance(e, sm.TextDelta))
    assert json.loads(deltas) == PARIS


def _gemini(server: LoopbackServer, model: str = "gemini-3-pro-preview", **kw: Any) -> GeminiModel:
    return GeminiModel(model, api_key=KEY, base_url=server.url, retry=FAST, sleep=Sleeps(), **kw)


@pytest.mark.timeout(60)
def test_gemini_sends_response_json_schema_and_validates_the_streamed_answer(
    server: LoopbackServer,
) -> None:
    server.add(sse("gemini/json_output.sse", piece_size=11))
    result, _ = options_run(_gemini(server), output_type=CITY)
    assert result.output == PARIS
    [body] = server.bodies()
    config = body["generationConfig"]
    assert config["responseMimeType"] == "application/json"
    assert config["responseJsonSchema"] == CITY
    assert "tools" not in body


@pytest.mark.timeout(60)
def test_gemini_before_3_gets_the_final_result_tool(server: LoopbackServer) -> None:
    before = _gemini(server, "gemini-2.5-flash")
    assert before.native_output is False
    assert _gemini(server, "gemini-2.5-flash", native_output=True).native_output is True
    with pytest.raises(sm.errors.UsageError, match="output_mode='native'"):
        options_run(before, output_type=CITY, output_mode="native")
    assert server.requests == []
    with pytest.raises(sm.errors.InvalidInputError, match="native_output"):
        _gemini(server, native_output="yes")


# -- Anthropic and Bedrock: opt-in (only recent models accept a JSON-schema mode) -----------


def _anthropic(server: LoopbackServer, **kw: Any) -> AnthropicModel:
    return AnthropicModel(
        "claude-sonnet-4-5",
        api_key=KEY,
        base_url=server.url,
        stream=False,
        retry=FAST,
        sleep=Sleeps(),
        **kw,
    )


def _anthropic_reply(text: str) -> Reply:
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 4},
    }
    return Reply(200, JSON, json.dumps(message).encode())


@pytest.mark.timeout(60)
def test_anthropic_uses_the_tool_unless_native_output_is_asked(server: LoopbackServer) -> None:
    assert _anthropic(server).native_output is False
    with pytest.raises(sm.errors.UsageError, match="output_mode='native'"):
        options_run(_anthropic(server), output_type=CITY, output_mode="native")
    server.add(_anthropic_reply(json.dumps(PARIS)))
    result, _ = options_run(_anthropic(server, native_output=True), output_type=CITY)
    assert result.output == PARIS
    [body] = server.bodies()
    assert body["output_config"] == {"format": {"type": "json_schema", "schema": CITY}}
    assert "tools" not in body
    with pytest.raises(sm.errors.InvalidInputError, match="native_output"):
        _anthropic(server, native_output=1)


def _bedrock(server: LoopbackServer, **kw: Any) -> BedrockModel:
    return BedrockModel(
        "us.anthropic.claude-sonnet-4-5-20250929-v1:0",
        region="eu-central-1",
        endpoint_url=server.url,
        aws_access_key_id="AKIAFAKEFAKEFAKE",
        aws_secret_access_key="wJalrXUtnFEMI-K7MDENG-native0123456789",
        stream=False,
        retry=FAST,
        sleep=Sleeps(),
        **kw,
    )


@pytest.mark.timeout(60)
def test_bedrock_sends_output_config_when_native_output_is_asked(server: LoopbackServer) -> None:
    assert _bedrock(server).native_output is False
    whole = {
        "output": {"message": {"role": "assistant", "content": [{"text": json.dumps(PARIS)}]}},
        "stopReason": "end_turn",
        "usage": {"inputTokens": 3, "outputTokens": 2, "totalTokens": 5},
    }
    server.add(Reply(200, JSON, json.dumps(whole).encode()))
    result, _ = options_run(_bedrock(server, native_output=True), output_type=CITY)
    assert result.output == PARIS
    [body] = server.bodies()
    structure = body["outputConfig"]["textFormat"]["structure"]["jsonSchema"]
    assert body["outputConfig"]["textFormat"]["type"] == "json_schema"
    assert (structure["name"], json.loads(structure["schema"])) == ("final_result", CITY)
    assert "toolConfig" not in body

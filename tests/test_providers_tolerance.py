"""What compatible servers send that the SDKs' own types refuse, read through the real
SDKs against 127.0.0.1: read tolerantly where it changes nothing the run means, refused
by name where it does.

* Groq answers every non-streamed completion with ``"service_tier": "on_demand"``, a
  value the ``openai`` SDK's ``ChatCompletion`` does not allow (a recorded Groq reply).
* Azure OpenAI opens a stream with a prompt-filter chunk (``"object": ""``, no
  choices) and sends content-filter annotations with no ``delta`` (the stream Microsoft
  publishes as a real response, ``azure/async_filter_stream.sse``).
* A Chat Completions tool call of ``"type": "custom"`` (free-form input) cannot be run
  or carried back: both OpenAI adapters refuse it by name. No public recording of one
  was found; the bodies below are the shape the OpenAI API reference gives
  (``ChatCompletionMessageCustomToolCall``, and the Responses ``custom_tool_call`` item).
* An Anthropic stream with server-tool blocks (``server_tool_use``,
  ``web_search_tool_result``) between its text blocks is refused by name (a recorded
  web-search stream); its text blocks, with the server-tool blocks taken out, stay
  apart.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from providers_corpus import recording, sse_events
from providers_server import FIXTURES, LoopbackServer, Reply, Sleeps, complete, sse

import statemachine as sm
from statemachine.providers import (
    AnthropicModel,
    OpenAIChatModel,
    OpenAIResponsesModel,
    ProviderResponseError,
    RetryPolicy,
)

JSON = (("Content-Type", "application/json"),)
EVENTS = (("Content-Type", "text/event-stream"),)


def chat(server: LoopbackServer, *, stream: bool, base: str = "/v1") -> OpenAIChatModel:
    return OpenAIChatModel(
        "some-model",
        api_key="sk-tolerance-0123456789",
        base_url=server.url + base,
        stream=stream,
        retry=RetryPolicy(max_attempts=1),
        sleep=Sleeps(),
    )


# -- Groq -----------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_a_groq_completion_with_service_tier_on_demand_is_read(server: LoopbackServer) -> None:
    rec = recording("groq", "groq_native_output")
    [turn] = rec.interactions
    assert turn.response["json"]["service_tier"] == "on_demand"
    server.add(turn.reply())
    reply = complete(chat(server, stream=False, base="/openai/v1"))
    assert reply.text == '{"city":"Mexico City","country":"Mexico"}'
    assert reply.stop_reason is sm.messages.StopReason.STOP
    assert reply.usage is not None
    assert reply.usage.total_tokens == 272


@pytest.mark.timeout(60)
def test_a_completion_that_lacks_its_finish_reason_is_still_refused(
    server: LoopbackServer,
) -> None:
    # Tolerance covers what we do not read; a whole completion without the finish
    # reason we do read stays an error.
    body = recording("groq", "groq_native_output").interactions[0].response["json"]
    del body["choices"][0]["finish_reason"]
    server.add(Reply(200, JSON, json.dumps(body).encode()))
    with pytest.raises(ProviderResponseError, match="could not validate"):
        complete(chat(server, stream=False))


# -- Azure OpenAI ---------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_an_azure_stream_with_filter_chunks_is_read(server: LoopbackServer) -> None:
    events = sse_events((FIXTURES / "azure" / "async_filter_stream.sse").read_text())
    assert events[0]["object"] == ""
    assert events[0]["choices"] == []
    assert "delta" not in events[-1]["choices"][0]
    server.add(sse("azure/async_filter_stream.sse"))
    reply = complete(chat(server, stream=True))
    assert reply.content == (sm.TextContent("Color is a"),)
    assert reply.stop_reason is sm.messages.StopReason.STOP


@pytest.mark.timeout(60)
def test_a_chunk_whose_text_is_not_text_is_still_refused(server: LoopbackServer) -> None:
    server.add(sse("openai/invalid_chunk.sse"))
    with pytest.raises(ProviderResponseError, match="could not validate"):
        complete(chat(server, stream=True))


# -- custom tool calls ----------------------------------------------------------------------

CUSTOM_CALL = {
    "id": "call_custom_1",
    "type": "custom",
    "custom": {"name": "code_exec", "input": "print('hello')"},
}


def custom_completion() -> dict[str, Any]:
    return {
        "id": "chatcmpl-custom",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-5",
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {"role": "assistant", "content": None, "tool_calls": [CUSTOM_CALL]},
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


def custom_stream() -> bytes:
    chunk = {
        "id": "chatcmpl-custom",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "gpt-5",
        "choices": [
            {"index": 0, "delta": {"tool_calls": [{"index": 0, **CUSTOM_CALL}]}},
        ],
    }
    end = {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in (chunk, end)) + (
        b"data: [DONE]\n\n"
    )


@pytest.mark.timeout(60)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_custom_tool_call_in_chat_completions_is_refused_by_name(
    stream: bool, server: LoopbackServer
) -> None:
    if stream:
        server.add(Reply(200, EVENTS, custom_stream()))
    else:
        server.add(Reply(200, JSON, json.dumps(custom_completion()).encode()))
    with pytest.raises(ProviderResponseError) as caught:
        complete(chat(server, stream=stream))
    text = str(caught.value)
    assert "tool call of type 'custom'" in text
    assert "'code_exec'" in text
    assert "cannot run or carry back" in text
    assert len(server.requests) == 1  # not retried


@pytest.mark.timeout(60)
def test_the_responses_adapter_refuses_a_custom_tool_call_in_the_same_words(
    server: LoopbackServer,
) -> None:
    response = {
        "id": "resp_custom",
        "object": "response",
        "status": "completed",
        "model": "gpt-5",
        "output": [
            {
                "type": "custom_tool_call",
                "id": "ctc_1",
                "call_id": "call_custom_1",
                "name": "code_exec",
                "input": "print('hello')",
            }
        ],
        "usage": {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15},
    }
    server.add(Reply(200, JSON, json.dumps(response).encode()))
    model = OpenAIResponsesModel(
        "gpt-5",
        api_key="sk-tolerance-0123456789",
        base_url=server.url + "/v1",
        stream=False,
        retry=RetryPolicy(max_attempts=1),
        sleep=Sleeps(),
    )
    with pytest.raises(ProviderResponseError, match="'custom_tool_call' item") as caught:
        complete(model)
    assert "cannot run or carry back" in str(caught.value)


# -- Anthropic server tools -----------------------------------------------------------------


def anthropic(server: LoopbackServer, *, stream: bool = True) -> AnthropicModel:
    return AnthropicModel(
        "claude-sonnet-4-0",
        api_key="sk-ant-tolerance-0123456789",
        base_url=server.url,
        max_tokens=4096,
        stream=stream,
        retry=RetryPolicy(max_attempts=1),
        sleep=Sleeps(),
    )


def without_server_blocks(text: str) -> tuple[str, list[str]]:
    """The recorded stream without its server-tool events (and their usage count),
    and the text of each text block, in order."""
    server_blocks: set[int] = set()
    texts: dict[int, str] = {}
    kept: list[str] = []
    for chunk in text.split("\n\n"):
        data = next((line[5:] for line in chunk.splitlines() if line.startswith("data:")), "")
        if not data.strip():
            continue
        event = json.loads(data)
        index = event.get("index")
        if event["type"] == "content_block_start" and event["content_block"]["type"] != "text":
            server_blocks.add(index)
        if index in server_blocks:
            continue
        if event["type"] == "content_block_delta" and event["delta"]["type"] == "text_delta":
            texts[index] = texts.get(index, "") + event["delta"]["text"]
        usage = event.get("usage")
        if isinstance(usage, dict):
            usage.pop("server_tool_use", None)
        kept.append(f"event: {event['type']}\ndata: {json.dumps(event)}")
    return "\n\n".join(kept) + "\n\n", [texts[i] for i in sorted(texts) if texts[i]]


@pytest.mark.timeout(60)
def test_an_anthropic_stream_with_server_tool_blocks_is_refused_by_name(
    server: LoopbackServer,
) -> None:
    [turn] = recording("anthropic", "web_search_tool_stream", "server_tools").interactions
    server.add(turn.reply())
    with pytest.raises(ProviderResponseError) as caught:
        complete(anthropic(server))
    text = str(caught.value)
    assert "'server_tool_use' block of the tool 'web_search'" in text
    assert "server-side tool" in text
    assert len(server.requests) == 1


@pytest.mark.timeout(60)
def test_a_whole_anthropic_message_with_server_tool_blocks_is_refused_by_name(
    server: LoopbackServer,
) -> None:
    turn = recording("anthropic", "web_search_tool", "server_tools").interactions[0]
    server.add(turn.reply())
    with pytest.raises(ProviderResponseError, match="'server_tool_use' block of the tool"):
        complete(anthropic(server, stream=False))


@pytest.mark.timeout(60)
def test_anthropic_text_blocks_stay_apart(server: LoopbackServer) -> None:
    [turn] = recording("anthropic", "web_search_tool_stream", "server_tools").interactions
    stream, texts = without_server_blocks(turn.response["text"])
    assert len(texts) > 2
    server.add(Reply(200, EVENTS, stream.encode()))
    reply = complete(anthropic(server))
    assert [b.text for b in reply.content if isinstance(b, sm.TextContent)] == texts

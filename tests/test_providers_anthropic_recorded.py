"""AnthropicModel against recorded Anthropic Messages traffic.

Each recording (``tests/fixtures/providers/anthropic/recorded``) is replayed turn by
turn through the real ``anthropic`` SDK, streaming or not as the recording was: the
loopback server sends the recorded bytes, and the next turn's history is our reply
plus the tool results and user text of the next recorded request. The reply must
hold what the recorded response holds (read here by a small independent oracle), with
its usage and stop reason; the request must match the recorded request field by field.

Where the recording client (PydanticAI) sent something else than we do, the
difference is named here and asserted, never ignored: it sends a ``tool_choice``
and ``"is_error": false`` (the defaults, which we leave out), a result as a string
where we send a list of text blocks, and it opens a history that starts with the
assistant directly, where we put a ``(conversation start)`` user message first
(the recording shows the API accepts either).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import providers_corpus
import pytest
from providers_corpus import Interaction, Outcome, Recording, recording, recordings, sse_events
from providers_server import LoopbackServer, Sleeps

import statemachine as sm
import statemachine.messages
from statemachine.providers import (
    AnthropicModel,
    ProviderError,
    ProviderRequestError,
    RetryPolicy,
)

KEY = "sk-ant-recorded-0123456789abcdef"
NAMES = [r.name for r in recordings("anthropic")]
PASSED_THROUGH = ("top_k", "metadata", "output_config")


def model_for(
    turn: Interaction, server: LoopbackServer, on_text: Callable[[str], None]
) -> AnthropicModel:
    body = turn.body
    return AnthropicModel(
        body["model"],
        api_key=KEY,
        base_url=server.url,
        max_tokens=body["max_tokens"],
        system=body.get("system"),
        temperature=body.get("temperature"),
        thinking=body.get("thinking"),
        stream=bool(body.get("stream", False)),
        extra_body={k: body[k] for k in PASSED_THROUGH if k in body},
        retry=RetryPolicy(max_attempts=1),
        sleep=Sleeps(),
        on_text=on_text,
    )


def tools_of(body: Mapping[str, Any]) -> tuple[sm.ToolDefinition, ...]:
    return tuple(
        sm.ToolDefinition(t["name"], t.get("description") or "", t["input_schema"])
        for t in body.get("tools", ())
    )


def blocks(content: str | Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)


def result_text(content: str | Sequence[Mapping[str, Any]]) -> str:
    return "".join(b["text"] for b in blocks(content))


def new_messages(body: Mapping[str, Any], history: Sequence[sm.Message]) -> list[sm.Message]:
    """The last recorded user message (or, on the first turn, every message)."""
    recorded = body["messages"] if not history else body["messages"][-1:]
    calls = {c.id: c for m in history if isinstance(m, sm.AssistantMessage) for c in m.tool_calls}
    out: list[sm.Message] = []
    for message in recorded:
        for block in blocks(message["content"]):
            if message["role"] == "assistant":
                out.append(sm.AssistantMessage(block["text"]))
            elif block["type"] == "text":
                out.append(sm.UserMessage(block["text"]))
            else:
                call = calls[block["tool_use_id"]]
                error = bool(block.get("is_error"))
                text = result_text(block["content"])
                out.append(sm.ToolResultMessage(call.id, call.name, text, is_error=error))
    return out


def replay(rec: Recording, server: LoopbackServer) -> tuple[list[Outcome], list[list[str]]]:
    return providers_corpus.replay(rec, server, model_for, new_messages, tools_of)


# -- the oracle -----------------------------------------------------------------------------


def recorded_message(response: Mapping[str, Any]) -> Mapping[str, Any]:
    """The whole message: the JSON body, or the stream's events put together."""
    if "json" in response:
        return response["json"]  # type: ignore[no-any-return]
    message: dict[str, Any] = {}
    content: dict[int, dict[str, Any]] = {}
    for event in sse_events(response["text"]):
        kind = event["type"]
        if kind == "message_start":
            message = dict(event["message"])
        elif kind == "content_block_start":
            content[event["index"]] = dict(event["content_block"])
        elif kind == "content_block_delta":
            block, delta = content[event["index"]], event["delta"]
            for field in ("text", "thinking", "signature"):
                if field in delta:
                    block[field] = block.get(field, "") + delta[field]
            if "partial_json" in delta:
                block["json"] = block.get("json", "") + delta["partial_json"]
        elif kind == "message_delta":
            message["stop_reason"] = event["delta"]["stop_reason"]
            message["usage"] = {**message["usage"], **event["usage"]}
    for block in content.values():
        if "json" in block:
            block["input"] = json.loads(block.pop("json") or "{}")
    message["content"] = [content[i] for i in sorted(content)]
    return message


def expected(message: Mapping[str, Any]) -> list[Any]:
    out: list[Any] = []
    for block in message["content"]:
        if block["type"] == "text":
            out.append(("text", block["text"]))
        elif block["type"] == "thinking":
            out.append(("thinking", block["thinking"], block["signature"]))
        elif block["type"] == "redacted_thinking":
            out.append(("redacted", block["data"]))
        elif block["type"] == "tool_use":
            out.append(("call", block["id"], block["name"], block["input"]))
    return out


def ours(message: sm.AssistantMessage) -> list[Any]:
    out: list[Any] = []
    for block in message.content:
        if isinstance(block, sm.messages.ThinkingContent):
            if block.redacted:
                out.append(("redacted", block.signature))
            else:
                out.append(("thinking", block.thinking, block.signature))
        elif isinstance(block, sm.TextContent):
            out.append(("text", block.text))
        elif isinstance(block, sm.ToolCall):
            out.append(("call", block.id, block.name, dict(block.arguments)))
    return out


def usage_of(raw: Mapping[str, Any]) -> sm.messages.Usage:
    fresh, output = raw.get("input_tokens") or 0, raw.get("output_tokens") or 0
    read = raw.get("cache_read_input_tokens") or 0
    written = raw.get("cache_creation_input_tokens") or 0
    return sm.messages.Usage(
        input=fresh,
        output=output,
        cache_read=read,
        cache_write=written,
        total_tokens=fresh + output + read + written,
    )


STOPS = {
    "end_turn": sm.messages.StopReason.STOP,
    "tool_use": sm.messages.StopReason.TOOL_USE,
    "max_tokens": sm.messages.StopReason.LENGTH,
}


# -- the request ----------------------------------------------------------------------------


def canonical(messages: Sequence[Mapping[str, Any]]) -> list[Any]:
    out: list[Any] = []
    for message in messages:
        content: list[Any] = []
        for block in blocks(message["content"]):
            kind = block["type"]
            if kind == "tool_result":
                error = bool(block.get("is_error"))
                content.append((kind, block["tool_use_id"], result_text(block["content"]), error))
            elif kind == "tool_use":
                content.append((kind, block["id"], block["name"], block["input"]))
            else:
                content.append((kind, {k: v for k, v in block.items() if k != "type"}))
        out.append((message["role"], content))
    return out


def assert_same_request(body: Mapping[str, Any], sent: Mapping[str, Any]) -> None:
    for key in ("model", "max_tokens", "system", "temperature", "thinking", *PASSED_THROUGH):
        assert sent.get(key) == body.get(key), key
    assert sent["stream"] is bool(body.get("stream", False))
    assert tools_of(sent) == tools_of(body)
    theirs = canonical(body["messages"])
    if body["messages"][0]["role"] == "assistant":
        theirs.insert(0, ("user", [("text", {"text": "(conversation start)"})]))
    assert canonical(sent["messages"]) == theirs


# -- every recording ------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", NAMES)
def test_recorded_conversation_replays_with_the_same_messages_usage_and_requests(
    name: str, server: LoopbackServer
) -> None:
    rec = recording("anthropic", name)
    outcomes, pieces = replay(rec, server)
    assert len(outcomes) == len(rec.interactions)
    for index, outcome in enumerate(outcomes):
        interaction = rec.interactions[index]
        assert_same_request(interaction.body, server.requests[index].json())
        if interaction.status != 200:
            assert isinstance(outcome, ProviderError)
            continue
        assert isinstance(outcome, sm.AssistantMessage), outcome
        message = recorded_message(interaction.response)
        assert ours(outcome) == expected(message)
        assert outcome.usage == usage_of(message["usage"])
        assert outcome.stop_reason is STOPS[message["stop_reason"]]
        texts = [b["text"] for b in message["content"] if b["type"] == "text"]
        assert "".join(pieces[index]) == "".join(texts)


def test_the_corpus_has_ten_recordings_or_more() -> None:
    assert len(NAMES) >= 10


@pytest.mark.timeout(60)
def test_a_recorded_invalid_request_is_a_request_error(server: LoopbackServer) -> None:
    rec = recording("anthropic", "anthropic_explicit_effort_xhigh_unsupported_model_errors")
    [error], _ = replay(rec, server)
    assert type(error) is ProviderRequestError
    assert "does not support effort level 'xhigh'" in str(error)
    assert KEY not in str(error)


@pytest.mark.timeout(60)
def test_four_parallel_calls_are_answered_in_one_user_message(server: LoopbackServer) -> None:
    outcomes, _ = replay(recording("anthropic", "multiple_parallel_tool_calls"), server)
    first = outcomes[0]
    assert isinstance(first, sm.AssistantMessage)
    assert len(first.tool_calls) == 4
    results = server.requests[1].json()["messages"][2]
    assert results["role"] == "user"
    assert [b["tool_use_id"] for b in results["content"]] == [c.id for c in first.tool_calls]

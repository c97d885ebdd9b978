"""BedrockModel against recorded Bedrock Converse traffic.

Each recording (``tests/fixtures/providers/bedrock/recorded``) is replayed turn by
turn through the real ``boto3`` client, pointed at the loopback server with fake
credentials: the server sends the recorded bytes (for ``ConverseStream``, the binary
AWS event stream exactly as AWS framed it, checksums included). The reply must hold
what the recorded response holds (read here by a small independent oracle: the JSON
body, or the event stream decoded with botocore's own decoder), with its usage and
stop reason; the request must match the recorded request field by field.

Where the recording client (PydanticAI) sent something else than we do, the
difference is named here and asserted, never ignored: it sends ``"system": []`` and
``"inferenceConfig": {}`` when they are empty (we leave them out), ``"status":
"success"`` on results and ``"toolChoice": {"auto": {}}`` (the defaults, which we
leave out), and ``cachePoint`` blocks (we mark no cache points).
"""

from __future__ import annotations

import base64
import json
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import providers_corpus
import pytest
from botocore.eventstream import EventStreamBuffer
from providers_corpus import Interaction, Outcome, Recording, recording, recordings
from providers_server import LoopbackServer, Sleeps

import statemachine as sm
import statemachine.messages
from statemachine.providers import (
    BedrockModel,
    ProviderError,
    ProviderRequestError,
    RetryPolicy,
)

SECRET = "fake-secret-0123456789abcdefXYZ"
NAMES = [r.name for r in recordings("bedrock")]


def model_id(path: str) -> str:
    return urllib.parse.unquote(path.split("/model/")[1].rsplit("/", 1)[0])


def region(host: str) -> str:
    return host.split(".")[1]


def model_for(
    turn: Interaction, server: LoopbackServer, on_text: Callable[[str], None]
) -> BedrockModel:
    request, body = turn.request, turn.body
    system = body.get("system") or []
    config = body.get("inferenceConfig", {})
    extra = {k: v for k, v in config.items() if k not in ("maxTokens", "temperature")}
    return BedrockModel(
        model_id(request["path"]),
        region=region(request["host"]),
        endpoint_url=server.url,
        aws_access_key_id="AKIAFAKEFAKEFAKE",
        aws_secret_access_key=SECRET,
        system="".join(s["text"] for s in system if "text" in s) or None,
        max_tokens=config.get("maxTokens"),
        temperature=config.get("temperature"),
        additional_fields=body.get("additionalModelRequestFields"),
        extra_body={"inferenceConfig": config} if extra else {},
        stream=request["path"].endswith("/converse-stream"),
        retry=RetryPolicy(max_attempts=1),
        sleep=Sleeps(),
        on_text=on_text,
    )


def tools_of(body: Mapping[str, Any]) -> tuple[sm.ToolDefinition, ...]:
    return tuple(
        sm.ToolDefinition(
            t["toolSpec"]["name"],
            t["toolSpec"].get("description") or "",
            t["toolSpec"]["inputSchema"]["json"],
        )
        for t in body.get("toolConfig", {}).get("tools", ())
    )


def new_messages(body: Mapping[str, Any], history: Sequence[sm.Message]) -> list[sm.Message]:
    """The user message at the end of a recorded request, as our messages."""
    last = body["messages"][-1]
    assert last["role"] == "user"
    calls = {c.id: c for m in history if isinstance(m, sm.AssistantMessage) for c in m.tool_calls}
    out: list[sm.Message] = []
    for block in last["content"]:
        if "text" in block:
            out.append(sm.UserMessage(block["text"]))
        elif "toolResult" in block:
            result = block["toolResult"]
            call = calls[result["toolUseId"]]
            text = "".join(c["text"] for c in result["content"])
            error = result.get("status") == "error"
            out.append(sm.ToolResultMessage(call.id, call.name, text, is_error=error))
    return out


def replay(rec: Recording, server: LoopbackServer) -> tuple[list[Outcome], list[list[str]]]:
    return providers_corpus.replay(rec, server, model_for, new_messages, tools_of)


# -- the oracle -----------------------------------------------------------------------------


def stream_events(response: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The recorded event stream, decoded by botocore's own event-stream decoder."""
    buffer = EventStreamBuffer()
    buffer.add_data(base64.b64decode(response["base64"]))
    events = []
    for message in buffer:
        kind = message.headers[":event-type"]
        events.append({kind: json.loads(message.payload)})
    return events


def expected_reply(response: Mapping[str, Any]) -> tuple[list[Any], str, dict[str, int]]:
    """The content, the stop reason and the usage a recorded response holds."""
    if "json" in response:
        body = response["json"]
        content: list[tuple[Any, ...]] = []
        for block in body["output"]["message"]["content"]:
            if "text" in block:
                content.append(("text", block["text"]))
            elif "toolUse" in block:
                use = block["toolUse"]
                content.append(("call", use["toolUseId"], use["name"], use["input"]))
            elif "reasoningContent" in block:
                reasoning = block["reasoningContent"]
                if "redactedContent" in reasoning:
                    content.append(("redacted", base64.b64decode(reasoning["redactedContent"])))
                else:
                    text = reasoning["reasoningText"]
                    content.append(("thinking", text["text"], text.get("signature")))
        return content, body["stopReason"], body["usage"]
    blocks: dict[int, list[Any]] = {}
    stop, usage = "", {}
    for event in stream_events(response):
        if "contentBlockStart" in event:
            start = event["contentBlockStart"]
            use = start["start"]["toolUse"]
            blocks[start["contentBlockIndex"]] = ["call", use["toolUseId"], use["name"], ""]
        elif "contentBlockDelta" in event:
            index = event["contentBlockDelta"]["contentBlockIndex"]
            delta = event["contentBlockDelta"]["delta"]
            if "text" in delta:
                blocks.setdefault(index, ["text", ""])[1] += delta["text"]
            elif "toolUse" in delta:
                blocks[index][3] += delta["toolUse"]["input"]
            else:
                reasoning = delta["reasoningContent"]
                if "redactedContent" in reasoning:
                    raw = base64.b64decode(reasoning["redactedContent"])
                    blocks.setdefault(index, ["redacted", b""])[1] += raw
                else:
                    block = blocks.setdefault(index, ["thinking", "", None])
                    block[1] += reasoning.get("text", "")
                    if "signature" in reasoning:
                        block[2] = (block[2] or "") + reasoning["signature"]
        elif "messageStop" in event:
            stop = event["messageStop"]["stopReason"]
        elif "metadata" in event:
            usage = event["metadata"]["usage"]
    content = []
    for index in sorted(blocks):
        block = blocks[index]
        if block[0] == "call":
            block[3] = json.loads(block[3] or "{}")
        if block[0] == "text" and not block[1]:
            continue
        content.append(tuple(block))
    return content, stop, usage


def ours(message: sm.AssistantMessage) -> list[Any]:
    out: list[Any] = []
    for block in message.content:
        if isinstance(block, sm.messages.ThinkingContent):
            if block.redacted:
                assert block.signature is not None
                out.append(("redacted", base64.b64decode(block.signature)))
            else:
                out.append(("thinking", block.thinking, block.signature))
        elif isinstance(block, sm.TextContent):
            out.append(("text", block.text))
        elif isinstance(block, sm.ToolCall):
            out.append(("call", block.id, block.name, dict(block.arguments)))
    return out


STOPS = {
    "end_turn": sm.messages.StopReason.STOP,
    "tool_use": sm.messages.StopReason.TOOL_USE,
    "max_tokens": sm.messages.StopReason.LENGTH,
}


# -- the request ----------------------------------------------------------------------------


def recorded_request(body: Mapping[str, Any]) -> dict[str, Any]:
    """The recorded body, less what the recording client sends and we do not (see the
    module docstring)."""
    out = dict(body)
    for key in ("system", "inferenceConfig"):
        if not out.get(key):
            out.pop(key, None)
    messages = []
    for message in out["messages"]:
        content = []
        for block in message["content"]:
            if "cachePoint" in block:
                continue
            if "toolResult" in block and block["toolResult"].get("status") == "success":
                result = {k: v for k, v in block["toolResult"].items() if k != "status"}
                block = {"toolResult": result}
            content.append(block)
        messages.append({"role": message["role"], "content": content})
    out["messages"] = messages
    if out.get("toolConfig", {}).get("toolChoice") == {"auto": {}}:
        out["toolConfig"] = {"tools": out["toolConfig"]["tools"]}  # the API's default
    if "system" in out:
        out["system"] = [s for s in out["system"] if "cachePoint" not in s]
    return out


# -- every recording ------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", NAMES)
def test_recorded_conversation_replays_with_the_same_messages_usage_and_requests(
    name: str, server: LoopbackServer
) -> None:
    rec = recording("bedrock", name)
    outcomes, pieces = replay(rec, server)
    for index, outcome in enumerate(outcomes):
        interaction = rec.interactions[index]
        request = server.requests[index]
        assert request.path == interaction.request["path"]
        assert request.headers["authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIA")
        assert request.json() == recorded_request(interaction.body)
        if interaction.status != 200:
            assert isinstance(outcome, ProviderError)
            continue
        assert isinstance(outcome, sm.AssistantMessage), outcome
        content, stop, usage = expected_reply(interaction.response)
        assert ours(outcome) == content
        assert outcome.stop_reason is STOPS[stop]
        assert outcome.usage is not None
        assert outcome.usage.input == usage["inputTokens"]
        assert outcome.usage.output == usage["outputTokens"]
        assert outcome.usage.cache_read == usage.get("cacheReadInputTokens", 0)
        assert outcome.usage.cache_write == usage.get("cacheWriteInputTokens", 0)
        assert outcome.usage.total_tokens == usage["totalTokens"]
        texts = [c[1] for c in content if c[0] == "text"]
        assert "".join(pieces[index]) == "".join(texts)
    assert len(outcomes) == len(rec.interactions)


def test_the_corpus_has_ten_recordings_or_more() -> None:
    assert len(NAMES) >= 10


# -- what particular recordings show ------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["bedrock_error", "bedrock_streaming_error"])
def test_a_recorded_invalid_model_id_is_a_request_error_naming_region_and_model(
    name: str, server: LoopbackServer
) -> None:
    [error], _ = replay(recording("bedrock", name), server)
    assert type(error) is ProviderRequestError
    text = str(error)
    assert "Bedrock model 'us.does-not-exist-model-v1:0' in region us-east-1" in text
    assert "HTTP 400" in text
    assert "The provided model identifier is invalid" in text
    assert SECRET not in text

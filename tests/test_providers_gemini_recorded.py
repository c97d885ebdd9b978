"""GeminiModel against recorded Gemini API traffic.

Each recording (``tests/fixtures/providers/gemini/recorded``) is replayed turn by
turn against the real ``google-genai`` SDK: the loopback server sends the recorded
bytes, and the next turn's history is our reply plus the function responses and user
text of the next recorded request. The reply must hold what the recorded response
holds (read here by a small independent oracle), with its usage and finish reason;
the request must match the recorded request field by field.

Where the recording client (PydanticAI) sent something else than we do, the
difference is named here and asserted, never ignored:

* it gives every call an id of its own (``pyd_ai_...``) and sends it back; Gemini
  sent none, so we send none back (Gemini matches responses to calls by order);
* it wraps a function's result as ``{"return_value": ...}``, we as ``{"output": ...}``;
* it asks for ``responseModalities: ["TEXT"]`` and sets a ``toolConfig``; we send
  neither (they are the API's defaults for a text model with tools);
* older recordings declare parameters in Gemini's Schema form (``"type":
  "OBJECT"``); we send JSON Schema as ``parameters_json_schema`` (compared after
  lowering the type names).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import providers_corpus
import pytest
from providers_corpus import (
    Interaction,
    Outcome,
    Recording,
    last_calls,
    recording,
    recordings,
    sse_events,
    trailing,
)
from providers_server import LoopbackServer, Sleeps

import statemachine as sm
import statemachine.messages
from statemachine.providers import GeminiModel, RetryPolicy, VertexGeminiModel
from statemachine.providers.gemini import GENERATED_ID_PREFIX, SIGNATURE_PREFIX

KEY = "AIza-recorded-0123456789abcdef"
NAMES = [r.name for r in recordings("gemini")]


def model_name(path: str) -> str:
    return path.split("/models/")[1].split(":")[0]


def model_for(
    turn: Interaction, server: LoopbackServer, on_text: Callable[[str], None]
) -> GeminiModel:
    path, body = turn.request["path"], turn.body
    config = body.get("generationConfig", {})
    system = body.get("systemInstruction")
    extra: dict[str, Any] = {}
    if "safetySettings" in body:
        extra["safety_settings"] = body["safetySettings"]
    return GeminiModel(
        model_name(path),
        api_key=KEY,
        base_url=server.url,
        system="".join(p["text"] for p in system["parts"]) if system else None,
        temperature=config.get("temperature"),
        max_output_tokens=config.get("maxOutputTokens"),
        thinking=config.get("thinkingConfig"),
        stream="streamGenerateContent" in path,
        extra_body=extra,
        retry=RetryPolicy(max_attempts=1),
        sleep=Sleeps(),
        on_text=on_text,
    )


def json_schema(schema: Any) -> Any:
    """Gemini's own Schema form (``"type": "OBJECT"``), which older recordings use, as
    the JSON Schema we send (``parameters_json_schema``)."""
    if isinstance(schema, dict):
        return {
            k: v.lower() if k == "type" and isinstance(v, str) else json_schema(v)
            for k, v in schema.items()
        }
    if isinstance(schema, list):
        return [json_schema(v) for v in schema]
    return schema


def tools_of(body: Mapping[str, Any]) -> tuple[sm.ToolDefinition, ...]:
    return tuple(
        sm.ToolDefinition(
            d["name"],
            d.get("description") or "",
            d.get("parameters_json_schema")
            or d.get("parametersJsonSchema")
            or json_schema(d["parameters"]),
        )
        for tool in body.get("tools", ())
        for d in tool.get("functionDeclarations", ())
    )


def result_text(response: Mapping[str, Any]) -> str:
    value = response.get("return_value", response)
    return value if isinstance(value, str) else json.dumps(value)


def new_messages(body: Mapping[str, Any], history: Sequence[sm.Message]) -> list[sm.Message]:
    """The user contents at the end of a recorded request, as our messages: text
    becomes a user message, a function response the result of our call at the same
    position."""
    tail = trailing(body["contents"], ("user",))
    calls = last_calls(history)
    out: list[sm.Message] = []
    answered = 0
    for content in tail:
        for part in content["parts"]:
            if "text" in part:
                out.append(sm.UserMessage(part["text"]))
            else:
                response = part["functionResponse"]
                call = calls[answered]
                answered += 1
                assert call.name == response["name"]
                out.append(
                    sm.ToolResultMessage(call.id, call.name, result_text(response["response"]))
                )
    return out


def replay(rec: Recording, server: LoopbackServer) -> tuple[list[Outcome], list[list[str]]]:
    return providers_corpus.replay(rec, server, model_for, new_messages, tools_of)


# -- the oracle -----------------------------------------------------------------------------


def chunks(response: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
    if "json" in response:
        return [response["json"]]
    return sse_events(response["text"])


def signature(raw: str) -> bytes:
    """A thought signature as bytes, whichever base64 alphabet it came in."""
    return base64.urlsafe_b64decode(raw.replace("+", "-").replace("/", "_") + "==")


def expected_reply(response: Mapping[str, Any]) -> tuple[list[Any], str, dict[str, int] | None]:
    """The content (calls as ``(name, args, id or None)``), finish reason and last usage."""
    content: list[Any] = []
    finish = ""
    usage = None
    for chunk in chunks(response):
        usage = chunk.get("usageMetadata", usage)
        for candidate in chunk.get("candidates", ())[:1]:
            for part in candidate.get("content", {}).get("parts", ()):
                sig = part.get("thoughtSignature")
                if part.get("thought"):
                    content.append(("thinking", part["text"], sig and signature(sig)))
                    continue
                if sig is not None:
                    content.append(("thinking", "", signature(sig)))
                if "functionCall" in part:
                    call = part["functionCall"]
                    content.append(("call", call["name"], call.get("args", {}), call.get("id")))
                elif part.get("text"):
                    if content and content[-1][0] == "text":
                        content[-1] = ("text", content[-1][1] + part["text"])
                    else:
                        content.append(("text", part["text"]))
            finish = candidate.get("finishReason", finish)
    return content, finish, usage


def ours(message: sm.AssistantMessage) -> list[Any]:
    out: list[Any] = []
    for block in message.content:
        if isinstance(block, sm.messages.ThinkingContent):
            raw = block.signature
            assert raw is not None
            assert raw.startswith(SIGNATURE_PREFIX)
            sig = base64.b64decode(raw.removeprefix(SIGNATURE_PREFIX)) or None
            out.append(("thinking", block.thinking, sig))
        elif isinstance(block, sm.TextContent):
            out.append(("text", block.text))
        elif isinstance(block, sm.ToolCall):
            given = None if block.id.startswith(GENERATED_ID_PREFIX) else block.id
            out.append(("call", block.name, dict(block.arguments), given))
    return out


# -- the request ----------------------------------------------------------------------------


def canonical_contents(contents: Sequence[Mapping[str, Any]]) -> list[Any]:
    out: list[Any] = []
    for content in contents:
        parts: list[Any] = []
        for part in content["parts"]:
            sig = part.get("thoughtSignature")
            sig_bytes = signature(sig) if sig else None
            if "functionCall" in part:
                call = part["functionCall"]
                given = call.get("id")
                if given is not None and given.startswith("pyd_ai_"):
                    given = None  # the recording client's own id; Gemini sent none
                parts.append(("call", call["name"], call.get("args", {}), given, sig_bytes))
            elif "functionResponse" in part:
                response = part["functionResponse"]
                given = response.get("id")
                if given is not None and given.startswith("pyd_ai_"):
                    given = None
                value = response["response"]
                text = value["output"] if "output" in value else result_text(value)
                parts.append(("response", response["name"], text, given))
            else:
                parts.append(("text", part["text"], bool(part.get("thought")), sig_bytes))
        out.append((content["role"], parts))
    return out


def camel(config: Mapping[str, Any]) -> dict[str, Any]:
    def key(name: str) -> str:
        head, *rest = name.split("_")
        return head + "".join(word.title() for word in rest)

    return {key(k): v for k, v in config.items()}


def assert_same_request(path: str, body: Mapping[str, Any], sent_path: str, sent: Any) -> None:
    assert sent_path.split("?")[0] == path.split("?")[0]
    assert canonical_contents(sent["contents"]) == canonical_contents(body["contents"])
    theirs = dict(body.get("generationConfig", {}))
    theirs.pop("responseModalities", None)  # the recording client's; see the docstring
    mine = dict(sent.get("generationConfig", {}))
    # The API takes either spelling of the thinking config's keys (both recorded).
    for config in (theirs, mine):
        if "thinkingConfig" in config:
            config["thinkingConfig"] = camel(config["thinkingConfig"])
    assert mine == theirs
    assert sent.get("safetySettings") == body.get("safetySettings")
    assert tools_of(sent) == tools_of(body)
    system = body.get("systemInstruction")
    mine_system = sent.get("systemInstruction")
    assert (mine_system is None) == (system is None)
    if system is not None:
        assert [p["text"] for p in mine_system["parts"]] == [p["text"] for p in system["parts"]]


# -- every recording ----------------------------------------------------------------------------


def usage_of(raw: Mapping[str, int] | None) -> sm.messages.Usage | None:
    if raw is None:
        return None
    prompt = raw.get("promptTokenCount", 0)
    cached = raw.get("cachedContentTokenCount", 0)
    output = raw.get("candidatesTokenCount", 0) + raw.get("thoughtsTokenCount", 0)
    return sm.messages.Usage(
        input=prompt - cached,
        output=output,
        cache_read=cached,
        total_tokens=raw.get("totalTokenCount", prompt + output),
    )


STOPS = {
    "STOP": sm.messages.StopReason.STOP,
    "MAX_TOKENS": sm.messages.StopReason.LENGTH,
    "SAFETY": sm.messages.StopReason.ERROR,
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", NAMES)
def test_recorded_conversation_replays_with_the_same_messages_usage_and_requests(
    name: str, server: LoopbackServer
) -> None:
    rec = recording("gemini", name)
    outcomes, pieces = replay(rec, server)
    assert len(outcomes) == len(rec.interactions)
    for index, outcome in enumerate(outcomes):
        interaction = rec.interactions[index]
        assert isinstance(outcome, sm.AssistantMessage), outcome
        content, finish, usage = expected_reply(interaction.response)
        assert ours(outcome) == content
        assert outcome.usage == usage_of(usage)
        stop = STOPS[finish]
        if stop is sm.messages.StopReason.STOP and outcome.tool_calls:
            stop = sm.messages.StopReason.TOOL_USE
        assert outcome.stop_reason is stop
        texts = [c[1] for c in content if c[0] == "text"]
        assert "".join(pieces[index]) == "".join(texts)
        request = server.requests[index]
        assert_same_request(
            interaction.request["path"], interaction.body, request.path, request.json()
        )


def test_the_corpus_has_ten_recordings_or_more() -> None:
    assert len(NAMES) >= 10


# -- what particular recordings show -------------------------------------------------------------


@pytest.mark.timeout(60)
def test_calls_without_ids_get_unique_ids_that_are_not_sent_back(server: LoopbackServer) -> None:
    rec = recording("gemini", "google_model_iter_stream")
    outcomes, _ = replay(rec, server)
    ids = [c.id for o in outcomes if isinstance(o, sm.AssistantMessage) for c in o.tool_calls]
    assert len(ids) == 2
    assert len(set(ids)) == 2
    assert all(i.startswith(GENERATED_ID_PREFIX) for i in ids)
    second = server.requests[1].json()["contents"]
    assert "id" not in second[1]["parts"][0]["functionCall"]
    assert "id" not in second[2]["parts"][0]["functionResponse"]


@pytest.mark.timeout(60)
def test_a_thought_signature_on_a_call_goes_back_on_that_call(server: LoopbackServer) -> None:
    rec = recording("gemini", "google_streaming_tool_call_thought_signature")
    outcomes, _ = replay(rec, server)
    first = outcomes[0]
    assert isinstance(first, sm.AssistantMessage)
    marker, call = first.content
    assert isinstance(marker, sm.messages.ThinkingContent)
    assert marker.thinking == ""
    assert isinstance(call, sm.ToolCall)
    part = server.requests[1].json()["contents"][1]["parts"][0]
    recorded = rec.interactions[1].body["contents"][1]["parts"][0]
    assert signature(part["thoughtSignature"]) == signature(recorded["thoughtSignature"])


@pytest.mark.timeout(60)
def test_a_safety_stop_is_an_error_stop_naming_the_reason(server: LoopbackServer) -> None:
    [reply], _ = replay(recording("gemini", "google_model_safety_settings"), server)
    assert isinstance(reply, sm.AssistantMessage)
    assert reply.stop_reason is sm.messages.StopReason.ERROR
    assert reply.error_message is not None
    assert "finish reason SAFETY" in reply.error_message


@pytest.mark.timeout(60)
def test_an_empty_reply_at_max_tokens_is_an_empty_length_stop(server: LoopbackServer) -> None:
    rec = recording("gemini", "google_model_max_tokens_thinking_model_empty_response")
    [reply], _ = replay(rec, server)
    assert isinstance(reply, sm.AssistantMessage)
    assert reply == attrs.evolve(reply, content=(), stop_reason=sm.messages.StopReason.LENGTH)


# -- Gemini on Vertex AI (vertex/recorded) ------------------------------------------------------


class VertexToken:
    """Google credentials holding a valid token (what Application Default Credentials give)."""

    token = "ya29.recorded-vertex-token"
    expired = False
    valid = True
    quota_project_id = None

    def refresh(self, request: object) -> None:
        raise AssertionError("the token is valid: no refresh")

    def before_request(self, request: Any, method: str, url: str, headers: dict[str, str]) -> None:
        headers["authorization"] = f"Bearer {self.token}"

    def apply(self, headers: dict[str, str], token: str | None = None) -> None:
        headers["authorization"] = f"Bearer {self.token}"


def vertex_model_for(
    turn: Interaction, server: LoopbackServer, on_text: Callable[[str], None]
) -> VertexGeminiModel:
    path, body = turn.request["path"], turn.body
    # /v1beta1/projects/{project}/locations/{location}/publishers/google/models/{model}:...
    parts = path.split("/")
    system = body.get("systemInstruction")
    extra = {"labels": body["labels"]} if "labels" in body else {}
    return VertexGeminiModel(
        model_name(path),
        project=parts[3],
        location=parts[5],
        credentials=VertexToken(),
        base_url=server.url,
        api_version=parts[1],
        system="".join(p["text"] for p in system["parts"]) if system else None,
        stream="streamGenerateContent" in path,
        extra_body=extra,
        retry=RetryPolicy(max_attempts=1),
        sleep=Sleeps(),
        on_text=on_text,
    )


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", [r.name for r in recordings("vertex")])
def test_recorded_vertex_traffic_replays_through_the_vertex_model(
    name: str, server: LoopbackServer
) -> None:
    rec = recording("vertex", name)
    outcomes, pieces = providers_corpus.replay(
        rec, server, vertex_model_for, new_messages, tools_of
    )
    assert len(outcomes) == len(rec.interactions)
    for index, outcome in enumerate(outcomes):
        interaction = rec.interactions[index]
        assert isinstance(outcome, sm.AssistantMessage), outcome
        content, finish, usage = expected_reply(interaction.response)
        assert ours(outcome) == content
        assert outcome.usage == usage_of(usage)
        assert outcome.stop_reason is STOPS[finish]
        assert "".join(pieces[index]) == "".join(c[1] for c in content if c[0] == "text")
        request = server.requests[index]
        # The whole path: project, location, publisher, model and method.
        assert request.path.split("?")[0] == interaction.request["path"]
        assert request.headers["authorization"] == "Bearer ya29.recorded-vertex-token"
        assert_same_request(
            interaction.request["path"], interaction.body, request.path, request.json()
        )
        assert request.json().get("labels") == interaction.body.get("labels")

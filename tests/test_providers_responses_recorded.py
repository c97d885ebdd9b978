"""OpenAIResponsesModel against recorded OpenAI Responses traffic.

Each recording (``tests/fixtures/providers/openai_responses/recorded``) is replayed
turn by turn: the loopback server sends the recorded response bytes, the adapter
reads them, and the next turn's history is our reply plus the tool results and user
messages of the next recorded request. Then:

* the reply must hold what the recorded response holds (its final ``output`` list,
  read here by a small independent oracle), with the recorded usage;
* a streamed reply must have streamed exactly the recorded text deltas;
* the request the adapter sent must match the recorded request field by field:
  model, instructions, reasoning, include, stream, tools, and every input item.

Where the recording client (PydanticAI) sent something else than we do, the
difference is named and asserted, never ignored: it omits item ids for
non-reasoning models (we always send the ``fc_`` id we received, as OpenAI's
stateless examples do), an older version sent the item id as the ``call_id``, and it
sends an empty assistant text before parallel calls (we send no empty text).
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
    OpenAIResponsesModel,
    ProviderError,
    ProviderRequestError,
    RetryPolicy,
)
from statemachine.providers.openai_responses import SIGNATURE_PREFIX, split_call_id

KEY = "sk-recorded-0123456789abcdef"
NAMES = [r.name for r in recordings("openai_responses")]


def model_for(
    turn: Interaction, server: LoopbackServer, on_text: Callable[[str], None]
) -> OpenAIResponsesModel:
    """The adapter configured as the recording client was for this request."""
    body = turn.body
    return OpenAIResponsesModel(
        body["model"],
        api_key=KEY,
        base_url=server.url + "/v1",
        system=body.get("instructions") or None,
        reasoning=body.get("reasoning"),
        encrypted_reasoning="reasoning.encrypted_content" in body.get("include", ()),
        stream=bool(body.get("stream", False)),
        temperature=body.get("temperature"),
        retry=RetryPolicy(max_attempts=1),
        sleep=Sleeps(),
        on_text=on_text,
    )


def tools_of(body: Mapping[str, Any]) -> tuple[sm.ToolDefinition, ...]:
    return tuple(
        sm.ToolDefinition(t["name"], t.get("description") or "", t["parameters"])
        for t in body.get("tools", ())
    )


def _is_input(item: Mapping[str, Any]) -> bool:
    return item.get("role") == "user" or item.get("type") == "function_call_output"


def new_messages(body: Mapping[str, Any], history: Sequence[sm.Message]) -> list[sm.Message]:
    """The user messages and tool results at the end of a recorded request: what the
    person and the tools added since the model's last reply."""
    items = body["input"]
    if isinstance(items, str):
        return [sm.UserMessage(items)]
    tail: list[Mapping[str, Any]] = []
    for item in reversed(items):
        if not _is_input(item):
            break
        tail.insert(0, item)
    calls = {
        split_call_id(c.id)[0]: c
        for m in history
        if isinstance(m, sm.AssistantMessage)
        for c in m.tool_calls
    }
    out: list[sm.Message] = []
    for item in tail:
        if item.get("role") == "user":
            content = item["content"]
            if isinstance(content, str):
                out.append(sm.UserMessage(content))
            else:
                out.append(sm.UserMessage(tuple(sm.TextContent(p["text"]) for p in content)))
        else:
            call = calls.get(item["call_id"]) or _by_item_id(history, item["call_id"])
            out.append(sm.ToolResultMessage(call.id, call.name, item["output"]))
    return out


def _by_item_id(history: Sequence[sm.Message], item_id: str) -> sm.ToolCall:
    """The call whose item id an older recording client sent as the ``call_id``."""
    for m in history:
        if isinstance(m, sm.AssistantMessage):
            for call in m.tool_calls:
                if split_call_id(call.id)[1] == item_id:
                    return call
    raise AssertionError(f"no call for {item_id}")


def replay(rec: Recording, server: LoopbackServer) -> tuple[list[Outcome], list[list[str]]]:
    return providers_corpus.replay(rec, server, model_for, new_messages, tools_of)


# -- the oracle: what a recorded response holds, read independently ----------------------


def final_response(response: Mapping[str, Any]) -> Mapping[str, Any]:
    if "json" in response:
        return response["json"]  # type: ignore[no-any-return]
    for event in sse_events(response["text"]):
        if event["type"] in ("response.completed", "response.incomplete"):
            return event["response"]  # type: ignore[no-any-return]
    raise AssertionError("the recorded stream has no final response")


def expected_reply(response: Mapping[str, Any]) -> sm.AssistantMessage:
    content: list[Any] = []
    for item in response["output"]:
        if item["type"] == "reasoning":
            text = "\n\n".join(s["text"] for s in item.get("summary", ()))
            content.append(sm.messages.ThinkingContent(text, "(signature)"))
        elif item["type"] == "message":
            content.append(sm.TextContent("".join(p["text"] for p in item["content"])))
        elif item["type"] == "function_call":
            arguments = json.loads(item["arguments"] or "{}")
            content.append(sm.ToolCall(f"{item['call_id']}|{item['id']}", item["name"], arguments))
    usage = response["usage"]
    cached = usage["input_tokens_details"]["cached_tokens"]
    calls = any(isinstance(b, sm.ToolCall) for b in content)
    return sm.AssistantMessage(
        tuple(content),
        stop_reason=sm.messages.StopReason.TOOL_USE if calls else sm.messages.StopReason.STOP,
        usage=sm.messages.Usage(
            input=usage["input_tokens"] - cached,
            output=usage["output_tokens"],
            cache_read=cached,
            total_tokens=usage["total_tokens"],
        ),
    )


def without_signatures(message: sm.AssistantMessage) -> sm.AssistantMessage:
    import attrs

    content = tuple(
        attrs.evolve(b, signature="(signature)")
        if isinstance(b, sm.messages.ThinkingContent)
        else b
        for b in message.content
    )
    return attrs.evolve(message, content=content)


def streamed_deltas(response: Mapping[str, Any]) -> list[str]:
    """The text pieces ``on_text`` sees: each delta of a stream, or each message's
    whole text of a response that came in one piece."""
    if "json" in response:
        texts = [
            "".join(p["text"] for p in item["content"])
            for item in response["json"].get("output", ())
            if item["type"] == "message"
        ]
        return [t for t in texts if t]
    return [
        e["delta"]
        for e in sse_events(response["text"])
        if e["type"] == "response.output_text.delta"
    ]


# -- the request, field by field ------------------------------------------------------------


_TYPOGRAPHIC = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"'})


def canonical_input(items: Sequence[Mapping[str, Any]]) -> list[tuple[Any, ...]]:
    """Input items in one comparable shape: ``("user", content)``, ``("assistant",
    text, id)``, ``("reasoning", id, encrypted, summaries)``, ``("function_call",
    call_id, name, arguments, id)``, ``("function_call_output", call_id, output)``."""
    out: list[tuple[Any, ...]] = []
    for item in items:
        kind = item.get("type", "message")
        if kind == "message" and item["role"] == "user":
            out.append(("user", item["content"]))
        elif kind == "message":
            content = item["content"]
            text = content if isinstance(content, str) else "".join(p["text"] for p in content)
            # One recording's request has the answer's typographic quotes as ASCII (its
            # cassette was normalised); both sides are compared after the same step.
            out.append(
                ("assistant", text.translate(_TYPOGRAPHIC), item.get("id"), item.get("phase"))
            )
        elif kind == "reasoning":
            summaries = [s["text"] for s in item["summary"]]
            out.append(("reasoning", item["id"], item["encrypted_content"], summaries))
        elif kind == "function_call":
            arguments = json.loads(item["arguments"])
            out.append(("function_call", item["call_id"], item["name"], arguments, item.get("id")))
        elif kind == "function_call_output":
            out.append(("function_call_output", item["call_id"], item["output"]))
        else:
            raise AssertionError(f"unexpected input item {kind}")
    return out


def recorded_input(rec: Recording, body: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    """The recorded input, with the recording client's differences from ours made
    explicit (see the module docstring)."""
    items = [
        item
        for item in body["input"]
        # PydanticAI sends an empty assistant text before parallel calls; we never
        # send empty text.
        if not (item.get("role") == "assistant" and item.get("content") == "")
    ]
    return canonical_input(items)


def our_input(rec: Recording, body: Mapping[str, Any], sent: Mapping[str, Any]) -> list[Any]:
    """Our input, reduced where the recording client sent less: item ids it left out."""
    ours = canonical_input(sent["input"])
    recorded = {(i.get("call_id"), i.get("type")): i for i in body["input"] if isinstance(i, dict)}
    out: list[tuple[Any, ...]] = []
    for entry in ours:
        if entry[0] == "function_call":
            _, call_id, name, arguments, item_id = entry
            theirs = recorded.get((call_id, "function_call")) or recorded.get(
                (item_id, "function_call")
            )
            assert theirs is not None, f"the recording has no call {call_id}"
            if theirs["call_id"] == item_id:
                call_id = item_id  # the older client sent the item id as the call id
            if "id" not in theirs:
                assert item_id is not None
                assert item_id.startswith("fc_")
                item_id = None  # sent by us, left out by the recording client
            entry = ("function_call", call_id, name, arguments, item_id)
        elif entry[0] == "function_call_output":
            _, call_id, output = entry
            if (call_id, "function_call_output") not in recorded:
                call_id = next(
                    i["call_id"]
                    for i in body["input"]
                    if i.get("type") == "function_call_output" and i["output"] == output
                )
            entry = ("function_call_output", call_id, output)
        out.append(entry)
    return out


def assert_same_request(rec: Recording, body: Mapping[str, Any], sent: Mapping[str, Any]) -> None:
    assert sent["model"] == body["model"]
    assert sent.get("instructions") == (body.get("instructions") or None)
    assert sent["stream"] is bool(body.get("stream", False))
    assert sent.get("reasoning") == body.get("reasoning")
    assert sent.get("include") == body.get("include")
    assert sent.get("temperature") == body.get("temperature")
    assert sent["store"] is False
    ours = [(t["name"], t["description"], t["parameters"]) for t in sent.get("tools", ())]
    theirs = [
        (t["name"], t.get("description") or "", t["parameters"]) for t in body.get("tools", ())
    ]
    assert ours == theirs
    assert our_input(rec, body, sent) == recorded_input(rec, body)


# -- every recording ------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", NAMES)
def test_recorded_conversation_replays_with_the_same_messages_usage_and_requests(
    name: str, server: LoopbackServer
) -> None:
    rec = recording("openai_responses", name)
    outcomes, pieces = replay(rec, server)
    sent = server.bodies()
    assert len(sent) == len(outcomes)
    for index, outcome in enumerate(outcomes):
        interaction = rec.interactions[index]
        if interaction.status != 200:
            assert isinstance(outcome, ProviderError)
            continue
        assert isinstance(outcome, sm.AssistantMessage), outcome
        expected = expected_reply(final_response(interaction.response))
        assert without_signatures(outcome) == expected
        for block in outcome.content:
            if isinstance(block, sm.messages.ThinkingContent):
                assert block.signature is not None
                assert block.signature.startswith(SIGNATURE_PREFIX)
        assert pieces[index] == streamed_deltas(interaction.response)
        if name == "thinking_with_modified_history" and index == 1:
            continue  # the recorded request is the one OpenAI refused: see below
        assert_same_request(rec, interaction.body, sent[index])


def test_the_corpus_has_ten_recordings_or_more() -> None:
    assert len(NAMES) >= 10


# -- what particular recordings show ----------------------------------------------------------


@pytest.mark.timeout(60)
def test_recorded_400_for_a_bad_parameter_is_a_request_error_naming_the_parameter(
    server: LoopbackServer,
) -> None:
    outcomes, _ = replay(recording("openai_responses", "model_http_error"), server)
    [error] = outcomes
    assert type(error) is ProviderRequestError
    assert "HTTP 400" in str(error)
    assert "Invalid 'temperature'" in str(error)
    assert "gpt-4o" in str(error)
    assert server.url in str(error)
    assert KEY not in str(error)


@pytest.mark.timeout(60)
def test_reasoning_goes_back_with_the_message_that_followed_it_which_openai_requires(
    server: LoopbackServer,
) -> None:
    """PydanticAI sent the reasoning item and then the answer as a plain assistant
    message; OpenAI refused it ("provided without its required following item"). Our
    request sends the answer as the message item it was, under its id."""
    rec = recording("openai_responses", "thinking_with_modified_history")
    outcomes, _ = replay(rec, server)
    assert isinstance(outcomes[0], sm.AssistantMessage)
    assert isinstance(outcomes[1], ProviderRequestError)  # the recorded 400, served
    assert "without its required following item" in str(outcomes[1])
    first = final_response(rec.interactions[0].response)
    reasoning, message = first["output"]
    sent = server.bodies()[1]["input"]
    assert [i.get("type", i.get("role")) for i in sent] == ["user", "reasoning", "message", "user"]
    assert sent[1]["id"] == reasoning["id"]
    assert sent[1]["encrypted_content"] == reasoning["encrypted_content"]
    assert sent[2]["id"] == message["id"]
    assert sent[2]["content"][0]["text"] == message["content"][0]["text"]
    # The refused request: the (edited) answer as a plain message, with no id.
    refused = rec.interactions[1].body["input"]
    assert set(refused[2]) == {"role", "content"}
    assert refused[2]["role"] == "assistant"


@pytest.mark.timeout(60)
def test_parallel_calls_are_answered_in_order_with_their_call_ids(server: LoopbackServer) -> None:
    rec = recording("openai_responses", "model_retry")
    outcomes, _ = replay(rec, server)
    first = outcomes[0]
    assert isinstance(first, sm.AssistantMessage)
    assert [c.name for c in first.tool_calls] == ["get_location", "get_location"]
    assert [dict(c.arguments) for c in first.tool_calls] == [
        {"loc_name": "Londos"},
        {"loc_name": "London"},
    ]
    sent = server.bodies()[1]["input"]
    outputs = [i["call_id"] for i in sent if i.get("type") == "function_call_output"]
    assert outputs == [split_call_id(c.id)[0] for c in first.tool_calls]


@pytest.mark.timeout(60)
def test_streamed_reasoning_and_call_keep_usage_with_reasoning_tokens_in_output(
    server: LoopbackServer,
) -> None:
    rec = recording("openai_responses", "streaming_usage")
    [reply], _ = replay(rec, server)
    assert isinstance(reply, sm.AssistantMessage)
    usage = final_response(rec.interactions[0].response)["usage"]
    assert usage["output_tokens_details"]["reasoning_tokens"] > 0
    assert reply.usage is not None
    assert reply.usage.output == usage["output_tokens"]
    assert [type(b).__name__ for b in reply.content] == ["ThinkingContent", "ToolCall"]

"""OpenAIChatModel against recorded Chat Completions traffic: OpenAI itself, and the
OpenAI-compatible endpoints of Gemini, Cerebras and Ollama (``ollama/recorded``: real
Ollama responses on its ``/v1`` endpoint), and the services behind the compatible
model-string prefixes, each in its own folder: Groq, DeepSeek, OpenRouter, Cerebras
and Mistral.

Each recording is replayed turn by turn through the real ``openai`` SDK: the
loopback server sends the recorded bytes, and the next turn's history is our reply
plus the tool results and user messages of the next recorded request. The reply must
hold what the recorded response holds (read here by a small independent oracle), with
its usage; the request must match the recorded request field by field.

Where the recording client (PydanticAI) sent something else than we do, the
difference is named here and asserted, never ignored: it sends ``n: 1`` and a
``tool_choice`` (we send neither), ``strict`` on tools, and its own ids
(``pyd_ai_...``) for calls a server sent without one, where we make our own
``call_`` ids; we send ``stream_options`` when streaming, as it does.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

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
from providers_server import LoopbackServer, Sleeps, complete

import statemachine as sm
import statemachine.messages
from statemachine.providers import (
    AzureOpenAIChatModel,
    OpenAIChatModel,
    ProviderError,
    ProviderRequestError,
    ProviderResponseError,
    ProviderUnavailableError,
    RetryPolicy,
)

KEY = "sk-recorded-chat-0123456789abcdef"
# Every OpenAI-compatible service with recordings, each in its own folder.
SERVICES = ("openai", "ollama", "groq", "deepseek", "openrouter", "cerebras", "mistral")
# Recordings whose client retried an error the way we do not (the same request again,
# or a retry prompt after it): each is checked up to its first error, below.
RETRIED_ERRORS = {
    ("groq", "tool_use_failed_error"): (ProviderRequestError, "Tool call validation failed"),
    ("groq", "tool_use_failed_error_streaming"): (
        ProviderRequestError,
        "Tool call validation failed",
    ),
    ("groq", "tool_use_failed_error_with_text"): (ProviderRequestError, "did not call a tool"),
    ("groq", "tool_use_failed_error_streaming_with_text"): (
        ProviderRequestError,
        "did not call a tool",
    ),
    ("openrouter", "openrouter_errors_raised"): (
        ProviderUnavailableError,
        "returned HTTP 429: Provider returned error",
    ),
}
# Recordings whose 200 response is an error all the same (not a completion, or an
# error inside the stream).
ERRORS_IN_A_200 = {
    ("openai", "text_response"),
    ("openai", "invalid_response"),
    ("openrouter", "openrouter_stream_error"),
}
CASES = [
    (service, r.name)
    for service in SERVICES
    for r in recordings(service)
    if (service, r.name) not in RETRIED_ERRORS
]
PASSED_THROUGH = (
    "max_completion_tokens",
    "response_format",
    "moderation",
    "reasoning_effort",
    # the services' own request fields, sent through extra_body
    "clear_thinking",
    "search_settings",
    "frequency_penalty",
    "presence_penalty",
    "top_p",
    "models",
    "provider",
    "transforms",
    "reasoning",
    "preset",
)


def model_for(
    turn: Interaction, server: LoopbackServer, on_text: Callable[[str], None]
) -> OpenAIChatModel:
    request, body = turn.request, turn.body
    messages = body["messages"]
    system = messages[0]["content"] if messages and messages[0]["role"] == "system" else None
    base = request["path"].removesuffix("/chat/completions")
    return OpenAIChatModel(
        body["model"],
        api_key=KEY,
        base_url=server.url + base,
        system=system,
        stream=bool(body.get("stream", False)),
        # Groq's and Mistral's own SDKs stream without asking for a usage chunk.
        stream_usage="stream_options" in body,
        temperature=body.get("temperature"),
        extra_body={k: body[k] for k in PASSED_THROUGH if k in body},
        retry=RetryPolicy(max_attempts=1),
        sleep=Sleeps(),
        on_text=on_text,
    )


def tools_of(body: Mapping[str, Any]) -> tuple[sm.ToolDefinition, ...]:
    return tuple(
        sm.ToolDefinition(
            t["function"]["name"],
            t["function"].get("description") or "",
            t["function"].get("parameters") or {"type": "object", "properties": {}},
        )
        for t in body.get("tools", ())
    )


def new_messages(body: Mapping[str, Any], history: Sequence[sm.Message]) -> list[sm.Message]:
    """The user and tool messages at the end of a recorded request, as our messages;
    a tool message answers our call at the same position."""
    tail = trailing(body["messages"], ("user", "tool"))
    if not history:
        # The first request: everything but the system prompt (an opening assistant
        # message included) is the history we start from.
        tail = [m for m in body["messages"] if m["role"] != "system"]
    calls = last_calls(history)
    out: list[sm.Message] = []
    answered = 0
    for message in tail:
        if message["role"] == "user":
            out.append(sm.UserMessage(message["content"]))
        elif message["role"] == "assistant":
            out.append(sm.AssistantMessage(message["content"]))
        else:
            call = calls[answered]
            answered += 1
            out.append(sm.ToolResultMessage(call.id, call.name, message["content"]))
    return out


def replay(rec: Recording, server: LoopbackServer) -> tuple[list[Outcome], list[list[str]]]:
    return providers_corpus.replay(rec, server, model_for, new_messages, tools_of)


# -- the oracle -----------------------------------------------------------------------------


def expected_reply(response: Mapping[str, Any]) -> tuple[list[Any], str, Mapping[str, Any]]:
    """Content (calls as ``(id, name, args)``), finish reason and usage."""
    if "json" in response:
        body = response["json"]
        message = body["choices"][0]["message"]
        content: list[Any] = []
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        if reasoning:
            content.append(("thinking", reasoning))
        if message.get("content"):
            content.append(("text", message["content"]))
        for call in message.get("tool_calls") or ():
            arguments = json.loads(call["function"]["arguments"] or "{}")
            content.append(("call", call["id"], call["function"]["name"], arguments))
        return content, body["choices"][0]["finish_reason"], body["usage"]
    text, thinking, finish = "", "", ""
    usage: Mapping[str, Any] = {}
    calls: dict[int, list[Any]] = {}
    for chunk in sse_events(response["text"]):
        usage = chunk.get("usage") or (chunk.get("x_groq") or {}).get("usage") or usage
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            thinking += delta.get("reasoning_content") or delta.get("reasoning") or ""
            parts = delta.get("content") or ""
            if isinstance(parts, str):
                parts = [{"type": "text", "text": parts}]
            for part in parts:  # Mistral: a list of text and thinking parts
                if part["type"] == "text":
                    text += part["text"]
                else:
                    thinking += "".join(t["text"] for t in part["thinking"])
            for call in delta.get("tool_calls") or ():
                entry = calls.setdefault(call["index"], ["call", "", "", ""])
                entry[1] += call.get("id") or ""
                entry[2] += call.get("function", {}).get("name") or ""
                entry[3] += call.get("function", {}).get("arguments") or ""
            finish = choice.get("finish_reason") or finish
    content = [("thinking", thinking)] if thinking else []
    content += [("text", text)] if text else []
    for index in sorted(calls):
        kind, call_id, name, arguments = calls[index]
        content.append((kind, call_id, name, json.loads(arguments or "{}")))
    return content, finish, usage


def ours(message: sm.AssistantMessage, generated: set[str]) -> list[Any]:
    out: list[Any] = []
    for block in message.content:
        if isinstance(block, sm.messages.ThinkingContent):
            out.append(("thinking", block.thinking))
        elif isinstance(block, sm.TextContent):
            out.append(("text", block.text))
        elif isinstance(block, sm.ToolCall):
            given = "" if block.id in generated else block.id
            out.append(("call", given, block.name, dict(block.arguments)))
    return out


def usage_of(raw: Mapping[str, Any]) -> sm.messages.Usage:
    details = raw.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens") or 0
    return sm.messages.Usage(
        input=raw["prompt_tokens"] - cached,
        output=raw["completion_tokens"],
        cache_read=cached,
        total_tokens=raw["total_tokens"],
    )


STOPS = {
    "stop": sm.messages.StopReason.STOP,
    "tool_calls": sm.messages.StopReason.TOOL_USE,
    "length": sm.messages.StopReason.LENGTH,
}


# -- the request ----------------------------------------------------------------------------


def canonical(messages: Sequence[Mapping[str, Any]], ids: dict[str, str]) -> list[Any]:
    """Messages in one comparable shape; call ids renamed to their position, so that
    ids made by us and by the recording client for id-less calls compare equal."""
    out: list[Any] = []

    def position(call_id: str) -> str:
        return ids.setdefault(call_id, f"call#{len(ids)}")

    for message in messages:
        role = message["role"]
        if role == "assistant":
            calls = [
                (position(c["id"]), c["function"]["name"], json.loads(c["function"]["arguments"]))
                for c in message.get("tool_calls") or ()
            ]
            out.append((role, message.get("content") or None, calls))
        elif role == "tool":
            out.append((role, position(message["tool_call_id"]), message["content"]))
        else:
            out.append((role, message["content"]))
    return out


def assert_same_request(body: Mapping[str, Any], sent: Mapping[str, Any]) -> None:
    assert sent["model"] == body["model"]
    assert sent["stream"] is bool(body.get("stream", False))
    assert sent.get("stream_options") == body.get("stream_options")
    assert sent.get("temperature") == body.get("temperature")
    for key in PASSED_THROUGH:
        assert sent.get(key) == body.get(key)
    assert tools_of(sent) == tools_of(body)
    assert canonical(sent["messages"], {}) == canonical(body["messages"], {})


# -- every recording ------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("provider", "name"), CASES)
def test_recorded_conversation_replays_with_the_same_messages_usage_and_requests(
    provider: str, name: str, server: LoopbackServer
) -> None:
    rec = recording(provider, name)
    outcomes, pieces = replay(rec, server)
    assert len(outcomes) == len(rec.interactions)
    for index, outcome in enumerate(outcomes):
        interaction = rec.interactions[index]
        assert_same_request(interaction.body, server.requests[index].json())
        if isinstance(outcome, ProviderError):
            # Only where the provider did answer with an error (each such recording has
            # a test of its own below): any other error is a reply we failed to read.
            assert interaction.status >= 400 or (provider, name) in ERRORS_IN_A_200, outcome
            continue
        content, finish, usage = expected_reply(interaction.response)
        recorded_ids = {c[1] for c in content if c[0] == "call"}
        generated = {c.id for c in outcome.tool_calls if c.id not in recorded_ids}
        assert all(g.startswith("call_") for g in generated)
        assert ours(outcome, generated) == content
        assert outcome.usage == usage_of(usage)
        assert outcome.stop_reason is STOPS[finish]
        assert "".join(pieces[index]) == "".join(c[1] for c in content if c[0] == "text")


def test_the_corpus_has_ten_recordings_or_more() -> None:
    assert len([c for c in CASES if c[0] == "openai"]) >= 10


@pytest.mark.parametrize(
    ("service", "least"),
    [("groq", 5), ("openrouter", 5), ("cerebras", 3), ("deepseek", 2), ("mistral", 2)],
)
def test_each_compatible_service_has_its_recordings(service: str, least: int) -> None:
    # As many as the public source had that replay whole (SOURCES.md says which not).
    assert len([c for c in CASES if c[0] == service]) >= least


# -- what particular recordings show ------------------------------------------------------------


@pytest.mark.timeout(60)
def test_calls_a_compatible_server_sent_with_empty_ids_get_unique_ids(
    server: LoopbackServer,
) -> None:
    outcomes, _ = replay(recording("openai", "compatible_api_with_tool_calls_without_id"), server)
    first = outcomes[0]
    assert isinstance(first, sm.AssistantMessage)
    [call] = first.tool_calls
    assert call.id.startswith("call_")
    assert len(call.id) <= 40
    second = server.requests[1].json()["messages"]
    assert second[1]["tool_calls"][0]["id"] == call.id
    assert second[2]["tool_call_id"] == call.id


@pytest.mark.timeout(60)
def test_a_recorded_refusal_of_the_system_role_is_a_request_error(server: LoopbackServer) -> None:
    [error], _ = replay(recording("openai", "o1_mini_system_role"), server)
    assert type(error) is ProviderRequestError
    assert "does not support 'system' with this model" in str(error)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("text_response", "received `text/plain`"),
        ("invalid_response", "Data returned by API invalid for expected schema"),
    ],
)
def test_a_recorded_response_that_is_not_a_completion_is_a_response_error(
    name: str, words: str, server: LoopbackServer
) -> None:
    [error], _ = replay(recording("openai", name), server)
    assert type(error) is ProviderResponseError
    assert words in str(error)


@pytest.mark.timeout(60)
def test_ollama_reasoning_is_kept_as_thinking(server: LoopbackServer) -> None:
    outcomes, _ = replay(recording("ollama", "ollama_cloud_tool_output"), server)
    first = outcomes[0]
    assert isinstance(first, sm.AssistantMessage)
    thinking = first.content[0]
    assert isinstance(thinking, sm.messages.ThinkingContent)
    assert thinking.thinking.startswith("We need to answer question")


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("service", "name"), sorted(RETRIED_ERRORS))
def test_a_recorded_service_error_is_classified(
    service: str, name: str, server: LoopbackServer
) -> None:
    kind, words = RETRIED_ERRORS[service, name]
    rec = recording(service, name)
    outcomes, _ = replay(rec, server)
    error = outcomes[-1]
    assert type(error) is kind
    assert words in str(error)
    assert_same_request(rec.interactions[len(outcomes) - 1].body, server.requests[-1].json())


@pytest.mark.timeout(60)
def test_a_recorded_groq_tool_failure_is_not_retried(server: LoopbackServer) -> None:
    # Groq's 400 "tool_use_failed" is the model's bad call: a request error, at once.
    outcomes, _ = replay(recording("groq", "tool_use_failed_error"), server)
    assert len(outcomes) == 1
    assert len(server.requests) == 1


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "name", ["tool_use_failed_error_with_text", "tool_use_failed_error_streaming_with_text"]
)
def test_groq_calls_after_the_retry_prompt_are_read(name: str, server: LoopbackServer) -> None:
    # The recording's turns after its error: the retry prompt, and Groq's answer with
    # reasoning and a call (whole, then streamed).
    whole = recording("groq", name)
    rec = Recording(name, whole.source, whole.interactions[1:])
    [outcome], _ = replay(rec, server)
    assert isinstance(outcome, sm.AssistantMessage)
    assert_same_request(rec.interactions[0].body, server.requests[0].json())
    content, finish, usage = expected_reply(rec.interactions[0].response)
    assert [c[0] for c in content] == ["thinking", "call"]
    assert ours(outcome, set()) == content
    assert outcome.usage == usage_of(usage)
    assert outcome.stop_reason is STOPS[finish] is sm.messages.StopReason.TOOL_USE


@pytest.mark.timeout(60)
def test_deepseek_thinking_goes_back_between_calls_and_parallel_calls_are_read(
    server: LoopbackServer,
) -> None:
    # DeepSeek's thinking mode with tools: its reasoning_content goes back on each
    # assistant message of the tool loop (as the recording client sent it). The
    # recording opens with two system messages; we send the first as the system
    # prompt, so the second is left out of the comparison.
    rec = recording("deepseek", "deepseek_deferred_capability_with_thinking", "tools")

    def deepseek(
        turn: Interaction, server: LoopbackServer, on_text: Callable[[str], None]
    ) -> OpenAIChatModel:
        model = model_for(turn, server, on_text)
        model.reasoning_field = "reasoning_content"
        return model

    def one_to_one(body: Mapping[str, Any], history: Sequence[sm.Message]) -> list[sm.Message]:
        # Each recorded message after the system prompts is one of ours, in order; the
        # client also added an assistant call of its own (search_tools), kept as is.
        recorded = [m for m in body["messages"] if m["role"] != "system"][len(history) :]
        out: list[sm.Message] = []
        for message in recorded:
            if message["role"] == "user":
                out.append(sm.UserMessage(message["content"]))
            elif message["role"] == "assistant":
                calls = tuple(
                    sm.ToolCall(
                        c["id"], c["function"]["name"], json.loads(c["function"]["arguments"])
                    )
                    for c in message["tool_calls"]
                )
                out.append(sm.AssistantMessage(calls, stop_reason=sm.messages.StopReason.TOOL_USE))
            else:
                by_id = {c.id: c for c in last_calls([*history, *out])}
                call = by_id[message["tool_call_id"]]
                out.append(sm.ToolResultMessage(call.id, call.name, message["content"]))
        return out

    outcomes, _ = providers_corpus.replay(rec, server, deepseek, one_to_one, tools_of)
    assert len(outcomes) == 3
    for index, outcome in enumerate(outcomes):
        assert isinstance(outcome, sm.AssistantMessage)
        response = rec.interactions[index].response["json"]
        message = response["choices"][0]["message"]
        content, finish, usage = expected_reply(rec.interactions[index].response)
        assert ours(outcome, set()) == content
        assert outcome.usage == usage_of(usage)
        assert outcome.stop_reason is STOPS[finish]
        sent = [m for m in server.requests[index].json()["messages"] if m["role"] != "system"]
        recorded = [m for m in rec.interactions[index].body["messages"] if m["role"] != "system"]
        assert canonical(sent, {}) == canonical(recorded, {})
        # (the client's own call went with an empty reasoning_content, ours with none)
        assert [m.get("reasoning_content") for m in sent] == [
            m.get("reasoning_content") or None for m in recorded
        ]
        if index == 1:
            assert len(message["tool_calls"]) == 2  # two calls in parallel
            assert [c.name for c in outcome.tool_calls] == ["get_player_name", "roll_dice"]


@pytest.mark.timeout(60)
def test_a_recorded_azure_openai_call_replays_through_the_azure_model(
    server: LoopbackServer,
) -> None:
    rec = recording("azure", "azure_provider_call")
    [turn] = rec.interactions
    server.add(turn.reply())
    version = turn.request["query"].removeprefix("api-version=")
    model = AzureOpenAIChatModel(
        turn.body["model"],
        endpoint=server.url,
        api_version=version,
        api_key=KEY,
        stream=False,
        retry=RetryPolicy(max_attempts=1),
        sleep=Sleeps(),
    )
    history = new_messages(turn.body, [])
    reply = complete(model, history)
    content, finish, usage = expected_reply(turn.response)
    assert ours(reply, set()) == content
    assert reply.usage == usage_of(usage)
    assert reply.stop_reason is STOPS[finish]
    request = server.requests[0]
    assert request.path == f"{turn.request['path']}?{turn.request['query']}"
    assert request.headers["api-key"] == KEY
    assert_same_request(turn.body, request.json())


@pytest.mark.timeout(60)
def test_a_recorded_whole_magistral_answer_reads_its_thinking_and_text_parts(
    server: LoopbackServer,
) -> None:
    # The recording's second turn is Mistral's (its first is OpenAI's, whose thinking
    # the recording client sent to Mistral as content parts, which we do not): only
    # Mistral's answer is read here.
    turn = recording("mistral", "mistral_model_thinking_part", "whole").interactions[1]
    message = turn.response["json"]["choices"][0]["message"]
    server.add(turn.reply())
    model = OpenAIChatModel(
        turn.body["model"],
        api_key=KEY,
        base_url=server.url + "/v1",
        stream=False,
        retry=RetryPolicy(max_attempts=1),
        sleep=Sleeps(),
    )
    reply = complete(model)
    thinking = "".join(
        t["text"]
        for part in message["content"]
        if part["type"] == "thinking"
        for t in part["thinking"]
    )
    text = "".join(part["text"] for part in message["content"] if part["type"] == "text")
    assert reply.content == (sm.messages.ThinkingContent(thinking), sm.TextContent(text))
    assert reply.usage == usage_of(turn.response["json"]["usage"])

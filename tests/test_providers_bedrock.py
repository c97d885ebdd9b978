"""BedrockModel against the real ``boto3`` client, pointed at a loopback server with
fake credentials: the request it signs and sends, Bedrock's error types (as HTTP
errors with ``x-amzn-ErrorType``, and as exceptions inside the event stream), and
every documented outcome of bad input. The recorded corpus is in
``test_providers_bedrock_recorded.py``; the limits shared with the other adapters in
``test_providers_limits.py``."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from typing import Any

import pytest
from providers_corpus import bedrock_event, bedrock_exception, bedrock_text_stream
from providers_server import (
    FAST,
    LIST,
    TEXT_PIECES,
    TEXT_REPLY,
    Log,
    LoopbackServer,
    Reply,
    Sleeps,
    assert_text_deltas,
    complete,
    options_run,
)

import statemachine as sm
import statemachine.messages
from statemachine.providers import (
    BedrockModel,
    CallOptions,
    ContextOverflowError,
    ProviderAuthError,
    ProviderLimitError,
    ProviderRequestError,
    ProviderResponseError,
    ProviderUnavailableError,
)
from statemachine.providers.bedrock import project_messages

SECRET = "wJalrXUtnFEMI-K7MDENG-0123456789abcdef"
STREAM = (("Content-Type", "application/vnd.amazon.eventstream"),)
MODEL = "us.anthropic.claude-sonnet-4-20250514-v1:0"


def make_model(server: LoopbackServer, **kw: Any) -> BedrockModel:
    kw.setdefault("retry", FAST)
    kw.setdefault("sleep", Sleeps())
    return BedrockModel(
        MODEL,
        region="eu-central-1",
        endpoint_url=server.url,
        aws_access_key_id="AKIAFAKEFAKEFAKE",
        aws_secret_access_key=SECRET,
        **kw,
    )


def stream(*events: bytes) -> Reply:
    return Reply(200, STREAM, b"".join(events))


def end(reason: str = "end_turn") -> bytes:
    usage = {"inputTokens": 10, "outputTokens": 5, "totalTokens": 15}
    return bedrock_event("messageStop", {"stopReason": reason}) + bedrock_event(
        "metadata", {"usage": usage, "metrics": {"latencyMs": 1}}
    )


def tool_use(index: int, use_id: str, name: str, pieces: list[str]) -> bytes:
    start = {"contentBlockIndex": index, "start": {"toolUse": {"toolUseId": use_id, "name": name}}}
    out = bedrock_event("contentBlockStart", start)
    for piece in pieces:
        delta = {"contentBlockIndex": index, "delta": {"toolUse": {"input": piece}}}
        out += bedrock_event("contentBlockDelta", delta)
    return out + bedrock_event("contentBlockStop", {"contentBlockIndex": index})


def aws_error(status: int, kind: str, message: str) -> Reply:
    headers = (("Content-Type", "application/json"), ("x-amzn-ErrorType", f"{kind}:http://"))
    return Reply(status, headers, json.dumps({"message": message}).encode())


# -- the request --------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_a_text_stream_gives_text_usage_and_a_signed_request(server: LoopbackServer) -> None:
    server.add(Reply(200, STREAM, bedrock_text_stream(), piece_size=13))
    pieces: list[str] = []
    model = make_model(
        server,
        system="Be brief.",
        on_text=pieces.append,
        max_tokens=300,
        temperature=0.5,
        additional_fields={"thinking": {"type": "enabled", "budget_tokens": 1024}},
    )
    reply = complete(model, tools=(LIST,))
    assert reply == TEXT_REPLY
    assert pieces == TEXT_PIECES
    [request] = server.requests
    assert request.path == "/model/us.anthropic.claude-sonnet-4-20250514-v1%3A0/converse-stream"
    assert request.headers["authorization"].startswith(
        "AWS4-HMAC-SHA256 Credential=AKIAFAKEFAKEFAKE/"
    )
    assert "/eu-central-1/bedrock/aws4_request" in request.headers["authorization"]
    assert request.json() == {
        "messages": [{"role": "user", "content": [{"text": "list the files"}]}],
        "system": [{"text": "Be brief."}],
        "inferenceConfig": {"maxTokens": 300, "temperature": 0.5},
        "toolConfig": {
            "tools": [
                {
                    "toolSpec": {
                        "name": "list_files",
                        "inputSchema": {"json": LIST.schema_dict()},
                        "description": "List a directory.",
                    }
                }
            ]
        },
        "additionalModelRequestFields": {"thinking": {"type": "enabled", "budget_tokens": 1024}},
    }


def test_history_maps_to_messages_with_reasoning_results_and_images() -> None:
    image = sm.ImageContent("iVBORw0KGgo=", "image/png")
    png = base64.b64decode("iVBORw0KGgo=")
    redacted = base64.b64encode(b"\x00secret").decode()
    history: list[sm.Message] = [
        sm.AssistantMessage("Hello."),
        sm.UserMessage((sm.TextContent("look"), image)),
        sm.AssistantMessage(
            (
                sm.messages.ThinkingContent("Signed.", "c2ln"),
                sm.messages.ThinkingContent("", redacted, redacted=True),
                sm.messages.ThinkingContent("Unsigned."),
                sm.messages.ThinkingContent("Gemini's.", "gemini:AAAA"),
                sm.ToolCall("tooluse_1", "read_file", {"path": "a"}),
                sm.ToolCall("call:with:colons", "list_files", {}),
            ),
            stop_reason=sm.messages.StopReason.TOOL_USE,
        ),
        sm.ToolResultMessage("tooluse_1", "read_file", "no such file", is_error=True),
        sm.ToolResultMessage("call:with:colons", "list_files", (sm.TextContent("a"), image)),
        sm.UserMessage(""),
    ]
    messages = project_messages(history)
    substitute = messages[3]["content"][3]["toolUse"]["toolUseId"]
    assert substitute.startswith("call_with_colons_")
    assert len(messages) == 5
    assert messages[0] == {"role": "user", "content": [{"text": "(conversation start)"}]}
    assert messages[1] == {"role": "assistant", "content": [{"text": "Hello."}]}
    assert messages[2] == {
        "role": "user",
        "content": [{"text": "look"}, {"image": {"format": "png", "source": {"bytes": png}}}],
    }
    assert messages[3] == {
        "role": "assistant",
        "content": [
            {"reasoningContent": {"reasoningText": {"text": "Signed.", "signature": "c2ln"}}},
            {"reasoningContent": {"redactedContent": b"\x00secret"}},
            {"toolUse": {"toolUseId": "tooluse_1", "name": "read_file", "input": {"path": "a"}}},
            {"toolUse": {"toolUseId": substitute, "name": "list_files", "input": {}}},
        ],
    }
    assert messages[4] == {
        "role": "user",
        "content": [
            {
                "toolResult": {
                    "toolUseId": "tooluse_1",
                    "content": [{"text": "no such file"}],
                    "status": "error",
                }
            },
            {
                "toolResult": {
                    "toolUseId": substitute,
                    "content": [
                        {"text": "a"},
                        {"image": {"format": "png", "source": {"bytes": png}}},
                    ],
                }
            },
            {"text": "(empty message)"},
        ],
    }


def test_an_image_bedrock_cannot_take_is_a_clear_error() -> None:
    bmp = sm.UserMessage((sm.ImageContent("Qk0=", "image/bmp"),))
    with pytest.raises(sm.InvalidInputError, match="cannot carry an image of type 'image/bmp'"):
        project_messages([bmp])


# -- reading ------------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_reasoning_and_parallel_tool_use_stream_into_thinking_and_calls(
    server: LoopbackServer,
) -> None:
    thinking = {"reasoningContent": {"text": "Two files."}}
    signature = {"reasoningContent": {"signature": "c2ln"}}
    server.add(
        stream(
            bedrock_event("contentBlockDelta", {"contentBlockIndex": 0, "delta": thinking}),
            bedrock_event("contentBlockDelta", {"contentBlockIndex": 0, "delta": signature}),
            tool_use(1, "tooluse_a", "read_file", ['{"pa', 'th": "é\\"\\n"}']),
            tool_use(2, "tooluse_b", "list_files", [""]),
            end("tool_use"),
        )
    )
    reply = complete(make_model(server))
    assert reply.content == (
        sm.messages.ThinkingContent("Two files.", "c2ln"),
        sm.ToolCall("tooluse_a", "read_file", {"path": 'é"\n'}),
        sm.ToolCall("tooluse_b", "list_files", {}),
    )
    assert reply.stop_reason is sm.messages.StopReason.TOOL_USE


@pytest.mark.timeout(30)
def test_tool_input_that_is_not_json_becomes_a_call_with_a_parse_error(
    server: LoopbackServer,
) -> None:
    server.add(stream(tool_use(0, "tooluse_a", "read_file", ['{"path": "a']), end("tool_use")))
    [call] = complete(make_model(server)).tool_calls
    assert call.parse_error is not None
    assert "not valid JSON" in call.parse_error


@pytest.mark.timeout(30)
def test_a_tool_use_without_an_id_is_a_response_error(server: LoopbackServer) -> None:
    start = {"contentBlockIndex": 0, "start": {"toolUse": {"name": "read_file"}}}
    server.add(stream(bedrock_event("contentBlockStart", start), end("tool_use")))
    with pytest.raises(ProviderResponseError, match="a toolUseId is not text"):
        complete(make_model(server))


@pytest.mark.timeout(30)
def test_two_tool_uses_with_one_id_are_a_response_error(server: LoopbackServer) -> None:
    server.add(
        stream(
            tool_use(0, "tooluse_a", "read_file", ["{}"]),
            tool_use(1, "tooluse_a", "read_file", ["{}"]),
            end("tool_use"),
        )
    )
    with pytest.raises(ProviderResponseError, match="two calls have the same toolUseId"):
        complete(make_model(server))


@pytest.mark.timeout(30)
def test_an_unknown_delta_is_skipped_with_a_debug_log(server: LoopbackServer) -> None:
    # An event type botocore's service model does not know is dropped by botocore
    # itself, before the adapter sees it; a delta of a kind the adapter does not use
    # is skipped here, with a debug log.
    log = Log()
    citation = {"contentBlockIndex": 1, "delta": {"citation": {"title": "x"}}}
    server.add(
        stream(
            bedrock_event("brandNewEvent", {"x": 1}),
            bedrock_event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "Hi."}}),
            bedrock_event("contentBlockDelta", citation),
            end(),
        )
    )
    assert complete(make_model(server, logger=log)).text == "Hi."
    assert [(f["kind"], f["detail"]) for _, f in log.entries] == [("delta", "citation")]


@pytest.mark.timeout(30)
def test_a_stream_cut_before_message_stop_is_retried(server: LoopbackServer) -> None:
    cut = bedrock_event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "Hi"}})
    server.add(stream(cut), Reply(200, STREAM, bedrock_text_stream()))
    sleeps = Sleeps()
    assert complete(make_model(server, sleep=sleeps)).text.startswith("The workspace")
    assert sleeps.delays == [0.5]


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("reason", "stop"),
    [
        ("max_tokens", sm.messages.StopReason.LENGTH),
        ("guardrail_intervened", sm.messages.StopReason.ERROR),
        ("content_filtered", sm.messages.StopReason.ERROR),
    ],
)
def test_stop_reasons(server: LoopbackServer, reason: str, stop: sm.messages.StopReason) -> None:
    text = bedrock_event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "Hi"}})
    server.add(stream(text, end(reason)))
    reply = complete(make_model(server))
    assert reply.stop_reason is stop
    assert (reply.error_message is not None) is (stop is sm.messages.StopReason.ERROR)


# -- Bedrock's errors -------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_throttling_is_retried_then_names_region_and_model(server: LoopbackServer) -> None:
    server.add(*[aws_error(429, "ThrottlingException", "Too many requests.")] * 3)
    sleeps = Sleeps()
    with pytest.raises(ProviderUnavailableError) as caught:
        complete(make_model(server, sleep=sleeps))
    assert sleeps.delays == [0.5, 1.0]
    text = str(caught.value)
    assert f"Bedrock model {MODEL!r} in region eu-central-1 at {server.url}" in text
    assert "ThrottlingException: Too many requests" in text
    assert SECRET not in text


@pytest.mark.timeout(30)
def test_access_denied_is_an_auth_error(server: LoopbackServer) -> None:
    message = "You don't have access to the model with the specified model ID."
    server.add(aws_error(403, "AccessDeniedException", message))
    with pytest.raises(ProviderAuthError, match="bedrock:InvokeModel") as caught:
        complete(make_model(server))
    assert "region eu-central-1" in str(caught.value)
    assert len(server.requests) == 1


@pytest.mark.timeout(30)
def test_a_validation_error_is_a_request_error_and_a_long_input_an_overflow(
    server: LoopbackServer,
) -> None:
    server.add(aws_error(400, "ValidationException", "The model returned an error."))
    with pytest.raises(ProviderRequestError, match="ValidationException"):
        complete(make_model(server))
    server.add(aws_error(400, "ValidationException", "Input is too long for requested model."))
    with pytest.raises(ContextOverflowError):
        complete(make_model(server))


@pytest.mark.timeout(30)
def test_an_exception_inside_the_stream_is_classified(server: LoopbackServer) -> None:
    text = bedrock_event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "Hi"}})
    server.add(
        stream(text, bedrock_exception("throttlingException", "Slow down.")),
        Reply(200, STREAM, bedrock_text_stream()),
    )
    sleeps = Sleeps()
    assert complete(make_model(server, sleep=sleeps)).text.startswith("The workspace")
    assert sleeps.delays == [0.5]
    server.add(stream(bedrock_exception("validationException", "Bad input.")))
    with pytest.raises(ProviderRequestError, match="Bad input"):
        complete(make_model(server))


@pytest.mark.timeout(30)
def test_stream_false_calls_converse(server: LoopbackServer) -> None:
    whole = {
        "output": {"message": {"role": "assistant", "content": [{"text": "Done."}]}},
        "stopReason": "end_turn",
        "usage": {"inputTokens": 3, "outputTokens": 2, "totalTokens": 5},
    }
    server.add(Reply(200, (("Content-Type", "application/json"),), json.dumps(whole).encode()))
    reply = complete(make_model(server, stream=False))
    assert reply.text == "Done."
    assert server.requests[0].path.endswith("/converse")


def test_missing_region_and_credentials_are_clear(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/config")
    with pytest.raises(sm.InvalidInputError, match="no AWS region"):
        BedrockModel(MODEL)
    model = BedrockModel(
        MODEL,
        region="us-east-1",
        aws_secret_access_key=SECRET,
        aws_access_key_id="AKIAFAKEFAKEFAKE",
    )
    assert SECRET not in repr(model)
    assert "bedrock-runtime.us-east-1.amazonaws.com" in repr(model)


@pytest.mark.timeout(20)
@pytest.mark.parametrize("streaming", [True, False])
def test_a_server_that_never_answers_is_stopped_at_the_deadline(
    server: LoopbackServer, streaming: bool
) -> None:
    server.add(Reply(stall=True))
    model = make_model(server, stream=streaming, timeout=0.5)
    started = time.monotonic()
    with pytest.raises(ProviderLimitError, match=r"\(timeout=0\.5\)") as caught:
        complete(model)
    # complete() returned, so botocore's worker thread was not left waiting.
    assert time.monotonic() - started < 3.0
    assert "region eu-central-1" in str(caught.value)


# -- the run's instructions, settings and deltas ------------------------------------------


@pytest.mark.timeout(30)
def test_run_instructions_and_settings_go_in_system_and_inference_config(
    server: LoopbackServer,
) -> None:
    server.add(Reply(200, STREAM, bedrock_text_stream(), piece_size=13))
    model = make_model(server, system="the adapter's prompt", max_tokens=300, temperature=1.0)
    settings = sm.ModelSettings(temperature=0.5, max_tokens=77, top_p=0.9, stop=["END"])
    result, events = options_run(model, instructions="Be brief.", model_settings=settings)
    body = server.requests[0].json()
    assert body["system"] == [{"text": "Be brief."}]
    assert body["inferenceConfig"] == {
        "maxTokens": 77,
        "temperature": 0.5,
        "topP": 0.9,
        "stopSequences": ["END"],
    }
    assert_text_deltas(result, events)


@pytest.mark.timeout(30)
def test_without_run_options_the_adapters_own_system_and_max_tokens_are_sent(
    server: LoopbackServer,
) -> None:
    server.add(Reply(200, STREAM, bedrock_text_stream()))
    result, _ = options_run(make_model(server, system="adapter prompt", max_tokens=300))
    assert result.ok
    body = server.requests[0].json()
    assert body["system"] == [{"text": "adapter prompt"}]
    assert body["inferenceConfig"] == {"maxTokens": 300}


@pytest.mark.timeout(30)
def test_tool_input_streams_as_deltas_that_add_up_to_the_call(server: LoopbackServer) -> None:
    server.add(
        stream(
            tool_use(0, "tooluse_a", "read_file", ['{"pa', 'th": "é\\"\\n"}']),
            tool_use(1, "tooluse_b", "list_files", ['{"path": "src"}']),
            end("tool_use"),
        )
    )
    fragments: list[tuple[int, str, str, str]] = []
    options = CallOptions(on_tool_call_delta=lambda *f: fragments.append(f))
    model = make_model(server)
    reply = asyncio.run(
        model.complete(
            [sm.UserMessage("read it")], (), sm.AbortController().signal, options=options
        )
    )
    first, second = reply.tool_calls
    assert [f[:3] for f in fragments] == [
        (0, "tooluse_a", "read_file"),
        (0, "tooluse_a", "read_file"),
        (1, "tooluse_b", "list_files"),
    ]
    assert json.loads("".join(f[3] for f in fragments[:2])) == dict(first.arguments)
    assert json.loads(fragments[2][3]) == dict(second.arguments)

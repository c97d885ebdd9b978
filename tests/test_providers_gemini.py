"""GeminiModel against the real ``google-genai`` SDK and a loopback server: the
request it sends, Gemini's documented error shapes, and every documented outcome of
bad input (a cut stream, an unknown part, missing, empty or repeated call ids). The
recorded corpus is in ``test_providers_gemini_recorded.py``; the limits shared with
the other adapters in ``test_providers_limits.py``."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import pytest
from providers_server import (
    FAST,
    LIST,
    READ,
    TEXT_PIECES,
    TEXT_REPLY,
    Log,
    LoopbackServer,
    Reply,
    Sleeps,
    assert_text_deltas,
    complete,
    options_run,
    sse,
)

import statemachine as sm
import statemachine.messages
from statemachine.providers import (
    CallOptions,
    ContextOverflowError,
    GeminiModel,
    ProviderAuthError,
    ProviderRequestError,
    ProviderResponseError,
    ProviderUnavailableError,
    RetryPolicy,
)
from statemachine.providers.gemini import GENERATED_ID_PREFIX, project_contents

KEY = "AIza-gem-test-0123456789abcdef"
SSE = (("Content-Type", "text/event-stream"),)
JSON = (("Content-Type", "application/json"),)
SIG = base64.b64encode(b"\x01\x02signature").decode()


def make_model(server: LoopbackServer, **kw: Any) -> GeminiModel:
    kw.setdefault("retry", FAST)
    kw.setdefault("sleep", Sleeps())
    return GeminiModel("gemini-2.5-flash", api_key=KEY, base_url=server.url, **kw)


def chunk(*parts: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
    candidate: dict[str, Any] = {"content": {"parts": list(parts), "role": "model"}, "index": 0}
    if finish is not None:
        candidate["finishReason"] = finish
    return b"data: " + json.dumps({"candidates": [candidate], **extra}).encode() + b"\r\n\r\n"


def stream(*chunks: bytes) -> Reply:
    return Reply(200, SSE, b"".join(chunks))


def google_error(status: int, code: str, message: str) -> Reply:
    body = {"error": {"code": status, "message": message, "status": code}}
    return Reply(status, JSON, json.dumps(body).encode())


# -- the request --------------------------------------------------------------------------


def test_a_text_stream_gives_text_usage_and_the_request(server: LoopbackServer) -> None:
    server.add(sse("gemini/text_stream.sse", piece_size=11))
    pieces: list[str] = []
    model = make_model(
        server,
        system="Be brief.",
        on_text=pieces.append,
        max_output_tokens=300,
        thinking={"include_thoughts": True},
    )
    reply = complete(model, tools=(LIST,))
    assert reply == TEXT_REPLY
    assert pieces == TEXT_PIECES
    [request] = server.requests
    assert request.path == "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
    assert request.headers["x-goog-api-key"] == KEY
    body = request.json()
    assert body["contents"] == [{"role": "user", "parts": [{"text": "list the files"}]}]
    assert body["systemInstruction"]["parts"] == [{"text": "Be brief."}]
    assert body["generationConfig"] == {
        "maxOutputTokens": 300,
        "thinkingConfig": {"include_thoughts": True},
    }
    [tool] = body["tools"]
    assert tool["functionDeclarations"] == [
        {
            "name": "list_files",
            "description": "List a directory.",
            "parameters_json_schema": LIST.schema_dict(),
        }
    ]


def test_history_maps_to_contents_with_signatures_results_and_images() -> None:
    image = sm.ImageContent("iVBORw0KGgo=", "image/png")
    png = base64.b64decode("iVBORw0KGgo=")
    history: list[sm.Message] = [
        sm.UserMessage((sm.TextContent("look"), image)),
        sm.AssistantMessage(
            (
                sm.messages.ThinkingContent("Thinking it over.", "gemini:"),
                sm.messages.ThinkingContent("from another provider", "c2lnbmF0dXJl"),
                sm.messages.ThinkingContent("", "gemini:" + SIG),
                sm.ToolCall("call_given", "read_file", {"path": "a"}),
                sm.ToolCall(GENERATED_ID_PREFIX + "0123", "list_files", {}),
            ),
            stop_reason=sm.messages.StopReason.TOOL_USE,
        ),
        sm.ToolResultMessage("call_given", "read_file", "no such file", is_error=True),
        sm.ToolResultMessage(
            GENERATED_ID_PREFIX + "0123", "list_files", (sm.TextContent("a.png"), image)
        ),
        sm.UserMessage(""),
    ]
    assert project_contents(history) == [
        {
            "role": "user",
            "parts": [{"text": "look"}, {"inline_data": {"mime_type": "image/png", "data": png}}],
        },
        {
            "role": "model",
            "parts": [
                {"text": "Thinking it over.", "thought": True},
                {
                    "function_call": {
                        "name": "read_file",
                        "args": {"path": "a"},
                        "id": "call_given",
                    },
                    "thought_signature": b"\x01\x02signature",
                },
                {"function_call": {"name": "list_files", "args": {}}},
            ],
        },
        {
            "role": "user",
            "parts": [
                {
                    "function_response": {
                        "name": "read_file",
                        "response": {"error": "no such file"},
                        "id": "call_given",
                    }
                },
                {"function_response": {"name": "list_files", "response": {"output": "a.png"}}},
                {"inline_data": {"mime_type": "image/png", "data": png}},
                {"text": ""},
            ],
        },
    ]


# -- reading ------------------------------------------------------------------------------


def test_calls_without_ids_with_empty_ids_and_with_repeated_ids_get_unique_ids(
    server: LoopbackServer,
) -> None:
    server.add(
        stream(
            chunk({"functionCall": {"name": "list_files", "args": {"path": "a"}}}),
            chunk({"functionCall": {"name": "list_files", "args": {"path": "b"}, "id": ""}}),
            chunk({"functionCall": {"name": "read_file", "args": {"path": "c"}, "id": "x"}}),
            chunk(
                {"functionCall": {"name": "read_file", "args": {"path": "d"}, "id": "x"}},
                finish="STOP",
            ),
        )
    )
    reply = complete(make_model(server), tools=(LIST, READ))
    ids = [c.id for c in reply.tool_calls]
    assert ids[2] == "x"
    assert all(i.startswith(GENERATED_ID_PREFIX) for i in (ids[0], ids[1], ids[3]))
    assert len(set(ids)) == 4
    assert [dict(c.arguments)["path"] for c in reply.tool_calls] == ["a", "b", "c", "d"]
    assert reply.stop_reason is sm.messages.StopReason.TOOL_USE
    # Two turns later the same ids must come back only where Gemini gave them.
    results = [sm.ToolResultMessage(c.id, c.name, "ok") for c in reply.tool_calls]
    contents = project_contents([sm.UserMessage("go"), reply, *results])
    sent_ids = [p["function_call"].get("id") for p in contents[1]["parts"]]
    assert sent_ids == [None, None, "x", None]


def test_thought_parts_and_signatures_are_kept_in_order(server: LoopbackServer) -> None:
    server.add(
        stream(
            chunk({"text": "Considering.", "thought": True}),
            chunk({"text": "Here", "thoughtSignature": SIG}),
            chunk({"text": " it is."}, finish="STOP"),
        )
    )
    reply = complete(make_model(server))
    assert reply.content == (
        sm.messages.ThinkingContent("Considering.", "gemini:"),
        sm.messages.ThinkingContent("", "gemini:" + SIG),
        sm.TextContent("Here it is."),
    )


def test_an_unknown_part_is_skipped_with_a_debug_log(server: LoopbackServer) -> None:
    log = Log()
    server.add(
        stream(
            chunk({"brandNewPart": {"x": 1}}),
            chunk({"executableCode": {"code": "print(1)", "language": "PYTHON"}}),
            chunk({"text": "Done."}, finish="STOP"),
        )
    )
    assert complete(make_model(server, logger=log)).text == "Done."
    assert [f["detail"] for _, f in log.entries] == [
        "(a part the SDK did not recognise)",
        "executable_code",
    ]


def test_a_stream_cut_before_its_finish_reason_is_retried(server: LoopbackServer) -> None:
    server.add(stream(chunk({"text": "The work"})), sse("gemini/text_stream.sse"))
    sleeps = Sleeps()
    reply = complete(make_model(server, sleep=sleeps))
    assert reply.text == "The workspace contains README.md and src/index.ts."
    assert sleeps.delays == [0.5]


def test_a_stream_cut_every_time_ends_unavailable(server: LoopbackServer) -> None:
    server.add(*[stream(chunk({"functionCall": {"name": "list_files"}}))] * 3)
    with pytest.raises(ProviderUnavailableError, match="ended before a finish reason"):
        complete(make_model(server))


@pytest.mark.parametrize(
    ("finish", "stop", "words"),
    [
        ("MAX_TOKENS", sm.messages.StopReason.LENGTH, None),
        ("SAFETY", sm.messages.StopReason.ERROR, "safety filters"),
        ("MALFORMED_FUNCTION_CALL", sm.messages.StopReason.ERROR, "malformed function call"),
        ("RECITATION", sm.messages.StopReason.ERROR, "recitation"),
    ],
)
def test_finish_reasons_map_to_stops(
    server: LoopbackServer, finish: str, stop: sm.messages.StopReason, words: str | None
) -> None:
    server.add(stream(chunk({"text": "Part"}, finish=finish)))
    reply = complete(make_model(server))
    assert reply.stop_reason is stop
    if words is None:
        assert reply.error_message is None
    else:
        assert reply.error_message is not None
        assert words in reply.error_message


def test_a_blocked_prompt_is_an_error_stop(server: LoopbackServer) -> None:
    blocked = {"promptFeedback": {"blockReason": "PROHIBITED_CONTENT"}}
    server.add(stream(b"data: " + json.dumps(blocked).encode() + b"\r\n\r\n"))
    reply = complete(make_model(server))
    assert reply.stop_reason is sm.messages.StopReason.ERROR
    assert reply.error_message == "Gemini blocked the prompt (PROHIBITED_CONTENT)"


# -- errors, in the shape Google documents ----------------------------------------------------


def test_resource_exhausted_is_retried_then_reported(server: LoopbackServer) -> None:
    server.add(*[google_error(429, "RESOURCE_EXHAUSTED", "Quota exceeded.")] * 3)
    sleeps = Sleeps()
    with pytest.raises(ProviderUnavailableError) as caught:
        complete(make_model(server, sleep=sleeps))
    assert sleeps.delays == [0.5, 1.0]
    text = str(caught.value)
    assert "Gemini model 'gemini-2.5-flash' at " + server.url in text
    assert "HTTP 429: Quota exceeded" in text
    assert KEY not in text


def test_an_invalid_key_is_an_auth_error_naming_the_variable(server: LoopbackServer) -> None:
    server.add(
        google_error(400, "INVALID_ARGUMENT", "API key not valid. Please pass a valid API key.")
    )
    with pytest.raises(ProviderRequestError):
        complete(make_model(server))
    server.add(google_error(403, "PERMISSION_DENIED", "Permission denied."))
    with pytest.raises(ProviderAuthError, match="GEMINI_API_KEY"):
        complete(make_model(server))


def test_too_many_tokens_is_a_context_overflow(server: LoopbackServer) -> None:
    message = (
        "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576)."
    )
    server.add(google_error(400, "INVALID_ARGUMENT", message))
    with pytest.raises(ContextOverflowError, match="exceeds the maximum number of tokens"):
        complete(make_model(server))


def test_a_server_error_is_retried(server: LoopbackServer) -> None:
    server.add(
        google_error(503, "UNAVAILABLE", "The model is overloaded."), sse("gemini/text_stream.sse")
    )
    sleeps = Sleeps()
    assert complete(make_model(server, sleep=sleeps)).text.startswith("The workspace")
    assert sleeps.delays == [0.5]


def test_stream_false_reads_one_response(server: LoopbackServer) -> None:
    whole = {
        "candidates": [
            {"content": {"parts": [{"text": "Done."}], "role": "model"}, "finishReason": "STOP"}
        ],
        "usageMetadata": {
            "promptTokenCount": 10,
            "cachedContentTokenCount": 4,
            "candidatesTokenCount": 2,
            "thoughtsTokenCount": 5,
            "totalTokenCount": 17,
        },
    }
    server.add(Reply(200, JSON, json.dumps(whole).encode()))
    reply = complete(make_model(server, stream=False))
    assert reply.text == "Done."
    assert reply.usage == sm.messages.Usage(input=6, output=7, cache_read=4, total_tokens=17)
    assert server.requests[0].path == "/v1beta/models/gemini-2.5-flash:generateContent"


def test_the_key_comes_from_either_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    with pytest.raises(sm.InvalidInputError, match="GEMINI_API_KEY"):
        GeminiModel("gemini-2.5-flash")
    monkeypatch.setenv("GOOGLE_API_KEY", "AIza-from-google-variable")
    model = GeminiModel("gemini-2.5-flash")
    assert "AIza-from-google-variable" not in repr(model)
    assert repr(model) == (
        "GeminiModel(model='gemini-2.5-flash', "
        "base_url='https://generativelanguage.googleapis.com')"
    )


def test_call_arguments_that_are_not_an_object_are_a_response_error(
    server: LoopbackServer,
) -> None:
    # Gemini sends arguments as a JSON object, never as text; anything else is refused.
    server.add(
        stream(chunk({"functionCall": {"name": "list_files", "args": [1, 2]}}, finish="STOP"))
    )
    with pytest.raises(ProviderResponseError, match="could not validate"):
        complete(make_model(server))
    assert len(server.requests) == 1


def test_the_retry_delay_google_names_in_the_error_is_honoured(server: LoopbackServer) -> None:
    body = {
        "error": {
            "code": 429,
            "message": "You exceeded your current quota.",
            "status": "RESOURCE_EXHAUSTED",
            "details": [
                {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": []},
                {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "13s"},
            ],
        }
    }
    server.add(Reply(429, JSON, json.dumps(body).encode()), sse("gemini/text_stream.sse"))
    sleeps = Sleeps()
    policy = RetryPolicy(max_attempts=2, jitter=0.0)
    assert complete(make_model(server, sleep=sleeps, retry=policy)).text.startswith("The work")
    assert sleeps.delays == [13.0]


# -- the run's instructions, settings and deltas ------------------------------------------


def test_run_instructions_and_settings_go_in_system_instruction_and_generation_config(
    server: LoopbackServer,
) -> None:
    server.add(sse("gemini/text_stream.sse", piece_size=11))
    model = make_model(server, system="the adapter's prompt", temperature=1.0, max_output_tokens=9)
    settings = sm.ModelSettings(temperature=0.5, max_tokens=77, top_p=0.9, stop=["END"])
    result, events = options_run(model, instructions="Be brief.", model_settings=settings)
    body = server.requests[0].json()
    assert body["systemInstruction"]["parts"] == [{"text": "Be brief."}]
    assert body["generationConfig"] == {
        "temperature": 0.5,
        "maxOutputTokens": 77,
        "topP": 0.9,
        "stopSequences": ["END"],
    }
    assert_text_deltas(result, events)


def test_without_run_instructions_the_adapters_own_system_instruction_is_sent(
    server: LoopbackServer,
) -> None:
    server.add(sse("gemini/text_stream.sse"))
    result, _ = options_run(make_model(server, system="adapter prompt"))
    assert result.ok
    assert server.requests[0].json()["systemInstruction"]["parts"] == [{"text": "adapter prompt"}]


def test_each_whole_call_reaches_the_delta_listener_as_one_fragment(
    server: LoopbackServer,
) -> None:
    server.add(
        stream(
            chunk({"functionCall": {"name": "list_files", "args": {"path": "a"}, "id": "x"}}),
            chunk({"functionCall": {"name": "read_file", "args": {"path": "b"}}}, finish="STOP"),
        )
    )
    fragments: list[tuple[int, str, str, str]] = []
    options = CallOptions(on_tool_call_delta=lambda *f: fragments.append(f))
    model = make_model(server)
    reply = asyncio.run(
        model.complete(
            [sm.UserMessage("read it")], (LIST, READ), sm.AbortController().signal, options=options
        )
    )
    first, second = reply.tool_calls
    assert [f[:3] for f in fragments] == [
        (0, "x", "list_files"),
        (1, second.id, "read_file"),
    ]
    assert [json.loads(f[3]) for f in fragments] == [dict(first.arguments), dict(second.arguments)]

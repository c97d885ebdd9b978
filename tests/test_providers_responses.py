"""OpenAIResponsesModel against the real ``openai`` SDK and a loopback server: the
request it sends, and every documented outcome of bad input (a cut stream, an
unknown event, arguments that are not JSON, a missing or repeated id, reported
errors). The recorded corpus is in ``test_providers_responses_recorded.py``."""

from __future__ import annotations

import asyncio
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
    OpenAIResponsesModel,
    ProviderRequestError,
    ProviderResponseError,
    ProviderUnavailableError,
)
from statemachine.providers.openai_responses import (
    SIGNATURE_PREFIX,
    project_input,
    reasoning_signature,
)

KEY = "sk-rsp-test-0123456789abcdef"
SSE = (("Content-Type", "text/event-stream"),)


def make_model(server: LoopbackServer, **kw: Any) -> OpenAIResponsesModel:
    kw.setdefault("retry", FAST)
    kw.setdefault("sleep", Sleeps())
    return OpenAIResponsesModel("gpt-5-mini", api_key=KEY, base_url=server.url + "/v1", **kw)


def event(kind: str, **fields: Any) -> bytes:
    data = json.dumps({"type": kind, **fields}, separators=(",", ":"))
    return f"event: {kind}\ndata: {data}\n\n".encode()


USAGE = {
    "input_tokens": 100,
    "input_tokens_details": {"cached_tokens": 64},
    "output_tokens": 30,
    "output_tokens_details": {"reasoning_tokens": 20},
    "total_tokens": 130,
}


def completed(output: list[dict[str, Any]], status: str = "completed", **extra: Any) -> bytes:
    response = {"id": "resp_1", "object": "response", "status": status, "output": output}
    return event(f"response.{status}", response={**response, "usage": USAGE, **extra})


def call_events(
    index: int, call_id: str | None, item_id: str, name: str, pieces: list[str]
) -> bytes:
    item: dict[str, Any] = {"type": "function_call", "id": item_id, "name": name}
    item["arguments"] = ""
    if call_id is not None:
        item["call_id"] = call_id
    out = event("response.output_item.added", output_index=index, item=item)
    for piece in pieces:
        out += event("response.function_call_arguments.delta", output_index=index, delta=piece)
    done = {**item, "arguments": "".join(pieces), "status": "completed"}
    return out + event("response.output_item.done", output_index=index, item=done)


def stream(*parts: bytes) -> Reply:
    return Reply(200, SSE, b"".join(parts))


# -- the request --------------------------------------------------------------------------


def test_a_text_stream_gives_text_usage_and_a_stateless_request(server: LoopbackServer) -> None:
    server.add(sse("responses/text_stream.sse", piece_size=9))
    pieces: list[str] = []
    model = make_model(
        server,
        system="Be brief.",
        on_text=pieces.append,
        max_output_tokens=300,
        reasoning={"effort": "low", "summary": "auto"},
        extra_body={"service_tier": "flex"},
    )
    reply = complete(model, tools=(LIST,))
    assert reply == TEXT_REPLY
    assert pieces == TEXT_PIECES
    [request] = server.requests
    assert request.path == "/v1/responses"
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.json() == {
        "model": "gpt-5-mini",
        "input": [{"role": "user", "content": "list the files"}],
        "instructions": "Be brief.",
        "stream": True,
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "tools": [
            {
                "type": "function",
                "name": "list_files",
                "description": "List a directory.",
                "parameters": LIST.schema_dict(),
                "strict": False,
            }
        ],
        "reasoning": {"effort": "low", "summary": "auto"},
        "max_output_tokens": 300,
        "service_tier": "flex",
    }


def test_history_maps_to_input_items_with_images_errors_and_reasoning() -> None:
    reasoning = {
        "id": "rs_1",
        "type": "reasoning",
        "encrypted_content": "ENC",
        "summary": [{"type": "summary_text", "text": "a"}, {"type": "summary_text", "text": "b"}],
    }
    signature = reasoning_signature(reasoning, {"type": "message", "id": "msg_1"})
    assert signature is not None
    assert signature.startswith(SIGNATURE_PREFIX)
    image = sm.ImageContent("iVBORw0KGgo=", "image/png")
    history: list[sm.Message] = [
        sm.UserMessage((sm.TextContent("look"), image)),
        sm.AssistantMessage(
            (sm.messages.ThinkingContent("a\n\nb", signature), sm.TextContent("Looking."))
        ),
        sm.UserMessage(""),
        sm.AssistantMessage(
            (
                sm.messages.ThinkingContent("from another provider", "c2lnbmF0dXJl"),
                sm.ToolCall("call_1|fc_1", "read_file", {"path": "a"}),
                sm.ToolCall("toolu_01", "list_files", {}),
            ),
            stop_reason=sm.messages.StopReason.TOOL_USE,
        ),
        sm.ToolResultMessage("call_1|fc_1", "read_file", "no such file", is_error=True),
        sm.ToolResultMessage("toolu_01", "list_files", (sm.TextContent("a.png"), image)),
    ]
    assert project_input(history) == [
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "look"},
                {
                    "type": "input_image",
                    "image_url": "data:image/png;base64,iVBORw0KGgo=",
                    "detail": "auto",
                },
            ],
        },
        {
            "type": "reasoning",
            "summary": [
                {"type": "summary_text", "text": "a"},
                {"type": "summary_text", "text": "b"},
            ],
            "encrypted_content": "ENC",
            "id": "rs_1",
        },
        {
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Looking.", "annotations": []}],
            "id": "msg_1",
        },
        {"role": "user", "content": "(empty message)"},
        # The other provider's thinking cannot be carried: left out.
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "read_file",
            "arguments": '{"path":"a"}',
            "id": "fc_1",
        },
        {"type": "function_call", "call_id": "toolu_01", "name": "list_files", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "Error: no such file"},
        {
            "type": "function_call_output",
            "call_id": "toolu_01",
            "output": [
                {"type": "input_text", "text": "a.png"},
                {
                    "type": "input_image",
                    "image_url": "data:image/png;base64,iVBORw0KGgo=",
                    "detail": "auto",
                },
            ],
        },
    ]


def test_reasoning_whose_following_item_cannot_be_sent_is_left_out() -> None:
    # Without the message id, OpenAI would refuse the reasoning item; so it stays out.
    signature = reasoning_signature({"id": "rs_1", "encrypted_content": "ENC", "summary": []})
    history: list[sm.Message] = [
        sm.UserMessage("hi"),
        sm.AssistantMessage((sm.messages.ThinkingContent("", signature), sm.TextContent("Hello."))),
    ]
    assert project_input(history)[1:] == [{"role": "assistant", "content": "Hello."}]
    assert reasoning_signature({"id": "rs_2", "summary": []}) is None  # no encrypted content


# -- reading ------------------------------------------------------------------------------


def test_parallel_calls_with_reasoning_stream_into_calls_and_thinking(
    server: LoopbackServer,
) -> None:
    reasoning = {"id": "rs_1", "type": "reasoning", "summary": [], "encrypted_content": "ENC"}
    server.add(
        stream(
            event("response.output_item.added", output_index=0, item={**reasoning, "summary": []}),
            event("response.reasoning_summary_part.added", output_index=0, summary_index=0),
            event("response.reasoning_summary_text.delta", output_index=0, delta="Two "),
            event("response.reasoning_summary_text.delta", output_index=0, delta="files."),
            event("response.reasoning_summary_part.added", output_index=0, summary_index=1),
            event("response.reasoning_summary_text.delta", output_index=0, delta="Then list."),
            event("response.output_item.done", output_index=0, item=reasoning),
            call_events(1, "call_a", "fc_a", "read_file", ['{"pa', 'th": "é\\"', '\\n"}']),
            call_events(2, "call_b", "fc_b", "list_files", ['{"path": "src"}']),
            completed([]),
        ),
    )
    reply = complete(make_model(server), tools=(LIST, READ))
    thinking, first, second = reply.content
    assert isinstance(thinking, sm.messages.ThinkingContent)
    assert thinking.thinking == "Two files.\n\nThen list."
    assert first == sm.ToolCall("call_a|fc_a", "read_file", {"path": 'é"\n'})
    assert second == sm.ToolCall("call_b|fc_b", "list_files", {"path": "src"})
    assert reply.stop_reason is sm.messages.StopReason.TOOL_USE
    assert reply.usage == sm.messages.Usage(input=36, output=30, cache_read=64, total_tokens=130)


def test_a_stream_cut_in_the_middle_of_a_call_is_retried(server: LoopbackServer) -> None:
    cut = call_events(0, "call_a", "fc_a", "read_file", ['{"path": "RE'])[:-60]
    server.add(stream(cut), sse("responses/text_stream.sse"))
    sleeps = Sleeps()
    reply = complete(make_model(server, sleep=sleeps))
    assert reply.text == "The workspace contains README.md and src/index.ts."
    assert sleeps.delays == [0.5]


def test_a_stream_cut_every_time_ends_unavailable_naming_the_url(server: LoopbackServer) -> None:
    text = sse("responses/text_stream.sse").body
    cut = text[: text.index(b"event: response.completed")]
    server.add(*[stream(cut)] * 3)
    with pytest.raises(ProviderUnavailableError) as caught:
        complete(make_model(server))
    assert "before response.completed" in str(caught.value)
    assert server.url + "/v1" in str(caught.value)
    assert "Gave up after 3 attempt(s)" in str(caught.value)


def test_an_unknown_event_type_is_skipped_with_a_debug_log(server: LoopbackServer) -> None:
    log = Log()
    server.add(
        stream(
            event("response.shiny_new_thing.delta", output_index=0, delta="?"),
            event("response.output_text.delta", output_index=0, delta="Hi."),
            completed([]),
        )
    )
    reply = complete(make_model(server, logger=log))
    assert reply.text == "Hi."
    assert log.entries == [
        (
            "provider_event_skipped",
            {
                "provider": "OpenAI Responses",
                "kind": "event:response.shiny_new_thing.delta",
                "detail": "",
            },
        )
    ]


def test_an_unknown_item_that_carries_a_call_is_an_error_not_a_silent_loss(
    server: LoopbackServer,
) -> None:
    custom = {"type": "custom_tool_call", "id": "ctc_1", "call_id": "call_x", "input": "SELECT 1"}
    server.add(
        stream(event("response.output_item.added", output_index=0, item=custom), completed([]))
    )
    with pytest.raises(ProviderResponseError) as caught:
        complete(make_model(server))
    assert "'custom_tool_call' item with a call_id" in str(caught.value)
    assert len(server.requests) == 1  # not retried


def test_an_unknown_item_without_a_call_is_skipped(server: LoopbackServer) -> None:
    log = Log()
    search = {"type": "web_search_call", "id": "ws_1", "status": "completed"}
    server.add(
        stream(
            event("response.output_item.added", output_index=0, item=search),
            event("response.output_text.delta", output_index=1, delta="Found it."),
            completed([]),
        )
    )
    assert complete(make_model(server, logger=log)).text == "Found it."
    assert [e[1]["kind"] for e in log.entries] == ["item:web_search_call"]


def test_arguments_that_are_not_json_become_a_call_with_a_parse_error(
    server: LoopbackServer,
) -> None:
    server.add(
        stream(call_events(0, "call_a", "fc_a", "read_file", ['{"path": "a']), completed([]))
    )
    reply = complete(make_model(server))
    [call] = reply.tool_calls
    assert call.arguments == {}
    assert call.parse_error is not None
    assert "not valid JSON" in call.parse_error
    assert '{"path": "a' in call.parse_error
    assert reply.stop_reason is sm.messages.StopReason.TOOL_USE


def test_a_call_without_a_call_id_is_a_response_error(server: LoopbackServer) -> None:
    server.add(stream(call_events(0, None, "fc_a", "read_file", ["{}"]), completed([])))
    with pytest.raises(ProviderResponseError, match="call_id is not text"):
        complete(make_model(server))


def test_calls_with_the_same_call_id_stay_apart_by_their_item_ids(
    server: LoopbackServer,
) -> None:
    server.add(
        stream(
            call_events(0, "call_a", "fc_1", "read_file", ['{"path": "a"}']),
            call_events(1, "call_a", "fc_2", "read_file", ['{"path": "b"}']),
            completed([]),
        )
    )
    reply = complete(make_model(server))
    assert [c.id for c in reply.tool_calls] == ["call_a|fc_1", "call_a|fc_2"]


def test_calls_that_cannot_be_told_apart_are_a_response_error(server: LoopbackServer) -> None:
    server.add(
        stream(
            call_events(0, "call_a", "fc_1", "read_file", ["{}"]),
            call_events(1, "call_a", "fc_1", "read_file", ["{}"]),
            completed([]),
        )
    )
    with pytest.raises(ProviderResponseError, match="two calls have the same call_id and item id"):
        complete(make_model(server))


@pytest.mark.parametrize(
    ("reason", "stop"),
    [
        ("max_output_tokens", sm.messages.StopReason.LENGTH),
        ("content_filter", sm.messages.StopReason.ERROR),
    ],
)
def test_an_incomplete_response_stops_for_its_reason(
    server: LoopbackServer, reason: str, stop: sm.messages.StopReason
) -> None:
    server.add(
        stream(
            event("response.output_text.delta", output_index=0, delta="Partial"),
            completed([], status="incomplete", incomplete_details={"reason": reason}),
        )
    )
    reply = complete(make_model(server))
    assert reply.stop_reason is stop
    assert reply.text == "Partial"


def test_a_failed_response_with_a_server_error_is_retried(server: LoopbackServer) -> None:
    failed = event(
        "response.failed",
        response={"status": "failed", "error": {"code": "server_error", "message": "boom"}},
    )
    server.add(stream(failed), sse("responses/text_stream.sse"))
    sleeps = Sleeps()
    reply = complete(make_model(server, sleep=sleeps))
    assert reply.text.startswith("The workspace")
    assert sleeps.delays == [0.5]


def test_a_failed_response_for_an_invalid_prompt_is_a_request_error(
    server: LoopbackServer,
) -> None:
    failed = event(
        "response.failed",
        response={"status": "failed", "error": {"code": "invalid_prompt", "message": "no."}},
    )
    server.add(stream(failed))
    with pytest.raises(ProviderRequestError, match="reported an error: no"):
        complete(make_model(server))
    assert len(server.requests) == 1


def test_an_error_event_for_the_context_window_is_a_context_overflow(
    server: LoopbackServer,
) -> None:
    error = event(
        "error",
        code="context_length_exceeded",
        message="Your input exceeds the context window of this model.",
        param="input",
    )
    server.add(stream(event("response.created", response={}), error))
    with pytest.raises(ContextOverflowError, match="context window"):
        complete(make_model(server))


def test_a_rate_limit_error_event_is_retried(server: LoopbackServer) -> None:
    error = event("error", code="rate_limit_exceeded", message="slow down", param=None)
    server.add(stream(error), sse("responses/text_stream.sse"))
    sleeps = Sleeps()
    assert complete(make_model(server, sleep=sleeps)).text.startswith("The workspace")
    assert sleeps.delays == [0.5]


def test_stream_false_reads_the_whole_response(server: LoopbackServer) -> None:
    whole = {
        "id": "resp_1",
        "object": "response",
        "status": "completed",
        "output": [
            {
                "type": "message",
                "id": "msg_1",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Done.", "annotations": []}],
            },
        ],
        "usage": USAGE,
    }
    server.add(Reply(200, (("Content-Type", "application/json"),), json.dumps(whole).encode()))
    reply = complete(make_model(server, stream=False))
    assert reply.text == "Done."
    assert server.requests[0].json()["stream"] is False


def test_the_key_is_required_unless_a_server_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(sm.InvalidInputError, match="OPENAI_API_KEY"):
        OpenAIResponsesModel("gpt-5")
    assert OpenAIResponsesModel("m", base_url="http://127.0.0.1:1/v1").model == "m"
    with pytest.raises(sm.InvalidInputError, match="max_output_tokens"):
        OpenAIResponsesModel("m", api_key=KEY, max_output_tokens=0)


def test_raw_reasoning_of_an_open_model_is_kept_as_thinking_but_not_sent_back(
    server: LoopbackServer,
) -> None:
    # vLLM and other servers of open models send the raw reasoning, with no summary
    # and no encrypted content.
    item = {"type": "reasoning", "id": "rs_1", "summary": []}
    done = {**item, "content": [{"type": "reasoning_text", "text": "Think. Then act."}]}
    server.add(
        stream(
            event("response.output_item.added", output_index=0, item=item),
            event("response.reasoning_text.delta", output_index=0, delta="Think. "),
            event("response.reasoning_text.delta", output_index=0, delta="Then act."),
            event("response.output_item.done", output_index=0, item=done),
            event("response.output_text.delta", output_index=1, delta="Acting."),
            completed([]),
        )
    )
    reply = complete(make_model(server))
    assert reply.content == (
        sm.messages.ThinkingContent("Think. Then act."),
        sm.TextContent("Acting."),
    )
    assert project_input([sm.UserMessage("go"), reply]) == [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "Acting."},
    ]


# -- the run's instructions, settings and deltas ------------------------------------------


def test_run_instructions_replace_system_and_settings_become_request_fields(
    server: LoopbackServer,
) -> None:
    server.add(sse("responses/text_stream.sse", piece_size=9))
    model = make_model(server, system="the adapter's prompt", temperature=1.0)
    settings = sm.ModelSettings(temperature=0.5, max_tokens=77, top_p=0.9)
    result, events = options_run(model, instructions="Be brief.", model_settings=settings)
    body = server.requests[0].json()
    assert body["instructions"] == "Be brief."
    assert (body["temperature"], body["max_output_tokens"], body["top_p"]) == (0.5, 77, 0.9)
    assert "max_tokens" not in body
    assert_text_deltas(result, events)


def test_without_run_instructions_the_adapters_own_system_is_the_instructions(
    server: LoopbackServer,
) -> None:
    server.add(sse("responses/text_stream.sse"))
    result, _ = options_run(make_model(server, system="adapter prompt"))
    assert result.ok
    assert server.requests[0].json()["instructions"] == "adapter prompt"


def test_stop_sequences_are_refused_before_any_call(server: LoopbackServer) -> None:
    with pytest.raises(sm.errors.UsageError, match="cannot send stop"):
        options_run(make_model(server), model_settings=sm.ModelSettings(stop=["END"]))
    assert server.requests == []


def test_call_arguments_stream_as_deltas_that_add_up_to_the_call(server: LoopbackServer) -> None:
    server.add(
        stream(
            call_events(0, "call_a", "fc_a", "read_file", ['{"pa', 'th": "é\\"', '\\n"}']),
            call_events(1, "call_b", "fc_b", "list_files", ['{"path": "src"}']),
            completed([]),
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
        (0, "call_a|fc_a", "read_file"),
        (0, "call_a|fc_a", "read_file"),
        (0, "call_a|fc_a", "read_file"),
        (1, "call_b|fc_b", "list_files"),
    ]
    assert json.loads("".join(f[3] for f in fragments[:3])) == dict(first.arguments)
    assert json.loads(fragments[3][3]) == dict(second.arguments)

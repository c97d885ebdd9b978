"""AnthropicModel against the real ``anthropic`` SDK and a loopback server.

Every test checks what the adapter returns and, where a request went out, the body
the server received. Retries run with an injected ``sleep`` that records delays and
returns at once: nothing here waits on a clock.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from providers_server import (
    FAST,
    LIST,
    READ,
    Log,
    LoopbackServer,
    Reply,
    Sleeps,
    abort_in_backoff,
    complete,
    error,
    run_on_workspace,
    sse,
)

import statemachine as sm
import statemachine.messages
from statemachine.core.invariants import history_violations
from statemachine.providers import (
    AnthropicModel,
    ContextOverflowError,
    ProviderAuthError,
    ProviderResponseError,
    ProviderUnavailableError,
    RetryPolicy,
)
from statemachine.providers.anthropic_messages import project_messages
from statemachine.testing import check_transcript
from statemachine.workspace import workspace_tools

KEY = "sk-ant-test-0123456789-secret"


def make_model(server: LoopbackServer, sleeps: Sleeps | None = None, **kw: Any) -> AnthropicModel:
    kw.setdefault("retry", FAST)
    return AnthropicModel(
        "claude-sonnet-4-5",
        api_key=KEY,
        base_url=server.url,
        sleep=sleeps or Sleeps(),
        **kw,
    )


# -- streaming --------------------------------------------------------------------------


def test_text_stream_returns_text_usage_and_sends_the_projected_request(
    server: LoopbackServer,
) -> None:
    server.add(sse("anthropic/text_stream.sse"))
    pieces: list[str] = []
    model = make_model(server, on_text=pieces.append, system="Be brief.", max_tokens=300)
    reply = complete(model, tools=(LIST,))
    assert reply == sm.AssistantMessage(
        "The workspace contains README.md and src/index.ts.",
        stop_reason=sm.messages.StopReason.STOP,
        usage=sm.messages.Usage(input=412, output=19, total_tokens=431),
    )
    assert pieces == ["The work", "space contains ", "README.md and ", "src/index.ts."]
    [request] = server.requests
    assert request.path == "/v1/messages"
    assert KEY in (request.headers.get("x-api-key", "") + request.headers.get("authorization", ""))
    assert request.json() == {
        "model": "claude-sonnet-4-5",
        "max_tokens": 300,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "list the files"}]}],
        "tools": [
            {
                "name": "list_files",
                "description": "List a directory.",
                "input_schema": LIST.schema_dict(),
            }
        ],
        "stream": True,
    }


def test_thinking_text_and_parallel_tool_uses_are_reassembled(server: LoopbackServer) -> None:
    # piece_size=5 also cuts the SSE lines themselves on the wire.
    server.add(sse("anthropic/thinking_tool_use.sse", piece_size=5))
    model = make_model(server, thinking={"type": "enabled", "budget_tokens": 1024})
    reply = complete(model, tools=(LIST, READ))
    assert reply.content == (
        sm.messages.ThinkingContent(
            "I should list the files and read the README.",
            "EqQBCkgIARABGAIiQL2msig-part-2==",
        ),
        sm.TextContent("Let me look."),
        sm.ToolCall("toolu_01A09q90qw90lq917835lq9", "list_files", {"path": "src"}),
        sm.ToolCall("toolu_01B7mNq2Zr", "read_file", {"path": "README.md", "note": 'é"\n'}),
    )
    assert reply.stop_reason is sm.messages.StopReason.TOOL_USE
    assert reply.usage == sm.messages.Usage(
        input=58, output=87, cache_read=1536, cache_write=236, total_tokens=58 + 87 + 1536 + 236
    )
    assert server.requests[0].json()["thinking"] == {"type": "enabled", "budget_tokens": 1024}


def test_malformed_tool_input_becomes_a_parse_error_that_names_the_problem(
    server: LoopbackServer,
) -> None:
    server.add(sse("anthropic/malformed_arguments.sse"))
    reply = complete(make_model(server), tools=(READ,))
    [call] = reply.tool_calls
    assert dict(call.arguments) == {}
    assert call.parse_error is not None
    assert call.parse_error.startswith("the arguments are not valid JSON (Expecting value")
    assert call.parse_error.endswith(': {"path": "README.md", "limit": }')


def test_redacted_thinking_is_kept_and_goes_back_as_it_came(server: LoopbackServer) -> None:
    # The API wants the encrypted block back, unchanged, with the turn it belongs to.
    server.add(sse("anthropic/redacted_thinking.sse"), sse("anthropic/text_stream.sse"))
    model = make_model(server, thinking={"type": "enabled", "budget_tokens": 1024})
    reply = complete(model)
    assert reply.content == (
        sm.messages.ThinkingContent("", "EmwKAhgBEgy3va3pzix/LafPsn4a", redacted=True),
        sm.TextContent("Done."),
    )
    assert sm.messages.message_from_dict(sm.messages.message_to_dict(reply)) == reply
    complete(model, [sm.UserMessage("list the files"), reply, sm.UserMessage("and now?")])
    assert server.bodies()[1]["messages"][1] == {
        "role": "assistant",
        "content": [
            {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4a"},
            {"type": "text", "text": "Done."},
        ],
    }


@pytest.mark.parametrize(
    ("fixture", "stop", "text", "error_message"),
    [
        ("anthropic/max_tokens.sse", sm.messages.StopReason.LENGTH, "Writing", None),
        (
            "anthropic/refusal.sse",
            sm.messages.StopReason.ERROR,
            "I can",
            "Anthropic refused to continue the response (stop reason 'refusal')",
        ),
        ("anthropic/redacted_thinking.sse", sm.messages.StopReason.STOP, "Done.", None),
    ],
)
def test_stop_reasons_map_to_ours(
    server: LoopbackServer,
    fixture: str,
    stop: sm.messages.StopReason,
    text: str,
    error_message: str | None,
) -> None:
    server.add(sse(fixture))
    reply = complete(make_model(server))
    assert reply.stop_reason is stop
    assert reply.text == text
    assert reply.error_message == error_message
    assert reply.tool_calls == ()


def test_an_overloaded_error_inside_the_stream_is_retried(server: LoopbackServer) -> None:
    server.add(sse("anthropic/overloaded_midstream.sse"), sse("anthropic/text_stream.sse"))
    sleeps = Sleeps()
    reply = complete(make_model(server, sleeps))
    assert reply.text == "The workspace contains README.md and src/index.ts."
    assert sleeps.delays == [0.5]
    assert len(server.requests) == 2


# -- abort --------------------------------------------------------------------------------


def test_abort_mid_stream_returns_the_text_so_far_and_drops_the_partial_call(
    server: LoopbackServer,
) -> None:
    server.add(sse("anthropic/partial_then_hold.sse", hold=True))
    controller = sm.AbortController()

    async def main() -> sm.AssistantMessage:
        arrived = asyncio.Event()

        def on_text(text: str) -> None:
            if text == "files now":
                arrived.set()

        model = make_model(server, on_text=on_text)
        task = asyncio.ensure_future(
            model.complete([sm.UserMessage("go")], (READ,), controller.signal)
        )
        await arrived.wait()
        controller.abort("user pressed stop")
        return await task

    reply = asyncio.run(main())
    assert reply.stop_reason is sm.messages.StopReason.ABORTED
    assert reply.content == (sm.TextContent("Reading the files now"),)
    assert reply.usage == sm.messages.Usage(input=100, output=1, total_tokens=101)


def test_abort_during_backoff_returns_promptly(server: LoopbackServer) -> None:
    server.add(error(529, "anthropic/error_529.json", {"retry-after": "20"}))
    reply, sleeps = abort_in_backoff(
        lambda sleeps: make_model(server, sleeps, retry=RetryPolicy(max_total_delay=60))
    )
    assert reply.stop_reason is sm.messages.StopReason.ABORTED
    assert reply.content == ()
    assert sleeps.delays == [20.0]
    assert len(server.requests) == 1


# -- errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("status", "fixture"), [(401, "error_401"), (403, "error_403")])
def test_auth_and_permission_errors_end_at_once(
    server: LoopbackServer, status: int, fixture: str
) -> None:
    server.add(error(status, f"anthropic/{fixture}.json"), sse("anthropic/text_stream.sse"))
    sleeps = Sleeps()
    with pytest.raises(ProviderAuthError) as caught:
        complete(make_model(server, sleeps))
    text = str(caught.value)
    assert f"HTTP {status}" in text
    assert "ANTHROPIC_API_KEY" in text
    assert sleeps.delays == []
    assert len(server.requests) == 1


def test_an_error_body_that_echoes_the_key_is_redacted(server: LoopbackServer) -> None:
    body = {"type": "error", "error": {"type": "authentication_error", "message": f"bad {KEY}"}}
    server.add(Reply(401, (("Content-Type", "application/json"),), json.dumps(body).encode()))
    with pytest.raises(ProviderAuthError) as caught:
        complete(make_model(server))
    assert KEY not in str(caught.value)
    assert "bad [REDACTED]" in str(caught.value)


def test_429_529_and_500_are_retried_honouring_retry_after(server: LoopbackServer) -> None:
    server.add(
        error(429, "anthropic/error_429.json", {"retry-after": "3"}),
        error(529, "anthropic/error_529.json", {"retry-after-ms": "250"}),
        error(500, "anthropic/error_500.json"),
        sse("anthropic/text_stream.sse"),
    )
    sleeps = Sleeps()
    model = make_model(server, sleeps, retry=RetryPolicy(max_attempts=4, initial_delay=0.5))
    reply = complete(model)
    assert reply.text == "The workspace contains README.md and src/index.ts."
    # The third wait has no header: backoff 0.5 * 2**2, jitter within 10 %.
    assert sleeps.delays[:2] == [3.0, 0.25]
    assert 2.0 <= sleeps.delays[2] <= 2.2
    assert len(server.requests) == 4


def test_overload_that_outlasts_the_budget_gives_up_with_an_explanation(
    server: LoopbackServer,
) -> None:
    server.add(*[error(529, "anthropic/error_529.json")] * 3)
    sleeps = Sleeps()
    with pytest.raises(ProviderUnavailableError) as caught:
        complete(make_model(server, sleeps))
    assert sleeps.delays == [0.5, 1.0]
    assert "HTTP 529: Overloaded. Gave up after 3 attempt(s)" in str(caught.value)


def test_prompt_too_long_is_a_context_overflow(server: LoopbackServer) -> None:
    server.add(error(400, "anthropic/error_context_length.json"))
    with pytest.raises(ContextOverflowError, match="prompt is too long: 208154 tokens"):
        complete(make_model(server))
    assert len(server.requests) == 1


def test_a_missing_key_is_refused_up_front(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(sm.InvalidInputError, match="ANTHROPIC_API_KEY"):
        AnthropicModel("claude-sonnet-4-5")


# -- a whole run ----------------------------------------------------------------------------


def test_run_agent_end_to_end_with_workspace_tools(server: LoopbackServer, tmp_path: Path) -> None:
    server.add(
        sse("anthropic/thinking_tool_use.sse", piece_size=13),
        sse("anthropic/single_tool_call.sse"),
        sse("anthropic/text_stream.sse"),
    )
    result = run_on_workspace(make_model(server), tmp_path, server, "anthropic")
    listing, bad_read, good_read = (
        m for m in result.messages if isinstance(m, sm.ToolResultMessage)
    )
    assert "index.ts" in listing.text
    assert not listing.is_error
    assert bad_read.is_error
    assert "'note' was unexpected" in bad_read.text
    assert "# Demo" in good_read.text
    assert not good_read.is_error
    third = server.bodies()[2]["messages"]
    assert [m["role"] for m in third] == ["user", "assistant", "user", "assistant", "user"]
    # Thinking goes back with its signature, and both results share one user message.
    assert third[1]["content"][0] == {
        "type": "thinking",
        "thinking": "I should list the files and read the README.",
        "signature": "EqQBCkgIARABGAIiQL2msig-part-2==",
    }
    assert [b["tool_use_id"] for b in third[2]["content"]] == [
        "toolu_01A09q90qw90lq917835lq9",
        "toolu_01B7mNq2Zr",
    ]
    assert [b.get("is_error", False) for b in third[2]["content"]] == [False, True]
    assert third[4]["content"] == [
        {
            "type": "tool_result",
            "tool_use_id": "toolu_01Zq3",
            "content": [{"type": "text", "text": good_read.text}],
        }
    ]


def test_strict_validation_refuses_an_event_of_the_wrong_shape(server: LoopbackServer) -> None:
    server.add(sse("anthropic/invalid_event.sse"), sse("anthropic/text_stream.sse"))
    with pytest.raises(ProviderResponseError, match="could not validate"):
        complete(make_model(server))
    assert len(server.requests) == 1  # a malformed response is not retried


def test_abort_mid_stream_inside_run_agent_ends_aborted_with_a_valid_history(
    server: LoopbackServer, tmp_path: Path
) -> None:
    server.add(
        sse("anthropic/single_tool_call.sse"), sse("anthropic/partial_then_hold.sse", hold=True)
    )
    (tmp_path / "README.md").write_text("# Demo\n")
    controller = sm.AbortController()

    def on_text(text: str) -> None:
        if text == "files now":
            controller.abort("user pressed stop")

    result = sm.run_agent_sync(
        model=make_model(server, on_text=on_text),
        tools=workspace_tools(tmp_path),
        messages=[sm.UserMessage("read the readme")],
        signal=controller.signal,
    )
    assert result.state is sm.TurnState.ABORTED
    assert result.turns == 2
    last = result.messages[-1]
    assert isinstance(last, sm.AssistantMessage)
    assert last.stop_reason is sm.messages.StopReason.ABORTED
    assert last.content == (sm.TextContent("Reading the files now"),)
    assert history_violations(result.messages) == []
    assert check_transcript(result.messages) == []
    # Resuming on that history sends the partial text, and nothing of the cut call.
    resumed = project_messages([*result.messages, sm.UserMessage("go on")])
    assert resumed[-2:] == [
        {"role": "assistant", "content": [{"type": "text", "text": "Reading the files now"}]},
        {"role": "user", "content": [{"type": "text", "text": "go on"}]},
    ]


def test_prompt_cache_marks_the_system_prompt_and_the_last_message(
    server: LoopbackServer,
) -> None:
    server.add(sse("anthropic/text_stream.sse"), sse("anthropic/text_stream.sse"))
    history: list[sm.Message] = [
        sm.UserMessage("read it"),
        sm.AssistantMessage(
            (
                sm.messages.ThinkingContent("t", "sig"),
                sm.ToolCall("toolu_1", "read_file", {"path": "a"}),
            )
        ),
        sm.ToolResultMessage("toolu_1", "read_file", "contents"),
    ]
    complete(make_model(server, system="Be brief.", prompt_cache=True), history, (READ,))
    complete(make_model(server, prompt_cache=True), history[:1], (READ,))
    with_system, without_system = server.bodies()
    ephemeral = {"type": "ephemeral"}
    assert with_system["system"] == [
        {"type": "text", "text": "Be brief.", "cache_control": ephemeral}
    ]
    assert "cache_control" not in with_system["tools"][-1]
    assert with_system["messages"][-1]["content"] == [
        {
            "type": "tool_result",
            "tool_use_id": "toolu_1",
            "content": [{"type": "text", "text": "contents"}],
            "cache_control": ephemeral,
        }
    ]
    assert "cache_control" not in with_system["messages"][1]["content"][0]  # thinking
    assert without_system["tools"][-1]["cache_control"] == ephemeral
    assert without_system["messages"][-1]["content"][-1]["cache_control"] == ephemeral


# -- event and block types newer than the SDK ------------------------------------------------


def _event(kind: str, **fields: Any) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n"


def test_an_unknown_event_and_an_unknown_block_are_skipped_with_a_debug_log(
    server: LoopbackServer,
) -> None:
    text = sse("anthropic/text_stream.sse").body.decode()
    start = text.index("event: content_block_stop")
    novel = (
        _event("message_annotation", note="new")
        + _event("content_block_start", index=5, content_block={"type": "hologram", "x": 1})
        + _event(
            "content_block_delta",
            index=5,
            delta={"type": "input_json_delta", "partial_json": '{"a": 1}'},
        )
        + _event("content_block_stop", index=5)
    )
    server.add(
        Reply(
            200,
            (("Content-Type", "text/event-stream"),),
            (text[:start] + novel + text[start:]).encode(),
        )
    )
    log = Log()
    reply = complete(make_model(server, logger=log))
    assert reply.text == "The workspace contains README.md and src/index.ts."
    assert reply.tool_calls == ()  # the unknown block's deltas went nowhere
    assert [(f["kind"], f["detail"]) for _, f in log.entries] == [
        ("event:message_annotation", ""),
        ("event:content_block_start", "hologram"),
    ]


def whole_message(*content: dict[str, Any]) -> Reply:
    """A whole (not streamed) Messages response asking for tools, with ``content``."""
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": list(content),
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 4},
    }
    return Reply(200, (("Content-Type", "application/json"),), json.dumps(message).encode())


def test_stream_false_reads_a_whole_message_skipping_unknown_blocks(
    server: LoopbackServer,
) -> None:
    server.add(
        whole_message(
            {"type": "hologram", "x": 1},
            {"type": "text", "text": "Reading."},
            {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "a"}},
        )
    )
    reply = complete(make_model(server, stream=False, temperature=0.2))
    assert reply.content == (
        sm.TextContent("Reading."),
        sm.ToolCall("toolu_1", "read_file", {"path": "a"}),
    )
    assert reply.stop_reason is sm.messages.StopReason.TOOL_USE
    sent = server.requests[0].json()
    assert sent["stream"] is False
    assert sent["temperature"] == 0.2


def test_two_tool_uses_with_one_id_are_a_response_error(server: LoopbackServer) -> None:
    server.add(
        whole_message(
            {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "a"}},
            {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "b"}},
        )
    )
    with pytest.raises(ProviderResponseError, match="two calls have the same tool_use id"):
        complete(make_model(server, stream=False))
    assert len(server.requests) == 1

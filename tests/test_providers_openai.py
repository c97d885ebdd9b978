"""OpenAIChatModel against the real ``openai`` SDK and a loopback server.

Every test checks what the adapter returns and, where a request went out, the body
the server received. Retries run with an injected ``sleep`` that records delays and
returns at once: nothing here waits on a clock.
"""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any

import pytest
from providers_server import (
    FAST,
    LIST,
    READ,
    TEXT_PIECES,
    TEXT_REPLY,
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
    ContextOverflowError,
    OpenAIChatModel,
    ProviderAuthError,
    ProviderRequestError,
    ProviderResponseError,
    ProviderUnavailableError,
    RetryPolicy,
)
from statemachine.providers._projection import MessageBuilder
from statemachine.testing import check_transcript

KEY = "sk-test-0123456789abcdef-secret"


def make_model(server: LoopbackServer, sleeps: Sleeps | None = None, **kw: Any) -> OpenAIChatModel:
    kw.setdefault("retry", FAST)
    return OpenAIChatModel(
        "gpt-4o-mini",
        api_key=KEY,
        base_url=server.url + "/v1",
        sleep=sleeps or Sleeps(),
        **kw,
    )


# -- streaming --------------------------------------------------------------------------


def test_text_stream_returns_text_usage_and_sends_the_projected_request(
    server: LoopbackServer,
) -> None:
    server.add(sse("openai/text_stream.sse"))
    pieces: list[str] = []
    model = make_model(server, on_text=pieces.append, system="Be brief.", max_tokens=300)
    reply = complete(model)
    assert reply == TEXT_REPLY
    assert pieces == TEXT_PIECES
    [request] = server.requests
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.json() == {
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "list the files"},
        ],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 300,
    }


def test_parallel_tool_calls_split_across_awkward_fragments_are_reassembled(
    server: LoopbackServer,
) -> None:
    # piece_size=7 also cuts the SSE lines themselves mid-JSON on the wire.
    server.add(sse("openai/parallel_tool_calls.sse", piece_size=7))
    reply = complete(make_model(server), tools=(LIST, READ))
    assert reply.content == (
        sm.TextContent("Let me look."),
        sm.ToolCall("call_q1Xw7fKc0", "list_files", {"path": "src"}),
        sm.ToolCall("call_Rr9pLm2", "read_file", {"path": "README.md", "note": 'é"\n'}),
    )
    assert reply.stop_reason is sm.messages.StopReason.TOOL_USE
    # prompt_tokens (1830) includes the 1536 cached ones; ours keeps them apart.
    assert reply.usage == sm.messages.Usage(
        input=294, output=61, cache_read=1536, total_tokens=1891
    )
    assert server.requests[0].json()["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "list_files",
                "description": "List a directory.",
                "parameters": LIST.schema_dict(),
            },
        },
        {
            "type": "function",
            "function": {
                "name": "read_file",
                "description": "Read a file.",
                "parameters": READ.schema_dict(),
            },
        },
    ]


def test_malformed_tool_arguments_become_a_parse_error_that_names_the_problem(
    server: LoopbackServer,
) -> None:
    server.add(sse("openai/malformed_arguments.sse"))
    reply = complete(make_model(server), tools=(READ,))
    [call] = reply.tool_calls
    assert call.id == "call_bad1"
    assert call.name == "read_file"
    assert dict(call.arguments) == {}
    assert call.parse_error == (
        "the arguments are not valid JSON (Expecting value at line 1 column 32): "
        '{"path": "README.md", "limit": }'
    )
    # finish_reason "stop" with a call present stays "stop": the call is still answered.
    assert reply.stop_reason is sm.messages.StopReason.STOP


def test_malformed_arguments_in_a_run_become_an_error_result_and_the_tool_never_runs(
    server: LoopbackServer,
) -> None:
    server.add(sse("openai/malformed_arguments.sse"), sse("openai/text_stream.sse"))
    ran: list[str] = []

    @sm.tool
    def read_file(path: str) -> str:
        """Read a file."""
        ran.append(path)
        return "contents"

    result = sm.run_agent_sync(
        model=make_model(server), tools=[read_file], messages=[sm.UserMessage("read it")]
    )
    assert result.state is sm.TurnState.DONE
    assert ran == []
    [answer] = [m for m in result.messages if isinstance(m, sm.ToolResultMessage)]
    assert answer.is_error
    assert answer.text.startswith(
        "Invalid arguments for tool read_file: the arguments are not valid JSON (Expecting "
        'value at line 1 column 32): {"path": "README.md", "limit": }. The tool was not run.'
    )
    assert '"required": ["path"]' in answer.text  # the schema, to try again with
    # The model is told, in the next request, exactly that.
    tool_message = server.bodies()[1]["messages"][2]
    assert tool_message == {
        "role": "tool",
        "tool_call_id": "call_bad1",
        "content": "Error: " + answer.text,
    }
    assert history_violations(result.messages) == []
    assert check_transcript(result.messages) == []


@pytest.mark.parametrize(
    ("fixture", "stop", "text", "error_message"),
    [
        ("openai/length.sse", sm.messages.StopReason.LENGTH, "The answer is long", None),
        (
            "openai/content_filter.sse",
            sm.messages.StopReason.ERROR,
            "",
            "OpenAI's content filter stopped the response",
        ),
    ],
)
def test_finish_reasons_map_to_our_stop_reasons(
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


def test_reasoning_content_of_compatible_servers_is_kept_as_thinking(
    server: LoopbackServer,
) -> None:
    server.add(sse("openai/reasoning_content.sse"))
    reply = complete(make_model(server, stream_usage=False))
    assert reply.content == (
        sm.messages.ThinkingContent("The user wants a greeting."),
        sm.TextContent("Hello!"),
    )
    assert reply.usage is None  # this server sent no usage chunk
    assert "stream_options" not in server.requests[0].json()


def test_a_stream_that_breaks_before_its_finish_reason_is_retried(
    server: LoopbackServer,
) -> None:
    server.add(sse("openai/truncated.sse"), sse("openai/text_stream.sse"))
    sleeps = Sleeps()
    reply = complete(make_model(server, sleeps))
    assert reply.text == "The workspace contains README.md and src/index.ts."
    assert sleeps.delays == [0.5]
    assert len(server.requests) == 2


# -- abort --------------------------------------------------------------------------------


def test_abort_mid_stream_returns_the_text_so_far_and_drops_the_partial_call(
    server: LoopbackServer,
) -> None:
    server.add(sse("openai/partial_then_hold.sse", hold=True))
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
    assert reply.tool_calls == ()
    assert len(server.requests) == 1


def test_an_already_aborted_signal_sends_nothing(server: LoopbackServer) -> None:
    controller = sm.AbortController()
    controller.abort()
    reply = complete(make_model(server), signal=controller.signal)
    assert reply.stop_reason is sm.messages.StopReason.ABORTED
    assert reply.content == ()
    assert server.requests == []


def test_abort_during_backoff_returns_promptly(server: LoopbackServer) -> None:
    server.add(error(429, "openai/error_429.json", {"retry-after": "30"}))
    reply, sleeps = abort_in_backoff(
        lambda sleeps: make_model(server, sleeps, retry=RetryPolicy(max_total_delay=60))
    )
    assert reply.stop_reason is sm.messages.StopReason.ABORTED
    assert reply.error_message is not None
    assert reply.error_message.startswith("aborted while waiting to retry")
    assert sleeps.delays == [30.0]
    assert len(server.requests) == 1


# -- errors ---------------------------------------------------------------------------------


def test_401_ends_at_once_with_a_readable_error_that_never_shows_the_key(
    server: LoopbackServer,
) -> None:
    body = {"error": {"message": f"Incorrect API key provided: {KEY}.", "code": "invalid_api_key"}}
    server.add(Reply(401, (("Content-Type", "application/json"),), json.dumps(body).encode()))
    sleeps = Sleeps()
    with pytest.raises(ProviderAuthError) as caught:
        complete(make_model(server, sleeps))
    text = str(caught.value)
    assert KEY not in text
    assert "Incorrect API key provided: [REDACTED]" in text
    assert "HTTP 401" in text
    assert "OPENAI_API_KEY" in text
    assert sleeps.delays == []
    assert len(server.requests) == 1


def test_401_fixture_is_not_retried(server: LoopbackServer) -> None:
    server.add(error(401, "openai/error_401.json"), sse("openai/text_stream.sse"))
    with pytest.raises(ProviderAuthError, match="retrying will not help"):
        complete(make_model(server))
    assert len(server.requests) == 1


def test_429_honours_retry_after_then_succeeds(server: LoopbackServer) -> None:
    server.add(
        error(429, "openai/error_429.json", {"retry-after": "2"}),
        error(429, "openai/error_429.json", {"retry-after-ms": "1500", "retry-after": "9"}),
        sse("openai/text_stream.sse"),
    )
    sleeps = Sleeps()
    reply = complete(make_model(server, sleeps, retry=RetryPolicy(max_attempts=3, jitter=0)))
    assert reply.text == "The workspace contains README.md and src/index.ts."
    assert sleeps.delays == [2.0, 1.5]  # retry-after-ms wins over retry-after
    bodies = server.bodies()
    assert len(bodies) == 3
    assert bodies[0] == bodies[1] == bodies[2]


def test_500s_back_off_exponentially_then_give_up_with_an_explanation(
    server: LoopbackServer,
) -> None:
    server.add(*[error(500, "openai/error_500.json")] * 3)
    sleeps = Sleeps()
    with pytest.raises(ProviderUnavailableError) as caught:
        complete(make_model(server, sleeps))
    assert sleeps.delays == [0.5, 1.0]
    assert len(server.requests) == 3
    text = str(caught.value)
    assert "HTTP 500" in text
    assert "The server had an error" in text
    assert "Gave up after 3 attempt(s)" in text


def test_a_retry_after_beyond_the_budget_gives_up_at_once(server: LoopbackServer) -> None:
    server.add(error(429, "openai/error_429.json", {"retry-after": "600"}))
    sleeps = Sleeps()
    model = make_model(server, sleeps, retry=RetryPolicy(max_total_delay=60, jitter=0))
    with pytest.raises(ProviderUnavailableError, match=r"next wait \(600 s\) would exceed"):
        complete(model)
    assert sleeps.delays == []
    assert len(server.requests) == 1


def test_context_length_is_named_so_a_caller_can_compact(server: LoopbackServer) -> None:
    server.add(error(400, "openai/error_context_length.json"))
    with pytest.raises(ContextOverflowError, match="maximum context length is 128000"):
        complete(make_model(server))
    assert len(server.requests) == 1


def test_other_400s_are_request_errors_and_not_retried(server: LoopbackServer) -> None:
    server.add(error(400, "openai/error_400.json"))
    with pytest.raises(ProviderRequestError, match=r"string too long"):
        complete(make_model(server))
    assert len(server.requests) == 1


def test_a_missing_key_is_refused_up_front(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(sm.InvalidInputError, match="OPENAI_API_KEY"):
        OpenAIChatModel("gpt-4o-mini")
    # A local server needs no key.
    local = OpenAIChatModel("llama3", base_url="http://127.0.0.1:1/v1")
    assert repr(local) == "OpenAIChatModel(model='llama3', base_url='http://127.0.0.1:1/v1')"


def test_repr_never_shows_the_key(server: LoopbackServer) -> None:
    assert KEY not in repr(make_model(server))


# -- a whole run ----------------------------------------------------------------------------


def test_run_agent_end_to_end_with_workspace_tools(server: LoopbackServer, tmp_path: Path) -> None:
    server.add(
        sse("openai/parallel_tool_calls.sse", piece_size=11),
        sse("openai/single_tool_call.sse"),
        sse("openai/text_stream.sse"),
    )
    model = make_model(server)
    result = run_on_workspace(model, tmp_path, server, "openai")
    roles = [m.role for m in result.messages]
    assert roles == [
        "user",
        "assistant",
        "toolResult",
        "toolResult",
        "assistant",
        "toolResult",
        "assistant",
    ]
    listing, bad_read, good_read = (
        m for m in result.messages if isinstance(m, sm.ToolResultMessage)
    )
    assert not listing.is_error
    assert "index.ts" in listing.text
    assert bad_read.is_error  # the workspace read_file takes no "note"
    assert "'note' was unexpected" in bad_read.text
    assert not good_read.is_error
    assert "# Demo" in good_read.text
    bodies = server.bodies()
    assert len(bodies) == 3
    # The third request carries the whole exchange, each result right after its call.
    third = bodies[2]["messages"]
    assert [m["role"] for m in third] == [
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
        "tool",
    ]
    assert [m["tool_call_id"] for m in third if m["role"] == "tool"] == [
        "call_q1Xw7fKc0",
        "call_Rr9pLm2",
        "call_Zq3",
    ]
    assert third[2]["content"] == listing.text
    assert third[3]["content"] == "Error: " + bad_read.text
    assert json.loads(third[4]["tool_calls"][0]["function"]["arguments"]) == {"path": "README.md"}
    total = sum(
        (m.usage for m in result.messages if isinstance(m, sm.AssistantMessage) and m.usage),
        sm.messages.Usage(),
    )
    assert total.cache_read == 1536 + 1792


def test_strict_validation_refuses_a_chunk_of_the_wrong_shape(server: LoopbackServer) -> None:
    server.add(sse("openai/invalid_chunk.sse"), sse("openai/text_stream.sse"))
    with pytest.raises(ProviderResponseError, match="could not validate"):
        complete(make_model(server))
    assert len(server.requests) == 1  # a malformed response is not retried


def test_calls_that_reuse_index_zero_with_new_ids_stay_separate_calls(
    server: LoopbackServer,
) -> None:
    # Ollama sends each call whole, every one at index 0.
    server.add(sse("openai/same_index_calls.sse"))
    reply = complete(make_model(server), tools=(LIST, READ))
    assert reply.tool_calls == (
        sm.ToolCall("call_k2l0x1", "list_files", {"path": "."}),
        sm.ToolCall("call_p9q8r7", "read_file", {"path": "README.md"}),
    )
    assert reply.usage == sm.messages.Usage(input=310, output=40, total_tokens=350)


def test_an_error_object_inside_the_stream_is_classified_and_retried(
    server: LoopbackServer,
) -> None:
    server.add(sse("openai/error_midstream.sse"), sse("openai/text_stream.sse"))
    sleeps = Sleeps()
    reply = complete(make_model(server, sleeps))
    assert reply.text == "The workspace contains README.md and src/index.ts."
    assert sleeps.delays == [0.5]


@pytest.mark.timeout(20)
def test_a_refused_connection_fails_at_once_naming_the_url_and_the_model() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # Nothing listens on the port any more: every connection is refused.
    sleeps = Sleeps()
    model = OpenAIChatModel(
        "m", api_key=KEY, base_url=f"http://127.0.0.1:{port}/v1", retry=FAST, sleep=sleeps
    )
    with pytest.raises(ProviderUnavailableError) as caught:
        complete(model)
    assert str(caught.value).startswith(
        f"could not connect to OpenAI model 'm' at http://127.0.0.1:{port}/v1: the "
        "connection was refused"
    )
    assert "Is the server running, and is base_url right?" in str(caught.value)
    assert sleeps.delays == []  # not retried: nothing listens there


def _refused_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"  # nothing listens there any more


@pytest.mark.timeout(60)
def test_a_refused_connection_reads_as_sentences_in_the_run_explanation() -> None:
    model = OpenAIChatModel("m", api_key=KEY, base_url=_refused_url(), retry=FAST, sleep=Sleeps())
    result = sm.run_agent_sync(model=model, messages="hello")
    assert result.state is sm.TurnState.FAILED
    assert "Is the server running, and is base_url right? The run stopped" in result.explanation
    assert "?." not in result.explanation


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "body",
    [
        {"detail": "Not Found"},  # FastAPI-based servers (vLLM and others)
        {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}},
    ],
)
def test_a_404_points_at_base_url_and_the_model_name(
    server: LoopbackServer, body: dict[str, Any]
) -> None:
    server.add(Reply(404, (("Content-Type", "application/json"),), json.dumps(body).encode()))
    with pytest.raises(ProviderRequestError) as caught:
        complete(make_model(server))
    text = str(caught.value)
    assert "returned HTTP 404" in text
    assert "base_url" in text
    assert "model name" in text
    assert "refused as invalid" not in text
    assert len(server.requests) == 1  # a wrong address stays wrong: not retried


@pytest.mark.timeout(60)
def test_a_run_whose_client_gave_up_after_retries_does_not_claim_none_were_made(
    server: LoopbackServer,
) -> None:
    server.add(*[error(500, "openai/error_500.json")] * 3)
    result = sm.run_agent_sync(model=make_model(server), messages="hello")
    assert result.state is sm.TurnState.FAILED
    assert "Gave up after 3 attempt(s)" in result.explanation
    assert "without retrying" not in result.explanation
    assert "the run itself does not retry" in result.explanation
    assert len(server.requests) == 3


def test_the_sdk_client_never_retries_and_validates_strictly(server: LoopbackServer) -> None:
    client = make_model(server)._client
    assert client.max_retries == 0
    assert client._strict_response_validation is True


def test_json_nested_beyond_what_a_message_can_hold_becomes_a_parse_error() -> None:
    builder = MessageBuilder()
    block = builder.block(("tool", 0), "tool")
    block.call_id, block.name = "c1", "read_file"
    block.text.append('{"a": ' * 50_000 + "1" + "}" * 50_000)
    [call] = builder.finish(sm.messages.StopReason.TOOL_USE, None).tool_calls
    assert dict(call.arguments) == {}
    assert call.parse_error is not None
    assert call.parse_error.startswith("the arguments are not valid JSON (")
    assert call.parse_error.endswith("\u2026")  # the quoted text is cut short


def test_abort_before_the_response_begins_returns_at_once(server: LoopbackServer) -> None:
    server.add(Reply(stall=True))  # the server never even sends a status line
    controller = sm.AbortController()

    async def main() -> sm.AssistantMessage:
        model = make_model(server)
        task = asyncio.ensure_future(model.complete([sm.UserMessage("go")], (), controller.signal))
        await asyncio.to_thread(server.holding.wait, 30)
        controller.abort()
        return await task

    reply = asyncio.run(main())
    assert reply == sm.AssistantMessage(
        (),
        stop_reason=sm.messages.StopReason.ABORTED,
        error_message="aborted before the response began",
    )
    assert len(server.requests) == 1


# -- ids a server got wrong ------------------------------------------------------------------


def test_calls_with_empty_or_repeated_ids_get_new_unique_ids(server: LoopbackServer) -> None:
    def call(call_id: str, path: str) -> dict[str, Any]:
        arguments = json.dumps({"path": path})
        return {
            "id": call_id,
            "type": "function",
            "function": {"name": "list_files", "arguments": arguments},
        }

    completion = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [call("", "a"), call("", "b"), call("c1", "c"), call("c1", "d")],
                },
            }
        ],
    }
    server.add(Reply(200, (("Content-Type", "application/json"),), json.dumps(completion).encode()))
    reply = complete(make_model(server, stream=False), tools=(LIST,))
    ids = [c.id for c in reply.tool_calls]
    assert ids[2] == "c1"
    assert [i.startswith("call_") and len(i) <= 40 for i in (ids[0], ids[1], ids[3])] == [True] * 3
    assert len(set(ids)) == 4
    assert [dict(c.arguments)["path"] for c in reply.tool_calls] == ["a", "b", "c", "d"]

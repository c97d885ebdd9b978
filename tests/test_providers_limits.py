"""Bounded I/O of every adapter against a loopback server that misbehaves on purpose.

Each test uses limits of a fraction of a second, so a limit that did not hold would
show as a test that runs into its (small) timeout instead of a quick failure.
"""

from __future__ import annotations

import gzip
import json
import socket
import time
from typing import Any

import pytest
from providers_corpus import bedrock_event, bedrock_text_stream, event_message
from providers_server import (
    FAST,
    Log,
    LoopbackServer,
    Reply,
    Sleeps,
    complete,
    fixture_text,
    sse,
)

import statemachine as sm
import statemachine.messages
from statemachine.providers import (
    AnthropicModel,
    BedrockModel,
    GeminiModel,
    OllamaModel,
    OpenAIChatModel,
    OpenAIResponsesModel,
    ProviderLimitError,
    ProviderResponseError,
    ProviderUnavailableError,
)

KEY = "sk-limit-test-0123456789abcdef"
SSE = (("Content-Type", "text/event-stream"),)

OPENAI_DELTA = (
    b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[{"index":0,"delta":{"content":"more "},"finish_reason":null}]}\n\n'
)
RESPONSES_DELTA = (
    b"event: response.output_text.delta\n"
    b'data: {"type":"response.output_text.delta","output_index":0,"content_index":0,'
    b'"item_id":"msg_1","delta":"more ","sequence_number":1}\n\n'
)
GEMINI_DELTA = (
    b'data: {"candidates": [{"content": {"parts": [{"text": "more "}], "role": "model"},'
    b' "index": 0}]}\r\n\r\n'
)
BEDROCK_DELTA = bedrock_event(
    "contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "more "}}
)
OLLAMA_DELTA = (
    b'{"model":"qwen3:8b","message":{"role":"assistant","content":"more "},"done":false}\n'
)
ANTHROPIC_DELTA = (
    b"event: content_block_delta\n"
    b'data: {"type":"content_block_delta","index":0,'
    b'"delta":{"type":"text_delta","text":"more "}}\n\n'
)


@pytest.fixture(params=["openai", "anthropic", "responses", "gemini", "bedrock", "ollama"])
def provider(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def make_model(server: LoopbackServer, provider: str, **kw: Any) -> Any:
    kw.setdefault("retry", FAST)
    kw.setdefault("sleep", Sleeps())
    if provider == "openai":
        return OpenAIChatModel("gpt-4o-mini", api_key=KEY, base_url=server.url + "/v1", **kw)
    if provider == "responses":
        return OpenAIResponsesModel("gpt-5-mini", api_key=KEY, base_url=server.url + "/v1", **kw)
    if provider == "gemini":
        return GeminiModel("gemini-2.5-flash", api_key=KEY, base_url=server.url, **kw)
    if provider == "bedrock":
        return bedrock_model(server.url, **kw)
    if provider == "ollama":
        return OllamaModel("qwen3:8b", base_url=server.url, **kw)
    return AnthropicModel("claude-test", api_key=KEY, base_url=server.url, **kw)


def bedrock_model(url: str, **kw: Any) -> BedrockModel:
    return BedrockModel(
        "amazon.nova-micro-v1:0",
        region="eu-west-1",
        endpoint_url=url,
        aws_access_key_id="AKIAFAKEFAKEFAKE",
        aws_secret_access_key=KEY,
        **kw,
    )


def url_of(server: LoopbackServer, provider: str) -> str:
    return server.url + ("/v1" if provider in ("openai", "responses") else "")


def text_stream(provider: str) -> bytes:
    """The text stream of every adapter's fixtures (Bedrock's is framed, not a file)."""
    if provider == "bedrock":
        return bedrock_text_stream()
    if provider == "ollama":
        return fixture_text("ollama/text_stream.ndjson").encode()
    return sse(f"{provider}/text_stream.sse").body


def delta(provider: str) -> bytes:
    deltas = {
        "openai": OPENAI_DELTA,
        "responses": RESPONSES_DELTA,
        "gemini": GEMINI_DELTA,
        "bedrock": BEDROCK_DELTA,
        "ollama": OLLAMA_DELTA,
    }
    return deltas.get(provider, ANTHROPIC_DELTA)


MODEL_NAMES = {
    "openai": "'gpt-4o-mini'",
    "responses": "'gpt-5-mini'",
    "anthropic": "'claude-test'",
    "gemini": "'gemini-2.5-flash'",
    "bedrock": "'amazon.nova-micro-v1:0'",
    "ollama": "'qwen3:8b'",
}


def names_url_model_and(
    error: BaseException, server: LoopbackServer, provider: str, limit: str
) -> None:
    text = str(error)
    assert url_of(server, provider) in text
    assert MODEL_NAMES[provider] in text
    assert f"({limit}=" in text


# -- total deadline, idle timeout, size --------------------------------------------------


@pytest.mark.timeout(10)
def test_an_endless_stream_is_stopped_by_the_total_deadline(
    server: LoopbackServer, provider: str
) -> None:
    # Events keep coming, so the idle timeout never fires: only the deadline can end it.
    server.add(Reply(200, SSE, delta(provider), repeat=True, delay=0.01))
    model = make_model(server, provider, timeout=0.5, idle_timeout=5.0)
    started = time.monotonic()
    with pytest.raises(ProviderLimitError) as caught:
        complete(model)
    assert time.monotonic() - started < 2.0
    names_url_model_and(caught.value, server, provider, "timeout")
    assert "longer than its limit of 0.5 s" in str(caught.value)
    assert len(server.requests) == 1  # a limit is not retried
    assert caught.value.__cause__ is None  # nothing of the SDK's to show


@pytest.mark.timeout(10)
def test_a_slow_drip_that_never_completes_an_event_hits_the_idle_timeout(
    server: LoopbackServer, provider: str
) -> None:
    # One byte every 50 ms: the socket is never silent, but no event ever completes.
    server.add(Reply(200, SSE, delta(provider), piece_size=1, delay=0.05))
    model = make_model(server, provider, timeout=5.0, idle_timeout=0.3)
    started = time.monotonic()
    with pytest.raises(ProviderLimitError) as caught:
        complete(model)
    assert time.monotonic() - started < 2.0
    names_url_model_and(caught.value, server, provider, "idle_timeout")
    assert "sent nothing for 0.3 s" in str(caught.value)


@pytest.mark.timeout(10)
def test_a_slow_drip_of_whole_events_is_stopped_by_the_deadline(
    server: LoopbackServer, provider: str
) -> None:
    # Each event arrives within the idle timeout; the deadline still ends the call.
    server.add(Reply(200, SSE, delta(provider), repeat=True, delay=0.1))
    model = make_model(server, provider, timeout=0.6, idle_timeout=0.5)
    started = time.monotonic()
    with pytest.raises(ProviderLimitError, match=r"\(timeout=0\.6\)"):
        complete(model)
    assert time.monotonic() - started < 2.0


@pytest.mark.timeout(10)
def test_a_stream_that_outgrows_the_size_limit_is_stopped(
    server: LoopbackServer, provider: str
) -> None:
    server.add(Reply(200, SSE, delta(provider) * 50, repeat=True))
    model = make_model(server, provider, max_response_bytes=20_000, timeout=5.0)
    with pytest.raises(ProviderLimitError) as caught:
        complete(model)
    names_url_model_and(caught.value, server, provider, "max_response_bytes")
    assert "beyond its limit of 20000 bytes" in str(caught.value)
    assert len(server.requests) == 1


@pytest.mark.timeout(10)
def test_an_oversized_error_body_is_stopped_too(server: LoopbackServer, provider: str) -> None:
    huge = json.dumps({"error": {"type": "api_error", "message": "x" * 50_000}}).encode()
    server.add(Reply(500, (("Content-Type", "application/json"),), huge))
    model = make_model(server, provider, max_response_bytes=10_000)
    with pytest.raises(ProviderLimitError, match=r"\(max_response_bytes=\d+\)"):
        complete(model)


@pytest.mark.timeout(10)
def test_a_compressed_body_is_counted_as_it_inflates(server: LoopbackServer, provider: str) -> None:
    # 4 MB of events that compress to a few kilobytes: the count is of what we keep.
    bomb = gzip.compress(delta(provider) * 40_000)
    assert len(bomb) < 50_000
    server.add(Reply(200, (*SSE, ("Content-Encoding", "gzip")), bomb))
    model = make_model(server, provider, max_response_bytes=100_000)
    with pytest.raises(ProviderLimitError, match=r"\(max_response_bytes=\d+\)"):
        complete(model)


def test_a_compressed_stream_within_the_limit_reads_normally(
    server: LoopbackServer, provider: str
) -> None:
    server.add(
        Reply(200, (*SSE, ("Content-Encoding", "gzip")), gzip.compress(text_stream(provider)))
    )
    reply = complete(make_model(server, provider))
    assert reply.text == "The workspace contains README.md and src/index.ts."
    assert server.requests[0].headers["accept-encoding"] == "gzip, deflate"


def test_a_corrupt_compressed_body_is_a_response_error(
    server: LoopbackServer, provider: str
) -> None:
    server.add(Reply(200, (*SSE, ("Content-Encoding", "gzip")), b"\x1f\x8b not gzip at all"))
    with pytest.raises(ProviderResponseError, match="the compressed body is corrupt"):
        complete(make_model(server, provider))


def test_an_unknown_content_encoding_is_refused(server: LoopbackServer, provider: str) -> None:
    server.add(Reply(200, (*SSE, ("Content-Encoding", "br")), b"\x00\x01"))
    with pytest.raises(ProviderResponseError, match="content encoding 'br'"):
        complete(make_model(server, provider))


@pytest.mark.timeout(10)
def test_a_deadline_inside_run_agent_fails_the_run_with_a_model_failed_error(
    server: LoopbackServer, provider: str
) -> None:
    server.add(Reply(200, SSE, delta(provider), repeat=True, delay=0.01))
    model = make_model(server, provider, timeout=0.3)
    result = sm.run_agent_sync(model=model, tools=[], messages=[sm.UserMessage("hi")])
    assert result.state is sm.TurnState.FAILED
    assert isinstance(result.error, sm.ModelFailedError)
    assert "The model call failed: ProviderLimitError: " in result.explanation
    names_url_model_and(result.error, server, provider, "timeout")


def test_limits_are_checked_up_front() -> None:
    for bad in ({"timeout": 0}, {"idle_timeout": -1.0}, {"timeout": float("nan")}):
        with pytest.raises(sm.InvalidInputError, match="positive number of seconds"):
            OpenAIChatModel("m", api_key=KEY, **bad)
    for size in (0, 1.5, True):
        with pytest.raises(sm.InvalidInputError, match="positive whole number of bytes"):
            AnthropicModel("m", api_key=KEY, max_response_bytes=size)  # type: ignore[arg-type]


def test_the_defaults_are_the_documented_ones() -> None:
    model = OpenAIChatModel("m", api_key=KEY)
    assert (model.limits.timeout, model.limits.idle_timeout) == (600.0, 300.0)
    assert model.limits.max_response_bytes == 32 * 1024 * 1024 <= 64 * 1024 * 1024
    assert AnthropicModel("m", api_key=KEY).limits == model.limits
    assert OpenAIResponsesModel("m", api_key=KEY).limits == model.limits
    assert GeminiModel("m", api_key=KEY).limits == model.limits
    assert bedrock_model("http://127.0.0.1:1").limits == model.limits


# -- bad JSON and malformed events -------------------------------------------------------


BEDROCK_DELTA_HEADERS = {
    ":event-type": "contentBlockDelta",
    ":content-type": "application/json",
    ":message-type": "event",
}


def bad_event(provider: str, data: bytes, sse_event: bytes = b"") -> Reply:
    """One event whose data is ``data``: an SSE event, or Bedrock's framed message."""
    if provider == "bedrock":
        return Reply(200, SSE, event_message(BEDROCK_DELTA_HEADERS, data))
    if provider == "ollama":
        return Reply(200, SSE, data + b"\n")  # one JSON line
    event = sse_event if provider == "anthropic" else b""
    return Reply(200, SSE, event + b"data: " + data + b"\n\n")


def test_invalid_json_in_a_stream_is_a_response_error(
    server: LoopbackServer, provider: str
) -> None:
    server.add(
        bad_event(
            provider, b'{"type": "content_block_delta", oops', b"event: content_block_delta\n"
        )
    )
    with pytest.raises(ProviderResponseError) as caught:
        complete(make_model(server, provider))
    text = str(caught.value)
    if provider == "bedrock":
        # botocore reads a payload that is not JSON as an empty object: the event then
        # lacks what every delta has.
        assert "cannot be read: a content block event has no contentBlockIndex" in text
    else:
        assert "sent a response that cannot be read: it is not valid JSON text" in text
        assert "JSONDecodeError" in text
    assert isinstance(caught.value, sm.StateMachineError)
    assert len(server.requests) == 1


MALFORMED = {
    # The SDK's validation, or (Responses, read by the adapter itself) the adapter's.
    "openai": "could not validate",
    "anthropic": "could not validate",
    "responses": "is not a JSON object",
    "bedrock": "botocore could not parse an event",
    "ollama": "a line of the response is not a JSON object",
}


def test_a_malformed_event_is_a_response_error(server: LoopbackServer, provider: str) -> None:
    # Valid JSON of the wrong shape: a list where an event object belongs.
    server.add(bad_event(provider, b"[1, 2, 3]", b"event: message_delta\n"))
    if provider == "gemini":
        # The Gemini SDK reads such a chunk as an empty one: the stream then ends
        # without a finish reason, which is a broken stream, retried until given up.
        server.add(*[bad_event(provider, b"[1, 2, 3]")] * 2)
        with pytest.raises(ProviderUnavailableError, match="ended before a finish reason"):
            complete(make_model(server, provider))
        return
    with pytest.raises(ProviderResponseError, match=MALFORMED[provider]):
        complete(make_model(server, provider))


def test_bytes_that_are_not_utf8_are_a_response_error(
    server: LoopbackServer, provider: str
) -> None:
    server.add(bad_event(provider, b"\xff\xfe\xfd"))
    # The Gemini SDK decodes with replacement characters, so only the JSON fails there.
    problem = "it is not valid JSON text" if provider == "gemini" else "it is not UTF-8 text"
    with pytest.raises(ProviderResponseError, match=f"cannot be read: {problem}"):
        complete(make_model(server, provider))


@pytest.mark.parametrize("whole", ["openai", "responses"])
def test_invalid_json_in_a_whole_response_is_a_response_error(
    server: LoopbackServer, whole: str
) -> None:
    server.add(Reply(200, (("Content-Type", "application/json"),), b'{"id": "x", '))
    with pytest.raises(ProviderResponseError, match="it is not valid JSON text"):
        complete(make_model(server, whole, stream=False))


# -- connections -------------------------------------------------------------------------


@pytest.mark.timeout(10)
def test_a_refused_connection_fails_fast_and_names_the_url(provider: str) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    sleeps = Sleeps()
    base = f"http://127.0.0.1:{port}"
    if provider == "openai":
        model: Any = OpenAIChatModel(
            "gpt-4o-mini", api_key=KEY, base_url=base + "/v1", sleep=sleeps
        )
    elif provider == "responses":
        model = OpenAIResponsesModel("gpt-5-mini", api_key=KEY, base_url=base + "/v1", sleep=sleeps)
    elif provider == "gemini":
        model = GeminiModel("gemini-2.5-flash", api_key=KEY, base_url=base, sleep=sleeps)
    elif provider == "bedrock":
        model = bedrock_model(base, sleep=sleeps)
    elif provider == "ollama":
        model = OllamaModel("qwen3:8b", base_url=base, sleep=sleeps)
    else:
        model = AnthropicModel("claude-test", api_key=KEY, base_url=base, sleep=sleeps)
    started = time.monotonic()
    with pytest.raises(ProviderUnavailableError) as caught:
        complete(model)
    assert time.monotonic() - started < 2.0
    assert sleeps.delays == []
    assert base in str(caught.value)
    assert "connection was refused" in str(caught.value)


def test_a_broken_stream_is_retried_and_names_the_url_and_model(
    server: LoopbackServer, provider: str
) -> None:
    server.add(Reply(200, SSE, delta(provider)), Reply(200, SSE, text_stream(provider)))
    sleeps = Sleeps()
    log = Log()
    reply = complete(make_model(server, provider, sleep=sleeps, logger=log))
    assert reply.text == "The workspace contains README.md and src/index.ts."
    assert sleeps.delays == [0.5]
    [(event, fields)] = log.entries
    assert event == "provider_retry"
    assert fields["error"].startswith("could not reach ")
    assert url_of(server, provider) in fields["error"]


# -- abort -------------------------------------------------------------------------------


@pytest.mark.timeout(20)
def test_an_abort_mid_stream_returns_the_text_so_far_and_frees_everything(
    server: LoopbackServer, provider: str
) -> None:
    # A text delta, then the server holds the connection open: only the abort ends it.
    server.add(Reply(200, SSE, delta(provider), hold=True))
    controller = sm.AbortController()
    model = make_model(server, provider, on_text=lambda _: controller.abort())
    started = time.monotonic()
    reply = complete(model, signal=controller.signal)
    # complete() returned: its event loop closed, so no worker thread was left waiting.
    assert time.monotonic() - started < 5.0
    assert reply.stop_reason is sm.messages.StopReason.ABORTED
    assert reply.text == "more "
    assert len(server.requests) == 1

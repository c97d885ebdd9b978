"""Provider edges: servers that do not stream, the system prompt on the wire, and a
missing SDK."""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any

import pytest
from providers_server import LoopbackServer, Reply, Sleeps, complete, sse

import statemachine as sm
import statemachine.messages
from statemachine.cli.run import cli_run
from statemachine.providers import (
    AnthropicModel,
    OpenAIChatModel,
    ProviderRequestError,
    ProviderResponseError,
    RetryPolicy,
)

KEY = "sk-edge-test-0123456789abcdef"
JSON = (("Content-Type", "application/json"),)

COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1764681600,
    "model": "local",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "Let me look.",
                "reasoning_content": "The user wants the files.",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "list_files", "arguments": '{"path": "."}'},
                    }
                ],
            },
            "finish_reason": "tool_calls",
        }
    ],
    "usage": {"prompt_tokens": 50, "completion_tokens": 12, "total_tokens": 62},
}


def openai_model(server: LoopbackServer, **kw: Any) -> OpenAIChatModel:
    kw.setdefault("retry", RetryPolicy(max_attempts=2, jitter=0.0))
    return OpenAIChatModel("local", api_key=KEY, base_url=server.url + "/v1", sleep=Sleeps(), **kw)


# -- servers that do not stream ----------------------------------------------------------


def test_stream_false_reads_a_whole_completion(server: LoopbackServer) -> None:
    server.add(Reply(200, JSON, json.dumps(COMPLETION).encode()))
    pieces: list[str] = []
    reply = complete(openai_model(server, stream=False, on_text=pieces.append))
    assert reply == sm.AssistantMessage(
        (
            sm.messages.ThinkingContent("The user wants the files."),
            sm.TextContent("Let me look."),
            sm.ToolCall("call_1", "list_files", {"path": "."}),
        ),
        stop_reason=sm.messages.StopReason.TOOL_USE,
        usage=sm.messages.Usage(input=50, output=12, total_tokens=62),
    )
    assert pieces == ["Let me look."]
    body = server.requests[0].json()
    assert body["stream"] is False
    assert "stream_options" not in body


def test_a_whole_completion_of_the_wrong_shape_is_a_response_error(
    server: LoopbackServer,
) -> None:
    choice = {**COMPLETION["choices"][0], "finish_reason": None}  # type: ignore[index]
    server.add(*[Reply(200, JSON, json.dumps({**COMPLETION, "choices": [choice]}).encode())] * 2)
    with pytest.raises(ProviderResponseError, match="could not validate"):
        complete(openai_model(server, stream=False))
    assert len(server.requests) == 1


def test_a_server_that_answers_a_stream_request_with_json_names_the_option(
    server: LoopbackServer,
) -> None:
    server.add(Reply(200, JSON, json.dumps(COMPLETION).encode()))
    with pytest.raises(ProviderRequestError) as caught:
        complete(openai_model(server))
    text = str(caught.value)
    assert "the server does not stream. Pass stream=False to OpenAIChatModel." in text
    assert server.url + "/v1" in text
    assert "'local'" in text
    assert len(server.requests) == 1


def test_a_server_that_refuses_streaming_gets_a_hint_naming_the_option(
    server: LoopbackServer,
) -> None:
    refusal = {"error": {"message": "Streaming is not supported", "type": "invalid_request_error"}}
    server.add(Reply(400, JSON, json.dumps(refusal).encode()))
    with pytest.raises(ProviderRequestError) as caught:
        complete(openai_model(server))
    assert str(caught.value).endswith(
        "If the server does not support streaming, pass stream=False to OpenAIChatModel."
    )


def test_other_refusals_get_no_streaming_hint(server: LoopbackServer) -> None:
    refusal = {"error": {"message": "unknown field foo", "type": "invalid_request_error"}}
    server.add(Reply(400, JSON, json.dumps(refusal).encode()))
    with pytest.raises(ProviderRequestError) as caught:
        complete(openai_model(server))
    assert "stream=False" not in str(caught.value)


# -- the system prompt -------------------------------------------------------------------


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_the_system_prompt_given_to_the_client_is_on_the_wire(
    server: LoopbackServer, provider: str
) -> None:
    server.add(sse(f"{provider}/text_stream.sse"))
    model: Any
    if provider == "openai":
        model = openai_model(server, system="You are terse.")
    else:
        model = AnthropicModel(
            "claude-test", api_key=KEY, base_url=server.url, system="You are terse."
        )
    result = sm.run_agent_sync(model=model, tools=[], messages=[sm.UserMessage("hi")])
    assert result.state is sm.TurnState.DONE
    body = server.requests[0].json()
    if provider == "openai":
        assert body["messages"][0] == {"role": "system", "content": "You are terse."}
    else:
        assert body["system"] == "You are terse."
        assert all(m["role"] != "system" for m in body["messages"])


def test_the_run_command_sends_its_system_prompt(
    server: LoopbackServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    server.add(sse("openai/text_stream.sse"))
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    argv = ["--provider", "openai", "--model", "m", "--base-url", server.url + "/v1"]
    assert cli_run([*argv, "--system", "Answer in French.", "hi"]) == 0
    assert server.requests[0].json()["messages"][0] == {
        "role": "system",
        "content": "Answer in French.",
    }


# -- a missing SDK -----------------------------------------------------------------------

ADAPTERS = [
    ("openai", "statemachine.providers.openai_chat", "OpenAIChatModel"),
    ("anthropic", "statemachine.providers.anthropic_messages", "AnthropicModel"),
]


def hide_sdk(monkeypatch: pytest.MonkeyPatch, sdk: str, module: str) -> None:
    """Make ``import <sdk>`` fail as it does when the extra is not installed."""
    monkeypatch.setitem(sys.modules, sdk, None)
    monkeypatch.delitem(sys.modules, module, raising=False)


@pytest.mark.parametrize(("sdk", "module", "name"), ADAPTERS)
def test_a_missing_sdk_says_which_extra_to_install(
    monkeypatch: pytest.MonkeyPatch, sdk: str, module: str, name: str
) -> None:
    hide_sdk(monkeypatch, sdk, module)
    expected = f"pip install 'agent-statemachine[{sdk}]'"
    with pytest.raises(ImportError) as direct:
        importlib.import_module(module)
    providers = importlib.import_module("statemachine.providers")
    with pytest.raises(ImportError) as lazy:
        getattr(providers, name)
    for caught in (direct, lazy):
        assert str(caught.value) == (
            f"the {sdk!r} SDK is not installed; the {sdk} adapter needs it: {expected}"
        )


@pytest.mark.parametrize(
    ("hidden", "extra", "module", "name"),
    [
        ("openai", "openai", "statemachine.providers.openai_responses", "OpenAIResponsesModel"),
        ("google.genai", "gemini", "statemachine.providers.gemini", "GeminiModel"),
        ("boto3", "bedrock", "statemachine.providers.bedrock", "BedrockModel"),
    ],
)
def test_a_missing_sdk_of_the_other_adapters_names_their_extra(
    monkeypatch: pytest.MonkeyPatch, hidden: str, extra: str, module: str, name: str
) -> None:
    hide_sdk(monkeypatch, hidden, module)
    providers = importlib.import_module("statemachine.providers")
    with pytest.raises(ImportError) as lazy:
        getattr(providers, name)
    assert str(lazy.value) == (
        f"the {extra!r} SDK is not installed; the {extra} adapter needs it: "
        f"pip install 'agent-statemachine[{extra}]'"
    )


@pytest.mark.parametrize(("sdk", "module", "name"), ADAPTERS)
def test_the_run_command_gives_the_same_message(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    sdk: str,
    module: str,
    name: str,
) -> None:
    hide_sdk(monkeypatch, sdk, module)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    assert cli_run(["--provider", sdk, "--model", "m", "hi"]) == 2
    assert capsys.readouterr().err == (
        f"run: the {sdk!r} SDK is not installed; the {sdk} adapter needs it: "
        f"pip install 'agent-statemachine[{sdk}]'\n"
    )

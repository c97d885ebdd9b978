"""The services behind the model-string prefixes: the OpenAI-compatible ones
(``compatible``), Azure OpenAI, Vertex AI (Gemini and Claude) and Ollama's native
API, each run through its real SDK (or, for Ollama, the library's HTTP client)
against 127.0.0.1: where each request goes, with which credential, and what comes
back.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from providers_server import (
    FIXTURES,
    READ,
    TEXT_REPLY,
    LoopbackServer,
    Reply,
    Sleeps,
    complete,
    error,
    sse,
)

import statemachine as sm
from statemachine.errors import InvalidInputError
from statemachine.providers import (
    OpenAIChatModel,
    ProviderAuthError,
    ProviderRequestError,
    ProviderResponseError,
    ProviderUnavailableError,
    RetryPolicy,
    known_providers,
    model_from_string,
)
from statemachine.providers.azure import AzureOpenAIChatModel, AzureOpenAIResponsesModel
from statemachine.providers.compatible import COMPATIBLE
from statemachine.providers.ollama import OllamaModel
from statemachine.providers.vertex import AnthropicVertexModel, VertexGeminiModel

ONE = RetryPolicy(max_attempts=1)
JSON = (("Content-Type", "application/json"),)
LINES = (("Content-Type", "application/x-ndjson"),)


def test_every_documented_prefix_is_known() -> None:
    expected = {"azure", "azure-responses", "vertex", "vertex-anthropic", "ollama"}
    assert expected | set(COMPATIBLE) <= set(known_providers())
    assert set(COMPATIBLE) == {
        "groq",
        "deepseek",
        "openrouter",
        "xai",
        "together",
        "fireworks",
        "cerebras",
        "mistral",
    }


# -- the OpenAI-compatible services ---------------------------------------------------------


@pytest.mark.parametrize("prefix", sorted(COMPATIBLE))
def test_a_compatible_prefix_builds_a_chat_model_for_its_service(
    prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = COMPATIBLE[prefix]
    monkeypatch.setenv(service.key_env, "sk-service-0123456789")
    model = model_from_string(f"{prefix}:some-model")
    assert isinstance(model, OpenAIChatModel)
    assert model.base_url == service.base_url
    assert model.provider == service.name
    assert "sk-service" not in repr(model)


@pytest.mark.parametrize("prefix", sorted(COMPATIBLE))
def test_a_compatible_prefix_without_its_key_names_the_variable(
    prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = COMPATIBLE[prefix]
    monkeypatch.delenv(service.key_env, raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-not-this-one")
    with pytest.raises(InvalidInputError, match=service.key_env):
        model_from_string(f"{prefix}:some-model")


@pytest.mark.timeout(60)
def test_a_compatible_service_sends_its_key_and_names_itself_in_errors(
    server: LoopbackServer,
) -> None:
    server.add(error(401, "openai/error_401.json"))
    model = model_from_string(
        "groq:llama-3.3-70b-versatile",
        api_key="gsk-loopback-0123456789",
        base_url=server.url + "/openai/v1",
        retry=ONE,
    )
    with pytest.raises(ProviderAuthError) as caught:
        complete(model)
    text = str(caught.value)
    assert text.startswith("Groq model 'llama-3.3-70b-versatile'")
    assert "GROQ_API_KEY" in text
    assert "gsk-loopback" not in text
    request = server.requests[0]
    assert request.path == "/openai/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer gsk-loopback-0123456789"


# -- Azure OpenAI ---------------------------------------------------------------------------


def azure_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AZURE_OPENAI_ENDPOINT", "AZURE_OPENAI_API_KEY", "OPENAI_API_VERSION"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.timeout(60)
def test_azure_chat_calls_the_deployment_named_like_the_model_with_its_key(
    server: LoopbackServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    azure_env(monkeypatch)
    server.add(sse("openai/text_stream.sse"))
    model = model_from_string(
        "azure:gpt-4o",
        endpoint=server.url,
        api_key="azure-key-0123456789",
        api_version="2024-12-01-preview",
        retry=ONE,
    )
    assert isinstance(model, AzureOpenAIChatModel)
    assert complete(model) == TEXT_REPLY
    request = server.requests[0]
    assert (
        request.path == "/openai/deployments/gpt-4o/chat/completions?api-version=2024-12-01-preview"
    )
    assert request.headers["api-key"] == "azure-key-0123456789"
    assert request.json()["model"] == "gpt-4o"


@pytest.mark.timeout(60)
def test_azure_chat_with_an_entra_id_token_provider_sends_a_bearer_token(
    server: LoopbackServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    azure_env(monkeypatch)
    server.add(sse("openai/text_stream.sse"))
    model = AzureOpenAIChatModel(
        "gpt-4o",
        endpoint=server.url,
        deployment="prod-4o",
        token_provider=lambda: "entra-token-0123456789",
        retry=ONE,
    )
    complete(model)
    request = server.requests[0]
    assert request.path.startswith("/openai/deployments/prod-4o/chat/completions?api-version=")
    assert request.headers["authorization"] == "Bearer entra-token-0123456789"
    assert "api-key" not in request.headers


@pytest.mark.timeout(60)
def test_azure_responses_posts_to_the_responses_route(
    server: LoopbackServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    azure_env(monkeypatch)
    monkeypatch.setenv("AZURE_OPENAI_ENDPOINT", server.url)
    monkeypatch.setenv("AZURE_OPENAI_API_KEY", "azure-key-0123456789")
    server.add(sse("responses/text_stream.sse"))
    model = model_from_string("azure-responses:my-gpt-5", retry=ONE)
    assert isinstance(model, AzureOpenAIResponsesModel)
    assert complete(model).text == TEXT_REPLY.text
    request = server.requests[0]
    assert request.path.startswith("/openai/responses?api-version=")
    assert request.json()["model"] == "my-gpt-5"


def test_azure_without_an_endpoint_or_a_credential_says_which(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    azure_env(monkeypatch)
    with pytest.raises(InvalidInputError, match="AZURE_OPENAI_ENDPOINT"):
        AzureOpenAIChatModel("gpt-4o", api_key="k")
    with pytest.raises(InvalidInputError, match="token_provider"):
        AzureOpenAIChatModel("gpt-4o", endpoint="https://x.openai.azure.com")


@pytest.mark.timeout(60)
def test_azure_errors_name_azure_and_its_key_variable(
    server: LoopbackServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    azure_env(monkeypatch)
    server.add(error(401, "openai/error_401.json"))
    model = AzureOpenAIChatModel("gpt-4o", endpoint=server.url, api_key="k-0123456789", retry=ONE)
    with pytest.raises(ProviderAuthError, match="AZURE_OPENAI_API_KEY") as caught:
        complete(model)
    assert str(caught.value).startswith("Azure OpenAI model 'gpt-4o'")


# -- Vertex AI ------------------------------------------------------------------------------


class Token:
    """Google credentials that hold a token already (what ``google.auth`` returns)."""

    token = "ya29.vertex-token-0123456789"
    expired = False
    valid = True
    quota_project_id = None

    def refresh(self, request: object) -> None:
        raise AssertionError("the token is valid: no refresh")

    def before_request(self, request: Any, method: str, url: str, headers: dict[str, str]) -> None:
        headers["authorization"] = f"Bearer {self.token}"

    def apply(self, headers: dict[str, str], token: str | None = None) -> None:
        headers["authorization"] = f"Bearer {self.token}"


@pytest.mark.timeout(60)
def test_vertex_gemini_calls_the_project_model_with_google_credentials(
    server: LoopbackServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    server.add(sse("gemini/text_stream.sse"))
    model = model_from_string(
        "vertex:gemini-2.5-flash",
        project="my-project",
        location="europe-west4",
        credentials=Token(),
        base_url=server.url,
        retry=ONE,
    )
    assert isinstance(model, VertexGeminiModel)
    assert complete(model) == TEXT_REPLY
    request = server.requests[0]
    assert request.path.startswith(
        "/v1/projects/my-project/locations/europe-west4/publishers/google/models/"
        "gemini-2.5-flash:streamGenerateContent"
    )
    assert request.headers["authorization"] == "Bearer ya29.vertex-token-0123456789"


def test_vertex_without_a_project_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GOOGLE_CLOUD_PROJECT", raising=False)
    with pytest.raises(InvalidInputError, match="GOOGLE_CLOUD_PROJECT"):
        VertexGeminiModel("gemini-2.5-flash")
    with pytest.raises(InvalidInputError, match="GOOGLE_CLOUD_PROJECT"):
        AnthropicVertexModel("claude-sonnet-4@20250514")


def test_vertex_gemini_names_the_regional_endpoint() -> None:
    model = VertexGeminiModel("gemini-2.5-flash", project="p", location="us-central1")
    assert model.base_url == "https://us-central1-aiplatform.googleapis.com"


@pytest.mark.timeout(60)
def test_claude_on_vertex_puts_the_model_in_the_path_and_the_version_in_the_body(
    server: LoopbackServer,
) -> None:
    server.add(sse("anthropic/text_stream.sse"))
    model = model_from_string(
        "vertex-anthropic:claude-sonnet-4@20250514",
        project="my-project",
        location="us-east5",
        access_token="ya29.vertex-token-0123456789",
        base_url=server.url + "/v1",
        retry=ONE,
    )
    assert isinstance(model, AnthropicVertexModel)
    assert complete(model).text == TEXT_REPLY.text
    request = server.requests[0]
    assert request.path == (
        "/v1/projects/my-project/locations/us-east5/publishers/anthropic/models/"
        "claude-sonnet-4@20250514:streamRawPredict"
    )
    body = request.json()
    assert "model" not in body
    assert isinstance(body["anthropic_version"], str)  # the SDK's, moved out of the header
    assert body["anthropic_version"]
    assert request.headers["authorization"] == "Bearer ya29.vertex-token-0123456789"


# -- Ollama (native API) --------------------------------------------------------------------


def lines(*items: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(i).encode() + b"\n" for i in items)


def chunk(**message: Any) -> dict[str, Any]:
    return {
        "model": "qwen3:8b",
        "created_at": "2025-06-01T10:00:00Z",
        "message": {"role": "assistant", "content": "", **message},
        "done": False,
    }


DONE = {
    "model": "qwen3:8b",
    "created_at": "2025-06-01T10:00:01Z",
    "message": {"role": "assistant", "content": ""},
    "done": True,
    "done_reason": "stop",
    "total_duration": 4883583458,
    "prompt_eval_count": 26,
    "eval_count": 12,
}


def ollama(server: LoopbackServer, **kw: Any) -> OllamaModel:
    return OllamaModel("qwen3:8b", base_url=server.url, retry=ONE, sleep=Sleeps(), **kw)


@pytest.mark.timeout(60)
def test_ollama_streams_thinking_and_text_with_usage(server: LoopbackServer) -> None:
    server.add(
        Reply(
            200,
            LINES,
            lines(
                chunk(thinking="The user greets."),
                chunk(thinking=" Answer briefly."),
                chunk(content="Hello"),
                chunk(content=" there."),
                DONE,
            ),
            piece_size=7,
        )
    )
    pieces: list[str] = []
    reply = complete(ollama(server, think=True, on_text=pieces.append))
    assert reply.content == (
        sm.messages.ThinkingContent("The user greets. Answer briefly."),
        sm.TextContent("Hello there."),
    )
    assert pieces == ["Hello", " there."]
    assert reply.usage == sm.messages.Usage(input=26, output=12, total_tokens=38)
    assert reply.stop_reason is sm.messages.StopReason.STOP
    request = server.requests[0]
    assert request.path == "/api/chat"
    assert request.json()["think"] is True
    assert request.json()["stream"] is True


@pytest.mark.timeout(60)
def test_ollama_parallel_calls_get_ids_and_end_with_tool_use(server: LoopbackServer) -> None:
    calls = [
        {"function": {"name": "read_file", "arguments": {"path": "a.txt"}}},
        {"function": {"name": "read_file", "arguments": {"path": "b.txt"}}},
    ]
    server.add(Reply(200, LINES, lines(chunk(tool_calls=calls), DONE)))
    reply = complete(ollama(server), tools=(READ,))
    first, second = reply.tool_calls
    assert (first.name, dict(first.arguments)) == ("read_file", {"path": "a.txt"})
    assert dict(second.arguments) == {"path": "b.txt"}
    assert first.id != second.id
    assert reply.stop_reason is sm.messages.StopReason.TOOL_USE
    tools = server.requests[0].json()["tools"]
    assert tools[0]["function"]["name"] == "read_file"


@pytest.mark.timeout(60)
def test_ollama_carries_calls_thinking_and_results_back(server: LoopbackServer) -> None:
    server.add(Reply(200, LINES, lines(chunk(content="Done."), DONE)))
    call = sm.ToolCall("call_1", "read_file", {"path": "a.txt"})
    history: list[sm.Message] = [
        sm.UserMessage("read a.txt"),
        sm.AssistantMessage(
            (sm.messages.ThinkingContent("I should read it."), call),
            stop_reason=sm.messages.StopReason.TOOL_USE,
        ),
        sm.ToolResultMessage("call_1", "read_file", "hello"),
    ]
    complete(ollama(server, system="Be brief."), history, (READ,))
    sent = server.requests[0].json()["messages"]
    assert sent == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "read a.txt"},
        {
            "role": "assistant",
            "content": "",
            "thinking": "I should read it.",
            "tool_calls": [{"function": {"name": "read_file", "arguments": {"path": "a.txt"}}}],
        },
        {"role": "tool", "tool_name": "read_file", "content": "hello"},
    ]


@pytest.mark.timeout(60)
def test_ollama_whole_response_is_read(server: LoopbackServer) -> None:
    whole = {**DONE, "message": {"role": "assistant", "content": "Hi.", "thinking": "Greet."}}
    server.add(Reply(200, JSON, json.dumps(whole).encode()))
    reply = complete(ollama(server, stream=False))
    assert reply.text == "Hi."
    assert server.requests[0].json()["stream"] is False


@pytest.mark.timeout(60)
def test_ollama_a_model_not_pulled_is_a_request_error_that_says_so(
    server: LoopbackServer,
) -> None:
    body = json.dumps({"error": "model 'qwen3:8b' not found"}).encode()
    server.add(Reply(404, JSON, body))
    with pytest.raises(ProviderRequestError, match="not pulled") as caught:
        complete(ollama(server))
    assert "model 'qwen3:8b' not found" in str(caught.value)


@pytest.mark.timeout(60)
def test_ollama_an_error_line_mid_stream_is_classified(server: LoopbackServer) -> None:
    server.add(
        Reply(200, LINES, lines(chunk(content="Hel"), {"error": "an error was encountered"}))
    )
    with pytest.raises(ProviderUnavailableError):
        complete(ollama(server))


@pytest.mark.timeout(60)
def test_ollama_a_line_that_is_not_an_object_is_a_response_error(server: LoopbackServer) -> None:
    server.add(Reply(200, LINES, b"[1, 2, 3]\n"))
    with pytest.raises(ProviderResponseError, match="not a JSON object"):
        complete(ollama(server))


@pytest.mark.timeout(60)
def test_ollama_a_stream_without_its_done_line_is_retried_then_given_up(
    server: LoopbackServer,
) -> None:
    server.add(*[Reply(200, LINES, lines(chunk(content="Hel")))] * 2)
    model = OllamaModel(
        "qwen3:8b", base_url=server.url, retry=RetryPolicy(max_attempts=2), sleep=Sleeps()
    )
    with pytest.raises(ProviderUnavailableError, match="done line"):
        complete(model)
    assert len(server.requests) == 2


@pytest.mark.timeout(60)
def test_ollama_run_settings_go_in_options(server: LoopbackServer) -> None:
    server.add(Reply(200, LINES, lines(chunk(content="ok"), DONE)))
    model = ollama(server, ollama_options={"num_ctx": 8192}, temperature=0.2)
    result = sm.run_agent_sync(
        model=model,
        tools=[],
        messages=[sm.UserMessage("hi")],
        instructions="Answer in French.",
        model_settings=sm.ModelSettings(max_tokens=64, stop=("END",)),
    )
    assert isinstance(result.messages[-1], sm.AssistantMessage)
    assert result.messages[-1].text == "ok"
    body = server.requests[0].json()
    assert body["options"] == {
        "num_ctx": 8192,
        "temperature": 0.2,
        "num_predict": 64,
        "stop": ["END"],
    }
    assert body["messages"][0] == {"role": "system", "content": "Answer in French."}


# -- Ollama: recorded native responses (ollama/native/SOURCES.md) ---------------------------

SEARCH = sm.ToolDefinition(
    "search",
    "Search the web.",
    {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
)
DATETIME = sm.ToolDefinition("datetime", "The date and time.", {"type": "object"})


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("name", "tool", "arguments", "usage"),
    [
        ("tool_call_with_arguments", SEARCH, {"query": "ollama bash lib"}, (129, 47)),
        ("tool_call_without_arguments", DATETIME, {}, (126, 35)),
    ],
)
def test_a_recorded_ollama_call_is_read_with_its_thinking_and_usage(
    name: str,
    tool: sm.ToolDefinition,
    arguments: dict[str, Any],
    usage: tuple[int, int],
    server: LoopbackServer,
) -> None:
    body = (FIXTURES / "ollama" / "native" / f"{name}.json").read_bytes()
    recorded = json.loads(body)["message"]
    server.add(Reply(200, JSON, body))
    reply = complete(ollama(server, stream=False), tools=(tool,))
    thinking, call = reply.content
    assert thinking == sm.messages.ThinkingContent(recorded["thinking"])
    assert isinstance(call, sm.ToolCall)
    assert (call.name, dict(call.arguments)) == (tool.name, arguments)
    assert call.id.startswith("call_")  # Ollama sent none
    assert reply.stop_reason is sm.messages.StopReason.TOOL_USE
    assert reply.usage == sm.messages.Usage(
        input=usage[0], output=usage[1], total_tokens=sum(usage)
    )


@pytest.mark.timeout(60)
def test_a_recorded_ollama_502_is_retried_then_unavailable(server: LoopbackServer) -> None:
    body = (FIXTURES / "ollama" / "native" / "error_502.json").read_bytes()
    server.add(Reply(502, JSON, body), Reply(502, JSON, body))
    sleeps = Sleeps()
    model = OllamaModel(
        "gpt-oss:20b", base_url=server.url, retry=RetryPolicy(max_attempts=2), sleep=sleeps
    )
    with pytest.raises(ProviderUnavailableError, match="upstream error"):
        complete(model)
    assert len(server.requests) == 2
    assert len(sleeps.delays) == 1


@pytest.mark.timeout(60)
def test_azure_chat_reads_azures_published_filter_stream(
    server: LoopbackServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    azure_env(monkeypatch)
    server.add(sse("azure/async_filter_stream.sse"))
    model = AzureOpenAIChatModel(
        "gpt-35-turbo", endpoint=server.url, api_key="azure-key-0123456789", retry=ONE
    )
    reply = complete(model)
    assert reply.content == (sm.TextContent("Color is a"),)
    assert reply.stop_reason is sm.messages.StopReason.STOP


@pytest.mark.parametrize(
    ("spec", "options", "name"),
    [
        ("groq:llama-3.3-70b-versatile", {"api_key": "k"}, "groq"),
        ("xai:grok-4", {"api_key": "k"}, "x_ai"),
        ("mistral:mistral-small-latest", {"api_key": "k"}, "mistral_ai"),
        ("openai:gpt-4o", {"api_key": "k"}, "openai"),
        (
            "azure:gpt-4o",
            {"api_key": "k", "endpoint": "https://x.openai.azure.com"},
            "azure.ai.openai",
        ),
        ("vertex:gemini-2.5-flash", {"project": "p"}, "gcp.vertex_ai"),
        ("ollama:qwen3:8b", {}, "ollama"),
    ],
)
def test_a_traced_service_has_its_conventions_provider_name(
    spec: str, options: dict[str, Any], name: str
) -> None:
    from opentelemetry.sdk.trace import TracerProvider

    from statemachine.otel import AgentTracer

    traced = AgentTracer(TracerProvider()).model(model_from_string(spec, **options))
    assert traced.provider == name  # type: ignore[attr-defined]


def test_deepseek_sends_thinking_back_as_reasoning_content_and_others_do_not() -> None:
    deepseek = model_from_string("deepseek:deepseek-reasoner", api_key="k")
    groq = model_from_string("groq:qwen/qwen3-32b", api_key="k")
    assert isinstance(deepseek, OpenAIChatModel)
    assert isinstance(groq, OpenAIChatModel)
    history: list[sm.Message] = [
        sm.UserMessage("hi"),
        sm.AssistantMessage((sm.messages.ThinkingContent("Greet back."), sm.TextContent("Hello"))),
        sm.UserMessage("again"),
    ]
    sent = deepseek.request_body(history, ())["messages"][1]
    assert sent == {"role": "assistant", "content": "Hello", "reasoning_content": "Greet back."}
    assert "reasoning_content" not in groq.request_body(history, ())["messages"][1]
    with pytest.raises(InvalidInputError, match="reasoning_field"):
        OpenAIChatModel("m", api_key="k", reasoning_field="not a field")

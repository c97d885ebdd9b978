"""What a real MCP server (written with the SDK, protocol 2026-07-28: its questions
come back as the SDK's InputRequired rounds) may ask of a run: a model's answer
(sampling) and the user's (elicitation), each only when enabled and bounded; and what
it tells while a call runs: progress and log messages, as the run's events."""

from __future__ import annotations

import sys
from collections.abc import Generator, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import httpx2
import pytest
from test_mcp import DEVNULL, _calls, _done, _results, _sync, serving_http

import statemachine as sm
from statemachine.mcp import (
    MCPElicitation,
    MCPError,
    MCPProgress,
    MCPSampling,
    MCPSamplingRequest,
    MCPServer,
)
from statemachine.mcp._asking import CHARS_PER_TOKEN, MAX_LOG_CHARS
from statemachine.testing import ScriptedModel

ASKING = Path(__file__).resolve().parent / "mcp_servers" / "asking.py"
NO_SIGNAL = sm.AbortController().signal


class SettingsModel(ScriptedModel):
    """A scripted model that takes every ``ModelSettings`` field."""

    supported_settings: ClassVar[frozenset[str]] = frozenset({"max_tokens", "temperature", "stop"})
    model = "sampler-1"


def _stdio(**options: Any) -> MCPServer:
    return MCPServer.stdio(sys.executable, [str(ASKING), "stdio"], stderr=DEVNULL, **options)


async def _trip(question: MCPElicitation) -> Mapping[str, Any] | None:
    assert question.schema["required"] == ["seats", "window"]
    return {"seats": 2, "window": True} if "Rome" in question.message else None


async def _tool(server: MCPServer, name: str, **arguments: Any) -> str:
    """What the call answers, or ``error: ...`` with the error the run would give the model."""
    (tool,) = [t for t in server.tools if t.name == name]
    try:
        output = await tool.execute(arguments, NO_SIGNAL)
    except MCPError as exc:
        return f"error: {exc}"
    assert isinstance(output, sm.ToolOutput)
    (text,) = output.content
    assert isinstance(text, sm.TextContent)
    return f"error: {text.text}" if output.is_error else text.text


def _in_order(seen: list[object], sent: list[object]) -> bool:
    """``seen`` is what a subscriber that read the events after the run is given of
    the progress ``sent``: the newest of each call (the others coalesced) or more."""
    return bool(seen) and seen[-1] == sent[-1] and all(p in sent for p in seen)


async def _a_run_that_asks(server: MCPServer) -> tuple[sm.RunResult, list[sm.RunEvent]]:
    """A run whose model reads a resource, then calls summarize (sampling) and book
    (elicitation), then count (progress and logs)."""
    (greeting,) = await server.read_resource("test://greeting")
    model = ScriptedModel(
        _calls(("summarize", {"text": "a long story"}), ("book", {"city": "Rome"})),
        _calls(("count", {"n": 3})),
        _done(),
    )
    run = sm.AgentRun(
        model=model,
        tools=server.tools,
        messages=[sm.UserMessage((sm.TextContent("Plan the trip. Context:"), greeting))],
    )
    events = run.events()
    result = await run.run()
    return result, [event async for event in events]


@pytest.mark.timeout(120)
@_sync
async def test_a_run_uses_resources_sampling_and_elicitation_over_stdio() -> None:
    sampler = SettingsModel(sm.AssistantMessage("A story, shortly."))
    asked: list[MCPSamplingRequest] = []

    def allow(request: MCPSamplingRequest) -> bool:
        asked.append(request)
        return True

    policy = MCPSampling(model=sampler, max_tokens=20, allow=allow)
    async with _stdio(sampling=policy, elicitation=_trip) as server:
        result, events = await _a_run_that_asks(server)
    assert result.state is sm.TurnState.DONE
    summary, booked, counted = (m.text for m in _results(result.messages))
    assert summary == "summary by sampler-1: A story, shortly."
    assert booked == "booked 2 seats to Rome (window: True)"
    assert counted == "counted to 3"
    (request,) = asked
    assert request.messages == (sm.UserMessage("Summarize in one line: a long story"),)
    assert (request.system_prompt, request.max_tokens, request.temperature) == (
        "You summarize.",
        50,
        0.0,
    )
    sampled = sampler.last_request
    assert sampled is not None
    assert sampled.instructions == "You summarize."
    assert sampled.settings == sm.ModelSettings(max_tokens=20, temperature=0.0)  # 50 capped
    assert sampled.tools == ()
    progress = [e.data for e in events if isinstance(e, sm.ToolProgress)]
    logs = [(e.level, e.data, e.logger) for e in events if isinstance(e, sm.ToolLog)]
    assert _in_order(progress, [MCPProgress(i, 3, f"step {i}") for i in (1, 2, 3)])
    assert logs == [("info", f"counted {i}", "counter") for i in (1, 2, 3)]
    count_call = next(
        e.call for e in events if isinstance(e, sm.ToolStarted) and e.call.name == "count"
    )
    assert {e.call_id for e in events if isinstance(e, sm.ToolProgress | sm.ToolLog)} == {
        count_call.id
    }


@pytest.mark.timeout(120)
@_sync
async def test_sampling_and_elicitation_are_refused_unless_enabled_and_the_error_says_how() -> None:
    async with _stdio() as server:
        for name, arguments in (("summarize", {"text": "x"}), ("book", {"city": "Rome"})):
            output = await _tool(server, name, **arguments)
            assert output.startswith(f"error: MCP server {server.name!r}, tool {name!r}: ")
            assert "did not declare the" in output
            assert "MCPServer(sampling=MCPSampling(...))" in output


class Refusing:
    """An ``allow`` that refuses every request (and counts them)."""

    def __init__(self) -> None:
        self.asked = 0

    async def __call__(self, request: MCPSamplingRequest) -> bool:
        self.asked += 1
        return False


@pytest.mark.timeout(120)
@_sync
async def test_sampling_is_bounded_by_its_policy() -> None:
    sampler = SettingsModel(*[sm.AssistantMessage(f"answer {i}") for i in range(5)])
    refusing = Refusing()
    limited = MCPSampling(model=sampler, max_requests=3, max_messages=10, max_chars=500)
    async with _stdio(sampling=limited) as server:
        many = await _tool(server, "chatty", n=11, tokens=5)
        assert many.startswith("error: ")
        assert "at most 10 messages per sampling request" in many
        long = await _tool(server, "summarize", text="z" * 600)
        assert long.startswith("error: ")
        assert "at most 500 characters" in long
        assert sampler.calls == 0
        capped = await _tool(server, "chatty", n=1, tokens=10**9)
        assert capped == "answered: answer 0"
        assert sampler.last_request is not None
        assert sampler.last_request.settings.max_tokens == 1024  # MCPSampling.max_tokens
        # the policy's max_requests counts every request of the connection, refused or not
        over = await _tool(server, "chatty", n=1, tokens=5)
        assert over.startswith("error: ")
        assert "at most 3 sampling requests per connection" in over
    async with _stdio(sampling=MCPSampling(model=sampler, allow=refusing)) as server:
        refused = await _tool(server, "summarize", text="x")
        assert refused.startswith("error: ")
        assert "sampling policy refused this request" in refused
    assert refusing.asked == 1
    assert sampler.calls == 1


@pytest.mark.timeout(120)
@_sync
async def test_max_tokens_bounds_the_answer_of_a_model_that_takes_no_settings() -> None:
    # ScriptedModel declares no supported settings: it is never told max_tokens, so the
    # answer it gives back is cut to the policy's budget of characters instead.
    long = "word " * 40_030
    sampler = ScriptedModel(sm.AssistantMessage(long), sm.AssistantMessage("short"))
    async with _stdio(sampling=MCPSampling(model=sampler, max_tokens=10)) as server:
        cut = await _tool(server, "sized", n=1, tokens=10**6)
        whole = await _tool(server, "sized", n=1, tokens=10**6)
    assert cut == f"{10 * CHARS_PER_TOKEN} characters, stopped: maxTokens"
    assert whole == "5 characters, stopped: endTurn"


@pytest.mark.timeout(120)
@_sync
async def test_the_connection_answers_at_most_max_input_requests() -> None:
    sampler = SettingsModel(sm.AssistantMessage("one"))
    async with _stdio(sampling=MCPSampling(model=sampler), max_input_requests=1) as server:
        assert await _tool(server, "chatty", n=1, tokens=5) == "answered: one"
        over = await _tool(server, "chatty", n=1, tokens=5)
    assert over.startswith("error: ")
    assert "at most 1 sampling and elicitation requests" in over


async def _fails(question: MCPElicitation) -> Mapping[str, Any] | None:
    raise RuntimeError("no user at the keyboard")


async def _wrong(question: MCPElicitation) -> Mapping[str, Any] | None:
    return {"seats": {"not": "a number"}}


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("handler", "city", "said"),
    [
        (_trip, "Oslo", "elicitation was decline"),  # _trip declines (None) all but Rome
        (_fails, "Rome", "elicitation handler failed: RuntimeError: no user at the keyboard"),
        (_wrong, "Rome", "elicitation answer is not valid"),
    ],
    ids=["declined", "raises", "invalid"],
)
@_sync
async def test_an_elicitation_the_handler_does_not_accept_fails_the_call_saying_why(
    handler: Any, city: str, said: str
) -> None:
    async with _stdio(elicitation=handler) as server:
        output = await _tool(server, "book", city=city)
        assert output.startswith("error: ")
        assert said in output
        # the connection goes on
        assert await _tool(server, "count", n=1) == "counted to 1"


@pytest.mark.timeout(120)
@_sync
async def test_a_log_message_is_cut_to_max_log_chars() -> None:
    async with _stdio() as server:
        model = ScriptedModel(_calls(("shout", {"size": 100_000})), _done())
        run = sm.AgentRun(model=model, tools=server.tools, messages=[sm.UserMessage("go")])
        events = run.events()
        result = await run.run()
        logs = [e async for e in events if isinstance(e, sm.ToolLog)]
    assert result.state is sm.TurnState.DONE
    (log,) = logs
    assert log.level == "warning"
    assert isinstance(log.data, str)
    assert isinstance(log.logger, str)
    assert log.data == "w" * MAX_LOG_CHARS + f"[{100_000 - MAX_LOG_CHARS} more cut]"
    assert len(log.logger) < 300


@pytest.mark.timeout(60)
def test_the_sampling_policy_refuses_bad_bounds() -> None:
    for option in ("max_tokens", "max_requests", "max_messages", "max_chars"):
        bad: dict[str, Any] = {option: 0}
        with pytest.raises(sm.InvalidInputError, match=option):
            MCPSampling(model=ScriptedModel(), **bad)
    with pytest.raises(sm.InvalidInputError, match="max_input_requests"):
        _stdio(max_input_requests=0)


# -- over streamable HTTP ---------------------------------------------------------------------


@pytest.fixture
def asking_url() -> Iterator[str]:
    yield from _serve({})


@pytest.fixture
def guarded_url() -> Iterator[str]:
    yield from _serve({"MCP_TEST_TOKEN": SECRET})


SECRET = "open-sesame-7f3a"


def _serve(env: dict[str, str]) -> Iterator[str]:
    with serving_http(ASKING, env) as (url, _process):
        yield url


@pytest.mark.timeout(120)
@_sync
async def test_a_run_uses_sampling_elicitation_progress_and_logs_over_http(asking_url: str) -> None:
    sampler = SettingsModel(sm.AssistantMessage("Over HTTP, shortly."))
    policy = MCPSampling(model=sampler)
    async with MCPServer.http(asking_url, sampling=policy, elicitation=_trip) as server:
        model = ScriptedModel(
            _calls(("summarize", {"text": "t"}), ("book", {"city": "Rome"}), ("count", {"n": 2})),
            _done(),
        )
        run = sm.AgentRun(model=model, tools=server.tools, messages=[sm.UserMessage("go")])
        events = run.events()
        result = await run.run()
        seen = [e async for e in events]
    assert result.state is sm.TurnState.DONE
    assert [m.text for m in _results(result.messages)] == [
        "summary by sampler-1: Over HTTP, shortly.",
        "booked 2 seats to Rome (window: True)",
        "counted to 2",
    ]
    progress = [e.data for e in seen if isinstance(e, sm.ToolProgress)]
    assert _in_order(progress, [MCPProgress(i, 2, f"step {i}") for i in (1, 2)])
    assert [e.data for e in seen if isinstance(e, sm.ToolLog)] == ["counted 1", "counted 2"]


class Bearer(httpx2.Auth):
    """An ``httpx2.Auth`` that sends one bearer token (as ``OAuthClientProvider`` does
    once it has one) and counts the requests it signed."""

    def __init__(self, token: str) -> None:
        self.token = token
        self.signed = 0

    def auth_flow(self, request: httpx2.Request) -> Generator[httpx2.Request, httpx2.Response]:
        request.headers["Authorization"] = f"Bearer {self.token}"
        self.signed += 1
        yield request


@pytest.mark.timeout(120)
@_sync
async def test_an_auth_provider_reaches_a_bearer_token_protected_server(guarded_url: str) -> None:
    bearer = Bearer(SECRET)
    async with MCPServer.http(guarded_url, auth=bearer) as server:
        assert await _tool(server, "count", n=1) == "counted to 1"
    assert bearer.signed >= 2  # the listing and the call at least
    for auth in (None, Bearer("wrong-token")):
        with pytest.raises(MCPError) as refused:
            async with MCPServer.http(guarded_url, auth=auth, connect_timeout=20):
                pass
        assert str(refused.value).endswith("(it answered HTTP 401 Unauthorized)")
        assert "wrong-token" not in str(refused.value)

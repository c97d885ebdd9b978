"""An MCP server's elicitation asked through the run (``MCPServer(elicitation="run")``),
against a real server (tests/mcp_servers/features.py, written with the SDK): pending on
the run, answered by a person with ``AgentRun.answer``, ended "cancel" by the call's
timeout or the run's abort, refused when its schema or size is not one to ask, bounded
per run."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from test_mcp import DEVNULL, _sync
from test_mcp_asking import _tool

import statemachine as sm
from statemachine.errors import NotPendingError
from statemachine.hooks import MAX_PENDING_QUESTIONS, ToolAnswered, ToolAsked
from statemachine.mcp import MCPServer
from statemachine.testing import FunctionModel

FEATURES = Path(__file__).resolve().parent / "mcp_servers" / "features.py"
NOISY = FEATURES.parent / "noisy.py"


def _features(log: Path | None = None, **options: Any) -> MCPServer:
    env = {"MCP_TEST_LOG": str(log)} if log else {}
    return MCPServer.stdio(
        sys.executable, [str(FEATURES), "stdio"], env=env, stderr=DEVNULL, **options
    )


def _calling(name: str, count: int = 1, arguments: dict[str, Any] | None = None) -> FunctionModel:
    """Calls ``name`` ``count`` times at once, then answers with what the calls said."""

    def model(messages: Any, tools: Any) -> sm.AssistantMessage:
        said = [m.text for m in messages if isinstance(m, sm.ToolResultMessage)]
        if said:
            return sm.AssistantMessage(" | ".join(said))
        calls = tuple(sm.ToolCall(f"c{i}", name, arguments or {}) for i in range(count))
        return sm.AssistantMessage(calls, stop_reason=sm.messages.StopReason.TOOL_USE)

    return FunctionModel(model)


async def _asked(events: AsyncIterator[Any], count: int = 1) -> list[ToolAsked]:
    asked = []
    async for event in events:
        if isinstance(event, ToolAsked):
            asked.append(event)
            if len(asked) == count:
                return asked
    raise AssertionError("the run returned before its tools asked")


def _start(
    server: MCPServer, model: FunctionModel, **options: Any
) -> tuple[sm.AgentRun[Any], AsyncIterator[Any], asyncio.Future[sm.RunResult]]:
    """A run of ``model`` on the server's tools, started, and its events from the start."""
    run: sm.AgentRun[Any] = sm.AgentRun(model=model, tools=server.tools, messages="book", **options)
    events = run.events()
    return run, events, asyncio.ensure_future(run.run())


@pytest.mark.timeout(60)
@_sync
async def test_a_question_is_pending_on_the_run_and_a_persons_answer_reaches_the_server() -> None:
    async with _features(elicitation="run") as server:
        run, events, task = _start(server, _calling("seat"))
        (asked,) = await _asked(events)
        question = asked.question
        assert run.pending_questions() == (question,)
        assert (question.call_id, question.tool_name, question.message) == (
            "c0",
            "seat",
            "Which row?",
        )
        assert question.source == server.name
        assert question.schema["properties"]["row"]["type"] == "integer"
        with pytest.raises(sm.InvalidInputError, match=r"answer\.row: 'three' is not of type"):
            run.answer(question.id, {"row": "three"})
        assert run.pending_questions() == (question,)  # a refused answer changes nothing
        run.answer(question.id, {"row": 3})
        with pytest.raises(NotPendingError, match="no question 'q1' is pending"):
            run.answer(question.id, {"row": 4})
        result = await task
        ended = [e async for e in events if isinstance(e, ToolAnswered)]
    assert result.state is sm.TurnState.DONE
    assert result.final_text == "row 3"
    assert ended == [ToolAnswered(question, "accept")]
    assert run.pending_questions() == ()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("answer", ["decline", "cancel"])
@_sync
async def test_a_person_may_decline_or_cancel_a_question(answer: str) -> None:
    async with _features(elicitation="run") as server:
        run, events, task = _start(server, _calling("seat"))
        (asked,) = await _asked(events)
        run.answer(asked.question.id, answer)  # type: ignore[arg-type]
        result = await task
        ended = [e.outcome async for e in events if isinstance(e, ToolAnswered)]
    assert (result.final_text, ended) == (answer, [answer])


@pytest.mark.timeout(60)
@_sync
async def test_a_question_nobody_answers_ends_at_the_calls_timeout_and_the_server_hears_cancel(
    tmp_path: Path,
) -> None:
    log = tmp_path / "server.log"
    # The grace period lets the server answer the "cancel" before the call is given up.
    async with _features(log, elicitation="run", call_timeout=2) as server:
        run: sm.AgentRun[Any] = sm.AgentRun(
            model=_calling("seat"), tools=server.tools, messages="seat", grace_period=30
        )
        events = run.events()
        result = await run.run()
        ended = [e.outcome async for e in events if isinstance(e, ToolAnswered)]
    assert ended == ["timed out"]
    assert result.final_text == "Tool seat timed out after 2 s"
    assert log.read_text(encoding="utf-8") == "seat: cancel\n"


@pytest.mark.timeout(60)
@_sync
async def test_an_aborted_run_answers_its_question_cancel(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    async with _features(log, elicitation="run") as server:
        run: sm.AgentRun[Any] = sm.AgentRun(
            model=_calling("seat"), tools=server.tools, messages="seat", grace_period=30
        )
        events = run.events()
        task = asyncio.ensure_future(run.run())
        (asked,) = await _asked(events)
        run.abort("the person left")
        result = await task
        ended = [e.outcome async for e in events if isinstance(e, ToolAnswered)]
    assert result.state is sm.TurnState.ABORTED
    assert ended == ["aborted"]
    assert log.read_text(encoding="utf-8") == "seat: cancel\n"
    with pytest.raises(NotPendingError):
        run.answer(asked.question.id, "cancel")


NESTED = {
    "type": "object",
    "properties": {"street": {"type": "object", "properties": {"name": {"type": "string"}}}},
}
BROKEN = {"type": "object", "properties": {"row": {"type": "integer", "minimum": "one"}}}
SEAT = {"type": "object", "properties": {"row": {"type": "integer"}}}


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("message", "schema", "refusal"),
    [
        ("Where?", NESTED, "requested schema is refused: property 'street' is not text"),
        ("Which?", BROKEN, "requested schema is refused: parameters is not a valid JSON"),
        ("Which? " * 2_000, SEAT, "an elicitation may hold at most 10000 characters"),
    ],
    ids=["nested", "not-a-schema", "too-long"],
)
@_sync
async def test_a_question_the_run_cannot_ask_is_refused_by_name(
    message: str, schema: dict[str, Any], refusal: str
) -> None:
    asking = MCPServer.stdio(
        sys.executable, [str(NOISY), "elicit"], stderr=DEVNULL, elicitation="run"
    )
    model = _calling("mangle", arguments={"message": message, "schema": schema})
    async with asking as server:
        run: sm.AgentRun[Any] = sm.AgentRun(model=model, tools=server.tools, messages="ask")
        events = run.events()
        result = await run.run()
        asked = [e async for e in events if isinstance(e, ToolAsked)]
    assert asked == []
    # The server is told why, and says what it was told.
    reply = json.loads(result.final_text)
    assert reply["code"] == -32600  # INVALID_REQUEST
    assert refusal in reply["message"], reply


@pytest.mark.timeout(60)
@_sync
async def test_an_older_servers_question_goes_to_its_call_in_flight() -> None:
    asking = MCPServer.stdio(
        sys.executable, [str(NOISY), "elicit"], stderr=DEVNULL, elicitation="run"
    )
    model = _calling("mangle", arguments={"message": "Which row?", "schema": SEAT})
    async with asking as server:
        run: sm.AgentRun[Any] = sm.AgentRun(model=model, tools=server.tools, messages="ask")
        events = run.events()
        task = asyncio.ensure_future(run.run())
        (asked,) = await _asked(events)
        assert (asked.question.call_id, asked.question.schema) == ("c0", SEAT)
        run.answer(asked.question.id, {"row": 7})
        result = await task
    assert json.loads(result.final_text) == {"action": "accept", "content": {"row": 7}}


@pytest.mark.timeout(60)
@_sync
async def test_a_run_holds_at_most_so_many_questions_pending() -> None:
    calls = MAX_PENDING_QUESTIONS + 1
    async with _features(elicitation="run", max_input_requests=calls) as server:
        run: sm.AgentRun[Any] = sm.AgentRun(
            model=_calling("seat", calls), tools=server.tools, messages="seats"
        )
        events = run.events()
        task = asyncio.ensure_future(run.run())
        asked, refused = [], None
        async for event in events:  # the questions asked, and the call refused its own
            asked += [event] if isinstance(event, ToolAsked) else []
            refused = event if isinstance(event, sm.ToolEnded) else refused
            if len(asked) == MAX_PENDING_QUESTIONS and refused is not None:
                break
        assert len(run.pending_questions()) == MAX_PENDING_QUESTIONS
        for event in asked:
            run.answer(event.question.id, {"row": 1})
        result = await task
    said = result.final_text.split(" | ")
    assert said.count("row 1") == MAX_PENDING_QUESTIONS
    (refused_said,) = [s for s in said if s != "row 1"]
    assert f"this run has {MAX_PENDING_QUESTIONS} questions pending already" in refused_said


@pytest.mark.timeout(60)
@_sync
async def test_a_question_outside_a_run_is_refused() -> None:
    async with _features(elicitation="run") as server:
        said = await _tool(server, "seat")
    assert said.startswith("error: ")
    assert "elicitation='run' answers only in a tool call of a run a person holds" in said
    with pytest.raises(sm.InvalidInputError, match='elicitation is a handler or "run"'):
        _features(elicitation="the run")

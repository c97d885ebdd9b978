"""Questions a running tool asks a person through its run (``statemachine.agent.questions``,
``AgentRun.pending_questions``/``answer``), without a server: a tool that asks as an MCP
server's elicitation does (tests/test_mcp_questions.py asks through real servers)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

import statemachine as sm
import statemachine.messages
from statemachine.agent.executor import IN_PROCESS, AsyncioExecutor, Operation
from statemachine.agent.questions import Answer, MakeQuestion
from statemachine.agent.run import use_backend
from statemachine.agent.running import ask_person
from statemachine.core.abort import AbortSignal
from statemachine.core.messages import ToolCall
from statemachine.hooks import MAX_PENDING_QUESTIONS, ToolAnswered, ToolAsked, ToolQuestion
from statemachine.testing import FunctionModel

ROW = {"type": "object", "properties": {"row": {"type": "integer"}}, "required": ["row"]}


async def _ask(arguments: dict[str, Any], signal: sm.AbortSignal) -> str:
    url = arguments.get("url")

    def question(question_id: str, call: sm.ToolCall) -> ToolQuestion:
        schema: Mapping[str, Any] = {} if url else ROW
        return ToolQuestion(question_id, call.id, call.name, "Which row?", schema, url, "test")

    answer = await ask_person(question, signal)
    return repr(answer)


def _asking(count: int = 1, timeout: float | None = None, **arguments: Any) -> dict[str, Any]:
    """A run's keywords: a model that calls ``ask`` ``count`` times at once, then says
    what the calls answered."""

    def model(messages: Any, tools: Any) -> sm.AssistantMessage:
        said = [m.text for m in messages if isinstance(m, sm.ToolResultMessage)]
        if said:
            return sm.AssistantMessage(" | ".join(said))
        calls = tuple(sm.ToolCall(f"c{i}", "ask", arguments) for i in range(count))
        return sm.AssistantMessage(calls, stop_reason=sm.messages.StopReason.TOOL_USE)

    tool = sm.Tool(sm.ToolDefinition("ask", "Ask a person."), _ask, timeout=timeout)
    return {"model": FunctionModel(model), "tools": [tool], "messages": "ask"}


async def _until_asked(
    run: sm.AgentRun[Any],
) -> tuple[tuple[ToolQuestion, ...], asyncio.Future[sm.RunResult]]:
    """Start ``run``; its first question once asked, and the run's task."""
    events = run.events()
    task = asyncio.ensure_future(run.run())
    async for event in events:
        if isinstance(event, ToolAsked):
            return (event.question,), task
    raise AssertionError("the run returned before its tool asked")


@pytest.mark.timeout(30)
def test_an_answer_from_another_thread_reaches_the_tool() -> None:
    async def scenario() -> tuple[sm.RunResult, list[Any]]:
        run: sm.AgentRun[Any] = sm.AgentRun(**_asking())
        events = run.events()
        task = asyncio.ensure_future(run.run())
        seen: list[Any] = []
        async for event in events:
            seen.append(event)
            if isinstance(event, ToolAsked):
                answering = threading.Thread(target=run.answer, args=("q1", {"row": 5}))
                answering.start()
                answering.join()
        return await task, seen

    result, seen = asyncio.run(scenario())
    assert result.final_text == "{'row': 5}"
    (asked,) = [e for e in seen if isinstance(e, ToolAsked)]
    (answered,) = [e for e in seen if isinstance(e, ToolAnswered)]
    assert asked.question == answered.question
    assert (answered.outcome, asked.question.call_id, asked.question.id) == ("accept", "c0", "q1")


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("answer", "refusal"),
    [
        ({"row": "two"}, r"question 'q1': answer\.row: 'two' is not of type 'integer'"),
        ({}, r"question 'q1': answer: 'row' is a required property"),
        ("maybe", "a mapping of the schema's fields"),
        ({1: 2}, "a mapping of the schema's fields"),
    ],
)
def test_an_answer_that_does_not_fit_is_refused_and_the_question_stays(
    answer: Any, refusal: str
) -> None:
    async def scenario() -> None:
        run: sm.AgentRun[Any] = sm.AgentRun(**_asking())
        (question,), task = await _until_asked(run)
        with pytest.raises(sm.InvalidInputError, match=refusal):
            run.answer(question.id, answer)
        assert run.pending_questions() == (question,)
        run.answer(question.id, "decline")
        result = await task
        assert result.final_text == "'decline'"

    asyncio.run(scenario())


@pytest.mark.timeout(30)
def test_a_url_question_is_accepted_with_nothing_else() -> None:
    async def scenario() -> str:
        run: sm.AgentRun[Any] = sm.AgentRun(**_asking(url="https://auth.example/start"))
        (question,), task = await _until_asked(run)
        assert question.url == "https://auth.example/start"
        with pytest.raises(sm.InvalidInputError, match="asks to open a URL"):
            run.answer(question.id, {"opened": True})
        run.answer(question.id, {})
        result = await task
        return result.final_text

    assert asyncio.run(scenario()) == "{}"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("abort", [False, True])
def test_a_question_nobody_answers_ends_with_its_call_answered_cancel(abort: bool) -> None:
    async def scenario() -> tuple[sm.RunResult, list[ToolAnswered]]:
        run: sm.AgentRun[Any] = sm.AgentRun(
            **_asking(timeout=None if abort else 0.5), grace_period=5
        )
        events = run.events()
        task = asyncio.ensure_future(run.run())
        answered: list[ToolAnswered] = []
        async for event in events:
            if isinstance(event, ToolAsked) and abort:
                run.abort("the person left")
            if isinstance(event, ToolAnswered):
                answered.append(event)
        return await task, answered

    result, answered = asyncio.run(scenario())
    assert [a.outcome for a in answered] == ["aborted" if abort else "timed out"]
    if abort:
        assert result.state is sm.TurnState.ABORTED
        # The tool heard "cancel" and answered within the grace period: kept (I6).
        assert [m.text for m in result.messages if m.role == "toolResult"] == ["'cancel'"]
    else:
        assert result.final_text == "Tool ask timed out after 0.5 s"


@pytest.mark.timeout(30)
def test_a_run_its_caller_cancels_answers_its_question_aborted() -> None:
    async def scenario() -> tuple[list[str], tuple[ToolQuestion, ...]]:
        run: sm.AgentRun[Any] = sm.AgentRun(**_asking(), grace_period=0)
        events = run.events()
        task = asyncio.ensure_future(run.run())
        outcomes = []
        async for event in events:
            if isinstance(event, ToolAsked):
                task.cancel()  # the caller gives up on run(): the run is aborted
            if isinstance(event, ToolAnswered):
                outcomes.append(event.outcome)
        with pytest.raises(asyncio.CancelledError):
            await task
        return outcomes, run.pending_questions()

    assert asyncio.run(scenario()) == (["aborted"], ())


async def _ask_briefly(arguments: dict[str, Any], signal: sm.AbortSignal) -> str:
    def question(question_id: str, call: sm.ToolCall) -> ToolQuestion:
        return ToolQuestion(question_id, call.id, call.name, "Quick?", ROW)

    try:
        return repr(await asyncio.wait_for(ask_person(question, signal), 0.2))
    except TimeoutError:
        return "nobody answered"


@pytest.mark.timeout(30)
def test_a_question_its_tool_stops_waiting_for_ends_cancelled() -> None:
    async def scenario() -> tuple[str, list[str], tuple[ToolQuestion, ...]]:
        keywords = _asking()
        keywords["tools"] = [sm.Tool(sm.ToolDefinition("ask", "Ask briefly."), _ask_briefly)]
        run: sm.AgentRun[Any] = sm.AgentRun(**keywords)
        events = run.events()
        result = await run.run()
        outcomes = [e.outcome async for e in events if isinstance(e, ToolAnswered)]
        return result.final_text, outcomes, run.pending_questions()

    assert asyncio.run(scenario()) == ("nobody answered", ["cancelled"], ())


@pytest.mark.timeout(30)
def test_a_run_holds_at_most_so_many_questions_and_refuses_the_next() -> None:
    async def scenario() -> sm.RunResult:
        calls = MAX_PENDING_QUESTIONS + 2
        run: sm.AgentRun[Any] = sm.AgentRun(**_asking(calls))
        events = run.events()
        task = asyncio.ensure_future(run.run())
        asked, refused = [], 0
        async for event in events:  # the questions asked, and the calls refused theirs
            asked += [event.question] if isinstance(event, ToolAsked) else []
            refused += isinstance(event, sm.ToolEnded)
            if len(asked) == MAX_PENDING_QUESTIONS and refused == 2:
                break
        assert run.pending_questions() == tuple(asked)
        for question in asked:
            run.answer(question.id, {"row": 1})
        return await task

    said = asyncio.run(scenario()).final_text.split(" | ")
    assert said.count("{'row': 1}") == MAX_PENDING_QUESTIONS
    refused = [s for s in said if s != "{'row': 1}"]
    assert len(refused) == 2
    assert all("questions pending already (MAX_PENDING_QUESTIONS)" in s for s in refused)


@pytest.mark.timeout(30)
def test_asking_outside_a_run_gives_none() -> None:
    def question(question_id: str, call: sm.ToolCall) -> ToolQuestion:
        raise AssertionError("not asked")

    assert asyncio.run(ask_person(question, sm.AbortController().signal)) is None


@pytest.mark.timeout(30)
def test_a_temporal_activity_has_no_one_to_ask() -> None:
    pytest.importorskip("temporalio", reason="the [temporal] extra is not installed")
    from statemachine.agent.options import DEFAULTS
    from statemachine.durable.temporal._activities import _InActivity, _OneOperation

    async def scenario() -> list[Any]:
        loop = _OneOperation("r1")
        (tool,) = _asking()["tools"]
        executor = AsyncioExecutor(
            loop,  # type: ignore[arg-type]  # what an activity gives for one operation
            model=FunctionModel(lambda m, t: sm.AssistantMessage("-")),
            tools={"ask": tool},
            hooks=DEFAULTS,
            grace=1.0,
            backend=_InActivity(),
        )
        await executor.run_tool(sm.ToolCall("c1", "ask", {}))
        return loop.events

    (finished,) = asyncio.run(scenario())
    assert finished.output.content[0].text == "None"  # asked nobody: the tool is told so


class _NoOneToAsk:
    """``run_agent``'s backend, but no one to ask (as a durable backend's today)."""

    def start(self, driver: AsyncioExecutor, op: Operation) -> None:
        IN_PROCESS.start(driver, op)

    def cancel(self, driver: AsyncioExecutor, keys: Sequence[str], reason: str) -> None:
        IN_PROCESS.cancel(driver, keys, reason)

    def reported(self, key: str) -> None:
        IN_PROCESS.reported(key)

    async def ask(
        self, driver: AsyncioExecutor, call: ToolCall, make: MakeQuestion, signal: AbortSignal
    ) -> Answer | None:
        return None


@pytest.mark.timeout(30)
def test_a_backend_with_no_one_to_ask_tells_the_tool_so_and_nothing_is_pending() -> None:
    async def scenario() -> tuple[sm.RunResult, tuple[ToolQuestion, ...]]:
        run: sm.AgentRun[Any] = sm.AgentRun(**_asking())
        use_backend(run, inbox=asyncio.Queue(), backend=_NoOneToAsk())
        result = await run.run()
        return result, run.pending_questions()

    result, pending = asyncio.run(scenario())
    assert pending == ()
    assert result.final_text == "None"  # asked nobody: the tool is told so

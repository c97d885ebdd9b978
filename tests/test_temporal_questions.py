"""A running tool's question to a person (an MCP server's elicitation,
``MCPServer(elicitation="run")``) in a durable run on Temporal: pending on the run's
workflow, seen and answered from any handle, checked as ``AgentRun.answer`` checks,
"cancel" once its call ends, and kept in the run's history so that a worker killed
while it waits, or after it was answered, loses nothing (tests/temporal_worker.py's
"asking" mode is the killed worker; the session's dev server is
temporal_support.temporal_address). What every backend shares (a question answered from
another handle, its call's timeout, an abort) is held in test_durable_questions.py."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from temporal_support import temporal_server  # noqa: F401 - the session's server
from temporal_worker import ROW, ask_row, asking
from temporalio.exceptions import ApplicationError
from test_mcp import DEVNULL
from test_temporal_kill import Trials

import statemachine as sm
from statemachine.core.tools import ToolDefinition
from statemachine.core.wire import messages_from_dicts
from statemachine.durable._wire import question_to_dict
from statemachine.durable.temporal import TemporalRunHandle, TemporalRunner
from statemachine.durable.temporal._questions import MAX_KEPT_ANSWERS, WorkflowQuestions
from statemachine.errors import InvalidInputError, NotPendingError
from statemachine.hooks import MAX_PENDING_QUESTIONS, ToolQuestion
from statemachine.mcp import MCPServer
from statemachine.testing import FunctionModel

FEATURES = Path(__file__).resolve().parent / "mcp_servers" / "features.py"


def _features(log: Path | None = None, **options: Any) -> MCPServer:
    env = {"MCP_TEST_LOG": str(log)} if log else {}
    return MCPServer.stdio(
        sys.executable, [str(FEATURES), "stdio"], env=env, stderr=DEVNULL, **options
    )


def _calling(name: str, count: int = 1) -> FunctionModel:
    """Calls ``name`` ``count`` times at once, then answers with what the calls said."""

    def model(messages: Sequence[sm.Message], tools: Sequence[ToolDefinition]) -> Any:
        said = [m.text for m in messages if isinstance(m, sm.ToolResultMessage)]
        if said:
            return sm.AssistantMessage(" | ".join(said))
        calls = tuple(sm.ToolCall(f"c{i}", name, {}) for i in range(count))
        return sm.AssistantMessage(calls, stop_reason=sm.messages.StopReason.TOOL_USE)

    return FunctionModel(model)


@asynccontextmanager
async def _runner(address: str, tools: Sequence[sm.Tool], **options: Any) -> AsyncIterator[Any]:
    """A worker with ``tools``, the models "seat" (calls "seat") and "asking"."""
    from temporalio.client import Client

    client = await Client.connect(address)
    models = {"seat": _calling("seat"), "asking": FunctionModel(asking)}
    models.update(options.pop("models", {}))
    runner = TemporalRunner(
        client,
        models=models,
        tools=tools,
        task_queue=f"q-{uuid.uuid4().hex[:8]}",
        heartbeat=1.0,
        **options,
    )
    async with runner:
        yield runner


async def _asked(handle: TemporalRunHandle, count: int = 1) -> tuple[ToolQuestion, ...]:
    """The run's pending questions, once there are ``count``."""
    async with asyncio.timeout(30):
        while True:
            questions = await handle.pending_questions()
            if len(questions) >= count:
                return questions
            await asyncio.sleep(0.05)


async def _asking(runner: TemporalRunner) -> tuple[TemporalRunHandle, ToolQuestion]:
    """A run of the "asking" model (one call of ``ask_row``), and its question."""
    handle = await runner.start(f"q-{uuid.uuid4().hex[:6]}", model="asking", messages="ask")
    (question,) = await _asked(handle)
    return handle, question


def _sync(test: Callable[..., Any]) -> Callable[..., None]:
    import functools

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


@pytest.mark.timeout(90)
@_sync
async def test_an_answer_is_checked_against_the_schema_and_a_stale_id_is_refused(
    temporal_address: str,
) -> None:
    async with _runner(temporal_address, [ask_row]) as runner:
        handle, question = await _asking(runner)
        assert (question.id, dict(question.schema)) == ("a1:1", ROW)
        with pytest.raises(InvalidInputError, match=r"answer\.row: 'three' is not of type"):
            await handle.answer(question.id, {"row": "three"})
        with pytest.raises(InvalidInputError, match="an answer is a mapping"):
            await handle.answer(question.id, "maybe")  # type: ignore[arg-type]
        with pytest.raises(NotPendingError, match="no question 'a1:2' is pending"):
            await handle.answer("a1:2", {"row": 1})
        assert await handle.pending_questions() == (question,)  # refused: nothing changed
        await handle.answer(question.id, {"row": 4})
        with pytest.raises(NotPendingError, match="no question 'a1:1' is pending"):
            await handle.answer(question.id, {"row": 5})  # answered already
        result = await handle.result(timeout=60)
        with pytest.raises(NotPendingError):
            await handle.answer(question.id, "cancel")  # the run has ended
        # Its history, with the question and the answers, replays on this code.
        history = await runner.client.get_workflow_handle(handle.run_id).fetch_history()
        await runner.replay([history])
    assert result.final_text == 'got {"row": 4}'


@pytest.mark.timeout(90)
@_sync
async def test_a_call_waiting_longer_than_its_heartbeat_timeout_runs_once_and_may_be_declined(
    temporal_address: str,
) -> None:
    from temporalio.api.enums.v1 import EventType

    async with _runner(temporal_address, [ask_row]) as runner:
        handle, question = await _asking(runner)
        await asyncio.sleep(3.0)  # three heartbeat timeouts: the waiting call heartbeats
        assert await handle.pending_questions() == (question,)
        await handle.answer(question.id, "decline")
        result = await handle.result(timeout=60)
        history = await runner.client.get_workflow_handle(handle.run_id).fetch_history()
    assert result.final_text == 'got "decline"'
    attempts = [
        e.activity_task_started_event_attributes.attempt
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
    ]
    assert attempts == [1, 1, 1]  # the model, the tool, the model: none retried


async def _ask_long(arguments: dict[str, Any], signal: sm.AbortSignal) -> str:
    from statemachine.agent.running import ask_person

    def question(question_id: str, call: sm.ToolCall) -> ToolQuestion:
        return ToolQuestion(question_id, call.id, call.name, "Which? " * 20_000, ROW)

    return repr(await ask_person(question, signal))


@pytest.mark.timeout(90)
@_sync
async def test_a_question_or_an_answer_too_long_for_the_history_is_refused(
    temporal_address: str,
) -> None:
    long_ask = sm.Tool(sm.ToolDefinition("ask_row", "Ask at length."), _ask_long)
    async with _runner(temporal_address, [long_ask]) as runner:
        handle = await runner.start(f"q-{uuid.uuid4().hex[:6]}", model="asking", messages="ask")
        result = await handle.result(timeout=60)
    assert "a question is at most 100000 characters of JSON" in result.final_text
    async with _runner(temporal_address, [ask_row]) as runner:
        handle, question = await _asking(runner)
        with pytest.raises(InvalidInputError, match="an answer is at most 100000 characters"):
            await handle.answer(question.id, {"row": "9" * 100_000})
        await handle.answer(question.id, {"row": 9})
        result = await handle.result(timeout=60)
    assert result.final_text == 'got {"row": 9}'


@pytest.mark.timeout(120)
@_sync
async def test_a_run_holds_at_most_so_many_questions_pending(temporal_address: str) -> None:
    calls = MAX_PENDING_QUESTIONS + 1
    many = FunctionModel(_many_asks(calls))
    async with _runner(temporal_address, [ask_row], models={"many": many}) as runner:
        handle = await runner.start(f"q-{uuid.uuid4().hex[:6]}", model="many", messages="ask")
        asked = await _asked(handle, MAX_PENDING_QUESTIONS)
        assert len(asked) == MAX_PENDING_QUESTIONS
        for question in asked:
            await handle.answer(question.id, {"row": 1})
        result = await handle.result(timeout=60)
    said = result.final_text.split(" | ")
    assert said.count('got {"row": 1}') == MAX_PENDING_QUESTIONS
    (refused,) = [s for s in said if s != 'got {"row": 1}']
    assert f"this run has {MAX_PENDING_QUESTIONS} questions pending already" in refused


def _many_asks(count: int) -> Callable[..., sm.AssistantMessage]:
    def model(messages: Sequence[sm.Message], tools: Sequence[ToolDefinition]) -> Any:
        said = [m.text for m in messages if isinstance(m, sm.ToolResultMessage)]
        if said:
            return sm.AssistantMessage(" | ".join(said))
        calls = tuple(sm.ToolCall(f"a{i}", "ask_row", {}) for i in range(count))
        return sm.AssistantMessage(calls, stop_reason=sm.messages.StopReason.TOOL_USE)

    return model


# -- a worker killed while a question waits, or after its answer ---------------------------


async def _killed_worker_trial(address: str, tmp: Path, kill_after_answer: bool) -> Trials:
    """One "asking" run: its worker killed while the question waits (then the answer),
    or once the tool has its answer (the answer first); the next worker finishes it."""
    from temporalio.client import Client

    trials = Trials(address, tmp, "asking", 1)
    try:
        client = await Client.connect(address)
        handle = TemporalRunHandle(client, trials.run_id)
        async with asyncio.timeout(60):
            while not trials.lines():  # the run's workflow exists once the tool began
                await asyncio.sleep(0.02)
        (question,) = await _asked(handle)
        if kill_after_answer:
            await handle.answer(question.id, {"row": 3})
            await trials.kill_when(lambda lines, pid: ["got", "a1", str(pid)] in _head(lines))
        else:
            await trials.kill_when(lambda lines, pid: True)
            await handle.answer(question.id, {"row": 3})
        await trials.finished()
    finally:
        trials.close()
    return trials


def _final_text(trials: Trials) -> str:
    """The final text of the result the last worker wrote."""
    messages = messages_from_dicts(json.loads(trials.out.read_text())["messages"])
    last = messages[-1]
    assert isinstance(last, sm.AssistantMessage)
    return last.text


def _head(lines: list[list[str]]) -> list[list[str]]:
    return [line[:3] for line in lines]


@pytest.mark.timeout(180)
def test_a_worker_killed_while_a_question_is_pending_and_a_new_worker_takes_the_answer(
    temporal_address: str, tmp_path: Path
) -> None:
    trials = asyncio.run(_killed_worker_trial(temporal_address, tmp_path, False))
    assert _final_text(trials) == 'got {"row": 3}'
    lines = _head(trials.lines())
    (killed,) = [str(pid) for pid in trials.killed]
    assert ["asked", "a1", killed] in lines  # the killed worker's tool asked ...
    assert ["got", "a1", killed] not in lines  # ... and never had the answer
    assert [line[0] for line in lines if line[2] != killed] == ["asked", "got", "end"]


@pytest.mark.timeout(180)
def test_an_answer_recorded_before_the_worker_is_killed_reaches_the_retried_call(
    temporal_address: str, tmp_path: Path
) -> None:
    trials = asyncio.run(_killed_worker_trial(temporal_address, tmp_path, True))
    assert _final_text(trials) == 'got {"row": 3}'
    lines = _head(trials.lines())
    (killed,) = [str(pid) for pid in trials.killed]
    assert [line[0] for line in lines if line[2] == killed] == ["asked", "got"]
    # The retried call asked the same question and had its recorded answer, with no
    # person answering again (the test answered once).
    assert [line[0] for line in lines if line[2] != killed] == ["asked", "got", "end"]


# -- what the run's workflow holds -------------------------------------------------------


def _question(question_id: str, message: str = "Which row?") -> dict[str, Any]:
    call_id = question_id.rpartition(":")[0]
    return question_to_dict(ToolQuestion(question_id, call_id, "ask_row", message, ROW))


def test_the_workflow_drops_a_finished_calls_questions_and_keeps_so_many_answers() -> None:
    held = WorkflowQuestions()
    assert held.ask(_question("c1:1")) is None
    held.answer("c1:1", {"row": 1})
    assert held.ask(_question("c1:1")) == {"answer": {"row": 1}}  # a retry: at once
    assert held.ask(_question("c2:1")) is None
    held.call_ended("c1")
    assert (list(held.pending), list(held.answers)) == (["c2:1"], [])
    for n in range(1, MAX_KEPT_ANSWERS + 6):
        held.ask(_question(f"c3:{n}"))
        held.answer(f"c3:{n}", {"row": n})
    assert len(held.answers) == MAX_KEPT_ANSWERS
    assert held.answer_of("c3:1") is None  # the oldest went: a retry asks it anew
    assert held.ask(_question("c3:1")) is None
    assert held.answer_of("c3:6") == {"answer": {"row": 6}}
    # Another question under a recorded answer's id is asked anew.
    assert held.ask(_question("c3:6", "Which seat?")) is None
    assert held.answer_of("c3:6") == {}


def test_the_workflow_refuses_a_question_past_the_limit_or_not_of_its_call() -> None:
    held = WorkflowQuestions()
    for n in range(1, MAX_PENDING_QUESTIONS + 1):
        held.check_ask(_question(f"c{n}:1"), running=True)
        held.ask(_question(f"c{n}:1"))
    with pytest.raises(ApplicationError, match="8 questions pending already") as refused:
        held.check_ask(_question("c9:1"), running=True)
    assert refused.value.type == "InvalidInputError"
    held.check_ask(_question("c1:1"), running=True)  # asked again by a retry: taken
    with pytest.raises(ApplicationError, match="not running"):
        held.check_ask(_question("c1:1"), running=False)
    with pytest.raises(ApplicationError, match="a question's id is its call's"):
        held.check_ask({**_question("c1:1"), "call_id": "c2"}, running=True)
    with pytest.raises(ApplicationError, match="at most 100000 characters"):
        held.check_ask(_question("c1:1", "x" * 100_000), running=True)

"""A durable run's tool asks a person (an MCP server's elicitation,
``MCPServer(elicitation="run")``): the question is published for any process
(``RunHandle.pending_questions``), answered from any handle (``RunHandle.answer``,
checked against its schema), ended "cancel" by its call's timeout or an abort, and
kept through kill -9: a question pending when its worker died is answered after the
restart, and an answer recorded before the death is given back to the call that
runs again, without a person.

The contract's cases run once per backend of ``QUESTION_BACKENDS``, through
test_durable_shared's ``Engine``; the kills here use DBOS worker processes
(tests/durable_worker.py, mode "asking"; Temporal's are in test_temporal_questions.py);
the MCP cases a real server process (tests/mcp_servers/features.py).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from durable_worker import (
    ANSWERS,
    asking_tool,
    asks,
    kill,
    log_lines,
    replays_to,
    start_worker,
    wait_for_log,
)
from test_durable_shared import Engine, engine_of
from test_mcp_questions import _calling, _features

if importlib.util.find_spec("temporalio") is not None or os.environ.get("CI") == "true":
    from temporal_support import temporal_server  # noqa: F401 - the session's server

import statemachine as sm
from statemachine.durable import BACKENDS, RunHandle, open_store
from statemachine.errors import InvalidInputError, NotPendingError, UnknownRunError
from statemachine.hooks import ToolQuestion
from statemachine.testing import FunctionModel

T = TypeVar("T")
QUESTION_BACKENDS = sorted(BACKENDS)  # every backend answers questions


@pytest.fixture(params=QUESTION_BACKENDS)
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Engine:
    """Each backend in turn (test_durable_shared's ``engine``, for these backends)."""
    return engine_of(request, tmp_path)


ASKING: dict[str, Any] = {"models": {"scripted": FunctionModel(asks)}, "tools": [asking_tool()]}


async def _question(handle: RunHandle, timeout: float = 30) -> ToolQuestion:
    """The run's one pending question, once it is published."""
    async with asyncio.timeout(timeout):
        while True:
            pending = await handle.pending_questions()
            if pending:
                (question,) = pending
                return question
            await asyncio.sleep(0.05)


@pytest.mark.timeout(90)
def test_a_question_is_published_and_answered_from_another_handle(engine: Engine) -> None:
    async def body(runner: Any) -> sm.RunResult:
        handle = await runner.start("asked", model="scripted", messages="go")
        question = await _question(handle)
        assert (question.id, question.call_id, question.tool_name, question.message) == (
            "c0:1",
            "c0",
            "ask",
            "Which row?",
        )
        other = await runner.handle("asked")
        assert await other.pending_questions() == (question,)
        await other.answer(question.id, {"row": 3})
        result: sm.RunResult = await handle.result(timeout=60)
        assert await handle.pending_questions() == ()
        return result

    ANSWERS.clear()
    result = engine.run(body, **ASKING)
    assert result.state is sm.TurnState.DONE
    assert result.final_text == "answered: {'row': 3}"
    assert ANSWERS == [{"row": 3}]


@pytest.mark.timeout(90)
def test_an_answer_is_checked_against_its_schema_and_a_stale_id_is_refused(
    engine: Engine, tmp_path: Path
) -> None:
    async def body(runner: Any) -> sm.RunResult:
        handle = await runner.start("checked", model="scripted", messages="go")
        question = await _question(handle)
        with pytest.raises(InvalidInputError, match=r"answer\.row: 'three' is not of type"):
            await handle.answer(question.id, {"row": "three"})
        with pytest.raises(InvalidInputError, match='"decline" or "cancel"'):
            await handle.answer(question.id, "maybe")
        assert await handle.pending_questions() == (question,)  # nothing changed
        with pytest.raises(NotPendingError, match="no question 'c9:1' is pending"):
            await handle.answer("c9:1", {"row": 3})
        await handle.answer(question.id, "decline")
        result: sm.RunResult = await handle.result(timeout=60)
        with pytest.raises(NotPendingError, match="no question 'c0:1' is pending"):
            await handle.answer(question.id, {"row": 4})  # answered, and the run ended
        await runner.export_journal("checked", tmp_path / "checked.jsonl")
        return result

    result = engine.run(body, **ASKING)
    assert result.final_text == "answered: 'decline'"
    replays_to(tmp_path / "checked.jsonl", result)  # the export replays a run that asked


def _seat_run(
    engine: Engine,
    log: Path,
    act: Callable[[RunHandle, ToolQuestion], Awaitable[None]],
    **options: Any,
) -> sm.RunResult:
    """A durable run of the features server's ``seat`` (a real server process, its
    answers logged to ``log``), started, then ``act(handle, question)`` once its
    question is pending; the run's result."""

    async def go() -> sm.RunResult:
        async with _features(log, elicitation="run", **options) as server:
            models = {"scripted": _calling("seat")}
            async with engine.runner(models=models, tools=server.tools) as runner:
                run_id = f"seated-{uuid.uuid4().hex[:8]}"  # the Temporal server is the session's
                handle = await runner.start(run_id, model="scripted", messages="seat")
                question = await _question(handle)
                assert (question.id, question.source) == ("c0:1", server.name)
                await act(handle, question)
                result: sm.RunResult = await handle.result(timeout=60)
                assert await handle.pending_questions() == ()
                with pytest.raises(NotPendingError):
                    await handle.answer(question.id, {"row": 1})
                return result

    return asyncio.run(go())


@pytest.mark.timeout(90)
def test_a_question_nobody_answers_ends_with_its_calls_timeout_and_the_server_hears_cancel(
    engine: Engine, tmp_path: Path
) -> None:
    async def wait(handle: RunHandle, question: ToolQuestion) -> None:
        """Nobody answers."""

    result = _seat_run(engine, tmp_path / "server.log", wait, call_timeout=2)
    assert result.final_text == "Tool seat timed out after 2 s"
    assert (tmp_path / "server.log").read_text(encoding="utf-8") == "seat: cancel\n"


@pytest.mark.timeout(90)
def test_an_abort_while_a_question_is_pending_ends_the_run_aborted(
    engine: Engine, tmp_path: Path
) -> None:
    async def abort(handle: RunHandle, question: ToolQuestion) -> None:
        await handle.abort("nobody is there")

    result = _seat_run(engine, tmp_path / "server.log", abort)
    assert result.state is sm.TurnState.ABORTED
    assert (tmp_path / "server.log").read_text(encoding="utf-8") == "seat: cancel\n"


@pytest.mark.timeout(90)
def test_a_real_servers_question_is_answered_through_a_durable_run(
    engine: Engine, tmp_path: Path
) -> None:
    async def answer(handle: RunHandle, question: ToolQuestion) -> None:
        assert question.schema["properties"]["row"]["type"] == "integer"
        await handle.answer(question.id, {"row": 7})

    result = _seat_run(engine, tmp_path / "server.log", answer)
    assert result.final_text == "row 7"
    assert (tmp_path / "server.log").read_text(encoding="utf-8") == "seat: row 7\n"


# -- kill -9 (DBOS worker processes) ------------------------------------------------------------


def _with_handle(db: str, run_id: str, act: Callable[[RunHandle], Awaitable[T]]) -> T:
    """``act(handle)`` with a handle of ``run_id`` from a process that is not its
    worker, once the run exists."""

    async def go() -> T:
        store = open_store("dbos", db)
        try:
            async with asyncio.timeout(60):
                while True:
                    try:
                        handle = await store.handle(run_id)
                        break
                    except UnknownRunError:
                        await asyncio.sleep(0.05)
            return await act(handle)
        finally:
            store.close()

    return asyncio.run(go())


def _final_text(out: Path) -> str:
    final = json.loads(out.read_text())["messages"][-1]
    return str(final["content"][0]["text"])


@pytest.mark.timeout(180)
def test_a_question_pending_when_its_worker_is_killed_is_answered_after_the_restart(
    tmp_path: Path,
) -> None:
    pytest.importorskip("dbos")
    db, out, log = f"sqlite:///{tmp_path}/runs.sqlite", tmp_path / "out.json", tmp_path / "log"
    first = start_worker(db, "asked", out, log, "asking")
    again = None
    try:
        wait_for_log(log, 1, first)  # the tool started: the database is set up
        asked = _with_handle(db, "asked", _question)
        kill(first)
        again = start_worker(db, "asked", out, log, "asking")
        wait_for_log(log, 2, again)  # the tool runs again, and asks again

        async def answer(handle: RunHandle) -> None:
            assert await _question(handle) == asked  # the same question, the same id
            await handle.answer(asked.id, {"row": 3})

        _with_handle(db, "asked", answer)
        assert again.wait(timeout=120) == 0
    finally:
        kill(first)
        if again is not None:
            kill(again)
    assert _final_text(out) == "answered: {'row': 3}"
    assert [line[:2] for line in log_lines(log)] == [
        ["start", "c0"],
        ["start", "c0"],
        ["answered", "c0"],
        ["end", "c0"],
    ]


@pytest.mark.timeout(180)
def test_an_answer_recorded_before_a_kill_is_given_to_the_rerun_without_a_person(
    tmp_path: Path,
) -> None:
    pytest.importorskip("dbos")
    db, out, log = f"sqlite:///{tmp_path}/runs.sqlite", tmp_path / "out.json", tmp_path / "log"
    gate = tmp_path / "gate"  # the tool waits here after its answer, until the restart
    first = start_worker(db, "kept", out, log, "asking", DURABLE_GATE=str(gate))
    again = None
    try:
        wait_for_log(log, 1, first)  # the tool started: the database is set up

        async def answer(handle: RunHandle) -> None:
            await handle.answer((await _question(handle)).id, {"row": 5})

        _with_handle(db, "kept", answer)
        wait_for_log(log, 2, first)  # answered: the run recorded the answer first
        kill(first)
        gate.touch()
        again = start_worker(db, "kept", out, log, "asking", DURABLE_GATE=str(gate))
        assert again.wait(timeout=60) == 0  # nobody answers again
    finally:
        kill(first)
        if again is not None:
            kill(again)
    assert _final_text(out) == "answered: {'row': 5}"
    lines = log_lines(log)
    assert [line[:2] for line in lines] == [
        ["start", "c0"],
        ["answered", "c0"],
        ["start", "c0"],
        ["answered", "c0"],
        ["end", "c0"],
    ]
    assert lines[0][2] != lines[2][2]  # the call ran again, in the second worker


# -- what a run takes from outside: bounded and checked -----------------------------------------

ROW_SCHEMA = {"type": "object", "properties": {"row": {"type": "integer"}}, "required": ["row"]}


def _row_question(message: str = "Which row?") -> ToolQuestion:
    return ToolQuestion("c0:1", "c0", "ask", message, ROW_SCHEMA, None, "test")


def test_a_recorded_answer_is_given_back_only_to_the_same_question() -> None:
    from statemachine.durable._questions import DurableQuestions, answer_message

    asked = _row_question()
    places = [{"at": 3, "message": answer_message(asked, {"row": 2})}]
    questions = DurableQuestions(places, None)
    assert questions.recorded(asked) == {"row": 2}
    assert questions.recorded(_row_question("Which seat?")) is None  # asked anew
    other_id = ToolQuestion("c0:2", "c0", "ask", "Which row?", ROW_SCHEMA, None, "test")
    assert questions.recorded(other_id) is None
    # A record whose answer does not fit the question's schema is no answer to it.
    broken = {**answer_message(asked, {"row": 2}), "answer": {"row": "two"}}
    assert DurableQuestions([{"at": 3, "message": broken}], None).recorded(asked) is None


def test_an_answer_and_a_question_are_bounded() -> None:
    from statemachine.durable._questions import MAX_QUESTION_JSON, DurableQuestions, answer_message

    free = ToolQuestion("c0:1", "c0", "ask", "Say", {"type": "object"}, None, "test")
    with pytest.raises(InvalidInputError, match=f"at most {MAX_QUESTION_JSON} characters"):
        answer_message(free, {"text": "x" * MAX_QUESTION_JSON})
    huge = ToolQuestion("c0:1", "c0", "ask", "x" * MAX_QUESTION_JSON, {}, None, "test")
    call = sm.ToolCall("c0", "ask", {})
    no_run: Any = None  # refused before the run is reached
    asking = DurableQuestions([], None).ask(
        no_run,
        call,
        lambda question_id: huge,
        sm.AbortController().signal,
    )
    with pytest.raises(InvalidInputError, match=f"at most {MAX_QUESTION_JSON} characters"):
        asyncio.run(asking)


def test_published_questions_are_read_bounded_and_malformed_ones_are_skipped() -> None:
    from statemachine.agent.questions import MAX_PENDING_QUESTIONS
    from statemachine.durable._questions import questions_from_published
    from statemachine.durable._wire import question_to_dict

    good = question_to_dict(_row_question())
    published = [{"id": 1}, "junk", {**good, "schema": "none"}, {**good, "url": 5}]
    published += [good] * (MAX_PENDING_QUESTIONS + 3)
    read = questions_from_published(published)
    assert read == (_row_question(),) * (MAX_PENDING_QUESTIONS - 4)
    assert questions_from_published({"not": "a list"}) == ()


def test_an_answer_taken_before_its_question_is_asked_again_is_kept_for_it() -> None:
    from statemachine.agent.questions import MAX_PENDING_QUESTIONS
    from statemachine.durable._questions import DurableQuestions, answer_message

    asked = _row_question()
    questions = DurableQuestions([], None)
    questions.take({"kind": "answer", "answer": {"row": 1}})  # names no question: dropped
    questions.take(answer_message(asked, {"row": 4}))  # the call has not asked again yet
    assert questions.recorded(asked) == {"row": 4}
    # Only the last MAX_PENDING_QUESTIONS such answers are kept.
    for n in range(MAX_PENDING_QUESTIONS):
        other = ToolQuestion(f"c{n + 1}:1", f"c{n + 1}", "ask", "Which row?", ROW_SCHEMA)
        questions.take(answer_message(other, {"row": n}))
    assert questions.recorded(asked) is None

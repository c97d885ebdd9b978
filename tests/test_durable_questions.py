"""A durable run's tool asks a person (an MCP server's elicitation,
``MCPServer(elicitation="run")``): the question is published for any process
(``RunHandle.pending_questions``), answered from any handle (``RunHandle.answer``,
checked against its schema), ended "cancel" by its call's timeout or an abort, and
kept through kill -9: a question pending when its worker died is answered after the
restart, and an answer recorded before the death is given back to the call that
runs again, without a person.

The contract's cases run once per backend of ``QUESTION_BACKENDS``, through
test_durable_shared's ``Engine``; the kills use DBOS worker processes
(tests/durable_worker.py, mode "asking"); the MCP cases a real server process
(tests/mcp_servers/features.py).
"""

from __future__ import annotations

import asyncio
import json
import os
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
from test_durable_shared import EXTRAS, Engine
from test_mcp_questions import _calling, _features

import statemachine as sm
from statemachine.durable import RunHandle, open_store
from statemachine.errors import InvalidInputError, NotPendingError, UnknownRunError
from statemachine.hooks import ToolQuestion
from statemachine.testing import FunctionModel

T = TypeVar("T")
QUESTION_BACKENDS = ["dbos"]  # the backends whose handles answer questions


@pytest.fixture(params=QUESTION_BACKENDS)
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Engine:
    """Each backend in turn (test_durable_shared's ``engine``, for these backends)."""
    name = str(request.param)
    if os.environ.get("CI") != "true":
        pytest.importorskip(EXTRAS[name])
    address = str(request.getfixturevalue("temporal_address")) if name == "temporal" else ""
    return Engine(name, tmp_path, address)


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
            await handle.answer(question.id, "maybe")  # type: ignore[arg-type]
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


@pytest.mark.timeout(90)
def test_a_question_nobody_answers_ends_with_its_calls_timeout_and_the_server_hears_cancel(
    engine: Engine, tmp_path: Path
) -> None:
    log = tmp_path / "server.log"

    async def go() -> sm.RunResult:
        async with _features(log, elicitation="run", call_timeout=2) as server:
            models = {"scripted": _calling("seat")}
            async with engine.runner(models=models, tools=server.tools) as runner:
                handle = await runner.start("late", model="scripted", messages="seat")
                question = await _question(handle)
                assert (question.id, question.source) == ("c0:1", server.name)
                result = await handle.result(timeout=60)
                assert await handle.pending_questions() == ()
                return result

    result = asyncio.run(go())
    assert result.final_text == "Tool seat timed out after 2 s"
    assert log.read_text(encoding="utf-8") == "seat: cancel\n"


@pytest.mark.timeout(90)
def test_an_abort_while_a_question_is_pending_ends_the_run_aborted(
    engine: Engine, tmp_path: Path
) -> None:
    log = tmp_path / "server.log"

    async def go() -> sm.RunResult:
        async with _features(log, elicitation="run") as server:
            models = {"scripted": _calling("seat")}
            async with engine.runner(models=models, tools=server.tools) as runner:
                handle = await runner.start("stopped", model="scripted", messages="seat")
                question = await _question(handle)
                await handle.abort("nobody is there")
                result = await handle.result(timeout=60)
                with pytest.raises(NotPendingError):
                    await handle.answer(question.id, {"row": 1})
                return result

    result = asyncio.run(go())
    assert result.state is sm.TurnState.ABORTED
    assert log.read_text(encoding="utf-8") == "seat: cancel\n"


@pytest.mark.timeout(90)
def test_a_real_servers_question_is_answered_through_a_durable_run(
    engine: Engine, tmp_path: Path
) -> None:
    log = tmp_path / "server.log"

    async def go() -> sm.RunResult:
        async with _features(log, elicitation="run") as server:
            models = {"scripted": _calling("seat")}
            async with engine.runner(models=models, tools=server.tools) as runner:
                handle = await runner.start("seated", model="scripted", messages="seat")
                question = await _question(handle)
                assert question.schema["properties"]["row"]["type"] == "integer"
                await handle.answer(question.id, {"row": 7})
                return await handle.result(timeout=60)

    result = asyncio.run(go())
    assert result.final_text == "row 7"
    assert log.read_text(encoding="utf-8") == "seat: row 7\n"


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

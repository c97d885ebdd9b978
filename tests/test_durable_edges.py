"""Durable runs at their edges: an abort during an approval wait, inputs a database
cannot hold, a handle outlived by its runner, oversized and misshapen input, a lone
surrogate exported, a database file deleted under a run. PostgreSQL runs under
`bash .ci/postgres.sh` (see test_durable_dbos.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import os
import sqlite3
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

if os.environ.get("CI") == "true":
    import dbos  # noqa: F401 - under CI the extra is installed: fail here, never skip
else:
    pytest.importorskip("dbos")

from durable_worker import database_urls, guarded, guarded_needs_a_person

import statemachine as sm
from statemachine.core.tools import ToolDefinition
from statemachine.durable import NotPendingError, StoreUnavailableError, _dbos_errors
from statemachine.durable._dbos_errors import write_ahead
from statemachine.durable.dbos import MAX_MESSAGE_CHARS, DBOSRunner
from statemachine.journal import Journal, replay, run_agent_journaled
from statemachine.testing import FunctionModel

T = TypeVar("T")


def _model(messages: Sequence[sm.Message], tools: Sequence[ToolDefinition]) -> sm.AssistantMessage:
    if not any(isinstance(m, sm.AssistantMessage) for m in messages):
        return sm.AssistantMessage([sm.ToolCall("c1", "guarded", {})])
    return sm.AssistantMessage("done \udc80 cut off")  # a stream cut inside a character


def _runner(db: str, **options: Any) -> DBOSRunner:
    return DBOSRunner(
        models={"m": FunctionModel(_model)},
        tools=[guarded],
        before_tool_call=guarded_needs_a_person,
        database_url=db,
        **options,
    )


def _launched(runner: DBOSRunner, body: Callable[[DBOSRunner], Awaitable[T]]) -> T:
    async def go() -> T:
        runner.launch()
        try:
            return await body(runner)
        finally:
            runner.destroy()

    return asyncio.run(go())


async def _waiting(runner: DBOSRunner, run_id: str) -> Any:
    handle = await runner.start(run_id, model="m", messages="go")
    for _ in range(1200):
        if await handle.pending_approvals():
            return handle
        await asyncio.sleep(0.05)
    raise AssertionError("the run never waited for a person")


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str], str]:
    return database_urls(request.param, tmp_path)  # type: ignore[no-any-return]


@pytest.mark.timeout(120)
def test_an_abort_during_an_approval_wait_leaves_nothing_pending(
    database: Callable[[str], str],
) -> None:
    async def body(runner: DBOSRunner) -> tuple[sm.RunResult, Any, Any]:
        handle = await _waiting(runner, "r")
        await handle.abort("nobody came")
        result = await handle.result(timeout=60)
        with pytest.raises(NotPendingError, match="the run has ended"):
            await handle.decide("c1", True)
        return result, await handle.pending_approvals(), await handle.status()

    result, pending, status = _launched(_runner(database("runs")), body)
    assert result.state is sm.TurnState.ABORTED
    assert pending == ()
    assert status.state == "finished"
    assert status.pending_approvals == ()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("run_id", ["a\x00b", "a\udc80b"], ids=["nul", "lone-surrogate"])
def test_a_run_id_the_store_cannot_hold_is_refused_before_anything_is_stored(
    database: Callable[[str], str], run_id: str
) -> None:
    async def body(runner: DBOSRunner) -> tuple[Any, ...]:
        with pytest.raises(sm.InvalidInputError, match="run id"):
            await runner.start(run_id, model="m", messages="go")
        with pytest.raises(sm.InvalidInputError, match="run id"):
            await runner.enqueue(run_id, queue="q", model="m", messages="go")
        with pytest.raises(sm.InvalidInputError, match="run id"):
            await runner.handle(run_id)
        return await runner.list_runs()

    assert _launched(_runner(database("runs")), body) == ()
    with pytest.raises(sm.InvalidInputError, match="executor_id"):
        _runner("sqlite:///unused.sqlite", executor_id="w\x00")


@pytest.mark.timeout(120)
def test_a_handle_used_after_its_runner_was_destroyed_says_so(tmp_path: Path) -> None:
    runner = _runner(f"sqlite:///{tmp_path}/runs.sqlite")

    async def body(runner: DBOSRunner) -> Any:
        return await _waiting(runner, "r")

    handle = _launched(runner, body)
    for call in (handle.status, handle.pending_approvals, functools.partial(handle.steer, "hi")):
        with pytest.raises(sm.UsageError, match="destroyed since: take a new handle"):
            asyncio.run(call())


@pytest.mark.timeout(120)
def test_misshapen_and_oversized_input_is_refused(tmp_path: Path) -> None:
    async def body(runner: DBOSRunner) -> None:
        handle = await _waiting(runner, "r")
        with pytest.raises(sm.UsageError, match="call_id must be a str"):
            await handle.decide(["c1"], True)
        big = "x" * (MAX_MESSAGE_CHARS + 1)
        for message in (big, sm.UserMessage(big), sm.UserMessage([sm.TextContent(big[:-2])] * 2)):
            with pytest.raises(sm.InvalidInputError, match=f"at most {MAX_MESSAGE_CHARS}"):
                await handle.steer(message)
        await handle.steer(sm.UserMessage("x" * MAX_MESSAGE_CHARS))  # the limit itself passes
        await handle.decide("c1", True)
        result = await handle.result(timeout=60)
        assert result.ok

    _launched(_runner(f"sqlite:///{tmp_path}/runs.sqlite"), body)


@pytest.mark.timeout(120)
def test_a_lone_surrogate_exports_as_run_agent_journaled_writes_it(tmp_path: Path) -> None:
    async def body(runner: DBOSRunner) -> None:
        handle = await _waiting(runner, "r")
        await handle.decide("c1", True)
        assert (await handle.result(timeout=60)).ok
        taken = tmp_path / "taken.jsonl"
        taken.write_text("")
        with pytest.raises(sm.InvalidInputError, match="already exists"):
            await runner.export_journal("r", taken)
        with pytest.raises(sm.InvalidInputError, match="cannot write"):
            await runner.export_journal("r", tmp_path / "missing" / "r.jsonl")
        await runner.export_journal("r", tmp_path / "durable.jsonl")
        stream = io.StringIO()
        await runner.export_journal("r", stream)
        assert stream.getvalue().encode() == (tmp_path / "durable.jsonl").read_bytes()

    _launched(_runner(f"sqlite:///{tmp_path}/runs.sqlite"), body)
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix != ".sqlite") == [
        "durable.jsonl",
        "taken.jsonl",
    ]  # nothing partial left behind
    assert replay(tmp_path / "durable.jsonl").ok

    async def in_memory() -> None:
        journal = Journal(tmp_path / "memory.jsonl")
        try:
            await run_agent_journaled(
                journal=journal,
                model=FunctionModel(_model),
                tools=[guarded],
                messages=[sm.UserMessage("go")],
                run_id="r",
            )
        finally:
            journal.close()

    asyncio.run(in_memory())
    exported = (tmp_path / "durable.jsonl").read_text().splitlines()
    written = (tmp_path / "memory.jsonl").read_text().splitlines()

    # The same events, the surrogate escaped the same way (the headers differ: the
    # durable run asked a person; the run in memory had no hook).
    def final_answer(lines: list[str]) -> str:
        (line,) = [line for line in lines if "udc80" in line]
        return line[line.index('"event"') :]  # without the seq

    assert final_answer(exported) == final_answer(written)
    assert '"done \\udc80 cut off"' in final_answer(exported)


@pytest.mark.timeout(120)
def test_a_sqlite_file_deleted_under_a_run_is_a_status_that_says_so(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite"

    async def body(runner: DBOSRunner) -> None:
        handle = await _waiting(runner, "r")
        path.unlink()
        with pytest.raises(StoreUnavailableError, match="was deleted"):
            await handle.status()
        with pytest.raises(StoreUnavailableError, match="was deleted"):
            await handle.steer("anyone?")

    _launched(_runner(f"sqlite:///{path}"), body)


@pytest.mark.timeout(60)
def test_the_default_sqlite_store_runs_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite"

    async def body(runner: DBOSRunner) -> None:
        handle = await _waiting(runner, "r")
        await handle.decide("c1", True)
        assert (await handle.result(timeout=60)).ok

    _launched(_runner(f"sqlite:///{path}"), body)
    connection = sqlite3.connect(path)
    try:
        assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        connection.close()


def _hold_a_transaction(path: Path, seconds: float, started: threading.Event) -> None:
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        connection.execute("BEGIN")
        connection.execute("CREATE TABLE IF NOT EXISTS busy (x)")  # a writer, as a migration is
        started.set()
        time.sleep(seconds)
        connection.execute("COMMIT")
    finally:
        connection.close()


@contextlib.contextmanager
def _held_by_another_connection(path: Path, seconds: float) -> Iterator[None]:
    """While inside, another connection is in a write transaction on ``path`` (for up
    to ``seconds``)."""
    started = threading.Event()
    holder = threading.Thread(target=_hold_a_transaction, args=(path, seconds, started))
    holder.start()
    try:
        assert started.wait(10)
        yield
    finally:
        holder.join(10)


@pytest.mark.timeout(60)
def test_a_new_sqlite_file_another_worker_is_setting_up_is_switched_to_wal_once_free(
    tmp_path: Path,
) -> None:
    # SQLite refuses a change of journal mode at once while another connection is in a
    # transaction (its busy timeout does not apply): two workers starting on one new
    # file must not fail because the other is creating its tables.
    path = tmp_path / "runs.sqlite"
    with _held_by_another_connection(path, 0.5):
        write_ahead(f"sqlite:///{path}")
    connection = sqlite3.connect(path)
    try:
        assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        connection.close()


@pytest.mark.timeout(60)
def test_a_sqlite_file_held_past_the_wait_is_a_named_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_dbos_errors, "WAL_WAIT_SECONDS", 0.2)
    path = tmp_path / "runs.sqlite"
    with _held_by_another_connection(path, 2.0):
        begun = time.monotonic()
        with pytest.raises(StoreUnavailableError, match="cannot be opened: database is locked"):
            write_ahead(f"sqlite:///{path}")
        assert time.monotonic() - begun < 1.5  # gave up after its wait, not the holder's

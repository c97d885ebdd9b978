"""Durable runs on DBOS: the same run as run_agent, approvals across a kill, bad input.

The tests that matter most for durability run on SQLite and on PostgreSQL. PostgreSQL
needs a server: `bash .ci/postgres.sh COMMAND` starts a throwaway one and sets
STATEMACHINE_TEST_POSTGRES (`.ci/run` does); without it they skip, except under
CI=true, where they fail. The kill trials are in test_durable_kill.py, messages to a
run in test_durable_control.py, queues and failover in test_durable_workers.py.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("CI") == "true":
    import dbos  # noqa: F401 - under CI the extra is installed: fail here, never skip
else:
    pytest.importorskip("dbos")

from durable_worker import (
    TOOLS,
    answer,
    database_urls,
    kill,
    log_lines,
    reference_run,
    result_json,
    start_worker,
)

import statemachine as sm
from statemachine.durable import (
    NotPendingError,
    RunHandle,
    StoreUnavailableError,
    UnknownRunError,
)
from statemachine.durable.dbos import DBOSRunHandle, DBOSRunner, connect
from statemachine.errors import InvalidInputError, UsageError
from statemachine.testing import FunctionModel


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str], str]:
    """The database URL for a name, on each backend (a fresh database per test)."""
    return database_urls(request.param, tmp_path)  # type: ignore[no-any-return]


def _reference() -> sm.RunResult:
    return reference_run()


@pytest.mark.timeout(120)
def test_a_durable_run_has_the_history_trace_and_stats_of_run_agent(
    database: Callable[[str], str],
) -> None:
    async def body() -> tuple[sm.RunResult, RunHandle]:
        runner = DBOSRunner(
            models={"scripted": FunctionModel(answer)},
            tools=TOOLS,
            database_url=database("runs"),
        )
        runner.launch()
        try:
            handle = await runner.start("same", model="scripted", messages="go")
            result = await handle.result(timeout=60)
            assert result.ok
            assert result.run_id == "same"
            assert (await handle.status()).state == "finished"
            again = await runner.start("same", model="scripted", messages="go")
            assert (await again.result(timeout=60)).messages == result.messages
            return result, handle
        finally:
            runner.destroy()

    durable, handle = asyncio.run(body())
    assert isinstance(handle, RunHandle)
    reference = _reference()
    assert result_json(durable) == result_json(reference)
    stats, expected = durable.stats, reference.stats
    assert stats is not None
    assert expected is not None
    assert stats.model_calls == expected.model_calls == 4
    assert stats.tool_calls == expected.tool_calls == {"alpha": {"ok": 3}, "beta": {"ok": 3}}
    assert stats.usage == expected.usage
    assert set(stats.tool_seconds) == set(expected.tool_seconds)
    assert len(stats.turn_seconds) == len(expected.turn_seconds)
    assert stats.wall_seconds > 0


async def _open_when_started(client: Any, run_id: str) -> DBOSRunHandle:
    deadline = time.monotonic() + 60
    while True:
        try:
            return await DBOSRunHandle.open(client, run_id)
        except Exception:  # no database or no run yet: the worker is starting
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def _wait_for_pending(
    handle: DBOSRunHandle, proc: subprocess.Popen[bytes], call_id: str
) -> list[str]:
    """Wait until ``call_id`` is pending (a decision just sent may not be taken yet)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        pending = [c.id for c in await handle.pending_approvals()]
        if call_id in pending:
            return pending
        assert proc.poll() is None, "the worker ended while the run should wait"
        await asyncio.sleep(0.05)
    raise AssertionError("no approval was published")


@pytest.mark.timeout(120)
def test_an_approval_waits_across_a_kill_and_is_decided_after_the_restart(
    tmp_path: Path, database: Callable[[str], str]
) -> None:
    db, out, log = database("runs"), tmp_path / "out.json", tmp_path / "log"
    procs: list[subprocess.Popen[bytes]] = []

    async def body() -> None:
        procs.append(start_worker(db, "appr", out, log, "approvals"))
        client = await _connect_when_made(db)
        try:
            handle = await _open_when_started(client, "appr")
            assert await _wait_for_pending(handle, procs[-1], "t1b") == ["t1b"]
            assert (await handle.status()).state == "waiting"
            kill(procs[-1])
            before = log_lines(log)
            procs.append(start_worker(db, "appr", out, log, "approvals"))
            with pytest.raises(NotPendingError):
                await handle.decide("t1a", True)  # permitted by the hook, never pending
            await handle.decide("t1b", True)
            await _decide_the_rest(handle, procs[-1])
            assert procs[-1].wait(timeout=60) == 0
            with pytest.raises(NotPendingError):
                await handle.decide("t1b", False)  # a second decision
            result = await handle.result(timeout=10)
        finally:
            client.destroy()
        assert result.ok
        results = {
            m.tool_call_id: m.text for m in result.messages if isinstance(m, sm.ToolResultMessage)
        }
        assert results["t1b"] == "beta(1)=1001"
        assert "denied" in results["t2b"].lower()
        starts = [line[1] for line in log_lines(log) if line[0] == "start"]
        assert starts.count("t1a") == 1  # ran before the kill, not again
        assert starts.count("t1b") == 1  # ran once, after the approval
        assert "t1b" not in [line[1] for line in before]

    try:
        asyncio.run(body())
    finally:
        for proc in procs:
            kill(proc)


async def _connect_when_made(db: str) -> Any:
    deadline = time.monotonic() + 60
    while True:
        try:
            return connect(db)
        except StoreUnavailableError:  # the worker has not made the database yet
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def _decide_the_rest(handle: DBOSRunHandle, proc: subprocess.Popen[bytes]) -> None:
    """Deny t2b, approve t3b, as they come up."""
    for call_id, approve in (("t2b", False), ("t3b", True)):
        assert await _wait_for_pending(handle, proc, call_id) == [call_id]
        await handle.decide(call_id, approve, None if approve else "not today")


@pytest.mark.timeout(60)
def test_bad_input_gets_clear_errors(tmp_path: Path) -> None:
    async def body() -> None:
        runner = DBOSRunner(
            models={"scripted": FunctionModel(answer)},
            tools=TOOLS,
            database_url=f"sqlite:///{tmp_path}/runs.sqlite",
        )
        with pytest.raises(UsageError, match="launch"):
            await runner.handle("x")
        runner.launch()
        try:
            with pytest.raises(UnknownRunError, match="nope"):
                await runner.handle("nope")
            with pytest.raises(InvalidInputError, match="unknown model"):
                await runner.start("r", model="other", messages="go")
            with pytest.raises(InvalidInputError, match="unknown tools"):
                await runner.start("r", model="scripted", messages="go", tools=["gamma"])
            with pytest.raises(InvalidInputError, match="run id"):
                await runner.start("", model="scripted", messages="go")
            with pytest.raises(InvalidInputError, match="max_turns"):
                await runner.start("r", model="scripted", messages="go", max_turns=0)
            with pytest.raises(InvalidInputError, match="messages"):
                await runner.start("r", model="scripted", messages=b"go")  # type: ignore[arg-type]
            handle = await runner.start("r", model="scripted", messages="go")
            await handle.result(timeout=60)
            with pytest.raises(NotPendingError, match="t1b"):
                await handle.decide("t1b", True)  # the run is over: nothing is pending
            with pytest.raises(InvalidInputError):
                await handle.decide("t1b", "yes")  # type: ignore[arg-type]
            with pytest.raises(InvalidInputError):
                await handle.steer("x" * 200_000)
            assert (await handle.result(timeout=5)).ok  # the refusals changed nothing
            with pytest.raises(InvalidInputError, match="queue"):
                await runner.enqueue("q", queue="", model="scripted", messages="go")
            with pytest.raises(InvalidInputError, match="executor_id"):
                await runner.recover(["w1", ""])
            assert await runner.recover([]) == []
            assert await runner.recover(["nobody"]) == []
        finally:
            runner.destroy()
        assert issubclass(UnknownRunError, UsageError)
        assert issubclass(NotPendingError, UsageError)

    asyncio.run(body())


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"queues": {"jobs": 0}}, "concurrency limit"),
        ({"queues": {"jobs": 10_000}}, "concurrency limit"),
        ({"queues": {"jobs": True}}, "concurrency limit"),
        ({"queues": {"": 1}}, "queue name"),
        ({"queues": ["jobs"]}, "queues"),
        ({"executor_id": ""}, "executor_id"),
        ({"executor_id": "x" * 201}, "executor_id"),
        ({"database_url": ""}, "database URL"),
        ({"database_url": "x" * 3000}, "database URL"),
    ],
)
def test_bad_runner_options_get_clear_errors(options: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidInputError, match=match):
        DBOSRunner(models={"scripted": FunctionModel(answer)}, tools=TOOLS, **options)


@pytest.mark.timeout(60)
def test_a_handle_on_an_unknown_run_says_so_and_stores_nothing(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/runs.sqlite"

    async def body() -> None:
        runner = DBOSRunner(
            models={"scripted": FunctionModel(answer)}, tools=TOOLS, database_url=db
        )
        runner.launch()
        runner.destroy()
        client = connect(db)
        try:
            with pytest.raises(UnknownRunError, match="ghost"):
                await DBOSRunHandle.open(client, "ghost")
            ghost = DBOSRunHandle(client, "ghost")  # built by hand, never started
            for call in (
                ghost.steer("hi"),
                ghost.follow_up("hi"),
                ghost.abort(),
                ghost.status(),
                ghost.result(timeout=1),
                ghost.pending_approvals(),
            ):
                with pytest.raises(UnknownRunError, match="ghost"):
                    await call
            with pytest.raises(UnknownRunError):
                await ghost.decide("c1", True)
            assert await client.list_workflows_async() == []
        finally:
            client.destroy()

    asyncio.run(body())


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "url",
    [
        "postgresql+psycopg://bob:hunter2secret@127.0.0.1:{port}/runs",
        "sqlite:///{tmp}/no/such/dir/runs.sqlite",
    ],
)
def test_an_unreachable_database_is_one_clear_error_without_the_password(
    tmp_path: Path, url: str
) -> None:
    import socket

    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = url.format(port=port, tmp=tmp_path)
    runner = DBOSRunner(models={"scripted": FunctionModel(answer)}, tools=TOOLS, database_url=url)
    errors = []
    with pytest.raises(StoreUnavailableError) as launched:
        runner.launch()
    errors.append(str(launched.value))
    with pytest.raises(StoreUnavailableError) as connected:
        connect(url)
    errors.append(str(connected.value))
    for message in errors:
        assert "hunter2secret" not in message
        assert "\n" not in message
        assert "cannot be" in message
    assert not (tmp_path / "no").exists()  # nothing made on the way
    # The process may launch a runner afterwards: the failure left nothing behind.
    ok = DBOSRunner(
        models={"scripted": FunctionModel(answer)},
        tools=TOOLS,
        database_url=f"sqlite:///{tmp_path}/runs.sqlite",
    )
    ok.launch()
    ok.destroy()

"""Durable runs on DBOS: the same run as run_agent, kill -9, approvals, bad input.

The tests that matter most for durability (the same history, the kill trials, an
approval across a kill) run on SQLite and on PostgreSQL. PostgreSQL needs a server:
`bash .ci/postgres.sh COMMAND` starts a throwaway one and sets
STATEMACHINE_TEST_POSTGRES (`.ci/run` does); without it they skip, except under
CI=true, where they fail.

The kill trials run real worker processes (tests/durable_worker.py) and kill them with
SIGKILL at random points of a run of three turns with two parallel tools each. The
default suite runs DURABLE_KILL_TRIALS trials (6: each costs several seconds of
process starts); set it to 20 or more for the full count.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("CI") == "true":
    import dbos  # noqa: F401 - under CI the extra is installed: fail here, never skip
else:
    pytest.importorskip("dbos")

from durable_worker import TOOLS, answer, result_json

import statemachine as sm
from statemachine.durable import NotPendingError, RunHandle, UnknownRunError
from statemachine.durable.dbos import DBOSRunHandle, DBOSRunner, connect
from statemachine.errors import InvalidInputError, UsageError
from statemachine.testing import FunctionModel

WORKER = str(Path(__file__).with_name("durable_worker.py"))
ROOT = str(Path(__file__).resolve().parent.parent)
TRIALS = int(os.environ.get("DURABLE_KILL_TRIALS", "6"))
CALLS = [f"t{turn}{side}" for turn in (1, 2, 3) for side in "ab"]
POSTGRES = os.environ.get("STATEMACHINE_TEST_POSTGRES")


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str], str]:
    """The database URL for a name, on each backend (a fresh database per test)."""
    if request.param == "sqlite":
        return lambda name: f"sqlite:///{tmp_path}/{name}.sqlite"
    if not POSTGRES:
        if os.environ.get("CI") == "true":
            pytest.fail("under CI the PostgreSQL tests must run: use bash .ci/postgres.sh")
        # A developer machine without a server: the SQLite case of the same test still
        # runs; CI (above) never skips, since .ci/run starts PostgreSQL for it.
        pytest.skip("no PostgreSQL: run under bash .ci/postgres.sh to include it")
    prefix = f"sm_{uuid.uuid4().hex[:12]}"

    def url(name: str) -> str:
        # A fresh database per name, made here: a handle may connect before any worker.
        import psycopg

        server = POSTGRES.replace("+psycopg", "") + "/postgres"
        with psycopg.connect(server, autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{prefix}_{name}"')
        return f"{POSTGRES}/{prefix}_{name}"

    return url


def _reference() -> dict[str, Any]:
    result = asyncio.run(
        sm.run_agent(model=FunctionModel(answer), tools=TOOLS, messages=[sm.UserMessage("go")])
    )
    return result_json(result)


def _start_worker(
    db: str, run_id: str, out: Path, log: Path, mode: str = ""
) -> subprocess.Popen[bytes]:
    env = dict(os.environ, DURABLE_SIDE_EFFECTS=str(log), PYTHONPATH=ROOT)
    return subprocess.Popen(
        [sys.executable, WORKER, db, run_id, str(out), mode],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _recorded_calls(db: str, run_id: str) -> set[str]:
    """The tool calls whose step is recorded in the database."""
    client = connect(db)
    try:
        steps = client.list_workflow_steps(run_id)
    except Exception:
        return set()  # the run is not in the database yet
    finally:
        client.destroy()
    return {
        s["output"][0]["callId"]
        for s in steps
        if s["function_name"] == "statemachine.tool" and s["output"]
    }


def _log_lines(log: Path) -> list[list[str]]:
    return [line.split() for line in log.read_text().splitlines()] if log.exists() else []


def _kill_when(proc: subprocess.Popen[bytes], log: Path, lines: int, extra: float) -> bool:
    """SIGKILL ``proc`` once the log has ``lines`` lines, ``extra`` s later; False if
    it ended on its own first."""
    deadline = time.monotonic() + 60
    while len(_log_lines(log)) < lines and proc.poll() is None:
        if time.monotonic() > deadline:
            break
        time.sleep(0.002)
    try:
        proc.wait(timeout=extra)
        return False
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        return True


def _reruns_of_finished_calls(log: Path, processes: list[tuple[int, set[str]]]) -> list[str]:
    """Calls recorded when one process ended that started again in a later one."""
    order = {pid: i for i, (pid, _) in enumerate(processes)}
    problems = []
    for what, call, pid in _log_lines(log):
        if what != "start":
            continue
        for earlier, (_, recorded) in enumerate(processes):
            if order[int(pid)] > earlier and call in recorded:
                problems.append(f"finished call {call} ran again in process {order[int(pid)]}")
    return problems


def _trial(db: str, tmp: Path, index: int, rng: random.Random) -> tuple[dict[str, Any], list[str]]:
    """One run killed one to three times; its result and any broken promise."""
    run_id = f"run{index}"
    out, log = tmp / f"trial{index}.json", tmp / f"trial{index}.log"
    processes: list[tuple[int, set[str]]] = []  # pid, calls recorded when it ended
    problems: list[str] = []
    for _ in range(rng.choice([1, 1, 2, 3])):
        proc = _start_worker(db, run_id, out, log)
        already = len(_log_lines(log))
        _kill_when(proc, log, already + rng.randint(0, 8), rng.uniform(0.0, 0.08))
        processes.append((proc.pid, _recorded_calls(db, run_id)))
    proc = _start_worker(db, run_id, out, log)
    if proc.wait(timeout=120) != 0:
        problems.append("the last worker failed")
    processes.append((proc.pid, set()))
    problems += _reruns_of_finished_calls(log, processes)
    starts = [call for what, call, _ in _log_lines(log) if what == "start"]
    started = set(starts)
    # -s shows what each trial did: kills, and interrupted calls run again.
    print(f"trial {index}: {len(processes) - 1} kills, {len(starts) - len(started)} re-runs")
    if started != set(CALLS):
        problems.append(f"calls started: {sorted(started)}")
    return (json.loads(out.read_text()) if out.exists() else {}), problems


@pytest.mark.timeout(120)
def test_a_durable_run_has_the_history_and_trace_of_run_agent(
    database: Callable[[str], str],
) -> None:
    async def body() -> tuple[dict[str, Any], RunHandle]:
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
            return result_json(result), handle
        finally:
            runner.destroy()

    durable, handle = asyncio.run(body())
    assert isinstance(handle, RunHandle)
    assert durable == _reference()


@pytest.mark.timeout(60 + 30 * TRIALS)
def test_kill_9_at_random_points_loses_nothing_and_reruns_no_finished_tool(
    tmp_path: Path, database: Callable[[str], str]
) -> None:
    expected = _reference()
    rng = random.Random(int(os.environ.get("DURABLE_KILL_SEED", "15")))
    failures = []
    for index in range(TRIALS):
        got, problems = _trial(database(f"trial{index}"), tmp_path, index, rng)
        if got.get("state") != "Done":
            problems.append(f"state {got.get('state')}")
        if got.get("messages") != expected["messages"]:
            problems.append("the history differs from run_agent's")
        if got.get("trace") != expected["trace"]:
            problems.append("the trace differs from run_agent's")
        if problems:
            failures.append(f"trial {index}: {'; '.join(problems)}")
    assert not failures, failures


@pytest.mark.timeout(120)
def test_the_kill_check_catches_a_backend_that_runs_finished_tools_again(tmp_path: Path) -> None:
    db, out, log = f"sqlite:///{tmp_path}/runs.sqlite", tmp_path / "out.json", tmp_path / "log"
    proc = _start_worker(db, "broken", out, log, "broken")
    deadline = time.monotonic() + 60
    while not _recorded_calls(db, "broken") and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    processes = [(proc.pid, _recorded_calls(db, "broken"))]
    assert processes[0][1], "no tool call was recorded before the kill"
    proc = _start_worker(db, "broken", out, log, "broken")
    assert proc.wait(timeout=60) == 0
    processes.append((proc.pid, set()))
    assert _reruns_of_finished_calls(log, processes)


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

    async def body() -> None:
        proc = _start_worker(db, "appr", out, log, "approvals")
        client = connect(db)
        try:
            handle = await _open_when_started(client, "appr")
            assert await _wait_for_pending(handle, proc, "t1b") == ["t1b"]
            assert (await handle.status()).state == "waiting"
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            before = _log_lines(log)
            proc = _start_worker(db, "appr", out, log, "approvals")
            with pytest.raises(NotPendingError):
                await handle.decide("t1a", True)  # permitted by the hook, never pending
            await handle.decide("t1b", True)
            await _decide_the_rest(handle, proc)
            assert proc.wait(timeout=60) == 0
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
        starts = [call for what, call, _ in _log_lines(log) if what == "start"]
        assert starts.count("t1a") == 1  # ran before the kill, not again
        assert starts.count("t1b") == 1  # ran once, after the approval
        assert "t1b" not in [call for _, call, _ in before]

    asyncio.run(body())


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
        finally:
            runner.destroy()
        assert issubclass(UnknownRunError, UsageError)
        assert issubclass(NotPendingError, UsageError)

    asyncio.run(body())


def _said(messages: Any) -> str:
    texts = [
        block.text
        for m in messages
        if isinstance(m, sm.UserMessage)
        for block in m.content
        if isinstance(block, sm.TextContent)
    ]
    return " | ".join(texts)


def _gated_runner(tmp_path: Path) -> tuple[DBOSRunner, asyncio.Event, asyncio.Event]:
    """A runner whose one tool waits for the test to open a gate; the model answers
    with what the person said so far."""
    entered, gate = asyncio.Event(), asyncio.Event()

    @sm.tool
    async def wait_at_gate() -> str:
        """Wait until the gate opens."""
        entered.set()
        await gate.wait()
        return "opened"

    def model(messages: Any, tools: Any) -> sm.AssistantMessage:
        if not any(isinstance(m, sm.ToolResultMessage) for m in messages):
            return sm.AssistantMessage([sm.ToolCall("g1", "wait_at_gate", {})])
        return sm.AssistantMessage(f"heard: {_said(messages)}")

    runner = DBOSRunner(
        models={"gated": FunctionModel(model)},
        tools=[wait_at_gate],
        database_url=f"sqlite:///{tmp_path}/runs.sqlite",
    )
    return runner, entered, gate


@pytest.mark.timeout(60)
def test_steer_and_follow_up_reach_the_run_as_stored_messages(tmp_path: Path) -> None:
    async def body() -> sm.RunResult:
        runner, entered, gate = _gated_runner(tmp_path)
        runner.launch()
        try:
            handle = await runner.start("steered", model="gated", messages="go")
            await asyncio.wait_for(entered.wait(), 30)
            await handle.steer("change of plan")
            await handle.follow_up("one more thing")
            gate.set()
            return await handle.result(timeout=30)
        finally:
            runner.destroy()

    result = asyncio.run(body())
    assert result.ok
    assert result.final_text == "heard: go | change of plan | one more thing"


@pytest.mark.timeout(60)
def test_abort_ends_the_run_at_its_next_model_call_with_every_result(tmp_path: Path) -> None:
    async def body() -> sm.RunResult:
        runner, entered, gate = _gated_runner(tmp_path)
        runner.launch()
        try:
            handle = await runner.start("aborted", model="gated", messages="go")
            await asyncio.wait_for(entered.wait(), 30)
            await handle.abort("the person left")
            gate.set()
            return await handle.result(timeout=30)
        finally:
            runner.destroy()

    result = asyncio.run(body())
    assert result.state is sm.TurnState.Aborted
    assert "the person left" in result.explanation
    tool_results = [m for m in result.messages if isinstance(m, sm.ToolResultMessage)]
    assert [m.text for m in tool_results] == ["opened"]  # the started call kept its result
    last = result.messages[-1]  # the model call the abort kept from starting
    assert isinstance(last, sm.AssistantMessage)
    assert last.content == ()
    assert "not started" in (last.error_message or "")

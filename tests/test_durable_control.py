"""Messages to a durable run on DBOS: abort within a second, steer and follow-up
recorded where they took effect (the same history after a kill), and what a turn
costs in saved operations. PostgreSQL runs under `bash .ci/postgres.sh` (see
test_durable_dbos.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Sequence
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
    echo,
    kill,
    log_lines,
    result_json,
    start_worker,
    wait_for_log,
)

import statemachine as sm
from statemachine.durable import StoreUnavailableError
from statemachine.durable.dbos import DBOSRunHandle, DBOSRunner, connect
from statemachine.testing import FunctionModel

CONTROL = "statemachine.control"


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str], str]:
    """The database URL for a name, on each backend (a fresh database per test)."""
    return database_urls(request.param, tmp_path)  # type: ignore[no-any-return]


def _steps(client: Any, run_id: str) -> list[str]:
    return [s["function_name"] for s in client.list_workflow_steps(run_id)]


async def _until_taken(client: Any, run_id: str, count: int) -> None:
    """Wait until the run has taken ``count`` messages (their places recorded)."""
    deadline = time.monotonic() + 30
    while _steps(client, run_id).count(CONTROL) < count:
        assert time.monotonic() < deadline, "the run did not take the messages"
        await asyncio.sleep(0.02)


def _i6_holds(messages: Sequence[sm.Message]) -> bool:
    """Every tool call in the history has its result."""
    calls = {b.id for m in messages if isinstance(m, sm.AssistantMessage) for b in m.tool_calls}
    answered = {m.tool_call_id for m in messages if isinstance(m, sm.ToolResultMessage)}
    return calls == answered


@pytest.mark.timeout(60)
def test_a_turn_costs_one_saved_operation_per_call_plus_a_constant(tmp_path: Path) -> None:
    async def body() -> tuple[Counter[str], Counter[str]]:
        runner = DBOSRunner(
            models={"scripted": FunctionModel(answer)},
            tools=TOOLS,
            database_url=f"sqlite:///{tmp_path}/runs.sqlite",
        )
        runner.launch()
        try:
            quiet = await runner.start("quiet", model="scripted", messages="go")
            await quiet.result(timeout=30)
            steered = await runner.start("steered", model="scripted", messages="go")
            await steered.steer("faster")
            await steered.result(timeout=30)
            client = runner._require_client()
            return Counter(_steps(client, "quiet")), Counter(_steps(client, "steered"))
        finally:
            runner.destroy()

    quiet, steered = asyncio.run(body())
    # 4 model calls, 6 tool calls; listening costs one operation (its deadline), and
    # making sure no message is left before the final answer four (the run published
    # as ending, then looked: a recv that does not wait, its deadline, what it found);
    # with nothing sent, no marker.
    assert quiet["statemachine.model"] == 4
    assert quiet["statemachine.tool"] == 6
    assert quiet["statemachine.look"] == 1
    assert quiet["DBOS.send"] == 0
    assert sum(quiet.values()) <= 4 + 6 + 1 + 4, quiet
    print(f"saved operations, 4 turns: {sum(quiet.values())} {dict(quiet)}")
    # A message taken costs three more (its recv, its place, the next deadline),
    # unless it came after the run's last event; and, taken during a turn, three for
    # the look before the run's next event (a recv that does not wait, its deadline,
    # what it found).
    assert sum(steered.values()) <= sum(quiet.values()) + 3 + 3 + 2, steered


def _gated_runner(db: str) -> tuple[DBOSRunner, asyncio.Event, list[float]]:
    """A runner whose one tool waits for its abort signal; ``fired`` gets the time."""
    entered = asyncio.Event()
    fired: list[float] = []

    @sm.tool
    async def wait_for_abort(signal: sm.AbortSignal) -> str:
        """Wait until the run is aborted."""
        signal.add_listener(lambda reason: fired.append(time.monotonic()))
        entered.set()
        while not signal.aborted:
            await asyncio.sleep(0.005)
        return f"stopped: {signal.reason}"

    def model(messages: Any, tools: Any) -> sm.AssistantMessage:
        return sm.AssistantMessage([sm.ToolCall("w1", "wait_for_abort", {})])

    runner = DBOSRunner(
        models={"waits": FunctionModel(model)}, tools=[wait_for_abort], database_url=db
    )
    return runner, entered, fired


@pytest.mark.timeout(60)
def test_an_abort_reaches_a_running_tool_within_a_second(database: Callable[[str], str]) -> None:
    async def body() -> tuple[sm.RunResult, float]:
        runner, entered, fired = _gated_runner(database("runs"))
        runner.launch()
        try:
            handle = await runner.start("aborted", model="waits", messages="go")
            await asyncio.wait_for(entered.wait(), 30)
            sent = time.monotonic()
            await handle.abort("the person left")
            result = await handle.result(timeout=30)
            return result, fired[0] - sent
        finally:
            runner.destroy()

    result, latency = asyncio.run(body())
    print(f"abort reached the tool after {latency * 1000:.0f} ms")
    assert latency < 1.0
    assert result.state is sm.TurnState.ABORTED
    assert "the person left" in result.explanation
    assert _i6_holds(result.messages)
    tool_results = [m.text for m in result.messages if isinstance(m, sm.ToolResultMessage)]
    assert tool_results == ["stopped: the person left"]  # its own answer, kept (I6)


async def _reference(gate: Path) -> dict[str, Any]:
    entered = asyncio.Event()

    @sm.tool(name="wait_at_gate")
    async def gated() -> str:
        """Wait until the gate opens."""
        entered.set()
        while not gate.exists():
            await asyncio.sleep(0.01)
        return "opened"

    run = sm.AgentRun(model=FunctionModel(echo), tools=[gated], messages=[sm.UserMessage("go")])
    task = asyncio.ensure_future(run.run())
    await asyncio.wait_for(entered.wait(), 30)
    run.steer("change of plan")
    run.follow_up("one more thing")
    await asyncio.sleep(0.05)
    gate.touch()
    return result_json(await task)


@pytest.mark.timeout(120)
def test_steer_and_follow_up_keep_their_place_across_a_kill(
    tmp_path: Path, database: Callable[[str], str]
) -> None:
    db, out, log, gate = (
        database("runs"),
        tmp_path / "out.json",
        tmp_path / "log",
        tmp_path / "gate",
    )
    expected = asyncio.run(_reference(tmp_path / "reference-gate"))
    procs = [start_worker(db, "steered", out, log, "gated", DURABLE_GATE=str(gate))]

    async def body() -> DBOSRunHandle:
        wait_for_log(log, 1, procs[0])  # the tool is waiting at the gate
        client = await _connect(db)
        handle = await DBOSRunHandle.open(client, "steered")
        await handle.steer("change of plan")
        await handle.follow_up("one more thing")
        await _until_taken(client, "steered", 2)
        client.destroy()
        return handle

    try:
        asyncio.run(body())
        kill(procs[0])
        gate.touch()
        procs.append(start_worker(db, "steered", out, log, "gated", DURABLE_GATE=str(gate)))
        assert procs[-1].wait(timeout=60) == 0
    finally:
        for proc in procs:
            kill(proc)
    got = json.loads(out.read_text())
    assert got["messages"] == expected["messages"]
    assert got["trace"] == expected["trace"]
    assert [line[0] for line in log_lines(log)] == ["start", "start"]  # the tool ran again


async def _connect(db: str) -> Any:
    deadline = time.monotonic() + 30
    while True:
        try:
            return connect(db)
        except StoreUnavailableError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


@pytest.mark.timeout(120)
def test_a_message_received_but_not_placed_before_a_crash_takes_effect_after_it(
    tmp_path: Path, database: Callable[[str], str]
) -> None:
    db, out, log = database("runs"), tmp_path / "out.json", tmp_path / "log"
    gate = tmp_path / "gate"
    procs = [start_worker(db, "torn", out, log, "gated-dies", DURABLE_GATE=str(gate))]
    try:
        wait_for_log(log, 1, procs[0])  # the tool is waiting at the gate

        async def steer() -> None:
            client = await _connect(db)
            await (await DBOSRunHandle.open(client, "torn")).steer("change of plan")
            client.destroy()

        asyncio.run(steer())
        assert procs[0].wait(timeout=30) == 9  # died with the message received
        client = connect(db)
        steps = _steps(client, "torn")
        client.destroy()
        assert "DBOS.recv" in steps  # taken from the database, recorded
        assert CONTROL not in steps  # but its place never recorded
        gate.touch()
        procs.append(start_worker(db, "torn", out, log, "gated", DURABLE_GATE=str(gate)))
        assert procs[-1].wait(timeout=60) == 0
    finally:
        for proc in procs:
            kill(proc)
    got = json.loads(out.read_text())
    assert got["state"] == "Done"
    assert got["messages"][-1]["content"][0]["text"] == "heard: go | change of plan"

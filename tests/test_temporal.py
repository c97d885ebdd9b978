"""Durable runs on Temporal, what only this backend has: continue-as-new, a tool
failure that is no activity retry, operators ending runs, task queues, the store, on
a real dev server (temporal_support.temporal_address). What every backend shares
(the run_agent history, approvals, messages, abort, export, bad input) is in
test_durable_shared.py; the kill trials are in test_temporal_kill.py."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest
from durable_worker import TOOLS, answer, beta_needs_approval, replays_to, result_json
from temporal_support import temporal_server  # noqa: F401 - the session's server
from temporalio.client import Interceptor, OutboundInterceptor, StartWorkflowUpdateInput

import statemachine as sm
from statemachine.core.tools import ToolDefinition
from statemachine.durable import RunHandle
from statemachine.durable.temporal import TemporalRunHandle, TemporalRunner, _inflight
from statemachine.durable.temporal._inflight import IN_FLIGHT, in_flight
from statemachine.errors import (
    InvalidInputError,
    NotPendingError,
    RunClosedError,
    RunFailedError,
    UnknownRunError,
    UsageError,
)
from statemachine.testing import FunctionModel

T = TypeVar("T")


def _with_runner(address: str, body: Callable[[TemporalRunner], Awaitable[T]], **options: Any) -> T:
    from temporalio.client import Client

    async def go() -> T:
        client = await Client.connect(address)
        options.setdefault("models", {"scripted": FunctionModel(answer)})
        options.setdefault("tools", TOOLS)
        runner = TemporalRunner(
            client, task_queue=f"q-{uuid.uuid4().hex[:8]}", heartbeat=1.0, **options
        )
        async with runner:
            return await body(runner)

    return asyncio.run(go())


async def _pending(handle: RunHandle, timeout: float = 20) -> list[str]:
    """The pending calls, once there are some."""
    async with asyncio.timeout(timeout):
        while True:
            calls = await handle.pending_approvals()
            if calls:
                return [c.id for c in calls]
            await asyncio.sleep(0.05)


def _counting(
    messages: Sequence[sm.Message], tools: Sequence[ToolDefinition]
) -> sm.AssistantMessage:
    turn = 1 + sum(isinstance(m, sm.AssistantMessage) for m in messages)
    if turn >= 25:
        return sm.AssistantMessage(f"done after {turn} turns")
    return sm.AssistantMessage([sm.ToolCall(f"c{turn}", "alpha", {"x": turn})])


@pytest.mark.timeout(120)
def test_a_long_run_goes_on_in_new_executions_and_ends_with_the_in_memory_history(
    temporal_address: str, tmp_path: Path
) -> None:
    from temporalio.client import Client

    async def body(runner: TemporalRunner) -> tuple[sm.RunResult, int]:
        handle = await runner.start("long", model="counting", messages="go", max_turns=30)
        result = await handle.result(timeout=90)
        await runner.export_journal("long", tmp_path / "long.jsonl")
        # The executions, from the last back through each one's predecessor.
        client = await Client.connect(temporal_address)
        executions, run_id = 0, None
        while run_id != "":
            history = await client.get_workflow_handle("long", run_id=run_id).fetch_history()
            started = history.events[0].workflow_execution_started_event_attributes
            executions, run_id = executions + 1, started.continued_execution_run_id
        return result, executions

    result, executions = _with_runner(
        temporal_address,
        body,
        models={"counting": FunctionModel(_counting)},
        continue_after=40,  # history events: a new execution every few turns
    )
    expected = asyncio.run(
        sm.run_agent(model=FunctionModel(_counting), tools=TOOLS, messages="go", max_turns=30)
    )
    assert result_json(result) == result_json(expected)
    assert executions > 3
    replays_to(tmp_path / "long.jsonl", result)


@pytest.mark.timeout(60)
def test_the_store_lists_exports_and_hands_out_runs(
    temporal_address: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from statemachine.cli import main as cli_main
    from statemachine.durable import RunStore
    from statemachine.durable import open_store as open_backend_store
    from statemachine.durable.temporal import TemporalStore, open_store

    async def body(runner: TemporalRunner) -> None:
        await (await runner.start("stored", model="scripted", messages="go")).result(timeout=30)
        store = open_store(f"temporal://{temporal_address}/default")
        assert isinstance(store, RunStore)
        try:
            async with asyncio.timeout(20):  # the server's listing follows its runs shortly
                while "stored" not in [r.run_id for r in await store.list_runs(limit=1000)]:
                    await asyncio.sleep(0.1)
            [listed] = [r for r in await store.list_runs(limit=1000) if r.run_id == "stored"]
            assert listed.state == "finished"
            assert listed.created <= listed.updated
            assert "stored" not in [r.run_id for r in await store.list_runs("running", 1000)]
            assert isinstance(await store.handle("stored"), RunHandle)
            with pytest.raises(UnknownRunError):
                await store.handle("nobody")
            with pytest.raises(InvalidInputError):
                await store.list_runs(limit=0)
            with pytest.raises(InvalidInputError):
                await store.list_runs("sleeping")
            assert (await store.export_journal("stored", tmp_path / "stored.jsonl")).finished
        finally:
            store.close()
        named = open_backend_store("temporal", f"temporal://{temporal_address}")
        assert isinstance(named, TemporalStore)
        assert named.namespace == "default"
        named.close()
        with pytest.raises(InvalidInputError):
            open_store("temporal://")

    _with_runner(temporal_address, body)
    # The command line reaches the same runs by the backend's name.
    address = f"temporal://{temporal_address}/default"
    assert cli_main(["durable", "list", "--backend", "temporal", "--db", address]) == 0
    assert "stored" in capsys.readouterr().out


@sm.tool
async def broken(x: int) -> str:
    """Fail.

    Args:
        x: a number
    """
    raise ValueError(f"no luck with {x}")


def _calls_broken(
    messages: Sequence[sm.Message], tools: Sequence[ToolDefinition]
) -> sm.AssistantMessage:
    if not any(isinstance(m, sm.ToolResultMessage) for m in messages):
        return sm.AssistantMessage([sm.ToolCall("b1", "broken", {"x": 7})])
    return sm.AssistantMessage("noted")


@pytest.mark.timeout(60)
def test_a_tool_that_raises_is_an_error_result_never_a_retried_activity(
    temporal_address: str,
) -> None:
    from temporalio.api.enums.v1 import EventType
    from temporalio.client import Client

    async def body(runner: TemporalRunner) -> tuple[sm.RunResult, list[int]]:
        result = await (await runner.start("broken", model="m", messages="go")).result(timeout=30)
        client = await Client.connect(temporal_address)
        attempts = [
            e.activity_task_started_event_attributes.attempt
            async for e in client.get_workflow_handle("broken").fetch_history_events()
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
        ]
        return result, attempts

    result, attempts = _with_runner(
        temporal_address, body, models={"m": FunctionModel(_calls_broken)}, tools=[broken]
    )
    expected = asyncio.run(
        sm.run_agent(model=FunctionModel(_calls_broken), tools=[broken], messages="go")
    )
    assert result_json(result) == result_json(expected)
    [failed] = [m for m in result.messages if isinstance(m, sm.ToolResultMessage)]
    assert failed.is_error
    assert "no luck with 7" in failed.text
    assert attempts == [1, 1, 1]  # model, tool, model: each activity ran once


@pytest.mark.timeout(60)
def test_a_run_ended_by_an_operator_is_failed_with_the_reason(temporal_address: str) -> None:
    from temporalio.client import Client

    async def body(runner: TemporalRunner) -> None:
        handle = await runner.start("ended", model="scripted", messages="go")
        assert await _pending(handle) == ["t1b"]
        client = await Client.connect(temporal_address)
        await client.get_workflow_handle("ended").terminate(reason="ended by an operator")
        status = await handle.status()
        assert status.state == "failed"
        assert status.explanation == "terminated: ended by an operator"
        with pytest.raises(RunFailedError, match="ended"):
            await handle.result(timeout=10)
        with pytest.raises(NotPendingError):
            await handle.decide("t1b", True)
        with pytest.raises(RunClosedError):
            await handle.steer("too late")

    _with_runner(temporal_address, body, before_tool_call=beta_needs_approval)


@pytest.mark.timeout(60)
def test_the_runner_lists_enqueues_and_ends_runs(temporal_address: str) -> None:
    async def body(runner: TemporalRunner) -> None:
        handle = await runner.start("operated", model="scripted", messages="go")
        assert await _pending(handle) == ["t1b"]
        assert (await runner.status("operated")).state == "waiting"
        assert await runner.recover(["dead-worker"]) == []  # Temporal takes them over
        with pytest.raises(UsageError):
            await runner.resume_held("operated")  # not held
        await runner.end_held("operated", "no longer needed")
        status = await runner.status("operated")
        assert status.state == "failed"
        assert status.explanation == "terminated: no longer needed"
        async with asyncio.timeout(20):  # the server's listing follows its runs shortly
            while "operated" not in [r.run_id for r in await runner.list_runs("failed", 1000)]:
                await asyncio.sleep(0.1)
        other = TemporalRunner(
            runner.client,
            models=runner.models,
            tools=list(runner.tools.values()),
            task_queue=f"{runner.task_queue}-other",
            before_tool_call=beta_needs_approval,
        )
        async with other:
            queued = await runner.enqueue(
                "queued", queue=other.task_queue, model="scripted", messages="go"
            )
            assert await _pending(queued) == ["t1b"]  # the other queue's worker runs it
        with pytest.raises(InvalidInputError):
            await runner.enqueue("bad", queue="", model="scripted", messages="go")

    _with_runner(temporal_address, body, before_tool_call=beta_needs_approval)


BLOCKING = 4.0  # seconds the tool below holds the event loop: four heartbeat timeouts
_blocking_starts: list[str] = []


@sm.tool
async def blocking() -> str:
    """Compute without yielding, then finish."""
    _blocking_starts.append(sm.current_tool_call().id)  # type: ignore[union-attr]
    time.sleep(BLOCKING)  # the mistake the test is about: the loop is held
    await asyncio.sleep(0.5)
    return "computed"


def _one_call(tool: str) -> FunctionModel:
    """A model that calls ``tool`` once, then says how many user messages it heard."""

    def answer(messages: Sequence[sm.Message], _: Sequence[ToolDefinition]) -> sm.AssistantMessage:
        if not any(isinstance(m, sm.ToolResultMessage) for m in messages):
            return sm.AssistantMessage([sm.ToolCall("k1", tool, {})])
        return sm.AssistantMessage(f"heard {sum(isinstance(m, sm.UserMessage) for m in messages)}")

    return FunctionModel(answer)


@pytest.mark.timeout(90)
def test_an_async_tool_that_blocks_the_event_loop_keeps_heartbeating_and_runs_once(
    temporal_address: str,
) -> None:
    """The tool holds the worker's event loop for four heartbeat timeouts: its call
    still heartbeats, so Temporal does not start a second attempt beside it."""
    from temporalio.api.enums.v1 import EventType
    from temporalio.client import Client

    async def body(runner: TemporalRunner) -> tuple[str, list[int]]:
        handle = await runner.start("blocking", model="m", messages="go")
        try:
            final = (await handle.result(timeout=40)).final_text
        except TimeoutError:
            final = "no result: every attempt timed out"  # what a starved heartbeat does
        client = await Client.connect(temporal_address)
        attempts = [
            e.activity_task_started_event_attributes.attempt
            async for e in client.get_workflow_handle("blocking").fetch_history_events()
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
        ]
        return final, attempts

    _blocking_starts.clear()
    final, attempts = _with_runner(
        temporal_address,
        body,
        models={"m": _one_call("blocking")},
        tools=[blocking],
        retry_interval=0.1,
    )
    assert _blocking_starts == ["k1"]  # one attempt, never two at once
    assert attempts == [1, 1, 1]
    assert final == "heard 1"
    # The thread that heartbeat the held call ends once no call runs (heartbeat / 6).
    for _ in range(100):
        if not any(t.name == "statemachine-heartbeats" for t in threading.enumerate()):
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the heartbeat thread outlived the calls it watched")


_gate: list[asyncio.Event] = []  # the run's: set once its tool waits, then opened


@sm.tool
async def gate() -> str:
    """Wait until the test opens the gate."""
    entered, opened = _gate
    entered.set()
    await opened.wait()
    return "opened"


@pytest.mark.timeout(240)
def test_steers_sent_at_once_through_several_handles_all_reach_the_next_model_call(
    temporal_address: str,
) -> None:
    """A handle has at most ten updates of its run in flight (the server's limit); three
    handles sending at once have thirty, and the server turns the others away for a
    while: they are sent again until it takes them, so every acknowledged steer
    reaches the model call after the tool."""
    from temporalio.client import Client

    handles, each = 6, 50

    async def body(runner: TemporalRunner) -> sm.RunResult:
        run_id = f"crowd-{uuid.uuid4().hex[:8]}"
        _gate[:] = [asyncio.Event(), asyncio.Event()]
        handle = await runner.start(run_id, model="m", messages="go")
        await asyncio.wait_for(_gate[0].wait(), 30)
        client = await Client.connect(temporal_address)
        senders = [TemporalRunHandle(client, run_id, message_timeout=150) for _ in range(handles)]
        await asyncio.gather(
            *(s.steer(f"steer {i}-{n}") for i, s in enumerate(senders) for n in range(each))
        )
        _gate[1].set()
        return await handle.result(timeout=60)

    result = _with_runner(temporal_address, body, models={"m": _one_call("gate")}, tools=[gate])
    assert result.final_text == f"heard {1 + handles * each}"  # the call after the tool
    said = [m.text for m in result.messages if isinstance(m, sm.UserMessage)]
    assert sorted(said) == sorted(
        ["go", *(f"steer {i}-{n}" for i in range(handles) for n in range(each))]
    )


class _Watch(Interceptor):
    """A client interceptor (temporalio's public hook) that counts the most updates in
    flight at once."""

    def __init__(self) -> None:
        self.now = self.most = 0

    def intercept_client(self, next: OutboundInterceptor) -> OutboundInterceptor:
        return _Counting(next, self)


class _Counting(OutboundInterceptor):
    def __init__(self, next: OutboundInterceptor, watch: _Watch) -> None:
        super().__init__(next)
        self.watch = watch

    async def start_workflow_update(self, input: StartWorkflowUpdateInput) -> Any:
        self.watch.now += 1
        self.watch.most = max(self.watch.most, self.watch.now)
        try:
            return await super().start_workflow_update(input)
        finally:
            self.watch.now -= 1


@pytest.mark.timeout(240)
def test_steers_sent_at_once_through_a_handle_each_share_the_runs_ten_updates_in_flight(
    temporal_address: str,
) -> None:
    """300 handles of one run, one steer each, all at once: the handles of a run in one
    process share its ten updates in flight (the server's limit), rather than each
    sending its own and waiting on the server's refusals (299 at once, most of them
    ``StoreUnavailableError`` after ``message_timeout``), so every steer is
    acknowledged within it."""
    from temporalio.client import Client

    handles = 300
    watch = _Watch()

    async def body(runner: TemporalRunner) -> sm.RunResult:
        run_id = f"crowds-{uuid.uuid4().hex[:8]}"
        _gate[:] = [asyncio.Event(), asyncio.Event()]
        handle = await runner.start(run_id, model="m", messages="go")
        await asyncio.wait_for(_gate[0].wait(), 30)
        client = await Client.connect(temporal_address, interceptors=[watch])
        senders = [TemporalRunHandle(client, run_id, message_timeout=30) for _ in range(handles)]
        await asyncio.gather(*(s.steer(f"steer {i}") for i, s in enumerate(senders)))
        _gate[1].set()
        return await handle.result(timeout=60)

    result = _with_runner(temporal_address, body, models={"m": _one_call("gate")}, tools=[gate])
    assert watch.most <= IN_FLIGHT, watch.most  # the server's limit, shared by the 300 handles
    assert result.final_text == f"heard {1 + handles}"
    said = [m.text for m in result.messages if isinstance(m, sm.UserMessage)]
    assert sorted(said) == sorted(["go", *(f"steer {i}" for i in range(handles))])


@pytest.mark.timeout(30)
def test_the_runs_in_flight_registry_empties_once_no_update_waits_or_is_in_flight() -> None:
    """Updates of one run share ``IN_FLIGHT`` slots per event loop; the run's entry
    goes once the last one is done, also when one was cancelled while it waited."""
    held: list[int] = [0, 0]  # now, most

    async def update(run: str, opened: asyncio.Event) -> None:
        async with in_flight(run):
            held[0] += 1
            held[1] = max(held)
            await opened.wait()
            held[0] -= 1

    async def burst() -> set[str]:
        opened = asyncio.Event()
        tasks = [asyncio.create_task(update(f"run-{i % 2}", opened)) for i in range(50)]
        waiter = asyncio.create_task(update("run-0", opened))
        while held[0] < 2 * IN_FLIGHT:
            await asyncio.sleep(0)
        waiter.cancel()  # waits for a slot: cancelled, it leaves its run's entry
        await asyncio.gather(waiter, return_exceptions=True)
        runs = {run for run, _ in _inflight._REGISTRY}
        opened.set()
        await asyncio.gather(*tasks)
        return runs

    assert asyncio.run(burst()) == {"run-0", "run-1"}
    assert held == [0, 2 * IN_FLIGHT]  # ten of each run at once, never more
    assert _inflight._REGISTRY == {}
    assert asyncio.run(burst()) == {"run-0", "run-1"}  # a second loop has its own slots
    assert _inflight._REGISTRY == {}


_EXIT_SCRIPT = """
import asyncio, gc, sys
from statemachine.durable.temporal import open_store
from statemachine.errors import UnknownRunError

gc.disable()  # garbage is collected only when asked for (or by the interpreter's end)
store = open_store(sys.argv[1])


async def look():
    try:
        await store.handle("no-such-run")
    except UnknownRunError:
        pass


asyncio.run(look())
asyncio.run(look())  # the store's client, made on the first loop, used on a second


class Cycle:
    def __init__(self):
        self.me = self

    def __del__(self):
        sys.__stdout__.write("finalizing\\n" if sys.is_finalizing() else "before exit\\n")


Cycle()
"""


@pytest.mark.timeout(60)
def test_a_store_collects_its_clients_garbage_before_the_interpreter_finalizes(
    temporal_address: str, tmp_path: Path
) -> None:
    """What the client leaves in reference cycles is freed at exit while the interpreter
    is whole: freed while it finalizes, its native threads could abort the process
    ("Fatal Python error: PyGILState_Release", now and then)."""
    script = tmp_path / "store_exit.py"
    script.write_text(_EXIT_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), f"temporal://{temporal_address}/default"],
        capture_output=True,
        text=True,
        timeout=50,
        env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent)),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["before exit"]

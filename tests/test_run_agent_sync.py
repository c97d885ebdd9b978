"""``run_agent_sync``: a run for code without an event loop, which closes its own loop
without waiting for what the run abandoned."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
from typing import Any

import pytest
from driver_support import (
    asks,
    make_tool,
)

import statemachine as sm
from statemachine.core.messages import (
    AssistantMessage,
    StopReason,
    ToolCall,
    UserMessage,
)
from statemachine.core.table import TurnState
from statemachine.testing import ScriptedModel

S = TurnState


@pytest.mark.timeout(30)
def test_run_agent_sync_closes_its_event_loop() -> None:
    loops: list[asyncio.AbstractEventLoop] = []

    async def where() -> str:
        loops.append(asyncio.get_running_loop())
        return "here"

    call = ToolCall("c1", "where", {})
    result = sm.run_agent_sync(
        model=ScriptedModel(
            AssistantMessage([call], stop_reason=StopReason.TOOL_USE), AssistantMessage("done")
        ),
        messages=[UserMessage("go")],
        tools=[make_tool("where", where)],
    )
    assert result.state is S.DONE
    (loop,) = loops
    assert loop.is_closed()


@pytest.mark.timeout(30)
def test_run_agent_sync_closes_the_async_generators_it_leaves_open() -> None:
    closed: list[str] = []
    kept: list[Any] = []

    async def numbers() -> Any:
        try:
            yield 1
            yield 2
        finally:
            closed.append("generator closed")

    async def first() -> str:
        generator = numbers()
        kept.append(generator)  # still referenced: only the loop's shutdown closes it
        return str(await generator.__anext__())

    call = ToolCall("c1", "first", {})
    result = sm.run_agent_sync(
        model=ScriptedModel(
            AssistantMessage([call], stop_reason=StopReason.TOOL_USE), AssistantMessage("done")
        ),
        messages=[UserMessage("go")],
        tools=[make_tool("first", first)],
    )
    assert result.state is S.DONE
    assert closed == ["generator closed"]


@pytest.mark.timeout(30)
def test_run_agent_sync_keeps_quiet_about_a_task_it_abandoned(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def stubborn() -> str:
        while True:
            try:
                await asyncio.sleep(10.0)
            except asyncio.CancelledError:
                pass

    controller = sm.AbortController()

    def abort_soon(call: ToolCall) -> None:
        threading.Timer(0.2, controller.abort, ["stop"]).start()

    result = sm.run_agent_sync(
        model=ScriptedModel(asks("stubborn")),
        messages=[UserMessage("go")],
        tools=[make_tool("stubborn", stubborn)],
        signal=controller.signal,
        before_tool_call=abort_soon,
        grace_period=0.05,
    )
    assert result.state is S.ABORTED
    assert "abandoned" in result.explanation
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        gc.collect()
    assert "destroyed but it is pending" not in caplog.text


def _leaving_a_task(cleanup: float, grace: float) -> tuple[sm.RunResult, list[str], Any]:
    """``run_agent_sync`` of a run whose tool starts a task that runs forever and
    returns: the result, what the task's cleanup (``cleanup`` seconds long, after its
    cancellation) recorded, and the task."""
    ended: list[str] = []
    kept: list[Any] = []

    async def forever() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            if cleanup:
                await asyncio.sleep(cleanup)
            ended.append("cleaned up")
            raise

    async def spawn() -> str:
        kept.append(asyncio.ensure_future(forever()))
        return "spawned"

    call = ToolCall("c1", "spawn", {})
    result = sm.run_agent_sync(
        model=ScriptedModel(
            AssistantMessage([call], stop_reason=StopReason.TOOL_USE), AssistantMessage("done")
        ),
        messages=[UserMessage("go")],
        tools=[make_tool("spawn", spawn)],
        grace_period=grace,
    )
    assert result.state is S.DONE
    return result, ended, kept[0]


@pytest.mark.timeout(30)
def test_run_agent_sync_cancels_the_tasks_a_run_leaves_behind() -> None:
    # A tool that starts a background task and returns leaves it running when the run
    # ends: run_agent_sync cancels it before it closes its loop (its cleanup runs then).
    _, ended, task = _leaving_a_task(cleanup=0.0, grace=0.2)
    assert ended == ["cleaned up"]
    assert task.cancelled()


@pytest.mark.timeout(30)
def test_a_signal_shared_by_many_runs_keeps_no_listener_of_a_finished_run() -> None:
    # A caller may pass one AbortSignal to run after run: each run stops listening to it
    # when it ends, so the signal does not hold every finished run (white-box: the
    # listeners are what would grow, and nothing public counts them).
    controller = sm.AbortController()
    for _ in range(5):
        result = sm.run_agent_sync(
            model=ScriptedModel(AssistantMessage("done")),
            messages=[UserMessage("go")],
            signal=controller.signal,
        )
        assert result.state is S.DONE
    assert not controller.signal._listeners  # none held


@pytest.mark.timeout(30)
def test_run_agent_sync_lets_a_left_task_finish_its_cleanup_within_the_grace_period() -> None:
    _, ended, _ = _leaving_a_task(cleanup=0.05, grace=5.0)
    assert ended == ["cleaned up"]


@pytest.mark.timeout(30)
def test_run_agent_sync_waits_for_a_left_task_no_longer_than_its_grace_period() -> None:
    _, ended, task = _leaving_a_task(cleanup=0.5, grace=0.01)
    assert ended == []
    assert not task.done()

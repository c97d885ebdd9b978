"""Aborting a run: the abort goes ahead of what is queued, the grace period is one
budget, every call is answered, a KeyboardInterrupt is raised once the run is closed."""

from __future__ import annotations

import asyncio

import pytest
from driver_support import (
    aborted_at_half_a_second,
    asking_run,
    asks,
    forever,
    ignores_one_cancellation,
    make_tool,
    on_virtual_time,
)

import statemachine as sm
from statemachine.agent.events import RunReturned, ToolEnded
from statemachine.core.messages import (
    AssistantMessage,
    StopReason,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from statemachine.core.table import Trigger, TurnState
from statemachine.core.tools import ToolOutput
from statemachine.testing import ScriptedModel

S = TurnState


@pytest.mark.timeout(30)
def test_a_hook_being_asked_is_cancelled_at_the_abort_before_the_run_ends() -> None:
    order: list[str] = []

    async def before(call: ToolCall) -> None:
        run.abort("stop")
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            order.append("hook cancelled")
            raise

    async def watch() -> None:
        async for event in run.events():
            if isinstance(event, RunReturned):
                order.append("run returned")

    run = asking_run({"wait": forever}, before_tool_call=before)

    async def main() -> sm.RunResult:
        watcher = asyncio.ensure_future(watch())
        result = await run.run()
        await watcher
        return result

    result = on_virtual_time(main)
    assert result.state is S.ABORTED
    assert order == ["hook cancelled", "run returned"]


@pytest.mark.timeout(30)
def test_a_keyboard_interrupt_from_an_abort_listener_is_raised_once_the_run_closes() -> None:
    interrupt = KeyboardInterrupt("ctrl-c in a listener")
    closed: list[str] = []

    async def listens(signal: sm.AbortSignal) -> str:
        def stop(reason: object) -> None:
            raise interrupt

        signal.add_listener(stop)
        try:
            await asyncio.Event().wait()
        finally:
            closed.append("tool cleaned up")
        return "never"

    run = asking_run({"listens": listens}, grace_period=1.0)

    async def main() -> None:
        asyncio.get_running_loop().call_later(0.5, run.abort, "stop")
        await run.run()

    with pytest.raises(KeyboardInterrupt) as raised:
        on_virtual_time(main)
    assert raised.value is interrupt
    assert closed == ["tool cleaned up"]


async def _for_a_long_time() -> str:
    await asyncio.sleep(1000.0)
    return "late"


@pytest.mark.timeout(30)
def test_a_second_abort_in_the_grace_period_still_ends_the_run_in_time() -> None:
    run = asking_run({"long": _for_a_long_time}, grace_period=2.0)

    async def main() -> tuple[sm.RunResult, float]:
        loop = asyncio.get_running_loop()
        loop.call_later(1.0, run.abort, "first")
        loop.call_later(1.5, run.abort, "second")
        started = loop.time()
        result = await run.run()
        return result, loop.time() - started

    result, seconds = on_virtual_time(main)
    assert result.state is S.ABORTED
    assert "first" in result.explanation
    assert seconds < 1.0 + 2.0 + 0.5


@pytest.mark.timeout(30)
def test_a_cancelled_call_beside_an_abandoned_one_reports_once() -> None:
    run = asking_run({"wait": forever, "stubborn": ignores_one_cancellation}, grace_period=1.0)

    async def main() -> sm.RunResult:
        asyncio.get_running_loop().call_later(0.5, run.abort, "stop")
        return await run.run()

    result = on_virtual_time(main)
    assert result.state is S.ABORTED
    texts = {m.tool_call_id: m.text for m in result.messages if isinstance(m, ToolResultMessage)}
    assert sorted(texts) == ["c1", "c2"]
    assert "ignored cancellation" in texts["c2"]
    assert "ignored cancellation" not in texts["c1"]


@pytest.mark.timeout(30)
def test_one_abort_is_one_transition_whatever_arrives_after_it() -> None:
    run = sm.AgentRun(
        model=ScriptedModel(asks("wait", "wait")),
        messages=[UserMessage("go")],
        tools=[make_tool("wait", forever)],
        grace_period=1.0,
    )

    async def main() -> sm.RunResult:
        asyncio.get_running_loop().call_later(0.5, run.abort, "stop")
        return await run.run()

    result = on_virtual_time(main)
    assert result.state is S.ABORTED
    assert [r.trigger for r in result.trace].count(Trigger.ABORT) == 1


@pytest.mark.timeout(30)
def test_input_queued_just_before_an_abort_that_ends_the_run_is_returned() -> None:
    async def before(call: ToolCall) -> None:
        run.steer("also check the logs")
        run.abort("stop")
        await asyncio.Event().wait()

    run = asking_run({"wait": forever}, before_tool_call=before)
    result = on_virtual_time(run.run)
    assert result.state is S.ABORTED
    assert [q.message for q in result.queued_input] == [UserMessage("also check the logs")]


@pytest.mark.timeout(30)
def test_calls_due_after_an_interrupting_hook_are_answered_not_started() -> None:
    interrupt = KeyboardInterrupt("ctrl-c in a hook")
    ran: list[str] = []

    async def gate() -> str:
        ran.append("gate")
        return "open"

    async def step(text: str) -> str:
        ran.append(text)
        return text

    def after(call: ToolCall, output: ToolOutput) -> None:
        if call.name == "gate":
            raise interrupt

    calls = [
        ToolCall("c1", "gate", {}),
        ToolCall("c2", "step", {"text": "two"}),
        ToolCall("c3", "step", {"text": "three"}),
    ]
    gate.__doc__ = "The gate tool."
    run = sm.AgentRun(
        model=ScriptedModel(AssistantMessage(calls, stop_reason=StopReason.TOOL_USE)),
        messages=[UserMessage("go")],
        tools=[sm.tool(sequential=True)(gate), make_tool("step", step)],
        after_tool_call=after,
    )
    with pytest.raises(KeyboardInterrupt) as raised:
        on_virtual_time(run.run)
    assert raised.value is interrupt
    assert ran == ["gate"]
    result = run.result
    assert result is not None
    assert result.state is S.ABORTED
    texts = {m.tool_call_id: m.text for m in result.messages if isinstance(m, ToolResultMessage)}
    assert "KeyboardInterrupt" in texts["c1"]
    assert "not started" in texts["c2"]
    assert "not started" in texts["c3"]
    # counted as calls of their tool that were cancelled, as any call answered that way
    assert result.stats is not None
    assert result.stats.tool_calls["step"] == {"cancelled": 2}


@pytest.mark.timeout(30)
def test_a_tool_with_a_timeout_is_cancelled_with_the_run() -> None:
    cleaned: list[str] = []

    async def slow() -> str:
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.append("slow cleaned up")
        return "never"

    slow.__doc__ = "The slow tool."
    run = sm.AgentRun(
        model=ScriptedModel(asks("slow")),
        messages=[UserMessage("go")],
        tools=[sm.tool(timeout=100.0)(slow)],
        grace_period=1.0,
    )

    async def main() -> tuple[sm.RunResult, list[str]]:
        asyncio.get_running_loop().call_later(0.5, run.abort, "stop")
        result = await run.run()
        return result, list(cleaned)

    result, cleaned_by_then = on_virtual_time(main)
    assert result.state is S.ABORTED
    assert cleaned_by_then == ["slow cleaned up"]


@pytest.mark.timeout(30)
def test_a_cancelled_error_a_tool_raises_after_the_abort_reads_as_the_abort() -> None:
    async def quits(signal: sm.AbortSignal) -> str:
        fired = asyncio.Event()
        signal.add_listener(lambda reason: fired.set())
        await fired.wait()
        raise asyncio.CancelledError

    run = asking_run({"quits": quits}, grace_period=2.0)

    async def main() -> sm.RunResult:
        asyncio.get_running_loop().call_later(0.5, run.abort, "stop")
        return await run.run()

    result = on_virtual_time(main)
    assert result.state is S.ABORTED
    (only,) = [m for m in result.messages if isinstance(m, ToolResultMessage)]
    assert only.text == "Operation aborted: CancelledError"
    assert only.is_error


@pytest.mark.timeout(30)
def test_a_caller_cancelling_twice_still_gets_the_running_tools_cancelled() -> None:
    cleaned: list[str] = []

    async def waits() -> str:
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.append("waits cleaned up")
        return "never"

    run = asking_run({"waits": waits}, grace_period=10.0)

    async def main() -> tuple[list[str], float]:
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(run.run())
        await asyncio.sleep(0.5)  # the tool is running
        task.cancel()  # the run aborts; its grace period starts
        await asyncio.sleep(0.5)
        task.cancel()  # again, well within the grace period
        second = loop.time()
        with pytest.raises(asyncio.CancelledError):
            await task
        return list(cleaned), loop.time() - second

    cleaned_up, waited = on_virtual_time(main)
    assert cleaned_up == ["waits cleaned up"]
    # Cancelled at once, not left to the abort's timer half a grace period later
    # (virtual time: the figure is exact, whatever the machine's load).
    assert waited < 1.0


@pytest.mark.timeout(30)
def test_a_tool_cancelled_in_the_grace_period_has_the_rest_of_it_to_clean_up() -> None:
    # The grace period after an abort is one budget: half for the tool to finish on
    # its own, then it is cancelled and its cleanup has what is left (half of it). A
    # cleanup that takes a quarter of the grace period ends in time: the call is
    # reported cancelled, not abandoned.
    grace = 1.0
    cleaned: list[str] = []

    async def deaf() -> str:
        try:
            await asyncio.Event().wait()  # does not listen to the abort signal
        except asyncio.CancelledError:
            await asyncio.sleep(grace * 0.25)
            cleaned.append("deaf cleaned up")
            raise
        return "never"

    run = asking_run({"deaf": deaf}, grace_period=grace)
    result, ended = aborted_at_half_a_second(run, "stop", ToolEnded)
    assert result.state is S.ABORTED
    assert cleaned == ["deaf cleaned up"]
    assert [(e.cancelled, e.abandoned) for e in ended] == [(True, False)]
    assert [e.output.is_error for e in ended] == [True]  # a cancelled call is no success
    (only,) = [m for m in result.messages if isinstance(m, ToolResultMessage)]
    assert "ignored cancellation" not in only.text


@pytest.mark.timeout(30)
def test_a_lone_tool_run_as_a_task_is_cancelled_by_the_abort() -> None:
    run = asking_run({"deaf": forever}, after_tool_call=lambda call, output: None, grace_period=0.5)
    result, ended = aborted_at_half_a_second(run, "enough", ToolEnded)
    assert result.state is S.ABORTED
    assert [(e.call.id, e.cancelled, e.abandoned) for e in ended] == [("c1", True, False)]


@pytest.mark.timeout(10)
def test_a_run_tells_whether_it_is_being_aborted() -> None:
    seen: list[bool] = []
    run: sm.AgentRun | None = None

    @sm.tool
    async def stop(text: str) -> str:
        """Abort the run it runs in."""
        assert run is not None
        seen.append(run.aborting)
        run.abort("enough")
        seen.append(run.aborting)
        return text

    asks = sm.AssistantMessage((sm.ToolCall("c1", "stop", {"text": "x"}),))
    run = sm.AgentRun(model=ScriptedModel(asks, "done"), messages="go", tools=[stop])
    before = run.aborting
    result = asyncio.run(run.run())
    assert result.state is TurnState.ABORTED
    assert (before, seen, run.aborting) == (False, [False, True], False)

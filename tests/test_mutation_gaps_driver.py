"""Tests written for mutants of the driver (``statemachine/agent/``) that outlived the
suite (``bench/mutate.py``; each gap is listed in ``bench/mutation.md``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

import attrs
import pytest

import statemachine as sm
from statemachine.agent.events import RunFinished, ToolEnded, TurnEnded
from statemachine.core.events import ModelCancelled, ToolCancelled
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
from statemachine.testing.clock import IdleSkippingLoop

S = TurnState
_T = TypeVar("_T")


def _on_virtual_time(main: Callable[[], Coroutine[Any, Any, _T]]) -> _T:
    """Run ``main()`` on the idle-skipping loop: waits and grace periods cost nothing."""
    with asyncio.Runner(loop_factory=IdleSkippingLoop) as runner:
        return runner.run(main())


def _tool(name: str, fn: Callable[..., Any]) -> sm.Tool:
    fn.__name__ = name
    fn.__doc__ = f"The {name} tool."
    return sm.tool(fn)


def _asks(*names: str) -> AssistantMessage:
    calls = [ToolCall(f"c{i}", name, {}) for i, name in enumerate(names, 1)]
    return AssistantMessage(calls, stop_reason=StopReason.TOOL_USE)


async def _forever() -> str:
    await asyncio.Event().wait()
    return "never"


@pytest.mark.timeout(30)
def test_a_hook_being_asked_is_cancelled_at_the_abort_before_the_run_ends() -> None:
    # Gap: the before_tool_call hook in progress was cancelled only when the run
    # closed, after it had reported its end, not when the abort came.
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
            if isinstance(event, RunFinished):
                order.append("run finished")

    run = sm.AgentRun(
        model=ScriptedModel(_asks("wait")),
        messages=[UserMessage("go")],
        tools=[_tool("wait", _forever)],
        before_tool_call=before,
    )

    async def main() -> sm.RunResult:
        watcher = asyncio.ensure_future(watch())
        result = await run.run()
        await watcher
        return result

    result = _on_virtual_time(main)
    assert result.state is S.Aborted
    assert order == ["hook cancelled", "run finished"]


@pytest.mark.timeout(30)
def test_a_keyboard_interrupt_from_an_abort_listener_is_raised_once_the_run_closes() -> None:
    # Gap: a KeyboardInterrupt raised by a tool's abort listener when the caller
    # aborted could be swallowed; the run must close, then raise it.
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

    run = sm.AgentRun(
        model=ScriptedModel(_asks("listens")),
        messages=[UserMessage("go")],
        tools=[_tool("listens", listens)],
        grace_period=1.0,
    )

    async def main() -> None:
        asyncio.get_running_loop().call_later(0.5, run.abort, "stop")
        await run.run()

    with pytest.raises(KeyboardInterrupt) as raised:
        _on_virtual_time(main)
    assert raised.value is interrupt
    assert closed == ["tool cleaned up"]


async def _for_a_long_time() -> str:
    await asyncio.sleep(1000.0)
    return "late"


@pytest.mark.timeout(30)
def test_a_second_abort_in_the_grace_period_still_ends_the_run_in_time() -> None:
    # Gap: a second abort was acted on again, which cancelled the grace period's own
    # timer: a tool still running was never cancelled, and the run waited for it.
    run = sm.AgentRun(
        model=ScriptedModel(_asks("long")),
        messages=[UserMessage("go")],
        tools=[_tool("long", _for_a_long_time)],
        grace_period=2.0,
    )

    async def main() -> tuple[sm.RunResult, float]:
        loop = asyncio.get_running_loop()
        loop.call_later(1.0, run.abort, "first")
        loop.call_later(1.5, run.abort, "second")
        started = loop.time()
        result = await run.run()
        return result, loop.time() - started

    result, seconds = _on_virtual_time(main)
    assert result.state is S.Aborted
    assert "first" in result.explanation
    assert seconds < 1.0 + 2.0 + 0.5


async def _ignores_one_cancellation() -> str:
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        await asyncio.sleep(5.0)  # past the grace period: abandoned
    return "late"


@pytest.mark.timeout(30)
def test_a_cancelled_call_beside_an_abandoned_one_reports_once() -> None:
    # Gap: an operation's report was not remembered, so at the end of the grace
    # period a call that had already reported its cancellation was reported again
    # (the engine refuses a second result for a call).
    run = sm.AgentRun(
        model=ScriptedModel(_asks("wait", "stubborn")),
        messages=[UserMessage("go")],
        tools=[_tool("wait", _forever), _tool("stubborn", _ignores_one_cancellation)],
        grace_period=1.0,
    )

    async def main() -> sm.RunResult:
        asyncio.get_running_loop().call_later(0.5, run.abort, "stop")
        return await run.run()

    result = _on_virtual_time(main)
    assert result.state is S.Aborted
    texts = {m.tool_call_id: m.text for m in result.messages if isinstance(m, ToolResultMessage)}
    assert sorted(texts) == ["c1", "c2"]
    assert "ignored cancellation" in texts["c2"]
    assert "ignored cancellation" not in texts["c1"]


@pytest.mark.timeout(30)
def test_one_abort_is_one_transition_whatever_arrives_after_it() -> None:
    # Gap: the abort handed ahead of the queue was handed to the engine again before
    # every later event (the engine absorbs a repeated abort, but records it).
    run = sm.AgentRun(
        model=ScriptedModel(_asks("wait", "wait")),
        messages=[UserMessage("go")],
        tools=[_tool("wait", _forever)],
        grace_period=1.0,
    )

    async def main() -> sm.RunResult:
        asyncio.get_running_loop().call_later(0.5, run.abort, "stop")
        return await run.run()

    result = _on_virtual_time(main)
    assert result.state is S.Aborted
    assert [r.trigger for r in result.trace].count(Trigger.abort) == 1


_E = TypeVar("_E")


def _watched(
    run: sm.AgentRun, kind: type[_E], abort: str | None = None
) -> tuple[sm.RunResult, list[_E]]:
    """Run ``run`` on virtual time, with its events of ``kind``; aborted after 0.5 s
    for the reason ``abort`` when one is given."""
    seen: list[_E] = []

    async def main() -> sm.RunResult:
        async def watch() -> None:
            async for event in run.events():
                if isinstance(event, kind):
                    seen.append(event)

        watcher = asyncio.ensure_future(watch())
        if abort is not None:
            asyncio.get_running_loop().call_later(0.5, run.abort, abort)
        result = await run.run()
        await watcher
        return result

    return _on_virtual_time(main), seen


def _aborted_at_half_a_second(
    run: sm.AgentRun, reason: str, kind: type[_E]
) -> tuple[sm.RunResult, list[_E]]:
    """Run ``run`` on virtual time, aborted after 0.5 s; with its events of ``kind``."""
    return _watched(run, kind, abort=reason)


@pytest.mark.timeout(30)
def test_the_run_finished_event_carries_the_explanation() -> None:
    # Gap: nothing read RunFinished.explanation.
    run = sm.AgentRun(
        model=ScriptedModel(_asks("wait")),
        messages=[UserMessage("go")],
        tools=[_tool("wait", _forever)],
        grace_period=0.5,
    )
    result, finished = _aborted_at_half_a_second(run, "enough", RunFinished)
    assert "enough" in result.explanation
    assert [(e.state, e.explanation) for e in finished] == [(S.Aborted, result.explanation)]


@pytest.mark.timeout(30)
def test_input_queued_just_before_an_abort_that_ends_the_run_is_returned() -> None:
    # Gap: a message queued ahead of an abort that ended the run at once was taken
    # from the queue and dropped instead of being returned with the result.
    async def before(call: ToolCall) -> None:
        run.steer("also check the logs")
        run.abort("stop")
        await asyncio.Event().wait()

    run = sm.AgentRun(
        model=ScriptedModel(_asks("wait")),
        messages=[UserMessage("go")],
        tools=[_tool("wait", _forever)],
        before_tool_call=before,
    )
    result = _on_virtual_time(run.run)
    assert result.state is S.Aborted
    assert [q.message for q in result.queued_input] == [UserMessage("also check the logs")]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("watched", [False, True], ids=["quiet", "watched"])
def test_a_turn_stopped_at_its_boundary_is_timed_once(watched: bool) -> None:
    # Gap: the turn timer was not cleared at the turn's end, so the run's end right
    # after a boundary counted the same turn twice (stats and TurnEnded); each path
    # (with a subscriber and without) times the turn, and the time is a duration.
    async def echo(text: str) -> str:
        return text

    def stop(messages: object, turn: int) -> sm.Stop:
        return sm.Stop("one turn is enough")

    ask = AssistantMessage(
        [ToolCall("c1", "echo", {"text": "hi"})], stop_reason=StopReason.TOOL_USE
    )
    run = sm.AgentRun(
        model=ScriptedModel(ask),
        messages=[UserMessage("go")],
        tools=[_tool("echo", echo)],
        should_continue=stop,
    )
    result, ended = _watched(run, TurnEnded) if watched else (_on_virtual_time(run.run), [])
    assert result.state is S.Done
    assert result.turns == 1
    assert result.stats is not None
    assert len(result.stats.turn_seconds) == 1
    assert 0.0 <= result.stats.turn_seconds[0] <= result.stats.wall_seconds
    if watched:
        assert [(e.turn, e.seconds) for e in ended] == [(1, result.stats.turn_seconds[0])]


@pytest.mark.timeout(30)
def test_calls_due_after_an_interrupting_hook_are_answered_not_started() -> None:
    # Gap (no test ran it): after_tool_call raising KeyboardInterrupt aborts the run
    # behind the call's result; the engine, handed that result first, asks for the
    # calls that were waiting for it, which must not start but each be answered as
    # never begun.
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
        tools=[sm.tool(sequential=True)(gate), _tool("step", step)],
        after_tool_call=after,
    )
    with pytest.raises(KeyboardInterrupt) as raised:
        _on_virtual_time(run.run)
    assert raised.value is interrupt
    assert ran == ["gate"]
    result = run.result
    assert result is not None
    assert result.state is S.Aborted
    texts = {m.tool_call_id: m.text for m in result.messages if isinstance(m, ToolResultMessage)}
    assert "KeyboardInterrupt" in texts["c1"]
    assert "not started" in texts["c2"]
    assert "not started" in texts["c3"]
    # counted as calls of their tool that were cancelled, as any call answered that way
    assert result.stats is not None
    assert result.stats.tool_calls["step"] == {"cancelled": 2}


@pytest.mark.timeout(30)
def test_the_turn_times_are_durations_within_the_run() -> None:
    # Gap: a turn's time was never compared with anything.
    async def echo(text: str) -> str:
        await asyncio.sleep(0.25)
        return text

    call = ToolCall("c1", "echo", {"text": "hi"})
    run = sm.AgentRun(
        model=ScriptedModel(
            AssistantMessage([call], stop_reason=StopReason.TOOL_USE), AssistantMessage("done")
        ),
        messages=[UserMessage("go")],
        tools=[_tool("echo", echo)],
    )
    result = asyncio.run(run.run())
    assert result.state is S.Done
    assert result.stats is not None
    assert len(result.stats.turn_seconds) == 2
    assert 0.25 <= sum(result.stats.turn_seconds) <= result.stats.wall_seconds


@pytest.mark.timeout(30)
def test_a_tool_with_a_timeout_is_cancelled_with_the_run() -> None:
    # Gap (no test ran it): cancelling a tool that has a timeout must cancel the task
    # that runs it, not only the task waiting for it.
    cleaned: list[str] = []

    async def slow() -> str:
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.append("slow cleaned up")
        return "never"

    slow.__doc__ = "The slow tool."
    run = sm.AgentRun(
        model=ScriptedModel(_asks("slow")),
        messages=[UserMessage("go")],
        tools=[sm.tool(timeout=100.0)(slow)],
        grace_period=1.0,
    )

    async def main() -> tuple[sm.RunResult, list[str]]:
        asyncio.get_running_loop().call_later(0.5, run.abort, "stop")
        result = await run.run()
        return result, list(cleaned)

    result, cleaned_by_then = _on_virtual_time(main)
    assert result.state is S.Aborted
    assert cleaned_by_then == ["slow cleaned up"]


@pytest.mark.timeout(30)
def test_a_cancelled_error_a_tool_raises_after_the_abort_reads_as_the_abort() -> None:
    # Gap: a tool that raises CancelledError itself once the run's signal fired (no
    # one cancelled its task yet) gets "Operation aborted", not a plain failure.
    async def quits(signal: sm.AbortSignal) -> str:
        fired = asyncio.Event()
        signal.add_listener(lambda reason: fired.set())
        await fired.wait()
        raise asyncio.CancelledError

    run = sm.AgentRun(
        model=ScriptedModel(_asks("quits")),
        messages=[UserMessage("go")],
        tools=[_tool("quits", quits)],
        grace_period=2.0,
    )

    async def main() -> sm.RunResult:
        asyncio.get_running_loop().call_later(0.5, run.abort, "stop")
        return await run.run()

    result = _on_virtual_time(main)
    assert result.state is S.Aborted
    (only,) = [m for m in result.messages if isinstance(m, ToolResultMessage)]
    assert only.text == "Operation aborted: CancelledError"
    assert only.is_error


@pytest.mark.timeout(30)
def test_an_agent_run_runs_once() -> None:
    # Gap: nothing ran an AgentRun twice.
    run = sm.AgentRun(model=ScriptedModel(AssistantMessage("done")), messages=[UserMessage("go")])
    assert asyncio.run(run.run()).state is S.Done
    with pytest.raises(sm.UsageError, match="an AgentRun runs once"):
        asyncio.run(run.run())


@pytest.mark.timeout(30)
def test_a_caller_cancelling_twice_still_gets_the_running_tools_cancelled() -> None:
    # Gap: the run's last cleanup (when the caller cancelled run() a second time,
    # during the abort's grace period) must cancel what still runs.
    cleaned: list[str] = []

    async def waits() -> str:
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.append("waits cleaned up")
        return "never"

    run = sm.AgentRun(
        model=ScriptedModel(_asks("waits")),
        messages=[UserMessage("go")],
        tools=[_tool("waits", waits)],
        grace_period=10.0,
    )

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

    cleaned_up, waited = _on_virtual_time(main)
    assert cleaned_up == ["waits cleaned up"]
    # Cancelled at once, not left to the abort's timer half a grace period later
    # (virtual time: the figure is exact, whatever the machine's load).
    assert waited < 1.0


@pytest.mark.timeout(30)
def test_a_tool_that_ignores_its_timeout_signal_is_cancelled() -> None:
    # Gap: after a tool's timeout and the grace period, a tool still running must be
    # cancelled, not left behind.
    cleaned: list[str] = []

    async def deaf() -> str:
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.append("deaf cleaned up")
        return "never"

    deaf.__doc__ = "The deaf tool."
    run = sm.AgentRun(
        model=ScriptedModel(_asks("deaf"), AssistantMessage("done")),
        messages=[UserMessage("go")],
        tools=[sm.tool(timeout=1.0)(deaf)],
        grace_period=1.0,
    )

    async def main() -> tuple[sm.RunResult, list[str]]:
        result = await run.run()
        return result, list(cleaned)

    result, cleaned_by_then = _on_virtual_time(main)
    assert result.state is S.Done
    assert cleaned_by_then == ["deaf cleaned up"]
    (only,) = [m for m in result.messages if isinstance(m, ToolResultMessage)]
    assert "timed out after 1 s" in only.text


@pytest.mark.timeout(30)
def test_a_keyboard_interrupt_from_transform_context_is_raised_after_the_run() -> None:
    # Gap: the context hook's KeyboardInterrupt must stop the process like the others,
    # once the run is closed, not only fail the model call.
    interrupt = KeyboardInterrupt("ctrl-c in transform_context")

    def transform(messages: Sequence[sm.Message]) -> Sequence[sm.Message]:
        raise interrupt

    run = sm.AgentRun(
        model=ScriptedModel(AssistantMessage("done")),
        messages=[UserMessage("go")],
        transform_context=transform,
    )
    with pytest.raises(KeyboardInterrupt) as raised:
        _on_virtual_time(run.run)
    assert raised.value is interrupt
    assert run.result is not None
    assert run.result.state is S.Failed
    assert "KeyboardInterrupt" in run.result.explanation


@pytest.mark.timeout(30)
def test_only_the_abandoned_call_is_reported_abandoned_in_the_events() -> None:
    # Gap: ToolEnded.abandoned was not read for a call that was only cancelled.
    run = sm.AgentRun(
        model=ScriptedModel(_asks("wait", "stubborn")),
        messages=[UserMessage("go")],
        tools=[_tool("wait", _forever), _tool("stubborn", _ignores_one_cancellation)],
        grace_period=1.0,
    )
    ended: dict[str, tuple[bool, bool]] = {}

    async def main() -> sm.RunResult:
        async def watch() -> None:
            async for event in run.events():
                if isinstance(event, ToolEnded):
                    ended[event.call.id] = (event.cancelled, event.abandoned)

        watcher = asyncio.ensure_future(watch())
        asyncio.get_running_loop().call_later(0.5, run.abort, "stop")
        result = await run.run()
        await watcher
        return result

    assert _on_virtual_time(main).state is S.Aborted
    assert ended == {"c1": (True, False), "c2": (True, True)}


@pytest.mark.timeout(30)
def test_a_tools_time_is_the_time_it_ran() -> None:
    async def nap() -> str:
        await asyncio.sleep(0.01)
        return "rested"

    async def quick() -> str:
        return "done"

    call = ToolCall("c1", "nap", {})
    lone = ToolCall("c2", "quick", {})
    model = ScriptedModel(
        AssistantMessage((call,), stop_reason=StopReason.TOOL_USE),
        AssistantMessage((lone,), stop_reason=StopReason.TOOL_USE),
        AssistantMessage("ok"),
    )
    result = asyncio.run(
        sm.run_agent(
            model=model,
            tools=[_tool("nap", nap), _tool("quick", quick)],
            messages=[UserMessage("go")],
        )
    )
    assert result.state is S.Done
    assert result.stats is not None
    seconds = result.stats.tool_seconds
    assert 0.005 <= seconds["c1"] < 30  # a clock difference, not a sum of clock readings
    assert 0 <= seconds["c2"] < 30


@pytest.mark.timeout(30)
def test_a_should_continue_answer_that_is_not_none_or_stop_stops_the_run_saying_so() -> None:
    async def echo(text: str) -> str:
        return text

    def should_continue(messages: Sequence[sm.Message], turn: int) -> object:
        return "yes, go on"  # neither None nor Stop

    model = ScriptedModel(
        *(
            AssistantMessage((ToolCall(f"c{i}", "echo", {"text": "x"}),), StopReason.TOOL_USE)
            for i in range(3)
        )
    )
    result = asyncio.run(
        sm.run_agent(
            model=model,
            tools=[_tool("echo", echo)],
            messages=[UserMessage("go")],
            should_continue=should_continue,  # type: ignore[arg-type]
        )
    )
    assert result.state is S.Done
    assert result.turns == 1
    assert "the should_continue hook returned str, expected None or Stop" in result.explanation


@pytest.mark.timeout(30)
def test_progress_reported_on_the_event_loop_reaches_subscribers_before_the_calls_end() -> None:
    # A report made on the loop's thread is handed to the subscribers at once. Two
    # calls of one batch run as tasks: the first ends at once and wakes the run, the
    # second reports progress and ends in the same pass of the loop; a report held
    # back to a later pass would reach the subscribers after the second call's end.
    async def quick() -> str:
        return "quick"

    async def reports() -> str:
        assert sm.report_progress("half way")
        return "reported"

    run = sm.AgentRun(
        model=ScriptedModel(_asks("quick", "reports"), AssistantMessage("done")),
        messages=[UserMessage("go")],
        tools=[_tool("quick", quick), _tool("reports", reports)],
    )
    seen: list[str] = []

    async def main() -> sm.RunResult:
        async def watch() -> None:
            async for event in run.events():
                if isinstance(event, sm.ToolProgress):
                    seen.append(f"progress {event.call_id}")
                elif isinstance(event, ToolEnded):
                    seen.append(f"ended {event.call.id}")

        watcher = asyncio.ensure_future(watch())
        result = await run.run()
        await watcher
        return result

    assert _on_virtual_time(main).state is S.Done
    assert seen.index("progress c2") < seen.index("ended c2")
    assert seen.count("progress c2") == 1


@pytest.mark.timeout(30)
def test_a_long_run_keeps_no_finished_hook_tasks() -> None:
    # White-box: the tasks that ask the hooks (should_continue at each turn's end,
    # before_tool_call before each call) are memory the run holds; a finished one must
    # be let go, or a long run grows by one task per question. Nothing public shows it.
    turns = 30

    async def echo(text: str) -> str:
        return text

    def allow(call: ToolCall) -> None:
        return None

    def go_on(messages: Sequence[sm.Message], turn: int) -> None:
        return None

    model = ScriptedModel(
        *(
            AssistantMessage((ToolCall(f"c{i}", "echo", {"text": "x"}),), StopReason.TOOL_USE)
            for i in range(turns)
        ),
        AssistantMessage("done"),
    )
    run = sm.AgentRun(
        model=model,
        messages=[UserMessage("go")],
        tools=[_tool("echo", echo)],
        max_turns=turns + 1,
        before_tool_call=allow,
        should_continue=go_on,
    )
    result = _on_virtual_time(run.run)
    assert result.state is S.Done
    assert result.turns == turns + 1
    assert run._helpers == set()


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

    run = sm.AgentRun(
        model=ScriptedModel(_asks("deaf")),
        messages=[UserMessage("go")],
        tools=[_tool("deaf", deaf)],
        grace_period=grace,
    )
    result, ended = _aborted_at_half_a_second(run, "stop", ToolEnded)
    assert result.state is S.Aborted
    assert cleaned == ["deaf cleaned up"]
    assert [(e.cancelled, e.abandoned) for e in ended] == [(True, False)]
    assert [e.output.is_error for e in ended] == [True]  # a cancelled call is no success
    (only,) = [m for m in result.messages if isinstance(m, ToolResultMessage)]
    assert "ignored cancellation" not in only.text


@pytest.mark.timeout(30)
def test_an_operation_that_ends_without_reporting_is_answered_as_cancelled() -> None:
    # White-box: every operation of the library reports its own end, so an operation
    # whose task is over without a word cannot be made through the public API. The
    # end of the grace period still answers it, as what it is: the model call with a
    # ModelCancelled, a tool call with a ToolCancelled for that call.
    run = sm.AgentRun(model=ScriptedModel(AssistantMessage("done")), messages=[UserMessage("go")])

    async def silent() -> None:
        return None

    async def main() -> list[object]:
        remove = run._begin(asyncio.get_running_loop())
        try:
            for key in ("model", "c1"):
                task = asyncio.ensure_future(silent())
                await task
                run._tasks[key] = task
            await run._cancel_after_grace(["model", "c1"], "stop")
            assert run._inbox is not None
            return list(run._inbox._items)
        finally:
            remove()

    assert _on_virtual_time(main) == [ModelCancelled(), ToolCancelled("c1")]


@pytest.mark.timeout(30)
def test_an_after_tool_call_answer_that_is_not_a_tool_output_is_an_error_result() -> None:
    async def echo(text: str) -> str:
        return text

    def after(call: ToolCall, output: ToolOutput) -> object:
        return "replaced"  # neither None nor a ToolOutput

    model = ScriptedModel(
        AssistantMessage((ToolCall("c1", "echo", {"text": "secret"}),), StopReason.TOOL_USE),
        AssistantMessage("done"),
    )
    result = _on_virtual_time(
        lambda: sm.run_agent(
            model=model,
            tools=[_tool("echo", echo)],
            messages=[UserMessage("go")],
            after_tool_call=after,  # type: ignore[arg-type]
        )
    )
    assert result.state is S.Done
    (only,) = [m for m in result.messages if isinstance(m, ToolResultMessage)]
    assert only.is_error
    assert "The after_tool_call hook returned str, expected a ToolOutput or None" in only.text
    assert "secret" not in only.text


@pytest.mark.timeout(30)
def test_the_wall_time_of_a_run_is_the_time_it_took() -> None:
    async def nap() -> str:
        await asyncio.sleep(0.01)
        return "rested"

    model = ScriptedModel(_asks("nap"), AssistantMessage("done"))

    async def main() -> tuple[sm.RunResult, float]:
        started = time.perf_counter()
        result = await sm.run_agent(
            model=model, tools=[_tool("nap", nap)], messages=[UserMessage("go")]
        )
        return result, time.perf_counter() - started

    result, took = asyncio.run(main())
    assert result.state is S.Done
    assert result.stats is not None
    assert 0.005 <= result.stats.wall_seconds <= took  # a clock difference, not a sum


@pytest.mark.timeout(30)
def test_a_lone_coroutine_tool_knows_its_call_and_reports_progress() -> None:
    # Gap: a call that runs alone is started without a task of its own; its context
    # must still name the call, for current_tool_call and report_progress.
    seen: list[tuple[str | None, bool]] = []

    async def whoami() -> str:
        call = sm.current_tool_call()
        seen.append((None if call is None else call.id, sm.report_progress("half")))
        return "ok"

    run = sm.AgentRun(
        model=ScriptedModel(_asks("whoami"), AssistantMessage("done")),
        messages=[UserMessage("go")],
        tools=[_tool("whoami", whoami)],
    )
    result, progress = _watched(run, sm.ToolProgress)
    assert result.state is S.Done
    assert seen == [("c1", True)]
    assert [(e.call_id, e.data) for e in progress] == [("c1", "half")]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("second", ["returns a dict", "raises"])
def test_a_client_that_fails_after_a_good_answer_fails_the_run(second: str) -> None:
    # Gap: after an answer queued straight from the client's coroutine, the next
    # call's failure (an answer of the wrong type, or an exception before it ever
    # waits) must still be reported, not dropped as already reported, which left the
    # run waiting forever.
    class Turncoat:
        def __init__(self) -> None:
            self.calls = 0

        async def complete(self, messages: object, tools: object, signal: object) -> object:
            self.calls += 1
            if self.calls == 1:
                return _asks("echo")
            if second == "raises":
                raise RuntimeError("the provider is down")
            return {"role": "assistant", "content": []}

    async def echo() -> str:
        return "ok"

    run = sm.AgentRun(
        model=Turncoat(),  # type: ignore[arg-type]
        messages=[UserMessage("go")],
        tools=[_tool("echo", echo)],
    )

    async def main() -> sm.RunResult:
        return await asyncio.wait_for(run.run(), timeout=5.0)

    result = _on_virtual_time(main)
    assert result.state is S.Failed
    last = result.messages[-1]
    assert isinstance(last, AssistantMessage)
    expected = "the provider is down" if second == "raises" else "ModelOutputError"
    assert expected in (last.error_message or "")


@pytest.mark.timeout(30)
def test_a_timed_out_tool_that_heeds_its_signal_stops_on_it_and_is_not_cancelled() -> None:
    # Gap: after a tool's timeout, its signal fires and it gets the grace period to
    # stop on its own; only then is it cancelled. One that stops on the signal, with
    # a cleanup that awaits, must not be cancelled in the middle of that cleanup.
    stopped: list[str] = []

    async def careful(signal: sm.AbortSignal) -> str:
        heard = asyncio.Event()
        signal.add_listener(lambda reason: heard.set())
        await heard.wait()
        try:
            await asyncio.sleep(0.1)  # flushing its work, well within the grace period
        except asyncio.CancelledError:
            stopped.append("cancelled in its cleanup")
            raise
        stopped.append("stopped on its signal")
        return "partial work saved"

    careful.__doc__ = "Stops when its signal fires."
    run = sm.AgentRun(
        model=ScriptedModel(_asks("careful"), AssistantMessage("done")),
        messages=[UserMessage("go")],
        tools=[sm.tool(timeout=0.05)(careful)],
        grace_period=5.0,
    )
    result = _on_virtual_time(run.run)
    assert result.state is S.Done
    assert stopped == ["stopped on its signal"]
    (answer,) = [m for m in result.messages if isinstance(m, ToolResultMessage)]
    assert answer.text == "Tool careful timed out after 0.05 s"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("alone", [True, False], ids=["alone", "beside-another"])
def test_a_keyboard_interrupt_while_reading_a_tools_output_is_raised_after_the_run(
    alone: bool,
) -> None:
    # Gap: an interrupt raised while the output a tool returned was read became that
    # call's error result, and the run went on as if nothing had happened.
    interrupt = KeyboardInterrupt("ctrl-c while reading")

    class Treacherous(list[sm.TextContent]):
        def __iter__(self) -> Any:
            raise interrupt

    async def odd(arguments: dict[str, Any], signal: sm.AbortSignal) -> Any:
        return Treacherous([sm.TextContent("x")])

    async def fine() -> str:
        return "fine"

    tools = [sm.Tool(sm.ToolDefinition("odd", "Odd output."), odd), _tool("fine", fine)]
    names = ("odd",) if alone else ("odd", "fine")
    run = sm.AgentRun(
        model=ScriptedModel(_asks(*names), AssistantMessage("never asked")),
        messages=[UserMessage("go")],
        tools=tools,
    )
    with pytest.raises(KeyboardInterrupt) as raised:
        _on_virtual_time(run.run)
    assert raised.value is interrupt
    result = run.result
    assert result is not None
    assert result.state is S.Aborted


@pytest.mark.timeout(30)
def test_a_lone_tool_run_as_a_task_is_cancelled_by_the_abort() -> None:
    # Gap: a call run alone but as a task (here because an after_tool_call hook wraps
    # it) was not kept with the run's tasks, so the abort never cancelled it and the
    # run waited for it forever (the test's timeout fails it).
    run = sm.AgentRun(
        model=ScriptedModel(_asks("deaf")),
        messages=[UserMessage("go")],
        tools=[_tool("deaf", _forever)],
        after_tool_call=lambda call, output: None,
        grace_period=0.5,
    )
    result, ended = _aborted_at_half_a_second(run, "enough", ToolEnded)
    assert result.state is S.Aborted
    assert [(e.call.id, e.cancelled, e.abandoned) for e in ended] == [("c1", True, False)]


@pytest.mark.timeout(30)
def test_a_tool_call_stops_listening_to_the_runs_signal_when_it_ends() -> None:
    # Gap: the own signal of each call with a timeout listens to the run's, and must
    # stop when the call ends, or the run's signal holds one listener for every call
    # ever made (white-box: the listeners are what would grow, and nothing public
    # counts them).
    async def echo(text: str) -> str:
        """Repeat the text back."""
        return text

    calls = [ToolCall(f"c{i}", "echo", {"text": str(i)}) for i in range(3)]
    run = sm.AgentRun(
        model=ScriptedModel(
            AssistantMessage(calls, stop_reason=StopReason.TOOL_USE), AssistantMessage("done")
        ),
        messages=[UserMessage("go")],
        tools=[sm.tool(timeout=30.0)(echo)],
    )
    assert _on_virtual_time(run.run).state is S.Done
    assert run._controller.signal._listeners == []


@pytest.mark.timeout(30)
def test_a_client_may_answer_with_a_subclass_of_assistant_message() -> None:
    # Gap: an answer of a subclass of AssistantMessage is an AssistantMessage; only
    # the exact class was ever returned by the tests' clients.
    @attrs.frozen
    class Annotated(AssistantMessage):
        pass

    class Client:
        async def complete(self, messages: object, tools: object, signal: object) -> object:
            await asyncio.sleep(0)  # answered after a wait: the client runs as a task
            return Annotated("all done")

    run = sm.AgentRun(model=Client(), messages=[UserMessage("go")])  # type: ignore[arg-type]
    result = _on_virtual_time(run.run)
    assert result.state is S.Done
    assert isinstance(result.messages[-1], Annotated)
    assert result.messages[-1].text == "all done"

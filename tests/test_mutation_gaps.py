"""Tests written for mutants of the engine, the table and the driver that outlived the suite
(``bench/mutate.py``; each gap is listed in ``bench/mutation.md``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, ClassVar, TypeVar

import attrs
import pytest

import statemachine as sm
from statemachine.agent.events import RunFinished, TurnEnded
from statemachine.core import state
from statemachine.core.engine import Engine
from statemachine.core.errors import ProtocolError, WireFormatError
from statemachine.core.events import (
    AbortRequested,
    CallModel,
    CheckPermission,
    InputQueued,
    ModelResponded,
    RunEnded,
    Start,
    ToolDenied,
    ToolFinished,
)
from statemachine.core.messages import (
    AssistantMessage,
    StopReason,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from statemachine.core.table import INTERNAL_TRIGGERS, TRANSITIONS, Trigger, TurnState
from statemachine.core.tools import ToolDefinition, ToolOutput
from statemachine.testing import ScriptedModel
from statemachine.testing.clock import IdleSkippingLoop

_T = TypeVar("_T")

S = TurnState
ECHO = ToolDefinition(
    "echo",
    "Repeat the text back.",
    {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
)


def _denied_engine() -> Engine:
    """An engine stopped in AwaitingUser by a policy denial."""
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")], check_permissions=True)
    engine.handle(Start())
    call = ToolCall("c1", "echo", {"text": "hi"})
    engine.handle(ModelResponded(AssistantMessage([call], stop_reason=StopReason.TOOL_USE)))
    actions = engine.handle(ToolDenied("c1", "not on weekends"))
    assert engine.state is S.AwaitingUser
    assert any(isinstance(a, RunEnded) for a in actions)
    return engine


@pytest.mark.timeout(30)
def test_a_message_after_a_policy_denial_resumes_the_run() -> None:
    # Gap: the denial was never forgotten, so a person's answer led straight back to
    # AwaitingUser and the run could never go on.
    engine = _denied_engine()
    actions = engine.handle(InputQueued(UserMessage("fine, use another tool")))
    assert engine.state is S.AwaitingModel
    assert [type(a) for a in actions] == [CallModel]
    assert engine.messages[-1] == UserMessage("fine, use another tool")
    assert engine.turns == 2


@pytest.mark.timeout(30)
def test_the_lone_internal_rows_carry_their_firing_guard() -> None:
    # The table's docstring: the lone rows of dispatched and settled carry the guard
    # that fires them, so the diagrams can show it. (Without it the engine behaves the
    # same, because it fires them only when the guard holds; the drawing does not.)
    for trigger in (Trigger.dispatched, Trigger.settled):
        rows = [r for r in TRANSITIONS if r.trigger is trigger]
        assert len(rows) == 1, trigger
        assert rows[0].guard is INTERNAL_TRIGGERS[trigger], trigger


@pytest.mark.timeout(30)
def test_calls_after_one_with_unreadable_arguments_are_still_checked() -> None:
    # Gap: resolving a call whose arguments could not be parsed stopped the checks of
    # the batch, so a later call to an unknown tool was started as if it were valid.
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")], check_permissions=True)
    engine.handle(Start())
    calls = [
        ToolCall("c1", "echo", {}, parse_error="Expecting value: line 1 column 9"),
        ToolCall("c2", "no_such_tool", {"text": "hi"}),
        ToolCall("c3", "echo", {"text": "hi"}),
    ]
    actions = engine.handle(
        ModelResponded(AssistantMessage(calls, stop_reason=StopReason.TOOL_USE))
    )
    # Only the valid call is asked about; the other two are answered with errors.
    assert [a.call.id for a in actions if isinstance(a, CheckPermission)] == ["c3"]
    assert [c.id for c in engine.pending_calls()] == ["c3"]
    results = [m for m in engine.messages if isinstance(m, ToolResultMessage)]
    assert [(r.tool_call_id, r.is_error) for r in results] == [("c1", True), ("c2", True)]
    assert "Unknown tool: no_such_tool" in results[1].text


@pytest.mark.timeout(30)
def test_a_response_reporting_an_abort_explains_itself_with_its_own_message() -> None:
    # Gap: the aborted response's own error message could be dropped from the
    # explanation without any test noticing.
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")])
    engine.handle(Start())
    response = AssistantMessage(
        [ToolCall("c1", "echo", {"text": "hi"})],
        stop_reason=StopReason.ABORTED,
        error_message="stream cut by the user",
    )
    engine.handle(ModelResponded(response))
    assert engine.state is S.Aborted
    assert engine.explanation is not None
    assert "reports that it was aborted: stream cut by the user" in engine.explanation


class _LateAbort(AbortRequested):
    """A subclass of an input event: not in the engine's table of event classes."""


@attrs.frozen
class _InternalTrigger:
    trigger: ClassVar[Trigger] = Trigger.dispatched


@pytest.mark.timeout(30)
def test_events_outside_the_event_classes_are_judged_by_their_trigger() -> None:
    # Gap: which duck-typed events are accepted was untested. An input trigger is
    # accepted from any class that names it; an internal one never is.
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")])
    engine.handle(Start())
    with pytest.raises(ProtocolError, match="not an input event"):
        engine.handle(_InternalTrigger())  # type: ignore[arg-type]
    before = engine.state
    engine.handle(_LateAbort("stop"))
    assert (before, engine.state) == (S.AwaitingModel, S.Aborting)


@pytest.mark.timeout(30)
def test_a_steering_message_enters_the_history_once() -> None:
    # Gap: the steering queue was not emptied once injected, so the message would be
    # sent again at every later model call; nothing checked it entered only once.
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")], max_turns=4)
    engine.handle(Start())
    engine.handle(InputQueued(UserMessage("also run the tests")))
    call = ToolCall("c1", "echo", {"text": "hi"})
    engine.handle(ModelResponded(AssistantMessage([call], stop_reason=StopReason.TOOL_USE)))
    engine.handle(ToolFinished("c1", ToolOutput("hi")))
    assert engine.state is S.AwaitingModel
    call2 = ToolCall("c2", "echo", {"text": "again"})
    engine.handle(ModelResponded(AssistantMessage([call2], stop_reason=StopReason.TOOL_USE)))
    engine.handle(ToolFinished("c2", ToolOutput("again")))
    steering = [m for m in engine.messages if m == UserMessage("also run the tests")]
    assert len(steering) == 1
    assert engine.queued_input() == ()


@pytest.mark.timeout(30)
def test_a_snapshot_missing_a_delivered_result_is_refused() -> None:
    # Gap: with every result of the batch delivered, the history may not end with an
    # unanswered call; a snapshot that drops a result must not be restored.
    snapshot = _denied_engine().snapshot()
    messages = snapshot["messages"]
    assert messages[-1]["role"] == "toolResult"
    broken = {**snapshot, "messages": messages[:-1]}
    with pytest.raises(WireFormatError, match=r"snapshot\.flushed: 1, but 0 message\(s\) follow"):
        Engine.restore(broken)
    assert Engine.restore(snapshot).state is S.AwaitingUser


class _UnaskableLogger:
    """A logger whose level cannot be asked: it must be given every event."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def bind(self, **_: object) -> _UnaskableLogger:
        return self

    def is_enabled_for(self, level: int) -> bool:
        raise RuntimeError("no level here")

    def debug(self, event: str, **_: object) -> None:
        self.events.append(event)

    info = warning = debug


@pytest.mark.timeout(30)
def test_a_logger_that_cannot_be_asked_its_level_gets_the_transitions() -> None:
    # Gap: a logger whose level check raises could silently lose the transition log.
    logger = _UnaskableLogger()
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")], logger=logger)
    engine.handle(Start())
    assert "transition" in logger.events


# -- the driver (statemachine/agent/loop.py) --------------------------------------------------


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


@pytest.mark.timeout(30)
def test_the_run_finished_event_carries_the_explanation() -> None:
    # Gap: nothing read RunFinished.explanation.
    run = sm.AgentRun(
        model=ScriptedModel(_asks("wait")),
        messages=[UserMessage("go")],
        tools=[_tool("wait", _forever)],
        grace_period=0.5,
    )
    finished: list[RunFinished] = []

    async def main() -> sm.RunResult:
        async def watch() -> None:
            async for event in run.events():
                if isinstance(event, RunFinished):
                    finished.append(event)

        watcher = asyncio.ensure_future(watch())
        asyncio.get_running_loop().call_later(0.5, run.abort, "enough")
        result = await run.run()
        await watcher
        return result

    result = _on_virtual_time(main)
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
def test_a_turn_stopped_at_its_boundary_is_timed_once() -> None:
    # Gap: the turn timer was not cleared at the turn's end, so the run's end right
    # after a boundary counted the same turn twice (stats and TurnEnded).
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
    ended: list[int] = []

    async def main() -> sm.RunResult:
        async def watch() -> None:
            async for event in run.events():
                if isinstance(event, TurnEnded):
                    ended.append(event.turn)

        watcher = asyncio.ensure_future(watch())
        result = await run.run()
        await watcher
        return result

    result = _on_virtual_time(main)
    assert result.state is S.Done
    assert result.turns == 1
    assert len(result.stats.turn_seconds) == 1
    assert ended == [1]


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


# -- the engine's state (statemachine/core/state.py) ------------------------------------------


def _holding(text: str) -> Engine:
    """An engine whose second call finished first: its result is held for call order."""
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")])
    engine.handle(Start())
    calls = [ToolCall("c1", "echo", {"text": "a"}), ToolCall("c2", "echo", {"text": "b"})]
    engine.handle(ModelResponded(AssistantMessage(calls, stop_reason=StopReason.TOOL_USE)))
    engine.handle(ToolFinished("c2", ToolOutput(text)))
    return engine


@pytest.mark.timeout(30)
def test_a_result_held_for_call_order_is_part_of_the_control_key() -> None:
    # Gap: the held result could drop out of the key, although it is what the next
    # model call will be sent.
    assert _holding("one").control_key() == _holding("one").control_key()
    assert _holding("one").control_key() != _holding("two").control_key()


@pytest.mark.timeout(60)
def test_the_repr_cache_of_the_control_key_is_bounded_and_kept() -> None:
    # Gap: neither the bound of the cache nor that it keeps anything was checked.
    state._REPRS.clear()
    values = [UserMessage(str(i)) for i in range(state._REPRS_MAX)]
    for value in values:
        state._rendered(value)
    assert len(state._REPRS) == state._REPRS_MAX  # kept, up to the bound
    state._rendered(values[0])
    assert len(state._REPRS) == state._REPRS_MAX  # a value seen before is not added
    state._rendered(UserMessage("one more"))
    assert len(state._REPRS) == 1  # full: cleared, then the new value
    state._REPRS.clear()

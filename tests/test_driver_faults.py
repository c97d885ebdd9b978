"""The driver under faults: exceptions that are not ``Exception``, and abort against
tools and clients that ignore it.

Runs go on the idle-skipping event loop where they can (a hang or a grace period
costs no real time, and ``loop.time()`` gives exact durations to assert on); tests
with threads or blocking calls run in real time with generous hang guards.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

import pytest
from structlog.testing import capture_logs

import statemachine as sm
import statemachine.messages
from statemachine.core.invariants import history_violations
from statemachine.testing import FunctionModel
from statemachine.testing.clock import IdleSkippingLoop

Reply = sm.AssistantMessage | Callable[[sm.AbortSignal], Awaitable[Any]]


def scripted_then_done(*replies: Reply) -> FunctionModel:
    """Answers from a script (``DONE`` once it runs out): a message, or a coroutine
    function of the signal."""
    script = list(replies)

    async def answer(
        messages: Sequence[sm.Message], tools: Sequence[sm.ToolDefinition], signal: sm.AbortSignal
    ) -> sm.AssistantMessage:
        reply = script.pop(0) if script else DONE
        if isinstance(reply, sm.AssistantMessage):
            return reply
        returned: sm.AssistantMessage = await reply(signal)
        return returned

    return FunctionModel(answer, with_signal=True)


def asks(*names: str) -> sm.AssistantMessage:
    calls = [sm.ToolCall(f"c{i}", name, {}) for i, name in enumerate(names, 1)]
    return sm.AssistantMessage(calls, stop_reason=sm.messages.StopReason.TOOL_USE)


DONE = sm.AssistantMessage("done")
GO = [sm.UserMessage("go")]


class Boom(BaseException):
    """Neither an ``Exception`` nor a request to stop the process."""


# Fresh instances per test: a raised exception keeps its traceback.
ODD: dict[str, Callable[[], BaseException]] = {
    "own-subclass": lambda: Boom("boom"),
    "GeneratorExit": lambda: GeneratorExit("closing"),
}
STOPPING: dict[str, Callable[[], BaseException]] = {
    "KeyboardInterrupt": lambda: KeyboardInterrupt("ctrl-c"),
    "SystemExit": lambda: SystemExit(3),
}


def results(result: sm.RunResult) -> dict[str, sm.ToolResultMessage]:
    return {m.tool_call_id: m for m in result.messages if isinstance(m, sm.ToolResultMessage)}


def on_virtual_time(main: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    """Run ``main()`` on the idle-skipping loop (hangs and grace periods cost nothing;
    the tests' timeouts guard against a hang)."""
    with asyncio.Runner(loop_factory=IdleSkippingLoop) as runner:
        return runner.run(main())


def make_tool(name: str, fn: Callable[..., Any], **options: Any) -> sm.Tool:
    fn.__name__ = name
    fn.__doc__ = f"The {name} tool."
    return sm.tool(**options)(fn)


def raising_tool(exc: BaseException, kind: str) -> sm.Tool:
    """A tool that raises ``exc``: async, sync (in a worker thread), or with a timeout
    (then it runs in a task of its own)."""
    if kind == "sync":

        def sync_body() -> str:
            raise exc

        return make_tool("bad", sync_body)

    async def body() -> str:
        await asyncio.sleep(0)
        raise exc

    return make_tool("bad", body, timeout=30.0 if kind == "timeout" else None)


# -- 1. a BaseException that is not an Exception is an ordinary failure ----------------------


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["async", "sync", "timeout"])
@pytest.mark.parametrize("make", ODD.values(), ids=ODD.keys())
def test_a_tool_raising_a_base_exception_gets_one_error_result(
    make: Callable[[], BaseException], kind: str
) -> None:
    exc = make()
    result = sm.run_agent_sync(
        model=scripted_then_done(asks("bad"), DONE), messages=GO, tools=[raising_tool(exc, kind)]
    )
    assert result.state is sm.TurnState.DONE
    (only,) = results(result).values()
    assert only.is_error
    assert type(exc).__name__ in only.text
    assert history_violations(result.messages) == []


@pytest.mark.timeout(30)
@pytest.mark.parametrize("make", ODD.values(), ids=ODD.keys())
def test_a_model_client_raising_a_base_exception_ends_failed(
    make: Callable[[], BaseException],
) -> None:
    exc = make()

    async def raises(signal: sm.AbortSignal) -> Any:
        raise exc

    result = sm.run_agent_sync(model=scripted_then_done(raises), messages=GO)
    assert result.state is sm.TurnState.FAILED
    assert type(exc).__name__ in result.explanation
    assert result.error is not None
    assert result.error.__cause__ is exc


def _hooks_raising(exc: BaseException, which: str) -> dict[str, Any]:
    def hook(*args: Any) -> Any:
        raise exc

    return {which: hook}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("make", ODD.values(), ids=ODD.keys())
@pytest.mark.parametrize(
    ("which", "state"),
    [
        ("before_tool_call", sm.TurnState.AWAITING_USER),  # fails closed: a policy denial
        ("after_tool_call", sm.TurnState.DONE),  # an error result keeping the tool's text
        ("should_continue", sm.TurnState.DONE),  # stops the run, explained
        ("transform_context", sm.TurnState.FAILED),  # fails the model call
    ],
)
def test_a_hook_raising_a_base_exception_takes_its_failure_path(
    make: Callable[[], BaseException], which: str, state: sm.TurnState
) -> None:
    exc = make()

    async def fine() -> str:
        return "tool text"

    result = sm.run_agent_sync(
        model=scripted_then_done(asks("fine"), DONE),
        messages=GO,
        tools=[make_tool("fine", fine)],
        **_hooks_raising(exc, which),
    )
    assert result.state is state
    name = type(exc).__name__
    if which == "after_tool_call":
        (only,) = results(result).values()
        assert only.is_error
        assert name in only.text
        assert "tool text" in only.text
    else:
        assert name in result.explanation
    assert history_violations(result.messages) == []


@pytest.mark.timeout(30)
def test_every_abort_listener_hears_the_abort_whatever_one_raises() -> None:
    controller = sm.AbortController()
    heard: list[str] = []

    def boom(reason: object) -> None:
        raise Boom("listener")

    def stop(reason: object) -> None:
        raise KeyboardInterrupt

    controller.signal.add_listener(boom)
    controller.signal.add_listener(stop)
    controller.signal.add_listener(lambda reason: heard.append(str(reason)))
    with capture_logs() as logs, pytest.raises(KeyboardInterrupt):
        controller.abort("now")
    # The KeyboardInterrupt comes after every listener ran; the others are logged.
    assert heard == ["now"]
    assert controller.signal.aborted
    assert [e["event"] for e in logs] == ["abort_listener_failed"]


@pytest.mark.timeout(30)
def test_a_tool_whose_abort_listener_raises_does_not_keep_the_run_from_ending() -> None:
    controller = sm.AbortController()

    async def touchy(signal: sm.AbortSignal) -> str:
        signal.add_listener(lambda reason: (_ for _ in ()).throw(Boom("listener")))
        controller.abort("stop")
        await asyncio.sleep(0)
        return "finished"

    result = sm.run_agent_sync(
        model=scripted_then_done(asks("touchy")),
        messages=GO,
        tools=[make_tool("touchy", touchy)],
        signal=controller.signal,
        grace_period=0.05,
    )
    assert result.state is sm.TurnState.ABORTED
    assert results(result)["c1"].text == "finished"


# -- 2. KeyboardInterrupt and SystemExit: close the run, then raise --------------------------


def _sibling_tools(events: list[str]) -> list[sm.Tool]:
    async def waits() -> str:
        try:
            await asyncio.Event().wait()
            return "never"
        finally:
            events.append("waits cleaned up")

    async def quick() -> str:
        return "quick result"

    return [make_tool("waits", waits), make_tool("quick", quick)]


async def _run_expecting(run: sm.AgentRun, exc: BaseException) -> set[asyncio.Task[Any]]:
    with pytest.raises(type(exc)) as raised:
        await run.run()
    assert raised.value is exc
    return asyncio.all_tasks() - {asyncio.current_task()}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["async", "sync", "timeout"])
@pytest.mark.parametrize("make", STOPPING.values(), ids=STOPPING.keys())
def test_a_stopping_exception_from_a_tool_is_raised_after_the_run_is_closed(
    make: Callable[[], BaseException], kind: str
) -> None:
    exc = make()
    events: list[str] = []
    tools = [*_sibling_tools(events), raising_tool(exc, kind)]
    run = sm.AgentRun(
        model=scripted_then_done(asks("quick", "waits", "bad")),
        messages=GO,
        tools=tools,
        grace_period=0.5,
    )

    leftovers = on_virtual_time(lambda: _run_expecting(run, exc))
    assert leftovers == set()  # every task cancelled and awaited
    assert events == ["waits cleaned up"]
    result = run.result
    assert result is not None
    assert result.state is sm.TurnState.ABORTED
    assert f"{type(exc).__name__} raised by tool bad" in result.explanation
    got = results(result)
    assert got["c1"].text == "quick result"
    assert got["c2"].is_error
    assert got["c2"].text.startswith("Operation aborted")
    assert got["c3"].is_error
    assert type(exc).__name__ in got["c3"].text
    assert history_violations(result.messages) == []


@pytest.mark.timeout(30)
@pytest.mark.parametrize("make", STOPPING.values(), ids=STOPPING.keys())
def test_a_stopping_exception_from_the_model_client_is_raised_after_the_run_ends(
    make: Callable[[], BaseException],
) -> None:
    exc = make()

    async def raises(signal: sm.AbortSignal) -> Any:
        raise exc

    model = scripted_then_done(raises, DONE)
    run = sm.AgentRun(model=model, messages=GO)
    assert on_virtual_time(lambda: _run_expecting(run, exc)) == set()
    assert run.result is not None
    assert run.result.state is sm.TurnState.FAILED
    assert type(exc).__name__ in run.result.explanation
    assert model.calls == 1


@pytest.mark.timeout(30)
@pytest.mark.parametrize("make", STOPPING.values(), ids=STOPPING.keys())
@pytest.mark.parametrize(
    ("which", "state"),
    [
        # The first call's denial names the error; the run is aborted behind it, so
        # the hook is not asked again and the other call is answered "not started".
        ("before_tool_call", sm.TurnState.ABORTED),
        ("after_tool_call", sm.TurnState.ABORTED),  # the waiting tool is cancelled
        ("should_continue", sm.TurnState.DONE),  # its Stop comes before the abort
    ],
)
def test_a_stopping_exception_from_a_hook_is_raised_after_the_run_is_closed(
    make: Callable[[], BaseException], which: str, state: sm.TurnState
) -> None:
    exc = make()
    events: list[str] = []
    asked: list[str] = []

    def hook(*args: Any) -> Any:
        asked.append(which)
        raise exc

    hooks: dict[str, Any] = {which: hook}
    names = ("quick",) if which == "should_continue" else ("quick", "waits")
    model = scripted_then_done(asks(*names), DONE)
    run = sm.AgentRun(
        model=model,
        messages=GO,
        tools=_sibling_tools(events),
        grace_period=0.5,
        **hooks,
    )
    assert on_virtual_time(lambda: _run_expecting(run, exc)) == set()
    result = run.result
    assert result is not None
    assert result.state is state
    assert asked == [which]
    assert model.calls == 1  # no model call after it
    assert len(results(result)) == len(names)
    assert type(exc).__name__ in (result.explanation + results(result)["c1"].text)
    assert history_violations(result.messages) == []


@pytest.mark.timeout(30)
def test_no_model_call_starts_after_a_stopping_exception_from_the_last_tool() -> None:
    exc = KeyboardInterrupt()
    model = scripted_then_done(asks("bad"), DONE)
    run = sm.AgentRun(model=model, messages=GO, tools=[raising_tool(exc, "async")])
    assert on_virtual_time(lambda: _run_expecting(run, exc)) == set()
    # The tool's error result completed the turn before the abort was handled; the
    # model call that the engine then asked for is never made.
    assert model.calls == 1
    assert run.result is not None
    assert run.result.state is sm.TurnState.ABORTED
    last = run.result.messages[-1]
    assert isinstance(last, sm.AssistantMessage)
    assert last.error_message == (
        "The model call was aborted: not started: the run was aborted before the call began"
    )


@pytest.mark.timeout(30)
def test_run_agent_sync_raises_a_keyboard_interrupt_from_a_tool() -> None:
    exc = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt) as raised:
        sm.run_agent_sync(
            model=scripted_then_done(asks("bad")), messages=GO, tools=[raising_tool(exc, "async")]
        )
    assert raised.value is exc


@pytest.mark.timeout(30)
def test_cancelling_run_closes_it_as_an_abort_with_every_call_answered() -> None:
    events: list[str] = []
    run = sm.AgentRun(
        model=scripted_then_done(asks("quick", "waits")),
        messages=GO,
        tools=_sibling_tools(events),
        grace_period=0.5,
    )

    async def main() -> None:
        task = asyncio.ensure_future(run.run())
        while not events and len(asyncio.all_tasks()) < 4:
            await asyncio.sleep(0)
        for _ in range(5):
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    on_virtual_time(main)
    assert events == ["waits cleaned up"]
    assert run.result is not None
    assert run.result.state is sm.TurnState.ABORTED
    assert "the caller cancelled the run" in run.result.explanation
    assert set(results(run.result)) == {"c1", "c2"}


# -- 3. abort ends the run within the grace period, whatever the tools do ----------------------


class Stubborn:
    """A tool body that swallows every cancellation and keeps awaiting, until released
    (after the run, so the test's loop can close)."""

    def __init__(self) -> None:
        self.released = False
        self.swallowed = 0

    async def wait_forever(self) -> None:
        while not self.released:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                self.swallowed += 1


GRACE = 2.0  # on the idle-skipping loop: costs no real time
SLACK = 0.5  # real time spent computing, which the virtual clock also counts


@pytest.mark.timeout(30)
def test_a_tool_that_swallows_cancellation_is_abandoned_at_the_end_of_the_grace() -> None:
    controller = sm.AbortController()
    stubborn = Stubborn()
    marks: dict[str, float] = {}

    async def obstinate() -> str:
        marks["abort"] = asyncio.get_running_loop().time()
        controller.abort("stop")
        await stubborn.wait_forever()
        return "never"

    run = sm.AgentRun(
        model=scripted_then_done(asks("obstinate")),
        messages=GO,
        tools=[make_tool("obstinate", obstinate)],
        signal=controller.signal,
        grace_period=GRACE,
    )
    ended: list[sm.ToolEnded] = []

    async def main() -> sm.RunResult:
        async def watch() -> None:
            async for event in run.events():
                if isinstance(event, sm.ToolEnded):
                    ended.append(event)

        watcher = asyncio.ensure_future(watch())
        result = await run.run()
        marks["return"] = asyncio.get_running_loop().time()
        marks["swallowed"] = stubborn.swallowed
        await watcher
        stubborn.released = True
        return result

    with capture_logs() as logs:
        result = on_virtual_time(main)
    assert marks["swallowed"] == 1  # it was cancelled once, and shrugged
    assert marks["return"] - marks["abort"] <= GRACE + SLACK
    assert result.state is sm.TurnState.ABORTED
    text = results(result)["c1"].text
    assert text == "Operation aborted: abandoned: the tool ignored cancellation"
    assert "abandoned tool obstinate (call c1)" in result.explanation
    assert "finished its cleanup" not in result.explanation
    assert [(e.cancelled, e.abandoned) for e in ended] == [(True, True)]
    assert "operation_abandoned" in [e["event"] for e in logs]


@pytest.mark.timeout(30)
def test_a_model_client_that_ignores_the_signal_and_cancellation_is_abandoned() -> None:
    controller = sm.AbortController()
    stubborn = Stubborn()
    marks: dict[str, float] = {}

    async def deaf(signal: sm.AbortSignal) -> Any:
        marks["abort"] = asyncio.get_running_loop().time()
        controller.abort("stop")
        await stubborn.wait_forever()

    model = scripted_then_done(deaf)

    async def main() -> sm.RunResult:
        result = await sm.run_agent(
            model=model, messages=GO, signal=controller.signal, grace_period=GRACE
        )
        marks["return"] = asyncio.get_running_loop().time()
        stubborn.released = True
        return result

    result = on_virtual_time(main)
    assert marks["return"] - marks["abort"] <= GRACE + SLACK
    assert result.state is sm.TurnState.ABORTED
    last = result.messages[-1]
    assert isinstance(last, sm.AssistantMessage)
    assert last.error_message == "The model call was aborted: abandoned: it ignored cancellation"
    assert "abandoned the model call" in result.explanation


@pytest.mark.timeout(30)
def test_a_tool_that_honours_the_signal_late_keeps_its_result_within_the_first_half() -> None:
    controller = sm.AbortController()

    async def slow_stop(signal: sm.AbortSignal) -> str:
        stopped = asyncio.Event()
        signal.add_listener(lambda _: stopped.set())
        controller.abort("stop")
        await stopped.wait()
        await asyncio.sleep(GRACE * 0.4)  # cleanup inside the first half of the grace
        return "stopped cleanly"

    result = on_virtual_time(
        lambda: sm.run_agent(
            model=scripted_then_done(asks("slow_stop")),
            messages=GO,
            tools=[make_tool("slow_stop", slow_stop)],
            signal=controller.signal,
            grace_period=GRACE,
        )
    )
    assert results(result)["c1"].text == "stopped cleanly"
    assert "finished its cleanup" in result.explanation


def _abort_from_another_thread(run: sm.AgentRun) -> None:
    """Call ``run.abort`` from a thread, and wait for it: the abort is then queued
    while this thread (the loop's) is still busy."""
    thread = threading.Thread(target=run.abort, args=("stop from the ui",))
    thread.start()
    thread.join()


@pytest.mark.timeout(30)
def test_a_tool_blocking_the_loop_delays_the_abort_only_until_the_loop_is_free() -> None:
    stubborn = Stubborn()
    marks: dict[str, float] = {}
    holder: list[sm.AgentRun] = []

    async def blocker() -> str:
        _abort_from_another_thread(holder[0])
        time.sleep(0.2)  # blocks the loop: nothing can interrupt this
        marks["free"] = asyncio.get_running_loop().time()
        await stubborn.wait_forever()
        return "never"

    run = sm.AgentRun(
        model=scripted_then_done(asks("blocker")),
        messages=GO,
        tools=[make_tool("blocker", blocker)],
        grace_period=GRACE,
    )
    holder.append(run)

    async def main() -> sm.RunResult:
        result = await run.run()
        marks["return"] = asyncio.get_running_loop().time()
        stubborn.released = True
        return result

    result = on_virtual_time(main)
    assert marks["return"] - marks["free"] <= GRACE + SLACK
    assert result.state is sm.TurnState.ABORTED
    assert "abandoned" in results(result)["c1"].text


@pytest.mark.timeout(30)
def test_a_cleanup_that_blocks_the_loop_past_the_grace_ends_the_run_once_free() -> None:
    controller = sm.AbortController()
    stubborn = Stubborn()
    marks: dict[str, float] = {}

    async def blocking_cleanup(signal: sm.AbortSignal) -> str:
        heard = asyncio.Event()
        signal.add_listener(lambda _: heard.set())
        controller.abort("stop")
        await heard.wait()
        await asyncio.sleep(0)  # the driver is now counting its grace period
        time.sleep(0.3)  # a blocking cleanup, longer than the whole grace period
        marks["free"] = asyncio.get_running_loop().time()
        await stubborn.wait_forever()
        return "never"

    async def main() -> sm.RunResult:
        result = await sm.run_agent(
            model=scripted_then_done(asks("blocking_cleanup")),
            messages=GO,
            tools=[make_tool("blocking_cleanup", blocking_cleanup)],
            signal=controller.signal,
            grace_period=0.1,
        )
        marks["return"] = asyncio.get_running_loop().time()
        stubborn.released = True
        return result

    result = on_virtual_time(main)
    assert marks["return"] - marks["free"] <= SLACK  # not another grace period
    assert result.state is sm.TurnState.ABORTED


@pytest.mark.timeout(30)
def test_no_model_call_starts_after_an_abort_queued_behind_a_result() -> None:
    holder: list[sm.AgentRun] = []

    async def blocker() -> str:
        _abort_from_another_thread(holder[0])
        time.sleep(0.05)
        return "finished while the abort waited"  # its result is queued first

    model = scripted_then_done(asks("blocker"), DONE)
    run = sm.AgentRun(model=model, messages=GO, tools=[make_tool("blocker", blocker)])
    holder.append(run)
    result = on_virtual_time(run.run)
    assert model.calls == 1
    assert result.state is sm.TurnState.ABORTED
    assert results(result)["c1"].text == "finished while the abort waited"
    assert "stop from the ui" in result.explanation
    # The abort was handled before the queued result: the run never reached a second
    # turn (not even one answered "not started").
    assert result.turns == 1
    assert isinstance(result.messages[-1], sm.ToolResultMessage)
    assert "while the tool calls of turn 1 were running" in result.explanation


@pytest.mark.timeout(30)
def test_no_tool_call_starts_after_the_abort() -> None:
    holder: list[sm.AgentRun] = []
    ran: list[str] = []

    async def first() -> str:
        ran.append("first")
        _abort_from_another_thread(holder[0])
        return "first result"

    async def second() -> str:
        ran.append("second")
        return "second result"

    run = sm.AgentRun(
        model=scripted_then_done(asks("first", "second")),
        messages=GO,
        tools=[make_tool("first", first, sequential=True), make_tool("second", second)],
    )
    holder.append(run)
    result = on_virtual_time(run.run)
    assert ran == ["first"]
    got = results(result)
    assert got["c1"].text == "first result"
    assert got["c2"].is_error
    assert "not started" in got["c2"].text
    assert result.state is sm.TurnState.ABORTED


@pytest.mark.timeout(30)
def test_run_agent_sync_returns_although_a_tool_never_gives_up() -> None:
    controller = sm.AbortController()
    swallowed: list[int] = []

    async def forever() -> str:
        controller.abort("stop")
        while True:  # never ends: the loop is closed around it
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                swallowed.append(1)

    started = time.monotonic()
    result = sm.run_agent_sync(
        model=scripted_then_done(asks("forever")),
        messages=GO,
        tools=[make_tool("forever", forever)],
        signal=controller.signal,
        grace_period=0.2,
    )
    assert time.monotonic() - started < 10  # asyncio.run would never return here
    assert result.state is sm.TurnState.ABORTED
    assert "abandoned" in results(result)["c1"].text
    assert swallowed


@pytest.mark.timeout(30)
def test_run_agent_sync_returns_although_a_sync_tool_blocks_in_its_thread() -> None:
    controller = sm.AbortController()
    release = threading.Event()

    def blocked() -> str:
        controller.abort("stop")
        release.wait(20)  # a thread cannot be interrupted
        return "too late"

    try:
        result = sm.run_agent_sync(
            model=scripted_then_done(asks("blocked")),
            messages=GO,
            tools=[make_tool("blocked", blocked)],
            signal=controller.signal,
            grace_period=0.1,
        )
    finally:
        release.set()
    assert result.state is sm.TurnState.ABORTED
    assert results(result)["c1"].text.startswith("Operation aborted")

"""The action loop (statemachine.agent.loop) and its in-process executor: operations
that do not wait cost no task, those that wait do, and the executor seam is explicit."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import sys
from collections.abc import Coroutine, Generator, Sequence
from typing import Any

import pytest

import statemachine as sm
from statemachine.agent.executor import _start
from statemachine.agent.loop import ActionLoop, Inbox
from statemachine.core.events import CallModel, InputQueued, Start
from statemachine.testing import ScriptedModel

GO = [sm.UserMessage("go")]
_seen: contextvars.ContextVar[str] = contextvars.ContextVar("test_loop_seen", default="")


def _asks(*names: str) -> sm.AssistantMessage:
    return sm.AssistantMessage(
        tuple(sm.ToolCall(f"c_{name}", name, {"text": name}) for name in names)
    )


@sm.tool
async def echo(text: str) -> str:
    """Echo the text."""
    _seen.set(text)  # in the call's own context, as in a task of its own
    return text


@sm.tool
async def sleepy(text: str) -> str:
    """Wait a little, then echo."""
    await asyncio.sleep(0.001)
    return text


async def _run_counting_tasks(
    model: ScriptedModel, tools: list[sm.Tool], **options: Any
) -> tuple[sm.RunResult, list[str]]:
    """Run ``run_agent`` (with ``options``), naming every asyncio task it creates."""
    loop = asyncio.get_running_loop()
    created: list[str] = []

    def factory(
        loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **kwargs: Any
    ) -> asyncio.Task[Any]:
        created.append(getattr(coro, "__qualname__", type(coro).__name__))
        return asyncio.Task(coro, loop=loop, **kwargs)

    loop.set_task_factory(factory)  # type: ignore[arg-type]
    try:
        result = await sm.run_agent(model=model, messages=GO, tools=tools, max_turns=10, **options)
    finally:
        loop.set_task_factory(None)
    return result, created


@pytest.mark.timeout(10)
def test_operations_that_do_not_wait_start_no_task() -> None:
    model = ScriptedModel(_asks("echo"), _asks("echo"), "done")
    result, created = asyncio.run(_run_counting_tasks(model, [echo]))
    assert result.ok
    assert result.turns == 3
    assert created == []  # the model calls and the lone tool calls ran in the loop's step
    assert _seen.get() == ""  # what a tool sets stays in its own context


@pytest.mark.timeout(10)
def test_an_operation_that_waits_goes_on_as_a_task() -> None:
    model = ScriptedModel(_asks("sleepy"), "done")
    result, created = asyncio.run(_run_counting_tasks(model, [sleepy]))
    assert result.ok
    assert [t.text for t in result.messages if isinstance(t, sm.ToolResultMessage)] == ["sleepy"]
    # One task: the tool call, carried on from its first wait (the model calls ended at once)
    assert created == ["AsyncioExecutor._run_tool"]


@pytest.mark.timeout(10)
def test_a_batch_of_several_calls_runs_each_call_as_a_task() -> None:
    model = ScriptedModel(_asks("echo", "sleepy"), "done")
    result, created = asyncio.run(_run_counting_tasks(model, [echo, sleepy]))
    assert result.ok
    assert created.count("AsyncioExecutor._run_tool") == 2


@pytest.mark.timeout(10)
def test_an_operation_that_waits_is_cancelled_by_the_abort() -> None:
    @sm.tool
    async def forever(text: str) -> str:
        """Never returns."""
        await asyncio.sleep(3600)
        return text

    async def main() -> sm.RunResult:
        run = sm.AgentRun(
            model=ScriptedModel(_asks("forever")), messages=GO, tools=[forever], grace_period=0.05
        )
        task = asyncio.ensure_future(run.run())
        await asyncio.sleep(0.01)
        run.abort("stop")
        return await task

    result = asyncio.run(main())
    assert result.state is sm.TurnState.Aborted
    assert result.stats is not None
    assert result.stats.tool_calls == {"forever": {"cancelled": 1}}


@pytest.mark.timeout(10)
def test_the_inbox_hands_out_events_in_order_and_waits_when_empty() -> None:
    async def main() -> list[object]:
        inbox = Inbox()
        inbox.put_nowait(Start())
        got: list[object] = [await inbox.get()]
        waiter = asyncio.ensure_future(inbox.get())
        await asyncio.sleep(0)
        assert not waiter.done()
        event = InputQueued(sm.UserMessage("later"))
        inbox.put_nowait(event)
        got.append(await waiter)
        assert inbox.empty()
        return got

    got = asyncio.run(main())
    assert isinstance(got[0], Start)
    assert isinstance(got[1], InputQueued)


def _seam() -> Generator[tuple[str, tuple[Any, ...]], None, None]:
    yield "_start_model", (CallModel(messages=(), tools=(), turn=1), True)
    yield "_start_tool", (sm.ToolCall("c1", "echo", {}), True)
    yield "_start_permission_checks", ([],)
    yield "_start_continue_check", (1,)
    yield "_start_cancellation", (["model"], "stop")


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("name", "args"), list(_seam()))
def test_an_executor_must_perform_every_kind_of_action(name: str, args: tuple[Any, ...]) -> None:
    with pytest.raises(NotImplementedError):
        getattr(ActionLoop(), name)(*args)


@pytest.mark.timeout(10)
def test_an_operation_destroyed_while_it_waits_closes_quietly() -> None:
    unraisable: list[Any] = []
    loop = asyncio.new_event_loop()

    async def waits() -> None:
        await loop.create_future()

    async def main() -> asyncio.Task[None]:
        coro = waits()
        task = _start(coro)
        assert task is not None
        coro.close()  # collected first, as garbage of the same collection may be
        return task

    previous, sys.unraisablehook = sys.unraisablehook, unraisable.append
    try:
        task = loop.run_until_complete(main())
        loop.close()
        task._log_destroy_pending = False  # type: ignore[attr-defined]
        del task
        gc.collect()
    finally:
        sys.unraisablehook = previous
    assert unraisable == []


# -- yielding to the event loop between operations that did not wait ----------------------


async def _abort_on_io(turns: int) -> sm.RunResult:
    """A run whose every operation finishes at once, and an abort that can only arrive
    through I/O (a socket already readable when the run starts)."""
    import socket

    loop = asyncio.get_running_loop()
    reader, writer = socket.socketpair()
    model = ScriptedModel(*[_asks("echo") for _ in range(turns - 1)], "done", record=False)
    run = sm.AgentRun(model=model, messages=GO, tools=[echo], max_turns=turns)
    try:
        writer.send(b"x")
        loop.add_reader(reader.fileno(), lambda: run.abort("seen on a socket"))
        return await run.run()
    finally:
        loop.remove_reader(reader.fileno())
        reader.close()
        writer.close()


@pytest.mark.timeout(10)
def test_io_is_polled_during_a_run_whose_operations_never_wait() -> None:
    # Nothing else is ready, so most passes of the event loop are skipped; I/O must
    # still be polled within a few operations, not only when the run ends.
    result = asyncio.run(_abort_on_io(200))
    assert result.state is sm.TurnState.Aborted
    assert result.turns < 20


@pytest.mark.timeout(10)
def test_a_ready_callback_runs_before_the_next_event_is_handled() -> None:
    async def main() -> sm.RunResult:
        model = ScriptedModel(*[_asks("echo") for _ in range(9)], "done")
        run = sm.AgentRun(model=model, messages=GO, tools=[echo], max_turns=10)
        asyncio.get_running_loop().call_soon(run.abort, "at once")
        return await run.run()

    result = asyncio.run(main())
    assert result.state is sm.TurnState.Aborted
    assert result.turns == 1  # the first model call had already started


@pytest.mark.timeout(10)
def test_on_a_loop_whose_queues_are_unknown_the_run_yields_after_every_operation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A loop other than asyncio's (say uvloop) does not show what is ready to run: the
    # run then gives the event loop its pass after every operation, so a callback
    # scheduled at the start is run before the second model call.
    import statemachine.agent.loop as loop_module

    monkeypatch.setattr(loop_module, "_loop_queues", lambda loop: (None, None))

    async def main() -> sm.RunResult:
        model = ScriptedModel(*[_asks("echo") for _ in range(9)], "done")
        run = sm.AgentRun(model=model, messages=GO, tools=[echo], max_turns=10)
        asyncio.get_running_loop().call_soon(run.abort, "at once")
        return await run.run()

    result = asyncio.run(main())
    assert result.state is sm.TurnState.Aborted
    assert result.turns == 1


def test_the_loop_queues_are_found_only_on_asyncio_loops() -> None:
    from collections import deque

    from statemachine.agent.loop import _loop_queues

    loop = asyncio.new_event_loop()
    try:
        ready, scheduled = _loop_queues(loop)
        assert isinstance(ready, deque)
        assert isinstance(scheduled, list)
    finally:
        loop.close()

    class Elsewhere:  # any other loop: unknown queues, so the run always yields
        def __init__(self) -> None:
            self._ready: deque[object] = deque()
            self._scheduled: list[object] = []

    assert _loop_queues(Elsewhere()) == (None, None)  # type: ignore[arg-type]

    # An asyncio loop that keeps either queue in another form is not read either.
    for name, other in (("_scheduled", deque()), ("_ready", [])):
        odd = asyncio.new_event_loop()
        try:
            setattr(odd, name, other)
            assert _loop_queues(odd) == (None, None), name
        finally:
            setattr(odd, name, deque() if name == "_ready" else [])
            odd.close()


@pytest.mark.timeout(10)
def test_an_operation_with_its_hooks_around_it_that_does_not_wait_starts_no_task() -> None:
    async def transform(messages: Sequence[sm.Message]) -> Sequence[sm.Message]:
        return messages  # an async hook that returns at once

    async def after(call: sm.ToolCall, output: sm.ToolOutput) -> None:
        return None

    model = ScriptedModel(_asks("echo"), "done")
    result, created = asyncio.run(
        _run_counting_tasks(model, [echo], transform_context=transform, after_tool_call=after)
    )
    assert result.ok
    assert [t.text for t in result.messages if isinstance(t, sm.ToolResultMessage)] == ["echo"]
    assert created == []


@pytest.mark.timeout(10)
def test_an_executor_with_its_own_post_gets_every_operation_s_event_through_it() -> None:
    from statemachine.agent.run import AgentRun

    posted: list[tuple[str, str]] = []

    class Posting(AgentRun):
        def _post(self, key: str, event: Any) -> None:
            posted.append((key, type(event).__name__))
            super()._post(key, event)

    run = Posting(model=ScriptedModel(_asks("echo"), "done"), messages=GO, tools=[echo])
    result = asyncio.run(run.run())
    assert result.ok
    assert posted == [
        ("model", "ModelResponded"),
        ("c_echo", "ToolFinished"),
        ("model", "ModelResponded"),
    ]

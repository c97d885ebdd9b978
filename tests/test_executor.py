"""The in-process executor (statemachine.agent.executor): operations as asyncio tasks,
tool timeouts, and the grace period's answer for an operation that never reported."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import sys
from collections.abc import Sequence
from typing import Any

import attrs
import pytest
import structlog
from driver_support import asks, make_tool, on_virtual_time, watched

import statemachine as sm
from statemachine.agent.executor import IN_PROCESS, AsyncioExecutor, Operation, start_task
from statemachine.agent.loop import ActionLoop
from statemachine.agent.options import DEFAULTS
from statemachine.agent.questions import Answer, MakeQuestion
from statemachine.agent.run import use_backend
from statemachine.agent.stream import EventStream
from statemachine.core.abort import AbortController, AbortSignal
from statemachine.core.events import ModelCancelled, ToolCancelled
from statemachine.core.messages import AssistantMessage, ToolCall, ToolResultMessage, UserMessage
from statemachine.core.table import TurnState
from statemachine.engine import Engine
from statemachine.testing import ScriptedModel

S = TurnState
GO = [sm.UserMessage("go")]
_seen: contextvars.ContextVar[str] = contextvars.ContextVar("test_executor_seen", default="")


def _asks(*names: str) -> sm.AssistantMessage:
    return sm.AssistantMessage(
        tuple(sm.ToolCall(f"c_{name}", name, {"text": name}) for name in names)
    )


class _Keeping:
    """The in-process backend, keeping the driver it is given for a look after."""

    def __init__(self) -> None:
        self.made: list[AsyncioExecutor] = []

    def start(self, driver: AsyncioExecutor, op: Operation) -> None:
        if driver not in self.made:
            self.made.append(driver)
        IN_PROCESS.start(driver, op)

    def cancel(self, driver: AsyncioExecutor, keys: Sequence[str], reason: str) -> None:
        IN_PROCESS.cancel(driver, keys, reason)

    def reported(self, key: str) -> None:
        IN_PROCESS.reported(key)

    async def ask(
        self, driver: AsyncioExecutor, call: ToolCall, make: MakeQuestion, signal: AbortSignal
    ) -> Answer | None:
        return await IN_PROCESS.ask(driver, call, make, signal)


def _kept(run: sm.AgentRun) -> list[AsyncioExecutor]:
    """Run ``run`` with the in-process backend; the list holds its driver once run()
    starts an operation."""
    keeping = _Keeping()
    use_backend(run, inbox=asyncio.Queue(), backend=keeping)
    return keeping.made


@pytest.mark.timeout(30)
def test_a_tool_that_raises_after_its_timeout_leaves_no_unretrieved_task_exception() -> None:
    # The call is given up on at its timeout; when its signal then fires it raises.
    # Nobody awaits it any more, and asyncio must not log its exception as lost.
    @sm.tool(timeout=1.0)
    async def slow(signal: sm.AbortSignal) -> str:
        """Wait for the signal, then fail."""
        while not signal.aborted:
            await asyncio.sleep(0.1)
        raise RuntimeError("gave up after the signal")

    contexts: list[dict[str, Any]] = []

    async def main() -> sm.RunResult:
        asyncio.get_running_loop().set_exception_handler(lambda loop, c: contexts.append(c))
        result = await sm.run_agent(
            model=ScriptedModel(
                sm.AssistantMessage((sm.ToolCall("c1", "slow", {}),), stop_reason="toolUse"),
                "done",
            ),
            messages=GO,
            tools=[slow],
        )
        gc.collect()  # a task whose exception nobody retrieved says so when collected
        return result

    result = on_virtual_time(main)
    assert result.ok
    (tool_result,) = [m for m in result.messages if isinstance(m, sm.ToolResultMessage)]
    assert tool_result.is_error
    assert "timed out after 1 s" in tool_result.text
    assert [c["message"] for c in contexts] == []


@pytest.mark.timeout(10)
def test_each_tool_call_runs_in_a_context_of_its_own() -> None:
    @sm.tool
    async def sets(text: str) -> str:
        """Set a context variable."""
        _seen.set(text)
        return text

    result = asyncio.run(
        sm.run_agent(model=ScriptedModel(_asks("sets"), "done"), messages=GO, tools=[sets])
    )
    assert result.ok
    assert _seen.get() == ""  # what a tool sets stays in its own context


@pytest.mark.timeout(10)
def test_an_eager_task_starts_at_once_where_python_can() -> None:
    started: list[str] = []

    async def note() -> None:
        started.append("started")

    async def main() -> list[str]:
        task = start_task(note(), eager=True)
        at_once = list(started)
        await task
        return at_once

    # Python 3.12+ starts it in the caller's step; 3.11 at the event loop's next pass.
    assert asyncio.run(main()) == (["started"] if sys.version_info >= (3, 12) else [])


@pytest.mark.timeout(30)
def test_a_long_run_keeps_no_finished_task() -> None:
    # Every operation and every hook call is a task: once over, none is kept, or a run
    # of many turns would hold one for each.
    turns = 30

    async def allow(call: sm.ToolCall) -> None:
        return None

    async def go_on(messages: Any, turn: int) -> None:
        return None

    @sm.tool
    async def echo(text: str) -> str:
        """Echo the text."""
        return text

    run = sm.AgentRun(
        model=ScriptedModel(*[_asks("echo") for _ in range(turns)], "done"),
        messages=GO,
        tools=[echo],
        max_turns=turns + 1,
        before_tool_call=allow,
        should_continue=go_on,
    )
    made = _kept(run)
    result = on_virtual_time(run.run)
    assert result.state is sm.TurnState.DONE
    assert result.turns == turns + 1
    assert made[0].helpers == set()
    assert made[0].tasks == {}


@pytest.mark.timeout(30)
def test_a_tool_call_stops_listening_to_the_runs_signal_when_it_ends() -> None:
    # The own signal of each call with a timeout listens to the run's, and must stop
    # when the call ends, or the run's signal holds one listener for every call ever
    # made (nothing public counts the listeners: they are read here).
    @sm.tool(timeout=30.0)
    async def echo(text: str) -> str:
        """Repeat the text back."""
        return text

    calls = [sm.ToolCall(f"c{i}", "echo", {"text": str(i)}) for i in range(3)]
    run = sm.AgentRun(
        model=ScriptedModel(sm.AssistantMessage(calls, stop_reason="toolUse"), "done"),
        messages=GO,
        tools=[echo],
    )
    made = _kept(run)
    assert on_virtual_time(run.run).state is sm.TurnState.DONE
    assert not made[0].loop.controller.signal._listeners  # none held


@pytest.mark.timeout(30)
def test_an_operation_that_ends_without_reporting_is_answered_as_cancelled() -> None:
    # Every operation of the library reports its own end, so an operation whose task is
    # over without a word cannot be made through a run: the executor is driven here
    # directly. The end of the grace period still answers it, as what it is: the
    # model call with a ModelCancelled, a tool call with a ToolCancelled for that call.
    quiet = structlog.wrap_logger(structlog.ReturnLogger())
    engine = Engine(tools=[], messages=GO, logger=quiet)
    inbox: asyncio.Queue[Any] = asyncio.Queue()

    async def silent() -> None:
        return None

    async def main() -> list[object]:
        loop = ActionLoop(
            engine,
            inbox=inbox,
            stream=EventStream(engine),
            controller=AbortController(),
            log=quiet,
        )
        executor = AsyncioExecutor(
            loop, model=ScriptedModel("done"), tools={}, hooks=DEFAULTS, grace=1.0
        )
        for key in ("model", "c1"):
            executor.tasks[key] = task = asyncio.ensure_future(silent())
            await task
        await executor.cancel_after_grace(["model", "c1"], "stop")
        return [inbox.get_nowait() for _ in range(inbox.qsize())]

    assert on_virtual_time(main) == [ModelCancelled(), ToolCancelled("c1")]


@pytest.mark.timeout(30)
def test_a_tool_that_ignores_its_timeout_signal_is_cancelled() -> None:
    cleaned: list[str] = []

    async def deaf() -> str:
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.append("deaf cleaned up")
        return "never"

    deaf.__doc__ = "The deaf tool."
    run = sm.AgentRun(
        model=ScriptedModel(asks("deaf"), AssistantMessage("done")),
        messages=[UserMessage("go")],
        tools=[sm.tool(timeout=1.0)(deaf)],
        grace_period=1.0,
    )

    async def main() -> tuple[sm.RunResult, list[str]]:
        result = await run.run()
        return result, list(cleaned)

    result, cleaned_by_then = on_virtual_time(main)
    assert result.state is S.DONE
    assert cleaned_by_then == ["deaf cleaned up"]
    (only,) = [m for m in result.messages if isinstance(m, ToolResultMessage)]
    assert "timed out after 1 s" in only.text


@pytest.mark.timeout(30)
def test_a_keyboard_interrupt_from_transform_context_is_raised_after_the_run() -> None:
    interrupt = KeyboardInterrupt("ctrl-c in transform_context")

    def transform(messages: Sequence[sm.Message]) -> Sequence[sm.Message]:
        raise interrupt

    run = sm.AgentRun(
        model=ScriptedModel(AssistantMessage("done")),
        messages=[UserMessage("go")],
        transform_context=transform,
    )
    with pytest.raises(KeyboardInterrupt) as raised:
        on_virtual_time(run.run)
    assert raised.value is interrupt
    assert run.result is not None
    assert run.result.state is S.FAILED
    assert "KeyboardInterrupt" in run.result.explanation


@pytest.mark.timeout(30)
def test_a_lone_coroutine_tool_knows_its_call_and_reports_progress() -> None:
    seen: list[tuple[str | None, bool]] = []

    async def whoami() -> str:
        call = sm.current_tool_call()
        seen.append((None if call is None else call.id, sm.report_progress("half")))
        return "ok"

    run = sm.AgentRun(
        model=ScriptedModel(asks("whoami"), AssistantMessage("done")),
        messages=[UserMessage("go")],
        tools=[make_tool("whoami", whoami)],
    )
    result, progress = watched(run, sm.ToolProgress)
    assert result.state is S.DONE
    assert seen == [("c1", True)]
    assert [(e.call_id, e.data) for e in progress] == [("c1", "half")]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("second", ["returns a dict", "raises"])
def test_a_client_that_fails_after_a_good_answer_fails_the_run(second: str) -> None:
    class Turncoat:
        def __init__(self) -> None:
            self.calls = 0

        async def complete(self, messages: object, tools: object, signal: object) -> object:
            self.calls += 1
            if self.calls == 1:
                return asks("echo")
            if second == "raises":
                raise RuntimeError("the provider is down")
            return {"role": "assistant", "content": []}

    async def echo() -> str:
        return "ok"

    run = sm.AgentRun(
        model=Turncoat(),  # type: ignore[arg-type]
        messages=[UserMessage("go")],
        tools=[make_tool("echo", echo)],
    )

    async def main() -> sm.RunResult:
        return await asyncio.wait_for(run.run(), timeout=5.0)

    result = on_virtual_time(main)
    assert result.state is S.FAILED
    last = result.messages[-1]
    assert isinstance(last, AssistantMessage)
    expected = "the provider is down" if second == "raises" else "ModelOutputError"
    assert expected in (last.error_message or "")


@pytest.mark.timeout(30)
def test_a_timed_out_tool_that_heeds_its_signal_stops_on_it_and_is_not_cancelled() -> None:
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
        model=ScriptedModel(asks("careful"), AssistantMessage("done")),
        messages=[UserMessage("go")],
        tools=[sm.tool(timeout=0.05)(careful)],
        grace_period=5.0,
    )
    result = on_virtual_time(run.run)
    assert result.state is S.DONE
    assert stopped == ["stopped on its signal"]
    (answer,) = [m for m in result.messages if isinstance(m, ToolResultMessage)]
    assert answer.text == "Tool careful timed out after 0.05 s"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("alone", [True, False], ids=["alone", "beside-another"])
def test_a_keyboard_interrupt_while_reading_a_tools_output_is_raised_after_the_run(
    alone: bool,
) -> None:
    interrupt = KeyboardInterrupt("ctrl-c while reading")

    class Treacherous(list[sm.TextContent]):
        def __iter__(self) -> Any:
            raise interrupt

    async def odd(arguments: dict[str, Any], signal: sm.AbortSignal) -> Any:
        return Treacherous([sm.TextContent("x")])

    async def fine() -> str:
        return "fine"

    tools = [sm.Tool(sm.ToolDefinition("odd", "Odd output."), odd), make_tool("fine", fine)]
    names = ("odd",) if alone else ("odd", "fine")
    run = sm.AgentRun(
        model=ScriptedModel(asks(*names), AssistantMessage("never asked")),
        messages=[UserMessage("go")],
        tools=tools,
    )
    with pytest.raises(KeyboardInterrupt) as raised:
        on_virtual_time(run.run)
    assert raised.value is interrupt
    result = run.result
    assert result is not None
    assert result.state is S.ABORTED


@pytest.mark.timeout(30)
def test_a_client_may_answer_with_a_subclass_of_assistant_message() -> None:
    @attrs.frozen
    class Annotated(AssistantMessage):
        pass

    class Client:
        async def complete(self, messages: object, tools: object, signal: object) -> object:
            await asyncio.sleep(0)  # answered after a wait: the client runs as a task
            return Annotated("all done")

    run = sm.AgentRun(model=Client(), messages=[UserMessage("go")])  # type: ignore[arg-type]
    result = on_virtual_time(run.run)
    assert result.state is S.DONE
    assert isinstance(result.messages[-1], Annotated)
    assert result.messages[-1].text == "all done"

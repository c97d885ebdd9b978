"""The action loop (statemachine.agent.loop): one event at a time to the engine, each
action to the executor, every operation's report back through one asyncio.Queue."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Sequence

import pytest

import statemachine as sm
from statemachine.agent.executor import (
    CONTINUE,
    IN_PROCESS,
    MODEL,
    PERMISSIONS,
    TOOL,
    AsyncioExecutor,
    Operation,
    start_task,
)
from statemachine.agent.questions import Answer, MakeQuestion
from statemachine.agent.run import use_backend
from statemachine.core.abort import AbortSignal
from statemachine.core.events import Event
from statemachine.core.messages import ToolCall
from statemachine.testing import ScriptedModel

GO = [sm.UserMessage("go")]


def _asks(*names: str) -> sm.AssistantMessage:
    return sm.AssistantMessage(
        tuple(sm.ToolCall(f"c_{name}", name, {"text": name}) for name in names)
    )


@sm.tool
async def echo(text: str) -> str:
    """Echo the text."""
    return text


class Recording:
    """A backend that starts each operation in this process, as ``run_agent``'s does,
    noting every operation it is handed and every report (to a ``Reports`` of its own,
    which hands each on to the driver)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self._driver: AsyncioExecutor | None = None

    def start(self, driver: AsyncioExecutor, op: Operation) -> None:
        self._driver = driver
        subject = op.subject
        what: tuple[str, str]
        if op.kind == MODEL:
            what = ("start_model", f"turn {subject.turn}")
        elif op.kind == TOOL:
            what = ("start_tool", subject.id)
        elif op.kind == PERMISSIONS:
            what = ("start_permission_checks", ",".join(c.id for c in subject))
        else:
            assert op.kind == CONTINUE
            what = ("start_continue_check", f"turn {subject}")
        self.seen.append(what)
        driver.keep(op, start_task(driver.perform(op, self), eager=op.alone))

    def cancel(self, driver: AsyncioExecutor, keys: Sequence[str], reason: str) -> None:
        IN_PROCESS.cancel(driver, keys, reason)

    def reported(self, key: str) -> None:
        """Nothing kept: the loop holds the report."""

    async def ask(
        self, driver: AsyncioExecutor, call: ToolCall, make: MakeQuestion, signal: AbortSignal
    ) -> Answer | None:
        return await IN_PROCESS.ask(driver, call, make, signal)

    def report(self, key: str, event: Event) -> None:
        self.seen.append(("report", f"{key} {type(event).__name__}"))
        assert self._driver is not None
        self._driver.report(key, event)

    def put(self, event: Event) -> None:
        assert self._driver is not None
        self._driver.put(event)


def _recorded(run: sm.AgentRun) -> list[Recording]:
    """Plug the recording backend into ``run``."""
    made = [Recording()]
    use_backend(run, inbox=asyncio.Queue(), backend=made[0])
    return made


@pytest.mark.timeout(10)
def test_the_loop_hands_the_executor_each_action_and_takes_its_reports_in_order() -> None:
    async def allow(call: sm.ToolCall) -> None:
        return None

    async def go_on(messages: Sequence[sm.Message], turn: int) -> None:
        return None

    run = sm.AgentRun(
        model=ScriptedModel(_asks("echo"), "done"),
        messages=GO,
        tools=[echo],
        before_tool_call=allow,
        should_continue=go_on,
    )
    made = _recorded(run)
    result = asyncio.run(run.run())
    assert result.ok
    assert made[0].seen == [
        ("start_model", "turn 1"),
        ("report", "model ModelResponded"),
        ("start_permission_checks", "c_echo"),
        ("start_tool", "c_echo"),
        ("report", "c_echo ToolFinished"),
        ("start_continue_check", "turn 1"),
        ("start_model", "turn 2"),
        ("report", "model ModelResponded"),
    ]


@pytest.mark.timeout(10)
def test_a_backend_is_chosen_before_the_run_starts() -> None:
    run = sm.AgentRun(model=ScriptedModel("done"), messages=GO)
    assert asyncio.run(run.run()).ok
    with pytest.raises(sm.UsageError, match="before the run starts"):
        use_backend(run, inbox=asyncio.Queue(), backend=IN_PROCESS)


@pytest.mark.timeout(10)
def test_an_operation_that_waits_is_cancelled_by_the_abort() -> None:
    entered = asyncio.Event()

    @sm.tool
    async def forever(text: str) -> str:
        """Never returns."""
        entered.set()
        await asyncio.Event().wait()
        return text

    async def main() -> sm.RunResult:
        run = sm.AgentRun(
            model=ScriptedModel(_asks("forever")), messages=GO, tools=[forever], grace_period=0.05
        )
        task = asyncio.ensure_future(run.run())
        await entered.wait()
        run.abort("stop")
        return await task

    result = asyncio.run(main())
    assert result.state is sm.TurnState.ABORTED
    assert result.stats is not None
    assert result.stats.tool_calls == {"forever": {"cancelled": 1}}


async def _abort_on_io(turns: int) -> sm.RunResult:
    """A run whose every operation finishes at once, and an abort that can only arrive
    through I/O (a socket already readable when the run starts)."""
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
    result = asyncio.run(_abort_on_io(200))
    assert result.state is sm.TurnState.ABORTED
    assert result.turns < 20


@pytest.mark.timeout(10)
def test_a_ready_callback_runs_before_the_next_event_is_handled() -> None:
    async def main() -> sm.RunResult:
        def first(messages: object, tools: object) -> sm.AssistantMessage:
            # Made ready while the run runs (run() lets what was ready before it go first).
            asyncio.get_running_loop().call_soon(run.abort, "at once")
            return _asks("echo")

        model = ScriptedModel(first, *[_asks("echo") for _ in range(8)], "done")
        run = sm.AgentRun(model=model, messages=GO, tools=[echo], max_turns=10)
        return await run.run()

    result = asyncio.run(main())
    assert result.state is sm.TurnState.ABORTED
    assert result.turns == 1  # the first model call had already started

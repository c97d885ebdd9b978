"""Tests written for mutants of resuming a run and of ``run_agent_sync`` that outlived
the suite (``bench/mutate.py``; each gap is listed in ``bench/mutation.md``)."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
from collections.abc import Callable
from typing import Any

import pytest

import statemachine as sm
from statemachine.core.errors import InvalidInputError, SnapshotError, UsageError
from statemachine.core.messages import AssistantMessage, StopReason, ToolCall, UserMessage
from statemachine.core.table import TurnState
from statemachine.testing import ScriptedModel

S = TurnState


def _tool(name: str, fn: Callable[..., Any]) -> sm.Tool:
    fn.__name__ = name
    fn.__doc__ = f"The {name} tool."
    return sm.tool(fn)


def _asks(*names: str) -> AssistantMessage:
    calls = [ToolCall(f"c{i}", name, {}) for i, name in enumerate(names, 1)]
    return AssistantMessage(calls, stop_reason=StopReason.TOOL_USE)


def _suspended(approvals: dict[str, str]) -> sm.RunResult:
    """A run stopped for approval: the calls named in ``approvals`` need it (with that
    reason); the others were permitted, and wait their turn (the tool is sequential)."""

    async def act(name: str) -> str:
        return f"did {name}"

    act.__doc__ = "The act tool."

    def before(call: ToolCall) -> sm.RequireApproval | None:
        reason = approvals.get(call.id)
        return None if reason is None else sm.RequireApproval(reason)

    calls = [ToolCall(i, "act", {"name": i}) for i in ("a", "b")]
    return sm.run_agent_sync(
        model=ScriptedModel(AssistantMessage(calls, stop_reason=StopReason.TOOL_USE)),
        messages=[UserMessage("go")],
        tools=[sm.tool(sequential=True)(act)],
        before_tool_call=before,
    )


@pytest.mark.timeout(30)
def test_a_call_refused_on_resume_needs_no_tool_and_is_not_asked_about() -> None:
    # Gap: which calls may run on resume counted a refusal as an approval.
    first = _suspended({"a": "a person decides", "b": "a person decides"})
    asked: list[str] = []

    def before(call: ToolCall) -> sm.RequireApproval:
        asked.append(call.id)
        return sm.RequireApproval("still a person")

    async def other() -> str:
        return "other"

    run = sm.resume_run(
        first,
        model=ScriptedModel(AssistantMessage("fine")),
        tools=[_tool("other", other)],  # no "act": neither call may run
        approvals={"a": False, "b": sm.Deny("no")},
        before_tool_call=before,
    )
    result = asyncio.run(run.run())
    assert asked == []
    assert result.state is S.Done


@pytest.mark.timeout(30)
def test_resume_takes_a_turn_limit_of_one_and_refuses_zero() -> None:
    # Gap (no test ran it): the lowest turn limit a resume accepts.
    first = _suspended({"a": "a person decides"})
    tools = [sm.tool(sequential=True)(act)]
    for bad in (0, -1, True, 2.0, "2"):
        with pytest.raises(sm.InvalidInputError, match="max_turns must be a positive integer"):
            sm.resume_run(
                first,
                model=ScriptedModel(),
                tools=tools,
                approvals={"a": False},
                max_turns=bad,  # type: ignore[arg-type]
            )
    run = sm.resume_run(
        first,
        model=ScriptedModel(AssistantMessage("fine")),
        tools=tools,
        approvals={"a": False},
        max_turns=1,
        before_tool_call=lambda call: None,
    )
    result = asyncio.run(run.run())
    assert result.state is S.TurnLimitExceeded


async def act(name: str) -> str:
    """The act tool."""
    return f"did {name}"


@pytest.mark.timeout(30)
def test_a_resume_whose_hook_now_wants_approval_for_a_permitted_call_says_so() -> None:
    # Gap (no test ran it): the refusal names what the hook answered.
    first = _suspended({"a": "a person decides"})  # "b" was permitted
    run = sm.resume_run(
        first,
        model=ScriptedModel(AssistantMessage("fine")),
        tools=[sm.tool(sequential=True)(act)],
        approvals={"a": True},
        before_tool_call=lambda call: sm.RequireApproval("now it does"),
    )
    with pytest.raises(SnapshotError, match="requires a person's approval for it"):
        asyncio.run(run.run())


@pytest.mark.timeout(30)
def test_run_agent_sync_closes_its_event_loop() -> None:
    # Gap: nothing checked that the loop run_agent_sync makes is closed afterwards.
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
        tools=[_tool("where", where)],
    )
    assert result.state is S.Done
    (loop,) = loops
    assert loop.is_closed()


@pytest.mark.timeout(30)
def test_run_agent_sync_closes_the_async_generators_it_leaves_open() -> None:
    # Gap: nothing left an async generator open to see run_agent_sync finish it.
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
        tools=[_tool("first", first)],
    )
    assert result.state is S.Done
    assert closed == ["generator closed"]


@pytest.mark.timeout(30)
def test_run_agent_sync_keeps_quiet_about_a_task_it_abandoned(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Gap: an abandoned task is reported by the run; asyncio must not also log, when
    # the task is collected, that it was destroyed while pending.
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
        model=ScriptedModel(_asks("stubborn")),
        messages=[UserMessage("go")],
        tools=[_tool("stubborn", stubborn)],
        signal=controller.signal,
        before_tool_call=abort_soon,
        grace_period=0.05,
    )
    assert result.state is S.Aborted
    assert "abandoned" in result.explanation
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        gc.collect()
    assert "destroyed but it is pending" not in caplog.text


@pytest.mark.timeout(30)
def test_resume_without_a_needed_tool_names_the_calls_that_need_it() -> None:
    # Gap: the refusal's list of calls was never read.
    first = _suspended({"a": "a person decides"})  # "b" waits its turn, permitted

    async def other() -> str:
        return "other"

    with pytest.raises(
        sm.UsageError, match=r"tools lacks act, needed by the pending call\(s\) a, b:"
    ):
        sm.resume_run(
            first,
            model=ScriptedModel(),
            tools=[_tool("other", other)],
            approvals={"a": True},
            before_tool_call=lambda call: None,
        )


@pytest.mark.timeout(30)
def test_a_run_resumed_with_a_message_and_no_hook_runs_its_tools_unasked() -> None:
    # Gap: a restored engine must ask the hooks this run has, not those of the
    # suspended one: resumed without before_tool_call, nothing is asked.
    first = _suspended({"a": "a person decides"})
    ran: list[str] = []

    async def recorded(name: str) -> str:
        ran.append(name)
        return f"did {name}"

    call = ToolCall("c9", "act", {"name": "look"})
    run = sm.resume_run(
        first,
        model=ScriptedModel(
            AssistantMessage([call], stop_reason=StopReason.TOOL_USE), AssistantMessage("done")
        ),
        tools=[_tool("act", recorded)],
        message="never mind, just look",
    )

    async def main() -> sm.RunResult:
        return await asyncio.wait_for(run.run(), timeout=10.0)

    result = asyncio.run(main())
    assert result.state is S.Done
    assert ran == ["look"]


@pytest.mark.timeout(30)
def test_a_resumed_run_started_twice_asks_the_policy_once() -> None:
    # Gap: the second run() of a resumed run is refused; it must be refused before
    # the policy is asked again about calls that will not run.
    first = _suspended({"a": "a person decides"})  # "b" was permitted
    asked: list[str] = []

    def policy(call: ToolCall) -> None:
        asked.append(call.id)

    run = sm.resume_run(
        first,
        model=ScriptedModel(AssistantMessage("fine")),
        tools=[sm.tool(sequential=True)(act)],
        approvals={"a": True},
        before_tool_call=policy,
    )
    assert asyncio.run(run.run()).state is S.Done
    assert sorted(asked) == ["a", "b"]
    with pytest.raises(UsageError, match="runs once"):
        asyncio.run(run.run())
    assert sorted(asked) == ["a", "b"]


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("tools", "message"),
    [
        ("act", "tools must be a sequence of Tool"),
        ([act], r"tools\[0\] is a function, not a Tool"),
    ],
)
def test_resume_refuses_tools_that_are_not_tools_before_it_restores(
    tools: Any, message: str
) -> None:
    # Gap: the tools given to resume were checked only by the run built after the
    # snapshot was restored, which reads their names first.
    first = _suspended({"a": "a person decides"})
    with pytest.raises(InvalidInputError, match=message):
        sm.resume_run(first, model=ScriptedModel(), tools=tools, approvals={"a": True})


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
        tools=[_tool("spawn", spawn)],
        grace_period=grace,
    )
    assert result.state is S.Done
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
        assert result.state is S.Done
    assert controller.signal._listeners == []


@pytest.mark.timeout(30)
def test_a_run_resumed_with_should_continue_asks_it_though_the_suspended_run_had_none() -> None:
    # Gap: a restored engine must ask should_continue when this run has it, even if
    # the suspended run had none (hooks are code, they do not travel in a snapshot).
    first = _suspended({"a": "a person decides"})
    asked: list[int] = []

    def should_continue(messages: Any, turn: int) -> sm.Stop:
        asked.append(turn)
        return sm.Stop("that will do")

    run = sm.resume_run(
        first,
        model=ScriptedModel(AssistantMessage("not asked")),
        tools=[sm.tool(sequential=True)(act)],
        approvals={"a": True},
        before_tool_call=lambda call: None,
        should_continue=should_continue,
    )
    result = asyncio.run(asyncio.wait_for(run.run(), timeout=10.0))
    assert asked == [1]
    assert result.state is S.Done
    assert "that will do" in result.explanation


@pytest.mark.timeout(30)
def test_run_agent_sync_lets_a_left_task_finish_its_cleanup_within_the_grace_period() -> None:
    # Gap: the tasks a run leaves behind were cancelled, but their cleanup was not
    # waited for: a cleanup that awaits was cut off when the loop closed.
    _, ended, _ = _leaving_a_task(cleanup=0.05, grace=5.0)
    assert ended == ["cleaned up"]


@pytest.mark.timeout(30)
def test_run_agent_sync_waits_for_a_left_task_no_longer_than_its_grace_period() -> None:
    # Gap: the grace period given was not the one used when the loop closed (the
    # default, 1 s, would let this cleanup of 0.5 s finish).
    _, ended, task = _leaving_a_task(cleanup=0.5, grace=0.01)
    assert ended == []
    assert not task.done()


@pytest.mark.timeout(30)
def test_resume_refuses_two_tools_of_one_name() -> None:
    # Gap: resume checked each tool but not that their names differ (the run's engine,
    # which checks that, is restored from the snapshot, not built from these tools).
    first = _suspended({"a": "a person decides"})
    with pytest.raises(InvalidInputError, match="duplicate tool name 'act'"):
        sm.resume_run(
            first,
            model=ScriptedModel(AssistantMessage("fine")),
            tools=[sm.tool(sequential=True)(act), sm.tool(act)],
            approvals={"a": True},
            before_tool_call=lambda call: None,
        )

"""Resuming a suspended run (statemachine.agent.resume): what is checked before
anything runs, and what the resumed run asks."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from driver_support import (
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
from statemachine.errors import InvalidInputError, SnapshotError, UsageError
from statemachine.testing import ScriptedModel

S = TurnState


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


async def act(name: str) -> str:
    """The act tool."""
    return f"did {name}"


@pytest.mark.timeout(30)
def test_a_call_refused_on_resume_needs_no_tool_and_is_not_asked_about() -> None:
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
        tools=[make_tool("other", other)],  # no "act": neither call may run
        approvals={"a": False, "b": sm.Deny("no")},
        before_tool_call=before,
    )
    result = asyncio.run(run.run())
    assert asked == []
    assert result.state is S.DONE


@pytest.mark.timeout(30)
def test_resume_takes_a_turn_limit_of_one_and_refuses_zero() -> None:
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
    assert result.state is S.TURN_LIMIT_EXCEEDED


@pytest.mark.timeout(30)
def test_a_resume_whose_hook_now_wants_approval_for_a_permitted_call_says_so() -> None:
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
def test_resume_without_a_needed_tool_names_the_calls_that_need_it() -> None:
    first = _suspended({"a": "a person decides"})  # "b" waits its turn, permitted

    async def other() -> str:
        return "other"

    with pytest.raises(
        sm.UsageError, match=r"tools lacks act, needed by the pending call\(s\) a, b:"
    ):
        sm.resume_run(
            first,
            model=ScriptedModel(),
            tools=[make_tool("other", other)],
            approvals={"a": True},
            before_tool_call=lambda call: None,
        )


@pytest.mark.timeout(30)
def test_a_run_resumed_with_a_message_and_no_hook_runs_its_tools_unasked() -> None:
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
        tools=[make_tool("act", recorded)],
        message="never mind, just look",
    )

    async def main() -> sm.RunResult:
        return await asyncio.wait_for(run.run(), timeout=10.0)

    result = asyncio.run(main())
    assert result.state is S.DONE
    assert ran == ["look"]


@pytest.mark.timeout(30)
def test_a_resumed_run_started_twice_asks_the_policy_once() -> None:
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
    assert asyncio.run(run.run()).state is S.DONE
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
    first = _suspended({"a": "a person decides"})
    with pytest.raises(InvalidInputError, match=message):
        sm.resume_run(first, model=ScriptedModel(), tools=tools, approvals={"a": True})


@pytest.mark.timeout(30)
def test_a_run_resumed_with_should_continue_asks_it_though_the_suspended_run_had_none() -> None:
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
    assert result.state is S.DONE
    assert "that will do" in result.explanation


@pytest.mark.timeout(30)
def test_resume_refuses_two_tools_of_one_name() -> None:
    first = _suspended({"a": "a person decides"})
    with pytest.raises(InvalidInputError, match="duplicate tool name 'act'"):
        sm.resume_run(
            first,
            model=ScriptedModel(AssistantMessage("fine")),
            tools=[sm.tool(sequential=True)(act), sm.tool(act)],
            approvals={"a": True},
            before_tool_call=lambda call: None,
        )

"""Asking the run's hooks (statemachine.agent.hook_calls): an answer of the wrong
kind fails closed, explained."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from driver_support import (
    make_tool,
    on_virtual_time,
)

import statemachine as sm
from statemachine.core.messages import (
    AssistantMessage,
    StopReason,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from statemachine.core.table import TurnState
from statemachine.core.tools import ToolOutput
from statemachine.testing import ScriptedModel

S = TurnState


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
            tools=[make_tool("echo", echo)],
            messages=[UserMessage("go")],
            should_continue=should_continue,  # type: ignore[arg-type]
        )
    )
    assert result.state is S.DONE
    assert result.turns == 1
    assert "the should_continue hook returned str, expected None or Stop" in result.explanation


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
    result = on_virtual_time(
        lambda: sm.run_agent(
            model=model,
            tools=[make_tool("echo", echo)],
            messages=[UserMessage("go")],
            after_tool_call=after,  # type: ignore[arg-type]
        )
    )
    assert result.state is S.DONE
    (only,) = [m for m in result.messages if isinstance(m, ToolResultMessage)]
    assert only.is_error
    assert "The after_tool_call hook returned str, expected a ToolOutput or None" in only.text
    assert "secret" not in only.text

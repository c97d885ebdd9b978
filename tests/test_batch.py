"""The batch of tool calls (``core/batch.py``) as the engine dispatches it: every call
of a response is checked, whatever the calls before it; refusals quote the tool's
schema canonically; an abort answers the calls that never started at once, and each
cancelled call as it reports (rules 3 and 9, I1, I2)."""

from __future__ import annotations

import json
from collections.abc import Mapping

import pytest
from engine_support import ECHO

from statemachine.core.engine import Engine
from statemachine.core.events import (
    AbortRequested,
    CheckPermission,
    ModelResponded,
    Start,
    StartTool,
    ToolCancelled,
)
from statemachine.core.messages import (
    AssistantMessage,
    StopReason,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from statemachine.core.table import TurnState
from statemachine.core.tools import Scheduling, ToolDefinition

S = TurnState


@pytest.mark.timeout(30)
def test_calls_after_one_with_unreadable_arguments_are_still_checked() -> None:
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
def test_calls_after_one_with_arguments_off_the_schema_are_still_checked() -> None:
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")], check_permissions=True)
    engine.handle(Start())
    calls = [ToolCall("c1", "echo", {}), ToolCall("c2", "echo", {"text": "hi"})]
    actions = engine.handle(
        ModelResponded(AssistantMessage(calls, stop_reason=StopReason.TOOL_USE))
    )
    assert [a.call.id for a in actions if isinstance(a, CheckPermission)] == ["c2"]
    (result,) = [m for m in engine.messages if isinstance(m, ToolResultMessage)]
    assert result.tool_call_id == "c1"
    assert result.is_error


def _invalid_argument_text(schema: Mapping[str, object], call: ToolCall) -> str:
    engine = Engine(tools=[ToolDefinition("echo", "Repeat.", schema)], messages=[UserMessage("go")])
    engine.handle(Start())
    engine.handle(ModelResponded(AssistantMessage([call], stop_reason=StopReason.TOOL_USE)))
    result = engine.messages[-1]
    assert isinstance(result, ToolResultMessage)
    assert result.is_error
    return result.text


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "call",
    [
        ToolCall("c1", "echo", {"text": 7}),  # off the schema
        ToolCall("c1", "echo", {}, parse_error="not JSON: '{tex'"),  # unreadable
    ],
)
def test_the_schema_quoted_to_the_model_does_not_depend_on_its_key_order(call: ToolCall) -> None:
    properties = {"text": {"type": "string"}, "a": {"type": "integer"}}
    written = {"type": "object", "properties": properties, "required": ["text"]}
    reordered = {
        "required": ["text"],
        "properties": {"a": {"type": "integer"}, "text": {"type": "string"}},
        "type": "object",
    }
    text = _invalid_argument_text(written, call)
    assert text == _invalid_argument_text(reordered, call)
    assert json.dumps(written, sort_keys=True) in text


@pytest.mark.timeout(30)
def test_calls_waiting_their_turn_are_answered_when_the_abort_begins() -> None:
    slow = ToolDefinition("slow", "Wait.", {"type": "object", "properties": {}})
    engine = Engine(
        tools=[ECHO, slow],
        messages=[UserMessage("go")],
        scheduling={"slow": Scheduling(sequential=True)},
    )
    engine.handle(Start())
    calls = [ToolCall("c1", "echo", {"text": "hi"}), ToolCall("c2", "slow", {})]
    engine.handle(ModelResponded(AssistantMessage(calls, stop_reason=StopReason.TOOL_USE)))
    assert [c.id for c in engine.pending_calls()] == ["c1", "c2"]
    engine.handle(AbortRequested("stop"))
    assert engine.state is S.ABORTING
    assert [c.id for c in engine.pending_calls()] == ["c1"]


def test_a_tool_cancelled_during_the_abort_is_answered_at_once_beside_one_still_running() -> None:
    # I2 holds at every step, not only at the end: the first call's result enters the
    # history when its cancellation arrives, while the second call is still running.
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")])
    engine.handle(Start())
    first, second = ToolCall("a", "echo", {"text": "1"}), ToolCall("b", "echo", {"text": "2"})
    message = AssistantMessage((first, second), stop_reason=StopReason.TOOL_USE)
    started = engine.handle(ModelResponded(message))
    assert [a.call.id for a in started if isinstance(a, StartTool)] == ["a", "b"]
    states = []
    engine.handle(AbortRequested("stop"))
    states.append(engine.state)
    engine.handle(ToolCancelled("a"))
    states.append(engine.state)  # the second call still runs
    last = engine.messages[-1]
    assert isinstance(last, ToolResultMessage)
    assert (last.tool_call_id, last.is_error) == ("a", True)
    assert last.text == "Operation aborted: cancelled after the abort grace period"
    engine.handle(ToolCancelled("b"))
    states.append(engine.state)
    assert states == [S.ABORTING, S.ABORTING, S.ABORTED]
    assert [m.tool_call_id for m in engine.messages if isinstance(m, ToolResultMessage)] == [
        "a",
        "b",
    ]

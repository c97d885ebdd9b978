"""Helpers shared by the engine's tests: the one tool they declare, and an engine
stopped by a policy denial."""

from __future__ import annotations

from statemachine.core.engine import Engine
from statemachine.core.events import ModelResponded, ReturnToCaller, Start, ToolDenied
from statemachine.core.messages import AssistantMessage, StopReason, ToolCall, UserMessage
from statemachine.core.table import TurnState
from statemachine.core.tools import ToolDefinition

ECHO = ToolDefinition(
    "echo",
    "Repeat the text back.",
    {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
)


def denied_engine() -> Engine:
    """An engine stopped in AwaitingUser by a policy denial of its one call, ``c1``."""
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")], check_permissions=True)
    engine.handle(Start())
    call = ToolCall("c1", "echo", {"text": "hi"})
    engine.handle(ModelResponded(AssistantMessage([call], stop_reason=StopReason.TOOL_USE)))
    actions = engine.handle(ToolDenied("c1", "not on weekends"))
    assert engine.state is TurnState.AWAITING_USER
    assert any(isinstance(a, ReturnToCaller) for a in actions)
    return engine

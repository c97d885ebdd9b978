"""What a new engine is given, checked: its tool list and its history.

``Engine(...)`` refuses, with ``InvalidInputError`` and a sentence that names the
problem, a tool list with duplicates or non-definitions, and a history it could not
continue (empty, not messages, breaking I1/I2, or ending with the model).
"""

from __future__ import annotations

from collections.abc import Sequence

from statemachine.core.invariants import history_violations
from statemachine.core.messages import (
    AssistantMessage,
    Message,
    ToolResultMessage,
    UserMessage,
)
from statemachine.core.tools import ToolDefinition
from statemachine.errors import InvalidInputError

__all__ = ["check_history", "check_tool_definitions"]


def check_tool_definitions(tools: Sequence[ToolDefinition]) -> tuple[ToolDefinition, ...]:
    """Refuse a tool list that is not a list of unique definitions."""
    if isinstance(tools, (str, bytes)) or not isinstance(tools, Sequence):
        raise InvalidInputError("tools must be a sequence of tool definitions")
    seen: set[str] = set()
    for i, definition in enumerate(tools):
        if not isinstance(definition, ToolDefinition):
            raise InvalidInputError(
                f"tools[{i}] is a {type(definition).__name__}, not a ToolDefinition"
            )
        if definition.name in seen:
            raise InvalidInputError(
                f"duplicate tool name {definition.name!r}: tool names must be unique"
            )
        seen.add(definition.name)
    return tuple(tools)


def check_history(messages: Sequence[Message]) -> list[Message]:
    """Refuse a history the engine cannot continue; return it as a new list."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise InvalidInputError("messages must be a sequence of messages")
    history = list(messages)
    for i, message in enumerate(history):
        if not isinstance(message, (UserMessage, AssistantMessage, ToolResultMessage)):
            raise InvalidInputError(
                f"messages[{i}] is a {type(message).__name__}, not a message "
                "(use message_from_dict for wire dicts)"
            )
    if not history:
        raise InvalidInputError("the history is empty: give at least one user message")
    violations = history_violations(history)
    if violations:
        raise InvalidInputError("the history is invalid: " + "; ".join(str(v) for v in violations))
    last = history[-1]
    if isinstance(last, AssistantMessage):
        raise InvalidInputError(
            "the history ends with an assistant message, so there is nothing for the "
            "model to answer: append a user message to continue"
        )
    return history

"""Agents run as tools of other agents (``Agent.as_tool``): how deeply they nest, and
what a child's run becomes as its parent's tool result; and a prompt as a message.

The depth is a context variable: a child's run is started inside its parent's tool
call, so every task of the child inherits the parent's depth plus one, and an agent
that is its own sub-agent (or a long chain of them) stops at ``max_depth`` with a
``DelegationDepthError`` in the call's error result.
"""

from __future__ import annotations

import contextvars
import json
from typing import Any, Final

from statemachine.agent.events import RunResult
from statemachine.agent.output import output_json
from statemachine.core.messages import UserMessage
from statemachine.core.table import TurnState
from statemachine.core.tools import ToolOutput
from statemachine.errors import DelegationDepthError, InvalidInputError

__all__ = ["DEFAULT_MAX_DEPTH", "child_output", "enter_depth", "leave_depth", "prompt_message"]

DEFAULT_MAX_DEPTH: Final = 5
"""How deeply agents run as tools may nest by default (``Agent.as_tool(max_depth=...)``)."""

_depth: contextvars.ContextVar[int] = contextvars.ContextVar("statemachine_agent_depth", default=0)
"""How many agents run as tools enclose the code running now (a task inherits it)."""


def enter_depth(tool_name: str, max_depth: int) -> contextvars.Token[int]:
    """One level deeper for the child about to run (``DelegationDepthError`` past
    ``max_depth``); ``leave_depth`` with the token once it returned."""
    depth = _depth.get() + 1
    if depth > max_depth:
        raise DelegationDepthError(
            f"the {tool_name} agent was not run: agents run as tools would nest "
            f"{depth} deep, past max_depth={max_depth}"
        )
    return _depth.set(depth)


def leave_depth(token: contextvars.Token[int]) -> None:
    _depth.reset(token)


def prompt_message(prompt: object, name: str) -> UserMessage:
    """``prompt`` as the user message it asks for (``InvalidInputError`` naming it)."""
    if isinstance(prompt, str):
        return UserMessage(prompt)
    if isinstance(prompt, UserMessage):
        return prompt
    raise InvalidInputError(f"{name} must be a str or a UserMessage, got {type(prompt).__name__}")


def child_output(name: str, result: RunResult[Any], typed: bool) -> ToolOutput:
    """The tool result of a sub-agent's run: its output as JSON when it has an output
    type, else its final text."""
    if result.state is TurnState.DONE:
        if typed:
            return ToolOutput(json.dumps(output_json(result.messages)))
        return ToolOutput(result.final_text)
    if result.state is TurnState.AWAITING_USER:
        calls = ", ".join(f"{c.name} ({c.id})" for c in result.pending_approvals)
        return ToolOutput(
            f"the {name} agent stopped to ask a person's approval for {calls or 'its input'}; "
            "a person cannot be asked inside a sub-agent's call (give as_tool an approve "
            "hook, such as the parent's before_tool_call, to decide them)",
            is_error=True,
        )
    return ToolOutput(
        f"the {name} agent ended {result.state.value}: {result.explanation}", is_error=True
    )

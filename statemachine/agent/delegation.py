"""Agents run as tools of other agents (``Agent.as_tool``): how deeply they nest, and
what a child's run becomes as its parent's tool result; and a prompt as a message.

The depth is a context variable: a child's run is started inside its parent's tool
call, so every task of the child inherits the parent's depth plus one, and an agent
that is its own sub-agent (or a long chain of them) stops at ``max_depth`` with a
``DelegationDepthError`` in the call's error result.

A child that stops for approval (its ``before_tool_call`` said ``RequireApproval``)
cannot make the *parent* run stop ``AwaitingUser``: the parent's call of the
sub-agent is running, and the table suspends a run only once nothing runs (rule 8),
with a snapshot that holds no running operation; carrying the child's suspension
through would need a row for a running call that waits for a person. So the child's
approvals are routed to a hook instead: ``as_tool(approve=...)`` takes a hook of
``before_tool_call``'s shape (the parent's own ``before_tool_call`` fits) and is asked
about each call the child waits on, named as the child's (``"<tool>.<child tool>"``,
same id and arguments): ``None`` approves it, ``Deny(reason)`` denies it, and the
child is resumed inside the parent's call, as often as it stops (at most its
``max_turns`` times). ``RequireApproval`` from that hook, or no hook, ends the
parent's call with an error result naming the waiting calls.
"""

from __future__ import annotations

import contextvars
import json
from typing import TYPE_CHECKING, Any, Final

from statemachine.agent.calls import call_hook
from statemachine.agent.events import RunResult
from statemachine.agent.hooks import BeforeToolCall, Deny, RequireApproval
from statemachine.agent.output import output_json
from statemachine.core.abort import AbortSignal
from statemachine.core.messages import ToolCall, UserMessage, thaw_json
from statemachine.core.table import TurnState
from statemachine.core.tools import ToolOutput
from statemachine.errors import DelegationDepthError, InvalidInputError

if TYPE_CHECKING:
    from statemachine.agent.agent import Agent

__all__ = [
    "DEFAULT_MAX_DEPTH",
    "PROMPT_SCHEMA",
    "child_output",
    "decide_approvals",
    "enter_depth",
    "leave_depth",
    "prompt_message",
]

PROMPT_SCHEMA: Final = {
    "type": "object",
    "properties": {"prompt": {"type": "string", "description": "what to ask the agent"}},
    "required": ["prompt"],
    "additionalProperties": False,
}
"""The parameters of an agent run as a tool: one prompt."""

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


async def decide_approvals(
    agent: Agent[Any, Any],
    result: RunResult[Any],
    tool_name: str,
    approve: BeforeToolCall | None,
    deps: Any,  # the parent's, mapped: checked at run time
    signal: AbortSignal,
) -> RunResult[Any]:
    """The child's run once ``approve`` has decided each call it stopped for and it
    was resumed (``result`` itself without a hook, or when the hook asks for a
    person); the child's turns bound how often it can stop."""
    for _ in range(agent.options.max_turns):
        if approve is None or not result.pending_approvals:
            return result
        decisions: dict[str, bool | Deny] = {}
        for call in result.pending_approvals:
            named = ToolCall(call.id, f"{tool_name}.{call.name}", thaw_json(call.arguments))
            decision = await call_hook(approve, named)
            if isinstance(decision, RequireApproval):
                return result  # a person is needed: the call ends naming the calls
            if decision is not None and not isinstance(decision, Deny):
                raise InvalidInputError(
                    f"as_tool's approve returned {type(decision).__name__}: expected "
                    "None (approve), Deny or RequireApproval"
                )
            decisions[call.id] = True if decision is None else decision
        result = await agent.resume(result, approvals=decisions, deps=deps, signal=signal)
    return result

"""The hooks a run calls and the decisions they return.

How the driver calls them (and what it does with what they raise) is
``statemachine.agent.calls``; asking them during a run, ``statemachine.agent.hook_calls``.

Hooks and their failure modes
-----------------------------
- ``before_tool_call(call)``: ``None`` allows, ``Deny(reason)`` refuses (a policy
  denial stops the run in ``AwaitingUser`` at the turn boundary; ``advisory=True``
  only tells the model), ``RequireApproval(reason)`` suspends the call until a person
  decides. A hook that raises fails closed: a policy denial naming the error.
- ``after_tool_call(call, output)``: may return a replacement ``ToolOutput``. A hook
  that raises turns the result into an error result that names the hook's error and
  keeps the tool's own text (nothing is lost).
- ``should_continue(messages, turn)``: asked at each turn boundary; ``Stop(reason)``
  ends the run ``Done`` with the reason as explanation. A hook that raises stops the
  run the same way, with the error as the reason.
- ``transform_context(messages)``: what the model is sent (for compaction); the
  history itself stays append-only. A hook that raises fails that model call, so the
  run ends ``Failed`` with the hook's error as explanation.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeAlias

import attrs

from statemachine.agent.context import RunContext
from statemachine.core.messages import Message, ToolCall
from statemachine.core.tools import ToolOutput
from statemachine.errors import StrayCancelledError

__all__ = [
    "AfterToolCall",
    "BeforeToolCall",
    "Deny",
    "RequireApproval",
    "ShouldContinue",
    "Stop",
    "StrayCancelledError",
    "TransformContext",
]


@attrs.frozen
class Deny:
    """What ``before_tool_call`` returns to refuse a call.

    A policy denial (the default) stops the run in ``AwaitingUser`` at the turn
    boundary; an ``advisory`` one only tells the model, and the run goes on.
    """

    # Checked here, inside the hook's own call: a bad value then takes the hook's
    # failure path (fail closed) instead of killing the permission task later.
    reason: str = attrs.field(validator=attrs.validators.instance_of(str))
    advisory: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))


@attrs.frozen
class RequireApproval:
    """What ``before_tool_call`` returns when a person must approve the call first."""

    reason: str = attrs.field(default="", validator=attrs.validators.instance_of(str))


@attrs.frozen
class Stop:
    """What ``should_continue`` returns to end the run at a turn boundary."""

    reason: str = attrs.field(validator=attrs.validators.instance_of(str))


_Decision: TypeAlias = Awaitable[Deny | RequireApproval | None] | Deny | RequireApproval | None
_Output: TypeAlias = Awaitable[ToolOutput | None] | ToolOutput | None
_Continue: TypeAlias = Awaitable[Stop | None] | Stop | None
_Context: TypeAlias = Awaitable[Sequence[Message]] | Sequence[Message]

# Each hook may also take the run's ``RunContext`` first (annotated as such).
BeforeToolCall: TypeAlias = (
    Callable[[ToolCall], _Decision] | Callable[[RunContext[Any], ToolCall], _Decision]
)
AfterToolCall: TypeAlias = (
    Callable[[ToolCall, ToolOutput], _Output]
    | Callable[[RunContext[Any], ToolCall, ToolOutput], _Output]
)
ShouldContinue: TypeAlias = (
    Callable[[Sequence[Message], int], _Continue]
    | Callable[[RunContext[Any], Sequence[Message], int], _Continue]
)
TransformContext: TypeAlias = (
    Callable[[Sequence[Message]], _Context]
    | Callable[[RunContext[Any], Sequence[Message]], _Context]
)

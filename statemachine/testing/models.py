"""Fake models for your own tests: ``ScriptedModel`` and ``FunctionModel``.

Both are ``ModelClient``s that need no network and no account, and both record what
they were sent, so a test can check the context the loop built as well as the run's
result:

- ``ScriptedModel(*responses)`` answers call *n* with ``responses[n-1]``;
- ``FunctionModel(fn)`` answers with ``fn(messages, tools)``, so the answer can depend on
  the context (say, on the last tool result).

A response may be written short: a ``str`` is a text answer; a ``ToolCall`` (or a list
of them, with text blocks if you like) is a tool-calling answer with stop reason
``toolUse``; an ``AssistantMessage`` is used as it is. An exception class or instance
in a script is raised by that call (a failing provider).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeAlias

import attrs

from statemachine.core.abort import AbortSignal
from statemachine.core.errors import UsageError
from statemachine.core.messages import AssistantMessage, Message, StopReason, TextContent, ToolCall
from statemachine.core.tools import ToolDefinition

__all__ = ["FunctionModel", "Request", "Response", "ScriptedModel"]

Response: TypeAlias = (
    AssistantMessage | str | ToolCall | Sequence[ToolCall | TextContent] | BaseException
)
"""What a fake model may answer (see the module docstring)."""


@attrs.frozen
class Request:
    """One call a fake model received: the context and the tools it was shown."""

    messages: tuple[Message, ...]
    tools: tuple[ToolDefinition, ...]


def as_message(response: Response | type[BaseException]) -> AssistantMessage:
    """The ``AssistantMessage`` a short response stands for (or raise what it is)."""
    if isinstance(response, type) and issubclass(response, BaseException):
        raise response()
    if isinstance(response, BaseException):
        raise response
    if isinstance(response, AssistantMessage):
        return response
    if isinstance(response, str):
        return AssistantMessage(response)
    if isinstance(response, ToolCall):
        return AssistantMessage((response,), stop_reason=StopReason.TOOL_USE)
    blocks = tuple(response)
    if not all(isinstance(b, (ToolCall, TextContent)) for b in blocks):
        raise UsageError(
            "a fake model's response is an AssistantMessage, a str, a ToolCall, or a list "
            f"of ToolCall and TextContent blocks; got {type(response).__name__}"
        )
    has_calls = any(isinstance(b, ToolCall) for b in blocks)
    return AssistantMessage(blocks, stop_reason=StopReason.TOOL_USE if has_calls else "stop")


class _Recording:
    def __init__(self) -> None:
        self.requests: list[Request] = []

    @property
    def calls(self) -> int:
        """How many times the model was called."""
        return len(self.requests)

    def _record(self, messages: Sequence[Message], tools: Sequence[ToolDefinition]) -> None:
        self.requests.append(Request(tuple(messages), tuple(tools)))


class ScriptedModel(_Recording):
    """Answers model call *n* with the *n*-th response of the script.

    A call past the end of the script raises ``UsageError`` (the run ends ``Failed``,
    saying so), so a loop that calls the model more often than the test expected
    fails loudly instead of looping.
    """

    def __init__(self, *responses: Response | type[BaseException]) -> None:
        super().__init__()
        self._script = list(responses)

    @property
    def remaining(self) -> int:
        """Responses not used yet."""
        return len(self._script) - self.calls

    async def complete(
        self, messages: Sequence[Message], tools: Sequence[ToolDefinition], signal: AbortSignal
    ) -> AssistantMessage:
        number = self.calls + 1
        self._record(messages, tools)
        if number > len(self._script):
            raise UsageError(
                f"ScriptedModel: model call {number}, but the script has "
                f"{len(self._script)} response(s)"
            )
        return as_message(self._script[number - 1])


ModelFunction: TypeAlias = Callable[
    [Sequence[Message], Sequence[ToolDefinition]], "Response | Awaitable[Response]"
]


class FunctionModel(_Recording):
    """Answers with ``fn(messages, tools)``; ``fn`` may be sync or async."""

    def __init__(self, fn: ModelFunction) -> None:
        if not callable(fn):
            raise UsageError(f"FunctionModel needs a function, got {type(fn).__name__}")
        super().__init__()
        self._fn = fn

    async def complete(
        self, messages: Sequence[Message], tools: Sequence[ToolDefinition], signal: AbortSignal
    ) -> AssistantMessage:
        self._record(messages, tools)
        response = self._fn(messages, tools)
        if inspect.isawaitable(response):
            response = await response
        return as_message(response)

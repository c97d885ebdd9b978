"""The hooks a run calls, the decisions they return, and how a hook is called.

Whatever a hook, a tool or a model client raises reaches the run as an ``Exception``
(``_call_hook``, ``_carried``), so that the failure path of the operation runs.

Exceptions that are not ``Exception``
-------------------------------------
A tool, model client or hook may raise any ``BaseException``. ``GeneratorExit`` or a
class of its own is that operation's failure like any exception (an error result, a
failed model call, the hook's failure path). ``KeyboardInterrupt`` and ``SystemExit``
mean "stop": the operation is answered the same way, the run is aborted and closed
(every task cancelled and awaited, every call answered), and then ``run()`` raises
the exception to its caller; ``AgentRun.result`` holds how the run ended. A
``CancelledError`` that nothing asked for is the operation's failure too. When the
caller cancels ``run()`` itself (``asyncio.Runner`` does so on Ctrl-C), the run is
aborted and closed the same way before the cancellation goes on.

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

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeAlias, TypeVar

import attrs

from statemachine.core.messages import Message, ToolCall
from statemachine.core.tools import ToolOutput

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

_T = TypeVar("_T")


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


BeforeToolCall: TypeAlias = Callable[
    [ToolCall], Awaitable[Deny | RequireApproval | None] | Deny | RequireApproval | None
]
AfterToolCall: TypeAlias = Callable[
    [ToolCall, ToolOutput], Awaitable[ToolOutput | None] | ToolOutput | None
]
ShouldContinue: TypeAlias = Callable[[Sequence[Message], int], Awaitable[Stop | None] | Stop | None]
TransformContext: TypeAlias = Callable[
    [Sequence[Message]], Awaitable[Sequence[Message]] | Sequence[Message]
]


def _cancel_requested() -> bool:
    """True if someone called ``cancel()`` on the running task (not a stray raise)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


_FATAL = (KeyboardInterrupt, SystemExit)
"""What a tool, client or hook may raise to stop the process: re-raised after the run."""


def _describe(exc: BaseException) -> str:
    if isinstance(exc, _EscapedError):
        exc = exc.original
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ must not kill the reporting task
        text = "(its text could not be read)"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def _maybe_await(value: Awaitable[_T] | _T) -> _T:
    if inspect.isawaitable(value):
        return await value
    return value


class StrayCancelledError(Exception):
    """User code raised ``CancelledError`` although nothing cancelled its task."""


class _EscapedError(Exception):
    """A ``BaseException`` that is not an ``Exception``, carried as an ordinary failure
    so that the failure path of whatever raised it runs (module docstring)."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(_describe(original))
        self.original = original


def _fatal_in(exc: BaseException) -> BaseException | None:
    """The ``KeyboardInterrupt`` or ``SystemExit`` that ``exc`` is or carries."""
    original = exc.original if isinstance(exc, _EscapedError) else exc
    return original if isinstance(original, _FATAL) else None


async def _call_hook(hook: Callable[..., Awaitable[_T] | _T], *args: Any) -> _T:
    """Call a hook; whatever it raises reaches the caller as an ``Exception``, so the
    hook's failure path runs (otherwise its task dies silently and the run hangs)."""
    try:
        return await _maybe_await(hook(*args))
    except asyncio.CancelledError:
        if _cancel_requested():
            raise
        raise StrayCancelledError("raised by the hook though nothing cancelled it") from None
    except BaseException as exc:
        if isinstance(exc, Exception):
            raise
        raise _EscapedError(exc) from exc


async def _carried(awaitable: Awaitable[_T]) -> _T:
    """Await in a task of its own: a ``KeyboardInterrupt`` or ``SystemExit`` escaping a
    task is raised out of the event loop itself, so it leaves the task as a failure."""
    try:
        return await awaitable
    except _FATAL as exc:
        raise _EscapedError(exc) from exc

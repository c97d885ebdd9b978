"""How the driver calls code it does not own: hooks, tools and model clients.

Whatever such code raises reaches the driver as an ``Exception`` (``call_hook``,
``carried``), so that the failure path of the operation runs; ``describe`` is how
any such failure is named in a result, an explanation or a log line.

Exceptions that are not ``Exception``
-------------------------------------
A tool, model client or hook may raise any ``BaseException``. ``GeneratorExit`` or a
class of its own is that operation's failure like any exception (an error result, a
failed model call, the hook's failure path). ``KeyboardInterrupt`` and ``SystemExit``
(``FATAL``) mean "stop": the operation is answered the same way, the run is aborted
and closed (every task cancelled and awaited, every call answered), and then
``run()`` raises the exception to its caller (``fatal_in`` finds it). A
``CancelledError`` that nothing asked for (``cancel_requested`` tells) is the
operation's failure too.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from statemachine.agent.context import current_run_context, wants_context
from statemachine.agent.hooks import StrayCancelledError

__all__ = ["FATAL", "call_hook", "cancel_requested", "carried", "describe", "fatal_in"]

_T = TypeVar("_T")

FATAL = (KeyboardInterrupt, SystemExit)
"""What a tool, client or hook may raise to stop the process: re-raised after the run."""


def cancel_requested() -> bool:
    """True if someone called ``cancel()`` on the running task (not a stray raise)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def describe(exc: BaseException) -> str:
    """``"TypeName: text"`` for ``exc`` (the exception it carries, if any)."""
    if isinstance(exc, _EscapedError):
        exc = exc.original
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ must not kill the reporting task
        text = "(its text could not be read)"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class _EscapedError(Exception):
    """A ``BaseException`` that is not an ``Exception``, carried as an ordinary failure
    so that the failure path of whatever raised it runs (module docstring)."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(describe(original))
        self.original = original


def fatal_in(exc: BaseException) -> BaseException | None:
    """The ``KeyboardInterrupt`` or ``SystemExit`` that ``exc`` is or carries."""
    original = exc.original if isinstance(exc, _EscapedError) else exc
    return original if isinstance(original, FATAL) else None


async def call_hook(hook: Callable[..., Awaitable[_T] | _T], *args: Any) -> _T:
    """Call a hook, sync or async; whatever it raises reaches the caller as an
    ``Exception``, so the hook's failure path runs (otherwise its task dies silently
    and the run hangs). A hook whose first parameter is annotated ``RunContext``
    receives the run's context first."""
    try:
        if wants_context(hook):
            args = (current_run_context(), *args)
        value = hook(*args)
        if inspect.isawaitable(value):
            return await value
        return value
    except asyncio.CancelledError:
        if cancel_requested():
            raise
        raise StrayCancelledError("raised by the hook though nothing cancelled it") from None
    except BaseException as exc:
        if isinstance(exc, Exception):
            raise
        raise _EscapedError(exc) from exc


async def carried(awaitable: Awaitable[_T]) -> _T:
    """Await in a task of its own: a ``KeyboardInterrupt`` or ``SystemExit`` escaping a
    task is raised out of the event loop itself, so it leaves the task as a failure."""
    try:
        return await awaitable
    except FATAL as exc:
        raise _EscapedError(exc) from exc

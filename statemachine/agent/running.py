"""What a running tool reaches of its run: the call it is (``current_tool_call``),
its progress and log reports (``report_progress``, ``report_log``) and a person to
ask (``ask_person``). Each reads the executor and the call from the call's own
context (``running_call``), which the executor sets while it runs the tool.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from statemachine.agent.events import ToolLog, ToolProgress, ToolQuestion
from statemachine.agent.questions import Answer
from statemachine.core.abort import AbortSignal
from statemachine.core.messages import ToolCall

if TYPE_CHECKING:
    from statemachine.agent.executor import AsyncioExecutor

__all__ = ["ask_person", "current_tool_call", "report_log", "report_progress", "running_call"]

running_call: contextvars.ContextVar[tuple[AsyncioExecutor, ToolCall] | None] = (
    contextvars.ContextVar("statemachine_running_call", default=None)
)
"""The executor running a tool call, and the call: set in the call's own context."""


def current_tool_call() -> ToolCall | None:
    """The call a tool is executing (its id, name and arguments), or ``None``
    outside a tool run by the driver; works in sync tools' worker threads too."""
    running = running_call.get()
    return None if running is None else running[1]


def report_progress(data: object) -> bool:
    """Report progress from inside a running tool (async or sync, any thread).

    Subscribers of ``AgentRun.events()`` receive a ``ToolProgress`` event. Returns
    False (and does nothing) outside a tool run by the driver.
    """
    running = running_call.get()
    if running is None:
        return False
    executor, call = running
    executor.tell(partial(ToolProgress, call.id, data))
    return True


def report_log(level: str, data: object, logger: str | None = None) -> bool:
    """Report a log message from inside a running tool (any thread), as
    ``report_progress`` does: subscribers receive a ``ToolLog`` event (an MCP server's
    ``notifications/message`` during a call arrive so)."""
    running = running_call.get()
    if running is None:
        return False
    executor, call = running
    executor.tell(partial(ToolLog, call.id, level, data, logger))
    return True


async def ask_person(
    make: Callable[[str, ToolCall], ToolQuestion], signal: AbortSignal
) -> Answer | None:
    """Ask a person, through the run, the question ``make(id, call)`` builds, from
    inside a running tool (``statemachine.agent.questions``); its answer ("cancel"
    once ``signal``, the call's own, fires). ``None`` outside a tool run by the driver,
    and where the run's backend has no one to ask (``Backend.ask``)."""
    running = running_call.get()
    if running is None:
        return None
    executor, call = running
    return await executor.backend.ask(executor, call, lambda qid: make(qid, call), signal)

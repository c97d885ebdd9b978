"""Running a run from code without an event loop: ``run_agent_sync`` and its kin.

A run is asyncio code; these give it a loop of its own and close that loop without
waiting for what the run abandoned (a tool that ignores cancellation, a sync tool
blocked in its thread), which ``asyncio.run`` would wait for forever.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from functools import partial
from typing import Any, TypeVar

from statemachine.errors import UsageError

__all__ = ["DEFAULT_GRACE_PERIOD", "close_loop", "refuse_running_loop", "run_sync"]

T = TypeVar("T")

DEFAULT_GRACE_PERIOD = 1.0
"""Seconds an aborted operation is given to finish its cleanup before cancellation."""


def refuse_running_loop(name: str) -> None:
    """``UsageError`` if called from a running event loop (``name`` is the sync form)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise UsageError(
        f"{name}() cannot be called from a running event loop; "
        f"use 'await {name.removesuffix('_sync')}(...)' instead"
    )


def run_sync(run: Coroutine[Any, Any, T], grace_period: object) -> T:
    """Run ``run`` on a new event loop, closed without waiting for what the run
    abandoned (``run_agent_sync``)."""
    runner = asyncio.Runner(loop_factory=asyncio.new_event_loop)
    loop = runner.get_loop()
    grace = grace_period if isinstance(grace_period, (int, float)) else DEFAULT_GRACE_PERIOD
    try:
        return runner.run(run)
    finally:
        close_loop(loop, grace)


def _quiet_about(
    abandoned: set[int], loop: asyncio.AbstractEventLoop, context: dict[str, Any]
) -> None:
    """An exception handler that says nothing of the ``abandoned`` tasks' destruction."""
    task = context.get("task")
    if task is not None and id(task) in abandoned and "exception" not in context:
        return
    loop.default_exception_handler(context)


def close_loop(loop: asyncio.AbstractEventLoop, grace: float) -> None:
    """Close ``loop`` without waiting past ``grace`` for tasks that ignore cancellation,
    nor at all for executor threads (``loop.close()`` does not join them)."""
    try:
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.wait(pending, timeout=max(float(grace), 0.0)))
        abandoned = {id(task) for task in pending if not task.done()}
        if abandoned:
            # Abandoned, and reported as such by the run: asyncio need not say again,
            # when such a task is collected, that it never finished.
            loop.set_exception_handler(partial(_quiet_about, abandoned))
        loop.run_until_complete(
            asyncio.wait(
                [loop.create_task(loop.shutdown_asyncgens())], timeout=max(float(grace), 0.0)
            )
        )
    finally:
        loop.close()

"""Waiting for a run's result while watching that it is not held.

A run can be held while a caller waits for its result: a deploy took away code the
run needs, and the worker that took it holds it rather than run it. Its result would
then never come, so ``result()`` looks at the run's state every ``every`` seconds
while it waits and raises what the look raises (``RunHeldError``), as ``status()``
would say ``held``. Imports no backend.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ["HELD_CHECK", "unless_held"]

T = TypeVar("T")

HELD_CHECK = 1.0  # seconds between two looks at a run whose result is awaited


async def unless_held(
    waiting: Awaitable[T], check: Callable[[], Awaitable[None]], every: float = HELD_CHECK
) -> T:
    """The outcome of ``waiting``; meanwhile ``check()`` every ``every`` seconds, and
    what it raises ends the wait (``waiting`` is cancelled)."""
    result = asyncio.ensure_future(waiting)
    try:
        while True:
            done, _ = await asyncio.wait({result}, timeout=every)
            if done:
                return result.result()
            await check()
    finally:
        if not result.done():
            result.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await result

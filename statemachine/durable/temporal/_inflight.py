"""The updates of one run in flight from this process, shared by all its handles.

Temporal's server takes ``IN_FLIGHT`` updates of one workflow in flight at once and
turns the others away for a while. Handles of one run (many of them, each sending a
message) share one limit per run and event loop, so together they never send more
than the server takes, and the rest wait here in order rather than on the server's
refusals. An entry lives while an update of its run waits or is in flight (it holds
the run's id and the loop), and goes once none does: the registry holds no more
entries than the runs with updates in flight.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

__all__ = ["IN_FLIGHT", "in_flight"]

IN_FLIGHT = 10  # updates of one run Temporal's server takes in flight at once (its default)


class _Slots:
    """The run's limit, and how many updates hold or wait for one of its slots."""

    def __init__(self) -> None:
        self.semaphore = asyncio.Semaphore(IN_FLIGHT)
        self.users = 0


# (workflow id, event loop) -> its slots; a semaphore belongs to one loop.
_REGISTRY: dict[tuple[str, asyncio.AbstractEventLoop], _Slots] = {}


@asynccontextmanager
async def in_flight(workflow_id: str) -> AsyncIterator[None]:
    """Hold one of the run's ``IN_FLIGHT`` slots of this event loop while the block
    runs (waiting for one first)."""
    key = (workflow_id, asyncio.get_running_loop())
    slots = _REGISTRY.get(key)
    if slots is None:
        slots = _REGISTRY[key] = _Slots()
    slots.users += 1
    try:
        async with slots.semaphore:
            yield
    finally:
        slots.users -= 1
        if slots.users == 0:
            del _REGISTRY[key]

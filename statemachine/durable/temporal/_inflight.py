"""The updates of one run in flight from this process, shared by all its handles.

Temporal's server takes ``IN_FLIGHT`` updates of one workflow in flight at once and
turns the others away for a while. Handles of one run (many of them, each sending a
message) share one limit per run and event loop, so together they never send more
than the server takes, and the rest wait here in order rather than on the server's
refusals. An entry lives while an update of its run waits or is in flight (it holds
the run's id and the loop), and goes once none does: the registry holds no more
entries than the runs with updates in flight. ``send_update`` sends one so, again
while the server turns it away.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

from temporalio.client import WorkflowHandle, WorkflowUpdateRPCTimeoutOrCancelledError
from temporalio.service import RPCError, RPCStatusCode

__all__ = ["IN_FLIGHT", "in_flight", "send_update"]

IN_FLIGHT = 10  # updates of one run Temporal's server takes in flight at once (its default)
FIRST_PAUSE = 0.05  # seconds before an update the server turned away is sent again
LAST_PAUSE = 1.0  # ... doubling up to this
# How the server turns an update away for a while: too many in flight, or aborted
# (the run's workflow task was given to a worker again).
_BUSY = (RPCStatusCode.RESOURCE_EXHAUSTED, RPCStatusCode.UNAVAILABLE)


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


async def send_update(
    workflow: WorkflowHandle[Any, Any], name: str, argument: Any, timeout: float
) -> Any:
    """The result of the update ``name``, sent again while the server turns it away
    for the updates of the run it has in flight (it takes ``IN_FLIGHT`` at once, which
    every sender of the run in this process shares) or aborts it, until ``timeout``
    seconds have passed (``WorkflowUpdateRPCTimeoutOrCancelledError``). Every try has
    the same update id: the server takes the update once, however many tries reach it."""
    update_id = f"{name}-{uuid.uuid4().hex}"
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    pause = FIRST_PAUSE
    while True:
        try:
            async with asyncio.timeout_at(deadline), in_flight(workflow.id):
                left = deadline - loop.time()
                return await workflow.execute_update(
                    name, argument, id=update_id, rpc_timeout=timedelta(seconds=left)
                )
        except TimeoutError:
            raise WorkflowUpdateRPCTimeoutOrCancelledError() from None
        except RPCError as exc:
            if exc.status not in _BUSY or deadline - loop.time() <= pause:
                raise
        # Spread the tries of updates sent at once, so they do not come back together.
        await asyncio.sleep(random.uniform(pause / 2, pause))
        pause = min(pause * 2, LAST_PAUSE)

"""The durable runs of a Temporal namespace seen from a process that is not a worker
(``statemachine.durable.RunStore``): ``open_store("temporal://HOST:PORT/NAMESPACE")``,
which the command line's ``durable export|list --backend temporal`` uses. It
connects at its first use; queries (a running run's pending approvals) need a live
worker of the run, as with a handle."""

from __future__ import annotations

import asyncio
import atexit
import gc
import os
from typing import IO, Any

import attrs
from temporalio.api.enums.v1 import WorkflowExecutionStatus
from temporalio.client import Client

from statemachine.durable import ExportedJournal, ListedRun, RunStatus
from statemachine.durable._inputs import MAX_URL_CHARS, check_run_id
from statemachine.durable.temporal import _export
from statemachine.durable.temporal._handle import _STATES, TemporalRunHandle, open_handle
from statemachine.durable.temporal._workflow import WORKFLOW
from statemachine.errors import InvalidInputError, StoreUnavailableError

__all__ = ["MAX_LIST_LIMIT", "TemporalStore", "open_store"]

MAX_LIST_LIMIT = 10_000
LOOKS = 16  # running runs asked at once while listing
_KNOWN = ("running", "waiting", "held", "finished", "failed", "cancelled")
_EXECUTION = {  # each state, as Temporal's visibility names the executions in it
    "running": ("Running",),
    "waiting": ("Running",),
    "held": ("Running",),
    "finished": ("Completed",),
    "failed": ("Failed", "TimedOut", "Terminated"),
    "cancelled": ("Canceled",),
}


def open_store(database_url: str) -> TemporalStore:
    """The runs of the namespace ``temporal://HOST:PORT/NAMESPACE`` (the namespace
    ``default`` when the path is empty; ``HOST:PORT`` alone works too)."""
    if not isinstance(database_url, str) or not database_url or len(database_url) > MAX_URL_CHARS:
        raise InvalidInputError(f"a Temporal address is a non-empty str of at most {MAX_URL_CHARS}")
    rest = database_url.removeprefix("temporal://")
    address, _, namespace = rest.partition("/")
    if not address or "/" in namespace:
        raise InvalidInputError(f"not a Temporal address: {database_url!r}")
    return TemporalStore(address, namespace or "default")


_collecting: list[bool] = []  # [True] once ``_collect_before_exit`` is registered


def _collect_before_exit() -> None:
    """Collect garbage at exit while the interpreter is still whole (``atexit``).

    What temporalio's client leaves in reference cycles (from calls on an event loop
    that has since closed: a second ``asyncio.run``) is otherwise freed while the
    interpreter finalizes, when its native threads may no longer take the GIL: the
    process then aborted at exit, now and then, with "Fatal Python error:
    PyGILState_Release" (temporalio/sdk-python#300)."""
    if not _collecting:
        _collecting.append(True)
        atexit.register(gc.collect)


class TemporalStore:
    """The runs of one Temporal namespace (module docstring)."""

    def __init__(
        self, address: str, namespace: str = "default", client: Client | None = None
    ) -> None:
        self.address = address
        self.namespace = namespace
        self._client = client

    async def _connected(self) -> Client:
        if self._client is None:
            _collect_before_exit()
            try:
                self._client = await Client.connect(self.address, namespace=self.namespace)
            except RuntimeError as exc:
                raise StoreUnavailableError(
                    f"cannot reach Temporal at {self.address}: {exc}"
                ) from None
        return self._client

    async def handle(self, run_id: str) -> TemporalRunHandle:
        check_run_id(run_id)
        return await open_handle(await self._connected(), run_id)

    async def list_runs(self, status: str | None = None, limit: int = 100) -> tuple[ListedRun, ...]:
        """The runs, newest first, at most ``limit``; ``status`` keeps one state. A
        running run is asked whether it waits or is held (one look each)."""
        if (
            isinstance(limit, bool)
            or not isinstance(limit, int)
            or not 1 <= limit <= MAX_LIST_LIMIT
        ):
            raise InvalidInputError(
                f"limit must be an int from 1 to {MAX_LIST_LIMIT}, got {limit!r}"
            )
        if status is not None and status not in _KNOWN:
            raise InvalidInputError(f"unknown status {status!r}; known: {', '.join(_KNOWN)}")
        client = await self._connected()
        found = []
        query = f"WorkflowType = '{WORKFLOW}'"  # newest first
        if status is not None:
            query += f" AND ({' OR '.join(f'ExecutionStatus = {s!r}' for s in _EXECUTION[status])})"
        async for execution in client.list_workflows(query):
            found.append(execution)
            # A status filter drops runs after their look: read more than ``limit``
            # then, still bounded.
            if len(found) >= (limit if status is None else MAX_LIST_LIMIT):
                break
        # A running run is asked (a query): those no worker answers cost
        # QUERY_TIMEOUT each, so LOOKS of them are asked at once.
        looks = asyncio.Semaphore(LOOKS)

        async def listed(execution: Any) -> ListedRun:
            code = WorkflowExecutionStatus.ValueType(int(execution.status or 1))
            state = _STATES.get(code, "running")
            if state == "running":
                async with looks:
                    seen = await TemporalRunHandle(client, execution.id).status(tries=1)
            else:
                seen = RunStatus(execution.id, state)
            start = execution.start_time.timestamp()
            end = execution.close_time.timestamp() if execution.close_time else start
            return ListedRun(**attrs.asdict(seen, recurse=False), created=start, updated=end)

        runs = await asyncio.gather(*(listed(e) for e in found))
        kept = [r for r in runs if status is None or r.state == status]
        return tuple(kept[:limit])

    async def export_journal(
        self, run_id: str, target: str | os.PathLike[str] | IO[str]
    ) -> ExportedJournal:
        return await _export.export_journal(await self._connected(), run_id, target)

    def close(self) -> None:
        self._client = None  # the SDK's connection closes with its last reference

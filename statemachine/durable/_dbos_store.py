"""The runs' database on DBOS seen from a process that is not a worker: ``connect``
(a client of it) and ``DBOSStore`` (the backend's ``RunStore``, which
``open_store("dbos", url)`` opens): handles, the list of runs, journal exports.
"""

from __future__ import annotations

import os
from typing import IO

from dbos import DBOSClient

from statemachine.durable import ExportedJournal, ListedRun, _dbos_ops
from statemachine.durable._dbos_errors import (
    listening_client,
    reachable,
    store_errors,
    write_ahead,
)
from statemachine.durable._dbos_handle import DBOSRunHandle, open_handle
from statemachine.durable._dbos_status import newest_version
from statemachine.durable._inputs import check_url

__all__ = ["DBOSStore", "connect", "open_store"]


class DBOSStore:
    """The runs' database seen from a process that is not a worker
    (``statemachine.durable.RunStore``, ``open_store("dbos", url)``). It sees runs as
    a worker of the newest application version registered in the database would: a
    run of another version is ``held``, waiting for a worker of its version."""

    def __init__(self, database_url: str) -> None:
        self.database_url = database_url
        self._client = connect(database_url)

    async def handle(self, run_id: str) -> DBOSRunHandle:
        viewer = await newest_version(self._client)
        return await open_handle(self._client, run_id, viewer, newest=True)

    async def list_runs(self, status: str | None = None, limit: int = 100) -> tuple[ListedRun, ...]:
        viewer = await newest_version(self._client)
        return await _dbos_ops.list_runs(self._client, status, limit, viewer, newest=True)

    async def export_journal(
        self, run_id: str, target: str | os.PathLike[str] | IO[str]
    ) -> ExportedJournal:
        return await _dbos_ops.export_journal(self._client, run_id, target)

    def close(self) -> None:
        self._client.destroy()


def open_store(database_url: str) -> DBOSStore:
    """The ``RunStore`` of the DBOS backend on ``database_url``."""
    return DBOSStore(database_url)


def connect(database_url: str = "sqlite:///statemachine.sqlite") -> DBOSClient:
    """A client of the runs' database, for processes that are not workers: pass it to
    ``DBOSRunHandle.open``. ``destroy()`` it when done. ``StoreUnavailableError`` if
    the database cannot be reached."""
    reachable(check_url(database_url))
    write_ahead(database_url)
    with store_errors(database_url):
        # On PostgreSQL a listener thread wakes a handle's result() when the run ends.
        return listening_client(database_url)

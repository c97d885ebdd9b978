"""Heartbeats that a held event loop cannot stop.

An activity heartbeats from the worker's event loop (``_activities``), and
temporalio records a heartbeat on that loop too. An async tool that blocks the loop
(a ``time.sleep``, a long computation without ``await``) would stop every heartbeat
of the worker: after ``heartbeat`` seconds Temporal would give the call to another
attempt while the first still runs, and the call would run twice at once.

So one thread per worker (``Standby``) looks, every ``heartbeat / 6`` seconds, at
the calls its activities run: a call whose loop has not beaten for half a heartbeat
timeout is heartbeaten from the thread, through the worker's client
(``AsyncActivityHandle.heartbeat``, on an event loop of the thread's own), with the
call's last checkpoint, until its loop beats again. The thread runs only while a
call runs and ends once none does (or the interpreter exits). A call held for good
is then ended by its ``tool_timeout`` (or ``model_timeout``), not retried beside
itself.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from typing import Any

import attrs
from temporalio.client import Client

__all__ = ["Beating", "Standby"]


@attrs.define(eq=False)
class Beating:
    """One call's heartbeats: when its loop last beat, and its checkpoint."""

    token: bytes
    details: Sequence[Any]  # the checkpoint, as ``checkpoint`` last recorded it
    last: float = attrs.field(factory=time.monotonic)

    def beat(self) -> None:
        self.last = time.monotonic()


class Standby:
    """The thread that heartbeats the calls whose loop is held (module docstring)."""

    def __init__(self, heartbeat: float) -> None:
        self.heartbeat = heartbeat
        self._lock = threading.Lock()
        self._calls: dict[bytes, Beating] = {}
        self._client: Client | None = None
        self._thread: threading.Thread | None = None

    def enter(self, client: Client, token: bytes, details: Sequence[Any]) -> Beating:
        """Watch the call of ``token`` until ``leave``."""
        beating = Beating(token, details)
        with self._lock:
            self._calls[token] = beating
            self._client = client
            if self._thread is None:
                self._thread = threading.Thread(
                    target=asyncio.run, args=(self._watch(),), name="statemachine-heartbeats"
                )
                self._thread.start()
        return beating

    def leave(self, beating: Beating) -> None:
        with self._lock:
            if self._calls.get(beating.token) is beating:
                del self._calls[beating.token]

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat / 6)
            with self._lock:
                late_after = time.monotonic() - self.heartbeat / 2
                late = [b for b in self._calls.values() if b.last < late_after]
                client = self._client
                # No call left, or the interpreter is exiting (its main thread has
                # ended, and waits for this one): nothing more to watch.
                if not self._calls or not threading.main_thread().is_alive():
                    self._thread = None  # the next ``enter`` starts another
                    return
            for beating in late:
                await _send(client, beating)


async def _send(client: Client | None, beating: Beating) -> None:
    """One heartbeat of a held call; a call Temporal no longer has (it ended, was
    cancelled or timed out) is its own worker's to learn of, on its loop."""
    if client is None:
        return
    handle = client.get_async_activity_handle(task_token=beating.token)
    try:
        await handle.heartbeat(*beating.details)
    except Exception:  # noqa: BLE001 - its loop's next heartbeat meets the same answer
        pass

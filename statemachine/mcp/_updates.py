"""Resource updates: what a server says changed among the resources a client
subscribed to, on a ``subscriptions/listen`` stream (the 2026-07-28 protocol)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import mcp
from mcp.client.subscriptions import ListenNotSupportedError
from mcp.shared.subscriptions import ResourceUpdated

from statemachine.errors import MCPError
from statemachine.mcp._results import describe

__all__ = ["ResourceUpdates", "listen_for_updates"]


class ResourceUpdates:
    """The URIs of the subscribed resources that changed, in the order they changed
    (``async for uri in updates``). An unread update of a URI is kept once however
    often the server repeats it, and a URI not subscribed to is ignored, so what waits
    is never more than the URIs subscribed to."""

    def __init__(self, server: str, uris: Iterable[str], holder: asyncio.Future[None]) -> None:
        self.server = server
        self.uris = frozenset(uris)
        self._pending: dict[str, None] = {}  # ordered, each URI once
        self._wake = asyncio.Event()
        self._ended: str | None = None  # why the stream ended, once it has
        self._holder = holder

    def changed(self, uri: str) -> None:
        if uri in self.uris:
            self._pending[uri] = None
            self._wake.set()

    def end(self, reason: str) -> None:
        self._ended = self._ended or reason
        self._wake.set()

    def __aiter__(self) -> ResourceUpdates:
        return self

    async def __anext__(self) -> str:
        while not self._pending:
            if self._ended is not None:
                raise MCPError(f"MCP server {self.server!r}: resource updates ended: {self._ended}")
            self._wake.clear()
            waiting = asyncio.ensure_future(self._wake.wait())
            try:
                await asyncio.wait((waiting, self._holder), return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiting.cancel()
            if self._holder.done() and not self._pending:
                self.end("the connection ended")
        uri = next(iter(self._pending))
        del self._pending[uri]
        return uri


async def listen_for_updates(
    client: mcp.Client, updates: ResourceUpdates, opened: asyncio.Future[None]
) -> None:
    """Hold the stream until cancelled, telling ``updates`` each change (never raises:
    a failure before the stream opened goes to ``opened``, after it to ``updates``)."""
    try:
        async with client.listen(resource_subscriptions=sorted(updates.uris)) as stream:
            opened.set_result(None)
            async for event in stream:
                if isinstance(event, ResourceUpdated):
                    updates.changed(event.uri)
        updates.end("the server closed the stream")
    except ListenNotSupportedError:
        reason = "resource updates need a server of the 2026-07-28 protocol (subscriptions/listen)"
        if not opened.done():
            opened.set_exception(MCPError(f"MCP server {updates.server!r}: {reason}"))
        updates.end(reason)
    except Exception as exc:  # noqa: BLE001 - reported to the subscriber
        failure = MCPError(f"MCP server {updates.server!r}, subscriptions/listen: {describe(exc)}")
        if not opened.done():
            opened.set_exception(failure)
        updates.end(describe(exc))

"""The requests of an ``MCPServer`` other than tool calls: resources and prompts."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, TypeVar

import mcp

from statemachine.core.messages import Message, ToolResultContent
from statemachine.errors import InvalidInputError, MCPError
from statemachine.mcp._resources import (
    MCPCompletion,
    MCPPrompt,
    MCPResource,
    MCPResourceTemplate,
    completion_of,
    prompt_messages,
    prompt_of,
    reference_of,
    resource_blocks,
    resource_of,
    template_of,
)
from statemachine.mcp._results import describe
from statemachine.mcp._support import retrieve, subscription
from statemachine.mcp._updates import ResourceUpdates, listen_for_updates

__all__ = ["Requests"]

_T = TypeVar("_T")


class Requests:
    """Resources and prompts, listed and read within ``call_timeout`` (a base of
    ``MCPServer``, which holds the connection)."""

    name: str
    call_timeout: float | None
    max_tools: int
    max_output_chars: int
    max_output_bytes: int
    max_blocks: int
    _client: mcp.Client | None
    _holder: asyncio.Task[None] | None
    _lost: str | None
    _watchers: set[ResourceUpdates]  # the resource_updates blocks of an older server

    # -- resources and prompts ----------------------------------------------------------

    async def list_resources(self) -> tuple[MCPResource, ...]:
        """The server's resources (at most ``max_tools`` of them)."""
        found = await self._listing(
            "resources/list", "resources", lambda at, c: c.list_resources(cursor=at)
        )
        return tuple(resource_of(r) for page in found for r in page.resources)

    async def list_resource_templates(self) -> tuple[MCPResourceTemplate, ...]:
        """The server's resource templates (at most ``max_tools`` of them)."""
        found = await self._listing(
            "resources/templates/list",
            "resource_templates",
            lambda at, c: c.list_resource_templates(cursor=at),
        )
        return tuple(template_of(t) for page in found for t in page.resource_templates)

    @contextlib.asynccontextmanager
    async def resource_updates(self, *uris: str) -> AsyncIterator[ResourceUpdates]:
        """Subscribe to the resources at ``uris`` for the block: iterate what it
        yields for the URI of each one the server says changed (read it again with
        ``read_resource``). A server of the 2026-07-28 protocol is listened to on a
        ``subscriptions/listen`` stream (opened within ``call_timeout``); an older
        one is sent ``resources/subscribe`` for each URI (and ``resources/unsubscribe``
        at the end), and its ``notifications/resources/updated`` heard. Unread updates
        of one URI count once, so they never pile up; the iteration ends with an
        ``MCPError`` if the stream or the connection is lost."""
        client, holder = self._client, self._holder
        if client is None or holder is None or holder.done() or self._lost is not None:
            raise MCPError(f"MCP server {self.name!r} is not connected: {self._lost or 'closed'}")
        updates = ResourceUpdates(self.name, uris, holder)
        if client.protocol_version < "2026-07-28":
            async with self._subscribed(updates):
                yield updates
            return
        opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        opened.add_done_callback(retrieve)
        listener = asyncio.ensure_future(listen_for_updates(client, updates, opened))
        try:
            try:
                async with asyncio.timeout(self.call_timeout):
                    await asyncio.wait((opened, holder), return_when=asyncio.FIRST_COMPLETED)
            except TimeoutError:
                raise MCPError(
                    f"MCP server {self.name!r}, subscriptions/listen: not opened within "
                    f"{self.call_timeout} s (call_timeout)"
                ) from None
            if not opened.done():
                raise MCPError(
                    f"MCP server {self.name!r}, subscriptions/listen: the connection ended"
                )
            opened.result()
            yield updates
        finally:
            listener.cancel()
            await asyncio.wait((listener,))

    @contextlib.asynccontextmanager
    async def _subscribed(self, updates: ResourceUpdates) -> AsyncIterator[None]:
        """``resources/subscribe`` for each URI (a server of a protocol before
        2026-07-28), its updates told to ``updates`` while the block lasts."""
        self._watchers.add(updates)
        try:
            for uri in sorted(updates.uris):
                await self._ask(f"resources/subscribe {uri!r}", subscription(uri, on=True))
            yield
        finally:
            self._watchers.discard(updates)
            for uri in sorted(updates.uris) if self._lost is None else ():
                with contextlib.suppress(MCPError):  # best effort: the server may be gone
                    await self._ask(f"resources/unsubscribe {uri!r}", subscription(uri, on=False))

    async def read_resource(self, uri: str) -> tuple[ToolResultContent, ...]:
        """A resource's contents as text and image blocks, bounded like a tool result:
        put them in a run as ``UserMessage((TextContent("..."), *blocks))``."""
        read = await self._ask(f"resource {uri!r}", lambda c: c.read_resource(uri))
        return resource_blocks(read, *self._limits())

    async def list_prompts(self) -> tuple[MCPPrompt, ...]:
        """The server's prompts (at most ``max_tools`` of them)."""
        found = await self._listing(
            "prompts/list", "prompts", lambda at, c: c.list_prompts(cursor=at)
        )
        return tuple(prompt_of(p) for page in found for p in page.prompts)

    async def get_prompt(
        self, name: str, arguments: Mapping[str, str] | None = None
    ) -> tuple[Message, ...]:
        """A prompt's messages, ready to start a run with (bounded like a tool result)."""
        got = await self._ask(
            f"prompt {name!r}", lambda c: c.get_prompt(name, dict(arguments or {}))
        )
        return prompt_messages(got, *self._limits())

    async def complete_argument(
        self,
        of: MCPPrompt | MCPResourceTemplate,
        argument: str,
        value: str = "",
        *,
        context: Mapping[str, str] | None = None,
    ) -> MCPCompletion:
        """What the server suggests for ``argument`` of a prompt or a resource template
        (``completion/complete``), given what is typed so far (``value``) and the
        arguments already chosen (``context``). Within ``call_timeout``; at most
        ``MAX_COMPLETION_VALUES`` (100) values of at most ``MAX_COMPLETION_CHARS``
        (1,000) characters each are kept."""
        reference = reference_of(of)
        chosen = dict(context or {})
        if not all(isinstance(v, str) for v in (argument, value, *chosen, *chosen.values())):
            raise InvalidInputError("complete_argument takes text: argument, value, context")
        completed = await self._ask(
            f"completion/complete of {argument!r}",
            lambda c: c.complete(reference, {"name": argument, "value": value}, chosen or None),
        )
        return completion_of(completed)

    def _limits(self) -> tuple[int, int, int]:
        return self.max_output_chars, self.max_output_bytes, self.max_blocks

    async def _listing(
        self, what: str, field: str, fetch: Callable[[str | None, mcp.Client], Awaitable[Any]]
    ) -> list[Any]:
        pages: list[Any] = []
        cursor: str | None = None
        listed = 0
        while True:
            page = await self._ask(what, functools.partial(fetch, cursor))
            pages.append(page)
            listed += len(getattr(page, field))
            if listed > self.max_tools:
                raise MCPError(
                    f"MCP server {self.name!r}: {what} lists more than "
                    f"{self.max_tools} entries (max_tools)"
                )
            cursor = page.next_cursor
            if not cursor:
                return pages

    async def _ask(self, what: str, fetch: Callable[[mcp.Client], Awaitable[_T]]) -> _T:
        """One request, within ``call_timeout``, answered (or failed) when the
        connection ends."""
        client, holder = self._client, self._holder
        if client is None or holder is None or holder.done() or self._lost is not None:
            raise MCPError(f"MCP server {self.name!r} is not connected: {self._lost or 'closed'}")
        request = asyncio.ensure_future(fetch(client))
        try:
            async with asyncio.timeout(self.call_timeout):
                await asyncio.wait((request, holder), return_when=asyncio.FIRST_COMPLETED)
        except BaseException as exc:
            request.cancel()
            request.add_done_callback(retrieve)
            if isinstance(exc, TimeoutError):
                raise MCPError(
                    f"MCP server {self.name!r}, {what}: no answer within "
                    f"{self.call_timeout} s (call_timeout)"
                ) from None
            raise
        if not request.done():
            request.cancel()
            request.add_done_callback(retrieve)
            ended = f" ({self._lost})" if self._lost else ""
            raise MCPError(f"MCP server {self.name!r}, {what}: the connection ended{ended}")
        try:
            return request.result()
        except Exception as exc:
            if self._lost is not None:  # the request failed because the connection ended
                raise MCPError(
                    f"MCP server {self.name!r}, {what}: the connection ended ({self._lost})"
                ) from None
            raise MCPError(f"MCP server {self.name!r}, {what}: {describe(exc)}") from exc

"""Listing a server's tools and checking them: the base of ``MCPServer`` that turns
its ``tools/list`` pages into ``Tool`` objects."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import mcp
import mcp.types as mcp_types
from mcp.client.caching import CacheMode

from statemachine.agent.tools import Tool
from statemachine.core.tools import ToolDefinition
from statemachine.errors import InvalidInputError
from statemachine.mcp._requests import Requests

__all__ = ["Listing"]


class Listing(Requests):
    """Tools listed page by page (at most ``max_tools``) and checked in a worker thread."""

    prefix: str
    _allowed: Callable[[str], bool]
    _allowed_names: frozenset[str]
    _blocked: Callable[[str], bool]
    # MCPServer's: the error of a server that cannot be reached, and a listed tool's Tool.
    _unreachable: Callable[[BaseException], BaseException]
    _tool: Callable[[mcp_types.Tool, ToolDefinition], Tool]

    async def _list_tools(
        self, client: mcp.Client, cache_mode: CacheMode = "use"
    ) -> list[mcp_types.Tool]:
        listed: list[mcp_types.Tool] = []
        cursor: str | None = None
        while True:
            try:
                page = await client.list_tools(cursor=cursor, cache_mode=cache_mode)
            except Exception as exc:
                raise self._unreachable(exc) from exc
            listed.extend(page.tools)
            if len(listed) > self.max_tools:
                raise InvalidInputError(
                    f"MCP server {self.name!r} lists more than {self.max_tools} tools (max_tools)"
                )
            cursor = page.next_cursor
            if not cursor:
                return listed

    async def _checked(self, remote: list[mcp_types.Tool]) -> tuple[Tool, ...]:
        """The offered tools, their schemas checked in a worker thread, one at a time;
        stopped between two tools when the deadline passes (or the caller cancels)."""
        names = [t.name for t in remote]
        seen: set[str] = set()
        for name in names:
            if name in seen:
                raise InvalidInputError(f"MCP server {self.name!r} lists two tools named {name!r}")
            seen.add(name)
        missing = sorted(self._allowed_names - seen)
        if missing:
            raise InvalidInputError(
                f"MCP server {self.name!r} does not list the allowed tools {missing}"
            )
        offered = [t for t in remote if self._allowed(t.name) and not self._blocked(t.name)]
        stop = threading.Event()

        def check() -> list[ToolDefinition]:
            definitions = []
            for tool in offered:
                if stop.is_set():
                    break
                definitions.append(self._definition(tool))
            return definitions

        try:
            definitions = await asyncio.to_thread(check)
        finally:
            stop.set()
        return tuple(self._tool(t, d) for t, d in zip(offered, definitions, strict=True))

    def _definition(self, remote: mcp_types.Tool) -> ToolDefinition:
        try:
            return ToolDefinition(
                name=self.prefix + remote.name,
                description=remote.description or remote.title or remote.name,
                parameters=dict(remote.input_schema),
            )
        except InvalidInputError as exc:
            raise InvalidInputError(
                f"MCP server {self.name!r}: its tool {remote.name!r} cannot be used: {exc}"
            ) from None

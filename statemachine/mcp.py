"""Tools from MCP servers (the official ``mcp`` SDK; ``pip install 'agent-statemachine[mcp]'``).

An :class:`MCPServer` connects to one Model Context Protocol server, over stdio (the
server is a subprocess this object starts and always reaps) or over streamable HTTP,
for the lifetime of an ``async with`` block, and offers the server's tools as
ordinary :class:`~statemachine.Tool` objects::

    async with MCPServer.stdio("python", ["server.py"], prefix="fs_") as server:
        result = await run_agent(model=model, tools=[*server.tools, *mine], messages=...)

What holds for every MCP tool, as for any other tool of a run:

- **Schemas are checked at connect time.** Each server tool becomes a
  ``ToolDefinition`` with the server's ``inputSchema``; a name or schema the library
  cannot use (not a JSON Schema object, a remote or recursive ``$ref``, a name that
  providers refuse) fails ``__aenter__`` with an ``InvalidInputError`` naming the
  server and the tool, never a mystery mid-run. ``prefix`` is prepended to every name
  so that two servers' tools cannot clash (the server still sees its own names).
- **Arguments are validated** by the engine against that schema before a call is
  sent, like any tool's.
- **Results** map to tool results: text blocks stay text; images stay images; audio,
  resource links and embedded resources become a short text line each (embedded text
  resources keep their text); ``structuredContent`` without any content block becomes
  its JSON; ``isError`` becomes an error result. The text is capped at
  ``max_output_chars`` (default :data:`DEFAULT_MAX_OUTPUT_CHARS`), with a note saying
  how much was cut.
- **Failures are results, never hangs.** A JSON-RPC error from the server, a dropped
  connection or a crashed server answers the call with an error result naming the
  server; every call has a deadline (``call_timeout``, default
  :data:`DEFAULT_CALL_TIMEOUT` seconds; ``None`` for none), after which the run
  records "timed out" (the tool's ``timeout``, enforced by the driver).
- **Abort** cancels the request at once: the SDK sends ``notifications/cancelled`` to
  the server, and the call is answered "Operation aborted" (I6). Connecting has its
  own deadline (``connect_timeout``, default :data:`DEFAULT_CONNECT_TIMEOUT` s).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

from statemachine.agent.tools import Tool
from statemachine.core.abort import AbortSignal
from statemachine.core.messages import ImageContent, TextContent, ToolResultContent
from statemachine.core.tools import ToolDefinition, ToolOutput
from statemachine.errors import InvalidInputError, MCPError

try:
    import mcp
    import mcp.types as mcp_types
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "statemachine.mcp needs the mcp SDK: pip install 'agent-statemachine[mcp]'"
    ) from exc

__all__ = [
    "DEFAULT_CALL_TIMEOUT",
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_MAX_OUTPUT_CHARS",
    "MCPError",
    "MCPServer",
]

DEFAULT_CALL_TIMEOUT = 60.0
"""Seconds one tool call may take before the run answers it "timed out"."""
DEFAULT_CONNECT_TIMEOUT = 30.0
"""Seconds to start (or reach) the server and list its tools."""
DEFAULT_MAX_OUTPUT_CHARS = 1_000_000
"""Characters of text one tool result may hold; the rest is cut, with a note."""


class MCPServer:
    """One MCP server's tools for the lifetime of an ``async with`` block.

    Build it with :meth:`stdio` or :meth:`http`. Inside the block, :attr:`tools` holds
    the server's tools as ``Tool`` objects; leaving the block closes the session and,
    for stdio, stops the subprocess (the SDK terminates its whole process tree).
    """

    def __init__(
        self,
        target: mcp.StdioServerParameters | str,
        *,
        name: str,
        prefix: str = "",
        call_timeout: float | None = DEFAULT_CALL_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
        http_headers: Mapping[str, str] | None = None,
        stderr: TextIO | None = None,
    ) -> None:
        if call_timeout is not None and not call_timeout > 0:
            raise InvalidInputError(f"call_timeout must be positive or None, got {call_timeout!r}")
        if not connect_timeout > 0:
            raise InvalidInputError(f"connect_timeout must be positive, got {connect_timeout!r}")
        if isinstance(max_output_chars, bool) or not (
            isinstance(max_output_chars, int) and max_output_chars > 0
        ):
            raise InvalidInputError(
                f"max_output_chars must be a positive integer, got {max_output_chars!r}"
            )
        self.name = name
        self.prefix = prefix
        self.call_timeout = call_timeout
        self.connect_timeout = connect_timeout
        self.max_output_chars = max_output_chars
        self._target = target
        self._headers = dict(http_headers or {})
        self._stderr = stderr
        self._client: mcp.Client | None = None
        self._tools: tuple[Tool, ...] = ()

    @classmethod
    def stdio(
        cls,
        command: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        **options: Any,
    ) -> MCPServer:
        """A server started as ``command args...``, spoken to over its stdin/stdout.

        The server's stderr goes to this process's stderr, as a subprocess's would;
        pass ``stderr=`` (an open text file) to send it elsewhere.
        """
        params = mcp.StdioServerParameters(
            command=command, args=list(args), env=dict(env) if env else None, cwd=cwd
        )
        name = options.pop("name", None) or " ".join([Path(command).name, *args])[:120]
        return cls(params, name=name, **options)

    @classmethod
    def http(
        cls, url: str, *, headers: Mapping[str, str] | None = None, **options: Any
    ) -> MCPServer:
        """A server reached over streamable HTTP at ``url`` (``headers``: e.g. auth)."""
        return cls(url, name=options.pop("name", url), http_headers=headers, **options)

    @property
    def tools(self) -> tuple[Tool, ...]:
        """The server's tools (empty outside the ``async with`` block)."""
        return self._tools

    async def __aenter__(self) -> MCPServer:
        if self._client is not None:
            raise InvalidInputError(f"MCP server {self.name!r} is already connected")
        # No SDK read timeout: the call deadline is the tool's own (enforced by the driver).
        client = mcp.Client(self._transport())
        try:
            async with asyncio.timeout(self.connect_timeout):
                await client.__aenter__()
        except TimeoutError:
            raise MCPError(
                f"MCP server {self.name!r} did not answer within {self.connect_timeout} s "
                "(connect_timeout)"
            ) from None
        except Exception as exc:
            raise MCPError(f"MCP server {self.name!r} could not be reached: {exc}") from exc
        self._client = client
        try:
            async with asyncio.timeout(self.connect_timeout):
                listed = await self._list_tools(client)
            self._tools = tuple(self._tool(t) for t in listed)
        except BaseException as exc:
            await self._close()
            if isinstance(exc, TimeoutError):
                raise MCPError(
                    f"MCP server {self.name!r} did not list its tools within "
                    f"{self.connect_timeout} s (connect_timeout)"
                ) from None
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._close()

    async def _close(self) -> None:
        client, self._client, self._tools = self._client, None, ()
        if client is not None:
            await client.__aexit__(None, None, None)

    def _transport(self) -> Any:
        if isinstance(self._target, mcp.StdioServerParameters) and self._stderr is not None:
            return mcp.stdio_client(self._target, errlog=self._stderr)
        if isinstance(self._target, str) and self._headers:
            import httpx2
            from mcp.client.streamable_http import streamable_http_client

            http = httpx2.AsyncClient(
                headers=self._headers, timeout=httpx2.Timeout(30.0, read=300.0)
            )
            return streamable_http_client(self._target, http_client=http)
        return self._target

    async def _list_tools(self, client: mcp.Client) -> list[mcp_types.Tool]:
        listed: list[mcp_types.Tool] = []
        cursor: str | None = None
        while True:
            page = await client.list_tools(cursor=cursor)
            listed.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                return listed

    def _tool(self, remote: mcp_types.Tool) -> Tool:
        name = self.prefix + remote.name
        try:
            definition = ToolDefinition(
                name=name,
                description=remote.description or remote.title or remote.name,
                parameters=dict(remote.input_schema),
            )
        except InvalidInputError as exc:
            raise InvalidInputError(
                f"MCP server {self.name!r}: its tool {remote.name!r} cannot be used: {exc}"
            ) from None

        async def execute(arguments: dict[str, Any], signal: AbortSignal) -> ToolOutput:
            return await self._call(remote.name, arguments, signal)

        return Tool(definition, execute, timeout=self.call_timeout)

    async def _call(
        self, remote: str, arguments: dict[str, Any], signal: AbortSignal
    ) -> ToolOutput:
        client = self._client
        if client is None:
            raise MCPError(f"MCP server {self.name!r} is not connected (outside its async with)")
        # The request runs as its own task so that an abort can cancel it at once:
        # cancelling the SDK's request sends notifications/cancelled to the server.
        request = asyncio.ensure_future(client.call_tool(remote, arguments))
        loop = asyncio.get_running_loop()

        def on_abort(_reason: object) -> None:
            # abort() may be called from another thread: cancel on the run's own loop.
            loop.call_soon_threadsafe(request.cancel)

        remove = signal.add_listener(on_abort)
        try:
            result = await request
        except asyncio.CancelledError:
            if signal.aborted and not _current_task_cancelling():
                raise MCPError(
                    f"cancelled on MCP server {self.name!r} (notifications/cancelled sent)"
                ) from None
            request.cancel()
            raise
        except Exception as exc:
            raise MCPError(f"MCP server {self.name!r}, tool {remote!r}: {exc}") from exc
        finally:
            remove()
        return self._output(result)

    def _output(self, result: mcp_types.CallToolResult) -> ToolOutput:
        blocks = [_block(item) for item in result.content]
        if not blocks and result.structured_content is not None:
            blocks.append(TextContent(json.dumps(result.structured_content, ensure_ascii=False)))
        if not blocks:
            blocks.append(TextContent("(no content)"))
        return ToolOutput(_capped(blocks, self.max_output_chars), is_error=bool(result.is_error))


def _current_task_cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _block(item: Any) -> ToolResultContent:
    if isinstance(item, mcp_types.TextContent):
        return TextContent(item.text)
    if isinstance(item, mcp_types.ImageContent):
        return ImageContent(item.data, item.mime_type)
    if isinstance(item, mcp_types.AudioContent):
        return TextContent(f"[audio: {item.mime_type}, {len(item.data)} base64 characters]")
    if isinstance(item, mcp_types.ResourceLink):
        return TextContent(f"[resource link: {item.uri}]")
    if isinstance(item, mcp_types.EmbeddedResource):
        resource = item.resource
        if isinstance(resource, mcp_types.TextResourceContents):
            return TextContent(resource.text)
        return TextContent(f"[resource: {resource.uri}, {resource.mime_type or 'binary'}]")
    return TextContent(f"[{getattr(item, 'type', type(item).__name__)} content]")


def _capped(blocks: Iterable[ToolResultContent], limit: int) -> list[ToolResultContent]:
    """The blocks with their text cut to ``limit`` characters in all, saying so once."""
    out: list[ToolResultContent] = []
    budget, cut = limit, 0
    for block in blocks:
        if not isinstance(block, TextContent):
            out.append(block)
        elif len(block.text) <= budget:
            out.append(block)
            budget -= len(block.text)
        else:
            if budget:
                out.append(TextContent(block.text[:budget]))
            cut += len(block.text) - budget
            budget = 0
    if cut:
        out.append(TextContent(f"[{cut} more characters cut: max_output_chars={limit}]"))
    return out

"""Tools from MCP servers (the official ``mcp`` SDK; ``pip install 'agent-statemachine[mcp]'``).

An :class:`MCPServer` connects to one Model Context Protocol server, over stdio (the
server is a subprocess this object starts and always reaps) or over streamable HTTP,
for the lifetime of an ``async with`` block, and offers the server's tools as
ordinary :class:`~statemachine.Tool` objects (and its resources and prompts)::

    async with MCPServer.stdio("python", ["server.py"], prefix="fs_") as server:
        result = await run_agent(model=model, tools=[*server.tools, *mine], messages=...)

- **Tools are listed and checked at connect time**, within ``connect_timeout``, in a
  worker thread (a server listing thousands never holds the event loop): a tool the
  library cannot use, two tools with one name or more than ``max_tools`` fail
  ``__aenter__`` with an ``InvalidInputError`` naming the server.
- **Results are bounded** (``max_blocks``, ``max_output_chars``, ``max_output_bytes``)
  and images checked (base64, ``image/*``); what is cut is said in a note.
- **Failures are results, never hangs.** A JSON-RPC error, a crashed or killed server
  (stdio or HTTP) answers the call with an error result naming the server, and the run
  goes on; every call has a deadline (``call_timeout``). The SDK's connection lives in
  a task of its own, so nothing its transport does can cancel the caller.
- **Abort** cancels the request at once (the SDK sends ``notifications/cancelled``).

The guide (docs/guides/mcp.md) and docs/limits.md give every default.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, TextIO

from statemachine._log import library_logger
from statemachine._version import DISTRIBUTION, __version__
from statemachine.agent.tools import Tool
from statemachine.core.abort import AbortSignal
from statemachine.core.tools import ToolDefinition, ToolOutput
from statemachine.errors import InvalidInputError, MCPError

try:
    import httpx2
    import mcp
    import mcp.types as mcp_types
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "statemachine.mcp needs the mcp SDK: pip install 'agent-statemachine[mcp]'"
    ) from exc

from statemachine.mcp._asking import (
    DEFAULT_MAX_INPUT_REQUESTS,
    Asking,
    ElicitationHandler,
    Elicitor,
    MCPElicitation,
    MCPProgress,
    MCPSampling,
    MCPSamplingRequest,
    RootsGiven,
    missing_capability,
    root_list,
    url_required,
)
from statemachine.mcp._listing import Listing
from statemachine.mcp._resources import (
    MAX_COMPLETION_CHARS,
    MAX_COMPLETION_VALUES,
    MCPCompletion,
    MCPPrompt,
    MCPResource,
    MCPResourceTemplate,
)
from statemachine.mcp._results import describe, tool_output
from statemachine.mcp._stderr import StderrTail, with_stderr
from statemachine.mcp._stdout import ENCODING, watching
from statemachine.mcp._support import (
    RemoteCall,
    ToolFilter,
    check_bounds,
    current_task_cancelling,
    filters,
    http_transport,
    listen_for_tool_changes,
    may_be_a_reply,
    retrieve,
    roots_changed,
    shown,
)

__all__ = [
    "DEFAULT_CALL_TIMEOUT",
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_MAX_BLOCKS",
    "DEFAULT_MAX_INPUT_REQUESTS",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "DEFAULT_MAX_OUTPUT_BYTES",
    "DEFAULT_MAX_OUTPUT_CHARS",
    "DEFAULT_MAX_TOOLS",
    "MAX_COMPLETION_CHARS",
    "MAX_COMPLETION_VALUES",
    "ElicitationHandler",
    "MCPCompletion",
    "MCPElicitation",
    "MCPError",
    "MCPProgress",
    "MCPPrompt",
    "MCPResource",
    "MCPResourceTemplate",
    "MCPSampling",
    "MCPSamplingRequest",
    "MCPServer",
]

LogLevel = Literal["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"]

DEFAULT_CALL_TIMEOUT = 60.0
"""Seconds one tool call may take before the run answers it "timed out"."""
DEFAULT_CONNECT_TIMEOUT = 30.0
"""Seconds to start (or reach) the server, list its tools and check them."""
DEFAULT_MAX_OUTPUT_CHARS = 1_000_000
"""Characters of text one tool result may hold; the rest is cut, with a note."""
DEFAULT_MAX_OUTPUT_BYTES = 8 * 1024 * 1024
"""Bytes one tool result may hold in all (text in UTF-8, image data as sent)."""
DEFAULT_MAX_BLOCKS = 100
"""Content blocks one tool result may hold; the rest are dropped, with a note."""
DEFAULT_MAX_TOOLS = 10_000
"""Tools one server may list."""
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""Bytes of one message (one line) a stdio server may write on its stdout."""


class MCPServer(Listing):
    """One MCP server's tools for the lifetime of an ``async with`` block.

    Build it with :meth:`stdio` or :meth:`http`. Inside the block, :attr:`tools` holds
    the server's tools as ``Tool`` objects; leaving the block closes the session and,
    for stdio, stops the subprocess (the SDK terminates its whole process tree).
    Enter and leave it in any task: the connection is held by a task of its own.
    """

    _asking: Asking | None = None  # the callbacks of the connection, while connected
    _refusal: str | None = None  # the last HTTP error status the server answered
    _tail: StderrTail | None = None  # a stdio server's stderr, while connected
    _client: mcp.Client | None = None
    _holder: asyncio.Task[None] | None = None
    _listed: asyncio.Future[list[mcp_types.Tool]] | None = None
    _wake: asyncio.Event | None = None  # set: the holder closes the connection
    _stage = "start"
    _unreadable: str | None = None  # what the SDK last could not read
    _lost: str | None = None  # why the connection ended, once it has
    _stale = False  # the server said its tool list changed since it was listed
    _refresher: asyncio.Future[None] | None = None

    def __init__(
        self,
        target: mcp.StdioServerParameters | str,
        *,
        name: str,
        prefix: str = "",
        call_timeout: float | None = DEFAULT_CALL_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        max_blocks: int = DEFAULT_MAX_BLOCKS,
        max_tools: int = DEFAULT_MAX_TOOLS,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        allowed_tools: ToolFilter | None = None,
        blocked_tools: ToolFilter = (),
        http_headers: Mapping[str, str] | None = None,
        http_auth: httpx2.Auth | None = None,
        stderr: TextIO | None = None,
        sampling: MCPSampling | None = None,
        elicitation: Elicitor | None = None,
        max_input_requests: int = DEFAULT_MAX_INPUT_REQUESTS,
        log_level: LogLevel | None = "info",
        roots: RootsGiven | None = None,
    ) -> None:
        check_bounds(
            call_timeout,
            connect_timeout,
            max_output_chars=max_output_chars,
            max_output_bytes=max_output_bytes,
            max_blocks=max_blocks,
            max_tools=max_tools,
            max_message_bytes=max_message_bytes,
            max_input_requests=max_input_requests,
        )
        self.name = name
        self.prefix = prefix
        self.call_timeout = call_timeout
        self.connect_timeout = connect_timeout
        self.max_output_chars = max_output_chars
        self.max_output_bytes = max_output_bytes
        self.max_blocks = max_blocks
        self.max_tools = max_tools
        self.max_message_bytes = max_message_bytes
        self._allowed, self._allowed_names, self._blocked = filters(allowed_tools, blocked_tools)
        self._target = target
        self._headers = dict(http_headers or {})
        self._auth = http_auth
        self.sampling = sampling
        if isinstance(elicitation, str) and elicitation != "run":
            raise InvalidInputError(f'elicitation is a handler or "run", not {elicitation!r}')
        self.elicitation = elicitation
        self.max_input_requests = max_input_requests
        self.log_level = log_level
        self.roots = None if roots is None else tuple(roots)
        root_list(self.roots or ())  # a root that is not a path or file:// URI: refused now
        self._stderr = stderr
        self._watchers = set()
        self._log = library_logger("statemachine.mcp")
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
        pass ``stderr=`` (a text file, or any object with ``write``) to send it
        elsewhere. If the server cannot be reached or does not answer, the
        ``MCPError`` also quotes the end of its stderr (``MAX_STDERR_CHARS``).
        """
        params = mcp.StdioServerParameters(
            command=command, args=list(args), env=dict(env) if env else None, cwd=cwd
        )
        name = options.pop("name", None) or " ".join([Path(command).name, *args])[:120]
        return cls(params, name=name, **options)

    @classmethod
    def http(
        cls,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        auth: httpx2.Auth | None = None,
        **options: Any,
    ) -> MCPServer:
        """A server reached over streamable HTTP at ``url``.

        ``headers`` go with every request (e.g. ``Authorization``); ``auth`` is an
        ``httpx2.Auth`` the HTTP client runs on every request: the SDK's
        ``mcp.client.auth.OAuthClientProvider`` for OAuth 2.1 (it discovers the
        server's authorization server, registers, refreshes tokens), or your own.
        Its default name, which errors quote, is the URL without its query and any
        user and password in it."""
        name = options.pop("name", None) or shown(url)
        return cls(url, name=name, http_headers=headers, http_auth=auth, **options)

    @property
    def tools(self) -> tuple[Tool, ...]:
        """The server's tools (empty outside the ``async with`` block)."""
        return self._tools

    # -- connecting ---------------------------------------------------------------------

    async def __aenter__(self) -> MCPServer:
        if self._holder is not None:
            raise InvalidInputError(f"MCP server {self.name!r} is already connected")
        loop = asyncio.get_running_loop()
        listed: asyncio.Future[list[mcp_types.Tool]] = loop.create_future()
        # Told why the connection failed even after __aenter__ stopped waiting for it.
        listed.add_done_callback(retrieve)
        self._listed = listed
        self._wake = asyncio.Event()
        self._stage, self._unreadable, self._lost, self._stale = "start", None, None, False
        self._holder = asyncio.create_task(self._hold(listed), name=f"MCP server {self.name}")
        try:
            async with asyncio.timeout(self.connect_timeout):
                remote = await asyncio.shield(listed)
                self._stage = "check"
                tools = await self._checked(remote)
        except BaseException as exc:
            await self._close()
            if isinstance(exc, TimeoutError):
                raise MCPError(self._late()) from None
            raise
        self._tools = tools
        self._stage = "ready"
        if self._stale:  # the list changed while it was being checked
            self._on_tools_changed()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._close()

    def _late(self) -> str:
        limit = f"within {self.connect_timeout} s (connect_timeout)"
        if self._stage == "start":
            return with_stderr(f"MCP server {self.name!r} did not answer {limit}", self._tail)
        if self._stage == "list":
            cause = f": {self._unreadable}" if self._unreadable else ""
            return f"MCP server {self.name!r} did not list its tools {limit}{cause}"
        return f"the tools of MCP server {self.name!r} could not be checked {limit}"

    async def _hold(self, listed: asyncio.Future[list[mcp_types.Tool]]) -> None:
        """Open the connection, list the tools, and keep the connection until told.

        The SDK's transports run in anyio task groups that cancel the task that
        entered them when the connection fails (an HTTP server killed mid-call, say):
        holding the connection here keeps that from ever reaching the caller.
        """
        try:
            asking = self._asking = Asking(
                self.name,
                self.sampling,
                self.elicitation,
                self.max_input_requests,
                self.max_output_bytes,
                self.roots,
            )
            # A stdio server's stdout that cannot be read on ends the connection.
            with watching(self._stdout_broken, self.max_message_bytes):
                await self._connected(asking, listed)
        except asyncio.CancelledError:
            if asyncio.current_task().cancelling():  # type: ignore[union-attr]
                raise  # closed by _close (or the loop is going away)
            # the SDK's cancel scope: the transport failed and took the session down
            self._lost = self._lost or "the connection was closed"
            await self._failed_to_connect(listed, ConnectionError(self._lost))
        except BaseException as exc:  # noqa: BLE001 - what the SDK raised is reported
            self._lost = self._lost or describe(exc)
            await self._failed_to_connect(listed, exc)
        finally:
            self._client = None
            if self._tail is not None:
                self._tail.close()
            if not listed.done():  # closed before the tools were listed
                listed.cancel()

    async def _connected(
        self, asking: Asking, listed: asyncio.Future[list[mcp_types.Tool]]
    ) -> None:
        """Connect, list the tools into ``listed``, and hold the connection until told."""
        client = mcp.Client(
            self._transport(),
            client_info=mcp_types.Implementation(name=DISTRIBUTION, version=__version__),
            message_handler=self._on_message,
            sampling_callback=asking.on_sampling if self.sampling else None,
            elicitation_callback=asking.on_elicitation if self.elicitation else None,
            list_roots_callback=asking.on_list_roots if self.roots is not None else None,
            logging_callback=asking.on_log,
            log_level=self.log_level,
        )
        async with client:
            self._stage = "list"
            try:
                tools = await self._list_tools(client)
            except Exception as exc:  # noqa: BLE001 - reported to __aenter__
                if not listed.done():
                    listed.set_exception(self._unreachable(exc))
                self._stage = "failed"  # the connection closes by itself
                return
            self._client = client
            listed.set_result(tools)
            await self._until_closed(client)

    async def _until_closed(self, client: mcp.Client) -> None:
        """Keep the connection until told, listening for changes of the tool list."""
        assert self._wake is not None
        listener = asyncio.ensure_future(
            listen_for_tool_changes(client, self._tools_changed, self._log, self.name)
        )
        try:
            await self._wake.wait()
        finally:
            listener.cancel()
            await asyncio.wait((listener,))

    async def _failed_to_connect(
        self, listed: asyncio.Future[list[mcp_types.Tool]], exc: BaseException
    ) -> None:
        """Tell ``__aenter__`` why, once a stdio server's stderr has ended (it may say)."""
        if listed.done():
            return
        if self._tail is not None and isinstance(exc, Exception):
            await self._tail.ended()
        if not listed.done():
            listed.set_exception(self._unreachable(exc))

    def _unreachable(self, exc: BaseException) -> BaseException:
        if isinstance(exc, MCPError | InvalidInputError):
            return exc
        if self._stage == "list":
            cause = self._unreadable or describe(exc)
            message = f"MCP server {self.name!r} could not list its tools: {cause}"
        else:
            message = f"MCP server {self.name!r} could not be reached: {describe(exc)}"
        if self._refusal is not None:
            message += f" (it answered {self._refusal})"
        return MCPError(with_stderr(message, self._tail))

    async def _on_message(self, message: Any) -> None:
        """The SDK's notifications and the transport's faults (never raises)."""
        if isinstance(message, mcp_types.ToolListChangedNotification):
            self._tools_changed()
        if isinstance(message, mcp_types.ResourceUpdatedNotification):
            for updates in self._watchers:
                updates.changed(message.params.uri)
        if isinstance(message, Exception):
            self._unreadable = f"it sent a message the SDK could not read ({describe(message)})"
            listed = self._listed
            listing = self._stage == "list" and listed is not None and not listed.done()
            if listed is not None and listing and may_be_a_reply(message):
                # Most likely the tools/list reply itself, which the SDK then drops.
                listed.set_exception(
                    MCPError(
                        f"MCP server {self.name!r} could not list its tools: {self._unreadable}"
                    )
                )

    def _stdout_broken(self, reason: str) -> None:
        """A stdio server's stdout ended or cannot be read on (the SDK's reader stops): the
        connection ends now, and every call waiting on it is answered why."""
        if self._holder is None:
            return  # closing: the server was stopped by this client
        self._lost = self._lost or reason
        listed = self._listed
        if listed is not None and not listed.done():
            doing = "list its tools" if self._stage == "list" else "be reached"
            message = f"MCP server {self.name!r} could not {doing}: {reason}"
            listed.set_exception(MCPError(with_stderr(message, self._tail)))
        if self._wake is not None:
            self._wake.set()

    def _tools_changed(self) -> None:
        self._stale = True
        if self._stage == "ready":
            self._on_tools_changed()

    def _on_tools_changed(self) -> None:
        if self._refresher is None or self._refresher.done():
            self._refresher = asyncio.ensure_future(self._refresh_while_stale())

    async def _refresh_while_stale(self) -> None:
        """Refresh until the list has not changed since (never raises: logs)."""
        while self._stale and self._client is not None:
            self._stale = False
            try:
                await self.refresh()
            except Exception as exc:  # noqa: BLE001 - a background refresh is logged
                self._log.warning("mcp_refresh_failed", server=self.name, error=describe(exc))

    async def _close(self) -> None:
        holder, self._holder, self._tools = self._holder, None, ()
        refresher, self._refresher = self._refresher, None
        if refresher is not None and not refresher.done():
            refresher.cancel()
            await asyncio.wait((refresher,))
        if holder is None:
            return
        if self._wake is not None:
            self._wake.set()
        if self._stage in ("start", "list"):
            holder.cancel()  # still connecting or listing: nothing to close cleanly
        try:
            await holder
        except asyncio.CancelledError:
            if asyncio.current_task().cancelling():  # type: ignore[union-attr]
                raise
        except BaseException:  # noqa: BLE001 - the holder reports through _lost
            pass

    def _transport(self) -> Any:
        self._tail = None
        if isinstance(self._target, mcp.StdioServerParameters):
            self._tail = StderrTail(self._stderr)
            params = self._target.model_copy(update={"encoding": ENCODING})
            return mcp.stdio_client(params, errlog=self._tail.errlog)
        self._refusal = None

        def refused(status: str) -> None:
            self._refusal = status

        return http_transport(str(self._target), self._headers, self._auth, refused)

    def _tool(self, remote: mcp_types.Tool, definition: ToolDefinition) -> Tool:
        return Tool(definition, RemoteCall(self, remote.name), timeout=self.call_timeout)

    async def refresh(self) -> tuple[Tool, ...]:
        """List the server's tools again, checked as when connecting (within
        ``connect_timeout``), and make them :attr:`tools`: for the runs started after
        (a run keeps the tools it started with). It runs by itself when the server
        says its tool list changed (``notifications/tools/list_changed``, or, from a
        server of the 2026-07-28 protocol, on the ``subscriptions/listen`` stream this
        client keeps open; a failure then is logged, and ``tools`` stays as it was)."""
        client = self._client
        if client is None:
            raise MCPError(f"MCP server {self.name!r} is not connected (outside its async with)")
        try:
            async with asyncio.timeout(self.connect_timeout):
                remote = await self._list_tools(client, cache_mode="refresh")
                tools = await self._checked(remote)
        except TimeoutError:
            raise MCPError(
                f"MCP server {self.name!r} did not list and check its tools within "
                f"{self.connect_timeout} s (connect_timeout)"
            ) from None
        self._tools = tools
        return tools

    # -- calling ------------------------------------------------------------------------

    async def _call(
        self, remote: str, arguments: dict[str, Any], signal: AbortSignal
    ) -> ToolOutput:
        client, holder = self._client, self._holder
        if client is None or holder is None or holder.done() or self._lost is not None:
            if self._lost is not None:
                raise MCPError(f"MCP server {self.name!r} is no longer connected: {self._lost}")
            raise MCPError(f"MCP server {self.name!r} is not connected (outside its async with)")
        # The request runs as its own task so that an abort can cancel it at once:
        # cancelling the SDK's request sends notifications/cancelled to the server.
        asking = self._asking
        assert asking is not None
        key = object()
        progress = asking.call_started(key, signal)
        request = asyncio.ensure_future(
            client.call_tool(remote, arguments, progress_callback=progress)
        )
        loop = asyncio.get_running_loop()

        def on_abort(_reason: object) -> None:
            if asking.asks_the_run(key):
                # Its question is answered "cancel", which the server is let hear and
                # answer: the driver cancels the call after its grace period if not.
                return
            # abort() may be called from another thread: cancel on the run's own loop.
            loop.call_soon_threadsafe(request.cancel)

        remove = signal.add_listener(on_abort)
        try:
            # The connection's end answers the call too, whatever the transport does
            # with the request it was waiting on.
            await asyncio.wait((request, holder), return_when=asyncio.FIRST_COMPLETED)
            if not request.done():
                request.cancel()
                request.add_done_callback(retrieve)  # whatever it ends with, nobody waits
                raise MCPError(
                    f"MCP server {self.name!r}, tool {remote!r}: the connection ended "
                    f"({self._lost or 'closed'})"
                )
            result = request.result()
        except asyncio.CancelledError:
            request.cancel()
            if signal.aborted and not current_task_cancelling():
                raise MCPError(
                    f"cancelled on MCP server {self.name!r} (notifications/cancelled sent)"
                ) from None
            raise
        except MCPError:
            raise
        except Exception as exc:
            raise await self._call_failed(remote, exc, asking) from exc
        finally:
            remove()
            asking.call_ended(key)
        return self._output(result)

    async def _call_failed(self, remote: str, exc: Exception, asking: Asking) -> MCPError:
        """The error of a call the server or the connection failed."""
        failed = f"MCP server {self.name!r}, tool {remote!r}"
        urls = url_required(exc)
        if urls is not None:
            await asking.tell_urls(urls)
            said = "; ".join(f"{q.message} {q.url}".strip() for q in urls) or "(no URL given)"
            return MCPError(
                f"{failed}: the user must first open a URL (URL-mode elicitation, error "
                f"-32042 URL_ELICITATION_REQUIRED): {said}; call the tool again once they have"
            )
        if self._lost is not None:  # the request failed because the connection ended
            return MCPError(f"{failed}: the connection ended ({self._lost})")
        return MCPError(f"{failed}: {describe(exc)}" + missing_capability(exc))

    async def set_roots(self, roots: RootsGiven) -> None:
        """Give the server other roots (``roots=`` when connecting): a server of an
        older protocol is told ``notifications/roots/list_changed`` and asks again; one
        of the 2026-07-28 protocol asks for them with each request that needs them."""
        made = root_list(roots)
        self.roots = tuple(roots)
        if self._asking is not None:
            self._asking.roots = made
        client = self._client
        if client is not None and client.protocol_version < "2026-07-28":
            await roots_changed(client)

    def _output(self, result: mcp_types.CallToolResult) -> ToolOutput:
        return tool_output(result, *self._limits())

"""Small pieces of the MCP client: URLs shown in errors, tool filters, task helpers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import urlsplit, urlunsplit

import httpx2
import mcp
import mcp.types as mcp_types
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import ListenNotSupportedError, SubscriptionLost

from statemachine.core.abort import AbortSignal
from statemachine.core.tools import ToolOutput
from statemachine.errors import InvalidInputError

if TYPE_CHECKING:
    from statemachine.mcp import MCPServer

ToolFilter = Collection[str] | Callable[[str], bool]
"""Which server tools to offer: their names (as the server spells them), or a
predicate on the name."""


def check_bounds(call_timeout: float | None, connect_timeout: float, **counts: int) -> None:
    """``MCPServer``'s timeouts and counts, checked (``InvalidInputError`` naming one)."""
    if call_timeout is not None and not call_timeout > 0:
        raise InvalidInputError(f"call_timeout must be positive or None, got {call_timeout!r}")
    if not connect_timeout > 0:
        raise InvalidInputError(f"connect_timeout must be positive, got {connect_timeout!r}")
    for option, value in counts.items():
        if isinstance(value, bool) or not (isinstance(value, int) and value > 0):
            raise InvalidInputError(f"{option} must be a positive integer, got {value!r}")


def shown(url: str) -> str:
    """``url`` without what may be a secret: user and password, query, fragment."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(an MCP server URL that could not be read)"
    host = f"[{host}]" if ":" in host else host
    return urlunsplit((parts.scheme, host + port, parts.path, "", ""))


def predicate(tools: ToolFilter | None, option: str) -> Callable[[str], bool]:
    if tools is None:
        return lambda _name: True
    if callable(tools):
        return tools
    if isinstance(tools, str) or not all(isinstance(n, str) for n in tools):
        raise InvalidInputError(f"{option} must be tool names or a predicate on a name")
    names = frozenset(tools)
    return names.__contains__


def filters(
    allowed: ToolFilter | None, blocked: ToolFilter
) -> tuple[Callable[[str], bool], frozenset[str], Callable[[str], bool]]:
    """Whether a tool is allowed, the names that must be listed, whether it is blocked."""
    names = frozenset(allowed) if allowed is not None and not callable(allowed) else frozenset()
    return predicate(allowed, "allowed_tools"), names, predicate(blocked, "blocked_tools")


@contextlib.asynccontextmanager
async def http_transport(
    url: str,
    headers: Mapping[str, str],
    auth: httpx2.Auth | None,
    refused: Callable[[str], None],
) -> AsyncIterator[Any]:
    """The SDK's streamable HTTP transport on an HTTP client of ours, closed with it
    (the SDK's timeouts: 30 s, 300 s to read a stream), which tells ``refused`` the
    status of a request the server refuses: the SDK's own error says only "Server
    returned an error response", not 401."""

    async def seen(response: httpx2.Response) -> None:
        if response.status_code >= 400:
            refused(f"HTTP {response.status_code} {response.reason_phrase}")

    async with (
        httpx2.AsyncClient(
            headers=dict(headers),
            auth=auth,
            timeout=httpx2.Timeout(30.0, read=300.0),
            event_hooks={"response": [seen]},
        ) as http,
        streamable_http_client(url, http_client=http) as streams,
    ):
        yield streams


LISTEN_AGAIN_SECONDS = 1.0
"""After a ``subscriptions/listen`` stream fails or drops: the wait before the next."""


async def listen_for_tool_changes(
    client: mcp.Client, changed: Callable[[], None], log: Any, server: str
) -> None:
    """Call ``changed`` whenever a server of the 2026-07-28 protocol says its tool list
    changed, on a ``subscriptions/listen`` stream, until cancelled (never raises). A
    stream that drops once open is opened again a second later, and ``changed`` called
    then (the stream has no replay); an older server (``notifications/tools/list_changed``
    tells instead), one that refuses the stream or closes it ends the listening."""
    while True:
        try:
            async with client.listen(tools_list_changed=True) as changes:
                async for _change in changes:
                    changed()
            return
        except ListenNotSupportedError:
            return
        except SubscriptionLost as exc:
            log.debug("mcp_listen_lost", server=server, error=str(exc)[:300])
        except Exception as exc:  # noqa: BLE001 - listening is best effort: logged
            error = f"{type(exc).__name__}: {exc}"[:300]
            log.debug("mcp_listen_failed", server=server, error=error)
            return
        await asyncio.sleep(LISTEN_AGAIN_SECONDS)
        changed()


def may_be_a_reply(exc: Exception) -> bool:
    """Whether a message the SDK could not read may be the reply to a request of ours
    (which the SDK then drops: the request would wait out its deadline), rather than a
    stray line a server printed on its stdout, which the SDK skips. A reply is a JSON
    object with an ``id``: a line that does not even start as an object, or an object
    without an ``id``, is stray. pydantic's ``errors()`` holds what was read."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return True
    try:
        read = errors()[0].get("input")
    except Exception:  # noqa: BLE001 - any other errors() says nothing of the input
        return True
    if isinstance(read, str):
        return read.lstrip().startswith("{")
    if isinstance(read, Mapping):
        return "id" in read
    return True


def subscription(uri: str, *, on: bool) -> Callable[[mcp.Client], Awaitable[Any]]:
    """``resources/subscribe`` (``on``) or ``resources/unsubscribe`` of ``uri``, for a
    server of a protocol before 2026-07-28, sent as the request it is: the SDK's own
    methods for it warn (of the newer protocol), and the library prints nothing."""
    params = mcp_types.SubscribeRequestParams(uri=uri)
    request: mcp_types.SubscribeRequest | mcp_types.UnsubscribeRequest = (
        mcp_types.SubscribeRequest(params=params)
        if on
        else mcp_types.UnsubscribeRequest(params=mcp_types.UnsubscribeRequestParams(uri=uri))
    )
    return lambda client: client.session.send_request(request, mcp_types.EmptyResult)


async def roots_changed(client: mcp.Client) -> None:
    """``notifications/roots/list_changed``, for a server of a protocol before
    2026-07-28, sent as the notification it is (the SDK's method for it warns)."""
    await client.session.send_notification(mcp_types.RootsListChangedNotification())


def retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


def current_task_cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class RemoteCall:
    """A tool's ``execute``: the call of one tool on its server."""

    # For the OpenTelemetry spans (statemachine.otel): a tool the agent runs by
    # calling an external service is an "extension" in the GenAI conventions.
    otel_attributes: ClassVar[Mapping[str, str]] = {"gen_ai.tool.type": "extension"}

    def __init__(self, server: MCPServer, remote: str) -> None:
        self._server = server
        self._remote = remote

    async def __call__(self, arguments: dict[str, Any], signal: AbortSignal) -> ToolOutput:
        return await self._server._call(self._remote, arguments, signal)

"""A run you watch live: an agent served over HTTP, its runs streamed as AG-UI events.

``LiveApp(agent)`` is an ASGI application (``statemachine.live._app``): an AG-UI
``RunAgentInput`` posted to ``/`` starts a run and is answered with the run's events
as server-sent events (``statemachine.live._agui`` maps them); ``/runs/ID/events``
watches a run; ``/`` shows it on a page, on the state diagram. ``serve`` runs the app
on uvicorn until stopped; ``running`` runs it inside an ``async with`` (tests, notebooks).

Shut by default: 127.0.0.1 unless told otherwise, never another address without an
access token of your own, the token on every request, no other origin, bounded bodies,
runs and watchers (``LiveApp``). Needs the ``[live]`` extra (``ag-ui-protocol``,
``uvicorn``).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Callable
from typing import Final

import uvicorn

from statemachine.errors import InvalidInputError
from statemachine.live._agui import CUSTOM_PREFIX, AguiStream
from statemachine.live._app import (
    DEFAULT_BODY_SECONDS,
    DEFAULT_KEEPALIVE_SECONDS,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_BUFFERED,
    DEFAULT_MAX_RUNS,
    DEFAULT_MAX_WATCHERS,
    MIN_TOKEN_LENGTH,
    LiveApp,
    is_loopback,
)

__all__ = [
    "CUSTOM_PREFIX",
    "DEFAULT_BODY_SECONDS",
    "DEFAULT_HOST",
    "DEFAULT_KEEPALIVE_SECONDS",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_BUFFERED",
    "DEFAULT_MAX_RUNS",
    "DEFAULT_MAX_WATCHERS",
    "DEFAULT_PORT",
    "MIN_TOKEN_LENGTH",
    "AguiStream",
    "LiveApp",
    "running",
    "serve",
]

DEFAULT_HOST: Final = "127.0.0.1"
"""Where the live server listens unless told otherwise: this machine only."""

DEFAULT_PORT: Final = 8765
"""The port ``serve`` listens on unless told otherwise."""


def _bind(app: LiveApp, host: str, port: int) -> socket.socket:
    """A listening socket on ``host``:``port``, once the address is allowed for ``app``."""
    if not is_loopback(host):
        if not app.token_given:
            raise InvalidInputError(
                f"the live server listens on {host!r}, which other machines reach, only "
                "with an access token you chose (LiveApp(token=...); the CLI reads "
                "STATEMACHINE_LIVE_TOKEN)"
            )
        app.hosts.add(host.strip("[]").lower())
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
        sock.listen(128)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def _server(app: LiveApp) -> uvicorn.Server:
    config = uvicorn.Config(
        app,
        log_config=None,  # the library configures no logging
        access_log=False,  # an access log would record the address that carries the token
        proxy_headers=False,
        server_header=False,
        lifespan="on",
        timeout_graceful_shutdown=5,
        # Connections at once: the event streams, and room for the other requests.
        limit_concurrency=app.max_watchers + 64,
    )
    return uvicorn.Server(config)


async def _serve(app: LiveApp, server: uvicorn.Server, sock: socket.socket) -> None:
    """Serve until told to stop; then abort the runs first, so that their event
    streams end and the server does not wait out its graceful period for them."""
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    try:
        while not task.done() and not server.should_exit:
            await asyncio.wait({task}, timeout=0.1)  # uvicorn says "stop" with a flag
        await app.close()
    finally:
        server.should_exit = True
        await task


@contextlib.asynccontextmanager
async def running(app: LiveApp, host: str = DEFAULT_HOST, port: int = 0) -> AsyncIterator[str]:
    """Serve ``app`` on uvicorn in this event loop while the block runs; yields the
    address (``http://127.0.0.1:PORT``; ``port=0`` takes a free one). On leaving, the
    runs still running are aborted and the server stops."""
    sock = _bind(app, host, port)
    server = _server(app)
    task = asyncio.ensure_future(_serve(app, server, sock))
    try:
        while not server.started:
            if task.done():
                task.result()  # it failed to start: say why
            await asyncio.wait({task}, timeout=0.01)
        yield _address(sock)
    finally:
        server.should_exit = True
        await task
        sock.close()


def serve(
    app: LiveApp,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    *,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve ``app`` on uvicorn until interrupted (Ctrl-C): the runs still running are
    aborted on the way out. Refuses an address other machines reach unless the app
    was given its own token. ``on_ready`` is told the address once it listens."""
    sock = _bind(app, host, port)
    try:
        if on_ready is not None:
            on_ready(_address(sock))
        asyncio.run(_serve(app, _server(app), sock))
    finally:
        sock.close()


def _address(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

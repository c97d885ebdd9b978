"""What the live server reads of a request and how it answers: the ASGI messages,
by hand (``statemachine.live._app`` says why there is no framework)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final
from urllib.parse import parse_qs

__all__ = [
    "PAGE_HEADERS",
    "STREAM_HEADERS",
    "Receive",
    "Scope",
    "Send",
    "disconnected",
    "headers_of",
    "query",
    "respond",
    "send_body",
    "send_json",
]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

PAGE_HEADERS: Final = [
    (b"content-type", b"text/html; charset=utf-8"),
    (b"cache-control", b"no-store"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-content-type-options", b"nosniff"),
]
STREAM_HEADERS: Final = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-store"),
    (b"x-accel-buffering", b"no"),  # proxies: pass each event on as it comes
    (b"x-content-type-options", b"nosniff"),
]


def headers_of(scope: Scope) -> dict[str, str]:
    """The request's headers, lower-cased names; a repeated one keeps its first value."""
    out: dict[str, str] = {}
    for raw_name, raw_value in scope.get("headers", ()):
        name = raw_name.decode("latin-1").lower()
        out.setdefault(name, raw_value.decode("latin-1"))
    return out


def query(scope: Scope) -> dict[str, str]:
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"), max_num_fields=20)
    return {key: values[0] for key, values in query.items()}


async def respond(
    send: Send, status: int, body: bytes | None, headers: list[tuple[bytes, bytes]]
) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    if body is not None:
        await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_body(send: Send, body: bytes) -> None:
    await send({"type": "http.response.body", "body": body, "more_body": True})


async def send_json(send: Send, status: int, data: Any) -> None:
    body = json.dumps(data).encode("utf-8")
    headers = [(b"content-type", b"application/json"), (b"cache-control", b"no-store")]
    await respond(send, status, body, headers)


async def disconnected(receive: Receive) -> None:
    """Return once the client has gone."""
    while (await receive())["type"] != "http.disconnect":
        pass

"""A hand-written MCP server over stdio (JSON-RPC lines) whose stdout misbehaves.

python noisy.py MODE

It lists two tools, ``echo`` (answers its ``text``) and ``mangle``, and answers
``ping``; what goes wrong is set by MODE:

bytes-at-start      bytes that are not UTF-8 before the reply to ``initialize``
bytes-on-call       ``mangle`` is answered with bytes that are not UTF-8 in its text
stray-at-start      a line that is not JSON before the reply to ``initialize``
stray-on-list       a line that is not JSON before the reply to ``tools/list``
stray-on-call       a line that is not JSON before the reply to ``mangle``
stray-json-on-list  a JSON log line (an object without ``id``) before ``tools/list``'s reply
long-line-on-call   ``mangle`` is answered with one line of MCP_TEST_BYTES bytes
url-required        ``mangle`` is answered with error -32042: a URL to open first
roots               (not misbehaving) a server of the 2025 protocols: ``mangle`` asks
                    the client ``roots/list`` and answers with the roots, and how many
                    ``notifications/roots/list_changed`` it has heard
resources           (not misbehaving) a server of the 2025 protocols whose resources
                    may be subscribed to: ``resources/subscribe`` is answered, then
                    that URI is said updated twice and ``test://other`` once
resources-then-exit like resources, but the server exits once it is subscribed to
elicit              (not misbehaving) a server of the 2025 protocols: ``mangle`` sends
                    ``elicitation/create`` with its arguments' ``message`` and
                    ``schema`` and answers with the client's reply, as JSON
completions-flood   ``completion/complete`` is answered with 502 values (the protocol
                    allows 100), two of them 5,000 characters long

The server goes on answering after it misbehaves, so a client that waits for it
to exit waits for nothing.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

MODE = sys.argv[1]
OUT = sys.stdout.buffer


def _send(message: dict[str, Any]) -> None:
    OUT.write(json.dumps(message).encode() + b"\n")
    OUT.flush()


def _raw(data: bytes) -> None:
    OUT.write(data)
    OUT.flush()


def _tools() -> list[dict[str, Any]]:
    text = {"type": "object", "properties": {"text": {"type": "string"}}}
    return [
        {"name": "echo", "description": "Echo.", "inputSchema": text},
        {"name": "mangle", "description": "Misbehave.", "inputSchema": {"type": "object"}},
    ]


def _result(rid: Any, result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "result": result}


def _text(rid: Any, text: str) -> dict[str, Any]:
    return _result(rid, {"content": [{"type": "text", "text": text}]})


_waiting: dict[str, Any] = {}  # the id of a roots/list request: the call it answers
_heard = {"notifications/roots/list_changed": 0}


def _call(rid: Any, params: dict[str, Any]) -> None:
    if MODE == "roots" and params["name"] == "mangle":
        asked = f"roots-{rid}"
        _waiting[asked] = rid
        _send({"jsonrpc": "2.0", "id": asked, "method": "roots/list"})
        return
    if MODE == "elicit" and params["name"] == "mangle":
        asked = f"elicit-{rid}"
        _waiting[asked] = rid
        arguments = params.get("arguments", {})
        question = {
            "message": arguments.get("message", "?"),
            "requestedSchema": arguments["schema"],
        }
        _send({"jsonrpc": "2.0", "id": asked, "method": "elicitation/create", "params": question})
        return
    if params["name"] == "echo":
        _send(_text(rid, str(params.get("arguments", {}).get("text", ""))))
        return
    if MODE == "bytes-on-call":
        reply = json.dumps(_text(rid, "PLACEHOLDER")).encode()
        _raw(reply.replace(b"PLACEHOLDER", b"caf\xe9 \xff\xfe") + b"\n")
    elif MODE == "url-required":
        needed = {
            "mode": "url",
            "message": "Sign in first",
            "url": "https://auth.example/start?x=1",
        }
        error = {"code": -32042, "message": "URL elicitation required"}
        _send({"jsonrpc": "2.0", "id": rid, "error": {**error, "data": {"elicitations": [needed]}}})
    elif MODE == "long-line-on-call":
        size = int(os.environ["MCP_TEST_BYTES"])
        reply = json.dumps(_text(rid, "PLACEHOLDER")).encode()
        _raw(reply.replace(b"PLACEHOLDER", b"y" * size) + b"\n")
    else:
        if MODE == "stray-on-call":
            _raw(b"this line is not JSON\n")
        _send(_text(rid, "mangled"))


def _answer(request: dict[str, Any]) -> None:
    method, rid = request.get("method"), request.get("id")
    if method is None and str(rid).startswith("elicit-") and rid in _waiting:
        reply = request.get("result", request.get("error"))
        _send(_text(_waiting.pop(rid), json.dumps(reply, sort_keys=True)))
        return
    if method is None and rid in _waiting:  # the client's answer to roots/list
        roots = " ".join(r["uri"] for r in request["result"]["roots"])
        heard = _heard["notifications/roots/list_changed"]
        _send(_text(_waiting.pop(rid), f"{roots} (list_changed heard {heard} times)"))
        return
    if rid is None:
        if method in _heard:
            _heard[method] += 1
        return  # a notification
    if method == "initialize":
        if MODE == "bytes-at-start":
            _raw(b"\xff\xfe\xfd not UTF-8\n")
        if MODE == "stray-at-start":
            _raw(b"this line is not JSON\n")
        _send(
            _result(
                rid,
                {
                    "protocolVersion": request["params"]["protocolVersion"],
                    "capabilities": {
                        "tools": {},
                        "resources": {"subscribe": True},
                        "completions": {},
                    },
                    "serverInfo": {"name": "noisy", "version": "1"},
                },
            )
        )
    elif method == "tools/list":
        if MODE == "stray-on-list":
            _raw(b"this line is not JSON\n")
        if MODE == "stray-json-on-list":
            _raw(b'{"level": "info", "msg": "listing"}\n')
        _send(_result(rid, {"tools": _tools()}))
    elif method == "tools/call":
        _call(rid, request["params"])
    elif method == "completion/complete" and MODE == "completions-flood":
        values = ["y" * 5_000, *(f"v{i}" for i in range(500)), "x" * 5_000]
        completion = {"values": values, "total": len(values), "hasMore": False}
        _send(_result(rid, {"completion": completion}))
    elif method == "ping":
        _send(_result(rid, {}))
    elif method == "resources/subscribe" and MODE == "resources-then-exit":
        _send(_result(rid, {}))
        sys.exit(0)
    elif method in ("resources/subscribe", "resources/unsubscribe") and MODE == "resources":
        _send(_result(rid, {}))
        if method == "resources/subscribe":
            for uri in (request["params"]["uri"], "test://other", request["params"]["uri"]):
                updated = {"method": "notifications/resources/updated", "params": {"uri": uri}}
                _send({"jsonrpc": "2.0", **updated})
    else:
        error = {"code": -32601, "message": f"method not found: {method}"}
        _send({"jsonrpc": "2.0", "id": rid, "error": error})


def main() -> None:
    for line in sys.stdin:
        _answer(json.loads(line))


if __name__ == "__main__":
    main()

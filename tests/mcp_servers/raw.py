"""A hand-written MCP server over stdio (JSON-RPC lines), for replies the SDK's server
API will not produce.

python raw.py DEPTH     list one tool whose input schema nests DEPTH levels deep
"""

from __future__ import annotations

import json
import sys
from typing import Any


def _deep(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


def _answer(request: dict[str, Any], depth: int) -> dict[str, Any] | None:
    method, rid = request.get("method"), request.get("id")
    if rid is None:
        return None  # a notification
    if method == "initialize":
        result: dict[str, Any] = {
            "protocolVersion": request["params"]["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "raw", "version": "1"},
        }
    elif method == "tools/list":
        tool = {"name": "deep", "description": "Deep.", "inputSchema": _deep(depth)}
        result = {"tools": [tool]}
    elif method == "ping":
        result = {}
    else:
        error = {"code": -32601, "message": f"method not found: {method}"}
        return {"jsonrpc": "2.0", "id": rid, "error": error}
    return {"jsonrpc": "2.0", "id": rid, "result": result}


def main() -> None:
    depth = int(sys.argv[1])
    sys.setrecursionlimit(10_000)
    for line in sys.stdin:
        answer = _answer(json.loads(line), depth)
        if answer is not None:
            sys.stdout.write(json.dumps(answer) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()

"""A hand-written MCP server over stdio (JSON-RPC lines), for replies the SDK's server
API will not produce.

python raw.py DEPTH     list one tool whose input schema nests DEPTH levels deep
python raw.py changing  list one tool, then say the list changed and list two
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


_listed = 0


def _tools(depth: int) -> list[dict[str, Any]]:
    global _listed
    _listed += 1
    if depth:
        return [{"name": "deep", "description": "Deep.", "inputSchema": _deep(depth)}]
    names = ["first"] if _listed == 1 else ["first", "second"]
    return [{"name": n, "description": n.title(), "inputSchema": {"type": "object"}} for n in names]


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
        result = {"tools": _tools(depth)}
    elif method == "ping":
        result = {}
    else:
        error = {"code": -32601, "message": f"method not found: {method}"}
        return {"jsonrpc": "2.0", "id": rid, "error": error}
    return {"jsonrpc": "2.0", "id": rid, "result": result}


def main() -> None:
    depth = 0 if sys.argv[1] == "changing" else int(sys.argv[1])
    sys.setrecursionlimit(10_000)
    for line in sys.stdin:
        request = json.loads(line)
        answer = _answer(request, depth)
        if answer is not None:
            sys.stdout.write(json.dumps(answer) + "\n")
            if request.get("method") == "tools/list" and not depth and _listed == 1:
                changed = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
                sys.stdout.write(json.dumps(changed) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()

"""An MCP server with odd tool lists and odd results, written with the SDK's low-level API.

python odd.py stdio                    serve over stdin/stdout

What it lists is set by the environment:

MCP_TEST_TOOLS=N        N tools ``t0``..``t{N-1}``, each with a small schema of its own
MCP_TEST_DUPLICATE=1    two tools named ``twin``
MCP_TEST_DEEP=N         one tool whose input schema nests N levels deep

Its one callable tool, ``result``, answers with the content named by its ``kind``
argument (``blocks``, ``image``, ``not_base64``, ``html_image``, ``big_text``), so the
client's bounds on results can be tried against a real server.
"""

from __future__ import annotations

import base64
import os
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9"
    "awAAAABJRU5ErkJggg=="
)


def _schema(i: int) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {f"p{i}": {"type": "string", "description": f"parameter {i}"}},
        "required": [f"p{i}"],
    }


def _deep(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


def _tools() -> list[types.Tool]:
    tools = [
        types.Tool(
            name="result",
            description="Answer with odd content.",
            input_schema={
                "type": "object",
                "properties": {"kind": {"type": "string"}, "n": {"type": "integer"}},
                "required": ["kind"],
            },
        )
    ]
    count = int(os.environ.get("MCP_TEST_TOOLS", "0"))
    tools += [
        types.Tool(name=f"t{i}", description=f"Tool number {i}.", input_schema=_schema(i))
        for i in range(count)
    ]
    if os.environ.get("MCP_TEST_DUPLICATE"):
        tools += [
            types.Tool(name="twin", description=f"Twin {i}.", input_schema=_schema(i))
            for i in range(2)
        ]
    deep = int(os.environ.get("MCP_TEST_DEEP", "0"))
    if deep:
        tools.append(types.Tool(name="deep", description="Deep.", input_schema=_deep(deep)))
    return tools


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=_tools())


def _content(kind: str, n: int) -> list[Any]:
    if kind == "blocks":
        return [types.TextContent(type="text", text="") for _ in range(n)]
    if kind == "image":
        data = base64.b64encode(b"\x89PNG" + b"\0" * n).decode()
        return [types.ImageContent(type="image", data=data, mime_type="image/png")]
    if kind == "not_base64":
        return [types.ImageContent(type="image", data="not base64 at all!", mime_type="image/png")]
    if kind == "html_image":
        return [types.ImageContent(type="image", data=PNG, mime_type="text/html")]
    if kind == "big_text":
        return [types.TextContent(type="text", text="y" * n)]
    raise ValueError(f"unknown kind {kind!r}")


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    arguments = params.arguments or {}
    return types.CallToolResult(content=_content(arguments["kind"], int(arguments.get("n", 1))))


server = Server("statemachine-odd-server", on_list_tools=list_tools, on_call_tool=call_tool)


async def main() -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)

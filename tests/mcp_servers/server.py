"""An MCP server for the tests, written with the SDK's own server API.

python server.py stdio                 serve over stdin/stdout
python server.py http PORT             serve streamable HTTP on 127.0.0.1:PORT/mcp

Every tool appends what happened to the file named by MCP_TEST_LOG (when set), so a
test can see that a call started, finished, or was cancelled on the server side.
"""

from __future__ import annotations

import asyncio
import base64
import os
import sys
from typing import Any

from mcp.server.mcpserver import Context, Image, MCPServer

server = MCPServer("statemachine-test-server")


def _log(line: str) -> None:
    path = os.environ.get("MCP_TEST_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    _log(f"add {a} {b}")
    return a + b


@server.tool()
def echo(text: str) -> str:
    """Echo the text back."""
    _log(f"echo {text}")
    return text


@server.tool()
async def hang(label: str) -> str:
    """Never answer (until cancelled)."""
    _log(f"hang started {label}")
    try:
        await asyncio.sleep(3600)
    except BaseException:
        _log(f"hang cancelled {label}")
        raise
    return "unreachable"


@server.tool()
def boom() -> str:
    """Raise an error inside the tool."""
    raise ValueError("boom from the server")


@server.tool()
def crash() -> str:
    """Kill the server process mid-call."""
    _log("crash")
    os._exit(3)


@server.tool()
def picture() -> Image:
    """Return a 1x1 PNG."""
    png = base64.b64decode(
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
    )
    return Image(data=png, format="png")


@server.tool()
def weather(city: str) -> dict[str, Any]:
    """Structured output."""
    return {"city": city, "celsius": 21}


@server.tool()
def big(n: int) -> str:
    """A long answer of n characters."""
    return "x" * n


@server.tool()
def who(ctx: Context) -> str:
    """The client's name and version, as it introduced itself."""
    params = ctx.session.client_params
    info = params.client_info if params is not None else None
    return f"{info.name} {info.version}" if info is not None else "(anonymous)"


@server.tool()
def grow(name: str) -> str:
    """Add a tool named ``name`` that answers its own name."""

    def answer() -> str:
        return name

    server.add_tool(answer, name=name, description=f"Added by grow: {name}.")
    return f"added {name}"


@server.tool()
async def grow_and_tell(name: str, ctx: Context) -> str:
    """Add a tool named ``name``, and tell the listening clients the list changed."""
    grow(name)
    await ctx.notify_tools_changed()
    return f"added {name} and told"


PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


@server.resource("test://greeting", name="greeting", description="A greeting.")
def greeting() -> str:
    return "Hello from the server."


@server.resource("test://dot.png", name="dot", mime_type="image/png")
def dot() -> bytes:
    return PNG


@server.prompt(description="Ask for a review.")
def review(code: str, strict: str = "no") -> str:
    return f"Please review this code (strict: {strict}): {code}"


if os.environ.get("MCP_TEST_BAD_TOOL"):

    @server.tool(name="has.dot")
    def dotted() -> str:
        """A name that providers refuse."""
        return ""


if __name__ == "__main__":
    if sys.argv[1] == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))

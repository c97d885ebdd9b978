"""An MCP server whose tools ask the client: for a model's answer (sampling), for the
user's answer (elicitation), and that report progress and log while they run.

python asking.py stdio                 serve over stdin/stdout
python asking.py http PORT             serve streamable HTTP on 127.0.0.1:PORT/mcp

With MCP_TEST_TOKEN set, the HTTP server takes only requests that carry that bearer
token (the SDK's resource-server side of OAuth, with a token verifier of its own).
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.resolve import Elicit, Resolve, Sample
from mcp.types import CreateMessageResult, SamplingMessage, TextContent
from pydantic import AnyHttpUrl, BaseModel


class OneToken:
    """Accepts one bearer token, the one in MCP_TEST_TOKEN."""

    def __init__(self, token: str) -> None:
        self.token = token

    async def verify_token(self, token: str) -> AccessToken | None:
        if token != self.token:
            return None
        return AccessToken(token=token, client_id="statemachine-tests", scopes=[])


def _server() -> MCPServer:
    token = os.environ.get("MCP_TEST_TOKEN")
    if not token or sys.argv[1] != "http":
        return MCPServer("statemachine-asking-server")
    here = f"http://127.0.0.1:{sys.argv[2]}/mcp"
    return MCPServer(
        "statemachine-asking-server",
        token_verifier=OneToken(token),
        auth=AuthSettings(
            issuer_url=AnyHttpUrl("http://127.0.0.1:9"), resource_server_url=AnyHttpUrl(here)
        ),
    )


server = _server()


def _say(text: str, role: str = "user") -> SamplingMessage:
    return SamplingMessage(role=role, content=TextContent(type="text", text=text))  # type: ignore[arg-type]


def ask_model(text: str) -> Sample:
    return Sample(
        [_say(f"Summarize in one line: {text}")],
        max_tokens=50,
        system_prompt="You summarize.",
        temperature=0.0,
    )


@server.tool()
def summarize(text: str, answer: Annotated[CreateMessageResult, Resolve(ask_model)]) -> str:
    """Summarize the text with the client's model."""
    content = answer.content
    said = content.text if isinstance(content, TextContent) else "(not text)"
    return f"summary by {answer.model}: {said}"


def ask_model_much(n: int, tokens: int) -> Sample:
    return Sample([_say(f"message {i}") for i in range(n)], max_tokens=tokens)


@server.tool()
def chatty(
    n: int, tokens: int, answer: Annotated[CreateMessageResult, Resolve(ask_model_much)]
) -> str:
    """Ask the client's model with n messages and max_tokens=tokens."""
    return f"answered: {answer.content.text if isinstance(answer.content, TextContent) else ''}"


@server.tool()
def sized(
    n: int, tokens: int, answer: Annotated[CreateMessageResult, Resolve(ask_model_much)]
) -> str:
    """Ask the client's model like chatty; say how long its answer was and why it stopped."""
    said = answer.content.text if isinstance(answer.content, TextContent) else ""
    return f"{len(said)} characters, stopped: {answer.stop_reason}"


class Trip(BaseModel):
    seats: int
    window: bool


def ask_user(city: str) -> Elicit[Trip]:
    return Elicit(f"How many seats to {city}, and by the window?", Trip)


@server.tool()
def book(city: str, trip: Annotated[Trip, Resolve(ask_user)]) -> str:
    """Book a trip, asking the user for the details."""
    return f"booked {trip.seats} seats to {city} (window: {trip.window})"


@server.tool()
async def count(n: int, ctx: Context) -> str:
    """Count to n, reporting progress and logging at each step."""
    for i in range(1, n + 1):
        await ctx.report_progress(i, n, f"step {i}")
        await ctx.info(f"counted {i}", logger_name="counter")
    return f"counted to {n}"


@server.tool()
async def shout(size: int, ctx: Context) -> str:
    """Log one message of size characters."""
    await ctx.warning("w" * size, logger_name="l" * size)
    return "shouted"


@server.resource("test://greeting", name="greeting", description="A greeting.")
def greeting() -> str:
    return "Hello from the server."


if __name__ == "__main__":
    if sys.argv[1] == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))

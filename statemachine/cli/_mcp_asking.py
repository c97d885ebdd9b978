"""The part of ``statemachine mcp-example`` that asks the client: a tool that samples
its model, one that elicits from its user, one that lists its roots; and its resources:
a text, a resource template, a CSV table as bytes, and a tool that says one changed.

The SDK reads the tools' annotations at run time (its resolvers), so this module has
them as objects, not strings, and imports the SDK at the top: it is imported only once
the SDK is known to be there.
"""

from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.resolve import Elicit, ListRoots, Resolve, Sample
from mcp.types import CreateMessageResult, ListRootsResult, SamplingMessage, TextContent
from pydantic import BaseModel

__all__ = ["add_asking"]


class Name(BaseModel):
    name: str


def add_asking(server: MCPServer, max_chars: int) -> None:
    """Add ``summarize`` (sampling), ``greet`` (elicitation), ``roots`` (roots),
    ``touch`` (resource updates) and the resources ``example://style``,
    ``example://notes/{name}`` (a template) and ``example://table.csv`` (bytes)."""

    @server.resource("example://style", name="style", description="How to answer.")
    def style() -> str:
        return "Answer in one short sentence."

    @server.resource("example://notes/{name}", name="note", description="A note, by name.")
    def note(name: str) -> str:
        return f"Note {name[:100]}: nothing yet."

    @server.resource("example://table.csv", name="table", mime_type="text/csv")
    def table() -> bytes:
        return "city,temperature\nZürich,4\nLisboa,17\n".encode()

    @server.tool()
    async def touch(uri: str, ctx: Context) -> str:
        """Say that the resource at ``uri`` changed (to clients listening for it)."""
        await ctx.notify_resource_updated(uri[:max_chars])
        return "told"

    def ask_roots() -> ListRoots:
        return ListRoots()

    @server.tool()
    def roots(given: Annotated[ListRootsResult, Resolve(ask_roots)]) -> str:
        """List the client's roots, one URI a line."""
        return "\n".join(str(root.uri) for root in given.roots[:100]) or "(no roots)"

    def ask_model(text: str) -> Sample:
        said = TextContent(type="text", text=f"Summarize: {text[:max_chars]}")
        return Sample([SamplingMessage(role="user", content=said)], max_tokens=100)

    @server.tool()
    def summarize(text: str, answer: Annotated[CreateMessageResult, Resolve(ask_model)]) -> str:
        """Summarize a text with the client's model."""
        content: Any = answer.content
        return str(getattr(content, "text", ""))

    def ask_user() -> Elicit[Name]:
        return Elicit("What is your name?", Name)

    @server.tool()
    def greet(person: Annotated[Name, Resolve(ask_user)]) -> str:
        """Greet the user, asking for their name."""
        return f"Hello, {person.name[:100]}!"

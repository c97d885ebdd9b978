"""The part of ``statemachine mcp-example`` that asks the client: a tool that samples
its model, one that elicits from its user, and a resource.

The SDK reads the tools' annotations at run time (its resolvers), so this module has
them as objects, not strings, and imports the SDK at the top: it is imported only once
the SDK is known to be there.
"""

from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.resolve import Elicit, Resolve, Sample
from mcp.types import CreateMessageResult, SamplingMessage, TextContent
from pydantic import BaseModel

__all__ = ["add_asking"]


class Name(BaseModel):
    name: str


def add_asking(server: MCPServer, max_chars: int) -> None:
    """Add ``summarize`` (sampling), ``greet`` (elicitation) and ``example://style``."""

    @server.resource("example://style", name="style", description="How to answer.")
    def style() -> str:
        return "Answer in one short sentence."

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

"""An MCP server, written with the SDK's server API, for the client features beyond
tools: roots, resource templates, blob resources, resource updates, elicitation,
argument completions.

python features.py stdio               serve over stdin/stdout
"""

from __future__ import annotations

import os
from typing import Annotated

from mcp.server.elicitation import AcceptedElicitation, ElicitationResult
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.resolve import Elicit, ListRoots, Resolve
from mcp.types import (
    Completion,
    CompletionArgument,
    CompletionContext,
    ListRootsResult,
    PromptReference,
    ResourceTemplateReference,
)
from pydantic import BaseModel

server = MCPServer("statemachine-features-server")


def ask_roots() -> ListRoots:
    return ListRoots()


@server.tool()
def where(roots: Annotated[ListRootsResult, Resolve(ask_roots)]) -> str:
    """Say the client's roots, one per line: name and URI."""
    return "\n".join(f"{r.name}: {r.uri}" for r in roots.roots) or "(no roots)"


@server.resource("test://notes/{name}", name="note", description="A note, by name.")
def note(name: str) -> str:
    return f"the note {name}"


@server.resource("test://table.csv", name="table", mime_type="text/csv")
def table() -> bytes:
    return "a,b\n1,2\nnaïve,ü\n".encode()


@server.resource("test://archive.zip", name="archive", mime_type="application/zip")
def archive() -> bytes:
    return b"PK\x03\x04" + bytes(range(256)) * 4


@server.resource("test://latin.txt", name="latin", mime_type="text/plain")
def latin() -> bytes:
    return "caf\xe9".encode("latin-1")


@server.tool()
async def touch(uri: str, ctx: Context) -> str:
    """Tell the listening clients the resource at ``uri`` changed."""
    await ctx.notify_resource_updated(uri)
    return f"touched {uri}"


class Seat(BaseModel):
    row: int


def ask_seat() -> Elicit[Seat]:
    return Elicit("Which row?", Seat)


@server.tool()
def seat(choice: Annotated[ElicitationResult[Seat], Resolve(ask_seat)]) -> str:
    """Ask the user for a row; say what came back: the row, declined or cancelled
    (also appended to the file MCP_TEST_LOG names, when set)."""
    said = f"row {choice.data.row}" if isinstance(choice, AcceptedElicitation) else choice.action
    if "MCP_TEST_LOG" in os.environ:
        with open(os.environ["MCP_TEST_LOG"], "a", encoding="utf-8") as log:
            log.write(f"seat: {said}\n")
    return said


LANGUAGES = ("python", "pascal", "perl", "prolog", "rust")


@server.prompt(name="review", description="Review code in a language.")
def review(language: str, owner: str) -> str:
    return f"Review this {language} code of {owner}."


@server.completion()  # type: ignore[no-untyped-call, untyped-decorator]  # the SDK does not type it
async def complete(
    ref: PromptReference | ResourceTemplateReference,
    argument: CompletionArgument,
    context: CompletionContext | None,
) -> Completion | None:
    """Languages by prefix for the prompt; note names for the template, prefixed with
    the owner when one was chosen."""
    if isinstance(ref, PromptReference) and argument.name == "language":
        found = [lang for lang in LANGUAGES if lang.startswith(argument.value)]
        return Completion(values=found, total=len(found), has_more=False)
    if isinstance(ref, ResourceTemplateReference) and argument.name == "name":
        owner = (context.arguments or {}).get("owner") if context else None
        return Completion(values=[f"{owner or 'anyone'}-{argument.value}today"])
    return None


if __name__ == "__main__":
    server.run("stdio")

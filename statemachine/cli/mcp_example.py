"""``statemachine mcp-example``: a small MCP server on stdin/stdout, to try MCP tools
with an installed package (the ``[mcp]`` extra).

    MCPServer.stdio(sys.executable, ["-m", "statemachine", "mcp-example"], prefix="calc_")

It serves the tools ``add``, ``echo`` and ``word_count``; ``summarize``, which asks the
client's model (sampling), ``greet``, which asks the client's user (elicitation),
``roots``, which lists the client's roots, and ``touch``, which says a resource changed;
the resources ``example://style``, ``example://notes/{name}`` (a template) and
``example://table.csv`` (bytes); the prompt ``review``; and completions of the
prompt's ``language`` and the template's ``name``. All written with the MCP SDK's own server API.
Standard output is the protocol: the server writes nothing else there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from statemachine.cli.common import EXIT_OK, CommandParser, fail, parse

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer

__all__ = ["cli_mcp_example"]

LANGUAGES = ("python", "pascal", "perl", "rust")
"""What the prompt ``review``'s argument ``language`` is completed from."""
NOTES = ("today", "tomorrow", "todo")
"""What the template ``example://notes/{name}``'s argument ``name`` is completed from."""
MAX_TEXT_CHARS = 100_000
"""The longest text ``echo`` and ``word_count`` take (the SDK bounds a message too)."""


def _server() -> MCPServer:
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("statemachine-example")

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @server.tool()
    def echo(text: str) -> str:
        """Echo the text back."""
        return text[:MAX_TEXT_CHARS]

    @server.tool()
    def word_count(text: str) -> int:
        """Count the words of a text."""
        return len(text[:MAX_TEXT_CHARS].split())

    @server.prompt(name="review", description="Review code in a language.")
    def review(language: str) -> str:
        return f"Review this {language[:100]} code."

    @server.completion()  # type: ignore[no-untyped-call, untyped-decorator]  # the SDK does not type it
    async def complete(ref: Any, argument: Any, context: Any) -> Any:
        from mcp.types import Completion

        known = LANGUAGES if argument.name == "language" else NOTES
        found = [name for name in known if name.startswith(argument.value)]
        return Completion(values=found, total=len(found), has_more=False)

    from statemachine.cli._mcp_asking import add_asking

    add_asking(server, MAX_TEXT_CHARS)
    return server


def cli_mcp_example(argv: list[str]) -> int:
    """``statemachine mcp-example``: serve the example tools over stdio until stdin ends."""
    parser = CommandParser(
        "mcp-example",
        description="A small MCP server on stdin/stdout (tools add, echo, word_count, "
        "summarize, greet, roots and touch; resources example://style, "
        "example://notes/{name} and example://table.csv), to try MCP tools without "
        "writing a server: start it from "
        'statemachine.mcp.MCPServer.stdio(sys.executable, ["-m", "statemachine", '
        '"mcp-example"]). Needs the [mcp] extra.',
        failed=None,
    )
    args = parse(parser, argv)
    if isinstance(args, int):
        return args
    try:
        server = _server()
    except ModuleNotFoundError as exc:
        return fail(
            "mcp-example",
            f"needs the Python package {(exc.name or 'mcp').partition('.')[0]!r}, which is not "
            "installed: "
            "pip install 'agent-statemachine[mcp]'",
        )
    server.run("stdio")
    return EXIT_OK

"""The client features beyond tools, against real servers (tests/mcp_servers/features.py,
written with the SDK; noisy.py by hand for an error the SDK's server will not send):
roots, resource templates, blob resources, resource updates, elicitation's "cancel",
URL-mode elicitation's error -32042, argument completions."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import pytest
from test_mcp import DEVNULL, _sync, _until
from test_mcp_asking import _tool

import statemachine as sm
from statemachine.mcp import (
    MAX_COMPLETION_CHARS,
    MAX_COMPLETION_VALUES,
    MCPCompletion,
    MCPElicitation,
    MCPError,
    MCPPrompt,
    MCPResourceTemplate,
    MCPServer,
)

SERVERS = Path(__file__).resolve().parent / "mcp_servers"
FEATURES = SERVERS / "features.py"
NOISY = SERVERS / "noisy.py"


def _features(**options: Any) -> MCPServer:
    return MCPServer.stdio(sys.executable, [str(FEATURES), "stdio"], stderr=DEVNULL, **options)


@pytest.mark.timeout(60)
@_sync
async def test_roots_are_declared_given_and_changed(tmp_path: Path) -> None:
    async with _features(roots=[tmp_path, "file:///srv/data"]) as server:
        assert await _tool(server, "where") == (
            f"{tmp_path.name}: {tmp_path.resolve().as_uri()}\nNone: file:///srv/data"
        )
        await server.set_roots(["file:///elsewhere"])
        assert await _tool(server, "where") == "None: file:///elsewhere"
    async with _features() as server:  # not declared: the server's request is refused
        assert (await _tool(server, "where")).startswith("error: ")
    with pytest.raises(sm.InvalidInputError, match="a root must be a path or a file:// URI"):
        _features(roots=["https://example.com"])


@pytest.mark.timeout(60)
@_sync
async def test_an_older_server_is_told_the_roots_changed_and_asks_again() -> None:
    server = MCPServer.stdio(
        sys.executable, [str(NOISY), "roots"], stderr=DEVNULL, roots=["file:///a"]
    )
    async with server:
        assert await _tool(server, "mangle") == "file:///a (list_changed heard 0 times)"
        await server.set_roots(["file:///b", "file:///c"])
        assert await _tool(server, "mangle") == ("file:///b file:///c (list_changed heard 1 times)")


@pytest.mark.timeout(60)
@_sync
async def test_resource_templates_are_listed_and_a_filled_one_read() -> None:
    async with _features() as server:
        assert await server.list_resource_templates() == (
            MCPResourceTemplate("test://notes/{name}", "note", "A note, by name.", "text/plain"),
        )
        assert await server.read_resource("test://notes/todo") == (sm.TextContent("the note todo"),)


@pytest.mark.timeout(60)
@_sync
async def test_blob_resources_are_text_when_they_are_text_and_bounded() -> None:
    async with _features() as server:
        (table,) = await server.read_resource("test://table.csv")
        (archive,) = await server.read_resource("test://archive.zip")
        (latin,) = await server.read_resource("test://latin.txt")
    async with _features(max_output_chars=12) as server:
        cut = await server.read_resource("test://table.csv")
    assert table == sm.TextContent("a,b\n1,2\nnaïve,ü\n")
    assert cut == (
        sm.TextContent("a,b\n1,2\nnaïv"),
        sm.TextContent("[4 more characters cut: max_output_chars=12]"),
    )
    assert archive == sm.TextContent("[resource: test://archive.zip, application/zip, 1028 bytes]")
    assert latin == sm.TextContent(
        "[resource: test://latin.txt, text/plain: not base64 UTF-8 text]"
    )


@pytest.mark.timeout(60)
@_sync
async def test_resource_updates_of_subscribed_uris_arrive_each_once() -> None:
    watched = ("test://table.csv", "test://latin.txt")
    async with _features() as server, server.resource_updates(*watched) as updates:
        for uri in ("test://table.csv", "test://other", "test://table.csv", "test://latin.txt"):
            assert (await _tool(server, "touch", uri=uri)).startswith("touched")
        # Once both have arrived (the stream is not the calls' channel), each waits once.
        await _until(lambda: set(updates._pending) == set(watched))
        async with asyncio.timeout(30):
            assert [await anext(updates), await anext(updates)] == list(watched)
    with pytest.raises(MCPError, match="not connected"):
        async with server.resource_updates("test://table.csv"):
            pass


@pytest.mark.timeout(60)
@_sync
async def test_an_older_servers_resources_are_subscribed_to_and_their_updates_heard() -> None:
    server = MCPServer.stdio(sys.executable, [str(NOISY), "resources"], stderr=DEVNULL)
    watched = ("test://a", "test://b")
    async with server, server.resource_updates(*watched) as updates:
        # The server says each updated twice (and test://other once) as it is subscribed.
        await _until(lambda: set(updates._pending) == set(watched))
        async with asyncio.timeout(30):
            assert [await anext(updates), await anext(updates)] == list(watched)
        assert list(updates._pending) == []


@pytest.mark.timeout(60)
@_sync
async def test_resource_updates_end_with_an_error_when_the_connection_ends() -> None:
    server = MCPServer.stdio(
        sys.executable, [str(NOISY), "resources-then-exit"], stderr=DEVNULL, call_timeout=None
    )
    async with server, server.resource_updates("test://a") as updates:
        async with asyncio.timeout(30):  # call_timeout=None: only the connection's end
            with pytest.raises(MCPError, match="resource updates ended: the connection ended"):
                await anext(updates)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("answer", ["cancel", "decline", None])
@_sync
async def test_an_elicitation_may_be_cancelled_or_declined(
    answer: Literal["cancel", "decline"] | None,
) -> None:
    async def dismiss(question: MCPElicitation) -> Mapping[str, Any] | str | None:
        assert question.message == "Which row?"
        return answer

    async with _features(elicitation=dismiss) as server:
        said = await _tool(server, "seat")
    assert said == ("cancel" if answer == "cancel" else "decline")


@pytest.mark.timeout(60)
@_sync
async def test_a_url_elicitation_error_names_the_url_and_shows_it_to_the_handler() -> None:
    shown: list[MCPElicitation] = []

    async def note(question: MCPElicitation) -> None:
        shown.append(question)

    server = MCPServer.stdio(
        sys.executable, [str(NOISY), "url-required"], stderr=DEVNULL, elicitation=note
    )
    async with server:
        said = await _tool(server, "mangle")
    assert said.startswith("error: MCP server ")
    assert "error -32042 URL_ELICITATION_REQUIRED" in said
    assert "Sign in first https://auth.example/start?x=1" in said
    assert [(q.message, q.url) for q in shown] == [
        ("Sign in first", "https://auth.example/start?x=1")
    ]


@pytest.mark.timeout(60)
@_sync
async def test_argument_completions_of_a_prompt_and_a_template_are_asked_for() -> None:
    async with _features() as server:
        (review,) = await server.list_prompts()
        (template,) = await server.list_resource_templates()
        languages = await server.complete_argument(review, "language", "p")
        named = await server.complete_argument(template, "name", "to", context={"owner": "ada"})
        by_name = await server.complete_argument(MCPPrompt("review"), "language", "r")
        unknown = await server.complete_argument(review, "owner", "a")
    assert languages == MCPCompletion(("python", "pascal", "perl", "prolog"), 4, False)
    assert named == MCPCompletion(("ada-totoday",))
    assert by_name.values == ("rust",)
    assert unknown == MCPCompletion(())


@pytest.mark.timeout(60)
@_sync
async def test_argument_completions_are_bounded_in_count_and_size() -> None:
    flooding = [str(NOISY), "completions-flood"]
    async with MCPServer.stdio(sys.executable, flooding, stderr=DEVNULL) as server:
        flood = await server.complete_argument(MCPPrompt("review"), "language", "p")
        with pytest.raises(sm.InvalidInputError, match="an MCPPrompt or an MCPResourceTemplate"):
            await server.complete_argument("review", "language")  # type: ignore[arg-type]
    # The first 100 values sent, less the one too long.
    assert len(flood.values) == MAX_COMPLETION_VALUES - 1
    assert flood.values[:2] == ("v0", "v1")
    assert all(len(v) <= MAX_COMPLETION_CHARS for v in flood.values)
    assert (flood.total, flood.has_more) == (502, True)


@pytest.mark.timeout(60)
@_sync
async def test_argument_completions_of_a_server_without_them_fail_naming_it() -> None:
    async with MCPServer.stdio(
        sys.executable, [str(SERVERS / "server.py"), "stdio"], stderr=DEVNULL
    ) as server:
        with pytest.raises(MCPError, match="completion/complete of 'language'"):
            await server.complete_argument(MCPPrompt("review"), "language", "p")

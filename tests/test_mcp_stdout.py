"""What a stdio server's stdout can do to a connection: bytes that are not UTF-8, lines
that are not JSON, a line without end. Each ends as a named outcome within its time
limit, never a stall of the call or of the calls after it. Every server here is a
real process (tests/mcp_servers/noisy.py), started by the test."""

from __future__ import annotations

import asyncio
import gc
import sys
from pathlib import Path
from typing import Any

import pytest
from test_mcp import DEVNULL, _sync

import statemachine as sm
from statemachine.mcp import MCPError, MCPServer

SERVERS = Path(__file__).resolve().parent / "mcp_servers"
NOISY = SERVERS / "noisy.py"
RAW = SERVERS / "raw.py"
# A bound no fix may rely on: the answers below must come long before it.
PATIENCE = 30.0


def _noisy(mode: str, env: dict[str, str] | None = None, **options: Any) -> MCPServer:
    options.setdefault("stderr", DEVNULL)
    return MCPServer.stdio(sys.executable, [str(NOISY), mode], name=mode, env=env, **options)


async def _call(server: MCPServer, name: str, **arguments: Any) -> sm.ToolOutput:
    (tool,) = [t for t in server.tools if t.name == name]
    output = await tool.execute(arguments, sm.AbortController().signal)
    assert isinstance(output, sm.ToolOutput)
    return output


class LoopErrors:
    """What the event loop reports to its exception handler ("Future exception was
    never retrieved", "Task exception was never retrieved"), collected."""

    def __init__(self) -> None:
        self.messages: list[str] = []

    def __enter__(self) -> LoopErrors:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, context: self.messages.append(context["message"]))
        return self

    def __exit__(self, *exc: object) -> None:
        gc.collect()  # a future nobody retrieved is reported when it is collected


# -- bytes that are not UTF-8 -----------------------------------------------------------------


@pytest.mark.timeout(90)
@_sync
async def test_bytes_that_are_not_utf8_end_the_connection_and_every_later_call_at_once() -> None:
    with LoopErrors() as errors:
        async with _noisy("bytes-on-call", call_timeout=None) as server:
            assert (await _call(server, "echo", text="before")).content == (
                sm.TextContent("before"),
            )
            async with asyncio.timeout(PATIENCE):  # call_timeout=None: only the fix ends it
                with pytest.raises(MCPError) as mangled:
                    await _call(server, "mangle")
                with pytest.raises(MCPError) as later:
                    await _call(server, "echo", text="after")
    assert str(mangled.value).startswith("MCP server 'bytes-on-call', tool 'mangle': ")
    assert "the connection ended" in str(mangled.value)
    assert "bytes that are not UTF-8 on its stdout (b'\\xe9'" in str(mangled.value)
    assert "no longer connected" in str(later.value)
    assert "not UTF-8" in str(later.value)
    assert errors.messages == []


@pytest.mark.timeout(90)
@_sync
async def test_bytes_that_are_not_utf8_at_connect_fail_it_at_once_naming_them() -> None:
    with LoopErrors() as errors:
        server = _noisy("bytes-at-start", connect_timeout=120)
        async with asyncio.timeout(PATIENCE):
            with pytest.raises(MCPError) as caught:
                async with server:
                    pass
    message = str(caught.value)
    assert message.startswith("MCP server 'bytes-at-start' could not be reached: ")
    assert "not UTF-8" in message
    assert errors.messages == []


# -- lines that are not JSON ------------------------------------------------------------------


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    "mode", ["stray-at-start", "stray-on-list", "stray-json-on-list", "stray-on-call"]
)
@_sync
async def test_one_line_that_is_not_json_is_skipped_wherever_it_comes(mode: str) -> None:
    async with _noisy(mode, call_timeout=PATIENCE) as server:
        assert [t.name for t in server.tools] == ["echo", "mangle"]
        assert (await _call(server, "mangle")).content == (sm.TextContent("mangled"),)
        assert (await _call(server, "echo", text="still")).content == (sm.TextContent("still"),)


@pytest.mark.timeout(90)
@_sync
async def test_a_reply_to_the_listing_that_cannot_be_read_still_fails_it_at_once() -> None:
    # The other side of skipping stray lines: tests/mcp_servers/raw.py replies with a
    # schema too deep for the SDK's parser, a line that starts as a JSON object.
    server = MCPServer.stdio(
        sys.executable, [str(RAW), "150"], name="deep", connect_timeout=120, stderr=DEVNULL
    )
    async with asyncio.timeout(PATIENCE):
        with pytest.raises(MCPError, match="could not list its tools: it sent a message the SDK"):
            async with server:
                pass


# -- a line without end -----------------------------------------------------------------------


@pytest.mark.timeout(90)
@_sync
async def test_a_line_past_max_message_bytes_ends_the_connection_naming_the_bound() -> None:
    async with _noisy(
        "long-line-on-call",
        {"MCP_TEST_BYTES": "300000"},
        call_timeout=None,
        max_message_bytes=200_000,
    ) as server:
        async with asyncio.timeout(PATIENCE):
            with pytest.raises(MCPError) as caught:
                await _call(server, "mangle")
    assert "the connection ended (it wrote a line of more than 200000 bytes on its stdout" in str(
        caught.value
    )
    assert "(max_message_bytes)" in str(caught.value)


@pytest.mark.timeout(90)
@_sync
async def test_a_line_within_max_message_bytes_is_read() -> None:
    async with _noisy(
        "long-line-on-call", {"MCP_TEST_BYTES": "150000"}, max_message_bytes=200_000
    ) as server:
        output = await _call(server, "mangle")
    assert output.content == (sm.TextContent("y" * 150_000),)

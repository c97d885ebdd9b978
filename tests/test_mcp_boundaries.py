"""What an MCP server can do to a run, and what it cannot: a killed HTTP server, a
thousand-tool listing, unbounded or malformed results, clashing names, a reply the
SDK cannot read. Every server here is a real one, written with the SDK (or by hand,
for replies the SDK's server API will not produce), started by the test."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from test_mcp import (
    DEVNULL,
    SERVER,
    HttpServer,
    _calls,
    _results,
    _sync,
    _until,
    http_server,
    serving_http,
)

import statemachine as sm
from statemachine.core.invariants import history_violations
from statemachine.mcp import (
    DEFAULT_MAX_BLOCKS,
    DEFAULT_MAX_OUTPUT_BYTES,
    MCPError,
    MCPPrompt,
    MCPResource,
    MCPServer,
)
from statemachine.testing import ScriptedModel

__all__ = ["http_server"]  # the fixture, shared with test_mcp

SERVERS = Path(__file__).resolve().parent / "mcp_servers"
ODD = SERVERS / "odd.py"
RAW = SERVERS / "raw.py"


def _odd(env: dict[str, str] | None = None, **options: Any) -> MCPServer:
    options.setdefault("stderr", DEVNULL)
    return MCPServer.stdio(sys.executable, [str(ODD), "stdio"], env=env or {}, **options)


class Ticker:
    """A task that ticks every millisecond and keeps the longest gap between ticks:
    how long the event loop was held by something else."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.001)
            now = time.monotonic()
            self.longest = max(self.longest, now - last)
            last = now

    def __enter__(self) -> Ticker:
        self._task = asyncio.get_running_loop().create_task(self._tick())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


# -- a streamable-HTTP server that dies ------------------------------------------------------


@pytest.mark.timeout(60)
@_sync
async def test_an_http_server_killed_mid_call_answers_the_call_and_the_run_goes_on(
    http_server: HttpServer,
) -> None:
    model = ScriptedModel(
        _calls(("hang", {"label": "K"})), _calls(("add", {"a": 1, "b": 2})), "done"
    )

    async def kill_once_hanging() -> None:
        await _until(lambda: "hang started K" in _log(http_server))
        http_server.kill()

    async with MCPServer.http(http_server.url, call_timeout=30) as server:
        killer = asyncio.create_task(kill_once_hanging())
        started = time.monotonic()
        result = await sm.run_agent(
            model=model, tools=server.tools, messages=[sm.UserMessage("go")]
        )
        await killer
    assert time.monotonic() - started < 20  # answered when the server died, not at 30 s
    assert result.state is sm.TurnState.DONE, result.explanation
    assert history_violations(result.messages) == []
    hang, add = _results(result.messages)
    assert hang.is_error
    assert "MCP server" in hang.text
    assert add.is_error  # the server is gone: the next call is answered at once
    assert "no longer connected" in add.text


@pytest.mark.timeout(60)
@_sync
async def test_an_http_server_killed_while_idle_answers_the_next_call(
    http_server: HttpServer,
) -> None:
    model = ScriptedModel(_calls(("add", {"a": 1, "b": 2})), "done")
    async with MCPServer.http(http_server.url) as server:
        http_server.kill()
        result = await sm.run_agent(
            model=model, tools=server.tools, messages=[sm.UserMessage("go")]
        )
    assert result.state is sm.TurnState.DONE, result.explanation
    (add,) = _results(result.messages)
    assert add.is_error
    assert "MCP server" in add.text


def _log(server: HttpServer) -> str:
    return server.log.read_text("utf-8") if server.log.exists() else ""


# -- thousands of tools --------------------------------------------------------------------


@pytest.mark.timeout(120)
@_sync
async def test_thousands_of_tools_never_hold_the_event_loop() -> None:
    count = 5_000
    with Ticker() as ticker:
        started = time.monotonic()
        async with _odd({"MCP_TEST_TOOLS": str(count)}, connect_timeout=90) as server:
            took = time.monotonic() - started
            assert len(server.tools) == count + 1
            assert list(server.tools[-1].definition.parameters["required"]) == [f"p{count - 1}"]
    # The schemas are checked in a thread: the loop is never held for more than a
    # small part of connecting (the SDK parses its replies on the loop; that is all).
    print(f"5,000 tools: connected in {took:.2f} s, loop held at most {ticker.longest:.3f} s")
    assert ticker.longest < took / 4, (ticker.longest, took)


@pytest.mark.timeout(60)
@_sync
async def test_checking_tools_stops_at_the_connect_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    release = threading.Event()
    checked: list[str] = []
    real = MCPServer._definition

    def slow(self: MCPServer, remote: Any) -> sm.ToolDefinition:
        checked.append(remote.name)
        release.wait(60)  # a check that takes long (released below)
        return real(self, remote)

    monkeypatch.setattr(MCPServer, "_definition", slow)
    server = _odd({"MCP_TEST_TOOLS": "50"}, connect_timeout=10)
    with Ticker() as ticker:
        started = time.monotonic()
        with pytest.raises(MCPError, match=r"could not be checked within 10 s \(connect_timeout\)"):
            async with server:
                pass
        took = time.monotonic() - started
    release.set()
    assert took < 30
    assert ticker.longest < 5.0  # the loop ticked all along (it was held for the whole check)
    # Once released, the worker finishes the tool it was checking and stops there.
    await asyncio.get_running_loop().shutdown_default_executor()
    assert checked == ["result"]


# -- results -------------------------------------------------------------------------------


async def _result(server: MCPServer, kind: str, n: int = 1) -> sm.ToolOutput:
    (tool,) = [t for t in server.tools if t.name == "result"]
    output = await tool.execute({"kind": kind, "n": n}, sm.AbortController().signal)
    assert isinstance(output, sm.ToolOutput)
    return output


@pytest.mark.timeout(60)
@_sync
async def test_a_result_keeps_at_most_max_blocks_blocks() -> None:
    async with _odd() as server:
        output = await _result(server, "blocks", 5_000)
    assert len(output.content) == DEFAULT_MAX_BLOCKS + 1
    note = output.content[-1]
    assert isinstance(note, sm.TextContent)
    assert (
        note.text == f"[{5_000 - DEFAULT_MAX_BLOCKS} more content blocks dropped: max_blocks=100]"
    )


@pytest.mark.timeout(60)
@_sync
async def test_an_image_past_max_output_bytes_is_dropped_with_a_note() -> None:
    size = DEFAULT_MAX_OUTPUT_BYTES  # base64 makes it a third larger than the limit
    async with _odd() as server:
        output = await _result(server, "image", size)
        small = await _result(server, "image", 10)
    assert not any(isinstance(b, sm.ImageContent) for b in output.content)
    (note,) = output.content
    assert isinstance(note, sm.TextContent)
    assert "1 images dropped" in note.text
    assert f"max_output_bytes={DEFAULT_MAX_OUTPUT_BYTES}" in note.text
    (image,) = small.content
    assert isinstance(image, sm.ImageContent)
    assert base64.b64decode(image.data).startswith(b"\x89PNG")


@pytest.mark.timeout(60)
@_sync
async def test_text_is_cut_by_bytes_too() -> None:
    async with _odd(max_output_bytes=1_000) as server:
        output = await _result(server, "big_text", 5_000)
    text, note = output.content
    assert isinstance(text, sm.TextContent)
    assert text.text == "y" * 1_000
    assert note == sm.TextContent("[4000 more bytes cut: max_output_bytes=1000]")


@pytest.mark.timeout(60)
@_sync
async def test_images_that_are_not_base64_or_not_images_are_refused() -> None:
    async with _odd() as server:
        garbled = await _result(server, "not_base64")
        html = await _result(server, "html_image")
    assert garbled.content == (
        sm.TextContent("[image refused (image/png): its data is not base64]"),
    )
    assert html.content == (
        sm.TextContent("[image refused: MIME type 'text/html' is not image/*]"),
    )


# -- listings the library cannot use -------------------------------------------------------


@pytest.mark.timeout(60)
@_sync
async def test_two_tools_with_one_name_fail_the_connection_naming_the_server() -> None:
    server = _odd({"MCP_TEST_DUPLICATE": "1"}, name="twins")
    with pytest.raises(
        sm.InvalidInputError, match=r"MCP server 'twins' lists two tools named 'twin'"
    ):
        async with server:
            pass


@pytest.mark.timeout(60)
@_sync
async def test_a_reply_the_sdk_cannot_read_is_named_at_once() -> None:
    server = MCPServer.stdio(
        sys.executable, [str(RAW), "150"], name="deep", connect_timeout=30, stderr=DEVNULL
    )
    started = time.monotonic()
    with pytest.raises(MCPError) as caught:
        async with server:
            pass
    assert time.monotonic() - started < 15  # not the whole connect_timeout
    message = str(caught.value)
    assert message.startswith("MCP server 'deep' could not list its tools: ")
    assert "could not read" in message
    assert "recursion limit" in message


@pytest.mark.timeout(60)
@_sync
async def test_a_schema_nested_within_the_limits_is_listed() -> None:
    server = MCPServer.stdio(sys.executable, [str(RAW), "20"], stderr=DEVNULL)
    async with server:
        assert [t.name for t in server.tools] == ["deep"]


@pytest.mark.timeout(60)
@_sync
async def test_more_tools_than_max_tools_fail_the_connection() -> None:
    with pytest.raises(sm.InvalidInputError, match=r"more than 10 tools \(max_tools\)"):
        async with _odd({"MCP_TEST_TOOLS": "20"}, max_tools=10):
            pass


# -- choosing tools, naming the client -------------------------------------------------------


@pytest.mark.timeout(60)
@_sync
async def test_allowed_and_blocked_tools_choose_what_is_offered() -> None:
    env = {"MCP_TEST_TOOLS": "5"}
    async with _odd(env, allowed_tools=["t1", "t3"], prefix="x_") as server:
        assert [t.name for t in server.tools] == ["x_t1", "x_t3"]
    async with _odd(env, blocked_tools=lambda name: name.startswith("t")) as server:
        assert [t.name for t in server.tools] == ["result"]
    with pytest.raises(sm.InvalidInputError, match=r"does not list the allowed tools \['nope'\]"):
        async with _odd(env, allowed_tools=["t1", "nope"]):
            pass
    with pytest.raises(sm.InvalidInputError, match="allowed_tools must be tool names"):
        _odd(env, allowed_tools="t1")


@pytest.mark.timeout(60)
@_sync
async def test_the_server_is_told_this_library_and_its_version(tmp_path: Path) -> None:
    log = tmp_path / "log"
    server = MCPServer.stdio(
        sys.executable, [str(SERVER), "stdio"], env={"MCP_TEST_LOG": str(log)}, stderr=DEVNULL
    )
    async with server:
        (who,) = [t for t in server.tools if t.name == "who"]
        output = await who.execute({}, sm.AbortController().signal)
    assert output == sm.ToolOutput(f"agent-statemachine {sm.__version__}")


@pytest.mark.timeout(60)
def test_bounds_must_be_positive_integers() -> None:
    options: dict[str, Any] = {"max_output_bytes": 0, "max_blocks": -1, "max_tools": True}
    for option, value in options.items():
        with pytest.raises(sm.InvalidInputError, match=option):
            MCPServer.http("http://127.0.0.1:1/mcp", **{option: value})


@pytest.mark.timeout(60)
@_sync
async def test_refresh_lists_the_tools_again_for_the_next_runs() -> None:
    async with MCPServer.stdio(sys.executable, [str(SERVER), "stdio"], stderr=DEVNULL) as server:
        before = server.tools
        (grow,) = [t for t in before if t.name == "grow"]
        added = await grow.execute({"name": "sprout"}, sm.AbortController().signal)
        assert added == sm.ToolOutput("added sprout")
        assert "sprout" not in [t.name for t in server.tools]
        refreshed = await server.refresh()
        assert refreshed == server.tools
        (sprout,) = [t for t in server.tools if t.name == "sprout"]
        assert sprout.definition.description == "Added by grow: sprout."
        answer = await sprout.execute({}, sm.AbortController().signal)
        assert answer == sm.ToolOutput("sprout")
    with pytest.raises(MCPError, match="not connected"):
        await server.refresh()


@pytest.mark.timeout(60)
@_sync
async def test_a_tool_list_that_changed_is_listed_again_by_itself() -> None:
    server = MCPServer.stdio(sys.executable, [str(RAW), "changing"], stderr=DEVNULL)
    async with server:
        await _until(lambda: [t.name for t in server.tools] == ["first", "second"])
        assert server.tools[1].definition.description == "Second"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", ["stdio", "http"])
@_sync
async def test_a_newer_servers_tool_list_change_is_heard_on_its_listen_stream(
    transport: str, tmp_path: Path
) -> None:
    # The 2026-07-28 protocol tells a change only on a subscriptions/listen stream.
    with contextlib.ExitStack() as stack:
        if transport == "http":
            url, _process = stack.enter_context(serving_http(SERVER, {}))
            server = MCPServer.http(url)
        else:
            server = MCPServer.stdio(sys.executable, [str(SERVER), "stdio"], stderr=DEVNULL)
        async with server:
            (grow,) = [t for t in server.tools if t.name == "grow_and_tell"]
            told = await grow.execute({"name": "shoot"}, sm.AbortController().signal)
            assert told == sm.ToolOutput("added shoot and told")
            await _until(lambda: "shoot" in [t.name for t in server.tools])
            (shoot,) = [t for t in server.tools if t.name == "shoot"]
            assert await shoot.execute({}, sm.AbortController().signal) == sm.ToolOutput("shoot")


@pytest.mark.timeout(60)
@_sync
async def test_an_http_servers_errors_never_show_the_credentials_in_its_url() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://agent:hunter2-secret@127.0.0.1:{port}/mcp?token=tok-secret#frag"
    server = MCPServer.http(url, headers={"Authorization": "Bearer bearer-secret"})
    assert server.name == f"http://127.0.0.1:{port}/mcp"
    with pytest.raises(MCPError) as caught:
        async with server:
            pass
    for secret in ("hunter2", "tok-secret", "bearer-secret"):
        assert secret not in str(caught.value)


# -- resources and prompts -------------------------------------------------------------------


@pytest.mark.timeout(60)
@_sync
async def test_resources_and_prompts_are_listed_read_and_put_in_a_run() -> None:
    async with MCPServer.stdio(sys.executable, [str(SERVER), "stdio"], stderr=DEVNULL) as server:
        resources = await server.list_resources()
        assert MCPResource("test://greeting", "greeting", "A greeting.", "text/plain") in resources
        assert [r.name for r in resources] == ["greeting", "dot"]
        (text,) = await server.read_resource("test://greeting")
        assert text == sm.TextContent("Hello from the server.")
        (picture,) = await server.read_resource("test://dot.png")
        assert isinstance(picture, sm.ImageContent)
        assert picture.mime_type == "image/png"
        assert await server.list_prompts() == (
            MCPPrompt("review", "Ask for a review.", ("code", "strict"), ("code",)),
        )
        messages = await server.get_prompt("review", {"code": "x = 1"})
        assert messages == (sm.UserMessage("Please review this code (strict: no): x = 1"),)
        with pytest.raises(MCPError, match=r"MCP server .*, resource 'test://nope': "):
            await server.read_resource("test://nope")
        model = ScriptedModel("reviewed")
        result = await sm.run_agent(
            model=model,
            messages=[*messages, sm.UserMessage((sm.TextContent("Also this:"), text))],
        )
    assert result.state is sm.TurnState.DONE
    assert model.contexts[0][0] == messages[0]
    with pytest.raises(MCPError, match="not connected"):
        await server.list_resources()


def test_resource_contents_and_prompt_messages_are_bounded() -> None:
    import mcp.types as mcp_types

    from statemachine.mcp._resources import prompt_messages, resource_blocks

    text = mcp_types.TextResourceContents(uri="test://t", text="z" * 50)
    blob = mcp_types.BlobResourceContents(uri="test://b", blob="AAAA", mime_type="application/zip")
    fake = mcp_types.BlobResourceContents(uri="test://i", blob="not base64!", mime_type="image/png")
    read = mcp_types.ReadResourceResult(contents=[text, blob, fake, text, text])
    blocks = resource_blocks(read, 157, 1_000, 4)  # 147 characters before the last
    assert blocks == (
        sm.TextContent("z" * 50),
        sm.TextContent("[resource: test://b, application/zip, 3 bytes]"),
        sm.TextContent("[image refused (image/png): its data is not base64]"),
        sm.TextContent("z" * 10),
        sm.TextContent("[40 more characters cut: max_output_chars=157]"),
        sm.TextContent("[1 more contents dropped: max_blocks=4]"),
    )
    said = mcp_types.PromptMessage(
        role="user", content=mcp_types.TextContent(type="text", text="w" * 100)
    )
    answered = mcp_types.PromptMessage(
        role="assistant", content=mcp_types.TextContent(type="text", text="ok")
    )
    got = mcp_types.GetPromptResult(messages=[said, answered, said])
    messages = prompt_messages(got, 40, 1_000, 2)
    assert messages == (
        sm.UserMessage(
            (
                sm.TextContent("w" * 20),
                sm.TextContent("[80 more characters cut: max_output_chars=20]"),
            )
        ),
        sm.AssistantMessage("ok"),
        sm.UserMessage("[1 more messages dropped: max_blocks=2]"),
    )

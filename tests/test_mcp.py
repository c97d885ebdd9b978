"""Tools from real MCP servers (the SDK's own server API), over stdio and HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import itertools
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import statemachine as sm
import statemachine.messages
from statemachine.core.invariants import history_violations
from statemachine.mcp import MCPError, MCPServer
from statemachine.mcp._stderr import MAX_STDERR_CHARS
from statemachine.testing import ScriptedModel

_T = TypeVar("_T")
SERVER = Path(__file__).resolve().parent / "mcp_servers" / "server.py"
ROOT = SERVER.parent.parent.parent


# The test server's stderr (tracebacks of the tools that fail on purpose) is dropped.
DEVNULL = open(os.devnull, "w")  # noqa: SIM115 - open for the whole session


def _stdio(log: Path | None = None, **options: Any) -> MCPServer:
    env = {"MCP_TEST_LOG": str(log)} if log else {}
    options.setdefault("stderr", DEVNULL)
    return MCPServer.stdio(sys.executable, [str(SERVER), "stdio"], env=env, **options)


def _sync(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async test in a fresh event loop (pytest sees the same signature)."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


def _calls(*calls: tuple[str, dict[str, Any]]) -> sm.AssistantMessage:
    blocks = tuple(sm.ToolCall(f"c{i}", name, args) for i, (name, args) in enumerate(calls))
    return sm.AssistantMessage(blocks, stop_reason=sm.messages.StopReason.TOOL_USE)


def _done() -> sm.AssistantMessage:
    return sm.AssistantMessage((sm.TextContent("done"),))


def _results(messages: Sequence[sm.Message]) -> list[sm.ToolResultMessage]:
    return [m for m in messages if isinstance(m, sm.ToolResultMessage)]


class Shared:
    """One stdio server for many tests, connected in an event loop of its own thread.

    Starting a server costs a Python start-up and the SDK's import (seconds on a
    loaded machine), so the tests that do not stop or break the server share one.
    Tools log to ``log``; each test uses labels of its own.
    """

    def __init__(self, log: Path) -> None:
        self.log = log
        self.server = _stdio(log, call_timeout=5, max_output_chars=200)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self._stop = self.run(_event())
        connected = threading.Event()

        async def hold() -> None:
            # The SDK's connection must be closed by the task that opened it.
            async with self.server:
                connected.set()
                await self._stop.wait()

        self._holder = asyncio.run_coroutine_threadsafe(hold(), self.loop)
        if not connected.wait(60):
            self._holder.result(1)  # raises what went wrong
            raise AssertionError("the shared MCP server did not connect")

    def run(self, awaitable: Awaitable[_T], timeout: float = 60) -> _T:
        async def wait() -> _T:
            return await awaitable

        return asyncio.run_coroutine_threadsafe(wait(), self.loop).result(timeout)

    def lines(self) -> list[str]:
        return self.log.read_text(encoding="utf-8").splitlines() if self.log.exists() else []

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self._stop.set)
        self._holder.result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


async def _event() -> asyncio.Event:
    return asyncio.Event()


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    server = Shared(tmp_path_factory.mktemp("mcp") / "log")
    try:
        yield server
    finally:
        server.close()


def _tool(shared: Shared, name: str) -> sm.Tool:
    return next(t for t in shared.server.tools if t.name == name)


# -- stdio ------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
@_sync
async def test_tools_are_listed_with_their_schemas_under_a_prefix() -> None:
    async with _stdio(prefix="t_") as server:
        names = [t.name for t in server.tools]
        assert names == [
            "t_add", "t_echo", "t_hang", "t_boom", "t_crash", "t_picture", "t_weather", "t_big",
            "t_who", "t_grow", "t_grow_and_tell",
        ]  # fmt: skip
        add = server.tools[0].definition
        assert add.description == "Add two integers."
        assert dict(add.parameters["properties"]["a"]) == {"title": "A", "type": "integer"}
        assert list(add.parameters["required"]) == ["a", "b"]
    assert server.tools == ()


@pytest.mark.timeout(60)
def test_results_map_to_tool_results(shared: Shared) -> None:
    signal = sm.AbortController().signal

    def call(name: str, **arguments: Any) -> sm.ToolOutput:
        output = shared.run(_tool(shared, name).execute(arguments, signal))
        assert isinstance(output, sm.ToolOutput)
        return output

    assert call("add", a=2, b=3) == sm.ToolOutput("5")
    boom = call("boom")
    assert boom.is_error
    assert "boom" in boom.content[0].text  # type: ignore[union-attr]
    picture = call("picture")
    assert isinstance(picture.content[0], sm.ImageContent)
    assert picture.content[0].mime_type == "image/png"
    weather = call("weather", city="Oslo")
    assert '"celsius": 21' in weather.content[0].text  # type: ignore[union-attr]
    big = call("big", n=250)
    texts = [b.text for b in big.content if isinstance(b, sm.TextContent)]
    assert texts == ["x" * 200, "[50 more characters cut: max_output_chars=200]"]


@pytest.mark.timeout(60)
def test_a_run_with_parallel_mcp_calls_keeps_every_invariant(shared: Shared) -> None:
    model = ScriptedModel(
        _calls(("add", {"a": 1, "b": 2}), ("echo", {"text": "parallel"}), ("boom", {})),
        _calls(("add", {"a": "not a number", "b": 1}), ("nope", {})),
        _done(),
    )
    before = len(shared.lines())
    result = shared.run(
        sm.run_agent(model=model, tools=shared.server.tools, messages=[sm.UserMessage("go")])
    )
    assert result.state is sm.TurnState.DONE, result.explanation
    assert history_violations(result.messages) == []
    results = _results(result.messages)
    assert [r.is_error for r in results] == [False, False, True, True, True]
    assert results[0].text == "3"
    assert results[1].text == "parallel"
    # the call with invalid arguments never reached the server, nor the unknown tool
    assert sorted(shared.lines()[before:]) == ["add 1 2", "echo parallel"]
    # the results went back to the model
    assert model.contexts[1][-3:] == list(result.messages[2:5])


@pytest.mark.timeout(60)
def test_abort_cancels_a_hanging_call_on_the_server(shared: Shared) -> None:
    model = ScriptedModel(_calls(("hang", {"label": "A"}), ("echo", {"text": "fast"})), _done())

    async def go() -> tuple[sm.RunResult, float]:
        run = sm.AgentRun(model=model, tools=shared.server.tools, messages=[sm.UserMessage("go")])
        events = run.events()
        task = asyncio.create_task(run.run())
        async for event in events:  # abort once the echo has its result
            if isinstance(event, sm.ToolEnded) and event.call.name == "echo":
                break
        await _until(lambda: "hang started A" in shared.lines())
        started = time.monotonic()
        run.abort("user pressed stop")
        result = await task
        return result, time.monotonic() - started

    result, elapsed = shared.run(go())
    shared.run(_until(lambda: "hang cancelled A" in shared.lines()))
    assert result.state is sm.TurnState.ABORTED
    assert elapsed < 1.0  # cancelled at once, not after the grace period
    assert history_violations(result.messages) == []
    hang, echo = _results(result.messages)
    assert hang.is_error
    assert hang.text.startswith("Operation aborted")
    assert "notifications/cancelled" in hang.text
    assert echo.text == "fast"
    assert not echo.is_error


@pytest.mark.timeout(60)
def test_a_call_past_its_deadline_is_answered_timed_out(shared: Shared) -> None:
    hang = attrs.evolve(_tool(shared, "hang"), timeout=0.3)
    model = ScriptedModel(_calls(("hang", {"label": "T"})), _done())
    result = shared.run(
        sm.run_agent(model=model, tools=[hang], messages=[sm.UserMessage("go")], grace_period=0.2)
    )
    (answer,) = _results(result.messages)
    assert answer.is_error
    assert "timed out" in answer.text
    assert result.state is sm.TurnState.DONE
    shared.run(_until(lambda: "hang cancelled T" in shared.lines()))


@pytest.mark.timeout(60)
@_sync
async def test_a_crashing_server_answers_the_call_with_an_error(tmp_path: Path) -> None:
    model = ScriptedModel(_calls(("crash", {})), _done())
    async with _stdio(tmp_path / "log", call_timeout=20) as server:
        started = time.monotonic()
        result = await sm.run_agent(
            model=model, tools=server.tools, messages=[sm.UserMessage("go")]
        )
    assert time.monotonic() - started < 15
    (crash,) = _results(result.messages)
    assert crash.is_error
    assert result.state is sm.TurnState.DONE
    assert history_violations(result.messages) == []


@pytest.mark.timeout(60)
@_sync
async def test_the_stdio_server_is_reaped_on_exit(tmp_path: Path) -> None:
    probe = tmp_path / "pid.py"
    probe.write_text(
        "import os, runpy, sys\n"
        f"open({str(tmp_path / 'pid')!r}, 'w').write(str(os.getpid()))\n"
        f"sys.argv = [{str(SERVER)!r}, 'stdio']\n"
        f"runpy.run_path({str(SERVER)!r}, run_name='__main__')\n",
        encoding="utf-8",
    )
    async with MCPServer.stdio(sys.executable, [str(probe)], stderr=DEVNULL) as server:
        assert server.tools
        pid = int((tmp_path / "pid").read_text())
        os.kill(pid, 0)  # alive
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.timeout(60)
@_sync
async def test_a_server_that_never_answers_fails_to_connect_in_time() -> None:
    silent = MCPServer.stdio(
        sys.executable, ["-c", "import time; time.sleep(60)"], connect_timeout=1.0
    )
    started = time.monotonic()
    with pytest.raises(MCPError, match=r"did not answer within 1.0 s \(connect_timeout\)"):
        async with silent:
            pass
    assert time.monotonic() - started < 10


@pytest.mark.timeout(60)
@_sync
async def test_a_command_that_does_not_exist_is_a_clear_error() -> None:
    with pytest.raises(MCPError, match="could not be reached"):
        async with MCPServer.stdio("/nonexistent/mcp-server"):
            pass


@pytest.mark.timeout(60)
@_sync
async def test_a_server_that_cannot_start_is_an_error_quoting_its_stderr(tmp_path: Path) -> None:
    missing = tmp_path / "no_such_server.py"
    passed_on = io.StringIO()
    with pytest.raises(MCPError) as caught:
        async with MCPServer.stdio(sys.executable, [str(missing)], stderr=passed_on):
            pass
    text = str(caught.value)
    assert "could not be reached" in text
    assert "its stderr:\n" in text
    assert "can't open file" in text
    assert str(missing) in text
    assert "TaskGroup" not in text
    assert "can't open file" in passed_on.getvalue()  # still where the stderr goes


@pytest.mark.timeout(60)
@_sync
async def test_the_stderr_an_error_quotes_is_its_bounded_end() -> None:
    noisy = (
        "import sys; out = sys.stderr.buffer; out.write(b'x' * 50000); "
        "out.write(b'\\xff\\xfe broken bytes; THE END'); out.flush(); sys.exit(3)"
    )
    with pytest.raises(MCPError) as caught:
        async with MCPServer.stdio(sys.executable, ["-c", noisy], stderr=DEVNULL):
            pass
    text = str(caught.value)
    assert f"its stderr ends with (the last {MAX_STDERR_CHARS} characters):\n" in text
    assert text.endswith("\ufffd\ufffd broken bytes; THE END")
    assert "x" * (MAX_STDERR_CHARS + 1) not in text
    assert len(text) < MAX_STDERR_CHARS + 300


@pytest.mark.timeout(60)
@_sync
async def test_a_server_that_never_answers_is_an_error_quoting_its_stderr() -> None:
    stuck = (
        "import sys, time; print('loading the index', file=sys.stderr, flush=True); time.sleep(60)"
    )
    silent = MCPServer.stdio(sys.executable, ["-c", stuck], connect_timeout=3.0, stderr=DEVNULL)
    with pytest.raises(MCPError) as caught:
        async with silent:
            pass
    text = str(caught.value)
    assert "did not answer within 3.0 s (connect_timeout)" in text
    assert text.endswith("its stderr:\nloading the index")


@pytest.mark.timeout(60)
@_sync
async def test_a_server_that_starts_passes_its_stderr_on_as_it_goes() -> None:
    passed_on = io.StringIO()
    chatty = MCPServer.stdio(
        sys.executable,
        [
            "-c",
            "import sys, runpy; print('starting', file=sys.stderr, flush=True); "
            f"sys.argv = [{str(SERVER)!r}, 'stdio']; "
            f"runpy.run_path({str(SERVER)!r}, run_name='__main__')",
        ],
        stderr=passed_on,
    )
    async with chatty as server:
        assert server.tools
    assert "starting" in passed_on.getvalue()


@pytest.mark.timeout(60)
@_sync
async def test_a_tool_the_library_cannot_use_is_refused_at_connect() -> None:
    bad = MCPServer.stdio(
        sys.executable,
        [str(SERVER), "stdio"],
        env={"MCP_TEST_BAD_TOOL": "1"},
        name="bad-server",
        stderr=DEVNULL,
    )
    with pytest.raises(sm.InvalidInputError, match=r"'bad-server': its tool 'has\.dot'"):
        async with bad:
            pass


def test_bad_options_are_refused() -> None:
    with pytest.raises(sm.InvalidInputError, match="call_timeout"):
        MCPServer.http("http://127.0.0.1:1/mcp", call_timeout=0)
    with pytest.raises(sm.InvalidInputError, match="max_output_chars"):
        MCPServer.http("http://127.0.0.1:1/mcp", max_output_chars=0)


@pytest.mark.timeout(60)
def test_without_the_sdk_the_import_says_which_extra_to_install() -> None:
    code = "import sys; sys.modules['mcp'] = None; import statemachine.mcp"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert proc.returncode == 1
    assert "pip install 'agent-statemachine[mcp]'" in proc.stderr.splitlines()[-1]


# -- streamable HTTP --------------------------------------------------------------------------


@attrs.frozen
class HttpServer:
    url: str
    log: Path
    process: subprocess.Popen[bytes]

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(10)


@contextlib.contextmanager
def serving_http(
    script: Path, env: dict[str, str]
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``script http PORT`` started on a free port of 127.0.0.1 (with ``env`` added),
    its URL once it accepts connections; killed at the end."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, str(script), "http", str(port)],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                break
            assert proc.poll() is None, "the server exited"
            assert time.monotonic() < deadline, "the server did not start in time"
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp", proc
    finally:
        proc.kill()
        proc.wait(10)


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[HttpServer]:
    log = tmp_path / "log"
    with serving_http(SERVER, {"MCP_TEST_LOG": str(log)}) as (url, proc):
        yield HttpServer(url, log, proc)


@pytest.mark.timeout(60)
@_sync
async def test_http_tools_run_and_abort_cancels_on_the_server(http_server: HttpServer) -> None:
    url, log = http_server.url, http_server.log
    model = ScriptedModel(_calls(("add", {"a": 40, "b": 2}), ("hang", {"label": "H"})), _done())
    async with MCPServer.http(url, headers={"X-Test": "1"}) as server:
        run = sm.AgentRun(model=model, tools=server.tools, messages=[sm.UserMessage("go")])
        events = run.events()
        task = asyncio.create_task(run.run())
        async for event in events:  # abort once the add has its result
            if isinstance(event, sm.ToolEnded) and event.call.name == "add":
                break
        await _until(lambda: log.exists() and "hang started H" in log.read_text("utf-8"))
        run.abort()
        result = await task
        await _until(lambda: "hang cancelled H" in log.read_text("utf-8"))
    assert result.state is sm.TurnState.ABORTED
    add, hang = _results(result.messages)
    assert add.text == "42"
    assert hang.is_error
    assert hang.text.startswith("Operation aborted")
    assert history_violations(result.messages) == []


@pytest.mark.timeout(60)
@_sync
async def test_an_http_server_that_is_not_there_is_a_clear_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(MCPError, match=rf"127\.0\.0\.1:{port}/mcp' could not be reached"):
        async with MCPServer.http(f"http://127.0.0.1:{port}/mcp", connect_timeout=5):
            pass


# -- the properties over runs that use MCP tools ---------------------------------------------

CALLS = st.sampled_from(["add", "echo", "boom", "add_bad", "missing", "hang"])
ARGUMENTS: dict[str, dict[str, Any]] = {
    "add": {"a": 1, "b": 2},
    "echo": {"text": "x"},
    "boom": {},
    "add_bad": {"a": "bad"},
    "missing": {},
}
GRACE = 2.0
_labels = itertools.count()


def _check_run(shared: Shared, turns: list[list[str]]) -> None:
    """Run the turns on the shared server and check what every run must show.

    I1/I2: one result per call, in call order, the history valid. I3/I4: ``Done``
    when nothing hangs. I6: a run with a hanging call is ended by abort at once (well
    within the grace period: the request is cancelled, not waited for), and every hang
    that started on the server was cancelled there.
    """
    labels: list[str] = []

    def call(name: str) -> tuple[str, dict[str, Any]]:
        if name == "hang":
            labels.append(f"P{next(_labels)}")
            return "hang", {"label": labels[-1]}
        return ("add" if name == "add_bad" else name), ARGUMENTS[name]

    model = ScriptedModel(*[_calls(*map(call, turn)) for turn in turns], _done())

    async def go() -> tuple[sm.RunResult, float]:
        run = sm.AgentRun(
            model=model,
            tools=shared.server.tools,
            messages=[sm.UserMessage("go")],
            max_turns=10,
            grace_period=GRACE,
        )
        aborted_at: list[float] = []

        def abort() -> None:
            aborted_at.append(time.monotonic())
            run.abort("stop")

        if labels:  # a hang only ends by abort: abort once the run is waiting on it
            asyncio.get_running_loop().call_later(0.3, abort)
        result = await run.run()
        return result, time.monotonic() - (aborted_at[0] if aborted_at else time.monotonic())

    result, after_abort = shared.run(go())
    assert history_violations(result.messages) == []
    expected_state = sm.TurnState.ABORTED if labels else sm.TurnState.DONE
    assert result.state is expected_state, result.explanation
    calls = [c for m in result.messages if isinstance(m, sm.AssistantMessage) for c in m.tool_calls]
    assert [r.tool_call_id for r in _results(result.messages)] == [c.id for c in calls]
    assert after_abort < GRACE / 2, f"the abort took {after_abort:.2f} s to end the run"
    for label in labels:
        if f"hang started {label}" in shared.lines():
            done = f"hang cancelled {label}"
            shared.run(_until(lambda done=done: done in shared.lines(), 10))  # type: ignore[misc]


@pytest.mark.timeout(240)
@settings(max_examples=25)
@given(turns=st.lists(st.lists(CALLS, min_size=1, max_size=3), min_size=1, max_size=3))
def test_every_call_has_one_result_in_order_and_aborts_end_runs(
    shared: Shared, turns: list[list[str]]
) -> None:
    _check_run(shared, turns)


@pytest.mark.timeout(60)
def test_the_property_catches_an_adapter_that_ignores_abort(
    shared: Shared, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def deaf(self: MCPServer, remote: str, arguments: dict[str, Any], signal: Any) -> Any:
        assert self._client is not None
        return self._output(await self._client.call_tool(remote, arguments))

    monkeypatch.setattr(MCPServer, "_call", deaf)
    with pytest.raises(AssertionError, match="the abort took"):
        _check_run(shared, [["echo", "hang"]])


async def _until(condition: Callable[[], bool], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.02)

"""A scripted HTTP server on 127.0.0.1 that replays recorded provider responses.

The provider tests run the real SDKs against it: each test queues the replies it
wants (a JSON error with its status and headers, or a recorded server-sent-event
stream, optionally cut into small byte pieces so that SSE lines arrive split), and
afterwards reads every request the server received, to check the projection.

A reply can ``hold`` the connection open after its bytes, as a slow model does,
``repeat`` its body until the client goes away (a stream that never ends), or wait
``delay`` seconds between pieces (a slow drip); ``respond`` builds the body from the
request (to echo what the client sent, e.g. its key). ``close()`` releases every held
connection, so a test never hangs on teardown.

``FAST``, ``LIST``, ``READ``, ``complete``, ``abort_in_backoff`` and
``run_on_workspace`` are what the tests of both adapters share: a quick retry policy,
two tool definitions, one model call, an abort while the adapter waits to retry, and a
whole run on a small workspace.

``provider_histories()`` generates the histories the projection property tests feed
to both adapters: every stop reason, odd and over-long tool-call ids, thinking with
and without signatures, empty texts, images, and user messages between results.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal

import attrs
from hypothesis import strategies as st

import statemachine as sm
import statemachine.messages
from statemachine.core.invariants import history_violations
from statemachine.core.messages import AssistantContent
from statemachine.providers import RetryPolicy
from statemachine.testing import check_transcript
from statemachine.workspace import workspace_tools

FIXTURES = Path(__file__).parent / "fixtures" / "providers"


def fixture_text(name: str) -> str:
    """A fixture file's text, by its path under ``tests/fixtures/providers``."""
    return (FIXTURES / name).read_text(encoding="utf-8")


@attrs.frozen
class Reply:
    """One scripted response."""

    status: int = 200
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""
    piece_size: int = 0  # >0: write the body in pieces of this many bytes, flushing each
    hold: bool = False  # keep the connection open after the body until close()
    stall: bool = False  # send nothing at all, not even the status, until close()
    repeat: bool = False  # send the body again and again until the client goes away
    delay: float = 0.0  # seconds between pieces
    respond: Callable[[Request], bytes] | None = None  # the body, from the request


def sse(name: str, *, piece_size: int = 0, hold: bool = False) -> Reply:
    """A recorded event stream from a fixture file."""
    return Reply(
        200,
        (("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache")),
        fixture_text(name).encode("utf-8"),
        piece_size,
        hold,
    )


def error(status: int, name: str, headers: dict[str, str] | None = None) -> Reply:
    """A recorded JSON error body with its status (and e.g. retry-after headers)."""
    return Reply(
        status,
        (("Content-Type", "application/json"), *(headers or {}).items()),
        fixture_text(name).encode("utf-8"),
    )


@attrs.frozen
class Request:
    """One request as the server received it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class LoopbackServer:
    """Use as ``with LoopbackServer() as server``; ``server.url`` is the base URL."""

    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.requests: list[Request] = []
        self.released = threading.Event()
        self.holding = threading.Event()  # set once a held reply has written its bytes
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.02,), daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def add(self, *replies: Reply) -> None:
        with self._lock:
            self.replies.extend(replies)

    def bodies(self) -> list[Any]:
        """The JSON bodies of every request, in order."""
        return [r.json() for r in self.requests]

    def __enter__(self) -> LoopbackServer:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self.released.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)

    def _next(self, request: Request) -> Reply:
        with self._lock:
            self.requests.append(request)
            if self.replies:
                return self.replies.popleft()
        body = {"error": {"type": "test_error", "message": "no scripted reply left"}}
        return Reply(418, (("Content-Type", "application/json"),), json.dumps(body).encode())

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep test output clean

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                headers = {k.lower(): v for k, v in self.headers.items()}
                request = Request("POST", self.path, headers, body)
                reply = server._next(request)
                if reply.stall:
                    server.holding.set()
                    server.released.wait(timeout=30)
                    return
                body = reply.respond(request) if reply.respond else reply.body
                self.send_response(reply.status)
                for name, value in reply.headers:
                    self.send_header(name, value)
                streamed = reply.hold or reply.repeat or reply.piece_size or reply.delay
                if not streamed:
                    self.send_header("Content-Length", str(len(body)))
                self.send_header("Connection", "close")
                self.end_headers()
                try:
                    while True:
                        for piece in _pieces(body, reply.piece_size):
                            if server.released.is_set():
                                return
                            self.wfile.write(piece)
                            self.wfile.flush()
                            if reply.delay:
                                time.sleep(reply.delay)
                        if not reply.repeat:
                            break
                    if reply.hold:
                        server.holding.set()
                        server.released.wait(timeout=30)
                except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
                    pass  # the client went away (an abort): that is the point of some tests

        return Handler


def _pieces(body: bytes, size: int) -> Iterator[bytes]:
    if size <= 0:
        yield body
        return
    for start in range(0, len(body), size):
        yield body[start : start + size]


class Sleeps:
    """An injectable ``sleep`` that records each requested delay and returns at once,
    or, with ``block=True``, never returns (to abort during a backoff)."""

    def __init__(self, *, block: bool = False) -> None:
        self.delays: list[float] = []
        self.block = block
        self.started = threading.Event()

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        self.started.set()
        if self.block:
            await asyncio.Event().wait()


# -- what the tests of both adapters share ----------------------------------------------


class Log:
    """A structlog-shaped logger that keeps what it is given, as ``(event, fields)``."""

    def __init__(self) -> None:
        self.entries: list[tuple[str, dict[str, Any]]] = []

    def debug(self, event: str, **fields: Any) -> None:
        self.entries.append((event, fields))

    info = warning = error = debug


FAST = RetryPolicy(max_attempts=3, initial_delay=0.5, multiplier=2.0, jitter=0.0)

LIST = sm.ToolDefinition(
    "list_files",
    "List a directory.",
    {"type": "object", "properties": {"path": {"type": "string"}}, "additionalProperties": False},
)
READ = sm.ToolDefinition(
    "read_file",
    "Read a file.",
    {
        "type": "object",
        "properties": {"path": {"type": "string"}, "note": {"type": "string"}},
        "required": ["path"],
        "additionalProperties": False,
    },
)


def complete(
    model: sm.ModelClient,
    messages: Sequence[sm.Message] | None = None,
    tools: tuple[sm.ToolDefinition, ...] = (),
    signal: sm.AbortSignal | None = None,
) -> sm.AssistantMessage:
    """One call of ``model`` (default history: the user asks to list the files)."""
    history = messages if messages is not None else [sm.UserMessage("list the files")]
    return asyncio.run(model.complete(history, tools, signal or sm.AbortController().signal))


TEXT_PIECES = ["The work", "space contains ", "README.md", " and src/", "index.ts."]
"""The pieces of the text stream every adapter's shared tests use."""
TEXT_REPLY = sm.AssistantMessage(
    "The workspace contains README.md and src/index.ts.",
    usage=sm.messages.Usage(input=412, output=19, total_tokens=431),
)
"""The reply that text stream makes."""


def options_run(model: sm.ModelClient, **kw: Any) -> tuple[sm.RunResult, list[sm.RunEvent]]:
    """A run of ``model`` on "list the files" with the run options ``kw``: its result
    and every event it sent."""

    async def main() -> tuple[sm.RunResult, list[sm.RunEvent]]:
        run = sm.AgentRun(model=model, messages="list the files", **kw)
        events = run.events()
        result = await run.run()
        return result, [e async for e in events]

    return asyncio.run(main())


def assert_text_deltas(result: sm.RunResult, events: Sequence[sm.RunEvent]) -> None:
    """The run's text deltas are the shared stream's pieces, and make its final text."""
    texts = [e.text for e in events if isinstance(e, sm.TextDelta)]
    assert texts == TEXT_PIECES
    assert "".join(texts) == result.final_text


def abort_in_backoff(
    make_model: Callable[[Sleeps], sm.ModelClient],
) -> tuple[sm.AssistantMessage, Sleeps]:
    """A call aborted while the adapter waits to retry (its backoff never ends alone)."""
    sleeps = Sleeps(block=True)
    controller = sm.AbortController()

    async def main() -> sm.AssistantMessage:
        model = make_model(sleeps)
        task = asyncio.ensure_future(model.complete([sm.UserMessage("go")], (), controller.signal))
        while not sleeps.started.is_set():
            await asyncio.sleep(0.01)
        controller.abort()
        return await task

    return asyncio.run(main()), sleeps


def run_on_workspace(
    model: sm.ModelClient, root: Path, server: LoopbackServer, wire: Literal["openai", "anthropic"]
) -> sm.RunResult:
    """A whole run with the workspace tools on a README and ``src/index.ts``: it ends
    ``Done`` after 3 model calls, and every history, ours and each request's, is valid."""
    (root / "README.md").write_text("# Demo\n")
    (root / "src").mkdir()
    (root / "src" / "index.ts").write_text("export {}\n")
    result = sm.run_agent_sync(
        model=model,
        tools=workspace_tools(root),
        messages=[sm.UserMessage("list the files")],
        max_turns=5,
    )
    assert result.state is sm.TurnState.DONE
    assert result.turns == 3
    assert history_violations(result.messages) == []
    assert check_transcript(result.messages) == []
    for body in server.bodies():
        assert check_transcript(body["messages"], wire) == []
    return result


_TEXT = st.text(max_size=12)
_RAW_IDS = st.one_of(
    st.from_regex(r"call_[A-Za-z0-9]{1,8}", fullmatch=True),
    st.text(min_size=1, max_size=90),  # any characters, often too long for OpenAI
)


@st.composite
def _result(draw: st.DrawFn, call: sm.ToolCall) -> sm.ToolResultMessage:
    blocks: list[sm.TextContent | sm.ImageContent] = [
        sm.TextContent(t) for t in draw(st.lists(_TEXT, max_size=2))
    ]
    if draw(st.booleans()):
        blocks.append(sm.ImageContent("iVBORw0KGgo=", "image/png"))
    return sm.ToolResultMessage(call.id, call.name, tuple(blocks), is_error=draw(st.booleans()))


@st.composite
def provider_histories(draw: st.DrawFn) -> list[sm.Message]:
    """A valid history (I1 and I2 hold) with everything a projection must handle."""
    messages: list[sm.Message] = [sm.UserMessage(draw(_TEXT))]
    used: set[str] = set()
    for turn in range(draw(st.integers(1, 4))):
        content: list[AssistantContent] = []
        if draw(st.booleans()):
            signature = draw(st.one_of(st.none(), st.just("c2lnbmF0dXJl")))
            content.append(sm.messages.ThinkingContent(draw(_TEXT), signature))
        if draw(st.booleans()):
            content.append(sm.TextContent(draw(_TEXT)))
        calls = []
        for index in range(draw(st.integers(0, 3))):
            raw = draw(_RAW_IDS)
            if raw in used:
                raw = f"{raw}#{turn}.{index}"  # ids are unique in a valid history
            used.add(raw)
            name = draw(st.sampled_from(["read_file", "list_files"]))
            calls.append(sm.ToolCall(raw, name, {"path": draw(_TEXT)}))
        content.extend(calls)
        stop = draw(st.sampled_from(list(sm.messages.StopReason)))
        messages.append(sm.AssistantMessage(tuple(content), stop_reason=stop))
        between: list[sm.Message] = [draw(_result(call)) for call in calls]
        interleave = draw(st.booleans())
        if between and interleave:
            at = draw(st.integers(0, len(between) - 1))
            between.insert(at, sm.UserMessage(draw(_TEXT)))
        messages.extend(between)
        if draw(st.booleans()):
            messages.append(sm.UserMessage(draw(_TEXT)))
    assert history_violations(messages) == []
    return messages

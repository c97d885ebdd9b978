"""Helpers of the live server's tests: a model that streams at the test's pace, the
server on a real uvicorn in a thread, and an HTTP client that reads its event streams."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

import attrs
import httpx2
from ag_ui_validate.transport import TransportOptions, TransportResponseLike, validate_endpoint
from ag_ui_validate.types import Report

import statemachine as sm
from statemachine.agent.model import CallOptions
from statemachine.core.messages import AssistantMessage, StopReason, ToolCall
from statemachine.live import LiveApp, running

TOKEN = "a-token-for-the-live-tests-0123456789"
DEADLINE = 60.0


@attrs.frozen
class Wait:
    """Wait until the test sets ``gate``."""

    gate: threading.Event


@attrs.frozen
class Say:
    """Stream ``text`` (one fragment)."""

    text: str


@attrs.frozen
class Call:
    """Stream a tool call."""

    id: str
    name: str
    arguments: Mapping[str, Any]


Step = Wait | Say | Call


class PacedModel:
    """A fake model that streams each answer step by step, waiting on the test's gates
    between steps: a page can be looked at in the middle of a response."""

    def __init__(self, *turns: Sequence[Step]) -> None:
        self.turns = list(turns)
        self.calls = 0

    async def complete(
        self, messages: object, tools: object, signal: object, *, options: CallOptions | None = None
    ) -> AssistantMessage:
        steps = self.turns[min(self.calls, len(self.turns) - 1)]
        self.calls += 1
        content: list[Any] = []
        for step in steps:
            if isinstance(step, Wait):
                await wait_for(step.gate)
            elif isinstance(step, Say):
                if options is not None and options.on_text is not None:
                    options.on_text(step.text)
                content.append(sm.TextContent(step.text))
            else:
                if options is not None and options.on_tool_call_delta is not None:
                    index = sum(isinstance(b, ToolCall) for b in content)
                    arguments = json.dumps(dict(step.arguments))
                    options.on_tool_call_delta(index, step.id, step.name, arguments)
                content.append(ToolCall(step.id, step.name, dict(step.arguments)))
        text = "".join(b.text for b in content if isinstance(b, sm.TextContent))
        calls = [b for b in content if isinstance(b, ToolCall)]
        merged = ([sm.TextContent(text)] if text else []) + calls
        return AssistantMessage(merged, stop_reason=StopReason.TOOL_USE if calls else "stop")


async def wait_for(gate: threading.Event) -> None:
    """Wait on the event loop until another thread sets ``gate`` (bounded)."""
    deadline = time.monotonic() + DEADLINE
    while not gate.is_set():
        if time.monotonic() > deadline:
            raise TimeoutError("the test never opened the gate")
        await asyncio.sleep(0.01)


@contextlib.contextmanager
def live_server(app: LiveApp) -> Iterator[str]:
    """``app`` served by uvicorn on 127.0.0.1 (a free port), in a thread with its own
    event loop; yields its address."""
    ready = threading.Event()
    found: list[Any] = []
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    async def main() -> None:
        async with running(app) as url:
            found.append(url)
            ready.set()
            await stop.wait()

    def thread() -> None:
        try:
            loop.run_until_complete(main())
        except BaseException as exc:
            found.append(exc)
            ready.set()
        finally:
            loop.close()

    worker = threading.Thread(target=thread, name="live-server", daemon=True)
    worker.start()
    assert ready.wait(DEADLINE), "the live server did not start"
    if isinstance(found[0], BaseException):
        raise found[0]
    try:
        yield str(found[0])
    finally:
        loop.call_soon_threadsafe(stop.set)
        worker.join(DEADLINE)
        assert not worker.is_alive(), "the live server did not stop"


def auth(token: str = TOKEN) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def run_input(run_id: str, prompt: str = "go", thread_id: str = "thread-1") -> dict[str, Any]:
    """An AG-UI ``RunAgentInput`` with one user message."""
    return {
        "threadId": thread_id,
        "runId": run_id,
        "messages": [{"id": f"{run_id}-u", "role": "user", "content": prompt}],
        "tools": [],
        "context": [],
        "state": {},
        "forwardedProps": {},
    }


def sse_events(text: str) -> list[dict[str, Any]]:
    """The JSON events of a server-sent event stream's text."""
    events = []
    for frame in text.split("\n\n"):
        data = [line[5:].lstrip() for line in frame.split("\n") if line.startswith("data:")]
        if data:
            events.append(json.loads("\n".join(data)))
    return events


def read_stream(
    url: str, method: str = "GET", body: Any = None, headers: Mapping[str, str] | None = None
) -> tuple[int, list[dict[str, Any]]]:
    """Read a whole event stream: the status and its events."""
    with (
        httpx2.Client(timeout=DEADLINE) as client,
        client.stream(method, url, json=body, headers=dict(headers or auth())) as response,
    ):
        text = "".join(response.iter_text())
        return response.status_code, sse_events(text) if response.status_code == 200 else []


class StreamReader:
    """An event stream read in a thread, so that a test can look at it as it grows."""

    def __init__(
        self,
        url: str,
        method: str = "GET",
        body: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.events: list[dict[str, Any]] = []
        self.status = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(
            target=self._read, args=(url, method, body, dict(headers or auth())), daemon=True
        )
        self._thread.start()

    def _read(self, url: str, method: str, body: Any, headers: dict[str, str]) -> None:
        with (
            httpx2.Client(timeout=DEADLINE) as client,
            client.stream(method, url, json=body, headers=headers) as response,
        ):
            self.status = response.status_code
            buffer = ""
            for chunk in response.iter_text():
                buffer += chunk
                *frames, buffer = buffer.split("\n\n")
                with self._lock:
                    self.events += sse_events("\n\n".join(frames) + "\n\n")

    def types(self) -> list[str]:
        with self._lock:
            return [e["type"] for e in self.events]

    def wait_until(self, what: str, check: Any) -> None:
        deadline = time.monotonic() + DEADLINE
        while not check(self):
            assert time.monotonic() < deadline, f"the stream never showed {what}: {self.types()}"
            time.sleep(0.02)

    def join(self) -> list[dict[str, Any]]:
        self._thread.join(DEADLINE)
        assert not self._thread.is_alive(), "the stream did not end"
        return self.events


async def _fetch(
    url: str, *, method: str, headers: dict[str, str], body: bytes | None, timeout_s: float | None
) -> TransportResponseLike:
    """ag-ui-validate's fetch, on the project's HTTP client (its default needs httpx)."""
    client = httpx2.AsyncClient(timeout=timeout_s)
    request = client.build_request(method, url, headers=headers, content=body)
    response = await client.send(request, stream=True)

    async def chunks() -> AsyncIterator[bytes]:
        try:
            async for chunk in response.aiter_bytes():
                yield chunk
        finally:
            await response.aclose()
            await client.aclose()

    return TransportResponseLike(
        status=response.status_code, headers=response.headers, body=chunks()
    )


def validate_live(url: str, body: Mapping[str, Any], token: str = TOKEN) -> Report:
    """ag-ui-validate's report on the stream that posting ``body`` to ``url`` answers."""
    options = TransportOptions(
        headers=auth(token), input=dict(body), fetch_impl=_fetch, timeout_ms=int(DEADLINE * 1000)
    )
    return asyncio.run(validate_endpoint(url, options)).report


def findings(report: Report) -> list[str]:
    """The report's errors and warnings, one line each."""
    return [
        f"{d.rule} {d.severity}: {d.message}"
        for d in report.diagnostics
        if d.severity in ("error", "warning")
    ]

"""The live server: an ASGI app that starts runs of one agent and streams their events.

``LiveApp(agent)`` is a plain ASGI application. Its routes:

=========================  ===================================================================
``GET /``                  the page that shows a run live (``statemachine.live._page``)
``POST /``                 an AG-UI ``RunAgentInput``: starts a run, answers with its events
``GET /runs``              the runs held, as JSON
``GET /runs/ID/events``    watch run ``ID``: its AG-UI events as server-sent events
``POST /runs/ID/steer``    ``{"message": "..."}``: queue a message for the next turn
``POST /runs/ID/abort``    abort the run
``POST /runs/ID/answer``   ``{"question": "q1", "answer": {...}}`` (or ``"decline"``,
                           ``"cancel"``): answer a question a running tool asks
``POST /runs/ID/approve``  ``{"approvals": {"CALL_ID": true}}``: resume a run that waits
                           for approvals (also: a ``RunAgentInput`` whose ``resume``
                           answers the run's interrupts)
=========================  ===================================================================

It is a door into running agents, so it is shut by default. Every request passes one
gate (``_refusal``) before any route sees it, in this order:

1. the ``Host`` header must name this server (loopback names, or the host it was bound
   to): a page from a name that merely resolves here (DNS rebinding) is refused;
2. a browser's request from another origin is refused: an ``Origin`` header that is
   not this server's, or ``Sec-Fetch-Site`` other than ``same-origin`` or ``none``.
   No CORS header is ever sent, so no other origin may read an answer either;
3. the access token, on every request, watching included: ``Authorization: Bearer
   TOKEN``; the page alone is also opened as ``GET /?token=TOKEN``, and its script sends
   the token it finds in its address as that header. Compared in constant time. Never a
   cookie: a browser hands a cookie of 127.0.0.1 to every server of 127.0.0.1,
   whatever its port, so any local server the browser visits would get the token;
4. a body is JSON (``Content-Type: application/json``, which a page of another origin
   cannot send without a preflight that is refused), at most ``max_body_bytes``, and
   arrives within ``body_seconds``.

Why a plain ASGI callable rather than a framework: seven routes, one gate before all of
them, and one streaming response that must notice a watcher leaving and let go of its
subscription in every case. Routing and reading a request are a few lines here; a
framework's middleware and streaming response would be one more thing to audit for
the refusals above. The server is uvicorn (``serve``, ``running``).

Bounded: at most ``max_runs`` runs are held (a returned run is dropped, oldest first,
to make room for a new one; when every held run is still running, a new one is
refused with 429) and at most ``max_watchers`` event streams are open at once (429
past it). A watcher never holds a run up: each has its own subscription of at most
``max_buffered`` unread events (``AgentRun.events``), past which the run drops its
progress events for that watcher and the watcher gets ``statemachine.eventsDropped``.

Nothing secret leaves: the token never appears in a page or an event, and every
event is scrubbed of the token and of the values of the process's environment
variables named like secrets (``*_API_KEY``, ``*_TOKEN``, ``*_SECRET``, ``*_PASSWORD``)
before it is sent, whatever a tool returned.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hmac
import ipaddress
import json
import os
import re
import secrets
from collections.abc import AsyncIterator, Mapping
from typing import Any, Final
from urllib.parse import urlsplit

from ag_ui.core import BaseEvent, RunAgentInput
from pydantic import ValidationError

from statemachine.agent.agent import Agent, AgentRunKeywords
from statemachine.agent.events import RunEvent, RunReturned
from statemachine.agent.resume import resume_run
from statemachine.agent.run import AgentRun
from statemachine.errors import InvalidInputError, NotPendingError, UsageError
from statemachine.live._agui import AguiStream, library_messages, run_end
from statemachine.live._http import (
    PAGE_HEADERS,
    STREAM_HEADERS,
    Receive,
    Scope,
    Send,
    disconnected,
    headers_of,
    query,
    respond,
    send_body,
    send_json,
)
from statemachine.live._page import page_html

__all__ = [
    "DEFAULT_BODY_SECONDS",
    "DEFAULT_KEEPALIVE_SECONDS",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_BUFFERED",
    "DEFAULT_MAX_RUNS",
    "DEFAULT_MAX_WATCHERS",
    "MIN_TOKEN_LENGTH",
    "LiveApp",
    "is_loopback",
]

DEFAULT_MAX_RUNS: Final = 8
"""Runs a ``LiveApp`` holds at once (running, or returned and still watchable)."""

DEFAULT_MAX_WATCHERS: Final = 32
"""Event streams a ``LiveApp`` keeps open at once (the starters' and the watchers')."""

DEFAULT_MAX_BODY_BYTES: Final = 1024 * 1024
"""The largest request body a ``LiveApp`` reads (a ``RunAgentInput`` with its history)."""

DEFAULT_MAX_BUFFERED: Final = 1000
"""Unread events one watcher may hold before the run drops its progress events for it."""

DEFAULT_KEEPALIVE_SECONDS: Final = 15.0
"""How long an event stream stays silent before a keep-alive comment is sent."""

DEFAULT_BODY_SECONDS: Final = 30.0
"""How long a request body may take to arrive."""

MIN_TOKEN_LENGTH: Final = 16
"""The shortest access token a ``LiveApp`` takes."""

_RUN_ID: Final = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_SECRET_NAME: Final = re.compile(r"(API_?KEY|_TOKEN|_SECRET|SECRET_KEY|_PASSWORD)$", re.I)
_LOOPBACK_NAMES: Final = frozenset({"localhost", "127.0.0.1", "::1"})


def is_loopback(host: str) -> bool:
    """True for a host name or address that only this machine reaches."""
    name = host.strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise InvalidInputError(f"{name} must be a positive number, got {value!r}")


class _HttpError(Exception):
    """A request answered with an error status (never raised out of the app)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason  # the key counted in LiveApp.refused


class _LiveRun:
    """One run the app holds: its handle, its task, and the AG-UI thread it belongs to."""

    def __init__(self, run: AgentRun, thread_id: str) -> None:
        self.run = run
        self.thread_id = thread_id
        self.task: asyncio.Future[Any] | None = None

    @property
    def returned(self) -> bool:
        return self.task is not None and self.task.done()

    def describe(self) -> dict[str, Any]:
        engine = self.run.engine
        return {
            "id": self.run.run_id,
            "threadId": self.thread_id,
            "state": engine.state.value,
            "turns": engine.turns,
            "returned": self.returned,
        }


class LiveApp:
    """The live server's ASGI application for ``agent`` (module docstring).

    ``token``: the access token every request must carry (at least
    ``MIN_TOKEN_LENGTH`` characters); when ``None``, one is made, readable as
    ``app.token`` by the code that built the app (to print the address to open).
    ``deps`` is given to every run. ``hosts``: more names this server answers to
    (the host it is bound to is added by ``serve``). The limits are the module's
    ``DEFAULT_*``. ``refused`` counts the refused requests by reason.
    """

    def __init__(
        self,
        agent: Agent[Any],
        *,
        token: str | None = None,
        deps: object = None,
        hosts: tuple[str, ...] = (),
        max_runs: int = DEFAULT_MAX_RUNS,
        max_watchers: int = DEFAULT_MAX_WATCHERS,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_buffered: int = DEFAULT_MAX_BUFFERED,
        keepalive_seconds: float = DEFAULT_KEEPALIVE_SECONDS,
        body_seconds: float = DEFAULT_BODY_SECONDS,
    ) -> None:
        if not isinstance(agent, Agent):
            raise InvalidInputError("LiveApp serves an Agent (statemachine.Agent)")
        if token is not None and (not isinstance(token, str) or len(token) < MIN_TOKEN_LENGTH):
            raise InvalidInputError(
                f"the access token must be a string of at least {MIN_TOKEN_LENGTH} characters"
            )
        for name, value in (
            ("max_runs", max_runs),
            ("max_watchers", max_watchers),
            ("max_body_bytes", max_body_bytes),
            ("max_buffered", max_buffered),
        ):
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidInputError(f"{name} must be a positive integer, got {value!r}")
            _positive(name, value)
        _positive("keepalive_seconds", keepalive_seconds)
        _positive("body_seconds", body_seconds)
        self.agent = agent
        self.token_given = token is not None
        self.token = token if token is not None else secrets.token_urlsafe(32)
        self.deps = deps
        self.hosts = set(_LOOPBACK_NAMES) | {h.strip("[]").lower() for h in hosts}
        self.max_runs = max_runs
        self.max_watchers = max_watchers
        self.max_body_bytes = max_body_bytes
        self.max_buffered = max_buffered
        self.keepalive_seconds = float(keepalive_seconds)
        self.body_seconds = float(body_seconds)
        self.refused: collections.Counter[str] = collections.Counter()
        self._runs: dict[str, _LiveRun] = {}
        self._watchers = 0
        self._page: str | None = None
        self._secrets = self._secret_texts()

    def __repr__(self) -> str:  # never the token
        return f"LiveApp(agent={self.agent!r}, runs={len(self._runs)})"

    @property
    def runs(self) -> Mapping[str, AgentRun]:
        """The runs held, by id (oldest first)."""
        return {run_id: live.run for run_id, live in self._runs.items()}

    @property
    def watchers(self) -> int:
        """The event streams open now."""
        return self._watchers

    # -- ASGI -------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":  # no websockets
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
            return
        headers = headers_of(scope)
        try:
            self._gate(scope, headers)
            await self._route(scope, headers, receive, send)
        except _HttpError as refused:
            self.refused[refused.reason] += 1
            await send_json(send, refused.status, {"error": str(refused)})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def close(self) -> None:
        """Abort every run still running and wait for each to return (within its
        grace period)."""
        tasks = []
        for live in self._runs.values():
            if live.task is not None and not live.task.done():
                live.run.abort("the live server is shutting down")
                tasks.append(live.task)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # -- the gate -----------------------------------------------------------------------------

    def _gate(self, scope: Scope, headers: Mapping[str, str]) -> None:
        host = headers.get("host", "")
        name = urlsplit(f"//{host}").hostname or ""
        if name.lower() not in self.hosts:
            raise _HttpError(403, "host", "this server does not answer to that host name")
        origin = headers.get("origin")
        if origin is not None:
            parts = urlsplit(origin)
            if parts.scheme not in ("http", "https") or parts.netloc.lower() != host.lower():
                raise _HttpError(403, "origin", "requests from another origin are refused")
        fetch_site = headers.get("sec-fetch-site")
        if fetch_site is not None and fetch_site not in ("same-origin", "none"):
            raise _HttpError(403, "origin", "requests from another site are refused")
        if not self._authorized(scope, headers):
            raise _HttpError(401, "token", "an access token is needed (see the live guide)")

    def _authorized(self, scope: Scope, headers: Mapping[str, str]) -> bool:
        given = None
        authorization = headers.get("authorization", "")
        if authorization[:7].lower() == "bearer ":
            given = authorization[7:].strip()
        elif scope["method"] == "GET" and scope["path"] == "/":
            given = query(scope).get("token")
        if given is None:
            return False
        return hmac.compare_digest(given.encode("utf-8"), self.token.encode("utf-8"))

    async def _body(self, headers: Mapping[str, str], receive: Receive) -> Any:
        kind = headers.get("content-type", "").split(";")[0].strip().lower()
        if kind != "application/json":
            raise _HttpError(415, "content-type", "the body must be application/json")
        length = headers.get("content-length")
        limit = self.max_body_bytes
        if length is not None and (not length.isdigit() or int(length) > limit):
            raise _HttpError(
                413, "body", f"the body is larger than {limit:,} bytes (max_body_bytes)"
            )
        body = bytearray()
        # A body that trickles in holds a connection: it has its own deadline.
        deadline = asyncio.get_running_loop().time() + self.body_seconds
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise _HttpError(
                    408, "body", f"the body took longer than {self.body_seconds:g} s to arrive"
                ) from None
            if message["type"] == "http.disconnect":
                raise _HttpError(400, "body", "the client left before its body arrived")
            body += message.get("body", b"")
            if len(body) > limit:
                raise _HttpError(
                    413, "body", f"the body is larger than {limit:,} bytes (max_body_bytes)"
                )
            if not message.get("more_body", False):
                break
        try:
            return json.loads(body)
        except ValueError:
            raise _HttpError(400, "body", "the body is not valid JSON") from None

    # -- the routes -----------------------------------------------------------------------------

    async def _route(
        self, scope: Scope, headers: Mapping[str, str], receive: Receive, send: Send
    ) -> None:
        method, path = scope["method"], scope["path"]
        if path == "/":
            if method == "GET":
                await self._page_response(send)
            elif method == "POST":
                await self._start(await self._body(headers, receive), scope, receive, send)
            else:
                raise _HttpError(405, "method", "GET or POST")
            return
        if path == "/runs" and method == "GET":
            runs = [live.describe() for live in self._runs.values()]
            await send_json(send, 200, {"runs": runs})
            return
        parts = path.split("/")
        if len(parts) == 4 and parts[1] == "runs" and parts[2] in self._runs:
            live, action = self._runs[parts[2]], parts[3]
            if action == "events" and method == "GET":
                await self._watch(live, receive, send)
                return
            if action in ("steer", "abort", "answer") and method == "POST":
                body = await self._body(headers, receive)
                await self._act(live, action, body, send)
                return
            if action == "approve" and method == "POST":
                body = await self._body(headers, receive)
                approvals = body.get("approvals") if isinstance(body, dict) else None
                await self._resume(live, approvals, receive, send)
                return
        raise _HttpError(404, "route", "no such route or run")

    async def _page_response(self, send: Send) -> None:
        if self._page is None:
            self._page = page_html()
        await respond(send, 200, self._page.encode("utf-8"), PAGE_HEADERS)

    async def _act(self, live: _LiveRun, action: str, body: Any, send: Send) -> None:
        if action == "abort":
            live.run.abort("aborted from the live server")
            await send_json(send, 202, {"run": live.describe()})
            return
        if action == "answer":
            body = body if isinstance(body, dict) else {}
            try:
                live.run.answer(str(body.get("question")), body.get("answer"))
            except NotPendingError as exc:
                raise _HttpError(409, "input", str(exc)) from None
            except InvalidInputError as exc:
                raise _HttpError(422, "input", str(exc)) from None
            await send_json(send, 202, {"run": live.describe()})
            return
        message = body.get("message") if isinstance(body, dict) else None
        if not isinstance(message, str) or not message:
            raise _HttpError(422, "input", 'steer takes {"message": "some text"}')
        try:
            live.run.steer(message)
        except UsageError as exc:
            raise _HttpError(409, "returned", str(exc)) from None
        await send_json(send, 202, {"run": live.describe()})

    async def _start(self, body: Any, scope: Scope, receive: Receive, send: Send) -> None:
        """Start a run and answer with its events. A starter that leaves does not abort
        the run: aborting is an action of its own (``POST /runs/ID/abort``)."""
        try:
            request = RunAgentInput.model_validate(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise _HttpError(
                422, "input", f"not a RunAgentInput: {where}: {first['msg']}"
            ) from None
        if request.resume:
            live, approvals = self._answered(request.thread_id, request.resume)
            await self._resume(live, approvals, receive, send)
            return
        run_id = request.run_id
        if not _RUN_ID.fullmatch(run_id):
            raise _HttpError(422, "input", "runId: 1 to 128 letters, digits or . _ : -")
        if run_id in self._runs:
            raise _HttpError(409, "input", f"a run with id {run_id!r} is held already")
        try:
            messages = library_messages(request.messages)
        except InvalidInputError as exc:
            raise _HttpError(422, "input", str(exc)) from None
        self._make_room()
        if self._watchers >= self.max_watchers:
            raise _HttpError(429, "watchers", f"{self.max_watchers} event streams are open")
        model, options = self.agent._run_options("run", {"deps": self.deps}, AgentRunKeywords)
        try:
            run: AgentRun = AgentRun(model=model, messages=messages, options=options, run_id=run_id)
        except InvalidInputError as exc:
            raise _HttpError(422, "input", str(exc)) from None
        live = _LiveRun(run, request.thread_id)
        self._runs[run_id] = live
        # Subscribed before the run starts, so its stream holds the run from the start.
        await self._watch(live, receive, send, start=True)

    def _answered(self, thread_id: str, answers: list[Any]) -> tuple[_LiveRun, dict[str, bool]]:
        """The held run of ``thread_id`` that waits on the interrupts ``answers`` answer,
        and the approvals they give (``resolved`` approves, unless its payload says
        ``{"approved": false}``; ``cancelled`` denies)."""
        approvals = {}
        for answer in answers:
            payload = answer.payload if isinstance(answer.payload, dict) else {}
            approved = answer.status == "resolved" and payload.get("approved", True) is not False
            approvals[answer.interrupt_id] = approved
        for live in self._runs.values():
            waiting = {c.id for c, _ in live.run.engine.pending_approvals()}
            if live.thread_id == thread_id and live.returned and waiting == set(approvals):
                return live, approvals
        raise _HttpError(409, "input", "no run of this thread waits on exactly those interrupts")

    async def _resume(
        self, live: _LiveRun, approvals: object, receive: Receive, send: Send
    ) -> None:
        """Resume a run that waits for approvals, as a new run under the same id, and
        answer with its events."""
        decided = approvals if isinstance(approvals, dict) else None
        if decided is None or not all(
            isinstance(k, str) and isinstance(v, bool) for k, v in decided.items()
        ):
            raise _HttpError(422, "input", 'approve takes {"approvals": {"CALL_ID": true}}')
        result = live.run.result
        if result is None or not result.pending_approvals:
            raise _HttpError(409, "returned", "the run does not wait for approvals")
        if self._watchers >= self.max_watchers:
            raise _HttpError(429, "watchers", f"{self.max_watchers} event streams are open")
        try:
            model, options = self.agent._run_options("run", {"deps": self.deps}, AgentRunKeywords)
            run: AgentRun = resume_run(result, model=model, options=options, approvals=decided)
        except (InvalidInputError, UsageError) as exc:
            raise _HttpError(422, "input", str(exc)) from None
        resumed = _LiveRun(run, live.thread_id)
        self._runs[run.run_id] = resumed
        await self._watch(resumed, receive, send, start=True)

    def _make_room(self) -> None:
        if len(self._runs) < self.max_runs:
            return
        for run_id, live in self._runs.items():
            if live.returned:
                del self._runs[run_id]
                return
        raise _HttpError(429, "runs", f"{self.max_runs} runs are running (max_runs)")

    # -- the event stream ---------------------------------------------------------------------

    async def _watch(
        self,
        live: _LiveRun,
        receive: Receive,
        send: Send,
        *,
        start: bool = False,
    ) -> None:
        """Answer with the run's AG-UI events: the opening (its start, history and
        state as they are now), then each event as it comes, until it returns or the
        watcher leaves. ``start``: start the run once subscribed."""
        if self._watchers >= self.max_watchers:
            raise _HttpError(429, "watchers", f"{self.max_watchers} event streams are open")
        self._watchers += 1
        try:
            run = live.run
            events = run.events(self.max_buffered)
            agui = AguiStream(live.thread_id, run.run_id)
            engine = run.engine
            first = agui.opening(
                engine.messages, engine.state, engine.turns, run.pending_questions()
            )
            if start:
                live.task = asyncio.ensure_future(run.run())
            await respond(send, 200, None, STREAM_HEADERS)
            for event in first:
                await self._send_event(send, event)
            await self._stream(live, agui, events, receive, send)
        finally:
            self._watchers -= 1

    async def _stream(
        self,
        live: _LiveRun,
        agui: AguiStream,
        events: AsyncIterator[RunEvent],
        receive: Receive,
        send: Send,
    ) -> None:
        left: asyncio.Future[Any] = asyncio.ensure_future(disconnected(receive))
        following: asyncio.Future[Any] | None = None
        try:
            while True:
                if following is None:
                    following = asyncio.ensure_future(anext(events))
                done, _ = await asyncio.wait(
                    {following, left},
                    timeout=self.keepalive_seconds,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if left in done:
                    return  # the watcher left: nothing more to send
                if following not in done:
                    await send_body(send, b": keep-alive\n\n")
                    continue
                try:
                    event = following.result()
                except StopAsyncIteration:
                    break
                finally:
                    following = None
                engine = live.run.engine
                waiting = engine.pending_approvals() if isinstance(event, RunReturned) else ()
                for out in agui.convert(event, engine.messages, waiting):
                    await self._send_event(send, out)
            if not agui.ended:  # the run had returned before this watcher came
                engine = live.run.engine
                explanation = engine.explanation or ""
                waiting = engine.pending_approvals()
                end = run_end(live.thread_id, live.run.run_id, engine.state, explanation, waiting)
                await self._send_event(send, end)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            left.cancel()
            if following is not None:
                following.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                    await following
            await events.aclose()  # type: ignore[attr-defined]

    async def _send_event(self, send: Send, event: BaseEvent) -> None:
        text = event.model_dump_json(by_alias=True)
        for secret in self._secrets:
            text = text.replace(secret, "[redacted]")
        await send_body(send, f"data: {text}\n\n".encode())

    def _secret_texts(self) -> tuple[str, ...]:
        """The texts no event may carry, as they appear inside JSON strings."""
        found = [self.token]
        for name, value in os.environ.items():
            if _SECRET_NAME.search(name) and len(value) >= 8:
                found.append(value)
        # Longest first, so that a secret holding another is replaced whole.
        return tuple(sorted({json.dumps(s)[1:-1] for s in found}, key=len, reverse=True))

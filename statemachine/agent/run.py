"""The run: ``AgentRun`` (a handle for steering, aborting and watching one run),
``run_agent`` and ``run_agent_sync``.

``AgentRun`` is the action loop (``statemachine.agent.loop``) with the in-process
executor (``statemachine.agent.executor``), plus what a caller holds: queued input
(``steer``, ``follow_up``), ``abort`` and the event stream (``events()``). The hooks
and their failure modes are in ``statemachine.agent.hooks``; resuming a suspended run
in ``statemachine.agent.resume``.

Exceptions that are not ``Exception``: ``KeyboardInterrupt`` and ``SystemExit`` from a
tool, client or hook abort the run and close it (every task cancelled and awaited,
every call answered), and then ``run()`` raises the exception to its caller;
``AgentRun.result`` holds how the run ended. When the caller cancels ``run()`` itself
(``asyncio.Runner`` does so on Ctrl-C), the run is aborted and closed the same way
before the cancellation goes on.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from statemachine._log import library_logger
from statemachine.agent.events import (
    RunEvent,
    RunResult,
    RunStarted,
)
from statemachine.agent.executor import AsyncioExecutor
from statemachine.agent.hooks import (
    AfterToolCall,
    BeforeToolCall,
    ShouldContinue,
    TransformContext,
)
from statemachine.agent.loop import Inbox
from statemachine.agent.model import ModelClient
from statemachine.agent.tools import Tool
from statemachine.core.abort import AbortController, AbortSignal
from statemachine.core.engine import Engine
from statemachine.core.errors import InvalidInputError, UsageError
from statemachine.core.events import AbortRequested, Event, InputKind, InputQueued, Start
from statemachine.core.messages import Message, UserMessage

__all__ = [
    "DEFAULT_GRACE_PERIOD",
    "AgentRun",
    "run_agent",
    "run_agent_sync",
]

DEFAULT_GRACE_PERIOD = 1.0
"""Seconds an aborted operation is given to finish its cleanup before cancellation."""


def _check_options(model: ModelClient, grace_period: float, signal: AbortSignal | None) -> None:
    if not callable(getattr(model, "complete", None)):
        raise InvalidInputError("model must have an async complete(messages, tools, signal)")
    if (
        isinstance(grace_period, bool)
        or not isinstance(grace_period, (int, float))
        or not grace_period >= 0  # also refuses NaN, with which the grace never ends
    ):
        raise InvalidInputError(f"grace_period must be a non-negative number, got {grace_period!r}")
    if signal is not None and not isinstance(signal, AbortSignal):
        raise InvalidInputError("signal must be an AbortSignal (AbortController().signal)")


class AgentRun(AsyncioExecutor):
    """One run of the loop, with a handle for steering, aborting and watching it.

    ``await AgentRun(...).run()`` is ``run_agent(...)``. Before or while it runs:
    ``steer(msg)`` queues a message for the next turn boundary, ``follow_up(msg)``
    one for when the model would otherwise finish, ``abort(reason)`` aborts, and
    ``events()`` is an async iterator of ``RunEvent``s (subscribe before ``run()``
    to see them all).
    """

    def __init__(
        self,
        *,
        model: ModelClient,
        messages: Sequence[Message] = (),
        tools: Sequence[Tool] = (),
        max_turns: int = 8,
        signal: AbortSignal | None = None,
        before_tool_call: BeforeToolCall | None = None,
        after_tool_call: AfterToolCall | None = None,
        should_continue: ShouldContinue | None = None,
        transform_context: TransformContext | None = None,
        grace_period: float = DEFAULT_GRACE_PERIOD,
        logger: Any = None,
        run_id: str | None = None,
        engine_factory: Callable[..., Engine] = Engine,
        _engine: Engine | None = None,
        _resume_events: Sequence[Event] = (),
    ) -> None:
        _check_tools(tools)
        _check_options(model, grace_period, signal)
        base = logger if logger is not None else library_logger()
        if _engine is None:
            _engine = engine_factory(
                tools=[t.definition for t in tools],
                messages=messages,
                max_turns=max_turns,
                check_permissions=before_tool_call is not None,
                check_continue=should_continue is not None,
                scheduling={t.name: t.scheduling for t in tools},
                run_id=run_id or uuid.uuid4().hex[:12],
                logger=base,
            )
        else:
            # A restored engine asks the hooks that this run has: hooks are code, they
            # do not travel in a snapshot.
            _engine.check_permissions = before_tool_call is not None
            _engine.check_continue = should_continue is not None
        self._init_loop(_engine)
        self._init_executor()
        self.run_id = _engine.run_id
        self._resume_events = tuple(_resume_events)
        self._model = model
        self._tools = {t.name: t for t in tools}
        self._user_signal = signal if signal is not None else AbortSignal()
        self._controller = AbortController()  # what tools and the model client hold
        self._signal = self._controller.signal  # read on every call: kept at hand
        self._before = before_tool_call
        self._after = after_tool_call
        self._should_continue = should_continue
        self._transform = transform_context
        self._grace = float(grace_period)
        self._log = base.bind(run_id=self.run_id)
        self._loop = None
        self._loop_thread = 0
        self._early: list[Event] = []  # input queued before run() started
        self._started = False
        self._outcome: RunResult | None = None

    @property
    def result(self) -> RunResult | None:
        """How the run ended, once ``run()`` has returned or raised (a
        ``KeyboardInterrupt`` or ``SystemExit`` from a tool, client or hook, or the
        caller's cancellation); ``None`` before."""
        return self._outcome

    # -- the caller's handle ------------------------------------------------------------

    def steer(self, message: str | UserMessage) -> None:
        """Queue a message for the model, injected at the next turn boundary."""
        self._queue_input(message, InputKind.STEER)

    def follow_up(self, message: str | UserMessage) -> None:
        """Queue a message used when the model would otherwise finish."""
        self._queue_input(message, InputKind.FOLLOW_UP)

    def abort(self, reason: object = None) -> None:
        """Abort the run (thread-safe); same as aborting the run's signal."""
        reason = "aborted by the caller" if reason is None else reason
        if self._loop is None:
            self._early.append(AbortRequested(str(reason)))
        elif self._finished:
            return  # nothing left to abort; not an error (abort is idempotent)
        elif threading.get_ident() == self._loop_thread:
            self._abort(str(reason))
        else:
            try:
                self._loop.call_soon_threadsafe(self._abort, str(reason))
            except RuntimeError:
                pass  # the loop has closed: the run is over

    def events(self) -> AsyncIterator[RunEvent]:
        """An async iterator of this run's events; ends after ``RunFinished``."""
        queue: asyncio.Queue[RunEvent | None] = asyncio.Queue()
        if self._finished:
            queue.put_nowait(None)
        self._subscribers.append(queue)

        async def iterate() -> AsyncIterator[RunEvent]:
            while True:
                item = await queue.get()
                if item is None:
                    return
                yield item

        return iterate()

    def _queue_input(self, message: str | UserMessage, kind: InputKind) -> None:
        if isinstance(message, str):
            message = UserMessage(message)
        if not isinstance(message, UserMessage):
            raise InvalidInputError("queued input must be a str or a UserMessage")
        if self._finished:
            raise UsageError("the run has ended; start a new run with this message")
        event = InputQueued(message, kind)
        if self._loop is None:
            self._early.append(event)
        elif threading.get_ident() == self._loop_thread:
            # From a tool, hook or model client of this run: queue it now, so it is
            # ahead of the event that the calling operation reports next.
            self._post_input(event)
        else:
            self._loop.call_soon_threadsafe(self._post_input, event)

    def _post_input(self, event: Event) -> None:
        assert self._inbox is not None
        self._inbox.put_nowait(event)

    # -- the run ------------------------------------------------------------------------------

    async def run(self) -> RunResult:
        """Drive the run to a terminal state or ``AwaitingUser``; never raises for
        how it ends (see ``RunResult``), only a ``KeyboardInterrupt`` or
        ``SystemExit`` raised under it, once the run is closed (module docstring)."""
        if self._started:
            raise UsageError("an AgentRun runs once; create a new one (or resume_agent)")
        self._started = True
        remove = self._begin(asyncio.get_running_loop())
        try:
            self._emit(lambda: RunStarted(self.run_id))
            self._first_events()
            try:
                await self._drive()
            except asyncio.CancelledError:
                # The caller cancelled run() (asyncio.Runner does on Ctrl-C): close the
                # run as an abort, so every call still gets its result, then go on.
                self._abort("the caller cancelled the run")
                await self._drive()
                raise
        finally:
            remove()
            await self._cleanup()
            self._outcome = self._result()
        if self._fatal is not None:
            raise self._fatal
        return self._outcome

    def _begin(self, loop: asyncio.AbstractEventLoop) -> Callable[[], None]:
        """Bind the run to ``loop`` and listen to the run's signal; returns the
        listener's removal."""
        self._loop = loop
        self._loop_thread = loop_thread = threading.get_ident()
        self._inbox = Inbox()
        self._t0 = time.perf_counter()

        def on_abort(reason: object) -> None:
            # On the loop's own thread (a tool or hook aborting), act at once, so the
            # signals that tools hold fire before the aborting code's next line; from
            # any other thread, only hand the news to the loop.
            if threading.get_ident() == loop_thread:
                self._abort(str(reason))
                return
            try:
                loop.call_soon_threadsafe(self._abort, str(reason))
            except RuntimeError:
                pass  # the loop is closed: the run is over, nothing to abort

        return self._user_signal.add_listener(on_abort)

    def _first_events(self) -> None:
        """Hand the engine what starts the run: the resume's events or ``Start``, and
        what was queued before ``run()``; or, if it was aborted already, the abort."""
        early_inputs = [e for e in self._early if isinstance(e, InputQueued)]
        early_abort = next((e for e in self._early if isinstance(e, AbortRequested)), None)
        if not self._user_signal.aborted and early_abort is None:
            first: list[Event] = (
                [*self._resume_events, *early_inputs]
                if self._resume_events
                else [*early_inputs, Start()]
            )
            for event in first:
                self._handle(event)
            return
        # Aborted before anything started: no model call is made at all.
        if not self._resume_events:
            for queued in early_inputs:
                self._handle(queued)  # kept as queued input, nothing is lost
        reason = str(self._user_signal.reason) if early_abort is None else early_abort.reason
        self._aborting = True
        self._controller.abort(reason)
        self._handle(AbortRequested(reason))


def _check_tools(tools: Sequence[Tool]) -> None:
    if isinstance(tools, (str, bytes)) or not isinstance(tools, Sequence):
        raise InvalidInputError("tools must be a sequence of Tool")
    seen: set[str] = set()
    for i, item in enumerate(tools):
        if not isinstance(item, Tool):
            raise InvalidInputError(
                f"tools[{i}] is a {type(item).__name__}, not a Tool (see statemachine.tool)"
            )
        if item.name in seen:
            raise InvalidInputError(f"duplicate tool name {item.name!r}: tool names must be unique")
        seen.add(item.name)


async def run_agent(
    *,
    model: ModelClient,
    messages: Sequence[Message],
    tools: Sequence[Tool] = (),
    max_turns: int = 8,
    signal: AbortSignal | None = None,
    before_tool_call: BeforeToolCall | None = None,
    after_tool_call: AfterToolCall | None = None,
    should_continue: ShouldContinue | None = None,
    transform_context: TransformContext | None = None,
    grace_period: float = DEFAULT_GRACE_PERIOD,
    logger: Any = None,
    run_id: str | None = None,
    engine_factory: Callable[..., Engine] = Engine,
) -> RunResult:
    """Run the agent loop until a terminal state or ``AwaitingUser``.

    Never raises for how a run ends (see ``RunResult``); raises ``InvalidInputError``
    before any model call for an invalid history, duplicate tool names or bad
    arguments. For steering, abort by handle, or the event stream, use ``AgentRun``.
    ``engine_factory`` (called with ``Engine``'s keyword arguments) lets a caller run
    an ``Engine`` subclass, e.g. ``functools.partial(JournalingEngine, journal=j)``.
    """
    run = AgentRun(
        model=model,
        messages=messages,
        tools=tools,
        max_turns=max_turns,
        signal=signal,
        before_tool_call=before_tool_call,
        after_tool_call=after_tool_call,
        should_continue=should_continue,
        transform_context=transform_context,
        grace_period=grace_period,
        logger=logger,
        run_id=run_id,
        engine_factory=engine_factory,
    )
    return await run.run()


def run_agent_sync(**kwargs: Any) -> RunResult:
    """``run_agent`` for code without an event loop (same keyword arguments).

    Like ``asyncio.run`` (Ctrl-C cancels the run, which is closed as an abort, then
    raises ``KeyboardInterrupt``), except that it never waits for what the run has
    abandoned: ``asyncio.run`` would wait for every leftover task and every executor
    thread, so a tool that ignores cancellation, or a sync tool blocked in its
    thread, would hold it forever. Such a thread keeps running after the return (a
    thread cannot be interrupted), and the interpreter waits for it when it exits.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise UsageError(
            "run_agent_sync() cannot be called from a running event loop; "
            "use 'await run_agent(...)' instead"
        )
    grace = kwargs.get("grace_period", DEFAULT_GRACE_PERIOD)
    runner = asyncio.Runner(loop_factory=asyncio.new_event_loop)
    loop = runner.get_loop()
    try:
        return runner.run(run_agent(**kwargs))
    finally:
        _close_loop(loop, grace if isinstance(grace, (int, float)) else DEFAULT_GRACE_PERIOD)


def _close_loop(loop: asyncio.AbstractEventLoop, grace: float) -> None:
    """Close ``loop`` without waiting past ``grace`` for tasks that ignore cancellation,
    nor at all for executor threads (``loop.close()`` does not join them)."""
    try:
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.wait(pending, timeout=max(float(grace), 0.0)))
        for task in pending:
            if not task.done():
                # Abandoned, and reported as such by the run: asyncio need not say
                # again, when the task is collected, that it never finished.
                setattr(task, "_log_destroy_pending", False)  # noqa: B010
        loop.run_until_complete(
            asyncio.wait(
                [loop.create_task(loop.shutdown_asyncgens())], timeout=max(float(grace), 0.0)
            )
        )
    finally:
        loop.close()

"""The action loop: the engine decides, an executor performs, results come back as events.

The engine answers every event it is handed with actions. ``ActionLoop`` turns those actions
into work and the work's outcomes back into events:

- ``CallModel``: the executor calls the model (``Executor.start_model``);
- ``StartTool``: it runs the tool (``start_tool``), one per call of a batch that may run;
- ``CheckPermission``: it asks ``before_tool_call`` about the calls, in call order
  (``start_permission_checks``);
- ``CheckContinue``: it asks ``should_continue`` at a turn boundary
  (``start_continue_check``);
- ``RunStep``: it calls a team's declared step (``start_step``);
- ``CancelOperations``: after an abort, it ends what is still outstanding within the
  grace period (``start_cancellation``);
- and when the engine stops in ``AwaitingUser`` (approval or input) or a terminal
  state, the loop returns; waiting for a person is the caller's ``resume``.

Every operation reports exactly once (``post``, keyed by ``"model"`` or the call id),
into one inbox (``RunInbox``, a FIFO queue); the loop takes one event at a time and hands it
to the engine, so the engine sees a strict sequence of events even though tools
finish in any order; that sequence is all the history depends on (I5). After each
event the loop tells the run's ``EventStream`` where the engine went.

The ordering rules
------------------
What the engine sees is the order in which the loop hands it events; these rules fix
that order where timing could otherwise decide it. The code names them (O1 to O4).

O1. One pass of the event loop before each event (``drive``: ``asyncio.sleep(0)``).
    What else is ready (an abort from another task, a timer, I/O) runs first, as it
    would have had the loop waited; and an operation started by the last event, whose
    task was scheduled before this pass, runs in it, so a report made without waiting
    (a quick tool) is taken at once instead of a pass later.
O2. A caller's abort goes ahead of the events already queued (``abort``, ``_take``).
    A result queued before the abort must not start a model call or a tool call
    after it (I6: nothing starts once the run is aborted). An operation's own
    failure that aborts the run (a ``KeyboardInterrupt`` in a tool) aborts *behind*
    its report instead, so that the report is kept.
O3. What was asked to be done "later" is done before the next event
    (``later``, ``_take``). An operation that asks for something before it reports
    (a fatal failure's abort), or another thread (an abort, a steer), has it done on
    the event loop's next pass or before the loop handles its next event, whichever
    comes first: so it takes effect before the report that followed it.
O4. Input queued from the loop's own thread is queued at once (``AgentRun.steer``
    from a tool or hook), so that it is ahead of the event the calling operation
    reports next; from another thread it goes through O3.

An operation that is the only action of its step may start eagerly (Python 3.12+,
``executor.start_task``): it runs up to its first wait before the loop takes its next
event, which O1 then makes the same order as on Python 3.11, where it starts in the
loop's next pass. The tool results of a batch are the engine's to order (I2), not
the loop's.

The executor
------------
``ActionLoop`` decides *what* to do and in which order; *how* each kind of action is
performed is the ``Executor`` protocol below, whose every operation must end in
exactly one ``post`` (or one event per permission check or continue check). The
in-process executor (``statemachine.agent.executor``) performs them as asyncio tasks;
the durable one (``statemachine.durable``) as recorded steps.

The executor is given the loop it reports to; the loop never holds the executor:
whoever runs the loop hands it over for the actions of each event
(``drive(executor)``, ``handle(event, executor)``) and closes it. So a finished run
is no reference cycle. The hook calls under way are the loop's to keep
(``helpers``), since an abort, which is the loop's, cancels them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, Protocol

from statemachine._log import library_logger
from statemachine.agent.calls import FATAL, describe, fatal_in
from statemachine.agent.stream import EventStream
from statemachine.core.abort import AbortController
from statemachine.core.engine import Engine
from statemachine.core.events import (
    AbortRequested,
    Action,
    CallModel,
    CancelOperations,
    CheckContinue,
    CheckPermission,
    Event,
    InputQueued,
    ModelCancelled,
    RunStep,
    StartTool,
    ToolCancelled,
    ToolFinished,
)
from statemachine.core.messages import ToolCall
from statemachine.errors import UsageError

__all__ = ["ActionLoop", "Executor", "Inbox", "RunInbox"]

_MODEL_NOT_STARTED = "not started: the run was aborted before the call began"
_TOOL_NOT_STARTED = "not started: the run was aborted before the tool began"


class Inbox(Protocol):
    """Where operations report and the loop takes its events: ``RunInbox`` is the run's
    own (an ``asyncio.Queue[Event]`` is one too); a backend may give one that also places
    messages of its own."""

    def put_nowait(self, item: Event, /) -> None: ...

    def empty(self) -> bool: ...

    def get_nowait(self) -> Event: ...

    def get(self) -> Awaitable[Event]: ...


class RunInbox:
    """The run's own ``Inbox``: a FIFO queue of events for one reader, the action loop.

    What ``asyncio.Queue`` does for the loop, with less kept alive while the run waits
    (which counts with thousands of runs in one process): one future per wait, no
    waiter deque. As in ``asyncio.Queue``, an event stays queued until the reader takes
    it, so a reader cancelled after it was woken but before it ran loses nothing.
    """

    __slots__ = ("_events", "_waiter")

    def __init__(self) -> None:
        # A list, not a deque: it holds a few events at a time (a batch's results),
        # and a deque holds a block of 64 slots from the start, in every waiting run.
        # None while empty, as a waiting run's inbox is: no list is held then.
        self._events: list[Event] | None = None
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, item: Event, /) -> None:
        if self._events is None:
            self._events = [item]
        else:
            self._events.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def empty(self) -> bool:
        return not self._events

    def get_nowait(self) -> Event:
        if not self._events:
            raise asyncio.QueueEmpty
        return self._pop(self._events)

    async def get(self) -> Event:
        """The next event, once there is one."""
        if self._waiter is not None:
            raise UsageError("the inbox has one reader: it is being waited on already")
        while not self._events:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._pop(self._events)

    def _pop(self, events: list[Event]) -> Event:
        event = events.pop(0)
        if not events:
            self._events = None
        return event


class Executor(Protocol):
    """Performs the loop's actions; each operation reports through ``ActionLoop.post``.

    ``alone``: the operation is the only action of its step, so nothing else is started
    behind it that it could overtake (the in-process executor may then start it eagerly).
    """

    def start_model(self, action: CallModel, alone: bool) -> None:
        """Begin the model call; it reports one ``Model*`` event (key ``"model"``)."""

    def start_tool(self, call: ToolCall, alone: bool) -> None:
        """Begin the tool call; it reports one ``ToolFinished`` or ``ToolCancelled``."""

    def start_permission_checks(self, calls: Sequence[ToolCall]) -> None:
        """Ask ``before_tool_call`` about each call in order; one event per call."""

    def start_continue_check(self, turn: int) -> None:
        """Ask ``should_continue``; it reports one ``ContinueDecided``."""

    def start_step(self, action: RunStep) -> None:
        """Call the declared step (``agent/steps.py``); it reports one ``StepDecided``."""

    def start_cancellation(self, keys: Sequence[str], reason: str) -> None:
        """End the operations ``keys`` ("model" or call ids) within the grace period;
        each one not yet reported is then reported cancelled or abandoned."""

    async def close(self) -> None:
        """The run returned to its caller: end whatever is left (normally nothing)."""


class ActionLoop:
    """Hands the engine one event at a time and the executor each action it answers.

    Its fields are slots, and what most runs never use (the abandoned keys, the hook
    calls, a bound logger) is made when first asked for: thousands of runs may wait in
    one process, each holding one loop."""

    __slots__ = (
        "_abandoned",
        "_abort_first",
        "_base_log",
        "_closed",
        "_done",
        "_event_loop",
        "_helpers",
        "_later",
        "_log",
        "aborting",
        "controller",
        "engine",
        "fatal",
        "inbox",
        "late_input",
        "model_exception",
        "on_handle",
        "reported",
        "returned",
        "stream",
    )

    def __init__(
        self,
        engine: Engine,
        *,
        inbox: Inbox,
        stream: EventStream,
        controller: AbortController,
        log: Any | None,
        on_handle: Callable[[Event], None] | None = None,
    ) -> None:
        self.engine = engine
        self.inbox = inbox
        self.stream = stream
        self.controller = controller  # what tools and the model client hold
        self._base_log = log
        self.on_handle = on_handle  # told of every event before the engine gets it
        self.reported: set[str] = set()  # keys whose one event has been queued
        self.aborting = False
        self.returned = False  # the engine returned to the caller (told once)
        self.fatal: BaseException | None = None  # raised again once the run is closed
        self.model_exception: BaseException | None = None  # the cause of a failed run
        self.late_input: tuple[InputQueued, ...] = ()  # queued, but the run had already returned
        self._done = engine.returns_to_caller  # where the last event left it
        self._abort_first: AbortRequested | None = None  # handled before queued events
        # What later() was asked to do (O3): made when first asked for, as most runs
        # never ask (a deque would hold a block of 64 slots from the start).
        self._later: list[Callable[[], None]] | None = None
        self._event_loop = asyncio.get_running_loop()
        self._closed = False  # the run is closed: an abort comes too late
        self._abandoned: set[str] | None = None
        self._helpers: set[asyncio.Future[None]] | None = None
        self._log: Any = None

    @property
    def abandoned(self) -> set[str]:
        """The keys given up on at the end of an abort's grace period (made when first
        asked for: most runs are never aborted)."""
        if self._abandoned is None:
            self._abandoned = set()
        return self._abandoned

    @property
    def helpers(self) -> set[asyncio.Future[None]]:
        """The hook calls and grace timers under way, which an abort cancels (made with
        the first: most runs ask no hook and are never aborted)."""
        if self._helpers is None:
            self._helpers = set()
        return self._helpers

    @property
    def log(self) -> Any:
        """The run's logger (``log``, or the library's when ``None``), the run id bound:
        made when first used (most runs log nothing of their own)."""
        if self._log is None:
            base = self._base_log if self._base_log is not None else library_logger()
            self._log = base.bind(run_id=self.engine.run_id)
        return self._log

    async def drive(self, executor: Executor) -> None:
        """Hand the engine the inbox's events until it returns to the caller, and
        ``executor`` the actions it answers with."""
        inbox = self.inbox
        while not self._done:
            await asyncio.sleep(0)  # O1 (module docstring)
            # Always get(): a backend's inbox places messages of its own there.
            event = await inbox.get()
            if self._later or self._abort_first is not None:
                self._take(event, executor)  # something goes ahead of it (O3, O2)
            else:
                self.handle(event, executor)
            del event  # no frame holds an event while the next is awaited
        # Input that was queued but arrived after the run returned is not dropped: it
        # is reported with the result, like input the run never got to inject.
        while not inbox.empty():
            self._keep_late(inbox.get_nowait())

    def _take(self, event: Event, executor: Executor) -> None:
        """Hand the engine ``event``, after what was asked to be done before it (O3)
        and an abort that goes ahead of it (O2)."""
        if self._later:
            self._do_later()
        first = self._abort_first
        if first is not None:
            self._abort_first = None
            self.handle(first, executor)
            if event is first:
                return
            if self._done:
                self._keep_late(event)
                return
        self.handle(event, executor)

    def close(self) -> None:
        """The run is closed (its executor has ended what was left): an abort from now
        on comes too late, and is not taken."""
        self._closed = True

    def _keep_late(self, event: Event) -> None:
        if isinstance(event, InputQueued):
            self.late_input += (event,)

    def handle(self, event: Event, executor: Executor) -> None:
        """Hand ``event`` to the engine, tell the stream, have ``executor`` perform the
        actions."""
        if self.on_handle is not None:
            self.on_handle(event)
        if isinstance(event, ToolFinished):
            self.stream.tool_ended(event, abandoned=False)
        elif isinstance(event, ToolCancelled):
            self.stream.tool_ended(event, event.call_id in self.abandoned)
        engine = self.engine
        actions = engine.handle(event)
        self.stream.engine_moved(engine)
        self._done = engine.returns_to_caller
        if self._done and not self.returned:
            self.returned = True
            self.stream.run_returned(engine)
        self._perform(actions, executor)

    def _perform(self, actions: Sequence[Action], executor: Executor) -> None:
        alone = len(actions) == 1
        checks: list[ToolCall] | None = None  # made for a batch that asks before_tool_call
        for action in actions:
            if isinstance(action, CallModel):
                self.reported.discard("model")  # the key of every model call
                if self.aborting:
                    self.post("model", ModelCancelled(_MODEL_NOT_STARTED))
                    continue
                self.stream.model_called()
                executor.start_model(action, alone)
            elif isinstance(action, StartTool):
                call = action.call
                self.reported.discard(call.id)
                if self.aborting:
                    # Asked for by an event handled ahead of the abort: never begun.
                    self.stream.tool_started(call, begun=False)
                    self.post(call.id, ToolCancelled(call.id, _TOOL_NOT_STARTED))
                    continue
                self.stream.tool_started(call)
                executor.start_tool(call, alone)
            elif isinstance(action, CheckPermission):
                if checks is None:
                    checks = []
                checks.append(action.call)
            elif isinstance(action, CheckContinue):
                executor.start_continue_check(action.turn)
            elif isinstance(action, RunStep):
                executor.start_step(action)
            elif isinstance(action, CancelOperations):
                keys = (["model"] if action.model else []) + list(action.tool_call_ids)
                executor.start_cancellation(keys, action.reason)
        if checks:
            executor.start_permission_checks(checks)

    def post(self, key: str, event: Event) -> None:
        """Queue the one event of an operation; later reports of it are dropped."""
        if key in self.reported:
            return
        self.reported.add(key)
        self.inbox.put_nowait(event)

    def abort(self, reason: str, urgent: bool = True) -> None:
        """Abort the run; ``urgent`` puts the abort ahead of the events already queued
        (a caller's abort), otherwise it follows them (an operation's own failure): O2."""
        if self.aborting or self.returned or self._closed:
            return
        self.aborting = True
        event = AbortRequested(reason)
        if urgent:
            self._abort_first = event
        try:
            self.controller.abort(reason)
        except FATAL as exc:  # a tool's abort listener: first close the run
            self.fatal = self.fatal or exc
        for task in self._helpers or ():
            task.cancel()  # stop asking hooks: the engine answers their calls
        self.inbox.put_nowait(event)

    def note_failure(self, exc: BaseException, where: str) -> None:
        """After an operation has reported its failure: if it was a KeyboardInterrupt
        or SystemExit, abort the run (behind that report) and raise it afterwards."""
        fatal = fatal_in(exc)
        if fatal is None:
            return
        self.fatal = self.fatal or fatal
        self.log.warning("run_interrupted", by=where, error=describe(fatal))
        reason = f"{type(fatal).__name__} raised by {where}"
        self.later(partial(self.abort, reason, False))

    def later(self, act: Callable[[], None], from_thread: bool = False) -> None:
        """Do ``act`` on the event loop's next pass, or before the loop handles its
        next event if that is sooner (O3). ``from_thread``: asked for from a thread
        other than the loop's."""
        if self._later is None:
            self._later = []
        self._later.append(act)
        if from_thread:
            self._event_loop.call_soon_threadsafe(self._do_later)
        else:
            self._event_loop.call_soon(self._do_later)

    def _do_later(self) -> None:
        later = self._later
        while later:
            later.pop(0)()

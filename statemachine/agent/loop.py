"""The action loop: the engine decides, an executor performs, results come back as events.

The engine answers every input event with actions. This module holds the one loop
that turns those actions into work and the work's outcomes back into events:

- ``CallModel``: call the model (``_start_model``);
- ``StartTool``: run the tool (``_start_tool``), one per call of a batch that may run;
- ``CheckPermission``: ask ``before_tool_call`` about the calls, in call order
  (``_start_permission_checks``);
- ``CheckContinue``: ask ``should_continue`` at a turn boundary
  (``_start_continue_check``);
- ``CancelOperations``: after an abort, end what is still outstanding within the grace
  period (``_start_cancellation``);
- and when the engine stops in ``AwaitingUser`` (approval or input) or a terminal
  state, the loop returns; waiting for a person is the caller's ``resume``.

Every operation reports exactly once, through one inbox, as an input event
(``_post``); the loop takes one event at a time and hands it to the engine, so the
engine sees a strict sequence of events even though tools finish in any order; that
sequence is all the history depends on (I5).

The executor seam
-----------------
``ActionLoop`` decides *what* to do and in which order; *how* each kind of action is
performed is the five ``_start_*`` methods, which an executor implements and which
must each end in exactly one ``_post`` per operation (or one event per permission
check or continue check). The in-process executor (``statemachine.agent.executor``)
performs them with asyncio: each operation starts at once, in the loop's own step,
and becomes a task only if it has to wait (a scripted model, a tool that returns
without awaiting, cost no task at all); cancellation and the grace period act on
those tasks. A durable executor would implement the same five methods by wrapping
each model call, tool call and hook call as a durable step (its result recorded
before it is posted) and by posting the tool results of a batch in call order, so
that a run recovered after a crash hands the engine the same sequence of events and
so records the same trace; everything in this module would be reused as it is.

What the loop does not do when nobody asks
-------------------------------------------
Run events (``events()``) are built only when someone subscribed; usage is summed
from the history once, when the stats are read; per transition the loop only looks
at where the engine went, to time the turns.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from statemachine.agent.events import (
    _ERRORS,
    MessageAdded,
    RunEvent,
    RunFinished,
    RunResult,
    RunStats,
    StateChanged,
    ToolEnded,
    ToolStarted,
    TurnEnded,
    TurnStarted,
)
from statemachine.agent.hooks import _FATAL, _describe, _fatal_in
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
    StartTool,
    ToolCancelled,
    ToolFinished,
)
from statemachine.core.messages import AssistantMessage, ToolCall, Usage
from statemachine.core.table import RETURNS_TO_CALLER, TurnState
from statemachine.core.tools import ToolOutput

__all__ = ["ActionLoop", "Inbox"]

_MODEL_NOT_STARTED = "not started: the run was aborted before the call began"
_TOOL_NOT_STARTED = "not started: the run was aborted before the tool began"

# Where the engine went, for timing turns: a turn starts on entering AwaitingModel and
# ends at the next boundary or return to the caller.
_TURN_ENDS = frozenset({TurnState.TurnBoundary, *RETURNS_TO_CALLER})
_AWAITING_MODEL = TurnState.AwaitingModel
_TIMED = frozenset({_AWAITING_MODEL, *_TURN_ENDS})


_MAX_SKIPPED_YIELDS = 16
"""How many operations that finished at once may follow each other with nothing else
ready before the loop still yields to the event loop (which then polls I/O)."""


def _loop_queues(
    loop: asyncio.AbstractEventLoop,
) -> tuple[deque[Any], list[Any]] | tuple[None, None]:
    """Where ``loop`` keeps its ready callbacks and its timers, to tell whether anything
    else could run now; ``(None, None)`` when unknown: the loop then yields every time.

    asyncio's own loops keep them in ``_ready`` and ``_scheduled``; any other loop (or
    asyncio, should those ever go) is treated as always having something ready.
    """
    ready = getattr(loop, "_ready", None)
    scheduled = getattr(loop, "_scheduled", None)
    if isinstance(loop, asyncio.BaseEventLoop) and (
        isinstance(ready, deque) and isinstance(scheduled, list)
    ):
        return ready, scheduled
    return None, None


class Inbox:
    """The loop's queue of input events: a deque and at most one waiter.

    ``asyncio.Queue`` does the same with more bookkeeping (two waiter deques, a task
    counter) than one consumer needs; this is on the path of every event.
    """

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: deque[Event] = deque()
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, event: Event) -> None:
        self._items.append(event)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def empty(self) -> bool:
        return not self._items

    def get_nowait(self) -> Event:
        return self._items.popleft()

    async def get(self) -> Event:
        while not self._items:
            waiter = asyncio.get_running_loop().create_future()
            self._waiter = waiter
            try:
                await waiter
            finally:
                self._waiter = None
        return self._items.popleft()


class ActionLoop:
    """The loop over the engine's actions; an executor supplies the ``_start_*`` methods."""

    engine: Engine
    run_id: str
    _log: Any
    _controller: AbortController  # what tools and the model client hold

    def _init_loop(self, engine: Engine) -> None:
        """The loop's bookkeeping, for ``engine``."""
        self.engine = engine
        self._inbox: Inbox | None = None
        self._late_input: list[InputQueued] = []  # queued, but the run had already ended
        self._reported: set[str] = set()  # keys whose one event has been queued
        self._aborting = False
        self._finished = False  # the run has ended (its end is reported once)
        self._done = engine.returns_to_caller  # where the engine stood after the last event
        self._subscribers: list[asyncio.Queue[RunEvent | None]] = []
        self._fatal: BaseException | None = None  # raised again once the run is closed
        self._abort_first: AbortRequested | None = None  # handled before queued events
        self._abandoned: set[str] = set()  # keys given up on at the end of the grace
        # bookkeeping for the event stream and stats
        self._seen_messages = len(engine.messages)
        self._first_message = self._seen_messages  # the usage of this run starts here
        self._yield_due = False  # set by an operation that finished without waiting
        self._seen_trace = len(engine.trace)
        self._t0 = 0.0
        self._turn_start: float | None = None
        self._turn_seconds: list[float] = []
        # call id -> the call and when it started (None: never), until it reports
        self._calls: dict[str, tuple[ToolCall, float | None]] = {}
        self._tool_seconds: dict[str, float] = {}
        self._tool_counts: dict[tuple[str, str], int] = {}  # (tool, outcome) -> calls
        self._model_calls = 0
        self._model_exception: BaseException | None = None

    # -- the executor seam (module docstring) ----------------------------------------------

    def _start_model(self, action: CallModel, alone: bool) -> None:
        """Begin the model call; it reports one ``Model*`` event. ``alone``: it is the
        only action of its step (nothing else starts after it in this step)."""
        raise NotImplementedError

    def _start_tool(self, call: ToolCall, alone: bool) -> None:
        """Begin the tool call; it reports one ``ToolFinished`` or ``ToolCancelled``."""
        raise NotImplementedError

    def _start_permission_checks(self, calls: list[ToolCall]) -> None:
        """Ask ``before_tool_call`` about each call in order; one event per call."""
        raise NotImplementedError

    def _start_continue_check(self, turn: int) -> None:
        """Ask ``should_continue``; it reports one ``ContinueDecided``."""
        raise NotImplementedError

    def _start_cancellation(self, keys: list[str], reason: str) -> None:
        """End the operations ``keys`` ("model" or call ids) within the grace period;
        each one not yet reported is then reported cancelled or abandoned."""
        raise NotImplementedError

    # -- the loop -----------------------------------------------------------------------------

    async def _drive(self) -> None:
        engine = self.engine
        inbox = self._inbox
        assert inbox is not None
        ready, scheduled = _loop_queues(asyncio.get_running_loop())
        queued = inbox._items  # read in place: this is every event's path
        skipped = 0
        done = engine.returns_to_caller  # then as _handle saw it after each event
        while not done:
            if self._yield_due:
                # An operation finished at once, without the loop ever waiting: give
                # other tasks (an abort, a timer) their turn, as a task would have.
                # A pass of the event loop costs as much as the engine's whole step,
                # so it is made when something else is ready to run (a callback, one
                # from another thread, a timer), and at least every few operations
                # so that I/O is still polled.
                self._yield_due = False
                if skipped == _MAX_SKIPPED_YIELDS or ready is None or ready or scheduled:
                    skipped = 0
                    await asyncio.sleep(0)
                else:
                    skipped += 1
            event = queued.popleft() if queued else await inbox.get()
            first = self._abort_first
            if first is not None:
                # An abort goes ahead of what was already queued: a result queued
                # before it must not start a new model call or tool call.
                self._abort_first = None
                self._handle(first)
                done = self._done
                if event is first:
                    continue
                if done:
                    self._keep_late(event)
                    break
            self._handle(event)
            done = self._done
        # Input that was queued but arrived after the run ended is not dropped: it
        # is reported with the result, like input the run never got to inject.
        while not inbox.empty():
            self._keep_late(inbox.get_nowait())

    def _keep_late(self, event: Event) -> None:
        if isinstance(event, InputQueued):
            self._late_input.append(event)

    def _handle(self, event: Event) -> None:
        if isinstance(event, (ToolFinished, ToolCancelled)):
            self._tool_done(event)
        engine = self.engine
        actions = engine.handle(event)
        if self._subscribers:
            self._observe_listening()
        else:
            # Nobody listens: of the new transitions only the turns' timing is kept
            # (one clock read an event), from the destinations alone (no records made).
            trace = engine.trace
            start = self._seen_trace
            self._seen_trace = len(trace)
            now = 0.0
            for dest in trace.dests(start):
                if dest not in _TIMED:
                    continue  # most transitions: one test
                if dest is _AWAITING_MODEL:
                    now = now or time.perf_counter()
                    self._turn_start = now
                elif self._turn_start is not None:
                    now = now or time.perf_counter()
                    self._turn_seconds.append(now - self._turn_start)
                    self._turn_start = None
        self._done = done = engine.returns_to_caller
        if done and not self._finished:
            self._finish()
        if len(actions) == 1 and not self._aborting:
            # The usual step: one model call or one tool call, started alone.
            action = actions[0]
            if action.__class__ is CallModel:
                self._model_calls += 1
                self._start_model(action, True)
                return
            if action.__class__ is StartTool:
                call = action.call
                self._calls[call.id] = (call, time.perf_counter())
                if self._subscribers:
                    self._emit(ToolStarted(call))
                self._start_tool(call, True)
                return
        self._perform(actions)

    def _perform(self, actions: Sequence[Action]) -> None:
        alone = len(actions) == 1
        checks: list[ToolCall] = []
        for action in actions:
            if isinstance(action, StartTool):
                call = action.call
                if self._aborting:
                    self._calls[call.id] = (call, None)
                    self._not_started(call.id, ToolCancelled(call.id, _TOOL_NOT_STARTED))
                    continue
                self._calls[call.id] = (call, time.perf_counter())
                if self._subscribers:
                    self._emit(ToolStarted(call))
                self._start_tool(call, alone)
            elif isinstance(action, CallModel):
                if self._aborting:
                    self._not_started("model", ModelCancelled(_MODEL_NOT_STARTED))
                    continue
                self._model_calls += 1
                self._start_model(action, alone)
            elif isinstance(action, CheckPermission):
                checks.append(action.call)
            elif isinstance(action, CheckContinue):
                self._start_continue_check(action.turn)
            elif isinstance(action, CancelOperations):
                keys = (["model"] if action.model else []) + list(action.tool_call_ids)
                self._start_cancellation(keys, action.reason)
        if checks:
            self._start_permission_checks(checks)

    def _post(self, key: str, event: Event) -> None:
        """Queue the one event of an operation; later reports of it are dropped."""
        if key in self._reported:
            return
        self._reported.add(key)
        assert self._inbox is not None
        self._inbox.put_nowait(event)

    def _not_started(self, key: str, event: Event) -> None:
        """An operation the engine asked for after the abort (queued events it handled
        first): it is never begun, and answered as such once the abort is handled."""
        self._reported.discard(key)
        self._post(key, event)

    def _abort(self, reason: str, urgent: bool = True) -> None:
        """Abort the run; ``urgent`` puts the abort ahead of the events already queued
        (a caller's abort), otherwise it follows them (an operation's own failure)."""
        if self._aborting or self._finished:
            return
        self._aborting = True
        event = AbortRequested(reason)
        if urgent:
            self._abort_first = event
        try:
            self._controller.abort(reason)
        except _FATAL as exc:  # a tool's abort listener: first close the run
            self._fatal = self._fatal or exc
        self._on_abort()
        if self._inbox is not None:
            self._inbox.put_nowait(event)

    def _on_abort(self) -> None:
        """What the executor stops at once on an abort (the hooks it is asking)."""

    def _note_failure(self, exc: BaseException, where: str) -> None:
        """After an operation has reported its failure: if it was a KeyboardInterrupt
        or SystemExit, abort the run (behind that report) and raise it afterwards."""
        fatal = _fatal_in(exc)
        if fatal is None:
            return
        self._fatal = self._fatal or fatal
        self._log.warning("run_interrupted", by=where, error=_describe(fatal))
        reason = f"{type(fatal).__name__} raised by {where}"
        asyncio.get_running_loop().call_soon(self._abort, reason, False)

    # -- deriving the event stream and stats from what the engine did -----------------

    def _emit(self, event: RunEvent | Callable[[], RunEvent]) -> None:
        """Give ``event`` (or what ``event()`` builds, only if someone listens) to
        every subscriber."""
        if not self._subscribers:
            return
        if callable(event):
            event = event()
        for queue in self._subscribers:
            queue.put_nowait(event)

    def _observe_listening(self) -> None:
        """What ``_handle`` notes for subscribers: every message and transition as a
        run event, and the turns timed."""
        engine = self.engine
        history = engine.messages
        for index in range(self._seen_messages, len(history)):
            self._emit(MessageAdded(index, history[index]))
        self._seen_messages = len(history)
        trace = engine.trace
        for index in range(self._seen_trace, len(trace)):
            record = trace[index]
            self._emit(StateChanged(record))
            dest = record.dest
            if dest is TurnState.AwaitingModel:
                self._turn_start = time.perf_counter()
                self._emit(TurnStarted(record.turn + 1))
            elif self._turn_start is not None and dest in _TURN_ENDS:
                seconds = time.perf_counter() - self._turn_start
                self._turn_start = None
                self._turn_seconds.append(seconds)
                self._emit(TurnEnded(record.turn, seconds))
        self._seen_trace = len(trace)

    def _finish(self) -> None:
        self._finished = True
        if not self._subscribers:
            return
        stats = self._stats()
        explanation = self.engine.explanation or ""
        self._emit(RunFinished(self.engine.state, explanation, stats))
        for queue in self._subscribers:
            queue.put_nowait(None)

    def _tool_done(self, event: ToolFinished | ToolCancelled) -> None:
        call_id = event.call_id
        begun = self._calls.pop(call_id, None)
        if begun is None:
            self._tool_seconds[call_id] = 0.0
            return
        call, started = begun
        seconds = 0.0 if started is None else time.perf_counter() - started
        self._tool_seconds[call_id] = seconds
        if isinstance(event, ToolFinished):
            outcome = "error" if event.output.is_error else "ok"
        else:
            outcome = "cancelled"
        key = (call.name, outcome)
        self._tool_counts[key] = self._tool_counts.get(key, 0) + 1
        if self._subscribers:
            if isinstance(event, ToolFinished):
                output = event.output
            else:
                output = ToolOutput(f"Operation aborted: {event.reason}", is_error=True)
            cancelled = isinstance(event, ToolCancelled)
            abandoned = cancelled and event.call_id in self._abandoned
            self._emit(ToolEnded(call, output, seconds, cancelled, abandoned))

    def _stats(self) -> RunStats:
        usage = Usage()
        for message in self.engine.messages[self._first_message :]:  # one slice, not a call each
            if isinstance(message, AssistantMessage) and message.usage is not None:
                usage = usage + message.usage
        return RunStats(
            model_calls=self._model_calls,
            tool_calls=self._tool_calls(),
            usage=usage,
            turn_seconds=tuple(self._turn_seconds),
            tool_seconds=dict(self._tool_seconds),
            wall_seconds=time.perf_counter() - self._t0,
        )

    def _tool_calls(self) -> dict[str, dict[str, int]]:
        """The tool calls by name and outcome ("ok", "error", "cancelled")."""
        by_name: dict[str, dict[str, int]] = {}
        for (name, outcome), count in self._tool_counts.items():
            by_name.setdefault(name, {})[outcome] = count
        return by_name

    def _result(self) -> RunResult:
        engine = self.engine
        state = engine.state
        explanation = engine.explanation or ""
        error_type = _ERRORS.get(state)
        error = error_type(explanation) if error_type is not None else None
        if error is not None and state is TurnState.Failed:
            error.__cause__ = self._model_exception
        return RunResult(
            state=state,
            messages=tuple(engine.messages),
            error=error,
            turns=engine.turns,
            explanation=explanation,
            trace=tuple(engine.trace),
            run_id=self.run_id,
            stats=self._stats(),
            pending_approvals=tuple(call for call, _ in engine.pending_approvals()),
            queued_input=engine.queued_input() + tuple(self._late_input),
            snapshot=engine.snapshot() if state is TurnState.AwaitingUser else None,
        )

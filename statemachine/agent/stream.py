"""The event stream of a run, and its stats: what the engine did, told to who listens.

``EventStream`` is one part of an ``AgentRun``: the action loop tells it where the
engine went after each event, which operations began and ended, and when the run
ended; it times the turns and the tool calls, counts the calls, and hands the
``RunEvent``s to the subscribers of ``AgentRun.events()``. An event is built only
when someone subscribed (``emit`` takes a function for the costly ones); the usage is
summed from the history once, when the stats are read. A resumed run's stats start
from the stats of the part before (``previous``), and a sub-agent's are added to the
run that called it (``add_child``), so ``RunResult.stats`` is the whole run's.

A subscriber that does not read never holds the run up, and never holds memory in
proportion to what the run does: a tool's progress reports that it has not read yet
are coalesced (it gets the newest one), and past ``DEFAULT_MAX_BUFFERED_EVENTS``
unread events the events that only describe the run's progress are dropped, an
``EventsDropped`` saying how many in their place (``_Subscriber``). A subscriber whose
iterator is closed (``aclose()``: a watcher left) is let go at once.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Generic

import attrs

from statemachine.agent.events import (
    EventsDropped,
    MessageAdded,
    OutputT,
    RunEvent,
    RunResult,
    RunReturned,
    RunStarted,
    RunStats,
    StateChanged,
    TextDelta,
    ToolAnswered,
    ToolAsked,
    ToolCallDelta,
    ToolEnded,
    ToolProgress,
    ToolStarted,
    TurnEnded,
    TurnStarted,
)
from statemachine.agent.questions import RunQuestions
from statemachine.core.engine import Engine
from statemachine.core.events import ToolCancelled, ToolFinished
from statemachine.core.messages import AssistantMessage, ToolCall, Usage
from statemachine.core.table import BASE_TABLE, RETURNS_TO_CALLER, State, Table, TurnState
from statemachine.core.tools import ToolOutput
from statemachine.errors import InvalidInputError

if TYPE_CHECKING:
    from statemachine.agent.run import AgentRun
    from statemachine.agent.session import SessionTurn

__all__ = ["DEFAULT_MAX_BUFFERED_EVENTS", "EventStream", "StreamedRun"]

DEFAULT_MAX_BUFFERED_EVENTS = 10_000
"""Unread events one subscriber may hold before the droppable ones are dropped."""

# Never dropped: each stands for something the run holds anyway (a message of its
# history, a call of it, its start and end, a question a tool asked of it and its end:
# counted by their askers, an MCP connection's at max_input_requests), so a few dozen
# bytes each.
_KEPT: frozenset[type] = frozenset(
    {RunStarted, MessageAdded, ToolStarted, ToolEnded, RunReturned, ToolAsked, ToolAnswered}
)

# A turn starts on entering AwaitingModel and ends at the next turn boundary, where
# the run returns to its caller, or in a terminal state of the run's table (a step's
# end): the states that mark turns, one set per table, read once per run (the base
# table's is shared by every run).
_AWAITING_MODEL = TurnState.AWAITING_MODEL
_MARKS = frozenset({_AWAITING_MODEL, TurnState.TURN_BOUNDARY, *RETURNS_TO_CALLER})
_BASE_MARKS = _MARKS | BASE_TABLE.terminal


def _turn_marks(table: Table) -> frozenset[State]:
    return _BASE_MARKS if table is BASE_TABLE else _MARKS | table.terminal


class EventStream:
    """The subscribers of one run, and the timings and counts of its stats (slots:
    every waiting run holds one)."""

    __slots__ = (
        "_calls",
        "_children",
        "_closed",
        "_first_message",
        "_model_calls",
        "_previous",
        "_questions",
        "_seen_messages",
        "_seen_trace",
        "_subscribers",
        "_t0",
        "_tool_counts",
        "_tool_seconds",
        "_turn",
        "_turn_marks",
        "_turn_seconds",
        "_turn_start",
    )

    def __init__(self, engine: Engine, previous: RunStats | None = None) -> None:
        self._previous = previous  # a resumed run's stats before the suspension
        self._children: tuple[RunStats, ...] = ()  # the sub-agents' stats
        self._turn = engine.turns + 1
        # Tuples, grown by a new one: most runs have no subscriber and no sub-agent,
        # and an empty tuple is shared rather than one more object per run.
        self._subscribers: tuple[_Subscriber, ...] = ()
        self._closed = False  # RunReturned has been told
        self._seen_messages = len(engine.messages)
        self._first_message = self._seen_messages  # the usage of this run starts here
        self._seen_trace = len(engine.trace)
        self._turn_marks = _turn_marks(engine.table)  # the engine's table is fixed
        self._t0 = time.perf_counter()
        self._turn_start: float | None = None
        self._turn_seconds: list[float] = []
        # call id -> the call and when it started (None: never), until it ends
        self._calls: dict[str, tuple[ToolCall, float | None]] = {}
        self._tool_seconds: dict[str, float] = {}
        self._tool_counts: dict[tuple[str, str], int] = {}  # (tool, outcome) -> calls
        self._model_calls = 0
        self._questions: RunQuestions | None = None

    @property
    def questions(self) -> RunQuestions:
        """The questions the run's tools wait on a person for (made when first asked
        or looked at: most runs have none)."""
        if self._questions is None:
            self._questions = RunQuestions(self.emit)
        return self._questions

    # -- subscribers -----------------------------------------------------------------------

    def subscribe(
        self, max_buffered: int = DEFAULT_MAX_BUFFERED_EVENTS, keep: tuple[type, ...] = ()
    ) -> AsyncIterator[RunEvent]:
        """An async iterator of the events from now on; it ends after ``RunReturned``
        (what a subscriber that lags is given: ``_Subscriber``; ``keep``: more event
        types it never drops)."""
        subscriber = _Subscriber(max_buffered, _KEPT.union(keep))
        if self._closed:
            subscriber.end()
        self._subscribers += (subscriber,)
        return subscriber.iterate(self._unsubscribe)

    def _unsubscribe(self, subscriber: _Subscriber) -> None:
        """Stop telling ``subscriber``: its iterator was closed (a watcher left)."""
        self._subscribers = tuple(s for s in self._subscribers if s is not subscriber)

    def emit(self, event: RunEvent | Callable[[], RunEvent]) -> None:
        """Give ``event`` (or what ``event()`` builds, only if someone listens) to every
        subscriber."""
        if not self._subscribers:
            return
        if callable(event):
            event = event()
        for subscriber in self._subscribers:
            subscriber.put(event)

    # -- what the action loop tells ----------------------------------------------------------

    def run_started(self, run_id: str) -> None:
        self._t0 = time.perf_counter()
        if self._subscribers:
            self.emit(RunStarted(run_id))

    def engine_moved(self, engine: Engine) -> None:
        """After each event: the turns timed, and the new messages and transitions told."""
        listening = bool(self._subscribers)
        if listening:
            history = engine.messages
            for index in range(self._seen_messages, len(history)):
                self.emit(MessageAdded(index, history[index]))
            self._seen_messages = len(history)
        records = engine.trace[self._seen_trace :]  # the new ones, read at once
        self._seen_trace += len(records)
        for record in records:
            if listening:
                self.emit(StateChanged(record))
            if record.dest not in self._turn_marks:
                continue  # most transitions: a turn neither starts nor ends there
            if record.dest is _AWAITING_MODEL:
                self._turn = record.turn + 1
                self._turn_start = time.perf_counter()
                if listening:
                    self.emit(TurnStarted(record.turn + 1))
            elif self._turn_start is not None:
                seconds = time.perf_counter() - self._turn_start
                self._turn_start = None
                self._turn_seconds.append(seconds)
                if listening:
                    self.emit(TurnEnded(record.turn, seconds))

    def model_called(self) -> None:
        self._model_calls += 1

    def text_delta(self, text: str) -> None:
        """A fragment of streamed text, from the model client."""
        if text and self._subscribers:  # called for every fragment: nothing made for none
            self.emit(TextDelta(self._turn, text))

    def tool_call_delta(self, index: int, call_id: str, name: str, arguments: str) -> None:
        """A fragment of a streamed tool call's arguments, from the model client."""
        if self._subscribers:
            self.emit(ToolCallDelta(self._turn, index, call_id, name, arguments))

    def add_child(self, stats: RunStats) -> None:
        """Count a sub-agent's run (a tool of this run) in this run's stats."""
        self._children += (stats,)

    def tool_started(self, call: ToolCall, begun: bool = True) -> None:
        """A tool call the engine asked for: ``begun``, or answered without being run
        (asked for after the abort)."""
        self._calls[call.id] = (call, time.perf_counter() if begun else None)
        if begun and self._subscribers:
            self.emit(ToolStarted(call))

    def tool_ended(self, event: ToolFinished | ToolCancelled, abandoned: bool) -> None:
        """A tool call's one answer, as the engine is about to get it."""
        call_id = event.call_id
        begun = self._calls.pop(call_id, None)
        if not self._calls:
            # A run waits for its model between batches: with an empty table, not the
            # one its batch grew (thousands of runs may wait in one process); clear()
            # lets the table go without making a new dict.
            self._calls.clear()
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
        if self._subscribers:  # the event is made only for someone listening
            if isinstance(event, ToolFinished):
                output = event.output
            else:
                output = ToolOutput(f"Operation aborted: {event.reason}", is_error=True)
            cancelled = isinstance(event, ToolCancelled)
            self.emit(ToolEnded(call, output, seconds, cancelled, cancelled and abandoned))

    def run_returned(self, engine: Engine) -> None:
        """The engine returned to the caller: ``RunReturned``, then the end of every
        subscriber's iterator."""
        self._closed = True
        if not self._subscribers:
            return
        self.emit(RunReturned(engine.state, engine.explanation or "", self.stats(engine)))
        for subscriber in self._subscribers:
            subscriber.end()

    # -- the stats ---------------------------------------------------------------------------

    def stats(self, engine: Engine) -> RunStats:
        usage = Usage()
        for message in engine.messages[self._first_message :]:
            if isinstance(message, AssistantMessage) and message.usage is not None:
                usage = usage + message.usage
        by_name: dict[str, dict[str, int]] = {}
        for (name, outcome), count in self._tool_counts.items():
            by_name.setdefault(name, {})[outcome] = count
        own = RunStats(
            model_calls=self._model_calls,
            tool_calls=by_name,
            usage=usage,
            turn_seconds=tuple(self._turn_seconds),
            tool_seconds=dict(self._tool_seconds),
            wall_seconds=time.perf_counter() - self._t0,
        )
        for child in self._children:
            # Its model calls, tool calls and usage; its time is this run's already.
            own = own + attrs.evolve(child, turn_seconds=(), tool_seconds={}, wall_seconds=0.0)
        return own if self._previous is None else self._previous + own


class _Subscriber:
    """The unread events of one subscriber, bounded whatever the run does.

    - A ``ToolProgress`` replaces the one of the same call that is still unread, in
      its place: a subscriber that lags gets the newest progress of each call.
    - Past ``max_buffered`` unread events, the events that only describe the run's
      progress (``TextDelta``, ``ToolCallDelta``, ``StateChanged``, ``TurnStarted``,
      ``TurnEnded``, ``ToolLog``, a new ``ToolProgress``) are dropped, and the subscriber finds
      one ``EventsDropped(count)`` where they would have been. ``RunStarted``,
      ``MessageAdded``, ``ToolStarted``, ``ToolEnded``, ``RunReturned``, ``ToolAsked``
      and ``ToolAnswered`` are always kept, whatever the count: the history holds the
      contents of the others, and a person must see every question.

    The run never waits for a subscriber.
    """

    def __init__(self, max_buffered: int, kept: frozenset[type] = _KEPT) -> None:
        if isinstance(max_buffered, bool) or not (
            isinstance(max_buffered, int) and max_buffered > 0
        ):
            raise InvalidInputError(
                f"max_buffered must be a positive integer, got {max_buffered!r}"
            )
        self._limit = max_buffered
        self._kept = kept
        self._items: deque[RunEvent | list[int] | None] = deque()  # list[int]: a drop count
        self._first = 0  # the position (counted from the first event) of _items[0]
        self._progress: dict[str, int] = {}  # call id -> position of its unread progress
        self._droppable = 0  # unread events that may be dropped
        self._wake = asyncio.Event()

    def put(self, event: RunEvent) -> None:
        items = self._items
        if type(event) in self._kept:
            items.append(event)
        elif isinstance(event, ToolProgress) and event.call_id in self._progress:
            items[self._progress[event.call_id] - self._first] = event
        elif self._droppable < self._limit:
            if isinstance(event, ToolProgress):
                self._progress[event.call_id] = self._first + len(items)
            self._droppable += 1
            items.append(event)
        elif items and isinstance(items[-1], list):
            items[-1][0] += 1
        else:
            items.append([1])
        self._wake.set()

    def end(self) -> None:
        self._items.append(None)
        self._wake.set()

    def _take(self) -> RunEvent | list[int] | None:
        item = self._items.popleft()
        self._first += 1
        if item is None or isinstance(item, list) or type(item) in self._kept:
            return item
        self._droppable -= 1
        if isinstance(item, ToolProgress):
            del self._progress[item.call_id]
        return item

    async def iterate(self, leave: Callable[[_Subscriber], None]) -> AsyncIterator[RunEvent]:
        """The events, until the run returns; ``leave(self)`` once the iterator is
        closed or ends, so that a subscriber that left is no longer given events."""
        try:
            while True:
                if not self._items:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                item = self._take()
                if item is None:
                    return
                yield EventsDropped(item[0]) if isinstance(item, list) else item
        finally:
            leave(self)


class StreamedRun(Generic[OutputT]):
    """A run being streamed (``Agent.run_stream``): its events, its text, its result."""

    def __init__(self, run: AgentRun[OutputT], given: int, turn: SessionTurn | None = None) -> None:
        self.run = run
        self._given = given
        self._turn = turn  # the run's turn in a session (statemachine.sessions), if any
        # Subscribed before the run starts, so it sees it all; the text deltas are never
        # dropped for lag (the answer's text is held by the run anyway), so
        # stream_text() read late is still the whole text.
        self._events = run._stream.subscribe(keep=(TextDelta,))
        self.task: asyncio.Task[RunResult[OutputT]] = asyncio.ensure_future(run.run())

    def __aiter__(self) -> AsyncIterator[RunEvent]:
        return self._events

    async def stream_text(self) -> AsyncIterator[str]:
        """The answer's text fragments as they arrive (``TextDelta`` events): every
        fragment, however far this reader lags (the other progress events may be
        dropped for a lagging reader, ``EventsDropped``; the text never is)."""
        async for event in self._events:
            if isinstance(event, TextDelta):
                yield event.text

    async def result(self) -> RunResult[OutputT]:
        """How the run returned (waits for it); stored in the run's session, if any."""
        try:
            result = attrs.evolve(await self.task, given=self._given)
        except BaseException:
            if self._turn is not None:
                self._turn.release()
            raise
        return result if self._turn is None else await self._turn.keep(result)

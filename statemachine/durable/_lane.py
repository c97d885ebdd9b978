"""The control lane of a durable run, on any backend: messages to the run, and where
they took effect.

A message to a run (steer, follow-up, abort, a decision) is stored by the backend
for the run (on DBOS: a message on one topic). The run listens for the next one all
the time, with one durable wait (on DBOS: a ``recv`` of up to a week, then another),
so a message reaches the run as soon as the backend notices it, in the middle of a
tool call too. Where it took effect is recorded:

- Each listener starts at a point fixed by the run's own course (the start of the
  workflow, or just after the previous message took effect): the wait starts, and
  the id of an operation, ``statemachine.control``, is drawn (``_reserve``).
  When the message has come, the run takes it between two engine events and that
  operation records ``{"at": n, "message": m, "ending": e, "n": k, "catches_up": True}``:
  ``n`` is how many events the engine had been handed in this workflow when the
  message took effect, ``e`` whether the run was looking then (taking the messages
  stored before it closed, or catching up), ``k`` how many messages it had taken
  before (a look's record is drawn after the listener's, but may be taken first),
  ``catches_up`` that this version recorded it (below).
- The run takes a message only once that record is saved, so nothing the message
  caused can be saved before it.
- After a crash the records are read first (one read, not an operation), and each
  message takes effect again after exactly ``n`` events (once the run is ending
  again, for a message taken while it was); the engine so receives the
  same events in the same order as before the crash, and every operation is started
  at the same point, so the backend gives it the same operation id.
- A message received but whose place was not recorded before the crash never took
  effect: it takes effect anew, but only once every operation recorded before the
  crash has been started again (else an operation recorded without the message
  would be started after it).
- After an abort the run stops listening: what follows an abort (cancellations,
  the grace period) depends on timing, so no later message could be placed again.
- No message that was sent is left unread: before the engine is handed a final
  answer, and once more when the run has ended (``sync``), the run publishes the event
  ``OPEN`` as ``False`` (it is ending; ``True`` again if input came and it goes on)
  and then takes every message stored before that. A sender reads ``OPEN`` after its
  message is stored: while it is not ``False``, its message was stored before the
  run closed, so the run takes it; otherwise the sender waits for the run to go on or
  to end, and then learns whether its message was taken (on DBOS:
  ``DBOSRunHandle.steer``). The messages taken before a final answer reach the model
  (the engine goes on to a turn boundary); those taken after the run ended are its
  ``queued_input``, as with ``AgentRun``.
- How the run takes every message stored before it closed: it looks, without
  waiting (``_look``, recorded): it takes the oldest message no listener has taken,
  if there is one, and learns whether the listener has taken one the run has not
  seen yet. Neither: every message stored before the close has been taken, and the
  run ends at once (the listener's wait, which the backend may only notice at its
  next poll, is not waited for). Otherwise the run takes what the listener and the
  look hold (the listener's first, being the older), and looks again, until a look
  finds nothing, or input came (the run goes on, and looks again at its next end),
  or an abort. A backend that cannot look sends the run a marker instead, and the run
  takes every message until the marker (the messages of a topic come in the order
  they were stored, so every message stored before the marker is taken before it).

- Once a steer or follow-up has been taken, the run looks the same way before the
  engine is handed its next event (which may end the turn and start a model call),
  still open (``catch_up``): the listener takes one message at a time, so without
  this a flood of messages would spread over later turns. A message taken while the
  run looks is recorded as ``ending`` too: after a crash it waits until the run looks
  again at the same point. A backend that cannot look does not catch up, nor does a
  run that took a message under an older version (its records lack ``catches_up``).

A backend numbers a run's operations in the order they are called (DBOS does); so
every operation of a run is started eagerly (up to its first wait) at the point the
engine asks for it, never later in a task (``start_now``).
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
from collections import deque
from collections.abc import Callable, Coroutine, Generator, Mapping, Sequence
from typing import Any, TypeVar

__all__ = ["NOTHING", "OPEN", "SYNC", "ControlLane", "start_now"]

SYNC = "sync"  # the kind of the marker a run sends itself (module docstring)
OPEN = "statemachine.open"  # published: whether the run is ending (module docstring)
NOTHING: Any = object()  # no message takes effect now

_T = TypeVar("_T")


def start_now(coro: Coroutine[Any, Any, _T]) -> asyncio.Future[_T]:
    """Run ``coro`` up to its first wait now (the backend numbers its operation
    there), in a context of its own as a task would, and carry it on as a task.

    Python 3.12+ does this itself (``eager_start``); Python 3.11 has no eager start,
    so there the coroutine is stepped once here and its task carries it on from that
    first wait (``_Resumed``)."""
    loop = asyncio.get_running_loop()
    if sys.version_info >= (3, 12):
        return asyncio.Task(coro, loop=loop, eager_start=True)
    context = contextvars.copy_context()
    try:
        waiting_on = context.run(coro.send, None)
    except StopIteration as stop:
        done: asyncio.Future[_T] = loop.create_future()
        done.set_result(stop.value)
        return done
    return loop.create_task(_carry_on(coro, waiting_on), context=context)


async def _carry_on(coro: Coroutine[Any, Any, _T], waiting_on: Any) -> _T:
    """Carry on, as a task, a coroutine already run to its first wait; its result."""
    result: _T = await _Resumed(coro, waiting_on)
    return result


class _Resumed:
    """Awaiting this goes on with a coroutine that has already run to its first wait
    (on ``waiting_on``): the task passes what it receives straight through."""

    def __init__(self, coro: Coroutine[Any, Any, Any], waiting_on: Any) -> None:
        self._coro = coro
        self._waiting_on = waiting_on

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, value = self._coro, self._waiting_on
        while True:
            try:
                try:
                    sent = yield value
                except GeneratorExit:
                    # Closed (a task destroyed while pending): close the coroutine
                    # too, which may be closed already, being garbage of the same
                    # collection.
                    coro.close()
                    raise
                except BaseException as exc:  # noqa: BLE001 - passed on, as the task would
                    value = coro.throw(exc)
                else:
                    value = coro.send(sent)
            except StopIteration as stop:
                return stop.value


def _in_taken_order(places: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Recorded places, in the backend's order, in the order their messages were taken:
    those recorded without the count (by an older version, which took them in the
    backend's order) first."""
    order = sorted(
        range(len(places)), key=lambda i: (1, places[i]["n"]) if "n" in places[i] else (0, i)
    )
    return [places[i] for i in order]


class ControlLane:
    """The control lane of one execution of a run (module docstring); a backend
    supplies the primitives (``_listen`` and the others below ``close``)."""

    def __init__(self, places: Sequence[Mapping[str, Any]], last_recorded: int) -> None:
        self.handled = 0  # engine events handed over in this workflow so far
        self.stopped = False
        self.on_arrival: Callable[[], None] | None = None  # wakes whoever takes messages
        # The recorded places (in the backend's order), in the order they were taken.
        self._schedule = deque(
            (p["at"], p["message"], bool(p.get("ending"))) for p in _in_taken_order(places)
        )
        self._taken = 0  # messages taken in this workflow so far
        self._last_recorded = last_recorded  # the last operation recorded before a crash
        self._recv: asyncio.Future[Any] | None = None
        self._place: Any = None  # the reserved record of the message's place
        self._listening_since = 0  # ``_next_operation()`` when the listener started
        self._looked: deque[tuple[Any, Any]] = deque()  # a look's message and its place
        self._listener_first = False  # the listener holds an older message than the look
        self._settling = False  # closed, and looking for the messages stored before that
        self._heard = False  # input taken since the last look that found nothing
        # A run that took a message under an older version, which did not catch up,
        # never does: taken back, it calls the operations it called then.
        self._catches_up = all(p.get("catches_up") for p in places)
        self.catching_up = False  # looking, still open, before an event is handed over
        self._listeners: list[asyncio.Future[Any]] = []  # every recv started, for close()
        self._syncs_sent = 0  # markers sent to the run by this execution
        self._syncs_taken = 0  # markers taken back
        self._draining = False  # the run has ended: take every message, aborts too
        self.synced_at: int | None = None  # ``handled`` when the last sync found nothing left
        self.closed = False  # ``OPEN`` is False: the run is ending (module docstring)

    def start(self) -> None:
        """Listen for the next message (at a point fixed by the run's course): the
        ``recv`` starts now, and the id of the step recording its place is drawn."""
        if self.stopped:
            return
        self._listening_since = self._next_operation()
        recv = self._listen()
        self._recv = recv
        self._place = self._reserve()
        self._listeners.append(recv)
        recv.add_done_callback(self._arrived)

    def _arrived(self, recv: asyncio.Future[Any]) -> None:
        if recv is self._recv and not recv.cancelled() and self.on_arrival is not None:
            self.on_arrival()

    async def due(self, waiting: bool = False) -> Any:
        """The message that takes effect now (its place recorded first), ``NOTHING``
        if none; ``waiting``: the run waits for a person, nothing blocks it."""
        recv = self._recv
        # The look's message next (after an abort, as the listener's, only at the end).
        looked = bool(self._looked) and not self._listener_first and not self.stopped
        if self._schedule:
            at, message, ending = self._schedule[0]
            if at > self.handled or (ending and not self._ending()):
                return NOTHING  # later in the run's course (when it is ending)
            if at < self.handled:
                raise RuntimeError(
                    f"a recorded message took effect after {at} events, but the run is "
                    f"past {self.handled}: the records do not fit this run"
                )
            self._schedule.popleft()
            if looked:  # recorded from the look: its message again, placed already
                self._looked.popleft()
        elif looked:
            place, message = self._looked.popleft()
            await self._record_place(place, self._record(message))
        elif (
            recv is not None and recv.done() and not self.stopped and (waiting or self._caught_up())
        ):
            message = recv.result()
            assert self._place is not None
            place, self._recv, self._place = self._place, None, None
            await self._record_place(place, self._record(message))
        else:
            return NOTHING
        self._taken += 1
        kind = message.get("kind") if isinstance(message, Mapping) else None
        if kind == "abort" and not self._draining:
            self.stopped = True
        elif kind == SYNC:
            self._syncs_taken += 1
            self.synced_at = self.handled
        elif kind in ("steer", "follow_up") and not self._draining:
            self._heard = True  # more may follow at once: looked for before the next event
            if self.closed:
                # Input before a final answer: the run goes on, and will take what is
                # sent from now on at its next end.
                await self._set_open(True)
        if not looked:
            self._listener_first = False
            self.start()  # the listener's message: listen for the next one
        await self._settle()
        return message

    async def sync(self) -> None:
        """Close the run to messages (``OPEN``), then take every message stored before
        that: ``synced()`` once they are taken (module docstring)."""
        if not self.closed:
            await self._set_open(False)
        self._settling = True
        self.synced_at = None  # set once nothing is left
        await self._settle()

    async def catch_up(self) -> bool:
        """Before the engine is handed an event (which may end the turn): whether the
        event may go now. Input came since the last look that found nothing: the run
        looks, still open, as ``sync`` does, and every message it finds (and the
        listener's) is due first; ``catching_up`` until a look finds nothing."""
        if self.catching_up:
            return False
        if not self._heard or self.stopped or self._settling or not self._catches_up:
            return True
        self.catching_up = True
        await self._settle()
        return not self.catching_up

    async def _settle(self) -> None:
        """Look (``_look``) while the run is closed (``sync``) or catching up, and every
        message a look found has been taken, until a look finds nothing; then the run is
        synced, or caught up. A message a look found is taken next (after the
        listener's, if it holds one). A backend that cannot look gets a marker instead
        when it closes, and does not catch up."""
        while not self._looked and not self._listener_first:
            if self._settling:
                if not self.closed or self.stopped:  # input came, the run goes on (and
                    self._settling = False  # takes what follows at its next end); or an
                    return  # abort came
            elif not self.catching_up:
                return
            elif self.stopped:
                self.catching_up = False
                return
            # Always looked here, whatever the listener's state now, which depends on
            # timing: the run's operations are the same when it runs again after a crash.
            listener = None if self._recv is None else self._listening_since
            looked = await self._look(listener)
            if looked is None:
                self.catching_up = self._heard = False
                if self._settling:
                    self._settling = False
                    self._syncs_sent += 1
                    await start_now(self._send({"kind": SYNC, "n": self._syncs_sent}))
                return
            message, self._listener_first = looked
            if message is not None:
                self._looked.append((self._reserve(), message))
            elif not self._listener_first:
                self.catching_up = self._heard = False
                if self._settling:
                    self._settling = False
                    self.synced_at = self.handled

    async def _set_open(self, is_open: bool) -> None:
        self.closed = not is_open
        await start_now(self._publish(OPEN, is_open))

    def _record(self, message: Any) -> dict[str, Any]:
        """The record of ``message``'s place, taking effect now."""
        return {
            "at": self.handled,
            "message": message,
            "ending": self._ending(),
            "n": self._taken,
            "catches_up": True,
        }

    def _ending(self) -> bool:
        """The run is looking for the messages stored so far: closed and taking those
        stored before that, or catching up (recorded as ``ending``: after a crash such a
        message waits until the run looks again at the same point)."""
        return self._settling or self.catching_up or self._syncs_taken < self._syncs_sent

    def synced(self) -> bool:
        """Every message stored before the run closed has been taken: the last look
        found none, and every marker sent has been taken."""
        return not self._settling and self._syncs_taken >= self._syncs_sent

    async def drain(self) -> list[Any]:
        """At the run's end: close it to messages and take every message stored so far
        (places recorded); returns them. Nothing to do right after a final answer
        taken once the run was closed and synced."""
        synced_at = self.synced_at
        if (
            self.closed
            and self.synced()
            and synced_at is not None
            and self.handled - synced_at <= 1
        ):
            return []
        self._draining = True
        if self.stopped:  # after an abort: listen again, now that nothing follows
            self.stopped = False
            if self._recv is None:  # (a look took the abort: the listener still listens)
                self.start()
        await self.sync()
        taken: list[Any] = []
        while not self.synced():
            message = await self.next_message()
            if not (isinstance(message, Mapping) and message.get("kind") == SYNC):
                taken.append(message)
        return taken

    def _caught_up(self) -> bool:
        """Every operation recorded before a crash has been started again."""
        return self._next_operation() >= self._last_recorded

    async def next_message(self) -> Any:
        """Wait for the next message while the run waits for a person."""
        while True:
            message = await self.due(waiting=True)
            if message is not NOTHING:
                return message
            if self._schedule:
                raise RuntimeError(
                    f"a recorded message took effect after {self._schedule[0][0]} events, "
                    f"but the run waits after {self.handled}: the records do not fit this run"
                )
            arrived = asyncio.Event()
            self.on_arrival = arrived.set
            try:
                if self._recv is not None and not self._recv.done():
                    await arrived.wait()
            finally:
                self.on_arrival = None

    async def close(self) -> None:
        """Stop listening (the run is over): a message not taken stays unread."""
        self.stopped = True
        # A task cancelled before its first step never passes the cancellation on to
        # the coroutine it carries (``start_now``): that ``recv`` would be closed by
        # the garbage collector, outside its context, while its setup, in a thread,
        # went on to write to a finished run. Each listener first takes its step.
        await asyncio.sleep(0)
        for recv in self._listeners:
            recv.cancel()
        for recv in self._listeners:
            try:
                await recv
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - cancelled on purpose
                pass

    # -- what a backend supplies --------------------------------------------------------

    def _listen(self) -> asyncio.Future[Any]:
        """Start a durable wait for the next message to the run, now (its operation
        numbered here, ``start_now``); its result is the message."""
        raise NotImplementedError

    async def _look(self, listening_since: int | None) -> tuple[Any, bool] | None:
        """Without waiting, and recorded: take the oldest message stored for the run
        that no listener has taken (``None`` if there is none), then tell whether the
        listener started when the run had called ``listening_since`` operations has
        taken one since (``None``: no listener, after an abort). ``None``: this backend
        cannot look (a marker is sent)."""
        return None

    def _reserve(self) -> Any:
        """Reserve, now, the operation that will record the next message's place."""
        raise NotImplementedError

    async def _record_place(self, place: Any, record: Mapping[str, Any]) -> None:
        """Record, as the reserved operation ``place``, ``record`` (module docstring)."""
        raise NotImplementedError

    async def _publish(self, key: str, value: Any) -> None:
        """Publish ``value`` under ``key`` for anyone to read (a recorded operation)."""
        raise NotImplementedError

    async def _send(self, marker: Mapping[str, Any]) -> None:
        """Send ``marker`` to the run itself, behind the messages stored before it."""
        raise NotImplementedError

    def _next_operation(self) -> int:
        """How many operations the run has called so far in this execution."""
        raise NotImplementedError

"""The control lane of a durable run: messages to the run, and where they took effect.

A message to a run (steer, follow-up, abort, a decision) is a DBOS message on one
topic. The run listens for the next one all the time, with one ``recv`` that waits
(for up to a week, then another), so a message reaches the run as soon as DBOS
notices it, in the middle of a tool call too. Where it took effect is recorded:

- Each listener starts at a point fixed by the run's own course (the start of the
  workflow, or just after the previous message took effect): the ``recv`` starts,
  and the id of a step, ``statemachine.control``, is drawn (``DBOS.reserve_step``).
  When the message has come, the run takes it between two engine events and that
  step records ``{"at": n, "message": m}``: ``n`` is how many events the engine had
  been handed in this workflow when the message took effect.
- The run takes a message only once that record is saved, so nothing the message
  caused can be saved before it.
- After a crash the records are read first (one read, not an operation), and each
  message takes effect again after exactly ``n`` events; the engine so receives the
  same events in the same order as before the crash, and every operation is started
  at the same point, so DBOS gives it the same operation id.
- A message received but whose place was not recorded before the crash never took
  effect: it takes effect anew, but only once every operation recorded before the
  crash has been started again (else an operation recorded without the message
  would be started after it).
- After an abort the run stops listening: what follows an abort (cancellations,
  the grace period) depends on timing, so no later message could be placed again.

DBOS draws an operation id when an operation is called, in call order; so every
operation of a run is started eagerly (up to its first wait) at the point the engine
asks for it, never later in a task (``start_now``).
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
from collections import deque
from collections.abc import Callable, Coroutine, Generator, Mapping, Sequence
from typing import Any, TypeVar

from dbos import DBOS, StepOptions, StepReservation

__all__ = ["NOTHING", "Control", "start_now"]

TOPIC = "statemachine.control"  # the topic of every message to a run
STEP = "statemachine.control"  # the step recording where a message took effect
WAIT_SECONDS = 7 * 24 * 3600.0  # one recv's wait; then the run listens again
NOTHING: Any = object()  # no message takes effect now

_T = TypeVar("_T")


def start_now(coro: Coroutine[Any, Any, _T]) -> asyncio.Future[_T]:
    """Run ``coro`` up to its first wait now (DBOS draws its operation id there), in
    a context of its own as a task would, and carry it on as a task.

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


def _next_operation_id() -> int:
    """The id DBOS gives the workflow's next operation, less one."""
    # Not public in DBOS: the workflow's context counts the operations called so far.
    from dbos._context import get_local_dbos_context

    ctx = get_local_dbos_context()
    return 0 if ctx is None else int(ctx.function_id)


async def _record(at: int, message: Any) -> dict[str, Any]:
    return {"at": at, "message": message}


class Control:
    """The control lane of one execution of a run's workflow (module docstring)."""

    def __init__(self, recorded: Sequence[Mapping[str, Any]]) -> None:
        self.handled = 0  # engine events handed over in this workflow so far
        self.stopped = False
        self.on_arrival: Callable[[], None] | None = None  # wakes whoever takes messages
        self._schedule: deque[tuple[int, Any]] = deque(
            (s["output"]["at"], s["output"]["message"])
            for s in sorted(recorded, key=lambda s: s["function_id"])
            if s["function_name"] == STEP and isinstance(s.get("output"), dict)
        )
        self._last_recorded = max((s["function_id"] for s in recorded), default=0)
        self._recv: asyncio.Future[Any] | None = None
        self._place: StepReservation | None = None
        self._listeners: list[asyncio.Future[Any]] = []  # every recv started, for close()

    def start(self) -> None:
        """Listen for the next message (at a point fixed by the run's course): the
        ``recv`` starts now, and the id of the step recording its place is drawn."""
        if self.stopped:
            return
        recv = start_now(DBOS.recv_async(TOPIC, timeout_seconds=WAIT_SECONDS))
        self._recv = recv
        self._place = DBOS.reserve_step()
        self._listeners.append(recv)
        recv.add_done_callback(self._arrived)

    def _arrived(self, recv: asyncio.Future[Any]) -> None:
        if recv is self._recv and not recv.cancelled() and self.on_arrival is not None:
            self.on_arrival()

    async def due(self, waiting: bool = False) -> Any:
        """The message that takes effect now (its place recorded first), ``NOTHING``
        if none; ``waiting``: the run waits for a person, nothing blocks it."""
        recv = self._recv
        if self._schedule:
            at, message = self._schedule[0]
            if at > self.handled:
                return NOTHING  # later in the run's course
            if at < self.handled:
                raise RuntimeError(
                    f"a recorded message took effect after {at} events, but the run is "
                    f"past {self.handled}: the records do not fit this run"
                )
            self._schedule.popleft()
        elif recv is not None and recv.done() and (waiting or self._caught_up()):
            message = recv.result()
            assert self._place is not None
            place, self._recv, self._place = self._place, None, None
            await place.run_async(StepOptions(name=STEP), _record, self.handled, message)
        else:
            return NOTHING
        if isinstance(message, Mapping) and message.get("kind") == "abort":
            self.stopped = True
        self.start()
        return message

    def _caught_up(self) -> bool:
        """Every operation recorded before a crash has been started again."""
        return _next_operation_id() >= self._last_recorded

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
        for recv in self._listeners:
            recv.cancel()
        for recv in self._listeners:
            try:
                await recv
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - cancelled on purpose
                pass

"""The executor of a durable run: ``AgentRun`` with each operation a DBOS step.

Each model call, tool call, batch of ``before_tool_call`` checks,
``should_continue`` check and declared step's decision runs as a DBOS step whose
recorded output is the JSON of the engine events it reported (``_wire``). Every
step is started eagerly, at the point the engine asks for it, so that DBOS numbers
the steps in the engine's order (``_lane.start_now``). The tool results of a batch
are handed to the engine in call order, whatever order the tools finish in, so that
this order does not depend on timing. Messages to the run come through its inbox, between two
engine events, at the place ``_dbos_control.Control`` records; before a final
answer the inbox first takes every message stored for the run (``_lane``). A step
that does not fit what the run recorded in its place (the worker's code differs)
hands nothing to the engine: it tells the workflow, which holds the run.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections import deque
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from functools import partial
from typing import Any

from dbos import DBOS, StepOptions

from statemachine.agent.events import RunResult
from statemachine.agent.executor import AsyncioExecutor
from statemachine.agent.loop import ActionLoop
from statemachine.agent.run import AgentRun, ExecutorFactory, use_backend
from statemachine.core.events import (
    CallModel,
    Event,
    InputKind,
    InputQueued,
    ModelResponded,
    RunStep,
    StepDecided,
)
from statemachine.core.messages import ToolCall
from statemachine.durable import _durable_run_id
from statemachine.durable._course import user_message
from statemachine.durable._dbos_control import NOTHING, Control, start_now
from statemachine.durable._dbos_errors import DBOSUnexpectedStepError
from statemachine.durable._journal import DECISION_STEP, NOT_RECORDED
from statemachine.durable._order import CallOrder
from statemachine.durable._wire import decode_step_events, encode_step_events

__all__ = ["ControlInbox", "DurableExecutor", "DurableRun"]

_capture: contextvars.ContextVar[_Capture | None] = contextvars.ContextVar(
    "statemachine_durable_capture", default=None
)


class _Capture:
    """Stands in for the loop's inbox inside a step: keeps what the operation reports,
    so that the step's recorded output is exactly those events."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def put_nowait(self, event: Event) -> None:
        self.events.append(event)


class ControlInbox:
    """The loop's inbox (an ``Inbox``), which also hands over the messages to the run
    where the control lane places them. The loop always asks ``get`` (which places
    the messages), so it never takes a queued event past a message's place."""

    __slots__ = ("_queue", "_run", "_synced_for", "_waiter")

    def __init__(self, run: DurableRun) -> None:
        self._queue: deque[Event] = deque()
        self._run = run
        self._waiter: asyncio.Future[None] | None = None
        self._synced_for: Event | None = None  # the final answer a marker was sent for

    def put_nowait(self, event: Event) -> None:
        self._queue.append(event)
        self.wake()

    def empty(self) -> bool:
        return not self._queue

    def get_nowait(self) -> Event:
        return self._queue.popleft()

    def wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> Event:
        while True:
            message = await self._run.control.due()
            if message is not NOTHING:
                event = self._run.take(message)
                if event is not None:
                    return event
                continue
            if self._queue:
                head = self._queue[0]
                control = self._run.control
                if not self._run.ends_unless_told(head):
                    # Input came this turn: what was stored since is taken before the
                    # event, which may end the turn (``_lane``: ``catch_up``).
                    if not control.catching_up:
                        if await control.catch_up():
                            return self._queue.popleft()
                        continue
                    await self._wait()  # the listener's message is on its way
                    continue
                # A final answer: every message sent so far is taken first, so that
                # none is left unread when the run ends (``_lane``).
                if self._synced_for is not head:
                    self._synced_for = head
                    await control.sync()
                    continue
                if control.synced():
                    return self._queue.popleft()
            await self._wait()

    async def _wait(self) -> None:
        """Wait until an operation reports or a message comes."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiter = waiter
        try:
            await waiter
        finally:
            self._waiter = None


class DurableExecutor(AsyncioExecutor):
    """The executor of a durable run: each operation a DBOS step (module docstring)."""

    def __init__(self, loop: ActionLoop, *, control: Control | None = None, **parts: Any) -> None:
        super().__init__(loop, **parts)
        self.control = control
        self._order = CallOrder(self._post_events, loop.reported)  # tools in call order

    # Inside a step, what an operation reports goes to the step's capture.

    def report(self, key: str, event: Event) -> None:
        capture = _capture.get()
        if capture is not None:
            capture.put_nowait(event)
            return
        super().report(key, event)
        self._flush()

    def put(self, event: Event) -> None:
        capture = _capture.get()
        if capture is not None:
            capture.put_nowait(event)
            return
        super().put(event)

    # -- the Executor protocol: every step started now, DBOS numbers it now -----------------

    def new_task(self, coro: Coroutine[Any, Any, None], *, eager: bool) -> asyncio.Future[None]:
        return start_now(coro)

    def start_model(self, action: CallModel, alone: bool) -> None:
        step = self._step("model", "statemachine.model", partial(self.call_model, action))
        self.start_operation("model", step, eager=True)

    def start_tool(self, call: ToolCall, alone: bool) -> None:
        self._order.started(call.id)
        step = self._step(call.id, "statemachine.tool", partial(self.run_tool, call))
        self.start_operation(call.id, step, eager=True)

    def start_permission_checks(self, calls: Sequence[ToolCall]) -> None:
        check = partial(self.check_permissions, calls)
        self.start_helper(self._step("", "statemachine.permissions", check), eager=True)

    def start_continue_check(self, turn: int) -> None:
        check = partial(self.check_continue, turn)
        self.start_helper(self._step("", "statemachine.continue", check), eager=True)

    def start_step(self, action: RunStep) -> None:
        decide = partial(self.run_step, action)
        self.start_helper(self._step("", DECISION_STEP, decide), eager=True)

    # -- steps -----------------------------------------------------------------------------

    async def _step(
        self, key: str, name: str, operation: Callable[[], Coroutine[Any, Any, None]]
    ) -> None:
        """Run ``operation`` as the DBOS step ``name``; hand its events to the loop."""
        capture = _Capture()
        run_id = self.loop.engine.run_id

        async def step() -> list[dict[str, Any]]:
            capture.events.clear()  # a retried attempt starts afresh
            token = _capture.set(capture)
            run_token = _durable_run_id.set(run_id)
            try:
                await operation()
            finally:
                _durable_run_id.reset(run_token)
                _capture.reset(token)
            return encode_step_events(capture.events)

        try:
            saved = await self.saved(name, key, step)
        except DBOSUnexpectedStepError as exc:
            # The run recorded another operation here: this worker's code does not
            # fit it. Nothing is handed to the engine; the workflow holds the run
            # (``DBOSRunner._execute``), which cancels this wait.
            mismatch = None if self.control is None else self.control.mismatch
            if mismatch is not None and not mismatch.done():
                mismatch.set_result(str(exc))
            await asyncio.get_running_loop().create_future()
            raise
        except asyncio.CancelledError:
            # Cancelled after an abort: what it reported (its cancellation) still
            # answers it; not recorded, so a recovery runs the call again. If it
            # reported nothing, the grace period's end answers for it.
            if capture.events:
                self.deliver(key, capture.events)
            raise
        if saved is not NOT_RECORDED:
            events = decode_step_events(saved)
            for event in events:
                if isinstance(event, StepDecided):
                    # A recorded decision (not run again) makes the compacted view the
                    # model calls from now on are sent, as it did when it was made.
                    self.hook_caller.views.note(event)
            self.deliver(key, events)

    async def saved(
        self, name: str, key: str, step: Callable[[], Coroutine[Any, Any, list[dict[str, Any]]]]
    ) -> Any:
        """The step's output: ``step`` run as a DBOS step (or, when the workflow runs
        again, the output DBOS recorded for it)."""
        return await DBOS.run_step_async(StepOptions(name=name), step)

    def deliver(self, key: str, events: list[Event]) -> None:
        """Hand the loop the events of the operation ``key`` (tools in call order)."""
        self._order.deliver(key, events)

    def _post_events(self, events: Iterable[Event]) -> None:
        for event in events:
            self.loop.inbox.put_nowait(event)

    def _flush(self) -> None:
        """Post the tool results that are next in call order."""
        self._order.flush()


class DurableRun(AgentRun):
    """``AgentRun`` with each operation a DBOS step (module docstring)."""

    _inbox_type: type[ControlInbox] = ControlInbox

    def __init__(
        self, *, control: Control, executor: ExecutorFactory = DurableExecutor, **kwargs: Any
    ) -> None:
        self.control = control
        super().__init__(**kwargs)
        self.inbox = self._inbox_type(self)
        executor = partial(executor, control=control)
        use_backend(self, inbox=self.inbox, executor=executor, on_handle=self._count)

    def _count(self, event: Event) -> None:
        self.control.handled += 1

    async def run(self) -> RunResult:
        self.control.on_arrival = self.inbox.wake
        try:
            return await super().run()
        finally:
            self.control.on_arrival = None

    def ends_unless_told(self, event: Event) -> bool:
        """Whether ``event`` is a final answer the run would end on, unless a message
        queued input first (and the run still listens for one)."""
        loop = self._loop
        return (
            isinstance(event, ModelResponded)
            and not event.message.tool_calls
            and not (loop is not None and loop.aborting)
            and not self.control.stopped
        )

    def take(self, message: Any) -> Event | None:
        """A message to the run, taking effect now: the event to hand the engine
        next, if any (an abort goes ahead by itself; a late decision is dropped)."""
        if not isinstance(message, Mapping):
            return None  # a listener's wait ended without a message
        kind = message.get("kind")
        if kind == "abort":
            self.abort(message.get("reason") or "aborted by the caller")
        elif kind in ("steer", "follow_up"):
            which = InputKind.STEER if kind == "steer" else InputKind.FOLLOW_UP
            return InputQueued(user_message(message), which)
        return None

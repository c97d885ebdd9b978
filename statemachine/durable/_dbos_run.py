"""The backend of a durable run: ``AgentRun`` with each operation a DBOS step.

Each model call, tool call, batch of ``before_tool_call`` checks,
``should_continue`` check and declared step's decision runs as a DBOS step whose
recorded output is the JSON of the engine events it reported (``_wire``). Every
step is started eagerly, at the point the engine asks for it, so that DBOS numbers
the steps in the engine's order (``_lane.start_now``). The tool results of a batch
are handed to the engine in call order, whatever order the tools finish in, so that
this order does not depend on timing. Messages to the run come through its inbox, between two
engine events, at the place ``_dbos_control.Control`` records; before a final
answer the inbox first takes every message stored for the run (``_lane``). A running
tool's question to a person is pending on the run and published; its answer is one of
those messages (``_questions``). A step
that does not fit what the run recorded in its place (the worker's code differs)
hands nothing to the engine: it tells the workflow, which holds the run.

The run is the driver's own (``AgentRun``, ``agent/run.py``), held by a ``LaneRun``
(``_course``), and given ``DBOSBackend`` (``agent/executor.py``: a ``Backend``),
which starts each operation as a step and keeps what it reports as the step's
output; the work itself is the driver's (``AsyncioExecutor.perform``).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from dbos import DBOS, DBOSClient, StepOptions

from statemachine.agent.executor import AsyncioExecutor, Operation
from statemachine.agent.questions import Answer, MakeQuestion
from statemachine.agent.run import AgentRun
from statemachine.core.abort import AbortSignal
from statemachine.core.events import Event, ModelResponded, StepDecided
from statemachine.core.messages import ToolCall
from statemachine.durable import _durable_run_id
from statemachine.durable._course import LaneRun, step_name
from statemachine.durable._dbos_control import NOTHING, Control, start_now
from statemachine.durable._dbos_errors import DBOSUnexpectedStepError
from statemachine.durable._dbos_status import QUESTIONS, find, pending_questions
from statemachine.durable._journal import NOT_RECORDED
from statemachine.durable._order import Handover
from statemachine.durable._questions import PublishQuestions
from statemachine.durable._wire import decode_step_events, encode_step_events

__all__ = [
    "ControlInbox",
    "DBOSBackend",
    "Saved",
    "durable_run",
    "forget_questions",
    "question_publisher",
]

StepBody = Callable[[], Coroutine[Any, Any, list[dict[str, Any]]]]
Saved = Callable[[str, str, StepBody], Awaitable[Any]]
"""What gives a step's output: ``(name, key, step)`` -> the output DBOS recorded for
the step (running ``step`` if it has none), or ``NOT_RECORDED``."""


async def run_step(name: str, key: str, step: StepBody) -> Any:
    """``step`` run as the DBOS step ``name`` (or, when the workflow runs again, the
    output DBOS recorded for it)."""
    return await DBOS.run_step_async(StepOptions(name=name), step)


class _Capture:
    """Where an operation reports inside a step (a ``Reports``): what it reports is
    kept, so that the step's recorded output is exactly those events."""

    __slots__ = ("events",)

    def __init__(self) -> None:
        self.events: list[Event] = []

    def report(self, key: str, event: Event) -> None:
        self.events.append(event)

    def put(self, event: Event) -> None:
        self.events.append(event)


class ControlInbox:
    """The loop's inbox (an ``Inbox``), which also hands over the messages to the run
    where the control lane places them. The loop always asks ``get`` (which places
    the messages), so it never takes a queued event past a message's place."""

    __slots__ = ("_queue", "_run", "_synced_for", "_waiter")

    def __init__(self, run: LaneRun) -> None:
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
                if not self._ends_unless_told(head):
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

    def _ends_unless_told(self, event: Event) -> bool:
        """Whether ``event`` is a final answer the run would end on, unless a message
        queued input first (and the run still listens for one)."""
        return (
            isinstance(event, ModelResponded)
            and not event.message.tool_calls
            and not self._run.aborting
            and not self._run.control.stopped
        )

    async def _wait(self) -> None:
        """Wait until an operation reports or a message comes (which wakes it)."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiter = waiter
        control = self._run.control
        control.on_arrival = self.wake
        try:
            await waiter
        finally:
            self._waiter = None
            control.on_arrival = None


class DBOSBackend:
    """Starts each operation as a DBOS step, eagerly (DBOS numbers it now), and hands
    the loop what it reported, tools in call order (module docstring); a
    ``Backend``. ``saved``: what gives a step's output (``run_step``; an export's
    answers it from the record)."""

    def __init__(self, control: Control, saved: Saved = run_step) -> None:
        self.control = control
        self.saved = saved
        self.handover = Handover()  # tools in call order

    def start(self, driver: AsyncioExecutor, op: Operation) -> None:
        self.handover.started(driver, op)
        driver.keep(op, start_now(self._step(driver, op)))

    def cancel(self, driver: AsyncioExecutor, keys: Sequence[str], reason: str) -> None:
        driver.track_helper(start_now(driver.cancel_after_grace(keys, reason)))

    def reported(self, key: str) -> None:
        self.handover.flush()

    async def ask(
        self, driver: AsyncioExecutor, call: ToolCall, make: MakeQuestion, signal: AbortSignal
    ) -> Answer | None:
        """Pending on the run and published for any process until a person answers it
        from a handle (``DBOSRunHandle.answer``, a message of the run); the answer
        recorded before a crash if the same question is asked again (``_questions``)."""
        return await self.control.questions.ask(driver, call, make, signal)

    async def _step(self, driver: AsyncioExecutor, op: Operation) -> None:
        """Run ``op`` as its DBOS step; hand its events to the loop."""
        capture = _Capture()
        run_id = driver.loop.engine.run_id

        async def step() -> list[dict[str, Any]]:
            capture.events.clear()  # a retried attempt starts afresh
            run_token = _durable_run_id.set(run_id)
            try:
                await driver.perform(op, capture)
            finally:
                _durable_run_id.reset(run_token)
            return encode_step_events(capture.events)

        try:
            saved = await self.saved(step_name(op), op.key, step)
        except DBOSUnexpectedStepError as exc:
            # The run recorded another operation here: this worker's code does not
            # fit it. Nothing is handed to the engine; the workflow holds the run
            # (``DBOSRunner._execute``), which cancels this wait.
            mismatch = self.control.mismatch
            if mismatch is not None and not mismatch.done():
                mismatch.set_result(str(exc))
            await asyncio.get_running_loop().create_future()
            raise
        except asyncio.CancelledError:
            # Cancelled after an abort: what it reported (its cancellation) still
            # answers it; not recorded, so a recovery runs the call again. If it
            # reported nothing, the grace period's end answers for it.
            if capture.events:
                self.handover.deliver(op.key, capture.events)
            raise
        if saved is not NOT_RECORDED:
            events = decode_step_events(saved)
            for event in events:
                if isinstance(event, StepDecided):
                    # A recorded decision (not run again) makes the compacted view the
                    # model calls from now on are sent, as it did when it was made.
                    driver.hook_caller.views.note(event)
            self.handover.deliver(op.key, events)


def question_publisher(client: DBOSClient, run_id: str) -> PublishQuestions:
    """Publishes the run's pending questions as its attribute ``QUESTIONS``: written
    by the client, outside the workflow's numbered operations (``_questions``)."""

    async def publish(questions: list[dict[str, Any]]) -> None:
        await client.update_workflow_attributes_async(run_id, {QUESTIONS: questions}, merge=True)

    return publish


async def forget_questions(client: DBOSClient, run_id: str) -> None:
    """As an execution of the run begins: the questions an earlier one published are
    not pending any more (a tool that runs again asks anew)."""
    if pending_questions(await find(client, run_id)):
        await client.update_workflow_attributes_async(run_id, {QUESTIONS: []}, merge=True)


def durable_run(part: AgentRun, control: Control, backend: DBOSBackend | None = None) -> LaneRun:
    """``part`` run as a durable run's part: each operation a DBOS step
    (``backend``, by default one that runs them), its messages through ``control``."""
    return LaneRun(
        part,
        control,
        ControlInbox,
        backend if backend is not None else DBOSBackend(control),
        control.questions.take,
    )

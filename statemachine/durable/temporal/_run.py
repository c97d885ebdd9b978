"""The run inside a Temporal workflow: ``AgentRun`` with each operation an activity.

The workflow drives the same ``AgentRun`` as ``run_agent``, held by a ``LaneRun``
(``_course``); only the backend (``TemporalBackend``, a ``Backend`` of
``agent/executor.py``) and the inbox differ. Each model call, tool call, batch of
``before_tool_call`` checks, ``should_continue`` check and declared step's decision
is one operation whose output is the JSON of the engine events it reported
(``_wire``): in the workflow an activity (``Operations``), in an export the output
the workflow history holds for it. The tool results of a batch are handed to the
engine in call order (``_order``), so that history and trace do not depend on which
tool finished first. The last summary of each compaction step (its ``compacted``
decision, recorded like any other) goes with every later model call and step
decision, so that the activity sends the model the compacted view the run is in, on
any worker, after any replay.

Messages to the run (steer, follow-up, abort, decisions) are kept by the
workflow's handlers in the run's lane (``Lane``); the inbox takes them between two
engine events, before the next result, and the lane records where each one took
effect (``places``: after how many engine events), which is what an export needs
to place it again. Temporal's own replay needs no such record: the handlers run
again at the same points of the history.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from statemachine.agent import executor
from statemachine.agent.executor import AsyncioExecutor, Operation, start_task
from statemachine.agent.questions import Answer, MakeQuestion
from statemachine.agent.run import AgentRun
from statemachine.core.abort import AbortSignal
from statemachine.core.engine import ABANDONED
from statemachine.core.events import (
    Event,
    ModelCancelled,
    ModelFailed,
    ModelResponded,
    StepDecided,
    ToolCancelled,
    ToolFinished,
)
from statemachine.core.messages import ToolCall
from statemachine.core.wire import action_to_dict, messages_to_dicts
from statemachine.durable._course import LaneRun, step_name
from statemachine.durable._journal import DECISION_STEP, MODEL_STEP, NOT_RECORDED, TOOL_STEP
from statemachine.durable._order import Handover
from statemachine.durable._wire import call_to_dict, decode_step_events

__all__ = ["NOTHING", "Lane", "Operations", "TemporalBackend", "remote_run"]

NOTHING: Any = object()  # no message takes effect now
MODEL_ANSWERS = (ModelResponded, ModelFailed, ModelCancelled)


class Operations(Protocol):
    """Where a run's operations are performed: ``run(name, key, payload)`` is the
    saved output (the JSON of the events) of the operation ``name`` (``MODEL_STEP``
    and the others; ``key``: "model", a call id or ""), or ``NOT_RECORDED``;
    ``cancel(key)`` asks the running operation ``key`` to stop (an abort);
    ``sleep`` and ``wait(ready)`` wait (in a workflow, durably); ``mismatch`` is
    told of a recorded result that does not fit its operation."""

    def run(self, name: str, key: str, payload: dict[str, Any]) -> Awaitable[Any]: ...

    def cancel(self, key: str) -> None: ...

    async def sleep(self, seconds: float) -> None: ...

    def roll_over(self) -> bool:
        """Whether the run goes on in a new execution instead of making the model
        call it is about to make (nothing else is running): Temporal's
        continue-as-new (the new execution makes the call)."""

    def mismatch(self, text: str) -> None:
        """A recorded result does not fit the operation started in its place: the
        code that replays the run is not the code that ran it."""

    async def wait(self, ready: Callable[[], bool]) -> None: ...


class Lane:
    """The run's messages (steer, follow-up, abort, decisions): ``incoming`` holds
    those accepted and not yet taken; ``places`` where each one taken took effect
    (``[n, message]``: after ``n`` engine events). The places recorded before
    (``schedule``: an export's, or those an execution carried over to the next) are
    taken first, each at its place; then what comes in."""

    def __init__(self, ops: Operations, schedule: Sequence[Sequence[Any]] = ()) -> None:
        self.ops = ops
        self.handled = 0  # engine events handed over so far
        self.incoming: deque[dict[str, Any]] = deque()
        self.places: list[list[Any]] = []
        self.open = True  # steers and follow-ups are still taken
        self._schedule = deque(schedule)

    def schedule(self, places: Sequence[Sequence[Any]], incoming: Sequence[Any]) -> None:
        """Take what an earlier execution carried over: the places of the messages it
        took, and those it had accepted but not taken (ahead of what comes in)."""
        self._schedule.extend(places)
        self.incoming.extendleft(reversed(list(incoming)))

    def due(self) -> Any:
        """The message that takes effect now (its place recorded), or ``NOTHING``."""
        if self._schedule:
            if self._schedule[0][0] > self.handled:
                return NOTHING
            message = self._schedule.popleft()[1]
        elif self.incoming:
            message = self.incoming.popleft()
        else:
            return NOTHING
        self.places.append([self.handled, message])
        return message

    def has_due(self) -> bool:
        if self._schedule:
            return bool(self._schedule[0][0] <= self.handled)
        return bool(self.incoming)

    async def next_message(self) -> Any:
        """Wait for the next message while the run waits for a person."""
        await self.ops.wait(self.has_due)
        return self.due()

    async def drain(self) -> list[Any]:
        """At the run's end: close it to input and take every message accepted."""
        self.open = False
        taken = []
        while (message := self.due()) is not NOTHING:
            taken.append(message)
        return taken


class RunInbox:
    """The loop's inbox: the operations' events, with the lane's messages placed
    before the next one (an ``Inbox``)."""

    def __init__(self, run: LaneRun) -> None:
        self._queue: deque[Event] = deque()
        self._run = run

    def put_nowait(self, event: Event) -> None:
        self._queue.append(event)

    def empty(self) -> bool:
        return not self._queue

    def get_nowait(self) -> Event:
        return self._queue.popleft()

    async def get(self) -> Event:
        lane = self._run.control
        while True:
            message = lane.due()
            if message is not NOTHING:
                event = self._run.take(message)
                if event is not None:
                    return event
                continue
            if self._queue:
                return self._queue.popleft()
            await lane.ops.wait(lambda: bool(self._queue) or lane.has_due())


class TemporalBackend:
    """Performs each operation through ``Operations`` (module docstring); a
    ``Backend``."""

    def __init__(self, ops: Operations) -> None:
        self.ops = ops
        self.handover = Handover()  # tools in call order
        # The last summary of each compaction step, by step (module docstring).
        self._views: dict[str, str] = {}

    def start(self, driver: AsyncioExecutor, op: Operation) -> None:
        if op.kind == executor.MODEL:
            running = [t for t in (*driver.tasks.values(), *driver.helpers) if not t.done()]
            if not running and self.ops.roll_over():
                return  # the run goes on in a new execution, which makes this call
        self.handover.started(driver, op)
        payload = self._payload(driver, op)
        driver.keep(
            op, start_task(self._remote(driver, step_name(op), op.key, payload), eager=False)
        )

    def _payload(self, driver: AsyncioExecutor, op: Operation) -> dict[str, Any]:
        """What the activity of ``op`` is sent."""
        subject = op.subject
        if op.kind == executor.MODEL:
            return {"action": action_to_dict(subject), "views": dict(self._views)}
        if op.kind == executor.TOOL:
            return {"call": call_to_dict(subject)}
        if op.kind == executor.PERMISSIONS:
            return {"calls": [call_to_dict(c) for c in subject]}
        messages = messages_to_dicts(driver.loop.engine.messages)
        if op.kind == executor.CONTINUE:
            return {"messages": messages, "turn": subject}
        return {"step": subject.step, "messages": messages, "views": dict(self._views)}

    def cancel(self, driver: AsyncioExecutor, keys: Sequence[str], reason: str) -> None:
        """Ask each running operation to stop: the activity fires the signal its
        tool or model client holds and gives it the grace period, as ``run_agent``
        does, then answers. One that has not answered a grace period (plus a
        heartbeat) later is abandoned."""
        for key in keys:
            self.ops.cancel(key)
        task = start_task(self._abandon_after_grace(driver, keys, reason), eager=False)
        driver.track_helper(task)

    def reported(self, key: str) -> None:
        self.handover.flush()

    async def ask(
        self, driver: AsyncioExecutor, call: ToolCall, make: MakeQuestion, signal: AbortSignal
    ) -> Answer | None:
        """Never asked: a Temporal run's tools run in activities, which ask through
        the workflow (``_questions``), never in the workflow itself."""
        return None

    async def _abandon_after_grace(
        self, driver: AsyncioExecutor, keys: Sequence[str], reason: str
    ) -> None:
        await self.ops.sleep(driver.grace * 2 + 1)
        loop = driver.loop
        for key in keys:
            if key in loop.reported:
                continue
            loop.abandoned.add(key)
            loop.log.warning("operation_abandoned", key=key, reason=reason)
            event: Event = (
                ModelCancelled(f"{ABANDONED}: it did not answer after the abort")
                if key == "model"
                else ToolCancelled(key, f"{ABANDONED}: the tool did not answer after the abort")
            )
            self.handover.deliver(key, [event])

    async def _remote(
        self, driver: AsyncioExecutor, name: str, key: str, payload: dict[str, Any]
    ) -> None:
        payload = {**payload, "run_id": driver.loop.engine.run_id}
        saved = await self.ops.run(name, key, payload)
        if saved is NOT_RECORDED:
            return
        events = decode_step_events(saved)
        misfit = _misfit(name, key, events)
        if misfit:
            self.ops.mismatch(misfit)
            return
        for event in events:
            if isinstance(event, StepDecided) and event.outcome == "compacted":
                self._views[event.step] = event.message
            elif isinstance(event, StepDecided) and event.outcome == "kept":
                self._views.pop(event.step, None)
        self.handover.deliver(key, events)


def remote_run(part: AgentRun, lane: Lane) -> LaneRun:
    """``part`` run inside the workflow (or an export): each operation performed by
    ``lane.ops``, its messages through ``lane``."""
    return LaneRun(part, lane, RunInbox, TemporalBackend(lane.ops))


def _misfit(name: str, key: str, events: Sequence[Event]) -> str:
    """Why ``events``, recorded as the result of the operation ``name`` started in
    this place (``key``), cannot be its result; "" when they can."""
    if name == TOOL_STEP:
        ends = [e.call_id for e in events if isinstance(e, (ToolFinished, ToolCancelled))]
        if ends != [key]:
            return f"the result recorded for tool call {key!r} answers {ends}"
    elif name == MODEL_STEP and not (len(events) == 1 and isinstance(events[0], MODEL_ANSWERS)):
        return "the result recorded for a model call is not a model's answer"
    elif name == DECISION_STEP and not (len(events) == 1 and isinstance(events[0], StepDecided)):
        return "the result recorded for a step is not a step's decision"
    return ""

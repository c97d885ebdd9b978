"""The course of a durable run, on any backend: through its waits for approvals to
its end, taking the messages sent to it.

``drive`` runs a run (an ``AgentRun`` whose operations a backend saves) to its end:
when the engine stops to wait for approvals, it publishes the pending calls, waits
(durably, through the run's control lane) for a decision on each or an abort, and
goes on with a run resumed with the decisions; other messages taken meanwhile are
handed to the resumed run. At the end, every message still stored for the run is
taken (``Lane.drain``): steers and follow-ups become the result's ``queued_input``,
so none that was acknowledged is lost. The backend's workflow runs this, and an
export runs it again over the saved steps, so both follow the same course.

Each part of a durable run (from its start, or from a wait for a person to the next)
is a ``LaneRun``: it holds the driver's ``AgentRun`` (not a subclass of it), given
the backend that starts its operations and an inbox that places the lane's messages
between two engine events.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from typing import Any, Protocol

import attrs

from statemachine.agent.events import RunResult, RunStats
from statemachine.agent.executor import CONTINUE, MODEL, PERMISSIONS, TOOL, Backend, Operation
from statemachine.agent.loop import Inbox
from statemachine.agent.run import AgentRun, continue_run, use_backend
from statemachine.core.engine import Engine
from statemachine.core.events import ApprovalDecided, Event, InputKind, InputQueued
from statemachine.core.messages import ToolCall, UserMessage
from statemachine.core.table import State, TurnState
from statemachine.core.wire import message_from_dict, messages_from_dicts
from statemachine.durable import _journal
from statemachine.errors import InvalidInputError
from statemachine.journal import Journal, JournalingEngine

__all__ = [
    "CourseRun",
    "Lane",
    "LaneRun",
    "Publish",
    "Resume",
    "drive",
    "replay_course",
    "step_name",
    "user_message",
]


class Lane(Protocol):
    """What the course needs of a run's control lane (messages to the run)."""

    async def next_message(self) -> Any:
        """Wait for the next message while the run waits for a person."""
        ...

    async def drain(self) -> list[Any]:
        """At the run's end: every message stored for it, taken."""
        ...


class CourseRun(Protocol):
    """What the course needs of a run."""

    @property
    def control(self) -> Lane: ...

    async def run(self) -> RunResult: ...

    def abort(self, reason: object = None) -> None: ...

    def steer(self, message: str | UserMessage) -> None: ...

    def follow_up(self, message: str | UserMessage) -> None: ...


class LaneRun:
    """One part of a durable run (module docstring): ``part`` (an ``AgentRun``), whose
    operations ``backend`` starts and whose inbox (``inbox(self)``) places the
    messages of the control lane ``control``; a ``CourseRun``. ``answers`` takes the
    answers to its tools' questions, where the backend lets them ask a person."""

    def __init__(
        self,
        part: AgentRun,
        control: Any,
        inbox: Callable[[LaneRun], Inbox],
        backend: Backend,
        answers: Callable[[Mapping[str, Any]], None] | None = None,
    ) -> None:
        self.part = part
        self.control = control
        self._answers = answers  # takes an answer to a tool's question (``_questions``)
        self.inbox = inbox(self)
        use_backend(part, inbox=self.inbox, backend=backend, on_handle=partial(_count, control))

    @property
    def engine(self) -> Engine:
        return self.part.engine

    @property
    def aborting(self) -> bool:
        return self.part.aborting

    async def run(self) -> RunResult:
        return await self.part.run()

    def abort(self, reason: object = None) -> None:
        self.part.abort(reason)

    def steer(self, message: str | UserMessage) -> None:
        self.part.steer(message)

    def follow_up(self, message: str | UserMessage) -> None:
        self.part.follow_up(message)

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
        elif kind == "answer" and self._answers is not None:
            self._answers(message)
        return None


def _count(control: Any, event: Event) -> None:
    """One more engine event handed over (where the lane places messages)."""
    control.handled += 1


_STEP_NAMES = {
    MODEL: _journal.MODEL_STEP,
    TOOL: _journal.TOOL_STEP,
    PERMISSIONS: _journal.PERMISSION_STEP,
    CONTINUE: _journal.CONTINUE_STEP,
}


def step_name(op: Operation) -> str:
    """The name under which a backend records the operation ``op``."""
    return _STEP_NAMES.get(op.kind, _journal.DECISION_STEP)


Resume = Callable[[Any, list[Event]], Any]  # (the run that stopped, decisions) -> resumed
Publish = Callable[[Sequence[ToolCall]], Awaitable[None]]


async def drive(
    run: CourseRun, resume: Resume, publish: Publish
) -> tuple[RunResult, RunStats | None]:
    """Run ``run`` to its end, through its waits for approvals: publish the pending
    calls, wait for the decisions (and take the other messages) through the control
    lane, and go on with ``resume(run, decisions)``. The workflow runs this, and an
    export runs it again over the recorded steps. The result and the
    stats of all parts."""
    published: list[bool] = []

    async def publishing(calls: Sequence[ToolCall]) -> None:
        published.append(True)
        await publish(calls)

    result = await run.run()
    stats: RunStats | None = result.stats
    while result.state is TurnState.AWAITING_USER and result.pending_approvals:
        decisions, others = await _wait_for_decisions(
            run.control, result.pending_approvals, publishing
        )
        run = resume(run, decisions)
        for message in others:
            _take_early(run, message)
        result = await run.run()
        if result.stats is not None:  # the parts of a run resumed after approvals, added up
            stats = result.stats if stats is None else stats + result.stats
    # Messages sent before the end and not yet taken: the result's queued input.
    late = [(user_message(m), m["kind"]) for m in await run.control.drain() if _is_input(m)]
    if late:
        queued = tuple(
            InputQueued(m, InputKind.STEER if k == "steer" else InputKind.FOLLOW_UP)
            for m, k in late
        )
        result = attrs.evolve(result, queued_input=result.queued_input + queued)
    if published and not result.pending_approvals:
        await publish(())  # nothing waits any more (an abort may have ended the wait)
    return result, stats


def _is_input(message: Any) -> bool:
    return isinstance(message, Mapping) and message.get("kind") in ("steer", "follow_up")


async def _wait_for_decisions(
    control: Lane, calls: Sequence[ToolCall], publish: Publish
) -> tuple[list[Event], list[Mapping[str, Any]]]:
    """Publish ``calls`` and wait (durably) until each is decided or the run is
    aborted; the decisions in call order, and the other messages received."""
    waiting = {c.id: c for c in calls}
    decided: dict[str, Event] = {}
    others: list[Mapping[str, Any]] = []
    await publish(calls)
    while len(decided) < len(waiting):
        message = await control.next_message()
        if not isinstance(message, Mapping):
            continue  # a week without a word: wait on
        if message.get("kind") != "decision":
            others.append(message)
            if message.get("kind") == "abort":
                break
            continue
        call_id = message.get("call_id")
        if call_id not in waiting or call_id in decided:
            continue  # raced with another decision; decide() refuses it when it can
        decided[call_id] = ApprovalDecided(call_id, message["approve"], message["reason"])
        await publish([c for c in calls if c.id not in decided])
    return [decided[c.id] for c in calls if c.id in decided], others


def _take_early(run: CourseRun, message: Mapping[str, Any]) -> None:
    """A message taken while the run waited for a person, for the resumed run."""
    kind = message.get("kind")
    if kind == "abort":
        run.abort(message.get("reason") or "aborted by the caller")
    elif kind == "steer":
        run.steer(user_message(message))
    elif kind == "follow_up":
        run.follow_up(user_message(message))


def user_message(message: Mapping[str, Any]) -> UserMessage:
    """The user message a steer or follow-up message carries."""
    user = message_from_dict(message["message"])
    if not isinstance(user, UserMessage):
        raise InvalidInputError("a queued message must be a user message")
    return user


async def replay_course(
    spec: Mapping[str, Any],
    run_id: str,
    journal: Journal,
    chosen: Mapping[str, Any],
    part: Callable[[AgentRun], LaneRun],
) -> tuple[RunResult | None, State]:
    """Run a durable run's course again over what it recorded, writing ``journal``
    (an export; ``part`` makes each part of the run a backend's, answered from the
    record; ``chosen``: the run's options as it recorded them). The result (``None``
    where the record ends first) and the state its engine is in."""
    kwargs: dict[str, Any] = {
        "model": _journal.NoModel(),
        "max_turns": spec["max_turns"],
        "run_id": run_id,
        **chosen,
    }
    first = AgentRun(
        messages=messages_from_dicts(spec["messages"]),
        engine_factory=partial(JournalingEngine, journal=journal),
        **kwargs,
    )
    runs = [part(first)]

    def resume(done: LaneRun, decisions: list[Event]) -> LaneRun:
        runs.append(part(continue_run(done.engine, decisions, **kwargs)))
        return runs[-1]

    try:
        result, _ = await drive(runs[0], resume, _publish_nothing)
    except _journal.RecordEndedError:
        return None, runs[-1].engine.state
    return result, result.state


async def _publish_nothing(calls: Sequence[ToolCall]) -> None:
    """An export publishes nothing."""

"""The control lane of a durable run on DBOS (``_lane.ControlLane``): a message to a
run is a DBOS message on one topic (``TOPIC``); the run waits for the next one with
``DBOS.recv`` (up to a week, then again), records where each took effect as a step
``statemachine.control`` reserved when the wait began (``DBOS.reserve_step``),
publishes whether it is ending as the DBOS event ``OPEN``, and sends itself its
markers with ``DBOS.send``. It looks without waiting (``_look``) with a ``recv`` that
does not wait, then a step ``statemachine.look`` that records what it took and
whether the listener's ``recv`` has taken a message (DBOS records a ``recv`` with the
message it takes, in the same transaction). The lane's logic is ``_lane``'s. An answer
to a tool's question is one of its messages (``_questions``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from dbos import DBOS, StepOptions, StepReservation

from statemachine.durable._lane import NOTHING, OPEN, SYNC, ControlLane, start_now
from statemachine.durable._questions import DurableQuestions, PublishQuestions

__all__ = [
    "LOOK",
    "NOTHING",
    "OPEN",
    "STEP",
    "SYNC",
    "TOPIC",
    "WAIT_SECONDS",
    "Control",
    "recorded_looks",
    "start_now",
]

TOPIC = "statemachine.control"  # the topic of every message to a run
STEP = "statemachine.control"  # the step recording where a message took effect
WAIT_SECONDS = 7 * 24 * 3600.0  # one recv's wait; then the run listens again
LOOK = "statemachine.look"  # the step recording what a look found (``Control._look``)
RECV = "DBOS.recv"  # the name DBOS records a recv under


def recorded_looks(recorded: Sequence[Mapping[str, Any]]) -> list[tuple[Any, bool]]:
    """What the run's looks found, in order, from its steps as DBOS lists them."""
    return [
        (s["output"]["message"], bool(s["output"]["listener_holds"]))
        for s in sorted(recorded, key=lambda s: s["function_id"])
        if s["function_name"] == LOOK and isinstance(s.get("output"), dict)
    ]


async def _record(record: dict[str, Any]) -> dict[str, Any]:
    return record


async def _found(workflow_id: str, message: Any, listener: int | None) -> dict[str, Any]:
    """What a look found: ``message`` (its ``recv``'s), and whether the listener's
    ``recv`` (operation ``listener``; ``None``: none listens) has recorded a message.
    A ``recv`` records the message in the transaction that takes it, so a message the
    listener took before the look's ``recv`` ran is seen here."""
    if listener is None:
        return {"message": message, "listener_holds": False}
    steps = await DBOS.list_workflow_steps_async(workflow_id, load_output=False)
    holds = any(s["function_id"] == listener and s["function_name"] == RECV for s in steps)
    return {"message": message, "listener_holds": holds}


class Control(ControlLane):
    """The control lane of one execution of a run's workflow, on DBOS; ``recorded``:
    the workflow's steps as DBOS lists them (the places of earlier executions)."""

    def __init__(
        self, recorded: Sequence[Mapping[str, Any]], publish: PublishQuestions | None = None
    ) -> None:
        places = [
            s["output"]
            for s in sorted(recorded, key=lambda s: s["function_id"])
            if s["function_name"] == STEP and isinstance(s.get("output"), dict)
        ]
        super().__init__(places, max((s["function_id"] for s in recorded), default=0))
        # The questions its tools ask a person, published by ``publish``.
        self.questions = DurableQuestions(places, publish)
        # Set by a step that does not fit what the run recorded (``_dbos_run``).
        self.mismatch: asyncio.Future[str] | None = None

    def _listen(self) -> asyncio.Future[Any]:
        return start_now(DBOS.recv_async(TOPIC, timeout_seconds=WAIT_SECONDS))

    def _reserve(self) -> StepReservation:
        return DBOS.reserve_step()

    async def _record_place(self, place: Any, record: Mapping[str, Any]) -> None:
        await place.run_async(StepOptions(name=STEP), _record, dict(record))

    async def _look(self, listening_since: int | None) -> tuple[Any, bool]:
        workflow_id = DBOS.workflow_id
        assert workflow_id is not None
        # DBOS numbered the listener's recv next after ``listening_since``.
        listener = None if listening_since is None else listening_since + 1
        message = await start_now(DBOS.recv_async(TOPIC, timeout_seconds=0))
        found = await start_now(
            DBOS.run_step_async(StepOptions(name=LOOK), _found, workflow_id, message, listener)
        )
        return found["message"], bool(found["listener_holds"])

    async def _publish(self, key: str, value: Any) -> None:
        await DBOS.set_event_async(key, value)

    async def _send(self, marker: Mapping[str, Any]) -> None:
        workflow_id = DBOS.workflow_id
        assert workflow_id is not None
        await DBOS.send_async(workflow_id, marker, TOPIC)

    def _next_operation(self) -> int:
        """The id DBOS gives the workflow's next operation, less one."""
        # Not public in DBOS: the workflow's context counts the operations called so far.
        from dbos._context import get_local_dbos_context

        ctx = get_local_dbos_context()
        return 0 if ctx is None else int(ctx.function_id)

"""The handle of one durable run on DBOS, from any process: its result and status,
and the messages sent to it (decisions, answers to its tools' questions, steer,
follow-up, abort; the docstring of
``statemachine.durable.dbos``), which go through the database, so no live worker is
needed. A handle made by a runner refuses to serve once that runner is destroyed.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import IO, Any, Protocol

import attrs
from dbos import DBOSClient, WorkflowHandleAsync

from statemachine.agent.events import RunResult, ToolQuestion
from statemachine.agent.questions import Answer
from statemachine.agent.tools import Tool
from statemachine.core.messages import ToolCall, UserMessage
from statemachine.durable import (
    ExportedJournal,
    NotPendingError,
    RunClosedError,
    RunFailedError,
    RunHeldError,
    RunStatus,
    _dbos_ops,
)
from statemachine.durable._dbos_control import OPEN, STEP, TOPIC
from statemachine.durable._dbos_errors import LISTENING, still_there
from statemachine.durable._dbos_status import (
    DONE,
    ENDED,
    described,
    find,
    pending_calls,
    pending_questions,
    status_of,
)
from statemachine.durable._inputs import check_run_id, checked_text, user_dict
from statemachine.durable._questions import answer_message
from statemachine.durable._watch import unless_held
from statemachine.durable._wire import result_from_dict
from statemachine.errors import InvalidInputError, UsageError

__all__ = ["ENDING_WAIT", "DBOSRunHandle", "Owner", "open_handle"]

POLL = 0.05  # how often a handle's result() looks (DBOS's default is a second)
RECHECK = 1.0  # on PostgreSQL, how often result() reads the status while notified
SETTLE_POLL = 0.005  # and how often once the run said it is done
_GOING = ("PENDING", "ENQUEUED", "DELAYED")  # DBOS's states of a run not ended
ENDING_WAIT = 30.0  # seconds a steer waits for an ending run to end or go on


class Owner(Protocol):
    """The runner that made a handle (``DBOSRunner``): its database, and its client
    (``None`` once it is destroyed)."""

    database_url: str
    _client: DBOSClient | None

    @property
    def output_types(self) -> Mapping[str, Any]:
        """The output types of the runner's registry, by name (a run records its)."""
        ...


async def open_handle(
    client: DBOSClient,
    run_id: str,
    viewer: str = "",
    owner: Owner | None = None,
    newest: bool = False,
) -> DBOSRunHandle:
    """The handle of an existing run; ``UnknownRunError`` if there is none."""
    check_run_id(run_id)
    await find(client, run_id)
    return DBOSRunHandle(client, run_id, viewer, owner, newest)


class DBOSRunHandle:
    """A durable run seen from any process (``statemachine.durable.RunHandle``)."""

    def __init__(
        self,
        client: DBOSClient,
        run_id: str,
        viewer: str = "",
        owner: Owner | None = None,
        newest: bool = False,
    ) -> None:
        self._own_client = client
        self.run_id = run_id
        self._viewer = viewer  # the application version of the worker that looks
        self._newest = newest  # the viewer is the newest version, not a worker's
        self._owner = owner  # the runner whose client this is, if a runner made it
        self._local: WorkflowHandleAsync[dict[str, Any]] | None = None  # started here

    @property
    def _client(self) -> DBOSClient:
        owner = self._owner
        if owner is not None:
            still_there(owner.database_url)
        if owner is not None and owner._client is not self._own_client:
            raise UsageError(
                f"the handle of run {self.run_id!r} was made by a runner that has been "
                "destroyed since: take a new handle (runner.handle(run_id), or "
                "DBOSRunHandle.open(connect(database_url), run_id))"
            )
        return self._own_client

    @classmethod
    async def open(cls, client: DBOSClient, run_id: str) -> DBOSRunHandle:
        """The handle of an existing run; ``UnknownRunError`` if there is none."""
        return await open_handle(client, run_id)

    async def result(self, timeout: float | None = None) -> RunResult:
        """The run's result once it ends; ``RunHeldError`` if a worker holds it (its
        code does not fit the run), ``RunFailedError`` if it ended without a result
        (the backend gave up on it, or an operator ended it)."""
        await self._raise_unless_going()
        try:
            # A run can be held while this waits (a worker that took it holds it, or
            # it waits for another application version): looked at every second.
            waiting = unless_held(self._output(), self._raise_unless_going)
            output = await asyncio.wait_for(waiting, timeout)
        except (TimeoutError, asyncio.CancelledError, RunHeldError, RunFailedError):
            raise
        except Exception as exc:
            await self._raise_unless_going()
            raise RunFailedError(f"run {self.run_id!r}: {described(exc)}") from exc
        owner = self._owner
        return result_from_dict(self.run_id, output, None if owner is None else owner.output_types)

    async def _output(self) -> dict[str, Any]:
        if self._local is not None:  # started by this process: no polling
            return await self._local.get_result()
        handle: WorkflowHandleAsync[dict[str, Any]]
        handle = await self._client.retrieve_workflow_async(self.run_id)
        if self._own_client not in LISTENING:  # SQLite, or a client made elsewhere
            return await handle.get_result(polling_interval_sec=POLL)
        # PostgreSQL: the run's last operation sets the event DONE, whose notification
        # wakes this wait; the status is read again every RECHECK seconds for a run
        # that ends otherwise (held, failed, cancelled).
        while (await handle.get_status()).status in _GOING:
            done = await self._client.get_event_async(self.run_id, DONE, timeout_seconds=RECHECK)
            if done is not None:
                break
        # DONE is set: the run's status says so within milliseconds (a crash in
        # between leaves it to the worker that takes the run back: then polling).
        loop = asyncio.get_running_loop()
        settle = loop.time() + RECHECK
        while (await handle.get_status()).status in _GOING and loop.time() < settle:
            await asyncio.sleep(SETTLE_POLL)
        return await handle.get_result(polling_interval_sec=POLL)

    async def _raise_unless_going(self) -> None:
        """``RunHeldError`` or ``RunFailedError`` unless the run is going, as this
        handle's viewer sees it (a run waiting for another version is held)."""
        status = status_of(await find(self._client, self.run_id), self._viewer, self._newest)
        if status.state == "held":
            raise RunHeldError(
                f"run {self.run_id!r} is held: {status.held}; resume it on a compatible worker "
                "or end it (DBOSRunner.resume_held, DBOSRunner.end_held)"
            )
        if status.state == "failed":
            raise RunFailedError(f"run {self.run_id!r} failed: {status.explanation}")
        if status.state == "cancelled":
            raise RunFailedError(f"run {self.run_id!r} was cancelled")

    async def pending_approvals(self) -> tuple[ToolCall, ...]:
        return await pending_calls(self._client, self.run_id)

    async def decide(self, call_id: str, approve: bool, reason: str | None = None) -> None:
        if not isinstance(call_id, str):
            raise InvalidInputError(f"call_id must be a str (one call), got {call_id!r}")
        if not isinstance(approve, bool):
            raise InvalidInputError("approve must be True or False")
        text = checked_text(reason or "", "reason")
        ended = status_of(await find(self._client, self.run_id)).state in ENDED
        if ended or call_id not in {c.id for c in await self.pending_approvals()}:
            raise NotPendingError(
                f"call {call_id!r} of run {self.run_id!r} is not waiting for a decision "
                "(unknown, decided already, or the run has ended)"
            )
        message = {"kind": "decision", "call_id": call_id, "approve": approve, "reason": text}
        await self._send(message, f"{self.run_id}:{call_id}")

    async def pending_questions(self) -> tuple[ToolQuestion, ...]:
        """The questions the run's running tools wait on a person for, oldest first
        (``statemachine.agent.questions``); none once the run has ended."""
        return pending_questions(await find(self._client, self.run_id))

    async def answer(self, question_id: str, answer: Answer) -> None:
        """Answer a pending question, checked against its schema as ``AgentRun.answer``
        checks it (``InvalidInputError``); ``NotPendingError`` if it is not pending.
        The answer is a message of the run: its worker takes it (``_questions``)."""
        if not isinstance(question_id, str):
            raise InvalidInputError(f"question_id must be a str, got {type(question_id).__name__}")
        question = next((q for q in await self.pending_questions() if q.id == question_id), None)
        if question is None:
            raise NotPendingError(
                f"no question {question_id[:200]!r} is pending on run {self.run_id!r} "
                "(unknown, answered already, ended with its call, or the run has ended)"
            )
        message = answer_message(question, answer)
        # One answer per question: a second one sent before the run took the first is
        # the same message to DBOS, which keeps one.
        await self._send(message, f"{self.run_id}:{question_id}:{message['asked'][:16]}")

    async def steer(self, message: str | UserMessage) -> None:
        """Queue a message for the model. Once this returns, the message reaches the
        model or, if the run ended first, its result's ``queued_input``;
        ``RunClosedError`` if the run had ended (module docstring)."""
        await self._queue_input("steer", message)

    async def follow_up(self, message: str | UserMessage) -> None:
        """Queue a message used when the model would otherwise finish (as ``steer``)."""
        await self._queue_input("follow_up", message)

    async def _queue_input(self, kind: str, message: str | UserMessage) -> None:
        text = user_dict(message)
        found = await find(self._client, self.run_id)
        if status_of(found).state in ENDED:
            raise RunClosedError(
                f"run {self.run_id!r} has ended; start a new run with this message"
            )
        message_id = uuid.uuid4().hex
        await self._send({"kind": kind, "message": text, "id": message_id})
        await self._confirm(message_id)

    async def _confirm(self, message_id: str) -> None:
        """Return once the message stored as ``message_id`` is sure to be taken by the
        run; ``RunClosedError`` if the run ended without it (``_lane``)."""
        deadline = time.monotonic() + ENDING_WAIT
        while True:
            is_open = await self._client.get_event_async(self.run_id, OPEN, timeout_seconds=0)
            if is_open is not False:
                return  # a marker follows the message: the run takes it
            found = await find(self._client, self.run_id)
            if status_of(found).state in ENDED:
                if await self._taken(message_id):
                    return
                raise RunClosedError(
                    f"run {self.run_id!r} ended before it took this message; "
                    "start a new run with it"
                )
            if time.monotonic() > deadline:
                raise RunClosedError(
                    f"run {self.run_id!r} is ending, and its worker did not finish it "
                    f"within {ENDING_WAIT:g} s: this message may not reach it"
                )
            await asyncio.sleep(POLL)

    async def _taken(self, message_id: str) -> bool:
        steps = await self._client.list_workflow_steps_async(self.run_id)
        for step in steps:
            output = step.get("output")
            if step["function_name"] == STEP and isinstance(output, Mapping):
                message = output.get("message")
                if isinstance(message, Mapping) and message.get("id") == message_id:
                    return True
        return False

    async def abort(self, reason: str | None = None) -> None:
        await self._send({"kind": "abort", "reason": checked_text(reason or "", "reason")})

    async def status(self) -> RunStatus:
        found = await find(self._client, self.run_id)
        status = status_of(found, self._viewer, self._newest)
        if status.state not in ("running", "held"):
            return status
        pending = await self.pending_approvals()
        if pending and status.state == "running":
            return attrs.evolve(status, state="waiting", pending_approvals=pending)
        return attrs.evolve(status, pending_approvals=pending)

    async def _send(self, message: dict[str, Any], key: str | None = None) -> None:
        await find(self._client, self.run_id)  # DBOS would keep a message to no run
        await self._client.send_async(self.run_id, message, TOPIC, idempotency_key=key)

    async def export_journal(
        self, target: str | os.PathLike[str] | IO[str], tools: Sequence[Tool] | None = None
    ) -> ExportedJournal:
        """Write this run as a journal (``_dbos_ops.export_journal``)."""
        return await _dbos_ops.export_journal(self._client, self.run_id, target, tools=tools)

"""The handle of one durable run on Temporal, from any process with a client.

Decisions, steers, follow-ups and answers to a tool's questions are workflow
updates: when ``decide``, ``steer``, ``follow_up`` or ``answer`` returns, the run's
workflow has accepted the message (its validator let it in), so it takes effect, or,
for input that came after the run's last answer, is in the result's
``queued_input``. A refused update is ``NotPendingError`` (a decision for a call, or
an answer for a question, that is not pending), ``InvalidInputError`` (an answer
that does not fit its question's schema) or ``RunClosedError`` (input once the run
took its last). An update needs a live
worker of the run: one that does not answer within ``message_timeout`` seconds is
a ``StoreUnavailableError`` (the message may still reach the run later). The handles
of a run in one process have at most ``IN_FLIGHT`` updates of it in flight together
(the server's limit for one run) and send again, under the same update id, one the
server turned away (``_inflight``). An abort
is a signal: it is stored even with no live worker, and reaches the run when a
worker runs it again.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import IO, Any

from temporalio.api.enums.v1 import EventType, WorkflowExecutionStatus
from temporalio.client import (
    Client,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from statemachine.agent.events import RunResult, ToolQuestion
from statemachine.agent.questions import Answer
from statemachine.agent.tools import Tool
from statemachine.core.messages import ToolCall, UserMessage
from statemachine.durable import ExportedJournal, RunStatus
from statemachine.durable._inputs import MAX_MESSAGE_CHARS, checked_text, user_dict
from statemachine.durable._questions import questions_from_published
from statemachine.durable._watch import unless_held
from statemachine.durable._wire import call_from_dict, result_from_dict
from statemachine.durable.temporal import _export
from statemachine.durable.temporal._inflight import send_update
from statemachine.durable.temporal._questions import INVALID, refused_answer
from statemachine.durable.temporal._workflow import CLOSED, NOT_PENDING
from statemachine.errors import (
    InvalidInputError,
    NotPendingError,
    RunClosedError,
    RunFailedError,
    RunHeldError,
    StoreUnavailableError,
    UnknownRunError,
)

__all__ = ["MESSAGE_TIMEOUT", "TemporalRunHandle", "open_handle"]

MESSAGE_TIMEOUT = 30.0  # seconds an update waits for a worker of the run to take it
QUERY_TIMEOUT = 5.0  # seconds a query (pending approvals) waits for a worker
STATUS_TRIES = 2  # queries status() makes before it says no worker answered
UNANSWERED = "no worker of the run answered"  # how status() begins that explanation
MAX_NOTES = 100  # notes status() reads from a worker
HELD_AFTER = 2  # attempts of a workflow task after which a run counts as held

_STATES = {
    WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_RUNNING: "running",
    WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_COMPLETED: "finished",
    WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_FAILED: "failed",
    WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_TIMED_OUT: "failed",
    WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_TERMINATED: "failed",
    WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_CANCELED: "cancelled",
    WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_CONTINUED_AS_NEW: "running",
}


async def open_handle(
    client: Client, run_id: str, output_types: Mapping[str, Any] | None = None
) -> TemporalRunHandle:
    """The handle of an existing run; ``UnknownRunError`` if there is none.
    ``output_types``: a runner's registry, which types the result's output."""
    handle = TemporalRunHandle(client, run_id, output_types=output_types)
    await handle._describe()
    return handle


class TemporalRunHandle:
    """A durable run on Temporal (``statemachine.durable.RunHandle``). Its result's
    structured output is of its type when ``output_types`` (a runner's registry) has
    it, else the validated JSON object (``_wire.result_from_dict``)."""

    def __init__(
        self,
        client: Client,
        run_id: str,
        message_timeout: float = MESSAGE_TIMEOUT,
        output_types: Mapping[str, Any] | None = None,
    ) -> None:
        self.run_id = run_id
        self._output_types = output_types
        self._client = client
        self._workflow: WorkflowHandle[Any, Any] = client.get_workflow_handle(run_id)
        self._message_timeout = message_timeout

    async def _describe(self) -> Any:
        try:
            return await self._workflow.describe()
        except RPCError as exc:
            if exc.status is RPCStatusCode.NOT_FOUND:
                raise UnknownRunError(f"no durable run has the id {self.run_id!r}") from None
            raise StoreUnavailableError(f"Temporal did not answer: {exc.message}") from None

    async def result(self, timeout: float | None = None) -> RunResult:
        """The run's result once it ends; ``RunFailedError`` if it ended without one
        (its workflow failed, was terminated or cancelled: the error says which);
        ``RunHeldError`` if it is held now (``status``)."""
        await self._raise_if_held()
        try:
            # A run can be held while this waits (a worker took it whose code does
            # not fit): looked at every second.
            waiting = unless_held(self._workflow.result(), self._raise_if_held)
            output = await asyncio.wait_for(waiting, timeout)
        except WorkflowFailureError as exc:
            cause = exc.cause
            text = cause.message if isinstance(cause, ApplicationError) else str(cause or exc)
            raise RunFailedError(f"run {self.run_id!r} failed: {text}") from None
        except RPCError as exc:
            if exc.status is RPCStatusCode.NOT_FOUND:
                raise UnknownRunError(f"no durable run has the id {self.run_id!r}") from None
            raise StoreUnavailableError(f"Temporal did not answer: {exc.message}") from None
        return result_from_dict(self.run_id, output, self._output_types)

    async def _raise_if_held(self) -> None:
        held = await self._held()
        if held:
            raise RunHeldError(
                f"run {self.run_id!r} is held: {held}; it goes on when a worker whose "
                "code fits it takes it"
            )

    async def pending_approvals(self) -> tuple[ToolCall, ...]:
        """The calls waiting for a decision, in call order (a query: it needs a live
        worker of the run; none while the run is not running).
        ``StoreUnavailableError`` if no worker answers within ``QUERY_TIMEOUT``."""
        return tuple(call_from_dict(c) for c in await self._answered("pending_approvals"))

    async def _pending(self, tries: int) -> tuple[ToolCall, ...] | None:
        """The pending calls; ``None`` when no worker answered (``_query``)."""
        pending = await self._query("pending_approvals", tries)
        return None if pending is None else tuple(call_from_dict(c) for c in pending)

    async def _query(self, name: str, tries: int) -> list[Any] | None:
        """The query's answer (none while the run is not running, or held); ``None``
        when no worker answered ``tries`` queries of ``QUERY_TIMEOUT`` seconds each
        (none is up, or the one that was is gone and Temporal still hands the run's
        tasks to it)."""
        description = await self._describe()
        if _STATES.get(description.status) != "running":
            return []
        for _ in range(tries):
            try:
                found = await self._workflow.query(
                    name, rpc_timeout=timedelta(seconds=QUERY_TIMEOUT)
                )
            except RPCError as exc:
                if exc.status is RPCStatusCode.FAILED_PRECONDITION:
                    return []  # held: no worker replays it now (``status``)
                if exc.status in (RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.CANCELLED):
                    continue  # the SDK's own deadline is a cancellation
                raise StoreUnavailableError(f"Temporal did not answer: {exc.message}") from None
            return list(found)
        return None

    async def pending_questions(self) -> tuple[ToolQuestion, ...]:
        """The questions the run's running tools wait on a person for (an MCP server's
        elicitation, ``MCPServer(elicitation="run")``), oldest first (a query, as
        ``pending_approvals``: none while the run is not running).
        ``StoreUnavailableError`` if no worker answers within ``QUERY_TIMEOUT``."""
        pending = await self._answered("pending_questions")
        return questions_from_published(pending)

    async def _answered(self, name: str) -> list[Any]:
        """The query's answer (``_query``); ``StoreUnavailableError`` if no worker
        answers within ``QUERY_TIMEOUT``."""
        found = await self._query(name, tries=1)
        if found is None:
            raise StoreUnavailableError(
                f"no worker of run {self.run_id!r} answered within {QUERY_TIMEOUT:g} s"
            )
        return found

    async def answer(self, question_id: str, answer: Answer) -> None:
        """Answer a pending question, as ``AgentRun.answer`` does: a mapping of its
        schema's fields accepts, "decline" says no, "cancel" dismisses it.
        ``InvalidInputError`` for an answer that does not fit the schema (or is more
        than ``MAX_MESSAGE_CHARS`` of JSON), ``NotPendingError`` for a question that is
        not pending. Once this returns, the run's history holds the answer."""
        if not isinstance(question_id, str):
            raise InvalidInputError(f"question_id must be a str, got {question_id!r}")
        if answer not in ("decline", "cancel") and not isinstance(answer, Mapping):
            raise InvalidInputError(
                f"question {question_id!r}: an answer is a mapping of the schema's fields, "
                f'"decline" or "cancel", not {type(answer).__name__}'
            )
        try:
            size = len(json.dumps(answer))
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(f"question {question_id!r}: an answer is JSON: {exc}") from None
        if size > MAX_MESSAGE_CHARS:
            raise InvalidInputError(
                f"question {question_id!r}: an answer is at most {MAX_MESSAGE_CHARS} "
                f"characters of JSON, got {size}"
            )
        await self._update("answer", {"question_id": question_id, "answer": answer})

    async def decide(self, call_id: str, approve: bool, reason: str | None = None) -> None:
        if not isinstance(call_id, str):
            raise InvalidInputError(f"call_id must be a str (one call), got {call_id!r}")
        if not isinstance(approve, bool):
            raise InvalidInputError("approve must be True or False")
        text = checked_text(reason or "", "reason")
        message = {"kind": "decision", "call_id": call_id, "approve": approve, "reason": text}
        await self._update("decide", message)

    async def steer(self, message: str | UserMessage) -> None:
        """Queue a message for the model; once this returns, it reaches the model or
        the result's ``queued_input`` (module docstring)."""
        await self._update("queue_input", {"kind": "steer", "message": user_dict(message)})

    async def follow_up(self, message: str | UserMessage) -> None:
        """Queue a message used when the model would otherwise finish (as ``steer``)."""
        await self._update("queue_input", {"kind": "follow_up", "message": user_dict(message)})

    async def abort(self, reason: str | None = None) -> None:
        """Abort the run (nothing to do once it has ended)."""
        text = checked_text(reason or "", "reason")
        try:
            await self._workflow.signal("abort", text)
        except RPCError as exc:
            if exc.status is RPCStatusCode.NOT_FOUND:
                await self._describe()  # an unknown run, or one that has ended
                return
            raise StoreUnavailableError(f"Temporal did not answer: {exc.message}") from None

    async def status(self, tries: int = STATUS_TRIES) -> RunStatus:
        """Where the run is, with its application version; ``held`` (naming why)
        while the workers that took it failed its workflow task because their code
        (or application version) does not fit it. A running run whose worker does
        not answer ``tries`` queries (``QUERY_TIMEOUT`` each: none is up, or one just
        restarted) is ``running`` with an ``explanation`` saying so, rather than an
        error."""
        description = await self._describe()
        state = _STATES.get(description.status, "running")
        held, version = await self._look()
        if state == "failed":
            explanation = await self._failure() or (
                f"the workflow ended {description.status.name.rsplit('_', 1)[-1].lower()}"
            )
            return RunStatus(self.run_id, state, app_version=version, explanation=explanation)
        if state != "running":
            return RunStatus(self.run_id, state, app_version=version)
        pending: tuple[ToolCall, ...] | None = ()
        if not held:
            pending = await self._pending(tries)
            if pending is None:
                held = await self._held()  # the query waited on a task being tried
        if held:
            return RunStatus(self.run_id, "held", app_version=version, held=held)
        if pending is None:
            return RunStatus(
                self.run_id,
                "running",
                app_version=version,
                explanation=(
                    f"{UNANSWERED} within {tries * QUERY_TIMEOUT:g} s (none is up, or one "
                    "just restarted): whether it waits for a person is not known"
                ),
            )
        state = "waiting" if pending else "running"
        notes = await self._notes()
        return RunStatus(self.run_id, state, pending, app_version=version, notes=notes)

    async def _notes(self) -> tuple[str, ...]:
        """The changes of code the worker that runs the run goes on through (a query:
        none when no worker answers it)."""
        try:
            notes = await self._workflow.query(
                "notes", rpc_timeout=timedelta(seconds=QUERY_TIMEOUT)
            )
        except (RPCError, WorkflowQueryFailedError):
            return ()
        return tuple(str(n) for n in notes or ())[:MAX_NOTES]

    async def _failure(self) -> str:
        """Why the run's workflow failed, as its history says ("" if it does not)."""
        async for event in self._workflow.fetch_history_events():
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED:
                return str(event.workflow_execution_failed_event_attributes.failure.message)
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED:
                reason = event.workflow_execution_terminated_event_attributes.reason
                return f"terminated: {reason}" if reason else "terminated"
        return ""

    async def _held(self) -> str:
        """Why the run is held ("" when it is not): ``_look``."""
        return (await self._look())[0]

    async def _look(self) -> tuple[str, str]:
        """Why the run is held, and its application version (from its input). Held:
        its workflow task failed (the worker's code does not fit it, or it is of
        another application version) or timed out and is being tried again; ""
        when it is not."""
        held = version = ""
        try:
            description = await self._workflow.describe()
            async for event in self._workflow.fetch_history_events():
                if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
                    version = await self._version(event)
                elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
                    held = event.workflow_task_failed_event_attributes.failure.message
                elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
                    held = ""
        except RPCError as exc:
            if exc.status is RPCStatusCode.NOT_FOUND:
                raise UnknownRunError(f"no durable run has the id {self.run_id!r}") from None
            raise StoreUnavailableError(f"Temporal did not answer: {exc.message}") from None
        task = description.raw_description.pending_workflow_task
        if not held and task.attempt >= HELD_AFTER:
            # Later failures are not recorded in the history: the workers' logs name
            # why ("Failed activation on workflow statemachine.run ...").
            held = (
                f"its workflow task was tried {task.attempt} times: the workers that "
                "took it cannot run it (their logs name why)"
            )
        return held, version

    async def _version(self, started: Any) -> str:
        """The application version the run's input names ("" if none)."""
        payloads = started.workflow_execution_started_event_attributes.input.payloads
        try:
            inputs = await self._client.data_converter.decode(payloads)
        except Exception:  # noqa: BLE001 - an input this converter cannot read
            return ""
        spec = inputs[0] if inputs else None
        version = spec.get("app_version") if isinstance(spec, Mapping) else None
        return version if isinstance(version, str) else ""

    async def export_journal(
        self, target: str | os.PathLike[str] | IO[str], tools: Sequence[Tool] | None = None
    ) -> ExportedJournal:
        """Write this run as a journal (``_export.export_journal``)."""
        return await _export.export_journal(self._client, self.run_id, target, tools=tools)

    async def _update(self, name: str, message: dict[str, Any]) -> None:
        description = await self._describe()
        if _STATES.get(description.status) != "running":
            self._refuse(name, message)
        held = await self._held()
        if held:
            raise RunHeldError(f"run {self.run_id!r} is held: {held}; no message reaches it now")
        try:
            await self._send(name, message)
        except WorkflowUpdateFailedError as exc:
            cause = exc.cause
            kind = cause.type if isinstance(cause, ApplicationError) else None
            if kind in (NOT_PENDING, CLOSED, INVALID):
                self._refuse(name, message, cause)
            raise
        except WorkflowUpdateRPCTimeoutOrCancelledError:
            # No worker took it in time: a worker that does not fit the run fails its
            # task again and again, or no worker of its task queue is up.
            await self._raise_if_held()
            raise StoreUnavailableError(
                f"no worker of run {self.run_id!r} took the message within "
                f"{self._message_timeout:g} s; it may still reach the run"
            ) from None
        except RPCError as exc:
            if exc.status is RPCStatusCode.NOT_FOUND:  # the run ended meanwhile
                self._refuse(name, message)
            if exc.status is RPCStatusCode.FAILED_PRECONDITION:
                raise RunHeldError(f"run {self.run_id!r} is held: {exc.message}") from None
            if exc.status is RPCStatusCode.DEADLINE_EXCEEDED:
                raise StoreUnavailableError(
                    f"no worker of run {self.run_id!r} took the message within "
                    f"{self._message_timeout:g} s; it may still reach the run"
                ) from None
            raise StoreUnavailableError(f"Temporal did not answer: {exc.message}") from None

    async def _send(self, name: str, message: dict[str, Any]) -> None:
        """Send the update within ``message_timeout`` (``_inflight.send_update``)."""
        await send_update(self._workflow, name, message, self._message_timeout)

    def _refuse(
        self, name: str, message: dict[str, Any] | None = None, cause: object = None
    ) -> None:
        if name == "answer":
            assert message is not None
            text = cause.message if isinstance(cause, ApplicationError) else ""
            kind = cause.type if isinstance(cause, ApplicationError) else None
            raise refused_answer(message["question_id"], self.run_id, kind, text)
        if name == "decide":
            call_id = None if message is None else message.get("call_id")
            raise NotPendingError(
                f"call {call_id!r} of run {self.run_id!r} is not waiting for a decision "
                "(unknown, decided already, or the run has ended)"
            )
        raise RunClosedError(f"run {self.run_id!r} has ended; start a new run with this message")

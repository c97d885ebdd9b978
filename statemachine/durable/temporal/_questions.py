"""Questions a running tool asks a person through its durable run on Temporal (an MCP
server's elicitation, ``MCPServer(elicitation="run")``), kept in the run's workflow.

The tool runs in an activity, whose executor asks through ``Asker``: an update
(``ask``) tells the run's workflow the question, then the activity looks for the
answer (the ``answer_of`` query, every ``ANSWER_POLL`` seconds; its heartbeats go
on meanwhile, so a call waiting for a person is neither timed out by its heartbeat
timeout nor started twice) until a person answers (the ``answer`` update, which
``TemporalRunHandle.answer`` sends) or the call's signal fires (its timeout, an
abort): then the tool hears "cancel" and the workflow drops the question (the
``question_ended`` signal). Every question and answer is in the run's history.

A question's id is ``"{call_id}:{n}"``, the call's n-th question (from 1), so an
activity started again after its worker died asks its questions under the same ids:
the same question (same message, schema and URL) gets the answer recorded for it at
once, without a person; a different one is asked anew.

Bounded (``WorkflowQuestions``): at most ``MAX_PENDING_QUESTIONS`` pending on a run
(the asker of one more is refused, as in-process), a question's and an answer's JSON
at most ``MAX_MESSAGE_CHARS``; a call's questions and answers are dropped when its
activity ends, and a run keeps at most ``MAX_KEPT_ANSWERS`` answers of running calls
(past it the oldest is dropped: a retried call asks that question anew).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from temporalio import activity
from temporalio.client import (
    Client,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError

from statemachine.agent.questions import MAX_PENDING_QUESTIONS, Answer, MakeQuestion, check_answer
from statemachine.core.abort import AbortSignal
from statemachine.core.messages import ToolCall
from statemachine.durable._inputs import MAX_MESSAGE_CHARS
from statemachine.durable._wire import question_from_dict, question_to_dict
from statemachine.durable.temporal._inflight import send_update
from statemachine.errors import InvalidInputError, NotPendingError, StoreUnavailableError

__all__ = [
    "ANSWER_POLL",
    "INVALID",
    "MAX_KEPT_ANSWERS",
    "Asker",
    "WorkflowQuestions",
]

ANSWER_POLL = 0.25  # seconds between two looks of a waiting activity for its answer
MAX_KEPT_ANSWERS = 64  # answers of running calls a run keeps (for their retries)
ASK_TIMEOUT = 30.0  # seconds the ``ask`` update waits for a worker of the run
# Seconds one look for the answer waits for a worker of the run: short, so that the
# call's end (its timeout, an abort) is heard soon even while no worker answers.
LOOK_TIMEOUT = 2.0
INVALID = "InvalidInputError"  # the type of a refused answer or question
NOT_PENDING = "NotPendingError"  # as the workflow's (``_workflow``)


def _json_chars(value: object) -> int:
    return len(json.dumps(value, default=repr))


class WorkflowQuestions:
    """What a run's workflow holds of its questions: the pending ones, and the answers
    of its running calls (module docstring). Changed only by the history's updates,
    signals and activity results, so a replay rebuilds it."""

    def __init__(self) -> None:
        self.pending: dict[str, dict[str, Any]] = {}  # by id, oldest first
        self.answers: dict[str, tuple[dict[str, Any], Any]] = {}  # id: (question, answer)

    def check_ask(self, question: Any, running: bool) -> None:
        """Refuse (``ApplicationError``) a question the run cannot hold."""
        if not running:
            raise ApplicationError("the asking call is not running", type=NOT_PENDING)
        if not isinstance(question, Mapping) or _json_chars(question) > MAX_MESSAGE_CHARS:
            raise ApplicationError(
                f"a question is at most {MAX_MESSAGE_CHARS} characters of JSON", type=INVALID
            )
        qid, call_id = question.get("id"), question.get("call_id")
        if not isinstance(qid, str) or qid.rpartition(":")[0] != call_id:
            raise ApplicationError(f"a question's id is its call's: {qid!r}", type=INVALID)
        recorded = self.answers.get(qid)
        again = qid in self.pending or (recorded is not None and recorded[0] == question)
        if not again and len(self.pending) >= MAX_PENDING_QUESTIONS:
            raise ApplicationError(
                f"this run has {MAX_PENDING_QUESTIONS} questions pending already "
                "(MAX_PENDING_QUESTIONS): answer them first",
                type=INVALID,
            )

    def ask(self, question: dict[str, Any]) -> dict[str, Any] | None:
        """Take a question: the answer recorded for the same question (a retried call
        asks it again), or ``None``: it is pending."""
        qid = question["id"]
        recorded = self.answers.get(qid)
        if recorded is not None and recorded[0] == question:
            return {"answer": recorded[1]}
        self.answers.pop(qid, None)  # another question under that id: asked anew
        self.pending[qid] = question
        return None

    def check_answer(self, question_id: Any, answer: Any) -> None:
        """Refuse an answer as ``AgentRun.answer`` does (``NOT_PENDING``, ``INVALID``)."""
        question = self.pending.get(question_id) if isinstance(question_id, str) else None
        if question is None:
            raise ApplicationError(f"no question {question_id!r} is pending", type=NOT_PENDING)
        asked = question_from_dict(question)
        if asked is None:  # the workflow keeps only questions it read whole (``ask``)
            raise ApplicationError(f"no question {question_id!r} is pending", type=NOT_PENDING)
        try:
            check_answer(asked, answer)
        except InvalidInputError as exc:
            raise ApplicationError(str(exc), type=INVALID) from None

    def answer(self, question_id: str, answer: Any) -> None:
        question = self.pending.pop(question_id)
        self.answers[question_id] = (question, answer)
        while len(self.answers) > MAX_KEPT_ANSWERS:
            del self.answers[next(iter(self.answers))]

    def answer_of(self, question_id: str) -> dict[str, Any] | None:
        """``{"answer": ...}`` once answered; ``{}`` while pending; ``None`` when the
        run no longer holds the question (it ended)."""
        if question_id in self.pending:
            return {}
        recorded = self.answers.get(question_id)
        return None if recorded is None else {"answer": recorded[1]}

    def ended(self, question_id: str) -> None:
        """The question ended with its call unanswered (its timeout, an abort)."""
        self.pending.pop(question_id, None)

    def call_ended(self, call_id: str) -> None:
        """Drop the questions and answers of a call whose activity has ended."""
        for held in (self.pending, self.answers):
            for qid in [q for q in held if q.rpartition(":")[0] == call_id]:
                del held[qid]


class Asker:
    """The activity's side of a tool call's questions (module docstring): made in the
    activity, so it knows the worker's client and the run."""

    def __init__(self) -> None:
        self._client: Client = activity.client()
        self._run_id = str(activity.info().workflow_id)
        self._asked: dict[str, int] = {}  # questions asked, by call id

    async def ask(self, call: ToolCall, make: MakeQuestion, signal: AbortSignal) -> Answer:
        """The answer to ``make(id)``; "cancel" once ``signal`` fires."""
        self._asked[call.id] = n = self._asked.get(call.id, 0) + 1
        question = make(f"{call.id}:{n}")
        if signal.aborted:
            return "cancel"
        workflow = self._client.get_workflow_handle(self._run_id)
        try:
            recorded = await send_update(workflow, "ask", question_to_dict(question), ASK_TIMEOUT)
        except WorkflowUpdateFailedError as exc:
            cause = exc.cause
            raise InvalidInputError(
                cause.message if isinstance(cause, ApplicationError) else str(exc)
            ) from None
        except (RPCError, WorkflowUpdateRPCTimeoutOrCancelledError) as exc:
            raise StoreUnavailableError(f"the run did not take the question: {exc}") from None
        if recorded:
            answer: Answer = recorded["answer"]
            return answer
        ended = asyncio.Event()
        loop = asyncio.get_running_loop()

        def fired(_reason: object) -> None:
            loop.call_soon_threadsafe(ended.set)  # the signal may fire from any thread

        remove = signal.add_listener(fired)
        try:
            return await self._wait(workflow, question.id, ended)
        finally:
            remove()

    async def _wait(self, workflow: Any, question_id: str, ended: asyncio.Event) -> Answer:
        """Look for the answer until it comes, or the call's signal fires ("cancel":
        the run is told, best effort, so no one answers it any more)."""
        while not ended.is_set():
            try:
                state = await workflow.query(
                    "answer_of", question_id, rpc_timeout=timedelta(seconds=LOOK_TIMEOUT)
                )
            except RPCError:
                state = {}  # no worker answered now (one restarting): look again
            if state is None:
                return "cancel"  # the run no longer holds it
            if "answer" in state:
                answer: Answer = state["answer"]
                return answer
            try:
                await asyncio.wait_for(ended.wait(), ANSWER_POLL)
            except TimeoutError:
                pass
        try:
            await workflow.signal("question_ended", question_id)
        except RPCError:
            pass  # the run drops it when the call's activity ends
        return "cancel"


def refused_answer(question_id: str, run_id: str, kind: str | None, text: str) -> Exception:
    """The error of an ``answer`` update the workflow refused."""
    if kind == INVALID:
        return InvalidInputError(text)
    return NotPendingError(f"no question {question_id!r} is pending on run {run_id!r}")

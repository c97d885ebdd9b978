"""Questions a durable run's running tools ask a person (an MCP server's elicitation,
``MCPServer(elicitation="run")``), on any backend.

A question is pending on the run's own ``RunQuestions`` (``agent/questions.py``), as
in-process: "cancel" once its call ends (its timeout, an abort), at most
``MAX_PENDING_QUESTIONS`` at once. What a durable run adds:

- Its id is the call's and the count of the call's questions: ``"{call_id}:{n}"``
  (from 1), the same when the call runs again after a crash.
- What is pending is published for any process (``RunHandle.pending_questions``):
  the backend writes the whole list each time it changes (``publish``), outside the
  run's numbered operations, since when a tool asks depends on timing.
- An answer is a message of the run (``{"kind": "answer", ...}``, ``answer_message``),
  taken through the control lane (``_lane``), which records where it took effect. It
  names the question by id and by ``fingerprint`` (its message, schema and URL), so
  it answers only the question it was given for.
- A tool call that was running when the process died runs again: when it asks the
  same question again (same id, same fingerprint), the answer recorded before the
  crash (or taken since, before the call asked again) is given back at once, without
  a person; any other question is asked anew.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from statemachine.agent.events import ToolQuestion
from statemachine.agent.executor import AsyncioExecutor
from statemachine.agent.questions import (
    MAX_PENDING_QUESTIONS,
    Answer,
    MakeQuestion,
    RunQuestions,
    check_answer,
)
from statemachine.core.abort import AbortSignal
from statemachine.core.messages import ToolCall
from statemachine.durable._wire import question_from_dict, question_to_dict
from statemachine.errors import InvalidInputError, NotPendingError

__all__ = [
    "ANSWER",
    "MAX_QUESTION_JSON",
    "DurableQuestions",
    "PublishQuestions",
    "answer_message",
    "fingerprint",
    "questions_from_published",
]

ANSWER = "answer"  # the kind of a message that answers a question
MAX_QUESTION_JSON = 100_000
"""Characters of one published question, or of one answer, as JSON: past it a
question is refused to its asker, an answer to the person."""

PublishQuestions = Callable[[list[dict[str, Any]]], Awaitable[None]]
"""Publishes the pending questions (as ``question_to_dict``) for any process."""


def questions_from_published(published: object) -> tuple[ToolQuestion, ...]:
    """The pending questions a run published (at most ``MAX_PENDING_QUESTIONS``)."""
    if not isinstance(published, list):
        return ()
    found = (question_from_dict(d) for d in published[:MAX_PENDING_QUESTIONS])
    return tuple(q for q in found if q is not None)


def fingerprint(question: ToolQuestion) -> str:
    """What makes two questions the same one: their message, schema and URL."""
    asked = {"message": question.message, "schema": question.schema, "url": question.url}
    return hashlib.sha256(json.dumps(asked, sort_keys=True).encode()).hexdigest()


def answer_message(question: ToolQuestion, answer: object) -> dict[str, Any]:
    """The message that answers ``question`` with ``answer``, checked against its
    schema (``InvalidInputError``, as ``AgentRun.answer``)."""
    checked = check_answer(question, answer)
    given = checked if isinstance(checked, str) else dict(checked)
    if len(json.dumps(given)) > MAX_QUESTION_JSON:
        raise InvalidInputError(
            f"question {question.id!r}: an answer holds at most {MAX_QUESTION_JSON} "
            "characters as JSON"
        )
    return {
        "kind": ANSWER,
        "question_id": question.id,
        "asked": fingerprint(question),
        "answer": given,
    }


class DurableQuestions:
    """The questions of one execution of a durable run (module docstring).
    ``places``: the messages the run took before (``_lane``'s records), whose answers
    are given back to the same questions; ``publish``: where the pending questions
    are published (``None``: nowhere, an export)."""

    def __init__(self, places: Sequence[Mapping[str, Any]], publish: PublishQuestions | None):
        self._recorded: dict[str, Mapping[str, Any]] = {}
        for place in places:
            message = place.get("message")
            if isinstance(message, Mapping) and message.get("kind") == ANSWER:
                self._recorded[str(message.get("question_id"))] = message
        self._publish = publish
        self._asked: dict[str, int] = {}  # questions asked so far, per call
        self._early: deque[str] = deque()  # answers taken before their question
        self._run: RunQuestions | None = None  # the questions of the part that asked last
        self._dirty = False
        self._writer: asyncio.Future[None] | None = None

    def recorded(self, question: ToolQuestion) -> Answer | None:
        """The answer recorded for ``question`` before a crash, if it is the same."""
        message = self._recorded.get(question.id)
        if message is None or message.get("asked") != fingerprint(question):
            return None
        try:
            return check_answer(question, message.get("answer"))
        except InvalidInputError:
            return None

    async def ask(
        self, driver: AsyncioExecutor, call: ToolCall, make: MakeQuestion, signal: AbortSignal
    ) -> Answer:
        """Ask ``make(id)`` on the run (``RunQuestions.ask``), published while it is
        pending, answered at once if it was answered before a crash."""
        question = self._next(call, make)
        if len(json.dumps(question_to_dict(question))) > MAX_QUESTION_JSON:
            raise InvalidInputError(
                f"a question holds at most {MAX_QUESTION_JSON} characters as JSON"
            )
        questions: RunQuestions = driver.loop.stream.questions
        self._run = questions
        aborting = driver.loop.controller.signal
        return await questions.ask(
            lambda _: question,
            signal,
            lambda: aborting.aborted,
            question_id=question.id,
            given=self.recorded(question),
            changed=self._changed if self._publish is not None else None,
        )

    def replayed(self, call: ToolCall, make: MakeQuestion) -> Answer | None:
        """The recorded answer to the question ``make(id)``, asked by ``call`` where
        nobody can be asked (an export)."""
        return self.recorded(self._next(call, make))

    def _next(self, call: ToolCall, make: MakeQuestion) -> ToolQuestion:
        """The call's next question, named ``"{call_id}:{n}"``."""
        count = self._asked[call.id] = self._asked.get(call.id, 0) + 1
        return make(f"{call.id}:{count}")

    def take(self, message: Mapping[str, Any]) -> None:
        """An answer taken from the run's messages: given to its question if that is
        pending and the same; dropped otherwise (answered already, ended with its
        call, or asked before a crash and not again)."""
        run = self._run
        question_id = message.get("question_id")
        if not isinstance(question_id, str) or len(question_id) > MAX_QUESTION_JSON:
            return
        pending = () if run is None else run.pending()
        question = next((q for q in pending if q.id == question_id), None)
        if run is None or question is None:
            self._keep(question_id, message)
            return
        if message.get("asked") != fingerprint(question):
            return
        try:
            run.answer(question_id, message.get("answer"))
        except (InvalidInputError, NotPendingError):
            return  # not an answer to this question (checked when it was sent)

    def _keep(self, question_id: str, message: Mapping[str, Any]) -> None:
        """An answer taken before its question was asked again (sent while a tool
        that runs again had not asked yet): given if the same question comes. The
        last ``MAX_PENDING_QUESTIONS`` such answers are kept."""
        self._early.append(question_id)
        self._recorded[question_id] = message
        if len(self._early) > MAX_PENDING_QUESTIONS:
            self._recorded.pop(self._early.popleft(), None)

    def _changed(self) -> None:
        """The pending questions changed: publish them (one write at a time, each
        of the list as it is when the write starts)."""
        self._dirty = True
        if self._writer is None or self._writer.done():
            self._writer = asyncio.ensure_future(self._write())

    async def _write(self) -> None:
        publish = self._publish
        assert publish is not None
        while self._dirty:
            self._dirty = False
            pending = () if self._run is None else self._run.pending()
            try:
                await publish([question_to_dict(q) for q in pending])
            except Exception:  # noqa: BLE001 - unseen, the question ends with its call
                continue  # (its timeout); the next change writes the list again

    async def settle(self) -> None:
        """Wait for the last write of the pending questions (the run is ending)."""
        if self._writer is not None:
            await asyncio.shield(self._writer)

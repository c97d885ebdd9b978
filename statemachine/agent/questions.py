"""Questions a running tool asks a person through its run (an MCP server's
elicitation, ``MCPServer(elicitation="run")``), and their answers.

An approval is asked before a call starts, so the run can stop at a turn boundary to
wait for it. A question comes while a call runs: the call holds it open, so the run
keeps its state (``CollectingResults``) and the question is an event of the running
tool. The run shows it (``AgentRun.pending_questions()``, a ``ToolAsked`` event) and
a person answers it (``AgentRun.answer(question_id, answer)``) as a decision on an
approval is given; ``ToolAnswered`` says how it ended.

Bounded: at most ``MAX_PENDING_QUESTIONS`` pending on one run at once (past it the
asker is refused), each one ends with its call (its timeout or an abort answer it
"cancel"), and an answer is checked against the question's schema before it is taken.
A durable run keeps its questions here too, and publishes them and takes their
answers through its backend (``statemachine.durable._questions``).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeAlias

from statemachine.agent.events import RunEvent, ToolAnswered, ToolAsked, ToolQuestion
from statemachine.core.abort import AbortSignal
from statemachine.core.tools import ToolDefinition, validate_arguments
from statemachine.errors import InvalidInputError, NotPendingError

__all__ = ["MAX_PENDING_QUESTIONS", "Answer", "MakeQuestion", "RunQuestions", "check_answer"]

MAX_PENDING_QUESTIONS = 8
"""Questions one run may have pending at once; the asker of one more is refused."""

MakeQuestion: TypeAlias = Callable[[str], ToolQuestion]
"""What builds a running tool's question once its id is known (the backend that asks
gives the id: ``Backend.ask``)."""

Answer: TypeAlias = Mapping[str, Any] | Literal["decline", "cancel"]
"""A person's answer: a mapping accepts (its values as the question's schema says),
"decline" says no, "cancel" dismisses the question without choosing."""


def check_answer(question: ToolQuestion, answer: object) -> Answer:
    """``answer``, checked against the question's schema (``InvalidInputError`` naming
    what does not fit)."""
    if answer in ("decline", "cancel"):
        return answer
    if not isinstance(answer, Mapping) or not all(isinstance(k, str) for k in answer):
        raise InvalidInputError(
            f"question {question.id!r}: an answer is a mapping of the schema's fields, "
            f'"decline" or "cancel", not {type(answer).__name__}'
        )
    if question.url is not None:
        if answer:
            raise InvalidInputError(f"question {question.id!r} asks to open a URL: accept is {{}}")
        return answer
    definition = ToolDefinition("answer", question.message[:200], question.schema)
    wrong = validate_arguments(definition, answer)
    if wrong:
        said = "; ".join(w.replace("arguments", "answer", 1) for w in wrong[:5])
        raise InvalidInputError(f"question {question.id!r}: {said}")
    return answer


class RunQuestions:
    """The questions pending on one run (module docstring). ``answer`` may come from
    any thread; the rest runs on the run's event loop."""

    def __init__(self, emit: Callable[[RunEvent], None], limit: int = MAX_PENDING_QUESTIONS):
        self._emit = emit
        self._limit = limit
        self._lock = threading.Lock()
        self._pending: dict[str, tuple[ToolQuestion, asyncio.Future[tuple[Answer, str]]]] = {}
        self._asked = 0

    def pending(self) -> tuple[ToolQuestion, ...]:
        """The questions waiting for an answer, oldest first."""
        with self._lock:
            return tuple(question for question, _ in self._pending.values())

    def answer(self, question_id: str, answer: object) -> None:
        """Answer a pending question; ``NotPendingError`` if it is not (unknown,
        answered already, or ended with its call)."""
        with self._lock:
            entry = self._pending.get(question_id)
            if entry is None:
                raise NotPendingError(f"no question {question_id!r} is pending on this run")
            checked = check_answer(entry[0], answer)
            del self._pending[question_id]
        outcome = checked if isinstance(checked, str) else "accept"
        _settle(entry[1], checked, outcome)

    async def ask(
        self,
        make: MakeQuestion,
        signal: AbortSignal,
        aborting: Callable[[], bool],
        *,
        question_id: str | None = None,
        given: Answer | None = None,
        changed: Callable[[], None] | None = None,
    ) -> Answer:
        """Ask ``make(id)`` and wait for its answer: "cancel" once ``signal`` fires (the
        call's timeout, or an abort: ``aborting()`` tells which). ``InvalidInputError``
        past ``MAX_PENDING_QUESTIONS``. A durable run names the question
        (``question_id``), may hold its answer already (``given``, recorded before a
        crash: taken at once) and publishes what is pending (``changed()``, called
        when a question is added or ends)."""
        if given is not None:
            question = make(question_id or "q0")
            self._emit(ToolAsked(question))
            self._emit(ToolAnswered(question, given if isinstance(given, str) else "accept"))
            return given
        future: asyncio.Future[tuple[Answer, str]] = asyncio.get_running_loop().create_future()
        with self._lock:
            if len(self._pending) >= self._limit:
                raise InvalidInputError(
                    f"this run has {self._limit} questions pending already "
                    "(MAX_PENDING_QUESTIONS): answer them first"
                )
            self._asked += 1
            question = make(question_id or f"q{self._asked}")
            if question.id in self._pending:
                raise InvalidInputError(f"question {question.id!r} is pending already")
            self._pending[question.id] = (question, future)
        if changed is not None:
            changed()

        def ended(_reason: object) -> None:
            with self._lock:
                if self._pending.pop(question.id, None) is None:
                    return  # answered already
            _settle(future, "cancel", "aborted" if aborting() else "timed out")

        remove = signal.add_listener(ended)
        self._emit(ToolAsked(question))
        outcome = "cancelled"
        try:
            answer, outcome = await future
            return answer
        finally:
            remove()
            with self._lock:
                self._pending.pop(question.id, None)
            if changed is not None:
                changed()
            if future.done() and not future.cancelled():
                outcome = future.result()[1]  # settled, then cancelled before it was read
            self._emit(ToolAnswered(question, outcome))


def _settle(future: asyncio.Future[tuple[Answer, str]], answer: Answer, outcome: str) -> None:
    """Resolve ``future`` on its own loop, from whichever thread answers."""

    def settle() -> None:
        if not future.done():
            future.set_result((answer, outcome))

    loop = future.get_loop()
    if loop.is_closed():
        return
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        settle()
    else:
        loop.call_soon_threadsafe(settle)

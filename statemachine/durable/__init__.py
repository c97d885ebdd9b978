"""Durable runs: the contract a backend keeps, with no backend imported.

A durable run is the same run as ``run_agent`` (the same engine, the same action loop,
the same ``RunResult``), with every operation's outcome saved in a database before the
engine sees it, so that the run survives the death of its process and can wait for a
person for days. ``statemachine.durable.dbos`` is the backend on DBOS (the ``[dbos]``
extra); this module names what any backend promises and what a caller holds.

What a backend offers
---------------------
A backend is a module named in ``BACKENDS`` with a ``DurableRunner`` (a worker: it
runs runs, resolving their models, tools and hooks in its registry), handles
(``RunHandle``) and ``open_store(database_url)`` (a ``RunStore``: the runs seen from
a process that is not a worker; the command line's ``durable export|list
--backend NAME``). What a backend reuses rather than rewrites lives in modules that
import none: the run's course through its approvals to its end (``_course``), tool
results delivered in call order (``_order``), the control lane's logic, which places
each message where it took effect and takes every stored message before the run
ends (``_lane``), the saved JSON (``_wire``), the registry's manifest and version
(``_registry``), the bounds on what callers hand a backend (``_inputs``) and the
rebuilding of a journal from saved steps (``_journal``).

What is promised
----------------
- **A finished step never runs again.** A model call, a tool call or a hook call
  whose outcome was saved is not repeated after a crash: recovery hands the engine
  the saved outcome.
- **A tool call that was running when the process died runs again** (at least once).
  Its idempotency key, ``"{run_id}:{call_id}"``, is the same every time: a tool with
  side effects reads it with ``idempotency_key()`` (or builds it from
  ``statemachine.current_tool_call()``) and deduplicates on it.
- **Model calls are recorded**: recovery does not call the model again for a turn
  whose answer was saved; a model client therefore needs no state of its own between
  calls (after a restart it is a fresh object).
- **The trace after recovery equals an uninterrupted run's**: the engine is rebuilt by
  handing it the saved events again, in the same order (a batch's tool results in call
  order), so history and transition log are those of a run that never stopped.
- **The application version** is the one the user sets, or by default the package
  version plus a digest of the transition table and of the worker's registry (its
  models, tools and hooks, with a digest of each one's code: ``_registry``). A worker
  recovers and dequeues only runs of its own version, so a deploy that changes the
  table or the registry never replays an old run on new code: the old runs wait for a
  worker of their version (keep one running until they drain) and are listed as
  ``held`` meanwhile. A worker of the same version whose code does not fit a run (a
  tool or hook the run used is gone) holds the run instead of running it, naming
  the mismatch; an operator resumes it on a compatible worker or ends it as failed.
- **Waiting for a person is durable**: a run that needs approvals publishes them
  (``pending_approvals()``) and waits in the database; ``decide`` may come from any
  process, before or after restarts. A call that is not pending (unknown, or already
  decided) is refused with ``NotPendingError``.
- **A running tool's question waits for a person durably** (an MCP server's
  elicitation, ``MCPServer(elicitation="run")``): it is published
  (``pending_questions()``) while its call runs, and ``answer(question_id, answer)``
  may come from any process; the answer is checked against the question's schema
  (``InvalidInputError``), a question that is not pending is refused
  (``NotPendingError``), and the answer is recorded as a message of the run. Its id
  is ``"{call_id}:{n}"`` (the call's n-th question, from 1). A call that runs again
  after a crash and asks the same question (same id, message and schema) gets the
  recorded answer at once, without a person; any other question is asked anew. A
  question ends with its call: its timeout or an abort answers it "cancel". At most
  ``MAX_PENDING_QUESTIONS`` are pending on a run at once.
"""

from __future__ import annotations

import contextvars
import importlib
import os
from collections.abc import Mapping, Sequence
from typing import IO, Protocol, Required, TypedDict, Union, Unpack, runtime_checkable

import attrs

from statemachine.agent.events import RunResult, ToolQuestion
from statemachine.agent.questions import Answer
from statemachine.agent.running import current_tool_call
from statemachine.agent.tools import Tool
from statemachine.core.limits import UsageLimits
from statemachine.core.messages import Message, ToolCall, UserMessage
from statemachine.durable._registry import application_version, table_digest
from statemachine.errors import (
    ExportError,
    InvalidInputError,
    NotPendingError,
    RunClosedError,
    RunFailedError,
    RunHeldError,
    StoreUnavailableError,
    UnknownRunError,
)

__all__ = [
    "BACKENDS",
    "DurableRunOptions",
    "DurableRunner",
    "ExportError",
    "ExportedJournal",
    "ListedRun",
    "NotPendingError",
    "RunClosedError",
    "RunFailedError",
    "RunHandle",
    "RunHeldError",
    "RunStatus",
    "RunStore",
    "StoreUnavailableError",
    "UnknownRunError",
    "application_version",
    "idempotency_key",
    "open_store",
    "table_digest",
]


class DurableRunOptions(TypedDict, total=False):
    """The options of a durable run (``DurableRunner.start`` and ``enqueue``): what
    ``run_agent`` takes as objects, named here in the worker's registry, so that the
    run's input is JSON that any worker of the registry can run."""

    model: Required[str]
    """The name of the run's model client in the registry (``models=``)."""
    messages: Required[str | Sequence[Message]]
    """The run's history: a string is one user message."""
    tools: Sequence[str] | None
    """The names of the registry's tools the run may call (``None``: all of them)."""
    max_turns: int
    """Model responses the run may take (default 8), as ``run_agent``'s."""
    instructions: str | None
    """The name of the run's instructions in the registry (``instructions=``)."""
    output_type: str | None
    """The name of the run's output type in the registry (``output_types=``)."""
    usage_limits: UsageLimits | None
    """As ``run_agent``'s."""


@attrs.frozen
class RunStatus:
    """Where a durable run is: ``state`` is ``"queued"``, ``"running"``, ``"waiting"``
    (for approvals), ``"held"`` (``held`` names why: the code that took it does not fit
    it, or it waits for a worker of its ``app_version``), ``"finished"`` (see
    ``result()`` for how), ``"failed"`` (the backend gave up on it, or an operator
    ended it: ``explanation`` says so) or ``"cancelled"``. A ``"running"`` run with an
    ``explanation`` is one whose state is not known more closely (Temporal: no worker
    of it answered). ``notes`` name the changes
    of code the run went on through (a tool's code changed since it started)."""

    run_id: str
    state: str
    pending_approvals: tuple[ToolCall, ...] = ()
    app_version: str = ""
    held: str = ""
    explanation: str = ""
    notes: tuple[str, ...] = ()


@attrs.frozen
class ListedRun(RunStatus):
    """A ``RunStatus`` with when the run was created and last updated (seconds since
    the epoch, as the backend keeps them; DBOS: to the millisecond on PostgreSQL, to
    the second on SQLite, where runs created in the same second list in no set order)."""

    created: float = 0.0
    updated: float = 0.0


@attrs.frozen
class ExportedJournal:
    """What ``export_journal`` wrote: the run, its events, where it stands, and
    whether the run had finished (``False``: the journal ends where its steps end)."""

    run_id: str
    events: int
    state: str
    finished: bool


JournalTarget = Union[str, "os.PathLike[str]", IO[str]]  # a new file's path, or a text stream


@runtime_checkable
class RunHandle(Protocol):
    """What a caller holds for a durable run; every method may be called from any
    process that reaches the run's database, before or after the run's worker died."""

    run_id: str

    async def result(self, timeout: float | None = None) -> RunResult:
        """Wait for the run to end; the same ``RunResult`` as ``run_agent``'s. Its
        ``stats`` count every call the engine was handed (the same after a crash);
        its times are those measured by the process that finished the run."""
        ...

    async def pending_approvals(self) -> tuple[ToolCall, ...]:
        """The calls waiting for a person's decision, in call order."""
        ...

    async def decide(self, call_id: str, approve: bool, reason: str | None = None) -> None:
        """Approve or deny a pending call; ``NotPendingError`` if it is not pending."""
        ...

    async def pending_questions(self) -> tuple[ToolQuestion, ...]:
        """The questions the run's running tools wait on a person for (an MCP
        server's elicitation), oldest first; none once the run has ended."""
        ...

    async def answer(self, question_id: str, answer: Answer) -> None:
        """Answer a pending question (``InvalidInputError`` if the answer does not fit
        its schema); ``NotPendingError`` if it is not pending."""
        ...

    async def steer(self, message: str | UserMessage) -> None:
        """Queue a message for the model, injected at a turn boundary."""
        ...

    async def follow_up(self, message: str | UserMessage) -> None:
        """Queue a message used when the model would otherwise finish."""
        ...

    async def abort(self, reason: str | None = None) -> None:
        """Abort the run; every started call still gets its result (I6)."""
        ...

    async def status(self) -> RunStatus:
        """Where the run is now."""
        ...

    async def export_journal(
        self, target: JournalTarget, tools: Sequence[Tool] | None = None
    ) -> ExportedJournal:
        """Write the run as the journal ``run_agent_journaled`` would have written
        (``tools``: the run's tools, for their schemas); ``ExportError`` if its saved
        steps do not rebuild its saved result."""
        ...


@runtime_checkable
class RunStore(Protocol):
    """The runs' database seen from a process that is not a worker (a command line,
    a dashboard): every backend offers one (``open_store``)."""

    async def handle(self, run_id: str) -> RunHandle:
        """The handle of an existing run; ``UnknownRunError`` if there is none."""
        ...

    async def list_runs(self, status: str | None = None, limit: int = 100) -> tuple[ListedRun, ...]:
        """The runs, newest first, at most ``limit``; ``status`` keeps one state."""
        ...

    async def export_journal(self, run_id: str, target: JournalTarget) -> ExportedJournal:
        """Write the run ``run_id`` as a journal (``RunHandle.export_journal``)."""
        ...

    def close(self) -> None:
        """Let go of the database."""
        ...


@runtime_checkable
class DurableRunner(Protocol):
    """A worker of a backend: it runs durable runs in this process, resolving their
    models, tools and hooks in its registry; every method needs it started.

    How a worker starts and stops is the backend's own, so it is not part of this
    protocol: ``DBOSRunner.launch()``/``destroy()`` are plain calls (DBOS runs its
    own threads), ``TemporalRunner``'s are coroutines (a Temporal worker runs on
    the caller's event loop; ``async with runner:`` does both)."""

    app_version: str

    async def start(self, run_id: str, **options: Unpack[DurableRunOptions]) -> RunHandle:
        """Start the run ``run_id`` in this worker (or return its handle)."""
        ...

    async def enqueue(
        self, run_id: str, *, queue: str, **options: Unpack[DurableRunOptions]
    ) -> RunHandle:
        """Put the run ``run_id`` on ``queue`` for a worker that takes from it."""
        ...

    async def handle(self, run_id: str) -> RunHandle:
        """The handle of an existing run; ``UnknownRunError`` if there is none."""
        ...

    async def recover(self, executor_ids: Sequence[str]) -> list[str]:
        """Take over the unfinished runs of dead workers; their run ids."""
        ...

    async def status(self, run_id: str) -> RunStatus:
        """The run's status as this worker sees it (``held`` included)."""
        ...

    async def list_runs(self, status: str | None = None, limit: int = 100) -> tuple[ListedRun, ...]:
        """The runs, newest first (``RunStore.list_runs``)."""
        ...

    async def export_journal(self, run_id: str, target: JournalTarget) -> ExportedJournal:
        """Write the run as a journal, with this worker's tools and hooks."""
        ...

    async def resume_held(self, run_id: str) -> None:
        """Let a held run go on, on this worker's code (which must fit it)."""
        ...

    async def end_held(self, run_id: str, explanation: str) -> None:
        """End a held run as failed, with ``explanation``."""
        ...


BACKENDS: Mapping[str, str] = {
    "dbos": "statemachine.durable.dbos",
    "temporal": "statemachine.durable.temporal",
}
"""The backends by name: each module has ``open_store(database_url) -> RunStore``."""


def open_store(backend: str, database_url: str) -> RunStore:
    """The ``RunStore`` of ``backend`` (a name in ``BACKENDS``) on ``database_url``;
    ``InvalidInputError`` for an unknown backend, ``StoreUnavailableError`` for a
    database that cannot be reached, ``ImportError`` without the backend's extra."""
    if backend not in BACKENDS:
        raise InvalidInputError(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}")
    module = importlib.import_module(BACKENDS[backend])
    store: RunStore = module.open_store(database_url)
    return store


_durable_run_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "statemachine_durable_run_id", default=None
)


def idempotency_key() -> str | None:
    """``"{run_id}:{call_id}"`` inside a tool run by a durable backend, the same on
    every attempt of that call; ``None`` elsewhere."""
    run_id = _durable_run_id.get()
    call = current_tool_call()
    if run_id is None or call is None:
        return None
    return f"{run_id}:{call.id}"

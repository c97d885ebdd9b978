"""Durable runs: the contract a backend keeps, with no backend imported.

A durable run is the same run as ``run_agent`` (the same engine, the same action loop,
the same ``RunResult``), with every operation's outcome saved in a database before the
engine sees it, so that the run survives the death of its process and can wait for a
person for days. ``statemachine.durable.dbos`` is the backend on DBOS (the ``[dbos]``
extra); this module names what any backend promises and what a caller holds.

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
- **The application version** is the package version plus a digest of the transition
  table (``application_version()``). A worker recovers and dequeues only runs of its
  own version, so a deploy with a changed table never replays an old run on the new
  table: runs in flight at an upgrade stay pending until a worker of their version
  finishes them (keep one running until they drain), or are cancelled.
- **Waiting for a person is durable**: a run that needs approvals publishes them
  (``pending_approvals()``) and waits in the database; ``decide`` may come from any
  process, before or after restarts. A call that is not pending (unknown, or already
  decided) is refused with ``NotPendingError``.
"""

from __future__ import annotations

import contextvars
import hashlib
from typing import Protocol, runtime_checkable

import attrs

from statemachine._version import __version__
from statemachine.agent.events import RunResult
from statemachine.agent.executor import current_tool_call
from statemachine.core.errors import StateMachineError, UsageError
from statemachine.core.messages import ToolCall, UserMessage
from statemachine.core.table import TRANSITIONS

__all__ = [
    "NotPendingError",
    "RunEndedError",
    "RunHandle",
    "RunStatus",
    "StoreUnavailableError",
    "UnknownRunError",
    "application_version",
    "idempotency_key",
    "table_digest",
]


class UnknownRunError(UsageError):
    """No durable run has this run id."""


class NotPendingError(UsageError):
    """A decision for a call that is not waiting for one (unknown or already decided)."""


class RunEndedError(UsageError):
    """A message to a run that has ended, or that ended before it took the message:
    it reaches no model (start a new run with it)."""


class StoreUnavailableError(StateMachineError):
    """The runs' database cannot be reached or opened (the message names it, with
    any password hidden); nothing was changed in it."""


@attrs.frozen
class RunStatus:
    """Where a durable run is: ``state`` is ``"queued"``, ``"running"``, ``"waiting"``
    (for approvals), ``"finished"`` (see ``result()`` for how), ``"failed"`` (the
    backend gave up on it) or ``"cancelled"``."""

    run_id: str
    state: str
    pending_approvals: tuple[ToolCall, ...] = ()
    app_version: str = ""


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


def table_digest() -> str:
    """A digest of the transition table's rows: changes whenever the table does."""
    # Names, not reprs: a guard's repr carries its memory address.
    rows = "\n".join(
        f"{t.source.value}|{t.trigger.value}|{t.dest.value}|"
        f"{getattr(t.guard, '__name__', t.guard)}|{t.label}"
        for t in TRANSITIONS
    )
    return hashlib.sha256(rows.encode()).hexdigest()[:12]


def application_version() -> str:
    """The version a durable backend runs under: package version + table digest."""
    return f"{__version__}+table.{table_digest()}"


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

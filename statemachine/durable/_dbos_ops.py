"""Looking at durable runs kept by DBOS: export one as a journal, list them.

``export_journal`` writes a durable run as the journal ``run_agent_journaled`` would
have written for it (``statemachine.journal``: header, events, checkpoints), so
``statemachine replay``, ``statemachine check`` and the transcript checker read it
unchanged. It is built the way a recovery rebuilds the run: the run's own course
(``_course.drive`` over ``durable_run``'s parts, as the workflow runs them) goes again over a
``JournalingEngine``, every model call, tool call and hook check answered by the
events its recorded step saved, never by running it, and each message the run took
(steer, follow-up, abort, decision) taking effect after the number of engine events
its ``statemachine.control`` record names (``_dbos_control.Control``). So the journal
holds exactly the events the run's engine accepted. An operation cancelled after an
abort saved no output; it is answered as the run answered it (cancelled).
A run that is not finished exports what it has: the journal ends where the recorded
steps end. A finished run's export is checked against the run's recorded result
(state, history, trace) before anything is written; a difference is an
``ExportError``, never a wrong journal.

The workflow's input names its tools, but their schemas live in the workers' code,
not in the database: pass the tools to get them in the header (``DBOSRunner`` does);
without them each tool is written with a schema that accepts any arguments (the
events, and so the replay, are the same unless the run's model sent arguments its
schema refused, which the check against the result then reports).

``list_runs`` lists the runs of a database, newest first, at most ``limit``
(``DEFAULT_LIST_LIMIT``).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Mapping, Sequence
from functools import partial
from typing import IO, Any, Final

import attrs
from dbos import DBOSClient

from statemachine.agent.events import RunResult
from statemachine.agent.executor import AsyncioExecutor, Operation
from statemachine.agent.questions import Answer, MakeQuestion
from statemachine.agent.run import AgentRun
from statemachine.agent.tools import Tool
from statemachine.core.abort import AbortSignal
from statemachine.core.events import ModelCancelled, ToolCancelled
from statemachine.core.messages import ToolCall
from statemachine.core.table import State
from statemachine.durable import (
    ExportedJournal,
    ExportError,
    ListedRun,
    UnknownRunError,
)
from statemachine.durable._course import LaneRun, replay_course
from statemachine.durable._dbos_control import Control, recorded_looks
from statemachine.durable._dbos_run import ControlInbox, DBOSBackend, StepBody
from statemachine.durable._dbos_status import STATES, WORKFLOW, pending_calls, status_of
from statemachine.durable._inputs import check_run_id
from statemachine.durable._journal import (
    MAX_EXPORT_STEPS,
    NOT_RECORDED,
    Recorded,
    RecordEndedError,
    SavedStep,
    check_against,
    journal_buffer,
    options,
    write_journal,
)
from statemachine.durable._registry import replay_options
from statemachine.errors import InvalidInputError
from statemachine.journal import Journal

__all__ = [
    "DEFAULT_LIST_LIMIT",
    "MAX_EXPORT_STEPS",
    "MAX_LIST_LIMIT",
    "ExportError",
    "ExportedJournal",
    "ListedRun",
    "export_journal",
    "list_runs",
]

DEFAULT_LIST_LIMIT: Final = 100
MAX_LIST_LIMIT: Final = 10_000


# -- what a run recorded ------------------------------------------------------------------------


class _ReplayControl(Control):
    """The control lane with the run's recorded messages only: no listening."""

    def __init__(self, recorded: Sequence[Mapping[str, Any]]) -> None:
        super().__init__(recorded)
        self._recorded_looks = deque(recorded_looks(recorded))

    def start(self) -> None:
        """Nothing to listen to: the messages are the recorded ones."""

    async def _look(self, listening_since: int | None) -> tuple[Any, bool]:
        """What the run's look found here, as recorded."""
        if not self._recorded_looks:
            raise RecordEndedError  # the run had gone no further
        return self._recorded_looks.popleft()

    def _reserve(self) -> Any:
        """The places are the recorded ones: nothing to reserve."""
        return None

    async def _record_place(self, place: Any, record: Mapping[str, Any]) -> None:
        raise RecordEndedError  # a message the run took but whose place it had not recorded

    async def _send(self, marker: Mapping[str, Any]) -> None:
        """The run's markers are recorded with its messages: nothing to send."""

    async def _publish(self, key: str, value: Any) -> None:
        """An export publishes nothing."""

    async def next_message(self) -> Any:
        if not self._schedule:
            raise RecordEndedError  # waiting for a person when the record ends
        return await super().next_message()


class _ReplayInbox(ControlInbox):
    """The run's inbox; an empty one is the end of the recorded steps (``_replay_run``)."""

    async def _wait(self) -> None:
        raise RecordEndedError


class _ReplayBackend:
    """Answers every step by its recorded output, never runs it (``_replay_run``); a
    ``Backend`` that holds the run's ``DBOSBackend`` for what they share."""

    def __init__(self, control: Control, recorded: Recorded) -> None:
        self._recorded = recorded
        self._unrecorded: list[str] = []  # operations started but not recorded
        self._steps = DBOSBackend(control, self._saved)

    async def _saved(self, name: str, key: str, step: StepBody) -> Any:
        saved = self._recorded.take(name, key)
        if saved is NOT_RECORDED:
            self._unrecorded.append(key)
        return saved

    def start(self, driver: AsyncioExecutor, op: Operation) -> None:
        self._steps.start(driver, op)

    def cancel(self, driver: AsyncioExecutor, keys: Sequence[str], reason: str) -> None:
        """An operation cancelled after the abort saved no output: answered as the
        end of the grace period answers one that ended without a word."""
        for key in keys:
            if key in self._unrecorded and key not in driver.loop.reported:
                self._steps.handover.deliver(
                    key, [ModelCancelled() if key == "model" else ToolCancelled(key)]
                )

    def reported(self, key: str) -> None:
        self._steps.reported(key)

    async def ask(
        self, driver: AsyncioExecutor, call: ToolCall, make: MakeQuestion, signal: AbortSignal
    ) -> Answer | None:
        """No one is asked: the answer the run recorded for the same question, if any
        (a tool's recorded step gives back its output, so none runs here)."""
        return self._steps.control.questions.replayed(call, make)


def _replay_run(part: AgentRun, control: Control, recorded: Recorded) -> LaneRun:
    """``part`` with its steps answered by their recorded outputs, never run. Every
    recorded answer is posted when its step starts, so a loop that would wait has
    reached the end of the recorded steps."""
    backend = _ReplayBackend(control, recorded)
    return LaneRun(part, control, _ReplayInbox, backend, control.questions.take)


# -- the export --------------------------------------------------------------------------------


async def _rebuild(
    run_id: str,
    spec: Mapping[str, Any],
    recorded: Recorded,
    steps: Sequence[Mapping[str, Any]],
    journal: Journal,
    chosen: Mapping[str, Any],
) -> tuple[RunResult | None, State]:
    """Run the run's course again over its recorded steps (``_course.drive``, as the
    workflow does), writing ``journal``; the result (``None`` where the recorded steps
    end first) and the state the engine is in."""
    control = _ReplayControl(steps)
    try:
        return await replay_course(
            spec, run_id, journal, chosen, partial(_replay_run, control=control, recorded=recorded)
        )
    except RuntimeError as exc:  # Control: a recorded message has no place in this course
        raise ExportError(f"run {run_id!r}: {exc}") from None


def _saved(step: Mapping[str, Any]) -> SavedStep:
    """A step as DBOS lists it, as ``_journal`` reads saved steps."""
    failed = step.get("error") is not None
    return SavedStep(
        int(step["function_id"]), str(step["function_name"]), step.get("output"), failed
    )


async def export_journal(
    client: DBOSClient,
    run_id: str,
    target: str | os.PathLike[str] | IO[str],
    *,
    tools: Sequence[Tool] | None = None,
    hooks: Mapping[str, Any] | None = None,
) -> ExportedJournal:
    """Write the durable run ``run_id`` as a journal to ``target`` (a new file's path,
    or an open text stream); module docstring. ``tools``: the run's tools (for their
    schemas); ``hooks``: the runner's hooks by name (which the run had), else taken
    from its steps. ``UnknownRunError`` if there is no such run."""
    check_run_id(run_id)
    found = await client.list_workflows_async(workflow_ids=[run_id], load_output=True)
    if not found or found[0].name != WORKFLOW:
        raise UnknownRunError(f"no durable run has the id {run_id!r}")
    status = found[0]
    spec = status.input["args"][1] if isinstance(status.input, Mapping) else None
    if not isinstance(spec, Mapping):
        raise ExportError(f"run {run_id!r} has no readable input")
    steps = await client.list_workflow_steps_async(run_id, limit=MAX_EXPORT_STEPS + 1)
    if len(steps) > MAX_EXPORT_STEPS:
        raise ExportError(f"run {run_id!r} has more than {MAX_EXPORT_STEPS} recorded operations")
    recorded = Recorded([_saved(s) for s in steps])
    # Written out only once it is known right, encoded as a journal file is (a lone
    # surrogate escaped, as run_agent_journaled writes it).
    buffer, data = journal_buffer()
    journal = Journal(buffer, flush="close")
    chosen = {**options(spec, recorded, tools, hooks), **replay_options(spec)}
    result, state = await _rebuild(run_id, spec, recorded, steps, journal, chosen)
    output = status.output
    finished = status.status == "SUCCESS" and isinstance(output, Mapping)
    if isinstance(output, Mapping) and finished:
        check_against(result, output, run_id)
    buffer.flush()
    write_journal(target, data.getvalue())
    return ExportedJournal(run_id, journal.events_written, state.value, finished)


# -- listing -----------------------------------------------------------------------------------

_DBOS_STATUSES: Final[Mapping[str, tuple[str, ...]]] = {
    ours: tuple(theirs for theirs, mapped in STATES.items() if mapped == ours)
    for ours in sorted(set(STATES.values()))
}


async def list_runs(
    client: DBOSClient,
    status: str | None = None,
    limit: int = DEFAULT_LIST_LIMIT,
    viewer: str = "",
    newest: bool = False,
) -> tuple[ListedRun, ...]:
    """The durable runs of ``client``'s database, newest first, at most ``limit``
    (``DEFAULT_LIST_LIMIT``, at most ``MAX_LIST_LIMIT``); ``status`` keeps one state
    (``RunStatus.state``), as a worker of the application version ``viewer`` sees it
    (``"held"`` too for runs waiting for a worker of another version; ``newest``:
    ``viewer`` is the newest version registered, ``_dbos_status.status_of``). The pending
    approvals are read for running and held runs only."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIST_LIMIT:
        raise InvalidInputError(f"limit must be an int from 1 to {MAX_LIST_LIMIT}, got {limit!r}")
    known = (*_DBOS_STATUSES, "waiting", "held")
    if status is not None and status not in known:
        raise InvalidInputError(f"unknown status {status!r}; known: {', '.join(sorted(known))}")
    found = await client.list_workflows_async(
        name=WORKFLOW,
        status=None if status in (None, "held", "failed") else list(_wanted(status)),
        limit=limit,
        sort_desc=True,
        load_input=False,
        load_output=False,
    )
    runs = []
    for workflow in found:
        listed = status_of(workflow, viewer, newest)
        if listed.state in ("running", "held"):
            pending = await pending_calls(client, workflow.workflow_id)
            if pending and listed.state == "running":
                listed = attrs.evolve(listed, state="waiting")
            listed = attrs.evolve(listed, pending_approvals=pending)
        if status is not None and listed.state != status:
            continue
        runs.append(
            ListedRun(
                **attrs.asdict(listed, recurse=False),
                created=(workflow.created_at or 0) / 1000,
                updated=(workflow.updated_at or 0) / 1000,
            )
        )
    return tuple(runs)


def _wanted(status: str | None) -> tuple[str, ...]:
    return _DBOS_STATUSES["running"] if status == "waiting" else _DBOS_STATUSES[status or ""]

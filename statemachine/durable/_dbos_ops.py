"""Looking at durable runs kept by DBOS: export one as a journal, list them.

``export_journal`` writes a durable run as the journal ``run_agent_journaled`` would
have written for it (``statemachine.journal``: header, events, checkpoints), so
``statemachine replay``, ``statemachine check`` and the transcript checker read it
unchanged. It is built the way a recovery rebuilds the run: the run's own course
(``_dbos_run.drive`` and ``DurableRun``, as the workflow runs them) goes again over a
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

import io
import os
import tempfile
from collections import deque
from collections.abc import Mapping, Sequence
from functools import partial
from typing import IO, Any, Final

import attrs
from dbos import DBOSClient

from statemachine.agent.events import RunResult
from statemachine.agent.tools import Tool
from statemachine.core.abort import AbortSignal
from statemachine.core.errors import InvalidInputError
from statemachine.core.events import (
    Event,
    ModelCancelled,
    ToolCancelled,
    ToolFinished,
)
from statemachine.core.messages import AssistantMessage, Message, ToolCall
from statemachine.core.table import TurnState
from statemachine.core.tools import ToolDefinition
from statemachine.core.wire import messages_from_dicts
from statemachine.durable import RunStatus, UnknownRunError
from statemachine.durable._course import drive
from statemachine.durable._dbos_control import Control
from statemachine.durable._dbos_run import NOT_RECORDED, ControlInbox, DurableRun
from statemachine.durable._wire import decode_step_events, result_from_dict
from statemachine.durable.dbos import _STATES, WORKFLOW, DBOSRunHandle, _check_run_id, _state
from statemachine.journal._writer import Journal, JournalingEngine

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

MAX_EXPORT_STEPS: Final = 200_000  # recorded operations of one run an export reads
DEFAULT_LIST_LIMIT: Final = 100
MAX_LIST_LIMIT: Final = 10_000
_MODEL_STEP = "statemachine.model"
_TOOL_STEP = "statemachine.tool"
_PERMISSION_STEP = "statemachine.permissions"
_CONTINUE_STEP = "statemachine.continue"
_STEPS = (_MODEL_STEP, _TOOL_STEP, _PERMISSION_STEP, _CONTINUE_STEP)


class ExportError(InvalidInputError):
    """A durable run whose recorded steps do not rebuild its recorded result."""


# -- what a run recorded ------------------------------------------------------------------------


class _Recorded:
    """A run's recorded operations, by kind, each taken once, in recorded order (the
    places of its messages are read by ``Control``)."""

    def __init__(self, steps: Sequence[Mapping[str, Any]]) -> None:
        self.steps = [dict(s) for s in steps]
        self.outputs: dict[str, deque[Any]] = {name: deque() for name in _STEPS}
        self.tools: dict[str, Any] = {}
        for step in sorted(self.steps, key=lambda s: int(s["function_id"])):
            name, output = step["function_name"], step.get("output")
            if step.get("error") is not None or name not in _STEPS:
                continue  # a step that raised or was cancelled saved nothing the engine saw
            if name == _TOOL_STEP:
                # Its answer names the call (a tool may also have queued input first).
                events = decode_step_events(output)
                ends = [e.call_id for e in events if isinstance(e, (ToolFinished, ToolCancelled))]
                self.tools[ends[0] if ends else ""] = output
            else:
                self.outputs[name].append(output)

    def has(self, name: str) -> bool:
        """Whether the run recorded any step ``name``."""
        return bool(self.outputs[name])

    def take(self, name: str, key: str) -> Any:
        """The saved output of the next step ``name`` (``key``: a tool's call id)."""
        if name == _TOOL_STEP:
            return self.tools.pop(key, NOT_RECORDED)
        found = self.outputs[name]
        return found.popleft() if found else NOT_RECORDED


class _RecordEndedError(Exception):
    """The recorded steps end here: the run had gone no further."""


class _ReplayControl(Control):
    """The control lane with the run's recorded messages only: no listening."""

    def start(self) -> None:
        """Nothing to listen to: the messages are the recorded ones."""

    async def _send(self, marker: Mapping[str, Any]) -> None:
        """The run's markers are recorded with its messages: nothing to send."""

    async def _publish(self, key: str, value: Any) -> None:
        """An export publishes nothing."""

    async def next_message(self) -> Any:
        if not self._schedule:
            raise _RecordEndedError  # waiting for a person when the record ends
        return await super().next_message()


class _ReplayInbox(ControlInbox):
    """The run's inbox; an empty one is the end of the recorded steps (``_ReplayRun``)."""

    async def _wait(self) -> None:
        raise _RecordEndedError


class _ReplayRun(DurableRun):
    """``DurableRun`` whose steps are answered by their recorded outputs, never run.
    Every recorded answer is posted when its step starts, so a loop that would wait
    has reached the end of the recorded steps."""

    def __init__(self, recorded: _Recorded, **kwargs: Any) -> None:
        self._recorded = recorded
        self._unrecorded: list[str] = []  # operations started but not recorded
        super().__init__(**kwargs)

    _inbox_type = _ReplayInbox

    async def _saved(self, name: str, key: str, step: Any) -> Any:
        saved = self._recorded.take(name, key)
        if saved is NOT_RECORDED:
            self._unrecorded.append(key)
        return saved

    def _start_cancellation(self, keys: list[str], reason: str) -> None:
        """An operation cancelled after the abort saved no output: answered as the
        end of the grace period answers one that ended without a word."""
        for key in keys:
            if key in self._unrecorded and key not in self._reported:
                self._deliver(key, [ModelCancelled() if key == "model" else ToolCancelled(key)])


# -- the export --------------------------------------------------------------------------------


class _NoModel:
    """Stands in for the run's model: an export never calls it."""

    async def complete(
        self, messages: Sequence[Message], tools: Sequence[ToolDefinition], signal: AbortSignal
    ) -> AssistantMessage:
        raise AssertionError("an export answers model calls from the recorded steps")


async def _never(arguments: Mapping[str, Any], signal: AbortSignal) -> str:
    raise AssertionError("an export answers tool calls from the recorded steps")


def _stand_in(name: str) -> Tool:
    definition = ToolDefinition(
        name, "(schema not recorded with the durable run)", {"type": "object"}
    )
    return Tool(definition, _never)


def _hook(*args: Any) -> None:
    """Stands in for a hook the run had: an export never calls it."""


@attrs.frozen
class ExportedJournal:
    """What ``export_journal`` wrote: the run, its events, where it stands, and
    whether the run had finished (``False``: the journal ends where its steps end)."""

    run_id: str
    events: int
    state: str
    finished: bool


async def _rebuild(
    run_id: str,
    spec: Mapping[str, Any],
    recorded: _Recorded,
    journal: Journal,
    options: Mapping[str, Any],
) -> tuple[RunResult | None, TurnState]:
    """Run the run's course again over its recorded steps (``_dbos_run.drive``, as the
    workflow does), writing ``journal``; the result (``None`` where the recorded steps
    end first) and the state the engine is in."""
    control = _ReplayControl(recorded.steps)
    kwargs: dict[str, Any] = {
        "model": _NoModel(),
        "max_turns": spec["max_turns"],
        "run_id": run_id,
        "control": control,
        **options,
    }
    runs = [
        _ReplayRun(
            recorded,
            messages=messages_from_dicts(spec["messages"]),
            engine_factory=partial(JournalingEngine, journal=journal),
            **kwargs,
        )
    ]

    def resume(done: DurableRun, decisions: list[Event]) -> DurableRun:
        runs.append(_ReplayRun(recorded, _engine=done.engine, _resume_events=decisions, **kwargs))
        return runs[-1]

    try:
        result, _ = await drive(runs[0], resume, _publish_nothing)
    except _RecordEndedError:
        return None, runs[-1].engine.state
    except RuntimeError as exc:  # Control: a recorded message has no place in this course
        raise ExportError(f"run {run_id!r}: {exc}") from None
    return result, result.state


async def _publish_nothing(calls: Sequence[ToolCall]) -> None:
    """An export publishes nothing."""


def _options(
    spec: Mapping[str, Any],
    recorded: _Recorded,
    tools: Sequence[Tool] | None,
    hooks: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The run's tools and which hooks it had (from the runner when known, else from
    what its steps show)."""
    names = [str(n) for n in spec["tools"]]
    known = {t.name: t for t in tools or ()}
    chosen = [known.get(n) or _stand_in(n) for n in names]
    if hooks is None:
        asked_permission = recorded.has(_PERMISSION_STEP)
        asked_continue = recorded.has(_CONTINUE_STEP)
    else:
        asked_permission = hooks.get("before_tool_call") is not None
        asked_continue = hooks.get("should_continue") is not None
    return {
        "tools": chosen,
        "before_tool_call": _hook if asked_permission else None,
        "should_continue": _hook if asked_continue else None,
    }


def _check_against(result: RunResult | None, recorded: Mapping[str, Any], run_id: str) -> None:
    expected = result_from_dict(run_id, recorded)
    if result is None:
        raise ExportError(
            f"run {run_id!r} finished, but its recorded steps rebuild a different, unfinished "
            "course (the run's tools or hooks differ from the exporter's?)"
        )
    for what in ("state", "messages", "trace"):
        if getattr(result, what) != getattr(expected, what):
            raise ExportError(
                f"run {run_id!r}: its recorded steps rebuild a different {what} than its "
                "recorded result (the run's tools or hooks differ from the exporter's?)"
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
    _check_run_id(run_id)
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
    recorded = _Recorded(steps)
    # Written out only once it is known right, encoded as a journal file is (a lone
    # surrogate escaped, as run_agent_journaled writes it).
    buffer = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", newline="\n")
    journal = Journal(buffer, flush="close")
    options = _options(spec, recorded, tools, hooks)
    result, state = await _rebuild(run_id, spec, recorded, journal, options)
    output = status.output
    finished = status.status == "SUCCESS" and isinstance(output, Mapping)
    if isinstance(output, Mapping) and finished:
        _check_against(result, output, run_id)
    buffer.flush()
    _write(target, buffer.buffer.getvalue())
    return ExportedJournal(run_id, journal.events_written, state.value, finished)


def _write(target: str | os.PathLike[str] | IO[str], data: bytes) -> None:
    """Write the journal at once: a new file appears whole or not at all."""
    if not isinstance(target, (str, os.PathLike)):
        target.write(data.decode("utf-8"))
        return
    path = os.fspath(target)
    if os.path.lexists(path):
        raise _exists(path)
    folder = os.path.dirname(os.path.abspath(path))
    try:
        fd, temporary = tempfile.mkstemp(prefix=".export-", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise InvalidInputError(f"cannot write {path!r}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.link(temporary, path)  # fails if the path was taken meanwhile
    except FileExistsError:
        raise _exists(path) from None
    finally:
        os.unlink(temporary)


def _exists(path: str) -> InvalidInputError:
    return InvalidInputError(f"{path!r} already exists: a journal holds one run; choose a new path")


# -- listing -----------------------------------------------------------------------------------

_DBOS_STATUSES: Final[Mapping[str, tuple[str, ...]]] = {
    ours: tuple(theirs for theirs, mapped in _STATES.items() if mapped == ours)
    for ours in sorted(set(_STATES.values()))
}


@attrs.frozen
class ListedRun(RunStatus):
    """A ``RunStatus`` with when the run was created and last updated (seconds since
    the epoch, as DBOS keeps them: to the millisecond on PostgreSQL, to the second on
    SQLite, where runs created in the same second list in no set order)."""

    created: float = 0.0
    updated: float = 0.0


async def list_runs(
    client: DBOSClient,
    status: str | None = None,
    limit: int = DEFAULT_LIST_LIMIT,
    viewer: str = "",
) -> tuple[ListedRun, ...]:
    """The durable runs of ``client``'s database, newest first, at most ``limit``
    (``DEFAULT_LIST_LIMIT``, at most ``MAX_LIST_LIMIT``); ``status`` keeps one state
    (``RunStatus.state``), as a worker of the application version ``viewer`` sees it
    (``"held"`` too for runs waiting for a worker of another version). The pending
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
        listed = _state(workflow, viewer)
        if listed.state in ("running", "held"):
            pending = await DBOSRunHandle(client, workflow.workflow_id).pending_approvals()
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

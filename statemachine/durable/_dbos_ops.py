"""Looking at durable runs kept by DBOS: export one as a journal, list them.

``export_journal`` writes a durable run as the journal ``run_agent_journaled`` would
have written for it (``statemachine.journal``: header, events, checkpoints), so
``statemachine replay``, ``statemachine check`` and the transcript checker read it
unchanged. It is built the way a recovery rebuilds the run: the action loop
(``AgentRun``) runs again over a ``JournalingEngine``, and every model call, tool call
and hook check is answered by the events its recorded step saved, never by running
it; the messages the run took (steer, follow-up, abort, decisions) are applied where
the run took them. So the journal holds exactly the events the run's engine accepted.
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
from collections import deque
from collections.abc import Mapping, Sequence
from functools import partial
from typing import IO, Any, Final

import attrs
from dbos import DBOSClient

from statemachine.agent.events import RunResult
from statemachine.agent.loop import Inbox
from statemachine.agent.run import AgentRun
from statemachine.agent.tools import Tool
from statemachine.core.abort import AbortSignal
from statemachine.core.errors import InvalidInputError
from statemachine.core.events import (
    ApprovalDecided,
    CallModel,
    Event,
    ModelCancelled,
    ToolCancelled,
    ToolFinished,
)
from statemachine.core.messages import AssistantMessage, Message, ToolCall
from statemachine.core.table import TurnState
from statemachine.core.tools import ToolDefinition
from statemachine.core.wire import event_from_dict, messages_from_dicts
from statemachine.durable import RunStatus, UnknownRunError
from statemachine.durable.dbos import (
    _STATES,
    WORKFLOW,
    DBOSRunHandle,
    _apply,
    _check_run_id,
    _result_from_dict,
)
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
_RECV = "DBOS.recv"


class ExportError(InvalidInputError):
    """A durable run whose recorded steps do not rebuild its recorded result."""


def decode_step_events(output: Any) -> list[Event]:
    """The engine events a step's recorded output holds (the runner's step format)."""
    return [event_from_dict(d) for d in output]


# -- what a run recorded ------------------------------------------------------------------------


class _Recorded:
    """A run's recorded steps, sorted by kind, each taken once, in recorded order."""

    def __init__(self, steps: Sequence[Mapping[str, Any]]) -> None:
        self.model: deque[tuple[int, list[Event]]] = deque()
        self.tools: dict[str, list[Event]] = {}
        self.permissions: deque[list[Event]] = deque()
        self.continues: deque[list[Event]] = deque()
        self.messages: deque[tuple[int, Mapping[str, Any]]] = deque()
        for step in sorted(steps, key=lambda s: int(s["function_id"])):
            name, output = step["function_name"], step.get("output")
            if step.get("error") is not None:
                continue  # a step that raised reported nothing the engine saw
            if name == _RECV:
                if isinstance(output, Mapping):
                    self.messages.append((int(step["function_id"]), output))
                continue
            if name not in (_MODEL_STEP, _TOOL_STEP, _PERMISSION_STEP, _CONTINUE_STEP):
                continue
            events = decode_step_events(output or [])
            if name == _MODEL_STEP:
                self.model.append((int(step["function_id"]), events))
            elif name == _TOOL_STEP:
                # Its answer names the call (a tool may also have queued input first).
                ends = [e.call_id for e in events if isinstance(e, (ToolFinished, ToolCancelled))]
                self.tools[ends[0] if ends else ""] = events
            elif name == _PERMISSION_STEP:
                self.permissions.append(events)
            else:
                self.continues.append(events)

    def messages_before_model(self) -> list[Mapping[str, Any]]:
        """The messages the run took before its next model call: those recorded before
        that call's step, or all that are left if the call has none (the run ended,
        aborted, before the call, or it had not been made yet)."""
        end = self.model[0][0] if self.model else float("inf")
        taken = []
        while self.messages and self.messages[0][0] < end:
            taken.append(self.messages.popleft()[1])
        return taken


class _RecordEndedError(Exception):
    """The recorded steps end here: the run had gone no further."""


class _ReplayInbox(Inbox):
    """Every recorded answer is posted before the loop waits, so an empty inbox means
    the recorded steps have run out."""

    async def get(self) -> Event:
        if not self._items:
            raise _RecordEndedError
        return self._items.popleft()


class _ReplayRun(AgentRun):
    """``AgentRun`` whose operations are answered by their recorded steps."""

    def __init__(self, recorded: _Recorded, **kwargs: Any) -> None:
        self._recorded = recorded
        super().__init__(**kwargs)

    def _begin(self, loop: Any) -> Any:
        remove = super()._begin(loop)
        self._inbox = _ReplayInbox()
        return remove

    def _answer(self, key: str, events: list[Event] | None) -> None:
        if events is None:
            return  # not recorded: the loop stops at the next wait (_ReplayInbox)
        assert self._inbox is not None
        if key:
            self._reported.add(key)
        for event in events:
            self._inbox.put_nowait(event)

    def _start_model(self, action: CallModel, alone: bool) -> None:
        for message in self._recorded.messages_before_model():
            _apply(self, message)
        if self._aborting:
            self._not_started("model", ModelCancelled("not started: the run was aborted"))
            return
        model = self._recorded.model
        self._answer("model", model.popleft()[1] if model else None)

    def _start_tool(self, call: ToolCall, alone: bool) -> None:
        self._answer(call.id, self._recorded.tools.pop(call.id, None))

    def _start_permission_checks(self, calls: list[ToolCall]) -> None:
        checks = self._recorded.permissions
        self._answer("", checks.popleft() if checks else None)

    def _start_continue_check(self, turn: int) -> None:
        checks = self._recorded.continues
        self._answer("", checks.popleft() if checks else None)

    def _start_cancellation(self, keys: list[str], reason: str) -> None:
        """Nothing to end: every recorded answer is queued already."""


def _decisions(
    recorded: _Recorded, calls: Sequence[ToolCall]
) -> tuple[list[Event], list[Mapping[str, Any]]] | None:
    """The decisions the run took while ``calls`` waited (as the runner takes them),
    and the other messages; ``None`` if the recorded messages end first."""
    waiting = {c.id for c in calls}
    decided: dict[str, Event] = {}
    others: list[Mapping[str, Any]] = []
    while len(decided) < len(waiting):
        if not recorded.messages:
            return None
        message = recorded.messages.popleft()[1]
        if message.get("kind") != "decision":
            others.append(message)
            if message.get("kind") == "abort":
                break
            continue
        call_id = message.get("call_id")
        if call_id in waiting and call_id not in decided:
            decided[call_id] = ApprovalDecided(call_id, message["approve"], message["reason"])
    return [decided[c.id] for c in calls if c.id in decided], others


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
    """Run the loop again over the recorded steps, writing ``journal``; the result
    (``None`` where the recorded steps end first) and the state the engine is in."""
    kwargs: dict[str, Any] = {"model": _NoModel(), "max_turns": spec["max_turns"], **options}
    run = _ReplayRun(
        recorded,
        messages=messages_from_dicts(spec["messages"]),
        run_id=run_id,
        engine_factory=partial(JournalingEngine, journal=journal),
        **kwargs,
    )
    while True:
        try:
            result = await run.run()
        except _RecordEndedError:
            return None, run.engine.state
        if result.state is not TurnState.AwaitingUser or not result.pending_approvals:
            return result, result.state
        taken = _decisions(recorded, result.pending_approvals)
        if taken is None:
            return None, result.state  # waiting for a person when the record ends
        run = _ReplayRun(recorded, _engine=run.engine, _resume_events=taken[0], **kwargs)
        for message in taken[1]:
            _apply(run, message)


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
        asked_permission = bool(recorded.permissions)
        asked_continue = bool(recorded.continues)
    else:
        asked_permission = hooks.get("before_tool_call") is not None
        asked_continue = hooks.get("should_continue") is not None
    return {
        "tools": chosen,
        "before_tool_call": _hook if asked_permission else None,
        "should_continue": _hook if asked_continue else None,
    }


def _check_against(result: RunResult | None, recorded: Mapping[str, Any], run_id: str) -> None:
    expected = _result_from_dict(run_id, recorded)
    if result is None:
        raise ExportError(f"run {run_id!r} finished, but its recorded steps end early")
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
    buffer = io.StringIO()  # written out only once it is known right
    journal = Journal(buffer, flush="close")
    options = _options(spec, recorded, tools, hooks)
    result, state = await _rebuild(run_id, spec, recorded, journal, options)
    output = status.output
    finished = status.status == "SUCCESS" and isinstance(output, Mapping)
    if isinstance(output, Mapping) and finished:
        _check_against(result, output, run_id)
    _write(target, buffer.getvalue())
    return ExportedJournal(run_id, journal.events_written, state.value, finished)


def _write(target: str | os.PathLike[str] | IO[str], text: str) -> None:
    if not isinstance(target, (str, os.PathLike)):
        target.write(text)
        return
    try:
        with open(target, "x", encoding="utf-8", newline="\n") as f:
            f.write(text)
    except FileExistsError:
        raise InvalidInputError(
            f"{os.fspath(target)!r} already exists: a journal holds one run; choose a new path"
        ) from None


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
    client: DBOSClient, status: str | None = None, limit: int = DEFAULT_LIST_LIMIT
) -> tuple[ListedRun, ...]:
    """The durable runs of ``client``'s database, newest first, at most ``limit``
    (``DEFAULT_LIST_LIMIT``, at most ``MAX_LIST_LIMIT``); ``status`` keeps one state
    (``RunStatus.state``). The pending approvals are read for running runs only."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIST_LIMIT:
        raise InvalidInputError(f"limit must be an int from 1 to {MAX_LIST_LIMIT}, got {limit!r}")
    known = (*_DBOS_STATUSES, "waiting")
    if status is not None and status not in known:
        raise InvalidInputError(f"unknown status {status!r}; known: {', '.join(sorted(known))}")
    wanted = _DBOS_STATUSES["running"] if status == "waiting" else _DBOS_STATUSES.get(status or "")
    found = await client.list_workflows_async(
        name=WORKFLOW,
        status=list(wanted) if wanted else None,
        limit=limit,
        sort_desc=True,
        load_input=False,
        load_output=False,
    )
    runs = []
    for workflow in found:
        state = _STATES.get(workflow.status, workflow.status.lower())
        pending: tuple[ToolCall, ...] = ()
        if state == "running":
            pending = await DBOSRunHandle(client, workflow.workflow_id).pending_approvals()
            state = "waiting" if pending else state
        if status is not None and state != status:
            continue
        runs.append(
            ListedRun(
                workflow.workflow_id,
                state,
                pending,
                workflow.app_version or "",
                created=(workflow.created_at or 0) / 1000,
                updated=(workflow.updated_at or 0) / 1000,
            )
        )
    return tuple(runs)

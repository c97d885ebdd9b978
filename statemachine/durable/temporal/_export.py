"""Export a durable run on Temporal as a journal, from its workflow history.

The journal is the one ``run_agent_journaled`` would have written for the run
(``statemachine.journal``), so ``statemachine replay``, ``statemachine check`` and
the transcript checker read it unchanged. It is built as the DBOS backend builds
its own (``_dbos_ops``): the run's course (``_course.drive`` over ``remote_run``'s parts)
goes again over a ``JournalingEngine``, every operation answered by the result its
activity recorded in the history, never by running it, and each message taking
effect after the number of engine events its place names (the workflow's output
holds the places; a running run's are asked by a query, which needs a live
worker). An activity cancelled before it began is answered as the workflow
answered it (cancelled). A finished run's rebuilt result is checked against its
recorded one before anything is written (``ExportError`` on a difference).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import IO, Any

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from statemachine.agent.tools import Tool
from statemachine.core.events import ModelCancelled, ToolCancelled
from statemachine.core.table import State
from statemachine.durable import ExportedJournal, ExportError, UnknownRunError
from statemachine.durable._course import replay_course
from statemachine.durable._inputs import check_run_id
from statemachine.durable._journal import (
    MAX_EXPORT_STEPS,
    MODEL_STEP,
    TOOL_STEP,
    Recorded,
    RecordEndedError,
    SavedStep,
    check_against,
    journal_buffer,
    options,
    write_journal,
)
from statemachine.durable._registry import replay_options
from statemachine.durable._wire import call_from_dict, encode_step_events
from statemachine.durable.temporal._run import Lane, remote_run
from statemachine.journal import Journal

__all__ = ["carried_steps", "export_journal", "recorded_steps", "run_input"]


class _Replayed:
    """A run's operations answered by their recorded outputs (``_run.Operations``);
    a wait with nothing left to come is the end of the recorded steps."""

    def __init__(self, recorded: Recorded) -> None:
        self._recorded = recorded
        self.misfit = ""

    def mismatch(self, text: str) -> None:
        self.misfit = self.misfit or text

    def roll_over(self) -> bool:
        return False

    async def run(self, name: str, key: str, payload: dict[str, Any]) -> Any:
        return self._recorded.take(name, key)

    def cancel(self, key: str) -> None:
        pass  # what the operation answered after the abort is recorded

    async def sleep(self, seconds: float) -> None:
        for _ in range(3):  # the recorded answers first
            await asyncio.sleep(0)

    async def wait(self, ready: Callable[[], bool]) -> None:
        for _ in range(3):  # every operation started so far answers at its first pass
            if ready():
                return
            await asyncio.sleep(0)
        if not ready():
            raise RecordEndedError


async def _payload(client: Client, payloads: Any) -> Any:
    values = await client.data_converter.decode(list(payloads.payloads))
    return values[0] if values else None


async def recorded_steps(
    client: Client, events: Sequence[HistoryEvent]
) -> tuple[list[SavedStep], Any, Any]:
    """The operations a workflow history holds (as ``_journal`` reads saved steps),
    the workflow's input and its output (``None`` while it runs)."""
    scheduled: dict[int, tuple[str, Any]] = {}
    steps: list[SavedStep] = []
    spec: Any = None
    output: Any = None
    for event in events:
        kind = event.event_type
        if kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            spec = await _payload(client, event.workflow_execution_started_event_attributes.input)
            carried = spec.get("carried", {}) if isinstance(spec, Mapping) else {}
            steps += carried_steps(carried)
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attributes = event.activity_task_scheduled_event_attributes
            payload = await _payload(client, attributes.input)
            scheduled[event.event_id] = (attributes.activity_type.name, payload)
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            done = event.activity_task_completed_event_attributes
            name, _ = scheduled[done.scheduled_event_id]
            result = await _payload(client, done.result)
            steps.append(SavedStep(done.scheduled_event_id, name, result))
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED:
            cancelled = event.activity_task_canceled_event_attributes
            name, payload = scheduled[cancelled.scheduled_event_id]
            answer = _cancelled(name, payload)
            if answer is not None:
                steps.append(SavedStep(cancelled.scheduled_event_id, name, answer))
        elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED:
            result = event.workflow_execution_completed_event_attributes.result
            output = await _payload(client, result)
    return steps, spec, output


async def run_input(client: Client, run_id: str) -> Mapping[str, Any]:
    """The input of the run's last execution (its spec)."""
    async for event in client.get_workflow_handle(run_id).fetch_history_events():
        attributes = event.workflow_execution_started_event_attributes
        spec = await _payload(client, attributes.input)
        if isinstance(spec, Mapping):
            return spec
        break
    raise ExportError(f"run {run_id!r} has no readable input")


def carried_steps(carried: Mapping[str, Any]) -> list[SavedStep]:
    """The operations an execution carried over to the next (continue-as-new), as
    saved steps ordered before those of this execution's history."""
    saved = list(carried.get("steps", ()))
    return [SavedStep(i - len(saved), name, output) for i, (name, output) in enumerate(saved)]


def _cancelled(name: str, payload: Any) -> list[dict[str, Any]] | None:
    """The answer the workflow gave an operation cancelled before it answered."""
    if name == MODEL_STEP:
        return encode_step_events([ModelCancelled()])
    if name == TOOL_STEP:
        return encode_step_events([ToolCancelled(call_from_dict(payload["call"]).id)])
    return None


async def _rebuild(
    run_id: str,
    spec: Mapping[str, Any],
    recorded: Recorded,
    places: Sequence[Sequence[Any]],
    journal: Journal,
    chosen: Mapping[str, Any],
) -> tuple[Any, State]:
    """Run the run's course again over its recorded steps, writing ``journal``; the
    result (``None`` where the recorded steps end first) and the engine's state."""
    replayed = _Replayed(recorded)
    lane = Lane(replayed, schedule=places)
    result, state = await replay_course(
        spec, run_id, journal, chosen, partial(remote_run, lane=lane)
    )
    if result is None and replayed.misfit:
        raise ExportError(f"run {run_id!r}: {replayed.misfit}") from None
    return result, state


async def export_journal(
    client: Client,
    run_id: str,
    target: str | os.PathLike[str] | IO[str],
    *,
    tools: Sequence[Tool] | None = None,
    hooks: Mapping[str, Any] | None = None,
) -> ExportedJournal:
    """Write the durable run ``run_id`` as a journal to ``target`` (a new file's path,
    or an open text stream); module docstring. ``tools``: the run's tools (for their
    schemas); ``hooks``: the runner's hooks by name. ``UnknownRunError`` if there is
    no such run."""
    check_run_id(run_id)
    handle = client.get_workflow_handle(run_id)
    try:
        history = await handle.fetch_history()
    except RPCError as exc:
        if exc.status is RPCStatusCode.NOT_FOUND:
            raise UnknownRunError(f"no durable run has the id {run_id!r}") from None
        raise
    if len(history.events) > MAX_EXPORT_STEPS:
        raise ExportError(f"run {run_id!r} has more than {MAX_EXPORT_STEPS} history events")
    steps, spec, output = await recorded_steps(client, history.events)
    if not isinstance(spec, Mapping):
        raise ExportError(f"run {run_id!r} has no readable input")
    finished = isinstance(output, Mapping)
    places = output["places"] if finished else await handle.query("places")
    recorded = Recorded(steps)
    buffer, data = journal_buffer()
    journal = Journal(buffer, flush="close")
    # The run's output type (its JSON Schema) and usage limits shape its course.
    chosen = {**options(spec, recorded, tools, hooks), **replay_options(spec)}
    result, state = await _rebuild(run_id, spec, recorded, places, journal, chosen)
    if finished:
        check_against(result, output, run_id)
    buffer.flush()
    write_journal(target, data.getvalue())
    return ExportedJournal(run_id, journal.events_written, state.value, finished)

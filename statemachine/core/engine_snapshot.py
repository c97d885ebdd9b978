"""The engine's state as JSON data, and back: ``Engine.snapshot`` and ``Engine.restore``.

``write`` turns an engine at rest into the snapshot dict; ``load`` reads one back
into a new engine, field by field with the typed readers of ``core/snapshot.py``
(which also checks the size, depth and signature first), and ``check_restored``
refuses a snapshot that no run could have written: its batch, history, transition
log and flags must agree with each other (see ``Engine.restore`` for the list).
Messages are written and read with the message codec (``message_to_dict`` and
``message_from_dict``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from statemachine.core import snapshot as _snapshots
from statemachine.core.batch import (
    DONE,
    READY,
    RUNNING,
    STATUSES,
    WAITING_APPROVAL,
    WAITING_PERMISSION,
    CallSlot,
)
from statemachine.core.errors import InvalidInputError, ProtocolError, SnapshotError
from statemachine.core.invariants import history_violations
from statemachine.core.messages import (
    AssistantMessage,
    ToolCall,
    ToolResultMessage,
    UserMessage,
    thaw_json,
)
from statemachine.core.table import INITIAL, RETURNS_TO_CALLER, TRANSITIONS, Trigger, TurnState
from statemachine.core.tools import Scheduling, ToolDefinition
from statemachine.core.trace import Trace, TransitionRecord
from statemachine.core.wire import (
    block_from_dict,
    message_from_dict,
    message_to_dict,
)

if TYPE_CHECKING:
    from statemachine.core.engine import Engine

__all__ = ["SNAPSHOT_VERSION", "check_restored", "load", "write"]

S = TurnState

SNAPSHOT_VERSION: Final = 1


def write(engine: Engine) -> dict[str, Any]:
    """The snapshot of ``engine`` (unsigned); see ``Engine.snapshot``."""
    if engine._model_outstanding or any(s.status == RUNNING for s in engine._batch):
        raise ProtocolError(f"cannot snapshot in {engine.state} while an operation is outstanding")
    return {
        "version": SNAPSHOT_VERSION,
        "runId": engine.run_id,
        "state": engine.state.value,
        "maxTurns": engine.max_turns,
        "checkPermissions": engine.check_permissions,
        "checkContinue": engine.check_continue,
        "turns": engine.turns,
        "tools": [
            {"name": d.name, "description": d.description, "parameters": d.schema_dict()}
            for d in engine._tools
        ],
        "messages": [message_to_dict(m) for m in engine._history],
        "batch": [_slot_to_dict(s) for s in engine._batch],
        "flushed": engine._flushed,
        "denial": None
        if engine._denial is None
        else {"callId": engine._denial[0].id, "reason": engine._denial[1]},
        "steer": [message_to_dict(m) for m in engine._steer],
        "followUp": [message_to_dict(m) for m in engine._follow_up],
        "continuePending": engine._continue_pending,
        "stopReason": engine._stop_reason,
        "abortReason": engine.abort_reason,
        "explanation": engine.explanation,
        "trace": [[r.source.value, r.trigger.value, r.dest.value, r.turn] for r in engine.trace],
    }


def _slot_to_dict(slot: CallSlot) -> dict[str, Any]:
    return {
        "call": message_to_dict(AssistantMessage((slot.call,)))["content"][0],
        "status": slot.status,
        "sequential": slot.sequential,
        "resources": sorted(slot.resources),
        "note": slot.note,
        "result": None if slot.result is None else message_to_dict(slot.result),
    }


def load(
    engine: Engine,
    data: Mapping[str, Any],
    scheduling: Mapping[str, Scheduling] | None,
    logger: Any,
) -> None:
    """Set up ``engine`` (made without ``__init__``) from the snapshot ``data``."""
    p = "snapshot"
    _snapshots.only_keys(data, _SNAPSHOT_KEYS, p)
    version = _snapshots.field(data, "version", p)
    if type(version) is not int or version != SNAPSHOT_VERSION:
        raise SnapshotError(f"snapshot.version: {version!r:.40} is not {SNAPSHOT_VERSION}")
    tools = tuple(
        _tool_from(t, f"snapshot.tools[{i}]")
        for i, t in enumerate(_snapshots.array(data, "tools", p))
    )
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise SnapshotError("snapshot.tools: tool names repeat")
    history = [
        message_from_dict(_snapshots.obj(d, f"{p}.messages[{i}]"), path=f"{p}.messages[{i}]")
        for i, d in enumerate(_snapshots.array(data, "messages", p))
    ]
    if not history:
        raise SnapshotError("snapshot.messages: empty")
    state_name = _snapshots.string(data, "state", p)
    if state_name not in _STATES:
        raise SnapshotError(f"snapshot.state: {state_name!r:.40} is not a state")
    engine._setup(
        tools=tools,
        history=history,
        max_turns=_snapshots.integer(data, "maxTurns", p, minimum=1),
        check_permissions=_snapshots.boolean(data, "checkPermissions", p),
        check_continue=_snapshots.boolean(data, "checkContinue", p),
        scheduling=scheduling,
        run_id=_snapshots.string(data, "runId", p),
        logger=logger,
        initial=_STATES[state_name],
    )
    _load_progress(engine, data)


def _load_progress(engine: Engine, data: Mapping[str, Any]) -> None:
    """The fields a run changes as it goes: counters, batch, queues, flags, the log."""
    p = "snapshot"
    engine.turns = _snapshots.integer(data, "turns", p, minimum=0)
    engine._batch = [
        _slot_from(item, f"snapshot.batch[{i}]")
        for i, item in enumerate(_snapshots.array(data, "batch", p))
    ]
    engine._slots = {s.call.id: s for s in engine._batch}
    if len(engine._slots) != len(engine._batch):
        raise SnapshotError("snapshot.batch: call ids repeat")
    engine._seen_ids.update(engine._slots)
    engine._flushed = _snapshots.integer(data, "flushed", p, minimum=0)
    engine._denial = _denial_from(engine, _snapshots.field(data, "denial", p))
    engine._steer = [
        _user(d, f"snapshot.steer[{i}]") for i, d in enumerate(_snapshots.array(data, "steer", p))
    ]
    engine._follow_up = [
        _user(d, f"snapshot.followUp[{i}]")
        for i, d in enumerate(_snapshots.array(data, "followUp", p))
    ]
    engine._continue_pending = _snapshots.boolean(data, "continuePending", p)
    engine._stop_reason = _snapshots.string(data, "stopReason", p, optional=True)
    engine.abort_reason = _snapshots.string(data, "abortReason", p, optional=True)
    engine.explanation = _snapshots.string(data, "explanation", p, optional=True)
    engine.trace = Trace(
        _record_from(r, f"snapshot.trace[{i}]")
        for i, r in enumerate(_snapshots.array(data, "trace", p))
    )


def _denial_from(engine: Engine, value: object) -> tuple[ToolCall, str] | None:
    if value is None:
        return None
    d = _snapshots.obj(value, "snapshot.denial")
    _snapshots.only_keys(d, frozenset({"callId", "reason"}), "snapshot.denial")
    call_id = _snapshots.string(d, "callId", "snapshot.denial")
    reason = _snapshots.string(d, "reason", "snapshot.denial")
    slot = engine._slots.get(call_id)
    if slot is None:
        raise SnapshotError(
            f"snapshot.denial.callId: {call_id!r:.40} is not a call of snapshot.batch"
        )
    return slot.call, reason


# -- checking a restored snapshot against itself ------------------------------------------


def check_restored(engine: Engine) -> None:
    """Refuse a restored snapshot that no run could have written (see ``restore``)."""
    state = engine._state
    if state in _NEVER_AT_REST:
        raise SnapshotError(
            f"snapshot.state: {state} always has an operation outstanding, and no "
            "snapshot is taken while one is"
        )
    _check_trace(engine)
    _check_batch_is_last_calls(engine)
    _check_slots(engine)
    _check_flags(engine)
    open_tail = bool(engine._batch) and engine._flushed < len(engine._batch)
    violations = history_violations(engine._history, allow_open_tail=open_tail)
    if violations:
        raise SnapshotError(
            "snapshot.messages: invalid history: " + "; ".join(map(str, violations[:3]))
        )


def _check_trace(engine: Engine) -> None:
    # The log is replayed: each record a row of the table, each starting where the
    # one before ended, each stamped with the model calls made before it.
    at, turns = INITIAL, 0
    for i, r in enumerate(engine.trace):
        if (r.source, r.trigger, r.dest) not in _ROW_SET:
            raise SnapshotError(
                f"snapshot.trace[{i}]: {r.source} --{r.trigger}--> {r.dest} is not a "
                "row of the transition table"
            )
        if r.source is not at:
            raise SnapshotError(
                f"snapshot.trace[{i}]: starts in {r.source}, but the run was in {at}"
            )
        if r.turn != turns:
            raise SnapshotError(
                f"snapshot.trace[{i}]: turn {r.turn}, but {turns} model call(s) came before"
            )
        if r.dest is S.AwaitingModel and r.source is not S.AwaitingModel:
            turns += 1
        at = r.dest
    if at is not engine._state:
        raise SnapshotError(f"snapshot.state: {engine._state}, but the trace ends in {at}")
    if turns != engine.turns:
        raise SnapshotError(
            f"snapshot.turns: {engine.turns}, but the trace shows {turns} model call(s)"
        )


def _check_batch_is_last_calls(engine: Engine) -> None:
    batch, history, flushed = engine._batch, engine._history, engine._flushed
    if not batch:
        if flushed:
            raise SnapshotError(f"snapshot.flushed: {flushed}, but the batch is empty")
        return
    k = next(
        (i for i in range(len(history) - 1, -1, -1) if isinstance(history[i], AssistantMessage)),
        None,
    )
    if k is None:
        raise SnapshotError("snapshot.batch: not empty, but no assistant message made calls")
    last = history[k]
    assert isinstance(last, AssistantMessage)
    calls = last.tool_calls
    if len(calls) != len(batch):
        raise SnapshotError(
            f"snapshot.batch: holds {len(batch)} call(s), but the last assistant message "
            f"(snapshot.messages[{k}]) made {len(calls)}"
        )
    for i, (slot, call) in enumerate(zip(batch, calls, strict=True)):
        if _call_key(slot.call) != _call_key(call):
            raise SnapshotError(
                f"snapshot.batch[{i}].call: differs from call {i} of the last assistant "
                f"message (snapshot.messages[{k}]) in its id, name or arguments"
            )
        # One object from here on: what runs is exactly what the history shows.
        slot.call = call
    engine._slots = {s.call.id: s for s in batch}
    if engine._denial is not None:
        engine._denial = (engine._slots[engine._denial[0].id].call, engine._denial[1])
    tail = history[k + 1 :]
    if flushed > len(batch) or len(tail) != flushed:
        raise SnapshotError(
            f"snapshot.flushed: {flushed}, but {len(tail)} message(s) follow the last "
            f"assistant message and the batch holds {len(batch)} call(s)"
        )
    for i, message in enumerate(tail):
        if message != batch[i].result:
            raise SnapshotError(
                f"snapshot.batch[{i}].result: differs from snapshot.messages[{k + 1 + i}], "
                "its place in the history"
            )


def _check_slots(engine: Engine) -> None:
    state = engine._state
    allowed = _OPEN_STATUSES.get(state, frozenset())
    for i, slot in enumerate(engine._batch):
        p = f"snapshot.batch[{i}]"
        done = slot.status == DONE
        if done != (slot.result is not None):
            raise SnapshotError(
                f"{p}.result: "
                + ("missing for a call with status done" if done else "present, but not done")
            )
        if slot.result is not None and (
            slot.result.tool_call_id != slot.call.id or slot.result.tool_name != slot.call.name
        ):
            raise SnapshotError(f"{p}.result: answers another call than {p}.call")
        if done:
            if i == engine._flushed:
                raise SnapshotError(
                    f"{p}.status: done, but its result is held back although every "
                    "result before it is in the history (snapshot.flushed)"
                )
            continue
        if slot.status not in allowed:
            raise SnapshotError(f"{p}.status: {slot.status!r} is impossible in {state}")
        _check_dispatchable(engine, slot, p)
        # A ready call in AwaitingUser may be held back by an earlier one, or
        # approved by a person while others still wait: both are fine, so what
        # made it ready cannot be read from here. resume_run asks the policy again.
    statuses = {s.status for s in engine._batch}
    if state is S.DispatchingTools and WAITING_PERMISSION not in statuses:
        raise SnapshotError("snapshot.state: DispatchingTools, but no call waits for permission")
    if state is S.AwaitingUser and statuses - {DONE} and WAITING_APPROVAL not in statuses:
        raise SnapshotError(
            "snapshot.batch: calls are open in AwaitingUser, but none waits for approval"
        )


def _check_dispatchable(engine: Engine, slot: CallSlot, p: str) -> None:
    """A call still open named a known tool and had readable arguments: dispatch
    answers any other at once. (Its arguments are not matched against the
    snapshot's own schema here: a hostile pattern could make that take forever.
    ``resume_run`` matches them against the caller's tools.)"""
    call = slot.call
    if call.name not in engine._tools_by_name:
        raise SnapshotError(f"{p}.call: tool {call.name!r} is not in snapshot.tools")
    if call.parse_error is not None:
        raise SnapshotError(f"{p}.call: arguments that could not be parsed cannot be open")


def _check_flags(engine: Engine) -> None:
    state = engine._state
    # At rest, TurnBoundary always waits for should_continue; an abort there leaves
    # the (now moot) question pending in Aborted.
    if engine._continue_pending != (state is S.TurnBoundary) and not (
        engine._continue_pending and state is S.Aborted
    ):
        raise SnapshotError(
            f"snapshot.continuePending: {str(engine._continue_pending).lower()} in {state}"
        )
    if state is S.Ready and engine._batch:
        raise SnapshotError("snapshot.batch: not empty, but no model call was made")
    if state is S.Ready and isinstance(engine._history[-1], AssistantMessage):
        raise SnapshotError("snapshot.messages: a run in Ready cannot end with the model")
    if state in RETURNS_TO_CALLER and engine.explanation is None:
        raise SnapshotError(f"snapshot.explanation: missing in {state}")
    if engine.abort_reason is not None and state is not S.Aborted:
        raise SnapshotError(f"snapshot.abortReason: set, but the run is {state}")
    if engine._denial is not None:
        slot = engine._slots[engine._denial[0].id]
        result = slot.result
        if (
            result is None
            or not result.is_error
            or (result.text != f"Tool call denied: {engine._denial[1]}")
        ):
            raise SnapshotError(
                "snapshot.denial: the call it names was not answered with that denial"
            )


_SNAPSHOT_KEYS: Final = frozenset(
    {
        "version",
        "runId",
        "state",
        "maxTurns",
        "checkPermissions",
        "checkContinue",
        "turns",
        "tools",
        "messages",
        "batch",
        "flushed",
        "denial",
        "steer",
        "followUp",
        "continuePending",
        "stopReason",
        "abortReason",
        "explanation",
        "trace",
        _snapshots.SIGNATURE_FIELD,
    }
)
_SLOT_KEYS: Final = frozenset({"call", "status", "sequential", "resources", "note", "result"})
_STATES: Final = {s.value: s for s in TurnState}
_TRIGGERS: Final = {t.value: t for t in Trigger}
_ROW_SET: Final = frozenset((r.source, r.trigger, r.dest) for r in TRANSITIONS)
# States a run only passes through while an operation is outstanding.
_NEVER_AT_REST: Final = frozenset({S.AwaitingModel, S.CollectingResults, S.Aborting})
# The statuses a call without a result may have when the run rests in a state.
_OPEN_STATUSES: Final = {
    S.DispatchingTools: frozenset({WAITING_PERMISSION, WAITING_APPROVAL, READY}),
    S.AwaitingUser: frozenset({WAITING_APPROVAL, READY}),
}


def _call_key(call: ToolCall) -> str:
    # Exact JSON, not ==: in Python 1 == 1.0 == True, and a tool would see the difference.
    return json.dumps(
        [call.id, call.name, thaw_json(call.arguments), call.parse_error], sort_keys=True
    )


def _tool_from(value: object, path: str) -> ToolDefinition:
    d = _snapshots.obj(value, path)
    _snapshots.only_keys(d, frozenset({"name", "description", "parameters"}), path)
    name = _snapshots.string(d, "name", path)
    description = _snapshots.string(d, "description", path)
    parameters = _snapshots.obj(_snapshots.field(d, "parameters", path), f"{path}.parameters")
    try:
        return ToolDefinition(name, description, parameters)
    except InvalidInputError as exc:
        raise SnapshotError(f"{path}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - the schema library on a hostile schema
        raise SnapshotError(
            f"{path}.parameters: not a usable JSON Schema ({type(exc).__name__})"
        ) from None


def _slot_from(value: object, path: str) -> CallSlot:
    item = _snapshots.obj(value, path)
    _snapshots.only_keys(item, _SLOT_KEYS, path)
    call = block_from_dict(_snapshots.field(item, "call", path), ("toolCall",), f"{path}.call")
    assert isinstance(call, ToolCall)
    slot = CallSlot(call)
    status = _snapshots.string(item, "status", path)
    if status not in STATUSES or status == RUNNING:
        raise SnapshotError(f"{path}.status: {status!r:.40} is not a status a snapshot holds")
    slot.status = status
    slot.sequential = _snapshots.boolean(item, "sequential", path)
    resources = _snapshots.array(item, "resources", path)
    if not all(isinstance(r, str) for r in resources):
        raise SnapshotError(f"{path}.resources: expected an array of strings")
    slot.resources = frozenset(resources)
    slot.note = _snapshots.string(item, "note", path)
    result = _snapshots.field(item, "result", path)
    if result is not None:
        message = message_from_dict(_snapshots.obj(result, f"{path}.result"), path=f"{path}.result")
        if not isinstance(message, ToolResultMessage):
            raise SnapshotError(f"{path}.result: expected a tool result message")
        slot.result = message
    return slot


def _record_from(value: object, path: str) -> TransitionRecord:
    if not isinstance(value, (list, tuple)) or len(value) != 4:
        raise SnapshotError(f"{path}: expected [source, trigger, dest, turn]")
    source, trigger, dest, turn = value
    if not (
        isinstance(source, str)
        and source in _STATES
        and isinstance(trigger, str)
        and trigger in _TRIGGERS
        and isinstance(dest, str)
        and dest in _STATES
    ):
        raise SnapshotError(f"{path}: names an unknown state or trigger")
    if isinstance(turn, bool) or not isinstance(turn, int) or turn < 0:
        raise SnapshotError(f"{path}[3]: expected an integer >= 0")
    return TransitionRecord(_STATES[source], _TRIGGERS[trigger], _STATES[dest], turn)


def _user(value: object, path: str) -> UserMessage:
    message = message_from_dict(_snapshots.obj(value, path), path=path)
    if not isinstance(message, UserMessage):
        raise SnapshotError(f"{path}: queued input must be a user message")
    return message
